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
import threading
import time
from pathlib import Path

from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite
from bench.common import (LABELS, BenchRedis, base_parser, crawl_commands, median, mode_of,
                          ratio, rerun_disturbed, run_nodes, strip_series, table,
                          undisturbed, finish)

NAME = "seeds"
SEEDS = {"full": 3000, "quick": 600, "smallest": 100}
LATENCIES = {"full": (0, 50), "quick": (0,), "smallest": (0,)}
CONCURRENCY = 64
FLOOR = 1.2
SYSTEMS = ("ours", "plain", "scrapy-redis")


def one_run(redis: BenchRedis, system: str, urls: list[str], seeds_file: Path,
            site: DemoSite) -> dict:
    redis.reset()
    args = {"follow": "0"}
    if system == "plain":
        args["seeds_file"] = str(seeds_file)
    else:
        key = start_urls_key(f"bench_{system.replace('-', '_')}")
        pipe = redis.client.pipeline(transaction=False)
        for i in range(0, len(urls), 500):
            pipe.lpush(key, *[json.dumps({"url": u}) for u in reversed(urls[i:i + 500])])
        pipe.execute()
    settings = {"CONCURRENT_REQUESTS": CONCURRENCY, "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY}
    run = run_nodes(system, 1, redis_url=redis.url if system != "plain" else None,
                    settings=settings, spider_args=args, timeout=120 + len(urls) / 10,
                    watch_pids=(redis.server.pid, site._proc.pid))
    if system != "plain":
        stats = crawl_commands(redis.commandstats())
        run["redis_calls"] = sum(v["calls"] for v in stats.values())
        run["redis_calls_per_page"] = ratio(run["redis_calls"], run["pages"])
    run["complete"] = run["pages"] >= len(urls)
    return run


WAIT_PRODUCTS = {"full": 4000}  # full mode only
WAIT_SEEDS = 50
WAIT_PUSH_AFTER = 4.0


def seed_wait(redis: BenchRedis, products: int) -> dict:
    """Seeds pushed while the shared frontier is deep: how long until a node reads them?

    One ``bench_ours`` node crawls a site from its home page (the frontier fills
    up with product requests); WAIT_PUSH_AFTER s into the crawl, WAIT_SEEDS
    seeds are pushed; the seed list is polled every 0.25 s until it is empty.
    """
    redis.reset()
    key = start_urls_key("bench_ours")
    queue_key = "{bench_ours}:queue"
    samples: list[tuple[float, int, int]] = []
    pushed: dict = {}
    with DemoSite(products=products, per_page=50, faults=False) as site:
        redis.client.lpush(key, site.url)

        def feeder():
            time.sleep(WAIT_PUSH_AFTER)
            client = redis.client
            pushed["queue"] = client.zcard(queue_key)
            client.lpush(key, *[json.dumps({"url": f"{site.url}product/{i}?seed=1"})
                                for i in range(1, WAIT_SEEDS + 1)])
            pushed["at"] = time.time()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                left = client.llen(key)
                samples.append((time.time() - pushed["at"], left, client.zcard(queue_key)))
                if left == 0:
                    break
                time.sleep(0.25)

        thread = threading.Thread(target=feeder, daemon=True)
        thread.start()
        run = run_nodes("ours", 1, redis_url=redis.url, spider_args={},
                        settings={"CONCURRENT_REQUESTS": CONCURRENCY,
                                  "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY},
                        timeout=60 + products / 20, watch_pids=(redis.server.pid, site._proc.pid))
        thread.join(130)
    read_after = next((t for t, left, _ in samples if left == 0), None)
    last = run["per_node"][0]["last_response"]
    return {"products": products, "seeds": WAIT_SEEDS, "pushed_after_s": WAIT_PUSH_AFTER,
            "queue_when_pushed": pushed.get("queue"), "seeds_read_after_s": read_after,
            "queue_when_read": next((q for _, left, q in samples if left == 0), None),
            "crawl_s": run["elapsed_s"],
            "crawl_left_when_pushed_s": (last - pushed["at"]) if pushed.get("at") and last else None,
            "samples": samples[::4]}


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

                def run_config(system: str, label: str) -> dict:
                    run = one_run(redis, system, urls, seeds_file, site)
                    print(f"  {label} {system} {latency} ms: {run['pages']} pages in "
                          f"{run['elapsed_s']:.2f}s (launch→last "
                          f"{run['launch_to_last_response_s']:.2f}s), node CPU "
                          f"{run['cpu_ms_per_page']:.2f} ms/page, other programs "
                          f"{run['external_cores'] or 0:.2f} cores", flush=True)
                    return strip_series(run)

                for rep in range(repeat):
                    order = SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))
                    for system in order:
                        if system == "scrapy-redis" and latency != LATENCIES[mode][0]:
                            continue  # context only: at the first latency
                        runs.setdefault(f"{system}|{latency}", []).append(
                            run_config(system, f"rep {rep + 1}"))
                mine = {k: v for k, v in runs.items() if k.endswith(f"|{latency}")}
                rerun_disturbed(mine, lambda key: run_config(key.split("|")[0], "again"),
                                wanted=min(repeat, 2),
                                max_extra={"full": 2}.get(mode, 0),
                                max_seconds=40 if mode == "full" else 20)
        wait = seed_wait(redis, WAIT_PRODUCTS[mode]) if mode in WAIT_PRODUCTS else None
        if wait:
            print(f"  seed wait: {WAIT_SEEDS} seeds pushed with {wait['queue_when_pushed']} "
                  f"requests queued were read after {wait['seeds_read_after_s']} s", flush=True)
    summary = {}
    for key, all_runs in runs.items():
        system, latency = key.split("|")
        rs = undisturbed(all_runs)
        summary[key] = {
            "runs": len(all_runs), "runs_used": len(rs),
            "cpu_ms_per_page": median([r["cpu_ms_per_page"] for r in rs]),
            "external_cores": median([r.get("external_cores") for r in rs]),
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
            "summary": summary, "checks": checks, "runs": runs, "seed_wait": wait,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = []
    for s in sorted(data["summary"].values(), key=lambda s: (s["latency_ms"], s["system"])):
        plain = data["summary"][f"plain|{s['latency_ms']}"]
        rows.append([f"{s['latency_ms']} ms", LABELS[s["system"]], s["pages"], s["elapsed_s"],
                     ratio(s["elapsed_s"], plain["elapsed_s"]), s["pages_per_s"],
                     s["launch_to_last_response_s"],
                     ratio(s["launch_to_last_response_s"], plain["launch_to_last_response_s"]),
                     s["cpu_ms_per_page"], f"{s['runs_used']}/{s['runs']}", round(s["external_cores"] or 0, 2),
                     "yes" if s["complete"] else "NO"])
    out = table(["latency", "system", "pages", "first request→last response s", "× plain time",
                 "pages/s", "launch→last response s", "× plain", "node CPU ms/page",
                 "runs used", "other programs (cores)", "complete"], rows)
    out += "\n\n" + table(["floor check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"], c["pass"]] for c in data["checks"]])
    w = data.get("seed_wait")
    if w:
        out += "\n\n" + table(
            ["seeds pushed mid-crawl (ours, 1 node)", "frontier queue when pushed",
             "read after s", "queue when read", "crawl time left when pushed s"],
            [[f"{w['seeds']} seeds, {w['pushed_after_s']:g} s into a {w['products']:,}-product crawl",
              w["queue_when_pushed"], w["seeds_read_after_s"], w["queue_when_read"],
              w["crawl_left_when_pushed_s"]]])
    return out


if __name__ == "__main__":
    main()
