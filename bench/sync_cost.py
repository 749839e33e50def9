"""Redis work per crawled page, by command — ours (today or an older commit) vs scrapy-redis.

One node crawls one site of the multi-host demo (:mod:`devtools.demo.hosts`) that
answers 503 once on every 50th page (2 % transient faults), at 0 ms and/or 50 ms
latency, interleaved with scrapy-redis in the same run. Before each crawl Redis is
flushed and ``CONFIG RESETSTAT`` zeroes ``INFO commandstats``; after it, every
command is counted (those a script runs included: Redis counts them too) and the
Redis server's CPU (psutil) is divided by the pages fetched (200 answers at the
site). Reported per command and per page, so two commits can be compared
command by command (which grew, inside the SYNC script or outside it).

``--old REV`` also runs ``ours`` from commit *REV* (unpacked with ``git archive``,
its nodes import its package and its ``bench`` spiders; the harness is today's).
``--label readme`` runs the README block (MongoDB pipeline on a local
SecantusDB, robots.txt, control, limit publishing...) instead of
:mod:`bench.settings`' scheduler alone.

    python -m bench.sync_cost [--pages 1500] [--latency 0,50] [--old 3dd8454] [--label ours|readme]
                              [--repeat N] [--set NAME=VALUE]

Command counts do not depend on the machine's load; CPU per page does (report both).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psutil

from bench import common
from bench.common import (BenchRedis, base_parser, crawl_commands, median, ratio, run_nodes,
                          table, finish)
from crawlproject.keys import start_urls_key
from devtools.demo.hosts import MultiHostSite

NAME = "sync_cost"
HOST = "127.0.0.44"
FAIL_EVERY = 50
THROUGHPUT = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS": 64, "CONCURRENT_REQUESTS_PER_DOMAIN": 64}
SPIDERS = {"ours": ("bench_hosts_ours", "bench.settings"),
           "readme": ("bench_hosts_readme", "bench.readme_settings"),
           "scrapy-redis": ("bench_hosts_scrapy_redis", "bench.settings")}
# commands a frontier script runs for itself (the rest are the node's own calls)
SCRIPTS = {"evalsha", "fcall", "eval", "fcall_ro", "evalsha_ro"}


def crawl(redis: BenchRedis, site: MultiHostSite, system: str, label: str,
          mongo_uri: str | None, extra: dict | None = None) -> dict:
    spider, module = SPIDERS["scrapy-redis" if system == "scrapy-redis" else label]
    redis.reset()
    site.reset()
    settings = {**THROUGHPUT, **(extra or {})}
    if module == "bench.readme_settings":
        settings.update(MONGO_URI=mongo_uri, MONGO_DATABASE=f"bench_sync_cost_{time.time_ns()}")
    redis.client.lpush(start_urls_key(spider), site.urls[HOST])
    server = psutil.Process(redis.server.pid)
    cpu0 = sum(server.cpu_times()[:2])
    run = run_nodes(system, 1, redis_url=redis.url, settings=settings, spider=spider,
                    settings_module=module, timeout=120 + site.pages[HOST] / 5,
                    watch_pids=(redis.server.pid, site._proc.pid))
    cpu = sum(server.cpu_times()[:2]) - cpu0
    stats = crawl_commands(redis.commandstats())
    hits = site.requests(HOST)
    pages = sum(1 for h in hits if h.status == 200) or 1
    calls = sum(v["calls"] for v in stats.values())
    return {"system": system, "pages": pages, "site_requests": len(hits),
            "elapsed_s": run["elapsed_s"], "errors": run["errors"],
            "redis_cpu_ms_per_page": 1000 * cpu / pages,
            "commands_per_page": calls / pages,
            "per_command": {k: v["calls"] / pages for k, v in
                            sorted(stats.items(), key=lambda kv: -kv[1]["calls"])},
            "usec_per_page": {k: v["usec"] / pages for k, v in stats.items()},
            "external_cores": run["external_cores"],
            # the node's own counts of what it sent (ours: scheduler/*, politeness/*)
            "node_stats": {k: v for node in run["per_node"] for k, v in node["stats"].items()
                           if k.split("/")[0] in ("scheduler", "politeness", "frontier")}}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=1500)
    parser.add_argument("--latency", default="0", help="comma-separated ms: 0,50")
    parser.add_argument("--old", default="", help="also run ours from this commit")
    parser.add_argument("--label", default="ours", choices=("ours", "readme"))
    parser.add_argument("--no-scrapy-redis", action="store_true")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a Scrapy setting for every system's nodes")
    args = parser.parse_args(argv)
    repeat = args.repeat or 1
    systems = ["ours"] + (["ours-old"] if args.old else []) + \
        ([] if args.no_scrapy_redis else ["scrapy-redis"])
    if args.old:
        # run_nodes' "ours-old" nodes import the package of common.BASELINE_REF
        common._baselines[common.BASELINE_REF] = common.baseline_package(args.old)
    mongo = storage = None
    if args.label == "readme":
        from devtools.services import MongoServer
        storage = Path(tempfile.mkdtemp(prefix="bench-sync-cost-mongo-"))
        mongo = MongoServer(storage_path=storage)
        mongo.start()
    extra = dict(item.split("=", 1) for item in args.set)
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    try:
        for latency in [int(x) for x in args.latency.split(",")]:
            with BenchRedis() as redis, MultiHostSite([HOST], pages={HOST: args.pages},
                                                      latency_ms=latency,
                                                      fail_every={HOST: FAIL_EVERY}) as site:
                for rep in range(repeat):
                    for system in systems:
                        run = crawl(redis, site, system, args.label, mongo.uri if mongo else None, extra)
                        runs.setdefault(f"{system}|{latency}", []).append(run)
                        print(f"  {system} {latency} ms rep {rep + 1}: {run['pages']} pages, "
                              f"{run['commands_per_page']:.2f} cmds/page, Redis CPU "
                              f"{run['redis_cpu_ms_per_page']:.3f} ms/page", flush=True)
    finally:
        if mongo:
            mongo.stop()
            shutil.rmtree(storage, ignore_errors=True)
    summary = {}
    for key, rs in runs.items():
        names = {n for r in rs for n in r["per_command"]}
        summary[key] = {
            "commands_per_page": median([r["commands_per_page"] for r in rs]),
            "redis_cpu_ms_per_page": median([r["redis_cpu_ms_per_page"] for r in rs]),
            "per_command": {n: median([r["per_command"].get(n, 0) for r in rs]) for n in names},
        }
    for key, s in summary.items():
        sr = summary.get(f"scrapy-redis|{key.split('|')[1]}")
        if sr and not key.startswith("scrapy-redis"):
            s["cpu_over_scrapy_redis"] = ratio(s["redis_cpu_ms_per_page"], sr["redis_cpu_ms_per_page"])
    data = {"mode": "quick", "pages": args.pages, "label": args.label, "old": args.old,
            "settings": {**THROUGHPUT, **extra}, "repeat": repeat,
            "runs": runs, "summary": summary, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    summary = data["summary"]
    rows = [[k, s["commands_per_page"], s["redis_cpu_ms_per_page"], s.get("cpu_over_scrapy_redis")]
            for k, s in summary.items()]
    out = [table(["system|latency", "commands/page", "Redis CPU ms/page", "CPU ÷ scrapy-redis"], rows)]
    keys = [k for k in summary if not k.startswith("scrapy-redis")]
    names = sorted({n for k in keys for n in summary[k]["per_command"]},
                   key=lambda n: -max(summary[k]["per_command"].get(n, 0) for k in keys))
    out.append(table(["command"] + keys,
                     [[n] + [summary[k]["per_command"].get(n, 0) for k in keys] for n in names]))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
