"""The spent budgets of a crawl, as ``crawlctl status`` and the dashboard show
them: the keys (sites) whose new pages the frontier refused over a budget, with
their counts, and the crawl's totals.

Read from each partition's budget hash (``"admitted|refused"`` per key, field
``||crawl`` for the partition; see crawlproject/frontier/lua/sync.lua), with
HSCAN in windows of 1,000 fields. Every site has a count once budgets apply
(and ``FRONTIER_SITE_BUDGET`` gives every site one by default), so a broad
crawl's hash holds a field per site: above :data:`SCAN_MAX` fields in a
partition only its totals are read (one HMGET), and the spent keys are not
listed (``too_many``): the dashboard reads the status every few seconds, and a
million fields each time would load the Redis every node waits on. The nodes'
logs name each spent key once (crawlproject/frontier/budgets.py).
"""

from __future__ import annotations

import redis

from crawlproject.frontier.sitelimits import parse_override
from crawlproject.keys import as_text as _s

#: keys with refusals listed, most refused first (the JSON says how many in all)
BUDGET_KEYS_SHOWN = 20
#: fields scanned at most per partition (10 round trips); a larger hash gives
#: only its totals
SCAN_MAX = 10_000
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
    ``crawlctl`` or ``settings``); ``too_many``: partitions of more than
    :data:`SCAN_MAX` fields, whose keys were not read (``spent`` counts the
    others' only); ``partial`` when a budget key is not a hash."""
    crawl = [0, 0]
    spent: list[tuple[int, str, int, int]] = []   # (-refused, key, admitted, partition)
    partial, too_many = False, 0
    for p, part in enumerate(parts):
        try:
            if part.client.hlen(part.keys.budget) > SCAN_MAX:
                too_many += 1
                counts = _counts(part.client.hget(part.keys.budget, CRAWL))
                if counts is not None:
                    crawl = [crawl[0] + counts[0], crawl[1] + counts[1]]
                continue
            for field, raw in part.client.hscan_iter(part.keys.budget, count=1000):
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
    if too_many:
        out["too_many"] = too_many
    return out


def budget_rows(budgets: dict) -> list[tuple[str, str]]:
    """The status table's rows for :func:`budget_summary`'s data: none while
    no budget refused a page."""
    if not budgets.get("refused"):
        return []
    rows = [("budgets: new pages admitted / refused (crawl)",
             f"{budgets['admitted']} / {budgets['refused']}"),
            ("budgets: keys spent", str(budgets["spent"]) + unread_note(budgets))]
    for row in budgets.get("keys", []):
        rows.append((f"budget spent: {row['key']}",
                     f"{row['admitted']} admitted of {row['budget']} ({row['source']}), "
                     f"{row['refused']} refused"))
    return rows


def unread_note(budgets: dict) -> str:
    """What :func:`budget_summary` could not list, in words ("" when nothing)."""
    if budgets.get("too_many"):
        return (f" (and those of {budgets['too_many']} partition(s) of more than "
                f"{SCAN_MAX:,} sites, not listed: the nodes' logs name each once)")
    return " (partly read)" if budgets.get("partial") else ""
