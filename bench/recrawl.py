"""Incremental recrawl: a second pass over an unchanged site vs a full re-crawl.

The demo shop with 5,000 products (50 a listing page, 5,101 pages with the dead
link; every page sends validators) is crawled once by a node of ``bench_recrawl``
(``bench_ours`` storing items and page records in MongoDB, ``RECRAWL_INTERVAL``
an hour). Then, interleaved, ``--repeat`` times each:

* **incremental**: every page record made due (what ``crawlctl recrawl`` does),
  one node started with nothing seeded: the feeder puts the due pages back in the
  frontier, they are fetched with ``If-None-Match`` / ``If-Modified-Since``, the
  site answers 304, nothing is parsed or stored but the page records;
* **full**: the frontier and Bloom filter reset (``RECRAWL_ENABLED`` off), the
  seed pushed again, the whole site downloaded and parsed again (items unchanged:
  MongoDB writes nothing new).

Bytes are what Scrapy counted as downloaded (``downloader/response_bytes``:
status line, headers and body) and the body bytes the site sent; time is from the
first request to the last response. A third configuration, once, is the
incremental pass over the same site where every fifth product page sends no
validators (only the body hash can tell it is unchanged), as many real sites do.

With ``--page-kb N`` every product page carries N KiB more markup (the demo's
pages weigh about 1 KiB, real product pages tens): the same comparison where
downloading and parsing a page costs what it does on real sites.

    python -m bench.recrawl [--quick] [--repeat N] [--latency-ms MS] [--page-kb N] [--out F]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pymongo

from bench.common import BenchRedis, base_parser, median, mode_of, ratio, run_nodes, table, \
    finish
import crawlproject.settings as project_settings
from devtools.demo.site import DemoSite
from crawlproject.keys import start_urls_key
from devtools.services import MongoServer

NAME = "recrawl"
SPIDER = "bench_recrawl"
SIZES = {"full": 5000, "quick": 1000, "smallest": 100}
PER_PAGE = 50
FLOOR_BYTES = 5.0
DATABASE = "bench"


def node_settings(mongo_uri: str, recrawl: bool) -> dict:
    return {"MONGO_URI": mongo_uri, "MONGO_DATABASE": DATABASE, "RECRAWL_ENABLED": recrawl,
            "RECRAWL_INTERVAL": 3600, "RECRAWL_CHECK_INTERVAL": 0.5,
            "RECRAWL_BATCH_SIZE": 1000, "RECRAWL_MAX_QUEUED": 4000,
            "CONCURRENT_REQUESTS": 16, "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
            "MONGO_CLOSE_WAIT": 0,
            # the project's default (crawlproject/settings.py), both passes alike
            "CONCURRENT_ITEMS": project_settings.CONCURRENT_ITEMS}


def one_pass(redis: BenchRedis, site: DemoSite, mongo_uri: str, kind: str, products: int) -> dict:
    seed = lambda: redis.client.lpush(start_urls_key(SPIDER), site.url)  # noqa: E731
    if kind == "first" or kind == "full":
        redis.reset()
    else:  # incremental: every known page due now, as `crawlctl recrawl` makes it
        with pymongo.MongoClient(mongo_uri) as client:
            client[DATABASE][f"{SPIDER}_pages"].update_many(
                {}, {"$set": {"next_visit": datetime.now(timezone.utc)}})
    site.reset()
    run = run_nodes("ours", 1, redis_url=redis.url, spider=SPIDER,
                    settings=node_settings(mongo_uri, kind != "full"),
                    push=seed if kind in ("first", "full") else None,
                    timeout=120 + products / 10, watch_pids=(redis.server.pid, site._proc.pid))
    served = site.served()
    stats = run["per_node"][0]["stats"]
    statuses: dict[str, int] = {}
    for counts in served["paths"].values():
        for status, n in counts.items():
            statuses[status] = statuses.get(status, 0) + n
    return {"kind": kind, "pages": run["pages"], "elapsed_s": run["elapsed_s"],
            "response_bytes": stats.get("downloader/response_bytes", 0),
            "site_body_bytes": served["body_bytes"], "statuses": statuses,
            "not_modified": stats.get("recrawl/not_modified", 0),
            "unchanged": stats.get("recrawl/unchanged", 0),
            "items": stats.get("item_scraped_count", 0),
            "cpu_ms_per_page": run["cpu_ms_per_page"], "external_cores": run["external_cores"],
            "errors": run["errors"]}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=int, default=10, help="the site's latency per page")
    parser.add_argument("--page-kb", type=int, default=0,
                        help="KiB of extra markup per product page (the demo's are ~1 KiB; "
                             "real ones tens of KiB)")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    products = SIZES[mode]
    repeat = args.repeat or (3 if mode == "full" else 1)
    runs: dict[str, list] = {"incremental": [], "full": [], "incremental_mixed": []}
    t0 = time.monotonic()
    directory = Path(tempfile.mkdtemp(prefix="bench-recrawl-"))
    mongo = MongoServer(storage_path=directory / "mongo")
    mongo.start()
    try:
        with BenchRedis() as redis:
            with DemoSite(products=products, per_page=PER_PAGE, latency_ms=args.latency_ms,
                          faults=False, no_validators_every=0, page_kb=args.page_kb) as site:
                first = one_pass(redis, site, mongo.uri, "first", products)
                print(f"  first crawl: {first['pages']} pages in {first['elapsed_s']:.1f}s",
                      flush=True)
                for rep in range(repeat):
                    for kind in (("incremental", "full") if rep % 2 == 0 else
                                 ("full", "incremental")):
                        run = one_pass(redis, site, mongo.uri, kind, products)
                        runs[kind].append(run)
                        print(f"  rep {rep + 1} {kind}: {run['pages']} pages, "
                              f"{run['response_bytes']:,} bytes in {run['elapsed_s']:.2f}s",
                              flush=True)
            # The same site where every fifth product page has no validators.
            with DemoSite(products=products, per_page=PER_PAGE, latency_ms=args.latency_ms,
                          faults=False, page_kb=args.page_kb) as mixed, \
                    pymongo.MongoClient(mongo.uri) as client:
                client.drop_database(DATABASE)  # only this site's pages are known
                one_pass(redis, mixed, mongo.uri, "first", products)
                run = one_pass(redis, mixed, mongo.uri, "incremental", products)
                runs["incremental_mixed"].append(run)
                print(f"  incremental, 1 page in 5 without validators: "
                      f"{run['response_bytes']:,} bytes in {run['elapsed_s']:.2f}s", flush=True)
    finally:
        mongo.stop()
        shutil.rmtree(directory, ignore_errors=True)
    summary = {kind: {"runs": len(rs), "pages": median([r["pages"] for r in rs]),
                      "response_bytes": median([r["response_bytes"] for r in rs]),
                      "site_body_bytes": median([r["site_body_bytes"] for r in rs]),
                      "elapsed_s": median([r["elapsed_s"] for r in rs]),
                      "cpu_ms_per_page": median([r["cpu_ms_per_page"] for r in rs]),
                      "not_modified": median([r["not_modified"] for r in rs]),
                      "statuses": rs[-1]["statuses"] if rs else {}}
               for kind, rs in runs.items() if rs}
    full, inc = summary["full"], summary["incremental"]
    bytes_ratio = ratio(full["response_bytes"], inc["response_bytes"])
    data = {"mode": mode, "products": products, "repeat": repeat, "latency_ms": args.latency_ms,
            "page_kb": args.page_kb,
            "first": first, "summary": summary, "runs": runs,
            "checks": [{"check": "full re-crawl bytes ÷ incremental pass bytes",
                        "ratio": bytes_ratio, "floor": FLOOR_BYTES,
                        "pass": bytes_ratio is not None and bytes_ratio >= FLOOR_BYTES},
                       {"check": "full re-crawl time ÷ incremental pass time (reported)",
                        "ratio": ratio(full["elapsed_s"], inc["elapsed_s"]), "floor": None,
                        "pass": None}],
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    labels = {"incremental": "incremental pass (all pages with validators)",
              "full": "full re-crawl",
              "incremental_mixed": "incremental pass (1 product page in 5 without validators)"}
    rows = [[labels[k], s["runs"], s["pages"], s["response_bytes"], s["site_body_bytes"],
             s["elapsed_s"], s["cpu_ms_per_page"],
             ", ".join(f"{code}: {n}" for code, n in sorted(s["statuses"].items()))]
            for k, s in data["summary"].items()]
    out = table(["pass", "runs", "pages", "bytes downloaded", "body bytes sent", "time s",
                 "node CPU ms/page", "answers"], rows)
    out += "\n\n" + table(["check", "ratio", "floor", "result"],
                          [[c["check"], c["ratio"], f"≥ {c['floor']}" if c["floor"] else "—",
                            c["pass"] if c["pass"] is not None else "reported"]
                           for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
