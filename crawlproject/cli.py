"""Small operator tool: seed, inspect and reset a crawl's shared state.

    python -m crawlproject.cli status [products] [--json] [--watch]
    python -m crawlproject.cli seed products http://127.0.0.1:8000/ '{"url": "...", "priority": 5}'
    python -m crawlproject.cli dead [list] products [-n 20]
    python -m crawlproject.cli dead requeue products [-n 1000]   # = replay products
    python -m crawlproject.cli dead purge products --yes         # = dead products --purge --yes
    python -m crawlproject.cli invalid [list|purge] products          # payloads moved aside
    python -m crawlproject.cli invalid-seeds [list|purge] products    # seeds moved aside
    python -m crawlproject.cli proxies products [--json] [--revive HOST:PORT]
    python -m crawlproject.cli pause|resume|drain|stop products   # every node, within ~1 s
    python -m crawlproject.cli reset products --yes [--keep-seeds] [--drop-proxy-pool]
    python -m crawlproject.cli recrawl products [--pattern REGEX] [--now]   # revisit pages
    python -m crawlproject.cli spool-replay [--mongo-uri URI] [--database DB] [--spool-dir DIR] [--spider products]
    python -m crawlproject.cli deploy [TARGET...] [--targets-file F] [--version V]
    python -m crawlproject.cli schedule products [TARGET...] -s MAX_IDLE_TIME_BEFORE_CLOSE=60
    python -m crawlproject.cli jobs [TARGET...] [--json]
    python -m crawlproject.cli dashboard [SPIDER...] [--host 127.0.0.1] [--port 9420]

``crawlctl`` (the package's console script) is the same program. The scrapyd
commands read targets from scrapy.cfg (``[deploy:NAME]``) or ``--targets-file``
and credentials from ``SCRAPYD_USERNAME``/``SCRAPYD_PASSWORD`` or ``~/.netrc``
(see crawlproject/scrapyd.py); they exit 1 naming every target that failed.

Connects to ``--redis-url`` (default: ``$REDIS_URL``, then the local default);
add ``--cluster`` for Redis Cluster. Passwords are never printed. Seeds are
checked exactly as the nodes check them (the project's spider class and
settings: published callbacks, ``SEED_META_ALLOW``) before they are pushed.
Errors are one line on stderr: exit 1 for Redis, 2 for bad input.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from crawlproject.connection import DEFAULT_REDIS_URL, env_default, redact_url, redis_from_url
from crawlproject.control import node_reports
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import (
    FrontierKeys,
    ProxyKeys,
    SeedKeys,
    check_spider_name,
    reset_spider,
    spider_keys,
    spooled_item_keys,
)
from crawlproject.ops.actions import CONTROL_COMMANDS, control_command, replay_dead_letters
from crawlproject.ops.common import (UsageError, _project, _s, _server_ms,
                                     frontier_partitions, project_spider, seed_keys_of)
from crawlproject.ops.proxies import proxy_report
from crawlproject.ops.status import status_data
from crawlproject.policy import InputPolicy
from crawlproject.seeds import InvalidSeed, check_seed, parse_seed


CONTROL_HINT = 1  # CONTROL_POLL_INTERVAL's default


# Terminal escape sequences: CSI (ESC [ ... or 0x9b), OSC (ESC ] ... BEL or
# ESC \, also unterminated), and any other ESC + one character.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?", re.DOTALL)
TERMINAL_TEXT_MAX = 200  # characters of one value read from Redis shown in a table


def terminal_text(value, limit: int = TERMINAL_TEXT_MAX) -> str:
    """*value* (read from Redis: untrusted) as rich markup that prints it as
    plain text: escape sequences removed, other control characters shown as
    ``?``, markup escaped, at most *limit* characters. Every value from Redis
    that the command line prints through rich goes through here."""
    from rich.markup import escape

    text = _ESCAPE_SEQUENCE.sub("", str(value))
    text = "".join(c if c.isprintable() else "?" for c in text)
    if len(text) > limit:
        text = text[:limit] + "…"
    return escape(text)


def _client(args):
    return redis_from_url(args.redis_url, cluster=args.cluster)


def _frontier(args) -> Frontier:
    """Partition 0 (the spider-wide keys live with it)."""
    return _partitions(args)[0]


def _partitions(args) -> list[Frontier]:
    return frontier_partitions(_client(args), args.spider)


def _spider_class(args):
    return project_spider(args.spider)


def _seed_keys(args, settings=None, spidercls=None) -> SeedKeys:
    return seed_keys_of(args.spider, settings, spidercls)


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
    settings, loader = _project()
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
    if control.get("error"):
        shown = f" (ERROR: {terminal_text(control['error'], 500)})"
    elif control.get("since"):
        shown = (f" (since {_ago(control.get('since'))}"
                 f"{', by ' + terminal_text(control['by']) if control.get('by') else ''})")
    else:
        shown = ""
    table.add_row("operator control", terminal_text(control["state"]) + shown)
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
        nodes.add_row(terminal_text(r["node"]), f"{r['age_s']:g}",
                      terminal_text(r.get("state", "")),
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


def _ago(ms) -> str:
    try:
        seconds = max(0.0, time.time() - int(ms) / 1000)
    except (TypeError, ValueError):
        return "?"
    return f"{seconds:.0f}s ago"


def cmd_control(args) -> int:
    """pause / resume / drain / stop: the state every node reads within ~1 s."""
    who = f"{os.environ.get('USER') or 'operator'}@{socket.gethostname()}"
    previous, state = control_command(_client(args), args.spider, args.command, who,
                                      force=args.force)
    print(f"{args.spider}: {previous} -> {state} (nodes follow within about "
          f"{CONTROL_HINT}s)")
    return 0


def _spider_name(name: str) -> str:
    """A spider name whose keys cannot be another spider's (argparse type)."""
    try:
        return check_spider_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_politeness(args) -> int:
    """Show the per-host politeness state, or change a host's limits at run time."""
    from crawlproject.frontier.politeness import (UNLIMITED, Limits, Override, limits_from,
                                                  partition_of, safe_key)
    from crawlproject.scheduler import HOST_LIMITS_REFRESH

    parts = _partitions(args)
    if args.delay is not None or args.concurrency is not None or args.clear:
        if not args.hosts:
            raise UsageError("name the host(s) whose limits to change")
        if args.concurrency is not None and args.concurrency < 1:
            # In settings 0 means "no limit"; typed here it is most likely meant
            # to stop a site: never read it as the opposite.
            raise UsageError("--concurrency must be 1 or more (requests of the host in flight "
                             "across all nodes); to hold a host back, raise --delay (up to "
                             "86400 s)")
        spec = {k: v for k, v in (("delay", args.delay), ("concurrency", args.concurrency))
                if v is not None}
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
                                 else current.get("concurrency")))
            part.set_limits({key: value})
            print(f"{key}: " + (_describe_override(value) + ", across all nodes"
                                if value is not None else
                                "limits cleared: the nodes' DOWNLOAD_DELAY and "
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
    now_ms = _server_ms(parts[0].client)
    rows, total = _politeness_rows(parts, [safe_key(h.lower()) for h in args.hosts],
                                   max(0, args.n))
    if args.json:
        print(json.dumps({"now_ms": now_ms, "hosts": rows, "hosts_total": total},
                         sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"politeness of {args.spider} (per host, across all nodes)")
    for column in ("host", "queued", "in flight", "limits", "next start in", "blocked for",
                   "backoff", "crawl delay"):
        table.add_column(column, justify="left" if column == "host" else "right")
    if total > len(rows):
        table.caption = (f"the {len(rows)} most queued of {total} hosts "
                         "(-n for more, or name hosts)")
    for key, row in rows.items():
        lim = row.get("limits")
        table.add_row(
            terminal_text(key), str(row.get("queued", 0)), str(row.get("inflight", 0)),
            (("settings'" if lim["delay"] is None else f"{lim['delay']:g}s") + " / "
             + ("settings'" if lim["concurrency"] is None else
                "no limit" if lim["concurrency"] >= UNLIMITED else str(lim["concurrency"]))
             + f" ({'cli' if lim['source'] == 'c' else 'settings'})")
            if lim else "defaults",
            _in(row.get("ready_at_ms"), now_ms), _in(row.get("blocked_until_ms"), now_ms),
            f"{row['backoff_ms'] / 1000:g}s" if row.get("backoff_ms") else "",
            f"{row['crawl_delay_ms'] / 1000:g}s" if row.get("crawl_delay_ms") else "")
    Console(width=max(Console().width, 140)).print(table)
    return 0


def _politeness_rows(parts: list, hosts: list[str], n: int) -> tuple[dict, int]:
    """The named *hosts*' rows (state and override), or else the *n* most
    queued hosts' and how many there are in all. Hosts are read in HSCAN
    windows and only the top *n* are kept: a crawl of millions of hosts is
    neither loaded into this process nor read from Redis in one command."""
    from crawlproject.frontier.politeness import partition_of

    limits = {}
    for part in parts:
        limits.update(part.limits())
    if hosts:
        by_part: dict[int, list[str]] = {}
        for key in hosts:
            by_part.setdefault(partition_of(key, len(parts)), []).append(key)
        rows = {}
        for p, keys in by_part.items():
            rows.update(parts[p].key_states(keys))
        rows = {key: {**state, "limits": limits.get(key)} for key, state in rows.items()}
        rows.update({key: {"limits": limits[key]} for key in hosts
                     if key in limits and key not in rows})
        return rows, len(rows)
    top: list[tuple[int, str]] = []       # a heap of (queued, key), least queued first
    kept: dict[str, dict] = {}
    for part in parts:
        for key, state in part.scan_key_states():
            if key in kept:               # HSCAN returned it again: the newer read
                kept[key] = state
                continue
            entry = (state["queued"], key)
            if len(top) < n:
                heapq.heappush(top, entry)
            elif n and entry > top[0]:
                kept.pop(heapq.heapreplace(top, entry)[1], None)
            else:
                continue
            kept[key] = state
    # Overrides of hosts without a state yet (set before any of their requests).
    extra: dict[int, list[str]] = {}
    for key in limits:
        if key not in kept:
            extra.setdefault(partition_of(key, len(parts)), []).append(key)
    missing = set()
    for p, keys in extra.items():
        states = parts[p].key_states(keys)
        missing.update(key for key in keys if key not in states)
    rows = {key: {**state, "limits": limits.get(key)}
            for key, state in sorted(kept.items(), key=lambda kv: (-kv[1]["queued"], kv[0]))}
    for key in sorted(missing)[:max(0, n - len(rows))]:
        rows[key] = {"limits": limits[key]}
    # (a count, not the scan's: HSCAN may return a field twice)
    return rows, sum(part.host_count() for part in parts) + len(missing)


def _politeness_key(given: str) -> str:
    """:func:`~crawlproject.frontier.politeness.host_key`, saying so when the
    key is not what was typed; a usage error if it names no host."""
    from crawlproject.frontier.politeness import host_key

    try:
        key = host_key(given)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key != given.strip().lower():
        print(f"{given}: politeness key {key!r} (host names, without scheme or port)",
              file=sys.stderr)
    return key


def _describe_override(value) -> str:
    from crawlproject.frontier.politeness import UNLIMITED

    delay = ("the nodes' DOWNLOAD_DELAY between request starts" if value.delay is None
             else f"at most one request every {value.delay:g}s")
    concurrency = ("the nodes' CONCURRENT_REQUESTS_PER_DOMAIN in flight"
                   if value.concurrency is None else
                   "no limit in flight" if value.concurrency >= UNLIMITED
                   else f"{value.concurrency} in flight")
    return f"{delay}, {concurrency}"


def cmd_proxies(args) -> int:
    """The shared proxy pool: masked ids, health, bans per domain, retirements
    (the most troubled first, at most ``--limit`` rows unless ``--all``)."""
    if args.revive:
        from crawlproject.proxystore import ProxyStore

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


def _in(at_ms, now_ms: int) -> str:
    if not at_ms or at_ms <= now_ms:
        return "now" if at_ms else ""
    return f"{(at_ms - now_ms) / 1000:.1f}s"


def cmd_seed(args) -> int:
    settings, spidercls = _spider_class(args)
    if spidercls is None:
        print(f"note: spider {args.spider!r} is not in this project: seeds are checked "
              "without its callbacks", file=sys.stderr)
    policy = InputPolicy.from_settings(settings, spidercls)
    key = _seed_keys(args, settings, spidercls).key
    if args.file:
        return _seed_file(args, policy, key)
    if not args.seeds:
        raise UsageError("give seeds, or --file FILE (- for standard input)")
    for raw in args.seeds:
        try:
            check_seed(raw, policy)
        except InvalidSeed as exc:
            raise UsageError(f"invalid seed {raw[:100]!r} ({exc.code}): {exc}") from None
    _client(args).lpush(key, *args.seeds)
    print(f"pushed {len(args.seeds)} seed(s) to {key}")
    return 0


SEED_CHUNK = 5000
SEED_ERRORS_SHOWN = 20


def _seed_file(args, policy: InputPolicy, key: str) -> int:
    """Stream a file of seeds (one a line; blank lines and ``#`` comments
    skipped): each line checked as the nodes check it, good ones pushed in
    pipelined chunks, bad ones reported with their line number (exit 2)."""
    from rich.progress import BarColumn, Progress, TextColumn, TransferSpeedColumn

    client = _client(args)
    try:
        source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    size = None if args.file == "-" else os.fstat(source.fileno()).st_size
    pushed = bad = 0
    chunk: list[bytes] = []

    def flush() -> None:
        nonlocal pushed
        if chunk:
            pipe = client.pipeline(transaction=False)
            for i in range(0, len(chunk), 1000):
                pipe.lpush(key, *chunk[i:i + 1000])
            pipe.execute()
            pushed += len(chunk)
            chunk.clear()

    progress = Progress(TextColumn("seeds"), BarColumn(), TextColumn("{task.fields[n]} lines"),
                        TransferSpeedColumn(), disable=not sys.stderr.isatty(),
                        console=None, transient=True)
    plain_checked = False
    with source, progress:
        task = progress.add_task("seed", total=size, n=0)
        for number, line in enumerate(source, 1):
            raw = line.strip()
            if raw and not raw.startswith(b"#"):
                try:
                    if plain_checked and not raw.startswith((b"{", b"[")):
                        # A plain URL: only its URL differs from the plain seed fully
                        # checked before, and parse_seed checks that with the engine's
                        # parser (4x faster than building and encoding its request).
                        parse_seed(raw)
                    else:
                        check_seed(raw, policy)
                        plain_checked = plain_checked or not raw.startswith((b"{", b"["))
                    chunk.append(raw)
                except InvalidSeed as exc:
                    bad += 1
                    if bad <= SEED_ERRORS_SHOWN:
                        print(f"line {number}: {exc.code}: {exc} ({raw[:80]!r})", file=sys.stderr)
                if len(chunk) >= SEED_CHUNK:
                    flush()
            if number % 10000 == 0:
                progress.update(task, completed=source.tell() if size else None, n=number)
        flush()
    if bad > SEED_ERRORS_SHOWN:
        print(f"... and {bad - SEED_ERRORS_SHOWN} more invalid line(s)", file=sys.stderr)
    print(f"pushed {pushed} seed(s) to {key}" + (f"; {bad} invalid line(s) not pushed" if bad
                                                 else ""))
    return 2 if bad else 0


def _purge(args, keys: list[str], what: str) -> int:
    if not args.yes:
        raise UsageError(f"refusing to delete {what} without --yes")
    client = _client(args)
    count = sum(client.llen(k) for k in keys)
    for key in keys:
        client.delete(key)
    print(f"purged {count} {what}")
    return 0


def _action(args) -> str:
    """The subcommand's action word (``list`` by default; ``--purge`` is ``purge``)."""
    if args.purge and args.action not in (None, "purge"):
        raise UsageError(f"--purge contradicts {args.action!r}")
    return "purge" if args.purge else (args.action or "list")


def cmd_dead(args) -> int:
    action = _action(args)
    if action == "requeue":
        return cmd_replay(args)
    parts = _partitions(args)
    if action == "purge":
        return _purge(args, [p.keys.dead for p in parts], "dead letter(s)")
    for part in parts:
        for record in part.dead_letters(args.n if args.n is not None else 20):
            record.pop("payload", None)
            print(json.dumps(record))
    return 0


def cmd_invalid(args) -> int:
    parts = _partitions(args)
    if _action(args) == "purge":
        return _purge(args, [p.keys.invalid for p in parts], "invalid payload(s)")
    for part in parts:
        for record in part.invalid_entries(args.n):
            print(json.dumps(record))
    return 0


def cmd_nodes(args) -> int:
    """The nodes' last reports (one JSON object a line; see `status`)."""
    parts = _partitions(args)
    registered = {_s(n) for part in parts for n in part.client.zrange(part.keys.nodes, 0, -1)}
    for report in node_reports(parts[0].client, args.spider):
        print(json.dumps({**report, "registered": report["node"] in registered}, sort_keys=True))
    return 0


def cmd_invalid_seeds(args) -> int:
    settings, spidercls = _spider_class(args)
    key = _seed_keys(args, settings, spidercls).invalid
    if _action(args) == "purge":
        return _purge(args, [key], "invalid seed(s)")
    for raw in _client(args).lrange(key, 0, args.n - 1):
        try:
            print(json.dumps(json.loads(raw)))
        except ValueError:
            print(json.dumps({"seed": raw.decode("utf-8", "replace"), "reason": "unreadable"}))
    return 0


def cmd_replay(args) -> int:
    count = args.n if args.n is not None else 1000
    print(f"replayed {replay_dead_letters(_partitions(args), count)} dead letter(s)")
    return 0


def cmd_reset(args) -> int:
    if not args.yes:
        raise UsageError("refusing to delete shared state without --yes")
    settings, spidercls = _spider_class(args)
    client = _client(args)
    spooled = {k: client.llen(k) for k in spooled_item_keys(client, args.spider)}
    if any(spooled.values()) and not args.drop_spooled_items:
        raise UsageError(
            f"{sum(spooled.values())} chunk(s) of items that nodes could not store in MongoDB "
            f"wait in {', '.join(spooled)}: store them first (spool-replay --spider "
            f"{args.spider}) or add --drop-spooled-items")
    deleted = reset_spider(client, args.spider, keep_seeds=args.keep_seeds,
                           seed_key=_seed_keys(args, settings, spidercls).key,
                           keep_proxy_pool=not args.drop_proxy_pool)
    kept = "" if args.drop_proxy_pool or not client.exists(ProxyKeys(args.spider).pool) else (
        f" (kept the proxy list {ProxyKeys(args.spider).pool}; --drop-proxy-pool deletes it)")
    print(f"deleted {deleted} key(s) of {args.spider}{kept}")
    return 0


def cmd_spool_replay(args) -> int:
    """Store the items a node left in its MongoDB spool, without crawling.

    Defaults as for the pipeline: the project's setting, else the environment
    variable (``MONGO_URI``, ``MONGO_DATABASE``, ``MONGO_SPOOL_DIR``), else the
    local default; a relative spool directory is under the project's ``.scrapy/``.
    """
    import asyncio

    from crawlproject.connection import (mongo_client_options, mongo_database_from_settings,
                                         mongo_uri_from_settings, setting)
    from crawlproject.pipelines.errors import MongoPipelineError
    from crawlproject.pipelines.replay import replay_spool
    from crawlproject.pipelines.spool import spool_path, target_dir

    settings, _ = _project()
    uri = args.mongo_uri or mongo_uri_from_settings(settings)
    database = args.database or mongo_database_from_settings(settings)
    base = spool_path(args.spool_dir or setting(settings, "MONGO_SPOOL_DIR", "mongo-spool"))

    async def run():
        redis = redis_from_url(args.redis_url, cluster=args.cluster, asyncio=True) \
            if args.spider else None
        try:
            return await replay_spool(uri, database, base, redis=redis, spider=args.spider,
                                      client_options=mongo_client_options(settings))
        finally:
            if redis is not None:
                await redis.aclose()

    try:
        replayed, left = asyncio.run(run())
    except MongoPipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    also = f" and Redis ({args.spider})" if args.spider else ""
    print(f"replayed {replayed} item(s) from {target_dir(base, uri, database)}{also}")
    if left:
        print(f"{left} item(s) still waiting (spool segments of a running node are left to it)",
              file=sys.stderr)
        return 1
    return 0


def cmd_recrawl(args) -> int:
    """Make the spider's known pages (those *pattern* finds) due for a revisit
    now; with ``--now`` the nodes look for due pages at once (else at their
    next ``RECRAWL_CHECK_INTERVAL``). Revisits are fed a bounded batch at a
    time and are as polite as any request."""
    import re
    from datetime import datetime, timezone

    import pymongo
    from pymongo.errors import PyMongoError

    from crawlproject.connection import (mongo_client, mongo_database_from_settings,
                                         mongo_uri_from_settings)
    from crawlproject.connection import collection_name
    from crawlproject.pipelines.errors import Scrubber
    from crawlproject.recrawl import PageVisit

    query: dict = {}
    if args.pattern:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            raise UsageError(f"--pattern {args.pattern!r} is not a regular expression: {exc}")
        query = {"url": {"$regex": args.pattern}}
    settings, _ = _project()
    uri = args.mongo_uri or mongo_uri_from_settings(settings)
    database = args.database or mongo_database_from_settings(settings)
    pages = collection_name("%(spider)s", PageVisit, args.spider)
    now = datetime.now(timezone.utc)
    client = mongo_client(uri, asyncio=False, settings=settings, serverSelectionTimeoutMS=5000)
    try:
        with pymongo.timeout(30):
            result = client[database][pages].update_many(query, {"$set": {"next_visit": now}})
    except PyMongoError as exc:
        print(f"error: MongoDB at {Scrubber(uri).redacted}: {Scrubber(uri).exception(exc)}",
              file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"{result.matched_count} page(s) of {args.spider} due for a revisit now "
          f"({database}.{pages}{', pattern ' + repr(args.pattern) if args.pattern else ''})")
    if args.now:
        _client(args).hincrby(FrontierKeys(args.spider).recrawl, "wake", 1)
        print(f"nodes of {args.spider} look for due pages within ~1 s")
    return 0


def cmd_dashboard(args) -> int:
    """The live dashboard in the browser (crawlproject/dashboard): every spider
    named, else every spider of the project."""
    from crawlproject.dashboard import DashboardConfig
    from crawlproject.dashboard.auth import Credentials
    from crawlproject.dashboard.server import run

    spiders = list(dict.fromkeys(args.spiders))
    if not spiders:
        _, loader = _project()
        spiders = sorted(loader.list()) if loader is not None else []
    if not spiders:
        raise UsageError("name the spider(s) to show: no Scrapy project here")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0 to 65535, got {args.port}")
    if args.interval <= 0 or args.window < args.interval:
        raise UsageError("--interval must be above 0 and --window at least one interval")
    config = DashboardConfig(spiders, args.redis_url, cluster=args.cluster,
                             credentials=Credentials.from_env(token_file=args.token_file),
                             interval=args.interval, window=args.window)
    return run(config, args.host, args.port)


# -- scrapyd nodes -------------------------------------------------------------------------
def _targets(args) -> list:
    from crawlproject.scrapyd import targets_from_cfg, targets_from_file

    known = (targets_from_file(args.targets_file, args.project or "crawlproject")
             if args.targets_file
             else targets_from_cfg(args.config))
    if args.project:
        for target in known.values():
            target.project = args.project
    names = args.targets or list(known)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        where = args.targets_file or args.config
        raise UsageError(f"unknown target(s) {', '.join(unknown)} (known in {where}: "
                         f"{', '.join(known) or 'none'})" if unknown else f"no target in {where}")
    return [known[n] for n in names]


def _each_target(targets, action) -> int:
    """Run *action(target)* on every target; name each that failed; 1 if any did."""
    from crawlproject.scrapyd import ScrapydError

    failed = []
    for target in targets:
        try:
            print(action(target))
        except ScrapydError as exc:
            failed.append(target.name)
            print(f"FAILED {exc}", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} of {len(targets)} target(s) failed: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


def cmd_deploy(args) -> int:
    """Build the egg once, upload it to every target."""
    from crawlproject.scrapyd import build_egg, default_version, upload

    targets = _targets(args)
    version = args.version or default_version()
    egg = Path(args.egg) if args.egg else build_egg(Path(args.config).resolve().parent)
    print(f"egg {egg.name} ({egg.stat().st_size // 1024} KiB), version {version}")

    def one(target):
        data = upload(target, egg, version)
        return f"ok {target.where}: project {data.get('project')} version {version}, " \
               f"spiders {data.get('spiders')}"

    return _each_target(targets, one)


def cmd_schedule(args) -> int:
    """Start SPIDER on every target (one job each)."""
    from crawlproject.scrapyd import schedule

    settings = dict(_pairs(args.set, "-s"))
    spider_args = dict(_pairs(args.arg, "-a"))
    return _each_target(_targets(args), lambda t: (
        f"ok {t.where}: job {schedule(t, args.spider, settings, spider_args)}"))


def cmd_jobs(args) -> int:
    """Pending, running and finished jobs of every target."""
    from crawlproject.scrapyd import jobs

    def one(target):
        data = jobs(target)
        if args.json:
            return json.dumps({"target": target.name, **{k: data.get(k, []) for k in
                                                        ("pending", "running", "finished")}})
        lines = [f"{target.where}: {len(data.get('pending', []))} pending, "
                 f"{len(data.get('running', []))} running, {len(data.get('finished', []))} finished"]
        for state in ("pending", "running", "finished"):
            for job in data.get(state, []):
                lines.append(f"  {state:8} {job.get('spider')} {job.get('id')} "
                             f"{job.get('start_time') or ''} {job.get('end_time') or ''}".rstrip())
        return "\n".join(lines)

    return _each_target(_targets(args), one)


def _pairs(items, flag: str):
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} expects NAME=VALUE, got {item!r}")
        yield name, value


def _add_target_options(p) -> None:
    p.add_argument("targets", nargs="*", help="target names (default: every target)")
    p.add_argument("--config", default="scrapy.cfg",
                   help="scrapy.cfg whose [deploy:NAME] sections are the targets")
    p.add_argument("--targets-file", help="'NAME URL' lines instead of scrapy.cfg")
    p.add_argument("--project", help="scrapyd project name (default: the target's, "
                                     "else crawlproject)")


#: action words of the list commands (the first is the default)
ACTIONS = {"dead": ("list", "requeue", "purge"), "invalid": ("list", "purge"),
           "invalid-seeds": ("list", "purge")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crawlctl",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=env_default("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--cluster", action="store_true",
                        default=env_default("REDIS_CLUSTER", "") in ("1", "true", "yes"))
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in [
        ("status", cmd_status, "queue, in-flight, delayed, dead, nodes, Bloom filter"),
        ("seed", cmd_seed, "check seeds as the nodes do, then push them to <spider>:start_urls"),
        ("dead", cmd_dead, "dead letters: list (reason, attempts), requeue (fresh retries) "
                           "or purge (with --yes)"),
        ("invalid", cmd_invalid, "payloads that were moved aside: list or purge (with --yes)"),
        ("invalid-seeds", cmd_invalid_seeds, "seeds that were moved aside, with the reason: "
                                             "list or purge (with --yes)"),
        ("replay", cmd_replay, "move dead letters back into the queue (= dead requeue)"),
        ("reset", cmd_reset, "delete the spider's queue, filter, seeds and seed claims"),
        ("politeness", cmd_politeness, "per-host politeness (limits, in flight, blocks); "
                                       "--delay/--concurrency HOST... change limits now"),
        ("proxies", cmd_proxies, "proxy pool: health, bans per domain, retired proxies "
                                 "(credentials masked); --revive ID brings one back"),
        ("nodes", cmd_nodes, "nodes' last reports: pages/s, items/s, errors, leases, state"),
        ("pause", cmd_control, "every node stops taking requests and seeds (leases kept)"),
        ("resume", cmd_control, "undo pause / drain / stop"),
        ("drain", cmd_control, "take no more seeds, finish the frontier, then nodes close"),
        ("stop", cmd_control, "nodes close now (leases back to the queue) until resume"),
    ]:
        p = sub.add_parser(name, help=help_)
        if name in ACTIONS:  # `dead [list|requeue|purge] SPIDER`
            p.add_argument("action", nargs="?", choices=ACTIONS[name],
                           help=f"default: list ({' | '.join(ACTIONS[name])})")
        if name == "status":
            p.add_argument("spider", nargs="?", type=_spider_name,
                           help="default: every spider of this project with crawl state")
        else:
            p.add_argument("spider", type=_spider_name)
        p.set_defaults(func=func)
        if name == "seed":
            p.add_argument("seeds", nargs="*")
            p.add_argument("--file", help="one seed a line (URL or JSON); - reads standard "
                                          "input; bad lines are reported, the others pushed")
        if name == "status":
            p.add_argument("--json", action="store_true", help="one JSON object (stable keys)")
            p.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
            p.add_argument("--interval", type=float, default=2.0, help="--watch period (s)")
        if name in ("dead", "invalid", "invalid-seeds", "replay"):
            p.add_argument("-n", type=int, default=20 if name in ("invalid", "invalid-seeds")
                           else None, help="records shown (default 20) or requeued (1000)")
        if name in ("dead", "invalid", "invalid-seeds"):
            p.add_argument("--purge", action="store_true", help="delete them all (with --yes)")
            p.add_argument("--yes", action="store_true")
        if name == "politeness":
            p.add_argument("hosts", nargs="*", help="politeness keys (hosts) to show or change")
            p.add_argument("--delay", type=float, help="seconds between request starts")
            p.add_argument("--concurrency", type=int, help="most requests in flight")
            p.add_argument("--clear", action="store_true", help="back to the settings' limits")
            p.add_argument("--json", action="store_true")
            p.add_argument("-n", type=int, default=50, help="hosts shown (most queued first)")
        if name == "proxies":
            p.add_argument("--json", action="store_true")
            p.add_argument("--limit", type=int, default=50,
                           help="proxies shown, most troubled first (default 50)")
            p.add_argument("--all", action="store_true", help="show every proxy")
            p.add_argument("--revive", nargs="+", metavar="HOST:PORT",
                           help="take these retired proxies back into the pool")
        if name in CONTROL_COMMANDS:
            p.add_argument("--force", action="store_true", help="replace a control key of "
                           "the wrong type (nodes treat one as pause)")
        if name == "reset":
            p.add_argument("--yes", action="store_true")
            p.add_argument("--keep-seeds", action="store_true")
            p.add_argument("--drop-spooled-items", action="store_true",
                           help="also delete items handed to Redis that are not in MongoDB yet")
            p.add_argument("--drop-proxy-pool", action="store_true",
                           help="also delete the operator's proxy list {spider}:proxies")
    p = sub.add_parser("recrawl", help="make known pages due for a revisit now (conditional "
                       "requests; unchanged pages are not parsed again)")
    p.add_argument("spider")
    p.add_argument("--pattern", help="only pages whose URL this regular expression finds")
    p.add_argument("--now", action="store_true",
                   help="nodes look for due pages at once (else at their next check)")
    p.add_argument("--mongo-uri", help="default: MONGO_URI (setting, then environment)")
    p.add_argument("--database", help="default: MONGO_DATABASE (setting, then environment)")
    p.set_defaults(func=cmd_recrawl)
    p = sub.add_parser("dashboard", help="live dashboard in the browser (127.0.0.1; any other "
                       "address needs DASHBOARD_TOKEN or DASHBOARD_USERNAME/_PASSWORD)")
    p.add_argument("spiders", nargs="*", help="spiders to show (default: the project's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=9420, help="port (0: a free one, printed)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reads of Redis")
    p.add_argument("--window", type=float, default=600.0, help="seconds the charts show")
    p.add_argument("--token-file", help="read the access token from this file "
                                        "(else $DASHBOARD_TOKEN; never on the command line)")
    p.set_defaults(func=cmd_dashboard)
    p = sub.add_parser("spool-replay", help="store the items a node left in its MongoDB spool "
                       "(no crawl); exit 0 when none is left")
    p.add_argument("--mongo-uri", help="default: MONGO_URI (setting, then environment)")
    p.add_argument("--database", help="default: MONGO_DATABASE (setting, then environment)")
    p.add_argument("--spool-dir", help="MONGO_SPOOL_DIR of the node (setting, then environment)")
    p.add_argument("--spider", help="also store the items nodes of this spider handed to Redis")
    p.set_defaults(func=cmd_spool_replay)
    p = sub.add_parser("deploy", help="build the project egg once and upload it to every "
                       "scrapyd target; exit 1 naming each target that refused")
    _add_target_options(p)
    p.add_argument("--version", help="default: <unix time>-<git commit>")
    p.add_argument("--egg", help="upload this egg instead of building one")
    p.set_defaults(func=cmd_deploy)
    p = sub.add_parser("schedule", help="start SPIDER on every scrapyd target")
    p.add_argument("spider")
    _add_target_options(p)
    p.add_argument("-s", "--set", action="append", metavar="NAME=VALUE",
                   help="a Scrapy setting for the job (repeatable)")
    p.add_argument("-a", "--arg", action="append", metavar="NAME=VALUE",
                   help="a spider argument (repeatable)")
    p.set_defaults(func=cmd_schedule)
    p = sub.add_parser("jobs", help="pending, running and finished jobs of every scrapyd target")
    _add_target_options(p)
    p.add_argument("--json", action="store_true", help="one JSON object per target")
    p.set_defaults(func=cmd_jobs)
    return parser


def main(argv: list[str] | None = None) -> int:
    from redis.exceptions import RedisClusterException, RedisError

    from crawlproject.scrapyd import ScrapydError

    args = build_parser().parse_args(argv)
    where = redact_url(args.redis_url)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ScrapydError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # e.g. an http:// REDIS_URL
        print(f"error: {str(exc).replace(args.redis_url, where)}", file=sys.stderr)
        return 2
    except (RedisError, RedisClusterException) as exc:  # the cluster's is not a RedisError
        message = str(exc).replace(args.redis_url, where)
        print(f"error: Redis at {where}: {type(exc).__name__}: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
