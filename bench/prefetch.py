"""One node at CONCURRENT_REQUESTS=16: plain Scrapy against ours at several
``SCHEDULER_PREFETCH`` values, interleaved, at 0 and 50 ms of site latency.

The workload of :mod:`bench.crawl` (the demo shop, 2,000 products at 0 ms, 1,000
at 50 ms). Each repetition runs plain Scrapy and ours with every prefetch value
once per latency (order reversed every other repetition); medians are reported,
with pages/s ÷ plain's, node CPU per page and Redis commands per page.

    python -m bench.prefetch [--repeat N] [--values 8,16,32]
"""

from __future__ import annotations

import time

from bench.common import BenchRedis, base_parser, median, mode_of, ratio, table, finish
from bench.crawl import PER_PAGE, one_run
from devtools.demo.site import DemoSite

NAME = "prefetch"
SIZES = {"full": {0: 2000, 50: 1000}, "quick": {0: 400, 50: 300}, "smallest": {0: 60}}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--values", default="8,16,32", help="SCHEDULER_PREFETCH values")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    values = [int(v) for v in args.values.split(",") if v]
    repeat = args.repeat or (4 if mode == "full" else 1)
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    with BenchRedis() as redis:
        sites = {lat: DemoSite(products=n, per_page=PER_PAGE, latency_ms=lat, faults=False).start()
                 for lat, n in SIZES[mode].items()}
        try:
            for rep in range(repeat):
                for lat, site in sites.items():
                    configs = [("plain", None)] + [("ours", v) for v in values]
                    for system, value in (reversed(configs) if rep % 2 else configs):
                        run = one_run(redis, site, system, 1, SIZES[mode][lat], 16,
                                      {"SCHEDULER_PREFETCH": value} if value else None)
                        key = f"{system}{value or ''}|{lat}"
                        runs.setdefault(key, []).append(
                            {k: run.get(k) for k in ("pages_per_s", "cpu_ms_per_page",
                                                     "redis_calls_per_page", "external_cores",
                                                     "complete")})
                        print(f"  rep {rep + 1} {key}: {run['pages_per_s']:.0f} pages/s, "
                              f"{run['cpu_ms_per_page']:.2f} ms CPU/page", flush=True)
        finally:
            for site in sites.values():
                site.stop()
    summary = {}
    for key, rs in runs.items():
        system, lat = key.split("|")
        plain = median([r["pages_per_s"] for r in runs[f"plain|{lat}"]])
        pages = median([r["pages_per_s"] for r in rs])
        summary[key] = {"latency_ms": int(lat), "system": system, "pages_per_s": pages,
                        "vs_plain": ratio(pages, plain),
                        "cpu_ms_per_page": median([r["cpu_ms_per_page"] for r in rs]),
                        "redis_calls_per_page": median([r["redis_calls_per_page"] for r in rs]),
                        "pages_per_s_runs": [round(r["pages_per_s"]) for r in rs],
                        "complete": all(r["complete"] for r in rs)}
    data = {"mode": mode, "repeat": repeat, "values": values, "summary": summary, "runs": runs,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[f"{s['latency_ms']} ms", "plain Scrapy" if s["system"] == "plain" else
             f"ours, prefetch {s['system'][4:]}", s["pages_per_s"], s["vs_plain"],
             s["cpu_ms_per_page"], s["redis_calls_per_page"],
             ", ".join(map(str, s["pages_per_s_runs"]))]
            for s in sorted(data["summary"].values(),
                            key=lambda s: (s["latency_ms"], s["system"]))]
    return table(["latency", "system", "pages/s", "× plain", "node CPU ms/page",
                  "Redis cmds/page", "pages/s of each run"], rows)


if __name__ == "__main__":
    main()
