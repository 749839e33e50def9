"""Benchmark of the whole product (issue 38): the README block, 3 nodes, 20 sites with faults.

One command (``python -m bench.product``) crawls the multi-host site
(:mod:`devtools.demo.hosts`, 20 ms latency) with three systems, in turn:

* ``ours``: 3 nodes on the README's settings block, whole
  (:mod:`bench.readme_settings`, spider ``bench_hosts_readme``): per site
  ``DOWNLOAD_DELAY = 1`` and 2 in flight for the whole cluster, one robots.txt
  per site for the cluster, backoff, identity, validation and the MongoDB
  pipeline (a local SecantusDB);
* ``scrapy-redis``: 3 nodes of scrapy-redis 0.9.1 (``bench_hosts_scrapy_redis``)
  with the same ``DOWNLOAD_DELAY = 1`` and ``CONCURRENT_REQUESTS_PER_DOMAIN = 2``
  and AutoThrottle, all per process, Scrapy's ``RobotsTxtMiddleware``, and the
  same MongoDB pipeline;
* ``plain``: 1 plain Scrapy node (``bench_hosts_plain``), the scrapy-redis
  settings (our middlewares off: Scrapy's own), the same MongoDB pipeline.

The 20 sites (10 with ``--smoke``): every site answers 503 once on every 50th
page (``--fail-every 50``; 2 % of pages; ``--smoke`` every 3rd); the first has
10× the pages of the others; the second and third ask for ``Crawl-delay: 2``
in robots.txt; the fourth answers 429 with ``Retry-After: 5`` to a request that
arrives while 2 of its requests are in flight (its answers take 1.5 s, so a
client that holds 2 in flight at 1 request/s never sees it).

Reported, from the site's record of every request (robots.txt included) and
the nodes:

* pages/s: 200 answers (robots.txt aside) ÷ crawl time (first request to last
  response over all nodes);
* time ÷ ideal, ideal = the slowest site at its limit: the requests a complete,
  polite crawl must make of it (its pages, its robots.txt, and the second ask
  of each page that answers 503 once) × its interval (1 s, or its crawl
  delay); also reported against its pages alone (``time_over_pages_ideal``);
* per-site peak ÷ limit: the most requests any window of 4 intervals saw on a
  site ÷ the 4 its limit allows; the worst site, and how many robots.txt
  requests each site got;
* node CPU per page: psutil's user + system CPU of the node processes (whole
  process, start-up included) ÷ pages, and the in-crawl CPU the node records
  (``bench.recorder``: first request to last response);
* Redis commands per page: ``INFO commandstats`` delta over the run without the
  harness' own commands (as ``bench.commands``);
* completeness, 429/503 answers, items stored in MongoDB.

Floors (ours): time ≤ 1.2× ideal; per-site peak ≤ 1.0× limit.

    python -m bench.product [--quick | --smoke] [--only ours,scrapy-redis,plain] [--repeat N]

Writes ``bench/results/product.json`` (``--quick``/``--smoke``: under
``bench/results/quick/`` or ``smallest/``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import pymongo

from bench.common import (BenchRedis, base_parser, crawl_commands, median, mode_of, run_nodes,
                          strip_series, table, finish)
from crawlproject.keys import start_urls_key
from devtools.demo.hosts import Hit, MultiHostSite, max_in_window, max_overlap
from devtools.services import MongoServer

NAME = "product"
HOT_FACTOR = 10
# mode -> (sites, pages of a cold site, fail every N-th page)
SIZES = {"full": (20, 20, 50), "quick": (20, 5, 50), "smallest": (10, 1, 3)}
LATENCY_MS = 20
OVERLOAD_LATENCY_MS = 1500
OVERLOAD = (2, 5)  # 429 with Retry-After 5 s while 2 requests are in flight
CRAWL_DELAY_S = 2
DELAY_S = 1.0  # the README block's DOWNLOAD_DELAY
CONCURRENCY = 2  # the README block's CONCURRENT_REQUESTS_PER_DOMAIN
PEAK_INTERVALS = 4
DATABASE = "bench_product"
FLOOR_TIME = 1.2
FLOOR_PEAK = 1.0
MONGO_PIPELINE = json.dumps({"crawlproject.pipelines.mongo.MongoPipeline": 800})
PER_PROCESS = {"DOWNLOAD_DELAY": DELAY_S, "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY,
               "AUTOTHROTTLE_ENABLED": True, "ROBOTSTXT_OBEY": True,
               "ITEM_PIPELINES": MONGO_PIPELINE, "MONGO_PIPELINE_ENABLED": True}
# label -> (system, nodes, spider, settings module, extra settings)
SYSTEMS = {
    "ours": ("ours", 3, "bench_hosts_readme", "bench.readme_settings", {}),
    "scrapy-redis": ("scrapy-redis", 3, "bench_hosts_scrapy_redis", "bench.settings",
                     PER_PROCESS),
    "plain": ("plain", 1, "bench_hosts_plain", "bench.settings",
              {**PER_PROCESS, "MONGO_SPOOL_HANDOFF": False,
               "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue"}),
}
LABELS = {"ours": "ours: README block + MongoDB, 3 nodes",
          "scrapy-redis": "scrapy-redis, DOWNLOAD_DELAY + AutoThrottle per process, 3 nodes",
          "plain": "plain Scrapy, 1 node"}


def site_layout(mode: str) -> dict:
    """Hosts and their roles: hot, crawl delay, overload; pages; faults."""
    count, cold, every = SIZES[mode]
    hosts = [f"127.0.0.{121 + i}" for i in range(count)]
    return {"hosts": hosts, "hot": hosts[0], "crawl_delay": {h: CRAWL_DELAY_S for h in hosts[1:3]},
            "overload": {hosts[3]: OVERLOAD},
            "pages": {h: cold * (HOT_FACTOR if i == 0 else 1) for i, h in enumerate(hosts)},
            "latency_ms": {h: OVERLOAD_LATENCY_MS if i == 3 else LATENCY_MS
                           for i, h in enumerate(hosts)},
            "fail_every": every}


def interval(site: MultiHostSite, host: str) -> float:
    """The site's limit: one request per interval."""
    return max(DELAY_S, site.crawl_delay.get(host, 0))


def required_requests(site: MultiHostSite, host: str) -> int:
    """What a complete, polite crawl must ask *host*: its pages, its robots.txt,
    and each page that answers 503 once a second time."""
    every = site.fail_every.get(host, 0)
    return len(site.expected_paths(host)) + 1 + (site.pages[host] // every if every else 0)


def ideal_seconds(site: MultiHostSite, pages_only: bool = False) -> tuple[float, str]:
    """The slowest site at its limit (its required requests, or with
    *pages_only* its pages, × its interval), and which site."""
    per_site = {h: (len(site.expected_paths(h)) if pages_only else required_requests(site, h))
                * interval(site, h) for h in site.hosts}
    worst = max(per_site, key=per_site.get)
    return per_site[worst], worst


def one_run(redis: BenchRedis, site: MultiHostSite, mongo_uri: str, label: str,
            workdir: Path) -> dict:
    system, nodes, spider, module, extra = SYSTEMS[label]
    redis.reset()
    site.reset()
    with pymongo.MongoClient(mongo_uri) as client:
        client.drop_database(DATABASE)
    settings = {**extra, "MONGO_URI": mongo_uri, "MONGO_DATABASE": DATABASE,
                "MONGO_CLOSE_WAIT": 30}
    args = {}
    if system == "plain":
        seeds = workdir / "seeds.txt"
        seeds.write_text("\n".join(site.root_urls()) + "\n")
        args["seeds_file"] = str(seeds)
    else:
        redis.client.lpush(start_urls_key(spider), *site.root_urls())
    ideal, slowest = ideal_seconds(site)
    run = run_nodes(system, nodes, redis_url=redis.url if system != "plain" else None,
                    settings=settings, spider_args=args, spider=spider, settings_module=module,
                    timeout=120 + 4 * ideal, watch_pids=(redis.server.pid, site._proc.pid))
    commands = crawl_commands(redis.commandstats()) if system != "plain" else {}
    with pymongo.MongoClient(mongo_uri) as client:
        db = client[DATABASE]
        stored = sum(db[name].estimated_document_count() for name in db.list_collection_names())
    hits = site.requests()
    run = strip_series(run)
    run.update(figures(site, hits))
    pages = run["site_pages"]
    calls = sum(v["calls"] for v in commands.values())
    process_cpu = [n["process_cpu_s"] for n in run["per_node"]]
    run.update({
        "ideal_s": ideal, "slowest_site": slowest,
        "time_over_ideal": run["elapsed_s"] / ideal if run["elapsed_s"] else None,
        "time_over_pages_ideal": (run["elapsed_s"] / ideal_seconds(site, pages_only=True)[0]
                                  if run["elapsed_s"] else None),
        "site_pages_per_s": pages / run["elapsed_s"] if run["elapsed_s"] else None,
        "process_cpu_ms_per_page": (1000 * sum(process_cpu) / pages
                                    if pages and None not in process_cpu else None),
        "redis_calls": calls if system != "plain" else None,
        "redis_calls_per_page": calls / pages if system != "plain" and pages else None,
        "redis_top_per_page": {k: v["calls"] / pages for k, v in sorted(
            commands.items(), key=lambda kv: -kv[1]["calls"])[:8]} if pages else {},
        "stored_items": stored, "pages_per_node": [n["pages"] for n in run["per_node"]],
    })
    return run


def figures(site: MultiHostSite, hits: list[Hit]) -> dict:
    """Per-site politeness, completeness and answers, from the site's record."""
    by_host: dict[str, list[Hit]] = defaultdict(list)
    for hit in hits:
        by_host[hit.host].append(hit)
    per_site = {}
    for host in site.hosts:
        rows = by_host[host]
        step = interval(site, host)
        window = PEAK_INTERVALS * step
        peak = max_in_window([h.t for h in rows], window)
        ok = Counter(h.path for h in rows if h.status == 200)
        expected = site.expected_paths(host)
        per_site[host] = {
            "requests": len(rows), "interval_s": step, "peak_in_window": peak,
            "peak_over_limit": peak / PEAK_INTERVALS,
            "robots_txt": sum(1 for h in rows if h.path == "/robots.txt"),
            "max_in_flight": max_overlap((h.t, h.done) for h in rows),
            "statuses": dict(Counter(str(h.status) for h in rows)),
            "missing": len(expected - set(ok)),
            "duplicates": sum(n - 1 for p, n in ok.items() if p != "/robots.txt"),
        }
    worst = max(per_site, key=lambda h: per_site[h]["peak_over_limit"])
    statuses = Counter(str(h.status) for h in hits)
    return {
        "peak_over_limit": per_site[worst]["peak_over_limit"], "worst_site": worst,
        "max_in_flight": max(f["max_in_flight"] for f in per_site.values()),
        "robots_txt_max": max(f["robots_txt"] for f in per_site.values()),
        "robots_txt_total": sum(f["robots_txt"] for f in per_site.values()),
        "site_pages": sum(1 for h in hits if h.status == 200 and h.path != "/robots.txt"),
        "site_requests": len(hits), "statuses": dict(statuses),
        "missing": sum(f["missing"] for f in per_site.values()),
        "complete": all(f["missing"] == 0 for f in per_site.values()),
        "duplicates": sum(f["duplicates"] for f in per_site.values()),
        "per_site": per_site,
    }


def summarize(runs: list[dict]) -> dict:
    """Worst peak over the runs; medians of the rest (one run: that run)."""
    keys = ("elapsed_s", "time_over_ideal", "time_over_pages_ideal", "site_pages_per_s",
            "process_cpu_ms_per_page",
            "cpu_ms_per_page", "redis_calls_per_page")
    out = {k: median([r[k] for r in runs]) for k in keys}
    worst = max(runs, key=lambda r: r["peak_over_limit"])
    out.update({
        "runs": len(runs), "peak_over_limit": worst["peak_over_limit"],
        "worst_site": worst["worst_site"], "max_in_flight": max(r["max_in_flight"] for r in runs),
        "robots_txt_max": max(r["robots_txt_max"] for r in runs),
        "ideal_s": runs[0]["ideal_s"], "pages": min(r["site_pages"] for r in runs),
        "complete": all(r["complete"] for r in runs),
        "missing": max(r["missing"] for r in runs),
        "duplicates": max(r["duplicates"] for r in runs),
        "statuses": runs[0]["statuses"], "stored_items": min(r["stored_items"] for r in runs),
        "external_cores": max(r.get("external_cores") or 0 for r in runs),
        "errors": sum(len(r["errors"]) for r in runs),
    })
    return out


def checks_for(summary: dict) -> list[dict]:
    ours = summary.get("ours")
    if ours is None:
        return []
    time_ratio, peak = ours["time_over_ideal"], ours["peak_over_limit"]
    return [
        {"check": "ours: crawl time ÷ ideal", "value": time_ratio, "floor": f"≤ {FLOOR_TIME}",
         "pass": time_ratio is not None and time_ratio <= FLOOR_TIME},
        {"check": f"ours: per-site peak ÷ limit ({PEAK_INTERVALS} intervals, robots.txt "
                  f"included; worst {ours['worst_site']})", "value": peak,
         "floor": f"≤ {FLOOR_PEAK}", "pass": peak <= FLOOR_PEAK},
        {"check": "ours: every page crawled", "value": ours["missing"], "floor": "0 missing",
         "pass": ours["complete"]},
    ]


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (same as --smallest)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {list(SYSTEMS)}")
    args = parser.parse_args(argv)
    args.smallest = args.smallest or args.smoke
    mode = mode_of(args)
    labels = [k for k in SYSTEMS if not args.only or k in args.only.split(",")]
    repeat = args.repeat or 1
    layout = site_layout(mode)
    runs: dict[str, list] = {}
    t0 = time.monotonic()
    storage = Path(tempfile.mkdtemp(prefix="bench-product-mongo-"))
    mongo = MongoServer(storage_path=storage)
    mongo.start()
    try:
        with BenchRedis() as redis, MultiHostSite(
                layout["hosts"], pages=layout["pages"], latency_ms=layout["latency_ms"],
                crawl_delay=layout["crawl_delay"], fail_every=layout["fail_every"],
                overload=layout["overload"]) as site, \
                tempfile.TemporaryDirectory(prefix="bench-product-") as tmp:
            ideal, slowest = ideal_seconds(site)
            print(f"  {len(site.hosts)} sites, hot {layout['hot']}: {layout['pages'][layout['hot']]}"
                  f" pages; crawl delay {CRAWL_DELAY_S}s on {', '.join(layout['crawl_delay'])}; "
                  f"429 under load on {', '.join(layout['overload'])}; 503 once every "
                  f"{layout['fail_every']} pages; ideal {ideal:.0f}s ({slowest})", flush=True)
            for rep in range(repeat):
                for label in labels if rep % 2 == 0 else labels[::-1]:
                    run = one_run(redis, site, mongo.uri, label, Path(tmp))
                    runs.setdefault(label, []).append(run)
                    print(f"  rep {rep + 1} {label}: {run['site_pages']} pages in "
                          f"{run['elapsed_s'] or 0:.1f}s (÷ ideal {run['time_over_ideal'] or 0:.2f})"
                          f", peak ÷ limit {run['peak_over_limit']:.2f} on {run['worst_site']}, "
                          f"robots.txt ≤ {run['robots_txt_max']}/site, statuses {run['statuses']}, "
                          f"missing {run['missing']}, stored {run['stored_items']}, CPU "
                          f"{run['process_cpu_ms_per_page'] or 0:.1f} ms/page, Redis "
                          f"{run['redis_calls_per_page'] or 0:.1f} calls/page, other programs "
                          f"{run['external_cores'] or 0:.2f} cores", flush=True)
    finally:
        mongo.stop()
        shutil.rmtree(storage, ignore_errors=True)
    summary = {label: summarize(rs) for label, rs in runs.items()}
    data = {"mode": mode, "repeat": repeat, "layout": layout, "latency_ms": LATENCY_MS,
            "limit": {"DOWNLOAD_DELAY": DELAY_S, "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY,
                      "crawl_delay_s": CRAWL_DELAY_S, "overload": OVERLOAD},
            "peak_window_intervals": PEAK_INTERVALS, "summary": summary,
            "checks": checks_for(summary), "runs": runs, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = [[LABELS[label], s["site_pages_per_s"], s["elapsed_s"], s["ideal_s"],
             s["time_over_ideal"], s.get("time_over_pages_ideal"), s["peak_over_limit"], s["robots_txt_max"], s["max_in_flight"],
             s["process_cpu_ms_per_page"], s["cpu_ms_per_page"], s["redis_calls_per_page"],
             f"{s['pages']} ({s['missing']} missing)", s["stored_items"],
             " ".join(f"{k}:{v}" for k, v in sorted(s["statuses"].items())),
             round(s["external_cores"], 2)]
            for label, s in data["summary"].items()]
    out = table(["system", "pages/s", "time s", "ideal s", "time ÷ ideal",
                 "time ÷ pages at the limit",
                 f"per-site peak ÷ limit ({data['peak_window_intervals']} intervals)",
                 "robots.txt per site (max)", "in flight/site (max)", "node CPU ms/page (psutil)",
                 "in-crawl CPU ms/page", "Redis calls/page", "pages", "items stored",
                 "answers", "other programs (cores)"], rows)
    out += "\n\n" + table(["floor check", "value", "floor", "result"],
                          [[c["check"], c["value"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
