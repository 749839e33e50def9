"""Benchmark 3: memory of a crawler node — peak RSS and flatness.

* Peak RSS: one ``bench_ours`` node vs the plain Scrapy spider on the crawl
  of benchmark 1 (0 ms latency); RSS of the scrapy process only (psutil,
  sampled every 0.1 s); median over repetitions.
* Flatness: a long crawl (latency 0, one node) sampled every second; RSS at
  10/25/50/100 % of the crawl's responses, and the growth from 25 % to 100 %.
  Plain Scrapy keeps its dupefilter (and its queue) in memory, ours keeps
  them in Redis.

    python -m bench.memory [--quick] [--flat-products N]
"""

from __future__ import annotations

import bisect
import time

from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite
from bench.common import (LABELS, BenchRedis, base_parser, median, mode_of, ratio, run_nodes,
                          strip_series, table, finish)

NAME = "memory"
PER_PAGE = 50
PEAK_PRODUCTS = {"full": 2000, "quick": 400, "smallest": 60}
FLAT_PRODUCTS = {"full": 20_000, "quick": 1_500, "smallest": 200}
CONCURRENCY = 64
FLOOR_PEAK = 1.1
POINTS = (0.10, 0.25, 0.50, 1.00)


def crawl(redis: BenchRedis, site: DemoSite, system: str, products: int, interval: float) -> dict:
    redis.reset()
    args = {}
    if system == "plain":
        args["start_url"] = site.url
    else:
        redis.client.lpush(start_urls_key(f"bench_{system}"), site.url)
    return run_nodes(system, 1, redis_url=redis.url if system != "plain" else None,
                     settings={"CONCURRENT_REQUESTS": CONCURRENCY,
                               "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY},
                     spider_args=args, timeout=60 + products / 25, rss_interval=interval,
                     watch_pids=(redis.server.pid, site._proc.pid))


def rss_at_progress(run: dict) -> dict:
    """RSS (MB) when the crawl had received 10/25/50/100 % of its responses."""
    node = run["per_node"][0]
    progress = node["progress"]  # [(ts, responses)]
    total = node["pages"]
    rss = [(t, r) for t, r in node["rss"] if t <= node["last_response"] + 0.5]
    # A tiny crawl on a loaded machine may end before the sampler's first
    # sample: then the first sample after it is the best reading there is.
    rss = rss or node["rss"][:1]
    if not rss and node.get("peak_rss_mb") and total:
        # Not one sample while the node ran (it lived less than the sampling
        # interval): its own peak is the only reading, for every point.
        return {f"{int(p * 100)}%": node["peak_rss_mb"] for p in POINTS}
    if not progress or not rss or not total:
        return {}
    times = [t for t, _ in progress]
    counts = [c for _, c in progress]

    def done_at(t):  # responses received by time t (interpolated)
        i = bisect.bisect_right(times, t)
        if i == 0:
            return 0
        if i >= len(times):
            return counts[-1]
        t0, t1, c0, c1 = times[i - 1], times[i], counts[i - 1], counts[i]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1

    out = {}
    for p in POINTS:
        target = p * total
        picks = [r for t, r in rss if done_at(t) >= target - 1e-9]
        value = (picks[0] if picks else None) if p < 1 else rss[-1][1]
        out[f"{int(p * 100)}%"] = value / 2**20 if value else None
    return out


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--flat-products", type=int, default=None)
    args = parser.parse_args(argv)
    mode = mode_of(args)
    repeat = args.repeat or (2 if mode == "full" else 1)
    flat_n = args.flat_products or FLAT_PRODUCTS[mode]
    t0 = time.monotonic()
    peak_runs: dict[str, list] = {"ours": [], "plain": []}
    flat: dict[str, dict] = {}
    with BenchRedis() as redis:
        with DemoSite(products=PEAK_PRODUCTS[mode], per_page=PER_PAGE, faults=False) as site:
            for rep in range(0 if mode == "smallest" else repeat):
                for system in (("ours", "plain") if rep % 2 == 0 else ("plain", "ours")):
                    run = crawl(redis, site, system, PEAK_PRODUCTS[mode], 0.1)
                    peak_runs[system].append(strip_series(run))
                    print(f"  peak rep {rep + 1} {system}: {run['per_node'][0]['peak_rss_mb']:.1f} MB",
                          flush=True)
        with DemoSite(products=flat_n, per_page=PER_PAGE, faults=False) as site:
            for system in ("ours", "plain"):
                run = crawl(redis, site, system, flat_n, 0.1 if mode == "smallest" else 1.0)
                redis_used = redis.client.info("memory")["used_memory"] if system == "ours" else None
                if mode == "smallest":  # no separate peak runs: the flat run serves
                    peak_runs[system].append(strip_series(run))
                points = rss_at_progress(run)
                node = run["per_node"][0]
                flat[system] = {
                    "pages": run["pages"], "elapsed_s": run["elapsed_s"],
                    "peak_rss_mb": node["peak_rss_mb"], "rss_at": points,
                    "redis_used_memory_mb": redis_used / 2**20 if redis_used else None,
                    "growth_25_100_mb": (points["100%"] - points["25%"])
                    if points.get("100%") and points.get("25%") else None,
                    "rss_series_mb": [(round(t - node["first_request"], 1), round(r / 2**20, 1))
                                      for t, r in node["rss"]],
                }
                g = flat[system]["growth_25_100_mb"]
                flat[system]["growth_25_100_pct"] = (100 * g / points["25%"]) if g is not None else None
                print(f"  flat {system}: {points}", flush=True)
    peak = {s: {"peak_rss_mb": median([max(n["peak_rss_mb"] for n in r["per_node"]) for r in rs]),
                "runs_mb": [r["per_node"][0]["peak_rss_mb"] for r in rs],
                "pages": median([r["pages"] for r in rs])} for s, rs in peak_runs.items()}
    r = ratio(peak["ours"]["peak_rss_mb"], peak["plain"]["peak_rss_mb"])
    checks = [{"check": "ours peak RSS ÷ plain peak RSS", "ratio": r, "floor": f"≤ {FLOOR_PEAK}",
               "pass": r is not None and r <= FLOOR_PEAK}]
    data = {"mode": mode, "repeat": repeat, "peak_products": PEAK_PRODUCTS[mode],
            "flat_products": flat_n, "peak": peak, "flat": flat, "checks": checks,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    p = data["peak"]
    out = table(["system", "pages", "peak RSS MB (median)", "runs MB", "× plain"],
                [[LABELS[s], p[s]["pages"], p[s]["peak_rss_mb"],
                  ", ".join(f"{x:.1f}" for x in p[s]["runs_mb"]),
                  ratio(p[s]["peak_rss_mb"], p["plain"]["peak_rss_mb"])] for s in ("ours", "plain")])
    rows = []
    for s, f in data["flat"].items():
        at = f["rss_at"]
        rows.append([LABELS[s], f["pages"], f["elapsed_s"], at.get("10%"), at.get("25%"),
                     at.get("50%"), at.get("100%"), f["growth_25_100_mb"], f["growth_25_100_pct"],
                     f.get("redis_used_memory_mb")])
    out += "\n\n" + table(["system", "pages", "time s", "RSS MB @10%", "@25%", "@50%", "@100%",
                           "growth 25→100% MB", "growth %", "Redis used_memory MB at the end"],
                          rows)
    out += "\n\n" + table(["floor check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
