"""The storage guarantees in real crawls (``scrapy crawl`` nodes, Redis, the
demo site, a MongoDB-wire server):

* a page crawled twice, and the same items stored by two nodes at once, are
  one document each (and the second write changes nothing);
* MongoDB stopped mid-crawl: the crawl goes on through the spool, then
  every item is in MongoDB exactly once and the spool is empty;
* MongoDB still down when the crawl runs out of pages: the node does not
  close while ``MONGO_CLOSE_WAIT`` lasts, and finishes normally once MongoDB
  is back; or, with a short wait, it closes with ``mongo_unavailable``,
  hands its spool to Redis, and another node stores every item;
* a node SIGKILLed while its items are still in the pipeline's memory
  buffer: those items were never acknowledged, so the other node crawls and
  stores them.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import pymongo
import pytest

from devtools.demo.site import DemoSite, expected_items
from crawlproject.keys import FrontierKeys, start_urls_key
from crawlproject.pipelines.spool import target_dir
from devtools.services import MongoServer
from tests.crawl_helpers import Node, assert_matches_catalog, node_env, stored_products

pytestmark = pytest.mark.slow


@pytest.fixture
def database(mongo_uri):
    name = f"store_{uuid.uuid4().hex[:8]}"
    client = pymongo.MongoClient(mongo_uri, tz_aware=True)
    yield client[name]
    client.drop_database(name)
    client.close()


def run_nodes(*nodes: Node, timeout: float = 240) -> list[int]:
    try:
        return [node.wait(timeout) for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def spool_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.jsonl"))


def spooled_lines(path: Path) -> int:
    """Complete lines in the spool files under *path* (items spooled so far)."""
    total = 0
    for file in spool_files(path):
        try:
            total += file.read_bytes().count(b"\n")
        except FileNotFoundError:  # replayed and deleted meanwhile
            pass
    return total


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_page_crawled_twice_is_one_unchanged_document(redis, redis_url, mongo_uri, database,
                                                        tmp_path):
    products = 30
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "MONGO_SPOOL_DIR": tmp_path / "spool"}
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=products) as site:
        runs = []
        for run in ("first", "second"):
            redis.flushall()  # a fresh frontier: every page is fetched again
            node = Node(run, tmp_path, env, settings=settings)
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("products"), site.url)
            assert run_nodes(node) == [0], node.tail()
            runs.append((node, stored_products(database["products"])))
    (first, before), (second, after) = runs
    expected = expected_items(site.url, products)
    assert_matches_catalog(after, expected)
    assert first.stat("mongo/upserted") == products
    assert second.stat("item_scraped_count") == products
    assert second.stat("mongo/unchanged") == products
    assert second.stat("mongo/upserted") == second.stat("mongo/modified") == 0
    assert after == before  # not rewritten: same first_seen, updated_at, hash


def test_two_nodes_storing_the_same_items_at_once_make_one_document(redis, redis_url, mongo_uri,
                                                                    database, tmp_path):
    """Two independent crawls (separate Redis databases, so separate frontiers)
    of the same site into the same collection, at the same time."""
    products = 60
    other_db_url = redis_url.rsplit("/", 1)[0] + "/1"
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "MONGO_SPOOL_DIR": tmp_path / "spool"}
    with DemoSite(products=products, latency_ms=5, faults=False) as site:
        nodes = [Node("a", tmp_path, node_env(redis_url, mongo_uri, database.name),
                      settings=settings),
                 Node("b", tmp_path, node_env(other_db_url, mongo_uri, database.name),
                      settings=settings)]
        for node in nodes:
            node.wait_for_log("Reading seeds from")
        for url in (redis_url, other_db_url):
            client = type(redis).from_url(url)
            client.lpush(start_urls_key("products"), site.url)
            client.close()
        assert run_nodes(*nodes) == [0, 0], [n.tail() for n in nodes]
        served = site.stats()
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(site.url, products))
    assert all(served[f"/product/{pid}"] == 2 for pid in range(1, products + 1))
    total = {key: sum(n.stat(f"mongo/{key}") for n in nodes)
             for key in ("upserted", "unchanged", "modified", "failed")}
    assert total == {"upserted": products, "unchanged": products, "modified": 0, "failed": 0}
    assert not [e for n in nodes for e in n.errors()]


def test_mongodb_outage_mid_crawl_spools_and_loses_nothing(redis, redis_url, tmp_path):
    products = 300
    spool = tmp_path / "spool"
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    client = pymongo.MongoClient(server.uri, tz_aware=True, serverSelectionTimeoutMS=20_000)
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 2,
                "MONGO_SPOOL_DIR": spool, "MONGO_SPOOL_AFTER": 2, "MONGO_PROBE_INTERVAL": 0.5}
    try:
        with DemoSite(products=products, latency_ms=200) as site:
            node = Node("outage", tmp_path, node_env(redis_url, server.uri, "outage"),
                        settings=settings)
            try:
                node.wait_for_log("Reading seeds from")
                redis.lpush(start_urls_key("products"), site.url)
                deadline = time.monotonic() + 60
                while (client["outage"]["products"].count_documents({}) < 15
                       and time.monotonic() < deadline):
                    time.sleep(0.1)
                server.stop()
                fetched_before = sum(site.stats().values())
                # Wait for the outage to be visible in what the node did: pages
                # still fetched, items in the spool (however slow the machine).
                deadline = time.monotonic() + 180
                while True:
                    fetched_during = sum(site.stats().values()) - fetched_before
                    files_during = spool_files(spool)
                    if ((fetched_during >= 60 and spooled_lines(spool) >= 40)
                            or time.monotonic() > deadline):
                        break
                    assert node.proc.poll() is None, "the crawl ended during the outage"
                    time.sleep(0.2)
                assert node.proc.poll() is None, "the crawl ended during the outage"
                server.start()
                assert node.wait(240) == 0, node.tail()
            finally:
                node.stop()
        stored = stored_products(client["outage"]["products"])
    finally:
        client.close()
        server.stop()
    assert fetched_during >= 60, "the crawl did not go on while MongoDB was down"
    assert files_during, "nothing was spooled during the outage"
    assert_matches_catalog(stored, expected_items(site.url, products))
    spooled = node.stat("mongo/spooled")
    assert spooled >= 40
    assert node.stat("mongo/replayed") == spooled
    assert node.stat("mongo/outages") == 1
    assert spool_files(spool) == [] and not list(spool.rglob("*.corrupt"))
    assert "MongoDB answers again" in node.text()


def test_items_in_memory_of_a_sigkilled_node_are_stored_by_the_other(redis, redis_url, mongo_uri,
                                                                      database, tmp_path):
    products = 120
    marks = tmp_path / "victim-items.txt"
    common = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4,
              "SCHEDULER_LEASE_TTL": 4, "SPIDER_MODULES": "crawlproject.spiders,tests.spiders",
              "MONGO_SPOOL_DIR": tmp_path / "spool"}
    # The victim keeps every item in its memory buffer (no flush by age or
    # size, not even when idle): exactly the state a crash can catch.
    victim_settings = {**common, "ITEM_MARK_FILE": marks, "MONGO_FLUSH_INTERVAL": 3600,
                       "MONGO_BULK_SIZE": 100_000, "MONGO_FLUSH_WHEN_IDLE": False}
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=products, latency_ms=100) as site:
        victim = Node("victim", tmp_path, env, spider="marking", settings=victim_settings)
        survivor = Node("survivor", tmp_path, env, spider="marking", settings=common)
        try:
            for node in (victim, survivor):
                node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("marking"), site.url)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if marks.exists() and len(marks.read_text().splitlines()) >= 10:
                    break
                time.sleep(0.05)
            victim.kill()
            in_memory = set(marks.read_text().splitlines())
            assert len(in_memory) >= 10
            # Not stored by anyone at the moment of the kill: only in the victim's buffer.
            assert database["marking"].count_documents({"url": {"$in": sorted(in_memory)}}) == 0
            assert survivor.wait(240) == 0, survivor.tail()
        finally:
            victim.stop()
            survivor.stop()
    stored = stored_products(database["marking"])
    assert_matches_catalog(stored, expected_items(site.url, products))
    assert in_memory <= set(stored)
    assert survivor.stat("scheduler/reclaimed") >= 1


def crawl_until_mongodb_stops(redis, redis_url, tmp_path, server, client, database, settings,
                              products):
    """Start a node on the demo site; stop MongoDB once a few items are stored."""
    site = DemoSite(products=products, latency_ms=150)
    site.start()
    node = Node("holder", tmp_path, node_env(redis_url, server.uri, database), settings=settings)
    node.wait_for_log("Reading seeds from")
    redis.lpush(start_urls_key("products"), site.url)
    wait_until(lambda: client[database]["products"].count_documents({}) >= 10, 60,
               "the first items in MongoDB")
    server.stop()
    return site, node


def test_a_node_waits_for_mongodb_before_closing_then_finishes(redis, redis_url, tmp_path):
    products = 100
    spool = tmp_path / "spool"
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    client = pymongo.MongoClient(server.uri, tz_aware=True, serverSelectionTimeoutMS=20_000)
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 2,
                "MONGO_SPOOL_DIR": spool, "MONGO_SPOOL_AFTER": 1, "MONGO_PROBE_INTERVAL": 0.5,
                "MONGO_CLOSE_WAIT": 120}
    site = node = None
    try:
        site, node = crawl_until_mongodb_stops(redis, redis_url, tmp_path, server, client,
                                               "held", settings, products)
        # Out of pages with items spooled and MongoDB down: the close is held...
        node.wait_for_log("Not closing yet: MongoDB is unreachable", timeout=180)
        assert spool_files(spool)
        # ... and stays held while the wait lasts (idle is re-checked every 5 s).
        with pytest.raises(subprocess.TimeoutExpired):
            node.proc.wait(8)
        server.start()
        assert node.wait(180) == 0, node.tail()
        stored = stored_products(client["held"]["products"])
    finally:
        if node is not None:
            node.stop()
        if site is not None:
            site.stop()
        client.close()
        server.stop()
    assert "'finish_reason': 'finished'" in node.text()
    assert_matches_catalog(stored, expected_items(site.url, products))
    assert spool_files(spool) == []
    assert node.stat("mongo/replayed") == node.stat("mongo/spooled") > 0
    assert not node.stat("mongo/spool_left_items")


def test_a_node_gives_up_after_the_close_wait_and_another_node_stores_its_spool(
        redis, redis_url, tmp_path):
    products = 100
    spool = tmp_path / "spool"
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    client = pymongo.MongoClient(server.uri, tz_aware=True, serverSelectionTimeoutMS=20_000)
    settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 2,
                "MONGO_SPOOL_DIR": spool, "MONGO_SPOOL_AFTER": 1, "MONGO_PROBE_INTERVAL": 0.5,
                "MONGO_CLOSE_WAIT": 3}
    key = FrontierKeys("products").mongo_spool(target_dir(spool, server.uri, "gaveup").name)
    site = node = other = None
    try:
        site, node = crawl_until_mongodb_stops(redis, redis_url, tmp_path, server, client,
                                               "gaveup", settings, products)
        assert node.wait(180) == 1, node.tail()      # MongoDB still down: exit 1
        text = node.text()
        assert "'finish_reason': 'mongo_unavailable'" in text
        left = node.stat("mongo/spool_left_items")
        assert left > 0
        (error,) = [line for line in node.errors() if "still unreachable at close" in line]
        assert f"{left} items" in error and key in error and str(spool) in error
        assert node.stat("mongo/spool_handed_off") == left
        assert spool_files(spool) == []               # nothing left on the machine...
        assert redis.llen(key) >= 1                   # ... it is in Redis
        server.start()
        # Another machine (its own spool directory) stores them once MongoDB answers.
        other = Node("other", tmp_path, node_env(redis_url, server.uri, "gaveup"),
                     settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2,
                               "MONGO_SPOOL_DIR": tmp_path / "other-spool"})
        assert other.wait(180) == 0, other.tail()
        stored = stored_products(client["gaveup"]["products"])
    finally:
        for running in (node, other):
            if running is not None:
                running.stop()
        if site is not None:
            site.stop()
        client.close()
        server.stop()
    assert_matches_catalog(stored, expected_items(site.url, products))
    assert other.stat("mongo/handoff_replayed") == left
    assert "'finish_reason': 'finished'" in other.text()
    assert not redis.exists(key)
