"""Benchmark: what the downloader middlewares cost, and how a crawl recovers from a ban.

One node of ours (``CONCURRENT_REQUESTS=16``) crawls the demo shop (``--no-faults``,
0 ms latency) from its home page, as ``bench.crawl`` does. Configurations, run
interleaved (rep 1 of each, then rep 2, ...), medians reported:

* ``off``: the identity, referer and proxy middlewares off (``IDENTITY_ENABLED``,
  ``REFERER_ENABLED``, ``PROXY_POOL_ENABLED`` False); requests go straight to the site
  with Scrapy's default User-Agent;
* ``on``: all three on as in production (one identity per session,
  ``SeedRefererMiddleware`` with ``REFERER_SEED_DEFAULT = "root"``, the shared proxy
  pool) through **one** local forward proxy (:mod:`devtools.demo.proxy`, Basic
  auth, keeps client connections alive as real proxies do);
* ``3 proxies``: ``on`` with a pool of three such proxies, none banning;
* ``3 proxies, 1 banned``: the same, but one proxy answers every request for the
  site's host with ``403`` and a captcha page (a site that banned that exit address).

Reported: pages/s, node CPU ms per page (the node process only, from its first
request to its last response), bans seen, pages through each proxy; and two checks:

* node CPU per page ``on`` ÷ ``off`` (floor ≤ 1.15): the middlewares' own cost;
* pages/s ``3 proxies, 1 banned`` ÷ ``3 proxies`` (floor ≥ 0.6): a banned proxy is
  taken out of rotation for that host after its first bans; its requests are
  retried through the others and the crawl goes on at the speed of the rest.

The local proxies run in this process (threads); their CPU counts as "other
programs" for the machine, not as node CPU.

    python -m bench.middlewares [--quick] [--repeat N] [--only on,off]
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack

from bench.common import (BenchRedis, base_parser, median, mode_of, ratio, run_nodes,
                          strip_series, table, finish)
from devtools.demo.proxy import ForwardProxy
from devtools.demo.site import DemoSite
from crawlproject.keys import start_urls_key

NAME = "middlewares"
SPIDER = "bench_ours"
PER_PAGE = 50
SIZES = {"full": 2000, "quick": 400, "smallest": 60}
CONCURRENCY = 16
FLOOR_CPU = 1.15
FLOOR_BAN = 0.6
CONFIGS = {
    "off": {"proxies": 0, "banned": 0},
    "on": {"proxies": 1, "banned": 0},
    "3 proxies": {"proxies": 3, "banned": 0},
    "3 proxies, 1 banned": {"proxies": 3, "banned": 1},
}
OFF = {"IDENTITY_ENABLED": False, "REFERER_ENABLED": False, "PROXY_POOL_ENABLED": False}
ON = {
    "IDENTITY_ENABLED": True,
    "REFERER_ENABLED": True,
    "REFERER_SEED_DEFAULT": "root",
    "PROXY_POOL_ENABLED": True,
    # the project's spider middlewares: SeedRefererMiddleware in place of Scrapy's
    "SPIDER_MIDDLEWARES": json.dumps({
        "scrapy.spidermiddlewares.referer.RefererMiddleware": None,
        "crawlproject.middlewares.referer.SeedRefererMiddleware": 700}),
}


def node_settings(config: str, proxies: list[ForwardProxy]) -> dict:
    settings = {"CONCURRENT_REQUESTS": CONCURRENCY,
                # cluster-wide per-host limit above what one node uses (as bench.crawl)
                "CONCURRENT_REQUESTS_PER_DOMAIN": 4 * CONCURRENCY}
    if config == "off":
        settings.update(OFF)
    else:
        settings.update(ON)
        settings["PROXY_POOL"] = ",".join(p.url for p in proxies)  # getlist splits on commas
    return settings


def one_run(redis: BenchRedis, site: DemoSite, config: str, proxies: list[ForwardProxy],
            products: int) -> dict:
    redis.reset()
    redis.client.lpush(start_urls_key(SPIDER), site.url)
    used = proxies[:CONFIGS[config]["proxies"]]
    before = [len(p.records) for p in used]
    run = run_nodes("ours", 1, redis_url=redis.url, settings=node_settings(config, used),
                    timeout=60 + products / 10, watch_pids=(redis.server.pid, site._proc.pid))
    run["config"] = config
    run["per_proxy"] = [len(p.records) - n for p, n in zip(used, before)]
    run["banned_answers"] = sum(
        sum(1 for r in p.records[n:] if r.status == 403) for p, n in zip(used, before))
    expected = products + -(-products // PER_PAGE) + 1  # products, listings, dead link
    run["expected_pages"] = expected
    run["complete"] = run["pages"] >= expected
    return run


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="configurations, comma-separated")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    products = SIZES[mode]
    repeat = args.repeat or (3 if mode == "full" else 1)
    only = [c for c in args.only.split(",") if c] or list(CONFIGS)
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    with BenchRedis() as redis, ExitStack() as stack:
        site = DemoSite(products=products, per_page=PER_PAGE, latency_ms=0, faults=False).start()
        stack.callback(site.stop)
        host = site.url.split("//", 1)[1].split(":", 1)[0]
        clean = [stack.enter_context(ForwardProxy(f"u{i}", f"secret-{i}")) for i in range(3)]
        banning = stack.enter_context(ForwardProxy("u9", "secret-9", ban_host=host))
        for rep in range(repeat):
            todo = only if rep % 2 == 0 else list(reversed(only))
            for config in todo:
                proxies = clean if not CONFIGS[config]["banned"] else [banning] + clean[:2]
                run = one_run(redis, site, config, proxies, products)
                print(f"  rep {rep + 1} {config}: {run['pages']} pages in {run['elapsed_s']:.2f}s"
                      f" = {run['pages_per_s']:.0f} pages/s, node CPU "
                      f"{run['cpu_ms_per_page']:.2f} ms/page, banned answers "
                      f"{run['banned_answers']}, per proxy {run['per_proxy']}", flush=True)
                runs.setdefault(config, []).append(strip_series(run))
    summary = {}
    for config, rs in runs.items():
        summary[config] = {
            "runs": len(rs),
            "pages": median([r["pages"] for r in rs]),
            "pages_per_s": median([r["pages_per_s"] for r in rs]),
            "pages_per_s_runs": [r["pages_per_s"] for r in rs],
            "cpu_ms_per_page": median([r["cpu_ms_per_page"] for r in rs]),
            "banned_answers": median([r["banned_answers"] for r in rs]),
            "per_proxy": rs[-1]["per_proxy"],
            "external_cores": median([r.get("external_cores") for r in rs]),
            "complete": all(r["complete"] for r in rs),
            "errors": sum(len(r["errors"]) for r in rs),
        }
    checks = []
    if "on" in summary and "off" in summary:
        r = ratio(summary["on"]["cpu_ms_per_page"], summary["off"]["cpu_ms_per_page"])
        checks.append({"check": "node CPU/page, middlewares on ÷ off", "ratio": r,
                       "floor": f"≤ {FLOOR_CPU}", "pass": r is not None and r <= FLOOR_CPU})
    if "3 proxies" in summary and "3 proxies, 1 banned" in summary:
        r = ratio(summary["3 proxies, 1 banned"]["pages_per_s"], summary["3 proxies"]["pages_per_s"])
        checks.append({"check": "pages/s, 1 of 3 proxies banned ÷ no bans", "ratio": r,
                       "floor": f"≥ {FLOOR_BAN}", "pass": r is not None and r >= FLOOR_BAN})
    data = {"mode": mode, "repeat": repeat, "concurrency": CONCURRENCY, "products": products,
            "summary": summary, "checks": checks, "runs": runs,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[config, s["pages"], s["pages_per_s"], s["cpu_ms_per_page"], s["banned_answers"],
             "/".join(str(n) for n in s["per_proxy"]) or "-", s["runs"],
             round(s["external_cores"] or 0, 2), "yes" if s["complete"] else "NO"]
            for config, s in data["summary"].items()]
    out = table(["configuration", "pages", "pages/s", "node CPU ms/page", "banned answers",
                 "pages per proxy (last run)", "runs", "other programs (cores)", "complete"], rows)
    out += "\n\n" + table(["check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
