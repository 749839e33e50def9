"""The dashboard's HTML, rendered on the server (the page and the fragments that
live updates swap in): one renderer, so what the first page shows and what the
updates show cannot drift apart.

Everything read from Redis (node ids, hosts, proxy ids, states, reasons) is
untrusted: every value goes through :func:`html.escape`, and the data embedded
for the script is JSON with ``<``, ``>`` and ``&`` escaped.
"""

from __future__ import annotations

import html
import json
import time
from urllib.parse import quote

from crawlproject.ops.budgets import unread_note

ACTIONS = {
    "pause": ("Pause", "Every node of {spider} stops taking requests and seeds within about "
                       "a second; downloads already started finish, leases are kept."),
    "resume": ("Resume", "Every node of {spider} goes on where it was (state run)."),
    "drain": ("Drain", "Nodes of {spider} take no more seeds, finish the frontier, then close."),
    "replay": ("Requeue dead letters", "The dead letters of {spider} go back into the queue "
                                       "with fresh retries."),
}
STATE_HELP = {"run": "nodes take work when there is some", "pause": "paused: no node takes work",
              "drain": "draining: no seeds taken, nodes close when the frontier is done",
              "stop": "stopped: nodes close, nodes started later wait (resume to start again)"}


def e(value) -> str:
    """Escaped text of any value (None is empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


def n(value) -> str:
    """A count with thousands separators; other numbers as they are."""
    if isinstance(value, bool) or value is None:
        return e(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}".rstrip("0").rstrip(".") if value == value else "?"
    return e(value)


def utc(ms) -> str:
    """``<time>`` of a unix time in ms (UTC, seconds)."""
    try:
        seconds = int(ms) / 1000
    except (TypeError, ValueError):
        return ""
    stamp = time.gmtime(seconds)
    return (f'<time datetime="{time.strftime("%Y-%m-%dT%H:%M:%SZ", stamp)}">'
            f'{time.strftime("%H:%M:%S", stamp)} UTC</time>')


def json_script(element_id: str, data) -> str:
    """Data for the script, safe inside HTML (never executed: CSP allows no inline script)."""
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c") \
        .replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{e(element_id)}">{text}</script>'


def _dl(rows: list[tuple[str, str, object]]) -> str:
    items = "".join(f'<div><dt>{e(label)}</dt><dd data-field="{e(field)}">{n(value)}</dd></div>'
                    for label, field, value in rows)
    return f'<dl class="stats">{items}</dl>'


def _table(caption: str, columns: list[str], rows: list[list[str]], empty: str,
           numeric_from: int = 1) -> str:
    if not rows:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f'<th scope="col"{" class=num" if i >= numeric_from else ""}>{e(c)}</th>'
                   for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(
        (f'<th scope="row">{cell}</th>' if i == 0 else
         f'<td{" class=num" if i >= numeric_from else ""}>{cell}</td>')
        for i, cell in enumerate(row)) + "</tr>" for row in rows)
    # A region the keyboard can scroll when the table is wider than the screen.
    return (f'<div class="table-wrap" tabindex="0" role="region" aria-label="{e(caption)}">'
            f'<table><caption>{e(caption)}</caption><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


# -- fragments ------------------------------------------------------------------------
def control_fragment(data: dict) -> str:
    control = data["control"]
    state = control.get("state", "run")
    since = f" since {utc(control['since'])}" if control.get("since") else ""
    by = f" by {e(control['by'])}" if control.get("by") else ""
    error = (f'<p class="error" role="alert">{e(control["error"])}</p>'
             if control.get("error") else "")   # a control key of the wrong type
    then = "; back to run by itself once complete" if control.get("then_clear") else ""
    resume = (f'<p>The state stays in Redis: nodes started now wait. To crawl again: Resume, '
              f'or <code>{e(control["resume"])}</code></p>'
              if control.get("resume") and state in ("stop", "drain") else "")
    crawl = data.get("crawl") or {"state": "unknown", "why": ""}
    return (f'<p class="crawl-state">State: <strong class="state state-{e(crawl["state"])}" '
            f'data-field="crawl.state">{e(crawl["state"])}</strong> — '
            f'<span data-field="crawl.why">{e(crawl["why"])}</span></p>'
            f'<p>Operator control: <strong class="state state-{e(state)}" '
            f'data-field="control.state">{e(state)}</strong> '
            f'({e(STATE_HELP.get(state, state))}){since}{by}{e(then)}</p>{resume}{error}')


def frontier_fragment(data: dict) -> str:
    f, s = data["frontier"], data["seeds"]
    return _dl([("queued", "frontier.queued", f["queued"]),
                ("in flight", "frontier.inflight", f["inflight"]),
                ("delayed (retries)", "frontier.delayed", f["delayed"]),
                ("dead letters", "frontier.dead", f["dead"]),
                ("invalid", "frontier.invalid", f["invalid"]),
                ("hosts", "frontier.hosts", f["hosts"]),
                ("nodes registered", "frontier.nodes", f["nodes"]),
                ("nodes holding leases", "frontier.nodes_holding_leases",
                 f.get("nodes_holding_leases", 0)),
                ("seeds waiting", "seeds.waiting", s["waiting"]),
                ("seeds claimed", "seeds.claimed", s["claimed"]),
                ("seeds invalid", "seeds.invalid", s["invalid"])])


def backlog_fragment(data: dict) -> str:
    """The frontier's two tiers: queued in Redis and in MongoDB per partition,
    the moves waiting, the largest backlogs (Redis' bookkeeping only)."""
    b = data.get("backlog") or {}
    if not b:
        return '<p class="empty">No backlog data.</p>'
    age = b.get("oldest_move_age_s")
    out = _dl([("queued in Redis", "backlog.queued_redis", b["queued_redis"]),
               ("queued in MongoDB", "backlog.queued_mongodb", b["queued_mongodb"]),
               ("moves waiting", "backlog.moves_waiting", b["moves_waiting"]),
               ("oldest move waits (s)", "backlog.oldest_move_age_s",
                "" if age is None else age)])
    rows = [[n(r["partition"]), n(r["queued_redis"]), n(r["queued_mongodb"]),
             n(r["moves_waiting"]),
             "" if r["oldest_move_age_s"] is None else f'{n(r["oldest_move_age_s"])} s']
            for r in b.get("partitions") or []]
    out += _table("Queued per partition, in Redis and in MongoDB",
                  ["partition", "in Redis", "in MongoDB", "moves waiting", "oldest move waits"],
                  rows, "No partition.", numeric_from=0)
    largest = [[e(r["key"]), n(r["partition"]), n(r["queued_mongodb"])]
               for r in b.get("largest") or []]
    return out + _table("Largest backlogs (entries in MongoDB)",
                        ["key", "partition", "in MongoDB"], largest,
                        "No key has entries in MongoDB.")


def totals_of(data: dict) -> list[tuple[str, str, object]]:
    """What the crawl has done in all (it stays once the nodes are gone): pages
    crawled (the frontier's count), items stored (MongoDB; else what the
    running nodes count)."""
    crawl, stored = data.get("crawl") or {}, data.get("stored") or {}
    # (nodes add their counts to the frontier's every report: while they run,
    # their own counts may be ahead)
    pages = max(crawl.get("pages_crawled", 0), sum(r.get("pages", 0) for r in data["nodes"]))
    rows = [("pages crawled (all time)", "crawl.pages_crawled", pages)]
    if stored.get("items") is not None:
        rows.append(("items stored (MongoDB)", "stored.items", stored["items"]))
    else:
        rows.append(("items (running nodes' count)", "stored.items",
                     sum(r.get("items", 0) for r in data["nodes"])))
    return rows


def rates_fragment(data: dict) -> str:
    r, err = data["rates"], data["errors"]
    stored = data.get("stored") or {}
    note = (f'<p class="warn">Items stored: cannot count ({e(stored["error"])})</p>'
            if stored.get("error") else
            f'<p class="where">Items counted in MongoDB collection <code>{e(stored["where"])}'
            '</code> (estimated count).</p>' if stored.get("items") is not None else "")
    return _dl(totals_of(data) + [("pages/s", "rates.pages_per_s", r["pages_per_s"]),
                ("items/s", "rates.items_per_s", r["items_per_s"]),
                ("download errors", "errors.download", err["download"]),
                ("callback errors", "errors.callback", err["callback"]),
                ("dead letters (all time)", "errors.dead_letters", err["dead_letters"]),
                ("new pages refused over a budget", "totals.budget_refused",
                 data.get("totals", {}).get("budget_refused", 0))]) + note


def nodes_fragment(data: dict) -> str:
    rows = []
    for r in data["nodes"]:
        heartbeat = r.get("heartbeat_age_s")
        rows.append([e(r["node"]), e(r.get("state", "")) + (
                         " (waiting: found at start)" if r.get("waiting") == 1 else ""),
                     n(heartbeat) if heartbeat is not None else "",
                     n(r.get("lease_left_s")) if r.get("registered") else "not registered",
                     n(r["age_s"]), n(r.get("pages_per_s", 0)), n(r.get("items_per_s", 0)),
                     n(r.get("pages", 0)), n(r.get("items", 0)),
                     f'{n(r.get("errors_download", 0))} / {n(r.get("errors_callback", 0))}',
                     # the frontier's count, as "nodes holding leases" above
                     n(r.get("leases_held", r.get("leases", 0))),
                     n(r["downloading"]) if "downloading" in r else ""])
    return _table("Nodes (each reports every 5 s; seconds)",
                  ["node", "state", "heartbeat age", "lease left", "report age", "pages/s",
                   "items/s", "pages", "items", "errors download / callback", "leases",
                   "downloading"],
                  rows, "No node is running (a node removes its report when it closes).",
                  numeric_from=2)


def _limit(value, unit: str) -> str:
    """One field of a host's override; None: the nodes' setting applies."""
    return "settings'" + unit if value is None else n(value) + unit


def hosts_fragment(data: dict) -> str:
    pol = data["politeness"]
    if "top" not in pol:
        return f'<p>{n(pol["hosts"])} hosts: {e(pol.get("note", ""))}</p>'
    rows = []
    for h in pol["top"]:
        lim = h.get("limits")
        limits = (f'{_limit(lim["delay"], " s")}, {_limit(lim["concurrency"], " at once")} '
                  f'({"crawlctl" if lim.get("source") == "c" else "settings"})'
                  if lim else "settings")
        blocked = ""
        if h["blocked_for_s"]:
            until = utc(data["at"] + h["blocked_for_s"] * 1000)
            blocked = f'{n(h["blocked_for_s"])} s (until {until})'
        rows.append([e(h["host"]), n(h["queued"]), n(h["inflight"]), e(limits),
                     "" if h["next_start_in_s"] is None else f'{n(h["next_start_in_s"])} s',
                     blocked, f'{n(h["backoff_s"])} s' if h["backoff_s"] else "",
                     f'{n(h["crawl_delay_s"])} s' if h["crawl_delay_s"] else ""])
    summary = (f'<p><span data-field="politeness.hosts">{n(pol["hosts"])}</span> hosts, '
               f'<span data-field="politeness.blocked">{n(pol["blocked"])}</span> blocked, '
               f'<span data-field="politeness.backing_off">{n(pol["backing_off"])}</span> '
               f'backing off; the most queued:</p>')
    return summary + _table("Per-host politeness (limits for all nodes together)",
                            ["host", "queued", "in flight", "limits (delay, concurrency)",
                             "next start in", "blocked for", "backoff", "crawl delay"],
                            rows, "No host in the frontier yet.")


#: below this share of its capacity a filter's bytes over its URLs say nothing
#: (it is sized for its capacity up front: 164,124 bytes per URL for a few URLs)
BLOOM_PER_URL_MIN_SHARE = 0.1


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,} bytes"


def bloom_fragment(data: dict) -> str:
    b = data["bloom"]
    if not b["layers"]:
        return '<p class="empty">The Bloom filter is empty.</p>'
    rows = [("layers", "bloom.layers", b["layers"]), ("URLs seen", "bloom.items", b["items"]),
            ("fill", "bloom.fill_ratio", f'{b["fill_ratio"] * 100:.3g} %'),
            ("estimated false-positive rate", "bloom.est_fp_rate", f'{b["est_fp_rate"]:.2e}')]
    capacity, size = b.get("capacity", 0), b.get("bytes", 0)
    if size:
        rows.append(("memory", "bloom.bytes", _bytes(size)))
    if capacity and size:
        rows.append(("URLs it holds at its error rate", "bloom.capacity", capacity))
        rows.append(("bytes per URL at capacity", "bloom.bytes_per_capacity",
                     round(size / capacity, 2)))
    if b["items"] >= BLOOM_PER_URL_MIN_SHARE * capacity and b["items"]:
        rows.append(("bytes per URL seen", "bloom.bytes_per_item", b["bytes_per_item"]))
    return _dl(rows)


def budgets_fragment(data: dict) -> str:
    b = data.get("budgets") or {}
    if not b.get("refused"):
        return '<p class="empty">No budget has refused a page.</p>'
    rows = [[e(r["key"]), n(r["admitted"]), f'{n(r["budget"])} ({e(r["source"])})',
             n(r["refused"])] for r in b.get("keys", [])]
    summary = (f'<p><span data-field="budgets.spent">{n(b["spent"])}</span> key(s) spent their '
               f'budget; <span data-field="budgets.refused">{n(b["refused"])}</span> new pages '
               f'refused, {n(b["admitted"])} admitted while budgets apply'
               f'{e(unread_note(b))}. Refused pages are counted, '
               "not queued: raise a budget with <code>crawlctl politeness SPIDER HOST "
               "--budget N</code>.</p>")
    return summary + _table("Spent budgets (most refused first)",
                            ["key", "new pages admitted", "budget", "refused"], rows, "")


def recrawl_fragment(data: dict) -> str:
    r = data.get("recrawl") or {}
    if not r.get("at"):
        return '<p class="empty">No revisit feeder has reported (RECRAWL_ENABLED is off).</p>'
    return _dl([("known pages", "recrawl.pages", r["pages"]),
                ("due now, not yet fed", "recrawl.due", r["due"]),
                ("fed to the frontier", "recrawl.fed", r["fed"]),
                ("reported", "recrawl.at", utc(r["at"]))])


def proxies_fragment(data: dict) -> str:
    report = data.get("proxies") or {"proxies": {}, "invalid_entries": []}
    rows = []
    for pid, p in report["proxies"].items():  # most troubled first (proxy_report)
        banned = ", ".join(f'{e(d)} ({n(b["for_s"])} s, strike {n(b["strikes"])})'
                           for d, b in sorted(p.get("banned", {}).items()))
        lat = p.get("latency_ms")
        rows.append([e(pid), n(p.get("ok", 0)), n(p.get("failures", 0)), n(p.get("bans", 0)),
                     f"{lat:.0f} ms" if isinstance(lat, (int, float)) else "",
                     n(p.get("failures_in_a_row", 0)),
                     f'{n(p["last_seen_s_ago"])} s ago' if "last_seen_s_ago" in p else "",
                     banned, e(p.get("retired", ""))])
    table = _table("Proxy pool (ids are host:port, credentials never shown)",
                   ["proxy", "ok", "failures", "bans", "latency", "failures in a row",
                    "last used", "banned for", "retired"],
                   rows, "No proxy pool for this spider.")
    bad = report.get("invalid_entries") or []
    counts = report.get("counts") or {}
    if bad:
        table += (f'<p class="warn">{n(counts.get("invalid_entries", len(bad)))} pool entries '
                  "do not parse: " + ", ".join(f'{e(b["entry"])} ({e(b["reason"])})'
                                               for b in bad[:10]) + "</p>")
    if counts:
        table += (f'<p>{n(counts["shown"])} of {n(counts["proxies"])} proxies shown (most '
                  f'troubled first); {n(counts["retired"])} retired, {n(counts["banned_now"])} '
                  f'bans in force ({n(counts["ban_records"])} ban records)</p>')
    if report.get("error"):
        table += f'<p class="error" role="alert">{e(report["error"])}</p>'
    for node, info in sorted((report.get("no_usable_proxy") or {}).items()):
        table += (f'<p class="error" role="alert">No usable proxy on node {e(node)} for '
                  f'{n(info.get("since_s_ago", 0))} s</p>')
    return table


def totals_fragment(data: dict) -> str:
    rows = [[e(k), n(v)] for k, v in sorted(data["totals"].items())]
    return _table("Cluster-wide counters", ["counter", "value"], rows, "No counters yet.")


FRAGMENTS = {"control": control_fragment, "frontier": frontier_fragment,
             "rates": rates_fragment, "nodes": nodes_fragment, "hosts": hosts_fragment,
             "bloom": bloom_fragment, "budgets": budgets_fragment,
             "recrawl": recrawl_fragment, "proxies": proxies_fragment,
             "totals": totals_fragment, "backlog": backlog_fragment}


def fragments(feed) -> dict[str, str]:
    """Every live region's HTML for the feed's latest data, and its status line."""
    status = (f'<span class="error" role="alert">Cannot read the crawl state: {e(feed.error)}'
              "</span> " if feed.error else "")
    if feed.latest is None:
        return {"updated": status or "no data yet"}
    out = {name: render(feed.latest) for name, render in FRAGMENTS.items()}
    out["updated"] = status + f"updated {utc(feed.latest['at'])}"
    return out


# -- pages ----------------------------------------------------------------------------
def _head(title: str, csrf: str = "") -> str:
    meta = f'<meta name="csrf-token" content="{e(csrf)}">' if csrf else ""
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'{meta}<title>{e(title)}</title>'
            '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/uPlot.min.css">'
            '<link rel="stylesheet" href="/static/dashboard.css">')


def _nav(spiders: list[str], current: str | None) -> str:
    links = "".join(
        f'<li><a href="/spider/{quote(s, safe="")}"'
        f'{" aria-current=page" if s == current else ""}>{e(s)}</a></li>' for s in spiders)
    return f'<nav aria-label="Spiders"><ul>{links}</ul></nav>'


CONFIRM_DIALOG = (
    '<dialog id="confirm" aria-labelledby="confirm-title" aria-describedby="confirm-text">'
    '<form method="dialog"><h2 id="confirm-title">Confirm</h2><p id="confirm-text"></p>'
    '<div class="buttons"><button value="cancel" id="confirm-cancel" autofocus>Cancel</button>'
    '<button value="confirm" id="confirm-ok" class="primary">Confirm</button></div></form>'
    '</dialog>')


def spider_page(feed, spiders: list[str], csrf: str, where: str, window: float,
                user: str | None) -> str:
    """The dashboard of one spider, filled with the latest snapshot."""
    spider, frags = feed.spider, fragments(feed)
    path = f"/api/spiders/{quote(spider, safe='')}"
    return (
        _head(f"{spider} · crawl dashboard", csrf)
        + '<script src="/static/uPlot.iife.min.js" defer></script>'
        '<script src="/static/dashboard.js" defer></script></head><body>'
        '<a class="skip" href="#main">Skip to the dashboard</a>'
        f'<header><h1>Crawl dashboard: {e(spider)}</h1>{_nav(spiders, spider)}'
        f'<p class="where">Redis {e(where)}{_signed_in(user)} · <span id="frag-updated">'
        f'{frags["updated"]}</span> <span id="live" class="live">connecting…</span></p></header>'
        f'<main id="main" data-spider="{e(spider)}" data-window="{e(window)}" '
        f'data-events="{path}/events" data-actions="{path}/actions/">'
        + "".join(_sections(spider, frags, f"{window / 60:g}")) + "</main>"
        + CONFIRM_DIALOG + json_script("samples", list(feed.samples)) + "</body></html>")


def _signed_in(user: str | None) -> str:
    if user == "token":
        return (' · signed in with the token <form method="post" action="/logout" '
                'class="inline"><button type="submit" class="link">Sign out</button></form>')
    return f" · signed in as {e(user)}" if user else ""


def _section(name: str, title: str, body: str, wide: bool = False) -> str:
    return (f'<section{" class=wide" if wide else ""} aria-labelledby="h-{name}">'
            f'<h2 id="h-{name}">{e(title)}</h2>{body}</section>')


def _chart(name: str, label: str, caption: str) -> str:
    return (f'<figure><div id="chart-{name}" class="chart" role="img" aria-label="Chart: '
            f'{e(label)}"></div><figcaption>{e(caption)}</figcaption></figure>')


def _sections(spider: str, frags: dict[str, str], minutes: str):
    def region(name: str) -> str:
        return f'<div id="frag-{name}" class="fragment">{frags.get(name, "")}</div>'

    buttons = "".join(
        f'<button type="button" class="action action-{name}" data-action="{name}" '
        f'data-label="{e(label)}" data-confirm="{e(text.format(spider=spider))}">{e(label)}'
        "</button>" for name, (label, text) in ACTIONS.items())
    yield _section("control", "Operator control", region("control") +
                   f'<div class="actions" role="group" aria-label="Operator actions">{buttons}'
                   '</div><p id="action-result" role="status" aria-live="polite"></p>')
    yield _section("frontier", "Frontier", region("frontier") + _chart(
        "frontier", f"queued, in flight, delayed, dead and invalid requests over the last "
                    f"{minutes} minutes (the numbers are above)",
        f"Frontier sizes, last {minutes} minutes"))
    yield _section("backlog", "Frontier tiers: Redis and MongoDB", region("backlog"),
                   wide=True)
    yield _section("rates", "Throughput and errors", region("rates") + _chart(
        "rates", f"pages and items per second over the last {minutes} minutes",
        "Pages/s and items/s (last minute, all nodes)"))
    yield _section("nodes", "Nodes", region("nodes"), wide=True)
    yield _section("hosts", "Hosts", region("hosts"), wide=True)
    yield _section("budgets", "Budgets", region("budgets"))
    yield _section("bloom", "Bloom filter", region("bloom"))
    yield _section("recrawl", "Revisits", region("recrawl"))
    yield _section("proxies", "Proxies", region("proxies"), wide=True)
    yield _section("totals", "Counters", "<details><summary>Cluster-wide counters</summary>"
                   f'{region("totals")}</details>')


def index_page(spiders: list[str], where: str) -> str:
    """The list of spiders."""
    items = "".join(f'<li><a href="/spider/{quote(s, safe="")}">{e(s)}</a></li>'
                    for s in spiders) or "<li>No spider: name some on the command line.</li>"
    return (_head("crawl dashboard") + '</head><body><header><h1>Crawl dashboard</h1>'
            f'<p class="where">Redis {e(where)}</p></header><main id="main">'
            f'<h2>Spiders</h2><ul class="spiders">{items}</ul></main></body></html>')


def login_page(error: str = "") -> str:
    """The token form (token mode, not signed in)."""
    alert = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    return (_head("Sign in · crawl dashboard") + '</head><body><main id="main" class="login">'
            '<h1>Crawl dashboard</h1><form method="post" action="/login">'
            f'{alert}<label for="token">Access token</label>'
            '<input id="token" name="token" type="password" autocomplete="current-password" '
            'required autofocus><button type="submit" class="primary">Sign in</button>'
            '</form></main></body></html>')
