"""The garbage collector's freeze on a long crawl: speed and memory of one node.

One node of ours at ``CONCURRENT_REQUESTS=16`` crawls the demo shop at 0 ms
(20,000 products, 20,401 pages) with Scrapy's defaults, with the freeze of
:mod:`crawlproject.extensions.gctuning` only, and with the project's node tuning
(:data:`bench.crawl.TUNING`: the freeze and ``CONCURRENT_ITEMS``), interleaved.
Reported: pages/s, node CPU per page and the collector's share of it (a
``gc.callbacks`` timer in :mod:`bench.recorder`), peak RSS, and the objects
frozen (from the node's stats). The freeze keeps the start-up heap out of every collection; what it could cost is memory
(a reference cycle among frozen objects is kept until close), hence the long
crawl and the RSS.

    python -m bench.gcfreeze [--repeat N] [--products N]
"""

from __future__ import annotations

import time

from bench.common import BenchRedis, base_parser, median, mode_of, ratio, table, finish
from bench.crawl import PER_PAGE, TUNING, one_run
from devtools.demo.site import DemoSite

NAME = "gcfreeze"
PRODUCTS = {"full": 20_000, "quick": 2_000, "smallest": 60}
FREEZE_ONLY = {k: v for k, v in TUNING.items() if k != "CONCURRENT_ITEMS"}
CONFIGS = {"defaults": ("ours", None), "freeze": ("ours", FREEZE_ONLY), "tuned": ("ours", TUNING)}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=None)
    args = parser.parse_args(argv)
    mode = mode_of(args)
    products = args.products or PRODUCTS[mode]
    repeat = args.repeat or (2 if mode == "full" else 1)
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    with BenchRedis() as redis:
        site = DemoSite(products=products, per_page=PER_PAGE, latency_ms=0, faults=False).start()
        try:
            for rep in range(repeat):
                names = list(CONFIGS)
                for name in (reversed(names) if rep % 2 else names):
                    system, settings = CONFIGS[name]
                    run = one_run(redis, site, system, 1, products, 16, settings)
                    node = run["per_node"][0]
                    stats = node["stats"]
                    runs.setdefault(name, []).append({
                        "pages": run["pages"], "pages_per_s": run["pages_per_s"],
                        "cpu_ms_per_page": run["cpu_ms_per_page"],
                        "gc_ms_per_page": run["gc_ms_per_page"],
                        "peak_rss_mb": node["peak_rss_mb"], "complete": run["complete"],
                        "external_cores": run["external_cores"],
                        "frozen_objects": stats.get("gc/frozen_objects")})
                    print(f"  rep {rep + 1} {name}: {run['pages']} pages, "
                          f"{run['pages_per_s']:.0f} pages/s, {run['cpu_ms_per_page']:.2f} ms "
                          f"CPU/page, peak RSS {node['peak_rss_mb']:.1f} MB", flush=True)
        finally:
            site.stop()
    summary = {}
    for name, rs in runs.items():
        summary[name] = {k: median([r[k] for r in rs])
                         for k in ("pages", "pages_per_s", "cpu_ms_per_page", "gc_ms_per_page",
                                   "peak_rss_mb")}
        summary[name].update(complete=all(r["complete"] for r in rs),
                             frozen_objects=rs[-1]["frozen_objects"])
    base = summary.get("defaults", {})
    for s in summary.values():
        s["speed_vs_defaults"] = ratio(s["pages_per_s"], base.get("pages_per_s"))
        s["rss_vs_defaults"] = ratio(s["peak_rss_mb"], base.get("peak_rss_mb"))
    data = {"mode": mode, "repeat": repeat, "products": products, "summary": summary,
            "runs": runs, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[name, s["pages"], s["pages_per_s"], s["speed_vs_defaults"], s["cpu_ms_per_page"],
             s["gc_ms_per_page"],
             s["peak_rss_mb"], s["rss_vs_defaults"], s["frozen_objects"] or "–", "yes" if s["complete"] else "NO"]
            for name, s in data["summary"].items()]
    return table(["ours with", "pages", "pages/s", "× defaults", "node CPU ms/page",
                  "of it, garbage collector",
                  "peak RSS MB", "RSS × defaults", "frozen objects", "complete"], rows)


if __name__ == "__main__":
    main()
