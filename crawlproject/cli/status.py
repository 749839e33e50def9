"""crawlctl status and nodes: the cluster's state as a table or JSON (read by
:mod:`crawlproject.ops.status`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from crawlproject.connection import redact_url
from crawlproject.control import REPORT_STALE_S, node_reports, node_reports_key
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
    if args.json and not args.watch:
        print(json.dumps(status_data(args.spider, parts, seeds), sort_keys=True))
        return 0
    from rich.console import Console

    console = Console(width=max(Console().width, 140))
    if not args.watch:
        console.print(_status_table(args, status_data(args.spider, parts, seeds)))
        return 0
    if args.count is not None and args.count < 1:
        raise UsageError(f"--count must be 1 or more, got {args.count}")
    try:
        if args.json or not console.is_terminal:
            return _watch_frames(args, seeds, console)
        from rich.live import Live

        with Live(console=console, auto_refresh=False) as live:
            for frame in _frames(args):
                if frame:
                    time.sleep(args.interval)
                live.update(_status_table(args, status_data(args.spider, _partitions(args),
                                                            seeds)), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def _frames(args):
    """0, 1, 2... (``--count`` of them, else for ever): the frames of ``--watch``;
    a true value means "wait an interval first"."""
    frame = 0
    while args.count is None or frame < args.count:
        yield frame
        frame += 1


def _watch_frames(args, seeds, console) -> int:
    """``--watch`` into a pipe or file (rich's live display prints nothing
    there): one frame after another, each under a line with the time; with
    ``--json``, one JSON object a line."""
    for frame in _frames(args):
        if frame:
            time.sleep(args.interval)
        data = status_data(args.spider, _partitions(args), seeds)
        if args.json:
            print(json.dumps(data, sort_keys=True), flush=True)
            continue
        console.print(f"--- {args.spider} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---",
                      markup=False, highlight=False)
        console.print(_status_table(args, data))
        console.file.flush()
    return 0


def _project_spiders(command: str):
    """The project's settings, spider loader and spider names, for a command run
    without a spider (a usage error outside a project or with no spider)."""
    settings, loader = current_project()
    names = sorted(loader.list()) if loader is not None else []
    if not names:
        raise UsageError("no Scrapy project here to find spiders in: name one "
                         f"(crawlctl {command} SPIDER)")
    return settings, loader, names


def _status_all(args) -> int:
    """`status` of each spider of this project with state in Redis (one JSON
    object a line with ``--json``, one table each otherwise)."""
    settings, loader, names = _project_spiders("status")
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
    backlog = data.get("backlog") or {}
    if backlog:
        table.add_row("queued: in Redis / in MongoDB (backlog)",
                      f"{backlog['queued_redis']} / {backlog['queued_mongodb']}")
        table.add_row("moves waiting (spill or refill; the oldest waits)",
                      f"{backlog['moves_waiting']}" + (
                          f" ({backlog['oldest_move_age_s']:g} s)"
                          if backlog.get("oldest_move_age_s") is not None else ""))
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
    nodes = _nodes_table("nodes (reports every 5 s)", data["nodes"])
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
    return Group(table, hosts, *_backlog_tables(backlog), nodes)


def _backlog_tables(backlog: dict) -> list:
    """The two tiers per partition (when there are several, or anything in
    MongoDB or waiting to move) and the largest backlogs (keys from Redis:
    through terminal_text)."""
    from rich.table import Table

    rows = backlog.get("partitions") or []
    if not (len(rows) > 1 or backlog.get("queued_mongodb") or backlog.get("moves_waiting")):
        return []
    tiers = Table(title="frontier tiers per partition (Redis bookkeeping; MongoDB not counted)")
    for column in ("partition", "queued in Redis", "queued in MongoDB", "moves waiting",
                   "oldest move waits"):
        tiers.add_column(column, justify="right")
    for r in rows:
        tiers.add_row(str(r["partition"]), str(r["queued_redis"]), str(r["queued_mongodb"]),
                      str(r["moves_waiting"]), "" if r["oldest_move_age_s"] is None
                      else f"{r['oldest_move_age_s']:g} s")
    out = [tiers]
    if backlog.get("largest"):
        largest = Table(title="largest backlogs (entries in MongoDB)")
        for column in ("key", "partition", "in MongoDB"):
            largest.add_column(column, justify="left" if column == "key" else "right")
        for r in backlog["largest"]:
            largest.add_row(terminal_text(r["key"]), str(r["partition"]),
                            str(r["queued_mongodb"]))
        out.append(largest)
    return out


def _nodes_table(title: str, reports: list[dict], registered: bool = False):
    """The nodes' reports as a rich table (every value from Redis through
    terminal_text); *registered*: a column saying whether it holds a lease slot."""
    from rich.table import Table

    nodes = Table(title=title)
    columns = ["node", "report age s", "state", "pages/s", "items/s", "pages", "items",
               "errors", "leases", "downloading"] + ["registered"] * registered
    for column in columns:
        nodes.add_column(column, justify="left" if column in ("node", "state") else "right")
    for r in reports:
        state = terminal_text(r.get("state", ""))
        nodes.add_row(terminal_text(r["node"]), f"{r['age_s']:g}",
                      state + " (waiting: found at start)" if r.get("waiting") == 1 else state,
                      f"{r.get('pages_per_s', 0):g}", f"{r.get('items_per_s', 0):g}",
                      str(r.get("pages", 0)), str(r.get("items", 0)), str(r.get("errors", 0)),
                      str(r.get("leases", 0)), str(r.get("downloading", "")),
                      *(["yes" if r.get("registered") else "no"] * registered))
    return nodes


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
    """The nodes' last reports, a table (``--json``: one JSON object a line).
    Without a spider: those of every spider of the project that has reports."""
    if args.spider is None:
        _, _, names = _project_spiders("nodes")
        client = _client(args)
        spiders = [name for name in names if client.exists(node_reports_key(name))]
        if not spiders:
            print(f"no node has reported to Redis at {redact_url(args.redis_url)} in the last "
                  f"{REPORT_STALE_S // 60} minutes for any spider of this project "
                  f"({', '.join(names)})", file=sys.stderr if args.json else sys.stdout)
            return 0
    else:
        spiders = [args.spider]
    console = None
    for spider in spiders:
        parts = _partitions(argparse.Namespace(**{**vars(args), "spider": spider}))
        registered = {_s(n) for part in parts
                      for n in part.client.zrange(part.keys.nodes, 0, -1)}
        reports = [{**r, "registered": r["node"] in registered}
                   for r in node_reports(parts[0].client, spider)]
        if args.json:
            for report in reports:
                print(json.dumps({**report, "spider": spider}, sort_keys=True))
            continue
        from rich.console import Console

        console = console or Console(width=max(Console().width, 140))
        if not reports:
            console.print(f"{spider}: no node has reported in the last "
                          f"{REPORT_STALE_S // 60} minutes", markup=False, highlight=False)
            continue
        console.print(_nodes_table(f"{terminal_text(spider)}: nodes (reports every 5 s)",
                                   reports, registered=True))
    return 0
