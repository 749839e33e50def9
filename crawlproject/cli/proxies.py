"""crawlctl proxies: the proxy pool as a table (read by
:mod:`crawlproject.ops.proxies`); revive."""

from __future__ import annotations

import json
import sys

from crawlproject.ops.proxies import proxy_report
from crawlproject.cli.common import _client, terminal_text


def cmd_proxies(args) -> int:
    """The shared proxy pool: masked ids, health, bans per domain, retirements
    (the most troubled first, at most ``--limit`` rows unless ``--all``)."""
    if args.revive:
        from crawlproject.proxies.store import ProxyStore

        store = ProxyStore(_client(args), args.spider)
        for proxy_id in args.revive:
            done = store.revive(proxy_id)
            print(f"{proxy_id}: " + ("revived" if done else "was not retired"))
        return 0
    report = proxy_report(_client(args), args.spider, None if args.all else max(0, args.limit))
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        _print_proxies(args.spider, report)
    if report.get("error"):
        print(f"error: {report['error']}", file=sys.stderr)
        return 1
    return 0


def _print_proxies(spider: str, report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    text = terminal_text  # read from Redis: no markup, no terminal control characters

    rows, counts = report["proxies"], report.get("counts", {})
    table = Table(title=f"proxies of {text(spider)} (shared by all nodes; ids are host:port; "
                        "most troubled first)")
    for column in ("proxy", "ok", "failures", "bans", "latency", "banned for", "retired"):
        table.add_column(column, justify="left" if column in ("proxy", "banned for", "retired")
                         else "right")
    for pid, row in rows.items():
        banned = ", ".join(f"{text(d)} ({b['for_s']:g}s, strike {b['strikes']})"
                           for d, b in sorted(row.get("banned", {}).items())[:5])
        if len(row.get("banned", {})) > 5:
            banned += f" and {len(row['banned']) - 5} more hosts"
        lat = row.get("latency_ms")
        table.add_row(text(pid), str(row.get("ok", 0)), str(row.get("failures", 0)),
                      str(row.get("bans", 0)), f"{lat:.0f} ms" if lat else "", banned,
                      text(row.get("retired", "")))
    console = Console(width=max(Console().width, 140))
    console.print(table)
    if counts:
        console.print(f"{counts['shown']} of {counts['proxies']} proxies shown (--all or "
                      f"--limit N for more); {counts['retired']} retired, {counts['banned_now']} "
                      f"bans in force ({counts['ban_records']} ban records), "
                      f"{counts['invalid_entries']} invalid entries, {counts['bad_values']} "
                      "unreadable stored values", highlight=False)
    for node, info in sorted(report.get("no_usable_proxy", {}).items()):
        console.print(f"WARNING: node {text(node)} has had no usable proxy for "
                      f"{info['since_s_ago']:g}s", highlight=False)
    for entry in report["invalid_entries"]:
        console.print(f"invalid pool entry {entry['entry']}: {text(entry['reason'])}")
