"""crawlctl status and nodes: the cluster's state as a table or JSON (read by
:mod:`crawlproject.ops.status`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from crawlproject.connection import redact_url
from crawlproject.control import node_reports
from crawlproject.keys import (
    spider_keys,
)
from crawlproject.keys import as_text as _s
from crawlproject.ops.common import UsageError, current_project
from crawlproject.ops.budgets import budget_rows
from crawlproject.ops.status import status_data
from crawlproject.cli.common import _ago, _client, _partitions, _seed_keys, _spider_class, terminal_text


def cmd_status(args) -> int:
    """The crawl's shared state; ``--json`` for scripts, ``--watch`` to refresh.
    Without a spider: every spider of the project that has crawl state."""
    if args.spider is None:
        return _status_all(args)
    settings, spidercls = _spider_class(args)
    seeds = _seed_keys(args, settings, spidercls)
    parts = _partitions(args)
    if not spider_keys(parts[0].client, args.spider, seeds.key):
        if spidercls is None:
            print(f"error: unknown spider {args.spider!r}: no such spider in this project and "
                  f"no crawl state in Redis at {redact_url(args.redis_url)}", file=sys.stderr)
            return 1
        if not args.json:
            print(f"{args.spider}: no crawl state in Redis yet (push seeds to {seeds.key})")
    if args.json:
        print(json.dumps(status_data(args.spider, parts, seeds), sort_keys=True))
        return 0
    from rich.console import Console
    from rich.live import Live

    console = Console(width=max(Console().width, 140))
    if not args.watch:
        console.print(_status_table(args, status_data(args.spider, parts, seeds)))
        return 0
    with Live(console=console, auto_refresh=False) as live:
        try:
            while True:
                live.update(_status_table(args, status_data(args.spider, _partitions(args), seeds)),
                            refresh=True)
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0


def _status_all(args) -> int:
    """`status` of each spider of this project with state in Redis (one JSON
    object a line with ``--json``, one table each otherwise)."""
    settings, loader = current_project()
    names = sorted(loader.list()) if loader is not None else []
    if not names:
        raise UsageError("no Scrapy project here to find spiders in: name one "
                         "(crawlctl status SPIDER)")
    client = _client(args)
    active = [name for name in names if spider_keys(
        client, name, _seed_keys(argparse.Namespace(spider=name), settings,
                                 loader.load(name)).key)]
    if not active:
        print(f"no crawl state in Redis at {redact_url(args.redis_url)} for any spider of "
              f"this project ({', '.join(names)})")
        return 0
    if args.watch and len(active) > 1:
        raise UsageError(f"--watch shows one spider: name one of {', '.join(active)}")
    for name in active:
        code = cmd_status(argparse.Namespace(**{**vars(args), "spider": name}))
        if code:
            return code
    return 0


def _status_table(args, data: dict):
    from rich.console import Group
    from rich.table import Table

    table = Table(title=f"{args.spider} on {redact_url(args.redis_url)}")
    table.add_column("what")
    table.add_column("value", justify="right")
    control = data["control"]
    if data.get("crawl"):   # finished, stopped, idle, stuck... (crawlproject.ops.crawlstate)
        table.add_row("state", terminal_text(f"{data['crawl']['state']}: {data['crawl']['why']}"))
    table.add_row("operator control", _control_text(control))
    if control.get("then_clear"):
        table.add_row("when the drain is complete", "back to run by itself")
    if control.get("resume"):
        table.add_row("to crawl again (nodes started now wait)", terminal_text(control["resume"]))
    for name, value in data["frontier"].items():
        table.add_row(name, str(value))
    for name, value in data["seeds"].items():
        table.add_row(f"seeds {name}", str(value))
    table.add_row("pages/s, items/s (last minute, all nodes)",
                  f"{data['rates']['pages_per_s']:g} / {data['rates']['items_per_s']:g}")
    table.add_row("errors: download / callback (nodes running) / dead letters (all)",
                  f"{data['errors']['download']} / {data['errors']['callback']} / "
                  f"{data['errors']['dead_letters']}")
    for name, value in sorted(data["totals"].items()):
        table.add_row(f"total {terminal_text(name)}", str(value))
    for label, value in budget_rows(data.get("budgets") or {}):
        table.add_row(label, terminal_text(value))
    recrawl = data.get("recrawl") or {}
    if recrawl.get("at"):
        table.add_row("recrawl: pages / due now / fed (as of)",
                      f"{recrawl['pages']} / {recrawl['due']} / {recrawl['fed']} "
                      f"({_ago(recrawl['at'])})")
    proxy_pool = data.get("proxy_pool") or {}
    if proxy_pool.get("since") or proxy_pool.get("error"):
        table.add_row("proxy pool", terminal_text(proxy_pool.get("error") or (
            f"no usable proxy since {_ago(proxy_pool['since'])} "
            f"({proxy_pool['nodes']} nodes; crawlctl proxies)")))
    bloom = data["bloom"]
    if bloom["layers"]:
        table.add_row("bloom layers / items", f"{bloom['layers']} / {bloom['items']}")
        table.add_row("bloom fill ratio", f"{bloom['fill_ratio']:.4f}")
        table.add_row("bloom est. FP rate", f"{bloom['est_fp_rate']:.2e}")
        table.add_row("bloom bytes per item", f"{bloom['bytes_per_item']:.2f}")
    nodes = Table(title="nodes (reports every 5 s)")
    for column in ("node", "report age s", "state", "pages/s", "items/s", "pages", "items",
                   "errors", "leases", "downloading"):
        nodes.add_column(column, justify="left" if column in ("node", "state") else "right")
    for r in data["nodes"]:
        state = terminal_text(r.get("state", ""))
        nodes.add_row(terminal_text(r["node"]), f"{r['age_s']:g}",
                      state + " (waiting: found at start)" if r.get("waiting") == 1 else state,
                      f"{r.get('pages_per_s', 0):g}", f"{r.get('items_per_s', 0):g}",
                      str(r.get("pages", 0)), str(r.get("items", 0)), str(r.get("errors", 0)),
                      str(r.get("leases", 0)), str(r.get("downloading", "")))
    pol = data["politeness"]
    hosts = Table(title=f"hosts: {pol['hosts']}" + (
        f", {pol['blocked']} blocked, {pol['backing_off']} backing off (most queued first)"
        if "top" in pol else f" ({pol.get('note', '')})"))
    for column in ("host", "queued", "in flight", "next start in", "blocked for", "backoff"):
        hosts.add_column(column, justify="left" if column == "host" else "right")
    for row in pol.get("top", []):
        hosts.add_row(terminal_text(row["host"]), str(row["queued"]), str(row["inflight"]),
                      "" if row["next_start_in_s"] is None else f"{row['next_start_in_s']:g}s",
                      f"{row['blocked_for_s']:g}s" if row["blocked_for_s"] else "",
                      f"{row['backoff_s']:g}s" if row["backoff_s"] else "")
    return Group(table, hosts, nodes)


def _control_text(control: dict) -> str:
    """The state, who set it and when (every value from Redis through terminal_text)."""
    if control.get("error"):
        return f"{terminal_text(control['state'])} (ERROR: {terminal_text(control['error'], 500)})"
    text = terminal_text(control["state"])
    if control.get("since") or control.get("by"):
        text += (f" (since {_ago(control['since']) if control.get('since') else '?'}, by "
                 f"{terminal_text(control.get('by') or 'unknown')})")
    return text


def cmd_nodes(args) -> int:
    """The nodes' last reports (one JSON object a line; see `status`)."""
    parts = _partitions(args)
    registered = {_s(n) for part in parts for n in part.client.zrange(part.keys.nodes, 0, -1)}
    for report in node_reports(parts[0].client, args.spider):
        print(json.dumps({**report, "registered": report["node"] in registered}, sort_keys=True))
    return 0
