"""Benchmark: items per second through the MongoDB pipeline into a MongoDB-wire server.

Compares, in the same run and against the same server:

* ``naive``: the item pipeline of Scrapy's documentation: a synchronous
  ``pymongo.MongoClient`` and one ``insert_one`` per item (Decimal converted
  to Decimal128 so it can be stored at all). The floor applies to this one.
* ``naive_async``: one ``insert_one`` per item through ``AsyncMongoClient``,
  many items in flight (a stronger baseline, for information).
* ``pipeline``: :class:`crawlproject.pipelines.mongo.MongoPipeline` with the
  project defaults (bulk, idempotent, durable before ``process_item``
  returns), on new keys as in a first crawl.
* ``pipeline_recrawl``: the same items again (every key exists and is
  unchanged): the cost of a re-crawl, for information.

Items are :class:`crawlproject.items.ProductItem` objects with the demo
catalog's clean values; ``process_item`` is called with ``--concurrency``
items in flight (default 1000), as in a fast crawl where responses keep
arriving while earlier items wait for their write. Each
variant writes to a fresh database; variants alternate within each repeat
and the median of the repeats is reported. The server is a local SecantusDB
(``devtools.services.MongoServer``) unless ``--uri`` is given.

Run::

    python -m bench.bench_pipeline [--quick] [--items N] [--repeats R]
        [--concurrency C] [--uri mongodb://...]

Writes ``bench/results/bench_pipeline.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pymongo
from itemadapter import ItemAdapter
from scrapy import Spider

from devtools.demo.site import catalog
from crawlproject.items import ProductItem
from crawlproject.pipelines.documents import to_mongo
from crawlproject.pipelines.mongo import MongoPipeline

RESULTS = Path(__file__).resolve().parent / "results" / "bench_pipeline.json"
FLOOR = 5.0
BASE = "http://127.0.0.1:8000/"


class BenchSpider(Spider):
    name = "bench_pipeline"


# ---------------------------------------------------------------------------- pipelines


class NaiveMongoPipeline:
    """Scrapy documentation's MongoPipeline: sync client, one insert_one per item."""

    def __init__(self, uri: str, database: str):
        self.uri, self.database = uri, database

    def open_spider(self):
        self.client = pymongo.MongoClient(self.uri)
        self.db = self.client[self.database]

    def close_spider(self):
        self.client.close()

    def process_item(self, item):
        self.db["products"].insert_one(to_mongo(ItemAdapter(item).asdict()))
        return item


class NaiveAsyncMongoPipeline:
    """One insert_one per item through the asyncio client (items overlap)."""

    def __init__(self, uri: str, database: str):
        self.uri, self.database = uri, database

    async def open_spider(self):
        self.client = pymongo.AsyncMongoClient(self.uri)
        self.db = self.client[self.database]

    async def close_spider(self):
        await self.client.close()

    async def process_item(self, item):
        await self.db["products"].insert_one(to_mongo(ItemAdapter(item).asdict()))
        return item


def make_items(count: int) -> list[ProductItem]:
    """*count* clean ProductItems with the demo catalog's values."""
    items = []
    for p in catalog(count):
        items.append(ProductItem(
            url=f"{BASE}product/{p.id}", title=p.title, price=p.price, currency=p.currency,
            published=p.published, description=p.description,
            related=[f"{BASE}product/{j}" for j in dict.fromkeys(p.related)], rendered=False))
    return items


def project_pipeline(uri: str, database: str, spool_dir: str) -> tuple[MongoPipeline, object]:
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(BenchSpider, {
        "MONGO_URI": uri, "MONGO_DATABASE": database, "MONGO_COLLECTION": "products",
        "MONGO_SPOOL_DIR": spool_dir, "MONGO_SPOOL_HANDOFF": False, "LOG_LEVEL": "WARNING"})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return MongoPipeline.from_crawler(crawler), crawler


# ---------------------------------------------------------------------------- driving


async def feed(pipeline, items, concurrency: int, sync: bool) -> None:
    """Call process_item for every item, *concurrency* at a time (like Scrapy)."""
    if sync:
        for item in items:
            pipeline.process_item(item)
        return
    queue = iter(items)

    async def worker():
        for item in queue:
            await pipeline.process_item(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_variant(name: str, uri: str, items, concurrency: int, spool_dir: str,
                      database: str | None = None) -> dict:
    """Run one variant; the timing covers open, every item and close."""
    database = database or f"bench_{name}_{uuid.uuid4().hex[:8]}"
    stats = None
    start = time.perf_counter()
    cpu = time.process_time()
    if name == "naive":
        pipe = NaiveMongoPipeline(uri, database)
        pipe.open_spider()
        await feed(pipe, items, concurrency, sync=True)
        pipe.close_spider()
    elif name == "naive_async":
        pipe = NaiveAsyncMongoPipeline(uri, database)
        await pipe.open_spider()
        await feed(pipe, items, concurrency, sync=False)
        await pipe.close_spider()
    else:
        pipe, crawler = project_pipeline(uri, database, spool_dir)
        start = time.perf_counter()
        cpu = time.process_time()
        await pipe.open_spider()
        await feed(pipe, items, concurrency, sync=False)
        await pipe.close_spider()
        stats = {k: v for k, v in crawler.stats.get_stats().items() if k.startswith("mongo/")}
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - cpu
    return {"database": database, "seconds": elapsed, "items_per_s": len(items) / elapsed,
            "client_cpu_s": client_cpu, "stats": stats}


def check_stored(uri: str, database: str, count: int) -> None:
    client = pymongo.MongoClient(uri)
    try:
        stored = client[database]["products"].count_documents({})
    finally:
        client.close()
    if stored != count:
        raise SystemExit(f"{database}: {stored} documents stored, expected {count}")


def drop(uri: str, database: str) -> None:
    client = pymongo.MongoClient(uri)
    try:
        client.drop_database(database)
    finally:
        client.close()


async def bench(uri: str, count: int, repeats: int, concurrency: int) -> dict:
    items = make_items(count)
    runs: dict[str, list[dict]] = {"naive": [], "naive_async": [], "pipeline": [],
                                   "pipeline_recrawl": []}
    with tempfile.TemporaryDirectory() as spool_dir:
        # Warm-up (imports, server caches), not recorded.
        warm = await run_variant("pipeline", uri, items[:200], concurrency, spool_dir)
        drop(uri, warm["database"])
        for _ in range(repeats):
            for name in ("naive", "pipeline", "naive_async"):
                result = await run_variant(name, uri, items, concurrency, spool_dir)
                check_stored(uri, result["database"], count)
                runs[name].append(result)
                if name == "pipeline":
                    again = await run_variant("pipeline_recrawl", uri, items, concurrency,
                                              spool_dir, database=result["database"])
                    check_stored(uri, result["database"], count)
                    runs["pipeline_recrawl"].append(again)
                drop(uri, result["database"])
    summary = {}
    for name, results in runs.items():
        rates = [r["items_per_s"] for r in results]
        summary[name] = {"items_per_s": statistics.median(rates), "runs_items_per_s": rates,
                         "client_cpu_s": statistics.median(r["client_cpu_s"] for r in results),
                         "stats": results[-1]["stats"]}
    return summary


def print_table(report: dict) -> None:
    naive = report["results"]["naive"]["items_per_s"]
    print(f"\nMongoDB pipeline benchmark: {report['items']} items, {report['repeats']} repeat(s), "
          f"{report['concurrency']} in flight, server {report['server']}")
    print(f"{'variant':<18}{'items/s':>12}{'vs naive':>10}{'client CPU s':>14}")
    for name, result in report["results"].items():
        rate = result["items_per_s"]
        print(f"{name:<18}{rate:>12.0f}{rate / naive:>9.1f}x{result['client_cpu_s']:>14.2f}")
    verdict = "PASS" if report["passed"] else "FAIL"
    print(f"pipeline / naive = {report['ratio']:.1f}x (floor {FLOOR:.0f}x): {verdict}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2000 items, 1 repeat")
    parser.add_argument("--items", type=int, default=None, help="items per run (default 10000)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default 3)")
    parser.add_argument("--concurrency", type=int, default=1000,
                        help="items in flight (default 1000)")
    parser.add_argument("--uri", default=None,
                        help="use this MongoDB instead of a local SecantusDB")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    count = args.items or (2000 if args.quick else 10_000)
    repeats = args.repeats or (1 if args.quick else 3)

    server = None
    uri = args.uri
    storage = None
    if uri is None:
        from devtools.services import MongoServer

        storage = tempfile.TemporaryDirectory()
        server = MongoServer(storage_path=storage.name)
        server.start()
        uri = server.uri
    try:
        results = asyncio.run(bench(uri, count, repeats, args.concurrency))
    finally:
        if server is not None:
            server.stop()
            storage.cleanup()
    ratio = results["pipeline"]["items_per_s"] / results["naive"]["items_per_s"]
    report = {
        "benchmark": "bench_pipeline",
        "items": count, "repeats": repeats, "concurrency": args.concurrency,
        "server": ("SecantusDB (devtools.services.MongoServer)" if args.uri is None
                   else "given --uri"),
        "results": results, "ratio": ratio, "floor": FLOOR, "passed": ratio >= FLOOR,
        "environment": {"python": platform.python_version(), "pymongo": pymongo.version,
                        "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                        "platform": platform.platform()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print_table(report)
    print(f"wrote {args.output}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
