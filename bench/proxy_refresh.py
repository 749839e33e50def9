"""Benchmark: what the proxy pool's REFRESH costs Redis, per node per second.

Every node of a crawl with ``PROXY_POOL_ENABLED`` calls the REFRESH script
once a ``PROXY_REFRESH_INTERVAL`` (1 s). Since 2026-12-05 a node reads only
the ban changes since its last call (a version log), so an up-to-date node's
call should cost the same whatever the number of bans; it still reads the
whole pool, health and retirements (O(pool)). This measures, in one private
redis-server, for each (bans, pool size): the Redis time of one REFRESH of an
up-to-date node with nothing to flush (``INFO commandstats``: the ``evalsha``
time, which includes the commands the script runs), without and with the
health hash (read every 10 s), the reply's size, and what
``crawlctl proxies`` (``proxy_report``, 50 rows) costs in wall time and output.

    python -m bench.proxy_refresh [--quick | --smallest] [--repeat N] [--out PATH]
"""

from __future__ import annotations

import json
import time

from bench.common import BenchRedis, base_parser, finish, median, mode_of, table
from crawlproject.frontier.library import SCRIPT_COMMANDS
from crawlproject.ops.proxies import proxy_report
from crawlproject.proxies.store import HealthBatch, ProxyStore

NAME = "proxy_refresh"
SIZES = {"full": [(100, 10), (20_000, 10), (100_000, 10), (100, 10_000), (20_000, 10_000)],
         "quick": [(100, 10), (20_000, 10), (100, 10_000)], "smallest": [(100, 10)]}


def fill(client, store: ProxyStore, bans: int, pool: int) -> int:
    """*pool* proxies with health, *bans* bans spread over them; the version reached."""
    pids = [f"10.{i // 62500}.{i // 250 % 250}.{i % 250}:80" for i in range(pool)]
    pipe = client.pipeline(transaction=False)
    for start in range(0, pool, 5_000):
        pipe.sadd(store.keys.pool, *(f"http://{p}" for p in pids[start:start + 5_000]))
    pipe.execute()
    health = HealthBatch()
    for pid in pids:
        health.success(pid, 0.05)
    store.read(health)
    for start in range(0, bans, 10_000):
        batch = HealthBatch()
        for i in range(start, min(bans, start + 10_000)):
            batch.ban(pids[i % pool], f"host{i // pool}.example", 600, 1)
        store.read(batch)
    return int(client.hget(store.keys.state, "ban_version"))


def _script_stats(bench: BenchRedis) -> dict:
    """Calls and µs of the script commands (FCALL on Redis 7, EVALSHA on 6.2)."""
    stats = [v for k, v in bench.commandstats().items() if k in SCRIPT_COMMANDS]
    return {"calls": sum(v["calls"] for v in stats), "usec": sum(v["usec"] for v in stats)}


def one_refresh(bench: BenchRedis, store: ProxyStore, since: int, with_health: bool) -> dict:
    before = _script_stats(bench)
    reply = store._refresh(keys=store.keys.refresh_keys(),
                           args=store._args(HealthBatch(), None, since, None, with_health))
    after = _script_stats(bench)
    return {"redis_ms": (after["usec"] - before["usec"]) / 1000 / (after["calls"] - before["calls"]),
            "reply_bytes": len(repr(reply)), "ban_changes": len(reply[4]) // 2}


def one_report(client) -> dict:
    t0 = time.perf_counter()
    report = proxy_report(client, "bench")
    return {"wall_ms": 1000 * (time.perf_counter() - t0),
            "json_bytes": len(json.dumps(report)), "rows": len(report["proxies"])}


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    mode = mode_of(args)
    repeat = args.repeat or (5 if mode == "full" else 1)
    t0 = time.monotonic()
    results = []
    with BenchRedis() as bench:
        for bans, pool in SIZES[mode]:
            bench.reset()
            store = ProxyStore(bench.client, "bench")
            version = fill(bench.client, store, bans, pool)
            refreshes = [one_refresh(bench, store, version, False) for _ in range(repeat)]
            healthy = [one_refresh(bench, store, version, True) for _ in range(repeat)]
            reports = [one_report(bench.client) for _ in range(repeat)]
            results.append({"bans": bans, "pool": pool,
                            "refresh_redis_ms": median([r["redis_ms"] for r in refreshes]),
                            "reply_bytes": refreshes[0]["reply_bytes"],
                            "with_health_redis_ms": median([r["redis_ms"] for r in healthy]),
                            "with_health_reply_bytes": healthy[0]["reply_bytes"],
                            "ban_changes": refreshes[0]["ban_changes"],
                            "report_wall_ms": median([r["wall_ms"] for r in reports]),
                            "report_json_bytes": reports[0]["json_bytes"],
                            "report_rows": reports[0]["rows"]})
    data = {"mode": mode, "repeat": repeat, "results": results,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[f"{r['bans']:,}", f"{r['pool']:,}", r["refresh_redis_ms"], f"{r['reply_bytes']:,}",
             r["with_health_redis_ms"], f"{r['with_health_reply_bytes']:,}",
             r["ban_changes"], r["report_wall_ms"], f"{r['report_json_bytes']:,}",
             r["report_rows"]] for r in data["results"]]
    return table(["bans", "pool", "REFRESH Redis ms (up-to-date node)", "reply bytes",
                  "with health (every 10 s) ms", "its reply bytes",
                  "ban changes sent", "crawlctl proxies wall ms", "report JSON bytes",
                  "rows shown"], rows)


if __name__ == "__main__":
    main()
