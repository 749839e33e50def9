"""MongoPipeline at the pipeline level, against a real MongoDB-wire server.

Idempotence (same items twice, changed items, two pipelines writing the same
keys at once), the content hash, ordering of stale writes, the spool during
an outage (server stopped and started again), replay at the next start by
another process after a SIGKILL, error handling and stats.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pymongo
import pytest
from bson.decimal128 import Decimal128
from scrapy import Spider, signals
from scrapy.exceptions import CloseSpider, DontCloseSpider, DropItem, NotConfigured
from scrapy.utils.test import get_crawler
from twisted.python.failure import Failure

from crawlproject.node import node_id
from crawlproject.items import ProductItem
from crawlproject.pipelines.documents import WriteOp
from crawlproject.pipelines.mongo import MongoPipeline
from devtools.services import MongoServer

ROOT = Path(__file__).resolve().parents[1]


class ShopSpider(Spider):
    name = "shop"


def make_pipeline(uri: str, database: str, spool_dir, **settings):
    """A MongoPipeline (and its crawler) built from settings, as Scrapy does.

    The Redis handoff is off unless a test turns it on (with its own Redis):
    nothing here may reach a Redis on the default port."""
    crawler = get_crawler(ShopSpider, {
        "MONGO_URI": uri, "MONGO_DATABASE": database, "MONGO_SPOOL_DIR": str(spool_dir),
        "MONGO_SPOOL_HANDOFF": False, **settings})
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return MongoPipeline.from_crawler(crawler), crawler.stats


def product(i: int, **changes) -> ProductItem:
    values = dict(url=f"http://shop.example/product/{i}", title=f"Product {i}",
                  price=Decimal("10.50") + i, currency="EUR",
                  published=datetime(2024, 1, 1, tzinfo=timezone.utc) + timedelta(days=i),
                  related=[f"http://shop.example/product/{i + 1}"], rendered=False)
    values.update(changes)
    return ProductItem(**values)


async def store(pipeline, items):
    await pipeline.open_spider()
    try:
        return await asyncio.gather(*(pipeline.process_item(item) for item in items),
                                    return_exceptions=True)
    finally:
        await pipeline.close_spider()


def docs(collection) -> dict[str, dict]:
    found = list(collection.find({}))
    urls = [d["url"] for d in found]
    assert len(urls) == len(set(urls)), "a key is stored twice"
    return {d["url"]: d for d in found}


@pytest.fixture
def db(mongo_uri):
    client = pymongo.MongoClient(mongo_uri, tz_aware=True)
    name = f"pipe_{uuid.uuid4().hex[:10]}"
    yield client[name]
    client.drop_database(name)
    client.close()


# ----------------------------------------------------------------------------- storage


@pytest.mark.parametrize("mode", ["auto", "upsert"])
def test_items_are_stored_once_with_clean_bson_values(mongo_uri, db, tmp_path, mode):
    pipeline, stats = make_pipeline(mongo_uri, db.name, tmp_path, MONGO_WRITE_MODE=mode)
    items = [product(i) for i in range(120)]
    results = asyncio.run(store(pipeline, items))
    assert results == items
    stored = docs(db["shop"])
    assert len(stored) == 120
    doc = stored["http://shop.example/product/3"]
    assert doc["_id"] == doc["url"]
    assert doc["price"] == Decimal128("13.50")
    assert doc["currency"] == "EUR" and doc["title"] == "Product 3"
    assert doc["published"] == datetime(2024, 1, 4, tzinfo=timezone.utc)
    assert doc["first_seen"] == doc["updated_at"]
    assert len(doc["content_hash"]) == 40
    assert stats.get_value("mongo/items") == 120
    assert stats.get_value("mongo/upserted") == 120
    assert not stats.get_value("mongo/spooled")


def test_unchanged_items_are_not_rewritten_and_changes_are(mongo_uri, db, tmp_path):
    first, _ = make_pipeline(mongo_uri, db.name, tmp_path)
    asyncio.run(store(first, [product(i) for i in range(50)]))
    before = docs(db["shop"])
    time.sleep(0.01)
    second, stats = make_pipeline(mongo_uri, db.name, tmp_path)
    changed = {5, 17}
    items = [product(i, title=f"New title {i}") if i in changed else product(i) for i in range(50)]
    asyncio.run(store(second, items))
    after = docs(db["shop"])
    assert len(after) == 50
    assert stats.get_value("mongo/modified") == 2
    assert stats.get_value("mongo/unchanged") == 48
    assert not stats.get_value("mongo/upserted")
    for url, doc in after.items():
        old = before[url]
        assert doc["first_seen"] == old["first_seen"]
        assert doc["_id"] == old["_id"]
        if url.endswith(("/5", "/17")):
            assert doc["title"].startswith("New title")
            assert doc["updated_at"] > old["updated_at"]
            assert doc["content_hash"] != old["content_hash"]
        else:
            assert doc == old  # not rewritten at all


@pytest.mark.parametrize("mode,key_as_id", [("auto", True), ("upsert", True), ("auto", False)])
def test_two_pipelines_writing_the_same_keys_at_once_make_one_document_each(
        mongo_uri, db, tmp_path, mode, key_as_id):
    settings = {"MONGO_WRITE_MODE": mode, "MONGO_KEY_AS_ID": key_as_id, "MONGO_BULK_SIZE": 40}
    a, stats_a = make_pipeline(mongo_uri, db.name, tmp_path / "a", **settings)
    b, stats_b = make_pipeline(mongo_uri, db.name, tmp_path / "b", **settings)
    items = [product(i) for i in range(300)]

    async def both():
        return await asyncio.gather(store(a, items), store(b, list(reversed(items))))

    results_a, results_b = asyncio.run(both())
    assert results_a == items and results_b == list(reversed(items))
    stored = docs(db["shop"])
    assert len(stored) == 300 and db["shop"].count_documents({}) == 300
    total = {k: (stats_a.get_value(f"mongo/{k}") or 0) + (stats_b.get_value(f"mongo/{k}") or 0)
             for k in ("upserted", "modified", "unchanged", "failed")}
    assert total["upserted"] == 300, total  # each key inserted exactly once
    assert total["unchanged"] == 300, total  # the other write changed nothing
    assert total["modified"] == 0 and total["failed"] == 0, total
    if not key_as_id:
        index = db["shop"].index_information()["url_1"]
        assert index["unique"] is True


def test_a_stale_version_never_overwrites_a_newer_one(mongo_uri, db, tmp_path):
    pipeline, stats = make_pipeline(mongo_uri, db.name, tmp_path)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    base = {"url": "http://shop.example/p", "title": "old"}
    newer = WriteOp.build(db.name, "shop", "url", {**base, "title": "new"}, seen=now)
    older = WriteOp.build(db.name, "shop", "url", {**base, "title": "old"},
                          seen=now - timedelta(minutes=5))

    async def run():
        await pipeline.open_spider()
        try:
            for op in (newer, older):  # e.g. a late replay of a spooled version
                outcome = await pipeline.writer.write([op], budget=2, mode="upsert")
                assert not outcome.failed and not outcome.unavailable
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    (doc,) = db["shop"].find({})
    assert doc["title"] == "new" and doc["updated_at"] == now
    assert doc["first_seen"] == now
    assert stats.get_value("mongo/unchanged") == 1


def test_values_that_look_like_operators_are_stored_literally(mongo_uri, db, tmp_path):
    pipeline, _ = make_pipeline(mongo_uri, db.name, tmp_path, MONGO_WRITE_MODE="upsert")
    asyncio.run(store(pipeline, [product(1, title="$title", description="$$ROOT")]))
    (doc,) = db["shop"].find({})
    assert doc["title"] == "$title" and doc["description"] == "$$ROOT"


def test_items_without_a_key_or_not_storable_are_dropped_not_crashing(mongo_uri, db, tmp_path):
    pipeline, stats = make_pipeline(mongo_uri, db.name, tmp_path)
    huge = product(2, description="x" * (17 * 1024 * 1024))  # over MongoDB's 16 MB
    results = asyncio.run(store(pipeline, [product(1, url=None), huge, product(3),
                                           product(4, title=object())]))
    assert isinstance(results[0], DropItem) and "'url'" in str(results[0])
    assert isinstance(results[1], DropItem) and "refused" in str(results[1])
    assert results[2] is not None and not isinstance(results[2], Exception)
    assert isinstance(results[3], DropItem) and "BSON" in str(results[3])
    assert set(docs(db["shop"])) == {"http://shop.example/product/3"}
    assert stats.get_value("mongo/dropped/no_key") == 1
    assert stats.get_value("mongo/dropped/unencodable") == 1
    assert stats.get_value("mongo/failed") == 1


@dataclass
class ReviewItem:
    """A dataclass item with its own key and collection."""

    mongo_key = "review_id"
    mongo_collection = "%(spider)s_reviews"

    review_id: str | None = None
    rating: int | None = None
    tags: list = field(default_factory=list)


def test_dataclass_items_use_their_own_key_and_collection(mongo_uri, db, tmp_path):
    pipeline, _ = make_pipeline(mongo_uri, db.name, tmp_path)
    reviews = [ReviewItem(review_id=f"r{i}", rating=i % 5 + 1, tags=["a"]) for i in range(10)]
    asyncio.run(store(pipeline, reviews + [product(1)]))
    assert db["shop_reviews"].count_documents({}) == 10
    assert db["shop_reviews"].find_one({"_id": "r3"})["rating"] == 4
    assert db["shop"].count_documents({}) == 1


def test_disabled_pipeline_is_not_configured(mongo_uri, tmp_path):
    with pytest.raises(NotConfigured):
        make_pipeline(mongo_uri, "x", tmp_path, MONGO_PIPELINE_ENABLED=False)


def test_process_item_waits_for_the_flush_and_batches_form(mongo_uri, db, tmp_path):
    """Items submitted together are written in few bulk writes, and none of
    them is reported done before MongoDB acknowledged it."""
    pipeline, stats = make_pipeline(mongo_uri, db.name, tmp_path, MONGO_BULK_SIZE=100,
                                    MONGO_FLUSH_WHEN_IDLE=False, MONGO_FLUSH_INTERVAL=0.3)
    seen_stored = []

    async def run():
        await pipeline.open_spider()
        try:
            async def one(item):
                await pipeline.process_item(item)
                seen_stored.append(db["shop"].count_documents({"url": item["url"]}))
            started = time.monotonic()
            await asyncio.gather(*(one(product(i)) for i in range(250)))
            return time.monotonic() - started
        finally:
            await pipeline.close_spider()

    elapsed = asyncio.run(run())
    assert seen_stored == [1] * 250
    assert stats.get_value("mongo/batches") == 3  # 100 + 100 by size, 50 by age
    assert elapsed >= 0.25


# ----------------------------------------------------------------------------- outages


@pytest.fixture
def own_mongo(tmp_path):
    """A dedicated server this test may stop and start."""
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    yield server
    server.stop()


def spool_files(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.rglob("*.jsonl"))


def test_outage_spools_then_replays_without_loss_or_duplicates(own_mongo, tmp_path):
    spool_dir = tmp_path / "spool"
    pipeline, stats = make_pipeline(own_mongo.uri, "outage", spool_dir, MONGO_SPOOL_AFTER=1.0,
                                    MONGO_PROBE_INTERVAL=0.2, MONGO_BULK_SIZE=50)
    timings = {}

    async def run():
        await pipeline.open_spider()
        try:
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(100)))
            own_mongo.stop()
            started = time.monotonic()
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(80, 200)))
            timings["first"] = time.monotonic() - started
            retries_before = stats.get_value("mongo/retries", 0)
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(200, 300)))
            timings["later_retries"] = stats.get_value("mongo/retries", 0) - retries_before
            timings["files_during"] = len(spool_files(spool_dir))
            own_mongo.start()
            # the outage ends once the spool is replayed: its files go first, then
            # the pipeline leaves the outage (items sent in between are spooled)
            deadline = time.monotonic() + 20
            while ((spool_files(spool_dir) or pipeline.outage.active)
                   and time.monotonic() < deadline):
                await asyncio.sleep(0.1)
            await asyncio.gather(*(pipeline.process_item(product(i, title="changed"))
                                   for i in range(290, 310)))
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    assert timings["first"] >= 0.9, timings      # retried for MONGO_SPOOL_AFTER, then spooled
    # During the outage later items go straight to the spool: no write attempt.
    assert timings["later_retries"] == 0, timings
    assert timings["files_during"] >= 1
    assert spool_files(spool_dir) == []
    assert stats.get_value("mongo/spooled") == 220
    assert stats.get_value("mongo/replayed") == 220
    assert stats.get_value("mongo/outages") == 1
    client = pymongo.MongoClient(own_mongo.uri)
    try:
        stored = docs(client["outage"]["shop"])
    finally:
        client.close()
    assert len(stored) == 310
    assert stored["http://shop.example/product/295"]["title"] == "changed"
    assert stored["http://shop.example/product/150"]["title"] == "Product 150"


def test_close_during_outage_keeps_the_spool_for_the_next_start(own_mongo, tmp_path):
    spool_dir = tmp_path / "spool"
    first, stats = make_pipeline(own_mongo.uri, "later", spool_dir, MONGO_SPOOL_AFTER=0.5)

    async def during_outage():
        await first.open_spider()
        own_mongo.stop()
        try:
            await asyncio.gather(*(first.process_item(product(i)) for i in range(40)))
        finally:
            await first.close_spider()

    asyncio.run(during_outage())
    assert stats.get_value("mongo/spooled") == 40
    assert stats.get_value("mongo/spool_left") == 1
    assert len(spool_files(spool_dir)) == 1
    own_mongo.start()
    second, stats2 = make_pipeline(own_mongo.uri, "later", spool_dir)
    asyncio.run(store(second, []))
    assert stats2.get_value("mongo/replayed") == 40
    assert spool_files(spool_dir) == []
    client = pymongo.MongoClient(own_mongo.uri)
    try:
        assert len(docs(client["later"]["shop"])) == 40
    finally:
        client.close()


CHILD = textwrap.dedent("""
    import asyncio, sys
    from tests.test_pipeline_mongo import make_pipeline, product

    async def main(uri, spool_dir):
        pipeline, stats = make_pipeline(uri, "killed", spool_dir, MONGO_SPOOL_AFTER=0.5)
        await pipeline.open_spider()
        print("opened", flush=True)
        sys.stdin.readline()  # the parent stops MongoDB, then says go
        await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(60)))
        print("spooled", stats.get_value("mongo/spooled"), flush=True)
        await asyncio.sleep(3600)  # killed here, the spool never replayed

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def test_spool_of_a_sigkilled_process_is_replayed_by_the_next_one(own_mongo, tmp_path):
    spool_dir = tmp_path / "spool"
    child = subprocess.Popen([sys.executable, "-c", CHILD, own_mongo.uri, str(spool_dir)],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened"
        own_mongo.stop()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().split() == ["spooled", "60"]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    (segment,) = spool_files(spool_dir)
    assert len(segment.read_text().splitlines()) == 60
    own_mongo.start()
    pipeline, stats = make_pipeline(own_mongo.uri, "killed", spool_dir)
    asyncio.run(store(pipeline, [product(i) for i in range(50, 70)]))
    assert stats.get_value("mongo/replayed") == 60
    assert spool_files(spool_dir) == []
    assert not list(spool_dir.rglob("*.lock"))
    client = pymongo.MongoClient(own_mongo.uri)
    try:
        stored = docs(client["killed"]["shop"])
    finally:
        client.close()
    assert len(stored) == 70


def test_mongo_unreachable_at_open_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pipeline, _ = make_pipeline(f"mongodb://127.0.0.1:{port}/", "x", tmp_path,
                                MONGO_CLIENT_OPTIONS=json.dumps({"serverSelectionTimeoutMS": 300}))
    with pytest.raises(RuntimeError, match=r"MongoDB at mongodb://127\.0\.0\.1:\d+/ .* not usable"):
        asyncio.run(pipeline.open_spider())
    asyncio.run(pipeline.close_spider())


# ----------------------------------------------------------------------------- injected errors


class FailpointMongo(MongoServer):
    """A MongoDB-wire server that accepts ``configureFailPoint`` (test commands)."""

    def command(self) -> list[str]:
        return super().command() + ["--enable-test-commands"]


@pytest.fixture(scope="module")
def failpoint_mongo(tmp_path_factory):
    server = FailpointMongo(storage_path=tmp_path_factory.mktemp("failpoint-mongo"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fail_with(failpoint_mongo):
    """Arm ``failCommand`` for the pipeline's connections (appname crawlproject)."""
    client = pymongo.MongoClient(failpoint_mongo.uri)

    def arm(mode, **data):
        client.admin.command("configureFailPoint", "failCommand", mode=mode,
                             data={"failCommands": ["insert", "update"],
                                   "appName": "crawlproject", **data})

    yield arm
    client.admin.command("configureFailPoint", "failCommand", mode="off")
    client.close()


def stored_count(server, database: str) -> int:
    client = pymongo.MongoClient(server.uri)
    try:
        return len(docs(client[database]["shop"]))
    finally:
        client.drop_database(database)
        client.close()


@pytest.mark.parametrize("data", [
    {"errorCode": 10107},                       # NotWritablePrimary
    {"errorCode": 91},                          # ShutdownInProgress
    {"closeConnection": True},                  # connection lost
    {"errorCode": 1, "errorLabels": ["RetryableWriteError"]},
], ids=["not-primary", "shutdown", "connection-lost", "retryable-label"])
def test_transient_errors_are_retried_with_backoff(failpoint_mongo, fail_with, tmp_path, data):
    database = f"retry_{uuid.uuid4().hex[:8]}"
    pipeline, stats = make_pipeline(failpoint_mongo.uri, database, tmp_path, MONGO_BULK_SIZE=50)

    async def run():
        await pipeline.open_spider()
        try:
            fail_with({"times": 5}, **data)
            return await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(100)),
                                        return_exceptions=True)
        finally:
            await pipeline.close_spider()

    results = asyncio.run(run())
    assert not [r for r in results if isinstance(r, Exception)]
    assert stats.get_value("mongo/retries") >= 1
    assert not stats.get_value("mongo/spooled") and not stats.get_value("mongo/failed")
    assert stored_count(failpoint_mongo, database) == 100


def test_write_concern_errors_are_written_again_idempotently(failpoint_mongo, fail_with, tmp_path):
    database = f"wce_{uuid.uuid4().hex[:8]}"
    pipeline, stats = make_pipeline(failpoint_mongo.uri, database, tmp_path)

    async def run():
        await pipeline.open_spider()
        try:
            fail_with({"times": 1}, writeConcernError={
                "code": 64, "codeName": "WriteConcernFailed", "errmsg": "replication timed out"})
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(30)))
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    assert not stats.get_value("mongo/failed")
    assert stored_count(failpoint_mongo, database) == 30


def test_a_batch_level_refusal_does_not_drop_the_good_items(failpoint_mongo, fail_with, tmp_path):
    database = f"iso_{uuid.uuid4().hex[:8]}"
    pipeline, stats = make_pipeline(failpoint_mongo.uri, database, tmp_path)

    async def run():
        await pipeline.open_spider()
        try:
            fail_with({"times": 1}, errorCode=2)  # BadValue on the whole insert_many
            return await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(30)),
                                        return_exceptions=True)
        finally:
            await pipeline.close_spider()

    results = asyncio.run(run())
    assert not [r for r in results if isinstance(r, Exception)]
    assert not stats.get_value("mongo/failed")
    assert stored_count(failpoint_mongo, database) == 30


def test_permanent_refusals_drop_items_with_a_reason_and_the_crawl_goes_on(
        failpoint_mongo, fail_with, tmp_path):
    database = f"perm_{uuid.uuid4().hex[:8]}"
    pipeline, stats = make_pipeline(failpoint_mongo.uri, database, tmp_path)

    async def run():
        await pipeline.open_spider()
        try:
            fail_with("alwaysOn", errorCode=2)
            refused = await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(5)),
                                           return_exceptions=True)
            fail_with("off")
            stored = await asyncio.gather(*(pipeline.process_item(product(i))
                                            for i in range(5, 10)))
            return refused, stored
        finally:
            await pipeline.close_spider()

    refused, stored = asyncio.run(run())
    assert all(isinstance(r, DropItem) and "MongoDB refused url=" in str(r) for r in refused)
    assert len(stored) == 5
    assert stats.get_value("mongo/failed") == 5 and stats.get_value("mongo/failed/2") == 5
    assert stored_count(failpoint_mongo, database) == 5


def test_one_collection_per_item_type(mongo_uri, db, tmp_path):
    pipeline, _ = make_pipeline(mongo_uri, db.name, tmp_path, MONGO_COLLECTION="%(item)s")
    asyncio.run(store(pipeline, [product(1), product(2)]))
    assert db.list_collection_names() == ["productitem"]
    assert db["productitem"].count_documents({}) == 2


# ----------------------------------------------------------------------------- environment


def test_a_project_without_mongo_settings_uses_the_environment(mongo_uri, db, redis_url,
                                                               tmp_path, monkeypatch):
    """A user's own project sets nothing: MONGO_URI, MONGO_DATABASE and
    MONGO_SPOOL_DIR come from the environment (as the README promises), and
    the spool is named after the node's one id."""
    monkeypatch.setenv("MONGO_URI", mongo_uri)
    monkeypatch.setenv("MONGO_DATABASE", db.name)
    monkeypatch.setenv("MONGO_SPOOL_DIR", str(tmp_path / "env-spool"))
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("NODE_ID", "env node/1")
    crawler = get_crawler(ShopSpider)
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    pipeline = MongoPipeline.from_crawler(crawler)

    async def run():
        await pipeline.open_spider()
        try:
            assert pipeline.spool.directory.parent == tmp_path / "env-spool"
            assert pipeline.spool.owner == node_id(crawler)
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(5)))
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    assert node_id(crawler).startswith("env_node_1-")
    assert len(docs(db["shop"])) == 5


def test_a_setting_wins_over_the_environment(mongo_uri, db, tmp_path, monkeypatch):
    monkeypatch.setenv("MONGO_DATABASE", "not_this_one")
    monkeypatch.setenv("MONGO_SPOOL_DIR", str(tmp_path / "not-this-one"))
    pipeline, _ = make_pipeline(mongo_uri, db.name, tmp_path / "spool")
    asyncio.run(store(pipeline, [product(1)]))
    assert len(docs(db["shop"])) == 1
    assert pipeline.spool.directory.parent == tmp_path / "spool"


# ----------------------------------------------------------------------------- closing


def send_idle(crawler):
    """Fire spider_idle as the engine does; the exceptions handlers raised."""
    results = crawler.signals.send_catch_log(signals.spider_idle, spider=crawler.spider,
                                             dont_log=(DontCloseSpider, CloseSpider))
    return [r.value for _, r in results if isinstance(r, Failure)]


def test_idle_close_is_held_while_mongodb_is_down_then_given_up(own_mongo, tmp_path):
    pipeline, stats = make_pipeline(own_mongo.uri, "held", tmp_path / "spool",
                                    MONGO_SPOOL_AFTER=0.5, MONGO_CLOSE_WAIT=30)
    crawler = pipeline.crawler
    now = [1000.0]
    pipeline.clock = lambda: now[0]

    async def run():
        await pipeline.open_spider()
        try:
            assert send_idle(crawler) == []           # nothing spooled: close at will
            own_mongo.stop()
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(10)))
            assert stats.get_value("mongo/spooled") == 10
            (held,) = send_idle(crawler)
            assert isinstance(held, DontCloseSpider)
            now[0] += 29
            assert [type(e) for e in send_idle(crawler)] == [DontCloseSpider]
            now[0] += 2                               # MONGO_CLOSE_WAIT is over
            (given_up,) = send_idle(crawler)
            assert isinstance(given_up, CloseSpider) and given_up.reason == "mongo_unavailable"
        finally:
            await pipeline.close_spider()

    asyncio.run(run())


def test_no_close_wait_closes_at_once_with_a_distinct_reason(own_mongo, tmp_path):
    pipeline, _ = make_pipeline(own_mongo.uri, "nowait", tmp_path / "spool",
                                MONGO_SPOOL_AFTER=0.5, MONGO_CLOSE_WAIT=0)

    async def run():
        await pipeline.open_spider()
        try:
            own_mongo.stop()
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(3)))
            (given_up,) = send_idle(pipeline.crawler)
            assert isinstance(given_up, CloseSpider) and given_up.reason == "mongo_unavailable"
        finally:
            await pipeline.close_spider()

    asyncio.run(run())


def test_mongodb_back_during_the_wait_lets_the_node_close_normally(own_mongo, tmp_path):
    pipeline, stats = make_pipeline(own_mongo.uri, "back", tmp_path / "spool",
                                    MONGO_SPOOL_AFTER=0.5, MONGO_PROBE_INTERVAL=0.2,
                                    MONGO_CLOSE_WAIT=300)

    async def run():
        await pipeline.open_spider()
        try:
            own_mongo.stop()
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(20)))
            assert [type(e) for e in send_idle(pipeline.crawler)] == [DontCloseSpider]
            own_mongo.start()
            deadline = time.monotonic() + 60
            while send_idle(pipeline.crawler) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert send_idle(pipeline.crawler) == []
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    assert stats.get_value("mongo/replayed") == 20
    assert not stats.get_value("mongo/spool_left_items")
    assert spool_files(tmp_path / "spool") == []


def test_items_left_at_close_are_reported_once_with_their_count_and_path(own_mongo, tmp_path,
                                                                         caplog):
    spool_dir = tmp_path / "spool"
    pipeline, stats = make_pipeline(own_mongo.uri, "left", spool_dir, MONGO_SPOOL_AFTER=0.5,
                                    MONGO_BULK_SIZE=10)

    async def run():
        await pipeline.open_spider()
        own_mongo.stop()
        try:
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(35)))
            caplog.clear()
        finally:
            await pipeline.close_spider()

    with caplog.at_level("INFO"):
        asyncio.run(run())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "35 items" in errors[0] and str(pipeline.spool.directory) in errors[0]
    assert "spool-replay" in errors[0]
    assert stats.get_value("mongo/spool_left_items") == 35
    assert stats.get_value("mongo/spool_left") == len(spool_files(spool_dir)) >= 1
