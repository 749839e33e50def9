"""Where page records live: Redis memory vs MongoDB storage, per page, at 10M pages.

The revisit state of a page (validators, body hash, interval, counters, next
visit, and the request that fetches it again) could be kept

* in Redis, as compactly as Redis allows: a hash ``fingerprint (8 bytes) →
  packed record`` (etag, Last-Modified as seconds, body hash 8 bytes, interval,
  counters, then the request's JSON payload) and a zset ``fingerprint → next
  visit``: what a feeder would need. All of it in RAM, on the frontier's
  Redis;
* in MongoDB, one document per page (``<spider>_pages``, what this project
  does): the document as the pipeline stores it, plus the ``_id`` and
  ``next_visit`` indexes.

Redis: the real structure for ``--pages`` pages (10,000,000 by default),
``INFO memory`` ``used_memory`` before and after. MongoDB: the BSON size of
the real documents (:func:`crawlproject.recrawl.visit_record` through the
pipeline's :func:`insert_document`), and the bytes the MongoDB-wire server's
storage directory grew by for ``--mongo-pages`` of them (SecantusDB keeps
WiredTiger files, like MongoDB; it has no ``collStats``), extrapolated per page.

    python -m bench.recrawl_memory [--quick] [--pages N] [--mongo-pages N]
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pymongo

from bench.common import BenchRedis, base_parser, mode_of, ratio, table, finish
from crawlproject.pipelines.documents import WriteOp, insert_document, item_fields
from crawlproject.recrawl.schedule import PageState, RevisitRule, visit_record

NAME = "recrawl_memory"
PAGES = {"full": 10_000_000, "quick": 500_000, "smallest": 5_000}
MONGO_PAGES = {"full": 100_000, "quick": 20_000, "smallest": 1_000}
BATCH = 10_000
TARGET = 10_000_000


def url(i: int) -> str:
    return f"https://shop{i % 997}.example.com/catalogue/product/{i}?ref=list"


def payload(i: int) -> str:
    # What the frontier stores for a product page of the demo spider.
    return ('{"url":"%s","callback":"parse_product","headers":{"Referer":'
            '["https://shop%d.example.com/catalogue/list/%d"]},"meta":{"depth":2},'
            '"v":1,"dont_filter":true}' % (url(i), i % 997, i // 50))


def packed(i: int) -> bytes:
    etag = b'"%020x"' % (i * 2654435761 % (1 << 80))
    head = struct.pack("<IQfHH", 1_767_225_600 + i % 86400, i, 3600.0, 3, 1)
    return bytes([len(etag)]) + etag + head + payload(i).encode()


def fp8(i: int) -> bytes:
    return hashlib.sha1(url(i).encode()).digest()[:8]


def redis_bytes(pages: int) -> dict:
    with BenchRedis() as redis:
        client = redis.client
        before = int(client.info("memory")["used_memory"])
        t0 = time.monotonic()
        for start in range(0, pages, BATCH):
            pipe = client.pipeline(transaction=False)
            mapping = {fp8(i): packed(i) for i in range(start, min(pages, start + BATCH))}
            pipe.hset("{bench}:pages", mapping=mapping)
            pipe.zadd("{bench}:due", {k: 1_767_225_600 + n for n, k in enumerate(mapping)})
            pipe.execute()
        used = int(client.info("memory")["used_memory"]) - before
        return {"pages": pages, "bytes": used, "bytes_per_page": used / pages,
                "seconds": time.monotonic() - t0,
                "record_bytes": sum(len(packed(i)) for i in range(1000)) / 1000,
                "at_10M_gb": used / pages * TARGET / 2**30}


def page_document(i: int, now: datetime) -> dict:
    rule = RevisitRule(pattern="", interval=3600)
    record = visit_record(url(i), rule, PageState(interval=3600), "unchanged", status=304,
                          now=now, payload=payload(i), etag='"%020x"' % i,
                          last_modified="Thu, 01 Jan 2026 00:00:00 GMT",
                          body=hashlib.sha1(url(i).encode()).hexdigest(),
                          items=[["products", "url", url(i)]])
    record["last_changed"] = now
    op = WriteOp.build("bench", "products_pages", "url", item_fields(record), seen=now)
    return insert_document(op)


def mongo_bytes(pages: int) -> dict:
    from devtools.services import MongoServer

    directory = Path(tempfile.mkdtemp(prefix="bench-mongo-"))
    server = MongoServer(storage_path=directory / "data")
    server.start()
    try:
        client = pymongo.MongoClient(server.uri)
        coll = client.bench.products_pages
        coll.create_index("next_visit")
        base = _du(directory)
        now = datetime.now(timezone.utc)
        t0 = time.monotonic()
        bson_total = 0
        import bson
        for start in range(0, pages, 1000):
            docs = [page_document(i, now) for i in range(start, min(pages, start + 1000))]
            bson_total += sum(len(bson.encode(d)) for d in docs)
            coll.insert_many(docs, ordered=False)
        client.close()
    finally:
        server.stop()  # flushes its files
    disk = _du(directory) - base
    shutil.rmtree(directory, ignore_errors=True)
    return {"pages": pages, "bson_bytes_per_page": bson_total / pages,
            "disk_bytes_per_page": disk / pages, "seconds": time.monotonic() - t0,
            "disk_at_10M_gb": disk / pages * TARGET / 2**30}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and f.suffix != ".log")


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=None, help="pages kept in Redis")
    parser.add_argument("--mongo-pages", type=int, default=None, help="documents in MongoDB")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    t0 = time.monotonic()
    r = redis_bytes(args.pages or PAGES[mode])
    m = mongo_bytes(args.mongo_pages or MONGO_PAGES[mode])
    data = {"mode": mode, "redis": r, "mongo": m,
            "redis_ram_per_page_vs_mongo_disk": ratio(r["bytes_per_page"],
                                                      m["disk_bytes_per_page"]),
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    r, m = data["redis"], data["mongo"]
    return table(["where", "pages measured", "bytes per page", "at 10M pages", "kind of memory"],
                 [["Redis: hash fp→packed record + zset fp→due", r["pages"], r["bytes_per_page"],
                   f"{r['at_10M_gb']:.2f} GiB", "RAM (all of it, on the frontier's Redis)"],
                  ["MongoDB: one document per page (BSON)", m["pages"],
                   m["bson_bytes_per_page"], f"{m['bson_bytes_per_page'] * TARGET / 2**30:.2f} GiB",
                   "document size before compression"],
                  ["MongoDB: storage files (WiredTiger, + indexes)", m["pages"],
                   m["disk_bytes_per_page"], f"{m['disk_at_10M_gb']:.2f} GiB",
                   "disk; RAM only for the working set"]])


if __name__ == "__main__":
    main()
