"""Benchmark 2: Redis commands per crawled page — ours vs scrapy-redis.

The crawl of benchmark 1 (0 ms latency), 1 and 2 nodes. Before each run the
Redis is flushed and ``CONFIG RESETSTAT`` zeroes ``INFO commandstats``;
afterwards every call is counted, including the commands run inside Lua
scripts (Redis counts those too: one SYNC is 1 EVALSHA + the commands it
runs). Also recorded: the Redis server's CPU time per page (psutil) and the
duration of every SYNC call (``SLOWLOG`` with a 0 µs threshold, so every
top-level command is logged).

    python -m bench.commands [--quick]
"""

from __future__ import annotations

import time

import psutil

from crawlproject.frontier.library import SCRIPT_COMMANDS
from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite
from bench.common import (LABELS, BenchRedis, base_parser, crawl_commands, mode_of, ratio,
                          run_nodes, strip_series, table, finish)

NAME = "commands"
PER_PAGE = 50
PRODUCTS = {"full": 1000, "quick": 300, "smallest": 60}
CONCURRENCY = 64
FLOOR = 3.0
SYSTEMS = ("ours", "scrapy-redis")


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def one_run(redis: BenchRedis, site: DemoSite, system: str, nodes: int, products: int) -> dict:
    redis.reset()
    client = redis.client
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 200_000)
    client.lpush(start_urls_key(f"bench_{system.replace('-', '_')}"), site.url)
    server = psutil.Process(redis.server.pid)
    cpu0 = sum(server.cpu_times()[:2])
    run = run_nodes(system, nodes, redis_url=redis.url,
                    settings={"CONCURRENT_REQUESTS": CONCURRENCY,
                              "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY},
                    timeout=60 + products / 20, watch_pids=(redis.server.pid, site._proc.pid))
    cpu = sum(server.cpu_times()[:2]) - cpu0
    stats = crawl_commands(redis.commandstats())
    slow = client.slowlog_get(200_000)
    client.config_set("slowlog-log-slower-than", 10_000)
    syncs = [e["duration"] for e in slow
             if (e.get("command") or b"").split(b" ")[0].lower().decode() in SCRIPT_COMMANDS]
    pages = run["pages"]
    calls = sum(v["calls"] for v in stats.values())
    run.update({
        "calls": calls, "calls_per_page": calls / pages,
        "per_command_per_page": {k: v["calls"] / pages for k, v in
                                 sorted(stats.items(), key=lambda kv: -kv[1]["calls"])},
        "commandstats": stats,
        "redis_cpu_s": cpu, "redis_cpu_us_per_page": 1e6 * cpu / pages,
        "script_calls": len(syncs), "script_calls_per_page": len(syncs) / pages,
        "script_us_median": percentile(syncs, 0.5), "script_us_p99": percentile(syncs, 0.99),
        "script_us_max": max(syncs) if syncs else None,
        "script_us_total_per_page": sum(syncs) / pages if syncs else None,
    })
    return run


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    mode = mode_of(args)
    products = PRODUCTS[mode]
    t0 = time.monotonic()
    runs = {}
    with BenchRedis() as redis, DemoSite(products=products, per_page=PER_PAGE, faults=False) as site:
        for nodes in ((1,) if mode == "smallest" else (1, 2)):
            for system in SYSTEMS:
                run = one_run(redis, site, system, nodes, products)
                runs[f"{system}|{nodes}"] = strip_series(run)
                print(f"  {system} x{nodes}: {run['calls_per_page']:.2f} commands/page "
                      f"({run['pages']} pages)", flush=True)
    checks = []
    for key, run in runs.items():
        system, nodes = key.split("|")
        if system == "ours":
            sr = runs.get(f"scrapy-redis|{nodes}")
            checks.append({"check": f"ours commands per page, {nodes} node(s)",
                           "value": run["calls_per_page"], "floor": f"≤ {FLOOR}",
                           "pass": run["calls_per_page"] <= FLOOR,
                           "scrapy_redis": sr["calls_per_page"] if sr else None})
    data = {"mode": mode, "products": products, "runs": runs, "checks": checks,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = []
    for key, r in data["runs"].items():
        system, nodes = key.split("|")
        sr = data["runs"].get(f"scrapy-redis|{nodes}")
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["per_command_per_page"].items())[:6])
        rows.append([LABELS[system], nodes, r["pages"], r["calls"], r["calls_per_page"],
                     ratio(r["calls_per_page"], sr["calls_per_page"]) if sr else None,
                     r["redis_cpu_us_per_page"], r.get("script_us_total_per_page"), top])
    out = table(["system", "nodes", "pages", "Redis calls", "calls/page", "× scrapy-redis",
                 "Redis CPU µs/page", "of which Lua µs/page", "top commands per page"], rows)
    sync_rows = [[LABELS[k.split("|")[0]], k.split("|")[1], r["script_calls_per_page"],
                  r["script_us_median"], r["script_us_p99"], r["script_us_max"]]
                 for k, r in data["runs"].items() if r["script_calls"]]
    if sync_rows:
        out += "\n\n" + table(["system", "nodes", "SYNC calls/page", "SYNC µs median", "p99", "max"],
                              sync_rows)
    out += "\n\n" + table(["floor check", "value", "scrapy-redis", "floor", "result"],
                          [[c["check"], c["value"], c["scrapy_redis"], c["floor"], c["pass"]]
                           for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
