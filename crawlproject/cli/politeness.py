"""crawlctl politeness: sites, their limits and state; limits changed at run time."""

from __future__ import annotations

import json
import sys

from crawlproject.ops.common import UsageError, redis_time_ms
from crawlproject.ops.hosts import budget_rows, politeness_rows, robots_states
from crawlproject.cli.common import _in, _partitions, terminal_text


def cmd_politeness(args) -> int:
    """Show the per-host politeness state, or change a host's limits at run time."""
    from crawlproject.frontier.sitelimits import (UNLIMITED, Limits, Override, limits_from,
                                                  partition_of, safe_key)
    from crawlproject.scheduler import HOST_LIMITS_REFRESH

    parts = _partitions(args)
    budget = getattr(args, "budget", None)
    if args.delay is not None or args.concurrency is not None or budget is not None or args.clear:
        if not args.hosts:
            raise UsageError("name the host(s) whose limits to change")
        if args.concurrency is not None and args.concurrency < 1:
            # In settings 0 means "no limit"; typed here it is most likely meant
            # to stop a site: never read it as the opposite.
            raise UsageError("--concurrency must be 1 or more (requests of the host in flight "
                             "across all nodes); to hold a host back, raise --delay (up to "
                             "86400 s)")
        if budget is not None and budget < 0:
            raise UsageError("--budget must be 0 (no budget) or more new pages")
        spec = {k: v for k, v in (("delay", args.delay), ("concurrency", args.concurrency),
                                  ("budget", budget)) if v is not None}
        try:
            checked = limits_from(spec, Limits(0.0, 0))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        keys = [_politeness_key(host) for host in args.hosts]   # all checked before any change
        for key in keys:
            part = parts[partition_of(key, len(parts))]
            value = None
            if not args.clear:
                # A limit not given keeps what applies now: the host's override
                # if it has one, else the nodes' own setting (never "no limit").
                current = part.limits().get(key) or {}
                value = Override(
                    delay=checked.delay if "delay" in spec else current.get("delay"),
                    concurrency=(checked.concurrency if "concurrency" in spec
                                 else current.get("concurrency")),
                    budget=((checked.budget or None) if "budget" in spec
                            else current.get("budget")))
            part.set_limits({key: value})
            print(f"{key}: " + (_describe_override(value) + ", across all nodes"
                                if value is not None else
                                "limits cleared, and its block, backoff and crawl delay "
                                "(the site may ask again): the nodes' DOWNLOAD_DELAY and "
                                "CONCURRENT_REQUESTS_PER_DOMAIN apply (or, within "
                                f"{HOST_LIMITS_REFRESH:.0f} s, the running nodes' "
                                "FRONTIER_HOST_LIMITS entry for it, if they have one)"))
            if value is not None and not part.key_states([key]) and not part.client.exists(
                    part.keys.queue(key)):
                print(f"note: no request of {args.spider} has had the politeness key {key!r} "
                      "yet; the limit applies once one does (keys are host names; registered "
                      "domains with FRONTIER_POLITENESS_KEY=domain, IP addresses with =ip)",
                      file=sys.stderr)
        return 0
    now_ms = redis_time_ms(parts[0].client)
    rows, total = politeness_rows(parts, [safe_key(h.lower()) for h in args.hosts],
                                  max(0, args.n))
    for key, robots in robots_states(parts[0].client, args.spider, list(rows),
                                     now_ms / 1000).items():
        rows[key]["robots"] = robots
    budgets = budget_rows(parts, list(rows))
    for key, counts in budgets.items():
        if key in rows:
            rows[key]["pages"] = counts
    if args.json:
        print(json.dumps({"now_ms": now_ms, "hosts": rows, "hosts_total": total,
                          "crawl_pages": budgets.get("||crawl")}, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    columns = ("host", "queued", "in flight", "limits", "next start in", "blocked for",
               "backoff", "slow-downs", "crawl delay", "robots.txt", "budget")
    cells = []
    for key, row in rows.items():
        lim = row.get("limits")
        cells.append([
            terminal_text(key), str(row.get("queued", 0)), str(row.get("inflight", 0)),
            (("settings'" if lim["delay"] is None else f"{lim['delay']:g}s") + " / "
             + ("settings'" if lim["concurrency"] is None else
                "no limit" if lim["concurrency"] >= UNLIMITED else str(lim["concurrency"]))
             + f" ({'cli' if lim['source'] == 'c' else 'settings'})")
            if lim else "defaults",
            _in(row.get("ready_at_ms"), now_ms), _in(row.get("blocked_until_ms"), now_ms),
            f"{row['backoff_ms'] / 1000:g}s" if row.get("backoff_ms") else "",
            f"{row['error_rate']:.0%}" if row.get("error_rate") else "",
            f"{row['crawl_delay_ms'] / 1000:g}s" if row.get("crawl_delay_ms") else "",
            _robots_cell(row.get("robots")), _budget_cell(row)])
    # The last four columns only when a host has something to show in them.
    shown = [i for i, column in enumerate(columns)
             if i < 7 or any(row[i] for row in cells)]
    table = Table(title=f"politeness of {args.spider} (per host, across all nodes)")
    for i in shown:
        table.add_column(columns[i], justify="left" if i == 0 else "right")
    if total > len(rows):
        table.caption = (f"the {len(rows)} most queued of {total} hosts "
                         "(-n for more, or name hosts)")
    for row in cells:
        table.add_row(*(row[i] for i in shown))
    Console(width=max(Console().width, 140)).print(table)
    return 0


def _budget_cell(row: dict) -> str:
    """``312/500 (40 refused)``: new pages admitted / the host's budget."""
    pages, lim = row.get("pages"), row.get("limits") or {}
    if not pages and not lim.get("budget"):
        return ""
    pages = pages or {"admitted": 0, "refused": 0}
    cell = f"{pages['admitted']}/{lim['budget']}" if lim.get("budget") else str(pages["admitted"])
    return cell + (f" ({pages['refused']} refused)" if pages["refused"] else "")


def _robots_cell(robots: dict | None) -> str:
    """``200, 23h left`` / ``503: pages wait, 4m`` / ``expired`` for the table."""
    if not robots:
        return ""
    left = robots["expires_in_s"]
    if left <= 0:
        return f"{robots['status'] or 'unreachable'}, expired"
    span = f"{left / 3600:.0f}h" if left >= 3600 else f"{left / 60:.0f}m" if left >= 60 \
        else f"{left:.0f}s"
    if robots["state"] == "unavailable":
        return f"{robots['status'] or 'unreachable'}: pages wait, {span}"
    return f"{robots['status']}, {span} left"


def _politeness_key(given: str) -> str:
    """:func:`~crawlproject.frontier.sitelimits.host_key`, saying so when the
    key is not what was typed; a usage error if it names no host."""
    from crawlproject.frontier.sitelimits import host_key

    try:
        key = host_key(given)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key != given.strip().lower():
        print(f"{given}: politeness key {key!r} (host names, without scheme or port)",
              file=sys.stderr)
    return key


def _describe_override(value) -> str:
    from crawlproject.frontier.sitelimits import UNLIMITED

    delay = ("the nodes' DOWNLOAD_DELAY between request starts" if value.delay is None
             else f"at most one request every {value.delay:g}s")
    concurrency = ("the nodes' CONCURRENT_REQUESTS_PER_DOMAIN in flight"
                   if value.concurrency is None else
                   "no limit in flight" if value.concurrency >= UNLIMITED
                   else f"{value.concurrency} in flight")
    budget = "" if value.budget is None else f", at most {value.budget} new pages from now on"
    return f"{delay}, {concurrency}{budget}"
