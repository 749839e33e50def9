"""Benchmark 5: seed feed — 3,000 product URLs fed as seeds.

* ours: one ``bench_ours`` node; the seeds wait in ``bench_ours:start_urls``
  (JSON ``{"url": ...}``, pushed before the node starts);
* plain Scrapy: the same URLs in ``start_urls``;
* scrapy-redis 0.9.1 (context): its RedisSpider reading the same list; on
  Scrapy 2.19 it reads seeds only from its ``spider_idle`` handler, one batch
  of ``CONCURRENT_REQUESTS`` seeds each time the node goes idle.

Product pages are parsed into items; related links are not followed
(``-a follow=0``), so each run fetches exactly the 3,000 seeds. Time is from
the first request to the last response (start-up and idle close excluded);
the time from process launch is reported too.

    python -m bench.seeds [--quick] [--repeat N]
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from crawlproject.demo.site import DemoSite
from bench.common import (LABELS, BenchRedis, base_parser, crawl_commands, median, mode_of,
                          ratio, run_nodes, strip_series, table, write_result)

NAME = "seeds"
SEEDS = {"full": 3000, "quick": 600, "smallest": 100}
LATENCIES = {"full": (0, 50), "quick": (0,), "smallest": (0,)}
CONCURRENCY = 64
FLOOR = 1.2
SYSTEMS = ("ours", "plain", "scrapy-redis")


def one_run(redis: BenchRedis, system: str, urls: list[str], seeds_file: Path) -> dict:
    redis.reset()
    args = {"follow": "0"}
    if system == "plain":
        args["seeds_file"] = str(seeds_file)
    else:
        key = f"bench_{system.replace('-', '_')}:start_urls"
        pipe = redis.client.pipeline(transaction=False)
        for i in range(0, len(urls), 500):
            pipe.lpush(key, *[json.dumps({"url": u}) for u in reversed(urls[i:i + 500])])
        pipe.execute()
    settings = {"CONCURRENT_REQUESTS": CONCURRENCY, "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY}
    run = run_nodes(system, 1, redis_url=redis.url if system != "plain" else None,
                    settings=settings, spider_args=args, timeout=120 + len(urls) / 10)
    if system != "plain":
        stats = crawl_commands(redis.commandstats())
        run["redis_calls"] = sum(v["calls"] for v in stats.values())
        run["redis_calls_per_page"] = ratio(run["redis_calls"], run["pages"])
    run["complete"] = run["pages"] >= len(urls)
    return run


def main(argv=None) -> dict:
    args = base_parser(__doc__.splitlines()[0]).parse_args(argv)
    mode = mode_of(args)
    repeat = args.repeat or (2 if mode == "full" else 1)
    n = SEEDS[mode]
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    with BenchRedis() as redis, tempfile.TemporaryDirectory() as tmp:
        for latency in LATENCIES[mode]:
            with DemoSite(products=n, latency_ms=latency, faults=False) as site:
                urls = [f"{site.url}product/{i}" for i in range(1, n + 1)]
                seeds_file = Path(tmp) / "seeds.txt"
                seeds_file.write_text("\n".join(urls) + "\n")
                for rep in range(repeat):
                    order = SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))
                    for system in order:
                        run = one_run(redis, system, urls, seeds_file)
                        runs.setdefault(f"{system}|{latency}", []).append(strip_series(run))
                        print(f"  rep {rep + 1} {system} {latency} ms: {run['pages']} pages in "
                              f"{run['elapsed_s']:.2f}s (launch→last {run['launch_to_last_response_s']:.2f}s)",
                              flush=True)
    summary = {}
    for key, rs in runs.items():
        system, latency = key.split("|")
        summary[key] = {
            "system": system, "latency_ms": int(latency), "seeds": n,
            "pages": median([r["pages"] for r in rs]),
            "elapsed_s": median([r["elapsed_s"] for r in rs]),
            "elapsed_s_runs": [r["elapsed_s"] for r in rs],
            "launch_to_last_response_s": median([r["launch_to_last_response_s"] for r in rs]),
            "pages_per_s": median([r["pages_per_s"] for r in rs]),
            "redis_calls_per_page": median([r.get("redis_calls_per_page") for r in rs]),
            "complete": all(r["complete"] for r in rs),
        }
    checks = []
    for latency in LATENCIES[mode]:
        ours, plain = summary[f"ours|{latency}"], summary[f"plain|{latency}"]
        r = ratio(ours["elapsed_s"], plain["elapsed_s"])
        checks.append({"check": f"ours time ÷ plain time, {latency} ms", "ratio": r,
                       "floor": f"≤ {FLOOR}", "pass": r is not None and r <= FLOOR})
    data = {"mode": mode, "repeat": repeat, "seeds": n, "concurrency": CONCURRENCY,
            "summary": summary, "checks": checks, "runs": runs,
            "duration_s": time.monotonic() - t0}
    path = write_result(NAME, data, args.out)
    print(render(data))
    print(f"\nwritten {path} in {data['duration_s']:.0f}s")
    return data


def render(data: dict) -> str:
    rows = []
    for s in sorted(data["summary"].values(), key=lambda s: (s["latency_ms"], s["system"])):
        plain = data["summary"][f"plain|{s['latency_ms']}"]
        rows.append([f"{s['latency_ms']} ms", LABELS[s["system"]], s["pages"], s["elapsed_s"],
                     ratio(s["elapsed_s"], plain["elapsed_s"]), s["pages_per_s"],
                     s["launch_to_last_response_s"],
                     ratio(s["launch_to_last_response_s"], plain["launch_to_last_response_s"]),
                     "yes" if s["complete"] else "NO"])
    out = table(["latency", "system", "pages", "first request→last response s", "× plain time",
                 "pages/s", "launch→last response s", "× plain", "complete"], rows)
    out += "\n\n" + table(["floor check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
