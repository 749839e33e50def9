"""The spent budgets of a crawl, as ``crawlctl status`` and the dashboard show
them: the keys (sites) whose new pages the frontier refused over a budget, with
their counts, and the crawl's totals.

Read from each partition's budget hash (``"admitted|refused"`` per key, field
``||crawl`` for the partition; see crawlproject/frontier/lua/sync.lua), with
HSCAN in windows: a crawl of a million sites is read in slices, never in one
HGETALL that would hold Redis for every node.
"""

from __future__ import annotations

import redis

from crawlproject.frontier.sitelimits import parse_override
from crawlproject.keys import as_text as _s

#: keys with refusals listed, most refused first (the JSON says how many in all)
BUDGET_KEYS_SHOWN = 20
#: fields read at most per partition (a status must stay quick on a huge crawl)
SCAN_MAX = 200_000
CRAWL = "||crawl"


def _counts(raw) -> tuple[int, int] | None:
    try:
        admitted, refused = (int(x) for x in _s(raw).split("|"))
    except (TypeError, ValueError, AttributeError):   # junk: SYNC counts it itself
        return None
    return admitted, refused


def budget_summary(parts: list, shown: int = BUDGET_KEYS_SHOWN) -> dict:
    """``{"admitted", "refused"}`` for the whole crawl (new pages counted while
    budgets apply), ``spent``: how many keys refused pages, ``keys``: the
    *shown* most refused ``{"key", "admitted", "refused", "budget", "source"}``
    (``budget``: the key's crawlctl override, else what it admitted: the
    frontier admits a key's new pages up to its budget exactly; ``source``:
    ``crawlctl`` or ``settings``), and ``partial`` when a partition held more
    than :data:`SCAN_MAX` fields (the rest not read)."""
    crawl = [0, 0]
    spent: list[tuple[int, str, int, int]] = []   # (-refused, key, admitted, partition)
    partial = False
    for p, part in enumerate(parts):
        try:
            fields = part.client.hscan_iter(part.keys.budget, count=1000)
            for read, (field, raw) in enumerate(fields):
                if read >= SCAN_MAX:
                    partial = True
                    break
                counts = _counts(raw)
                if counts is None:
                    continue
                name = _s(field)
                if name == CRAWL:
                    crawl = [crawl[0] + counts[0], crawl[1] + counts[1]]
                elif counts[1]:
                    spent.append((-counts[1], name, counts[0], p))
        except redis.ResponseError:   # not a hash: SYNC logs it (budget_skipped)
            partial = True
    spent.sort()
    top = spent[:shown]
    overrides: dict[str, int] = {}
    for p, part in enumerate(parts):
        names = [name for _, name, _, q in top if q == p]
        for name, raw in zip(names, part.client.hmget(part.keys.limits, names) if names else []):
            try:
                budget = parse_override(_s(raw)).get("budget") if raw is not None else None
            except ValueError:   # junk: `crawlctl politeness` says so
                budget = None
            if budget:
                overrides[name] = budget
    keys = [{"key": name, "admitted": admitted, "refused": -minus,
             "budget": overrides.get(name, admitted),
             "source": "crawlctl" if name in overrides else "settings"}
            for minus, name, admitted, _ in top]
    out = {"admitted": crawl[0], "refused": crawl[1], "spent": len(spent), "keys": keys}
    if partial:
        out["partial"] = True
    return out


def budget_rows(budgets: dict) -> list[tuple[str, str]]:
    """The status table's rows for :func:`budget_summary`'s data: none while
    no budget refused a page."""
    if not budgets.get("refused"):
        return []
    rows = [("budgets: new pages admitted / refused (crawl)",
             f"{budgets['admitted']} / {budgets['refused']}"),
            ("budgets: keys spent", str(budgets["spent"]) + (" (partly read)"
                                                             if budgets.get("partial") else ""))]
    for row in budgets.get("keys", []):
        rows.append((f"budget spent: {row['key']}",
                     f"{row['admitted']} admitted of {row['budget']} ({row['source']}), "
                     f"{row['refused']} refused"))
    return rows
