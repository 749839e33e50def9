"""The read model of a crawl: one dict with the cluster's state (control,
nodes, frontier, politeness, proxies, recrawl, Bloom filter), as
``crawlctl status --json`` prints it and the dashboard shows it."""

from __future__ import annotations

import time

from crawlproject.control import node_reports, read_state, resume_command
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import (
    FrontierKeys,
    SeedKeys,
)
from crawlproject.keys import as_text as _s
from crawlproject.ops.budgets import budget_summary
from crawlproject.ops.crawlstate import crawl_state, pages_crawled
from crawlproject.ops.common import redis_time_ms, seed_count


def status_data(spider: str, parts: list[Frontier], seeds: SeedKeys) -> dict:
    """Everything `status` shows, as JSON-safe data (the stable ``--json`` form;
    also what the dashboard shows)."""
    f = parts[0]
    counts: dict[str, int] = {}
    for part in parts:
        for name, value in part.counts().items():
            counts[name] = counts.get(name, 0) + value
    now_ms = redis_time_ms(f.client)
    # (a score is any float someone wrote, inf too: kept within what ms can be)
    deadlines = {_s(n): int(min(max(score, -1e15), 1e15)) for part in parts
                 for n, score in part.client.zrange(part.keys.nodes, 0, -1, withscores=True)
                 if score == score}
    registered = set(deadlines)
    counts["nodes"] = len(registered)
    counts["partitions"] = len(parts)
    totals: dict[str, int] = dict(f.stats())
    for part in parts[1:]:
        for name, value in part.own_stats().items():
            totals[name] = totals.get(name, 0) + value
    reports = node_reports(f.client, spider)
    held = _held_leases(parts, [*registered, *(r["node"] for r in reports)])
    counts["nodes_holding_leases"] = sum(1 for n in held.values() if n)
    for report in reports:
        _lease_fields(report, deadlines.get(report["node"]), now_ms)
        report["leases_held"] = held.get(report["node"], 0)
    est = _bloom_totals([part.bloom_estimates() for part in parts])
    data = {
        "politeness": _politeness_summary(parts, counts["hosts"]),
        "spider": spider, "at": int(time.time() * 1000),
        "control": _control(f.client, spider),
        "frontier": {k: counts[k] for k in ("queued", "delayed", "inflight", "dead", "invalid",
                                            "hosts", "nodes", "nodes_holding_leases",
                                            "partitions")},
        "seeds": {"waiting": seed_count(f.client, seeds.key),
                  "claimed": f.client.hlen(seeds.claims),
                  "invalid": f.client.llen(seeds.invalid)},
        "nodes": reports,
        "rates": {"pages_per_s": round(sum(r.get("pages_per_s", 0) for r in reports), 2),
                  "items_per_s": round(sum(r.get("items_per_s", 0) for r in reports), 2)},
        "errors": {"download": sum(r.get("errors_download", 0) for r in reports),
                   "callback": sum(r.get("errors_callback", 0) for r in reports),
                   "dead_letters": totals.get("dead", 0)},
        "totals": totals,
        "bloom": {"layers": est["layers"], "items": est["count"],
                  "fill_ratio": round(est["fill_ratio"], 6),
                  "est_fp_rate": est["est_fp_rate"],
                  "bytes_per_item": round(est["bytes_per_item"], 3),
                  "bytes": est["bits"] // 8, "capacity": int(est["capacity"])},
        "recrawl": _recrawl_summary(f.client, spider),
        "budgets": budget_summary(parts),
        "proxy_pool": _proxy_pool_summary(f.client, spider, now_ms),
        "backlog": backlog_summary(parts, now_ms),
    }
    data["crawl"] = crawl_state(data)
    data["crawl"]["pages_crawled"] = pages_crawled(data)
    return data


#: the largest backlogs (keys with the most entries in MongoDB) status shows
BACKLOG_KEYS_SHOWN = 10


def backlog_summary(parts: list[Frontier], now_ms: int) -> dict:
    """The frontier's two tiers (docs/frontier.md, "A frontier larger than
    RAM"): per partition the entries queued in Redis (kstate's ``||qlen``) and
    in MongoDB (``||backlog``, kept by the move scripts), the keys waiting for
    a spill or a refill (``T:moves``) and the oldest one's wait, and the
    :data:`BACKLOG_KEYS_SHOWN` keys with the largest backlogs (``ZREVRANGE
    T:backlog``). Redis' bookkeeping only, O(log n) a partition: never a count
    over the MongoDB collection (a status page must not scan 10^9 documents)."""
    rows, largest = [], []
    for part in parts:
        k = part.keys
        pipe = part.client.pipeline(transaction=False)
        pipe.hget(k.kstate, "||backlog")
        pipe.zcard(k.moves)
        pipe.zrange(k.moves, 0, 0, withscores=True)
        pipe.zrevrange(k.backlog, 0, BACKLOG_KEYS_SHOWN - 1, withscores=True)
        # (a key of another type: not ours, shown as none)
        total, moves, oldest, top = [None if isinstance(r, Exception) else r
                                     for r in pipe.execute(raise_on_error=False)]
        since = oldest[0][1] if oldest and oldest[0][1] == oldest[0][1] else None
        rows.append({"partition": k.partition, "queued_redis": part.queued(),
                     "queued_mongodb": _count(total), "moves_waiting": moves or 0,
                     "oldest_move_age_s": None if since is None else
                     round(max(0.0, now_ms - min(max(since, -1e15), 1e15)) / 1000, 1)})
        largest += [{"key": _s(key), "partition": k.partition,
                     "queued_mongodb": _count(score)} for key, score in top or []]
    largest.sort(key=lambda r: (-r["queued_mongodb"], r["partition"], r["key"]))
    ages = [r["oldest_move_age_s"] for r in rows if r["oldest_move_age_s"] is not None]
    return {"queued_redis": sum(r["queued_redis"] for r in rows),
            "queued_mongodb": sum(r["queued_mongodb"] for r in rows),
            "moves_waiting": sum(r["moves_waiting"] for r in rows),
            "oldest_move_age_s": max(ages) if ages else None,
            "partitions": rows, "largest": largest[:BACKLOG_KEYS_SHOWN]}


def _count(raw) -> int:
    """A count Redis holds (bytes, a float score, junk: 0), never below 0."""
    try:
        value = float(_s(raw)) if raw is not None else 0.0
    except ValueError:
        return 0
    return int(min(max(value, 0.0), 1e18)) if value == value else 0


def _held_leases(parts: list[Frontier], nodes: list[str]) -> dict[str, int]:
    """Entries each node holds leased, as the frontier counts them (its held
    sets: what is reclaimed if the node dies); one pipelined SCARD each."""
    nodes = list(dict.fromkeys(nodes))
    out = dict.fromkeys(nodes, 0)
    if not nodes:
        return out
    for part in parts:
        pipe = part.client.pipeline(transaction=False)
        for node in nodes:
            pipe.scard(part.keys.held(node))
        for node, n in zip(nodes, pipe.execute(raise_on_error=False)):
            if isinstance(n, int):   # (a held key of another type: not ours, not counted)
                out[node] += n
    return out


def _control(client, spider: str) -> dict:
    """The operator's state with who set it and when (``since`` ms or None,
    ``by``), ``then_clear`` (a drain that ends by itself), and ``resume``: the
    command that resumes the crawl (None while it runs)."""
    control = read_state(client, spider)
    control["resume"] = resume_command(spider) if control["state"] != "run" else None
    return control


def _proxy_pool_summary(client, spider: str, now_ms: int) -> dict:
    from crawlproject.proxies.store import no_proxy_summary

    return no_proxy_summary(client, spider, now_ms)


def _recrawl_summary(client, spider: str) -> dict:
    """The revisit feeder's last report (``{spider}:recrawl``): page records,
    pages due and not yet fed, fed in all, when (ms); zeros when none ran."""
    raw = {_s(k): _s(v) for k, v in client.hgetall(FrontierKeys(spider).recrawl).items()}
    out = {}
    for name in ("pages", "due", "fed", "at"):
        try:
            out[name] = max(0, int(raw.get(name, 0)))
        except ValueError:  # not written by a node: shown as unknown
            out[name] = 0
    return out


def _lease_fields(report: dict, deadline_ms: int | None, now_ms: int) -> None:
    """``registered``, ``lease_left_s`` (until its leases are reclaimed) and, when the
    node reports its lease TTL, ``heartbeat_age_s`` (since it last renewed them)."""
    report["registered"] = deadline_ms is not None
    if deadline_ms is None:
        return
    report["lease_left_s"] = round((deadline_ms - now_ms) / 1000, 1)
    ttl = report.get("lease_ttl_s")
    if isinstance(ttl, (int, float)) and ttl > 0:
        report["heartbeat_age_s"] = round(max(0.0, ttl - report["lease_left_s"]), 1)


STATUS_HOSTS_MAX = 200   # per-host rows read only below this many hosts (2 calls a host)


STATUS_HOSTS_SHOWN = 10


def _politeness_summary(parts: list[Frontier], hosts: int) -> dict:
    """Per-host politeness for `status`: how many hosts are blocked or backing
    off, and the most queued ones (for larger crawls: `crawlctl politeness`)."""
    if hosts > STATUS_HOSTS_MAX:
        return {"hosts": hosts, "note": f"more than {STATUS_HOSTS_MAX} hosts: "
                                        "see `crawlctl politeness SPIDER`"}
    now_ms = redis_time_ms(parts[0].client)
    rows = {}
    for part in parts:
        limits = part.limits()
        for key, state in part.key_states().items():
            rows[key] = {**state, "limits": limits.get(key)}
    top = sorted(rows.items(), key=lambda kv: (-kv[1]["queued"], kv[0]))[:STATUS_HOSTS_SHOWN]
    return {
        "hosts": len(rows),
        "blocked": sum(1 for r in rows.values() if (r["blocked_until_ms"] or 0) > now_ms),
        "backing_off": sum(1 for r in rows.values() if r["backoff_ms"]),
        "top": [{"host": key, "queued": r["queued"], "inflight": r["inflight"],
                 "next_start_in_s": round(max(0, (r["ready_at_ms"] or now_ms) - now_ms) / 1000, 2)
                 if r["ready_at_ms"] is not None else None,
                 "blocked_for_s": round(max(0, r["blocked_until_ms"] - now_ms) / 1000, 2),
                 "backoff_s": r["backoff_ms"] / 1000, "crawl_delay_s": r["crawl_delay_ms"] / 1000,
                 "slow_down_rate": round(r.get("error_rate", 0.0), 3),
                 "limits": r["limits"]} for key, r in top],
    }


def _bloom_totals(estimates: list[dict]) -> dict:
    bits = sum(e["bits"] for e in estimates)
    count = sum(e["count"] for e in estimates)
    return {"layers": max((e["layers"] for e in estimates), default=0), "count": count,
            "bits": bits, "capacity": sum(e.get("capacity", 0) for e in estimates),
            "fill_ratio": sum(e["fill_ratio"] * e["bits"] for e in estimates) / bits if bits else 0,
            "est_fp_rate": max((e["est_fp_rate"] for e in estimates), default=0.0),
            "bytes_per_item": bits / 8 / count if count else 0.0}
