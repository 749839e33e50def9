"""Benchmark: what browser impersonation on the wire costs a node (issue 40).

One node of ours (``CONCURRENT_REQUESTS=16``) crawls the demo shop (``--no-faults``)
from its home page, as ``bench.middlewares`` does, with identities on in both
configurations so that only the download path differs:

* ``off``: Scrapy's own HTTP client (Twisted), the identity's headers;
* ``on``: ``IMPERSONATE_ENABLED`` with the add-on: curl_cffi sends every request
  with the identity's browser profile (the demo shop is plain http: the profile's
  HTTP/1.1 headers and order, no TLS; the TLS handshake adds its cost once per
  connection, and connections are reused).

at 0 and 50 ms of site latency, interleaved (rep 1 of each, then rep 2, ...),
medians. Reported as ratios ``on ÷ off``: pages/s and node CPU ms per page (the
node process only, first request to last response).

Memory: the same node given 100 seeds (one product page each) in 100 explicit
sessions (``meta["session"]``), so that the impersonating handler holds 100
session connection pools (one curl_cffi session each); peak RSS of the node,
``on`` and ``off``, and the difference per session.

    python -m bench.impersonate [--quick] [--repeat N]
"""

from __future__ import annotations

import json
import time

from bench.common import (BenchRedis, base_parser, finish, median, mode_of, ratio, run_nodes,
                          strip_series, table)
from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite

NAME = "impersonate"
SPIDER = "bench_ours"
PER_PAGE = 50
SIZES = {"full": 2000, "quick": 400, "smallest": 60}
CONCURRENCY = 16
LATENCIES = (0, 50)
SESSIONS = 100
FLOOR_RATE_50 = 0.9     # pages/s on ÷ off at 50 ms: the site's latency, not the client, decides
FLOOR_CPU = 1.5         # node CPU per page on ÷ off
ADDON = json.dumps({"crawlproject.impersonate.ImpersonateAddon": 0})


def node_settings(config: str) -> dict:
    settings = {"CONCURRENT_REQUESTS": CONCURRENCY,
                "CONCURRENT_REQUESTS_PER_DOMAIN": 4 * CONCURRENCY,
                "IDENTITY_ENABLED": True, "SEED_META_ALLOW": '["session"]'}
    if config == "on":
        settings.update(IMPERSONATE_ENABLED=True, ADDONS=ADDON)
    return settings


def crawl_run(redis: BenchRedis, site: DemoSite, config: str, products: int) -> dict:
    redis.reset()
    redis.client.lpush(start_urls_key(SPIDER), site.url)
    run = run_nodes("ours", 1, redis_url=redis.url, settings=node_settings(config),
                    timeout=60 + products / 10, watch_pids=(redis.server.pid, site._proc.pid))
    expected = products + -(-products // PER_PAGE) + 1  # products, listings, dead link
    run.update(config=config, expected_pages=expected, complete=run["pages"] >= expected,
               impersonated=run["per_node"][0]["stats"].get("impersonate/responses", 0))
    return run


def sessions_run(redis: BenchRedis, site: DemoSite, config: str) -> dict:
    redis.reset()
    redis.client.lpush(start_urls_key(SPIDER), *(
        json.dumps({"url": f"{site.url}product/{n}", "meta": {"session": f"visitor{n}"}})
        for n in range(1, SESSIONS + 1)))
    run = run_nodes("ours", 1, redis_url=redis.url, spider_args={"follow": "0"},
                    settings=node_settings(config), timeout=120,
                    watch_pids=(redis.server.pid, site._proc.pid))
    node = run["per_node"][0]
    return {"config": config, "pages": run["pages"], "peak_rss_mb": node["peak_rss_mb"],
            "impersonated": node["stats"].get("impersonate/responses", 0),
            "errors": run["errors"]}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    mode = mode_of(args)
    products = SIZES[mode]
    repeat = args.repeat or (3 if mode == "full" else 1)
    runs: dict[str, list] = {}
    memory: dict[str, list] = {}
    t0 = time.monotonic()
    with BenchRedis() as redis:
        for latency in LATENCIES:
            site = DemoSite(products=products, per_page=PER_PAGE, latency_ms=latency,
                            faults=False).start()
            try:
                for rep in range(repeat):
                    for config in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                        run = crawl_run(redis, site, config, products)
                        key = f"{config}|{latency}"
                        print(f"  rep {rep + 1} {config} {latency} ms: {run['pages']} pages in "
                              f"{run['elapsed_s']:.2f}s = {run['pages_per_s']:.0f} pages/s, "
                              f"node CPU {run['cpu_ms_per_page']:.2f} ms/page, impersonated "
                              f"{run['impersonated']}", flush=True)
                        runs.setdefault(key, []).append(strip_series(run))
                if latency == 0:
                    for config in ("off", "on"):
                        result = sessions_run(redis, site, config)
                        print(f"  {SESSIONS} sessions {config}: peak RSS "
                              f"{result['peak_rss_mb']:.1f} MB, {result['pages']} pages",
                              flush=True)
                        memory.setdefault(config, []).append(result)
            finally:
                site.stop()
    summary = {}
    for key, rs in runs.items():
        config, latency = key.split("|")
        summary[key] = {
            "config": config, "latency_ms": int(latency), "runs": len(rs),
            "pages": median([r["pages"] for r in rs]),
            "pages_per_s": median([r["pages_per_s"] for r in rs]),
            "pages_per_s_runs": [r["pages_per_s"] for r in rs],
            "cpu_ms_per_page": median([r["cpu_ms_per_page"] for r in rs]),
            "impersonated": median([r["impersonated"] for r in rs]),
            "external_cores": median([r.get("external_cores") for r in rs]),
            "complete": all(r["complete"] for r in rs),
            "errors": sum(len(r["errors"]) for r in rs),
        }
    checks = []
    for latency in LATENCIES:
        on, off = summary.get(f"on|{latency}"), summary.get(f"off|{latency}")
        if not (on and off):
            continue
        rate = ratio(on["pages_per_s"], off["pages_per_s"])
        cpu = ratio(on["cpu_ms_per_page"], off["cpu_ms_per_page"])
        checks.append({"check": f"pages/s, impersonation on ÷ off, {latency} ms", "ratio": rate,
                       "floor": f"≥ {FLOOR_RATE_50}" if latency == 50 else None,
                       "pass": rate is not None and rate >= FLOOR_RATE_50
                       if latency == 50 else None})
        checks.append({"check": f"node CPU/page, impersonation on ÷ off, {latency} ms",
                       "ratio": cpu, "floor": f"≤ {FLOOR_CPU}",
                       "pass": cpu is not None and cpu <= FLOOR_CPU})
    mem = {c: {"peak_rss_mb": median([r["peak_rss_mb"] for r in rs]),
               "pages": median([r["pages"] for r in rs]),
               "impersonated": median([r["impersonated"] for r in rs])}
           for c, rs in memory.items()}
    if "on" in mem and "off" in mem:
        mem["extra_mb_per_session"] = round(
            (mem["on"]["peak_rss_mb"] - mem["off"]["peak_rss_mb"]) / SESSIONS, 3)
    data = {"mode": mode, "repeat": repeat, "concurrency": CONCURRENCY, "products": products,
            "sessions": SESSIONS, "summary": summary, "memory": mem, "checks": checks,
            "runs": runs, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[s["config"], s["latency_ms"], s["pages"], s["pages_per_s"], s["cpu_ms_per_page"],
             s["impersonated"], s["runs"], round(s["external_cores"] or 0, 2),
             "yes" if s["complete"] else "NO"]
            for s in data["summary"].values()]
    out = table(["impersonation", "latency ms", "pages", "pages/s", "node CPU ms/page",
                 "impersonated", "runs", "other programs (cores)", "complete"], rows)
    mem = data["memory"]
    out += "\n\n" + table(["node with 100 sessions", "peak RSS MB", "pages", "impersonated"],
                          [[c, m["peak_rss_mb"], m["pages"], m["impersonated"]]
                           for c, m in mem.items() if isinstance(m, dict)])
    if "extra_mb_per_session" in mem:
        out += f"\n\nextra MB per session (on - off) ÷ {data['sessions']}: " \
               f"{mem['extra_mb_per_session']}"
    out += "\n\n" + table(["check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"] or "-", c["pass"]]
                           for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
