"""RedisScheduler in real crawls: retries with backoff, dead letters, invalid
payloads moved aside, refusal of unserialisable requests, Redis Cluster."""

import json
import socket
import time

import pytest
import redis as redis_lib
from scrapy import Request, Spider, signals
from scrapy.utils.test import get_crawler

from devtools.demo.site import DemoSite, expected_items
from crawlproject.frontier import library
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import FrontierKeys, reset_spider, start_urls_key
from crawlproject.scheduler import RedisScheduler
from tests.crawl_helpers import (
    Node,
    assert_fetched_once,
    assert_matches_catalog,
    assert_written_once,
    node_env,
    stored_products,
)



def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MetaSpider(Spider):
    name = "meta"
    stored_meta_allow = ("n",)  # its own data in meta, published (crawlproject.policy)

    def parse(self, response):
        pass


def test_a_request_that_cannot_be_stored_is_kept_on_its_node_not_dropped(redis_url):
    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url,
                                       "FRONTIER_SECRET": "s" * 16})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    assert scheduler.enqueue_request(Request("http://127.0.0.1/ok", meta={"n": 1}))
    bad = Request("http://127.0.0.1/bad", meta={"conn": socket.socket})
    assert scheduler.enqueue_request(bad)            # accepted: kept here
    assert crawler.stats.get_value("scheduler/kept_local/not_storable") == 1
    assert len(scheduler.client.outbox[0].adds) == 1 and len(scheduler.local) == 1
    assert scheduler.has_pending_requests()


def test_a_kept_request_that_fails_for_good_is_dead_lettered_with_its_reason(redis_url, redis):
    """A kept request is never silently done: retries exhausted (or a callback
    that raised) make a dead letter, as for a leased one, with its URL and why."""
    import asyncio
    import json as json_

    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url, "FRONTIER_SECRET": "s" * 16})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()

    async def fail_it():
        request = Request("http://127.0.0.1/gone", callback=lambda r: None)
        assert scheduler.enqueue_request(request)
        scheduler.mark_failed(request, "TimeoutError: took too long")
        scheduler.mark_failed(request, "said twice")          # one letter, not two
        await asyncio.gather(*scheduler.failures.kept_tasks)
        await scheduler.client.partitions[0].client.aclose()
    asyncio.run(fail_it())
    dead = [json_.loads(r) for r in redis.lrange("{meta}:dead", 0, -1)]
    assert [(d["url"], d["kind"], d["payload"]) for d in dead] == [
        ("http://127.0.0.1/gone", "download", None)]
    assert dead[0]["reason"].startswith("TimeoutError: took too long")
    assert crawler.stats.get_value("scheduler/dead/download") == 1


@pytest.mark.slow
def test_retries_backoff_and_dead_letters(redis, redis_url, mongo_uri, database, tmp_path):
    dead_url = f"http://127.0.0.1:{closed_port()}/gone"
    with DemoSite(products=20) as site:
        # (robots.txt off: an unreachable site's robots.txt dead-letters its
        # pages at once, tests/test_robots.py; here the page's own retries)
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "RETRY_TIMES": 2, "RETRY_BACKOFF_BASE": 0.3,
                    "CALLBACK_RETRY_TIMES": 1, "ROBOTSTXT_OBEY": False,
                    "SPIDER_MODULES": "crawlproject.spiders,tests.spiders"}
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    spider="crashy", settings=settings)
        node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("crashy"), site.url, json.dumps({"url": dead_url, "priority": 3}))
        assert node.wait(120) == 0, node.tail()
        served = site.stats()
    frontier = Frontier(redis, "crashy", "test")
    dead = {d["kind"]: d for d in frontier.dead_letters()}
    assert set(dead) == {"download", "callback"}
    assert dead["download"]["url"] == dead_url and dead["download"]["attempts"] == 3
    assert "ConnectionRefused" in dead["download"]["reason"]
    assert dead["callback"]["url"].endswith("/product/3") and dead["callback"]["attempts"] == 2
    assert "simulated parser bug" in dead["callback"]["reason"]
    assert served["/product/3"] == 2                     # crashed once, retried once
    assert served["/product/17"] == 2                    # 503 once, then retried via Redis
    assert node.stat("retry/count") >= 3
    stored = stored_products(database["crashy"])
    assert len(stored) == 19 and f"{site.url}product/3" not in stored
    counts = frontier.counts()
    assert counts["queued"] == counts["inflight"] == counts["delayed"] == 0
    # An operator replays the dead letters: they are back in the queue.
    # (due at once: the next node call moves them to their site's queue)
    # (each under the key the nodes give its payload's URL)
    from crawlproject.ops.actions import politeness_key_function

    assert frontier.replay_dead(key_of=politeness_key_function()) == 2
    assert frontier.counts()["delayed"] == 2


@pytest.mark.slow
def test_a_download_that_raised_in_a_middleware_is_dead_lettered_not_acked(
        redis, redis_url, mongo_uri, database, tmp_path):
    """A request whose download raised in a downloader middleware (not one
    the retry middleware handles) was acknowledged as done: lost, with no dead
    letter. It is dead-lettered with the reason; a request a middleware
    ignored on purpose (IgnoreRequest) is done."""
    with DemoSite(products=6, faults=False) as site:
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    spider="faulty", settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2,
                                                "SPIDER_MODULES": "crawlproject.spiders,tests.spiders"})
        node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("faulty"), site.url)
        assert node.wait(120) == 0, node.tail()
        served = site.stats()
    frontier = Frontier(redis, "faulty", "test")
    (dead,) = frontier.dead_letters()
    assert dead["url"] == f"{site.url}product/3" and dead["kind"] == "download"
    assert "OverflowError: simulated middleware bug" in dead["reason"]
    assert dead["payload"]                                # replayable
    assert "/product/3" not in served and "/product/4" not in served
    assert sorted(stored_products(database["faulty"])) == [
        f"{site.url}product/{n}" for n in (1, 2, 5, 6)]
    counts = frontier.counts()
    assert counts["queued"] == counts["inflight"] == counts["delayed"] == 0
    assert node.stat("scheduler/dead/download") == 1


@pytest.mark.slow
def test_invalid_payload_is_moved_aside_and_crawl_goes_on(redis, redis_url, mongo_uri, database, tmp_path):
    # Written straight into the frontier (the site's queue), as an attacker would.
    Frontier(redis, "products", "attacker").push(b"\x80\x04\x95 a pickle, never loaded",
                                                 priority=9, key="127.0.0.1")
    with DemoSite(products=10) as site:
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2})
        node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("products"), site.url)
        assert node.wait(120) == 0, node.tail()
    (record,) = Frontier(redis, "products", "test").invalid_entries()
    assert record["member"] == "9:1@127.0.0.1" and "not JSON" in record["reason"]
    assert node.stat("scheduler/invalid") == 1
    assert len(stored_products(database["products"])) == 10


@pytest.mark.slow
def test_crawl_on_a_three_master_redis_cluster(redis_cluster, mongo_uri, database, tmp_path):
    client = redis_cluster.client()
    reset_spider(client, "products")
    products = 40
    with DemoSite(products=products, latency_ms=10) as site:
        env = {**node_env(redis_cluster.url, mongo_uri, database.name), "REDIS_CLUSTER": "true"}
        # (the MongoDB tier on from the first entry, windows of 2, a site's
        # queue that grows (20 ms between starts): the movers' scripts and
        # pipelines run on the cluster client, in the partition's slot)
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "DOWNLOAD_DELAY": 0.02,
                    "FRONTIER_BACKLOG_SPILL_ABOVE": 1, "FRONTIER_BACKLOG_WINDOW_MIN": 1,
                    "FRONTIER_BACKLOG_WINDOW_MAX": 2}
        nodes = [Node(f"c{i}", tmp_path, env, settings=settings) for i in (1, 2)]
        try:
            for node in nodes:
                node.wait_for_log("Reading seeds from")
            client.lpush(start_urls_key("products"), site.url)
            assert [n.wait(180) for n in nodes] == [0, 0], [n.tail() for n in nodes]
        finally:
            for node in nodes:
                node.stop()
        served = site.stats()
    assert sum(n.stat("backlog/spilled") for n in nodes) > 0
    assert sum(n.stat("backlog/refilled") for n in nodes) > 0
    assert_matches_catalog(stored_products(database["products"]), expected_items(site.url, products))
    assert_fetched_once(served, products)
    assert_written_once(nodes, products)
    assert not [e for n in nodes for e in n.errors()]
    # The frontier keys share one slot; seeds live wherever their key hashes.
    slots = {client.keyslot(k) for k in FrontierKeys("products").sync_keys()}
    assert len(slots) == 1


@pytest.mark.slow
def test_graceful_stop_returns_prefetched_requests_at_once(redis, redis_url, mongo_uri, database, tmp_path):
    import signal
    keys = FrontierKeys("products")
    products = 40
    with DemoSite(products=products, latency_ms=400) as site:
        env = node_env(redis_url, mongo_uri, database.name)
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 2,
                    "SCHEDULER_PREFETCH": 6, "SCHEDULER_LEASE_TTL": 600}
        first = Node("first", tmp_path, env, settings=settings)
        first.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("products"), site.url)
        deadline = time.monotonic() + 60
        while database["products"].count_documents({}) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert redis.hlen(keys.inflight) > 2          # downloading + prefetched
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, first.tail()
        # Everything it held came back now, not after the 600 s lease.
        assert redis.hlen(keys.inflight) == 0
        assert redis.zscore(keys.nodes, "first") is None
        assert "Left the frontier: returned" in first.text()
        second = Node("second", tmp_path, env, settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2})
        assert second.wait(120) == 0, second.tail()
    assert_matches_catalog(stored_products(database["products"]), expected_items(site.url, products))


@pytest.mark.slow
def test_redis_unreachable_at_start_then_back_and_password_never_logged(mongo_uri, database, tmp_path):
    from devtools.services import RedisServer, free_port

    password = "s3cr3t-Pa55word"
    port = free_port()
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    products = 10
    server = RedisServer(port=port, password=password, data_dir=tmp_path / "redis")
    with DemoSite(products=products) as site:
        node = Node("n1", tmp_path, node_env(url, mongo_uri, database.name),
                    settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 3})
        try:
            node.wait_for_log("is unreachable", timeout=90)
            assert node.proc.poll() is None               # still alive, waiting for Redis
            server.start()
            client = redis_lib.Redis.from_url(url)
            client.lpush(start_urls_key("products"), site.url)
            assert node.wait(180) == 0, node.tail()
        finally:
            node.stop()
            server.stop()
    assert len(stored_products(database["products"])) == products
    log = node.text()
    assert password not in log
    assert "redis://***@127.0.0.1" in log
    assert node.stat("seeds/redis_errors") + node.stat("scheduler/redis_errors") >= 1


@pytest.mark.slow
def test_seeds_stream_in_with_back_pressure(redis, redis_url, mongo_uri, database, tmp_path):
    import threading

    seeds = 600
    with DemoSite(products=seeds, latency_ms=20, faults=False) as site:
        redis.lpush(start_urls_key("leaf"), *[f"{site.url}product/{i}" for i in range(1, seeds + 1)])
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 8,
                    "REDIS_START_URLS_BATCH_SIZE": 20, "SEEDS_MAX_PENDING": 20,
                    "SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False}
        watcher = redis_lib.Redis.from_url(redis_url)
        samples, done = [], threading.Event()

        def watch():
            while not done.is_set():
                samples.append((watcher.llen(start_urls_key("leaf")),
                                watcher.hlen(FrontierKeys("leaf").inflight)))
                done.wait(0.01)

        thread = threading.Thread(target=watch)
        thread.start()
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    spider="leaf", settings=settings)
        try:
            assert node.wait(180) == 0, node.tail()
        finally:
            done.set()
            thread.join()
            node.stop()
    assert database["leaf"].count_documents({}) == seeds
    assert node.stat("seeds/read") == seeds
    # counted on the hot path, added to the stats every loop turn and at close
    assert node.stat("scheduler/enqueued/redis") == node.stat("scheduler/dequeued/redis") == seeds
    # Seeds were fed in batches while the crawl ran: pages were being crawled
    # while seeds were still waiting in Redis.
    assert any(seeds_left > 0 and leased > 0 for seeds_left, leased in samples), samples[:50]
    assert redis.llen(start_urls_key("leaf")) == 0


def test_a_nodes_own_repeats_are_dropped_before_encoding(redis_url):
    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url, "SCHEDULER_LOCAL_DEDUPE_SIZE": 2})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    assert scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    assert not scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/a", dont_filter=True))
    assert scheduler.client.outbox[0].adds[-1][1][0] == "!"   # queued, and recorded in the filter
    for url in ("b", "c", "d", "e"):                    # two generations of 2: "a" is forgotten
        assert scheduler.enqueue_request(Request(f"http://127.0.0.1/{url}"))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/a"))   # the shared filter decides
    scheduler.flush_counts()
    assert crawler.stats.get_value("dupefilter/filtered_locally") == 1
    assert crawler.stats.get_value("scheduler/enqueued/redis") == 7
    assert len(scheduler.client.outbox[0].adds) == 7


def _scheduler(redis_url, **settings):
    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url, **settings})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    return scheduler, crawler


def test_a_link_this_node_sent_is_dropped_without_computing_its_fingerprint(redis_url):
    """With Scrapy's own fingerprinter a GET's fingerprint is its URL's: a repeat
    of a URL this node sent is dropped on a set lookup. Whatever else enters the
    fingerprint (method, body, verbatim_url) still goes through it."""
    scheduler, crawler = _scheduler(redis_url)
    calls = []
    original = scheduler.fingerprinter._fingerprint

    def counting(request):
        calls.append(request.url)
        return original(request)
    scheduler.fingerprinter._fingerprint = counting
    url = "http://127.0.0.1/a?x=1&y=2"
    assert scheduler.enqueue_request(Request(url)) and len(calls) == 1
    assert not scheduler.enqueue_request(Request(url))
    assert len(calls) == 1                                  # no second fingerprint
    # the same resource under another spelling: the fingerprint decides
    assert not scheduler.enqueue_request(Request("http://127.0.0.1/a?y=2&x=1"))
    assert len(calls) == 2
    assert scheduler.enqueue_request(Request(url, method="POST", body=b"q=1"))
    assert not scheduler.enqueue_request(Request(url, meta={"verbatim_url": True}))
    assert len(calls) == 4
    scheduler.flush_counts()
    assert crawler.stats.get_value("dupefilter/filtered_locally") == 3
    assert len(scheduler.client.outbox[0].adds) == 2


class SessionFingerprinter:
    """Tells apart requests of one URL by their session header."""

    def fingerprint(self, request):
        from scrapy.utils.request import fingerprint
        return fingerprint(request, include_headers=["X-Session"])


def test_with_another_fingerprinter_a_repeated_url_is_not_taken_for_a_duplicate(redis_url):
    scheduler, _ = _scheduler(
        redis_url, REQUEST_FINGERPRINTER_CLASS=f"{__name__}.SessionFingerprinter")
    url = "http://127.0.0.1/account"
    assert scheduler.enqueue_request(Request(url, headers={"X-Session": "1"}))
    assert scheduler.enqueue_request(Request(url, headers={"X-Session": "2"}))
    assert not scheduler.enqueue_request(Request(url, headers={"X-Session": "2"}))
    assert len(scheduler.client.outbox[0].adds) == 2


def test_open_fails_loudly_without_the_engine_state_acks_rely_on(redis_url):
    """If a Scrapy upgrade renamed engine._slot.inprogress, nothing would ever be
    acknowledged, silently: refuse to start instead, saying why."""
    from types import SimpleNamespace

    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    crawler.engine = SimpleNamespace(_slot=SimpleNamespace(in_progress=set()))  # "renamed"
    with pytest.raises(RuntimeError, match=r"_slot.inprogress.*supported: Scrapy 2\.13"):
        scheduler.open(crawler.spider)


def test_priorities_beyond_the_bound_are_clamped_and_counted(redis_url):
    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    assert scheduler.enqueue_request(Request("http://127.0.0.1/deep", priority=-10_000))
    assert crawler.stats.get_value("scheduler/priority_clamped") == 1
    assert scheduler.client.outbox[0].adds[0][2] == -4095


def test_lease_ttl_and_heartbeat_defaults_recover_within_15_seconds(redis_url):
    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url})
    scheduler = RedisScheduler.from_crawler(crawler)
    assert scheduler.lease_ttl + scheduler.heartbeat <= 15
    with pytest.raises(ValueError):
        RedisScheduler.from_crawler(get_crawler(MetaSpider, {
            "REDIS_URL": redis_url, "SCHEDULER_HEARTBEAT_INTERVAL": 20}))


@pytest.mark.parametrize("concurrency, explicit, expected", [
    (16, None, 16), (32, None, 16), (64, None, 16), (256, None, 64), (64, 48, 48)])
def test_prefetch_default_is_a_quarter_of_the_concurrency_at_least_16(
        redis_url, concurrency, explicit, expected):
    """Not the whole concurrency: on a node whose CPU is the limit, a buffer as
    large as it filled every slot with responses to scrape, for fewer pages/s
    (see default_prefetch); an explicit SCHEDULER_PREFETCH wins."""
    settings = {"REDIS_URL": redis_url, "CONCURRENT_REQUESTS": concurrency}
    if explicit:
        settings["SCHEDULER_PREFETCH"] = explicit
    scheduler = RedisScheduler.from_crawler(get_crawler(MetaSpider, settings))
    assert scheduler.prefetch == expected


def test_robots_crawl_delay_and_slow_down_answers_reach_the_frontier(redis_url):
    """robots.txt Crawl-delay (with ROBOTSTXT_OBEY) and 429/503 answers become
    feedback for the site's politeness key in the next frontier call."""
    from scrapy.http import Response
    from scrapy.robotstxt import ProtegoRobotParser

    from crawlproject.middlewares.slowdown import (
        FrontierPolitenessMiddleware,
        retry_after_seconds,
    )

    crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url, "ROBOTSTXT_OBEY": True})
    crawler.spider = MetaSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    parser = ProtegoRobotParser(b"User-agent: *\nCrawl-delay: 3\n", crawler.spider)
    scheduler.site_feedback.on_robots(parser, Request("http://Shop.Example:8080/x"))
    assert scheduler.client.outbox[0].feedback == [("shop.example", "crawldelay", 3000)]

    crawler.engine = type("E", (), {"scheduler": scheduler})()
    middleware = FrontierPolitenessMiddleware.from_crawler(crawler)
    request = Request("http://shop.example/p")
    middleware.process_response(request, Response(request.url, status=429,
                                                  headers={"Retry-After": "7"}))
    middleware.process_response(request, Response(request.url, status=503))
    middleware.process_response(request, Response(request.url, status=500))
    assert scheduler.client.outbox[0].feedback[1:] == [("shop.example", "block", 7000),
                                                       ("shop.example", "backoff", 0)]
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0   # in the past
    assert retry_after_seconds(b"garbage") is None


def test_a_junk_limits_key_is_said_and_counted_not_a_stopped_node(redis, redis_url, caplog):
    """Anyone who can write to Redis can put a string where the limits hash
    goes: publishing FRONTIER_HOST_LIMITS is refused, the node says so once,
    counts each try and crawls on under its settings (an exception from the
    first-sync hook would fail every later frontier call)."""
    import asyncio

    scheduler, crawler = _scheduler(
        redis_url, FRONTIER_HOST_LIMITS={"slow.example": {"delay": 2}})
    limits_key = FrontierKeys("meta").limits
    redis.set(limits_key, "junk")

    async def first_sync_then_refresh():
        await scheduler.limits.first_sync()                   # refused: no exception
        scheduler.limits.published -= 60                  # the refresh is due
        scheduler.limits.maybe_refresh()
        await scheduler.limits.task
        redis.delete(limits_key)                           # mended
        scheduler.limits.published -= 60
        scheduler.limits.maybe_refresh()
        await scheduler.limits.task
        await scheduler.client.partitions[0].client.aclose()

    with caplog.at_level("ERROR"):
        asyncio.run(first_sync_then_refresh())
    assert crawler.stats.get_value("politeness/limits_refused") == 2
    said = [r.getMessage() for r in caplog.records if "FRONTIER_HOST_LIMITS" in r.getMessage()]
    assert len(said) == 1 and "refused" in said[0], said
    assert redis.hget(limits_key, "slow.example") == b"2000|8|100000|s"   # (FRONTIER_SITE_BUDGET 100,000)


def test_many_host_limits_are_published_in_bounded_calls(redis, redis_url):
    """A FRONTIER_HOST_LIMITS of thousands of hosts goes out in calls of at
    most LIMITS_CHUNK keys (a single script call over all of them would hold
    Redis, every node's calls included, that long), and all of it lands."""
    import asyncio

    from crawlproject.scheduler import LIMITS_CHUNK

    hosts = {f"h{i}.example": {"delay": 1 + i % 5} for i in range(2 * LIMITS_CHUNK + 7)}
    scheduler, _ = _scheduler(redis_url, FRONTIER_HOST_LIMITS=hosts)
    def script_calls():  # that ran (a first NOSCRIPT attempt is a failed call)
        return library.script_calls(redis.info("commandstats"))

    before = script_calls()

    async def first_sync():
        await scheduler.limits.first_sync()
        await scheduler.client.partitions[0].client.aclose()

    asyncio.run(first_sync())
    calls = script_calls() - before
    assert calls == 3, calls
    stored = redis.hgetall(FrontierKeys("meta").limits)
    assert len(stored) == len(hosts) and stored[b"h6.example"].startswith(b"2000|")


def test_counts_of_a_report_that_fails_are_kept_with_those_made_meanwhile():
    """The cluster-wide counters a node reports every SCHEDULER_LOG_INTERVAL:
    when Redis is away, the report's counts went back in place of the counts
    made while it was failing (those were lost)."""
    import asyncio

    scheduler, _ = _scheduler(f"redis://127.0.0.1:{closed_port()}/0")

    async def report_while_counting():
        scheduler.report.count("scheduler/acked", 2)
        scheduler.report.last_report = float("-inf")  # due (0.0 is not, on a machine up < 60 s)
        scheduler.report.maybe_report(scheduler.client)
        await asyncio.sleep(0)
        assert scheduler.report.stat_deltas == {}      # taken by the report in flight
        scheduler.report.count("scheduler/acked", 3)   # counted meanwhile
        await scheduler.report.task                    # Redis refused: kept
        await scheduler.client.partitions[0].client.aclose()

    asyncio.run(report_while_counting())
    assert scheduler.report.stat_deltas == {"scheduler/acked": 5}


def test_the_frontier_status_line_is_logged_once_an_interval_not_every_turn(
        redis_url, caplog, monkeypatch):
    """The "Frontier: ..." line (and its stats write to Redis) comes once every
    SCHEDULER_LOG_INTERVAL: its timer was never reset, so after the first
    interval every scheduler turn logged one (15-52 lines a second)."""
    import asyncio
    import logging
    import types

    import crawlproject.scheduling.report as report_module

    now = [1000.0]
    monkeypatch.setattr(report_module, "time",
                        types.SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    scheduler, _ = _scheduler(redis_url, SCHEDULER_LOG_INTERVAL=60)

    async def ten_minutes_of_turns():
        for _ in range(600 * 4):                       # a turn every 0.25 s
            now[0] += 0.25
            scheduler.report.maybe_report(scheduler.client)
            if scheduler.report.task is not None:
                await scheduler.report.task
        await scheduler.client.partitions[0].client.aclose()

    with caplog.at_level(logging.INFO, logger="crawlproject.scheduler"):
        asyncio.run(ten_minutes_of_turns())
    lines = [r for r in caplog.records if r.getMessage().startswith("Frontier: ")]
    assert len(lines) == 10


_REMOTE_CONTROL_PROBE = """
import asyncio, json, logging, sys
from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.extensions.remote_control import RemoteControl
from scrapy.settings import Settings
from crawlproject.scheduler import RedisScheduler
from tests.test_scheduler import MetaSpider

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
settings = json.loads(sys.argv[1])
# Not get_crawler(): it turns the remote control off itself. No Twisted
# reactor here: the extension runs on asyncio alone.
crawler = Crawler(MetaSpider, Settings({"TWISTED_REACTOR_ENABLED": False, **settings}))
crawler._apply_settings()
(ext,) = [e for e in crawler.extensions.middlewares if isinstance(e, RemoteControl)]
crawler.spider = MetaSpider.from_crawler(crawler)
RedisScheduler.from_crawler(crawler).setup(crawler.spider)

async def engine_started():
    await crawler.signals.send_catch_log_async(signals.engine_started)
    running = ext._runner is not None
    await ext.stop()
    return running

print(json.dumps(asyncio.run(engine_started())))
"""


def test_scrapys_remote_control_is_not_started_unless_the_user_set_it(redis_url):
    """Scrapy 2.19 starts an HTTP server that runs posted code, on by default;
    a user project with the README block had it on every node. Each probe runs
    in a fresh interpreter: a reactor another test installed would refuse
    TWISTED_REACTOR_ENABLED = False."""
    import subprocess
    import sys

    def started(settings):
        done = subprocess.run(
            [sys.executable, "-c", _REMOTE_CONTROL_PROBE,
             json.dumps({"REDIS_URL": redis_url, **settings})],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    running, log = started({})                    # not set: not started, and said
    assert not running
    assert "remote control server is not started" in log
    running, log = started({"REMOTE_CONTROL_ENABLED": True})   # the user's choice is kept
    assert running
    assert "remote control (runs Python code posted to it" in log


def test_scrapys_per_process_limits_are_taken_over_or_named(redis_url, caplog):
    """The node's own downloader neither delays nor limits a second time; what
    the frontier does not apply (CONCURRENT_REQUESTS_PER_IP) is said, and
    DOWNLOAD_SLOTS are named as the frontier's."""
    from types import SimpleNamespace

    from scrapy.core.downloader import Downloader

    from crawlproject.scheduling.engineguards import no_local_politeness

    scheduler, crawler = _scheduler(
        redis_url, DOWNLOAD_DELAY=2, CONCURRENT_REQUESTS_PER_IP=3,
        DOWNLOAD_SLOTS={"books.example": {"delay": 5}})
    downloader = Downloader(crawler)
    crawler.engine = SimpleNamespace(downloader=downloader)
    with caplog.at_level("INFO"):
        no_local_politeness(crawler, scheduler.politeness, {})
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "CONCURRENT_REQUESTS_PER_IP = 3 is not applied" in said
    assert "DOWNLOAD_SLOTS ['books.example']: enforced by the frontier" in said
    assert (downloader._delay, downloader.ip_concurrency, downloader.per_slot_settings) == (0, 0, {})
    assert scheduler.politeness.overrides["books.example"].delay == 5


def test_the_engine_gets_at_most_a_burst_of_requests_per_event_loop_turn():
    """Requests started in one turn come back together and queue behind each
    other's callbacks; so the engine gets SCHEDULER_START_BURST a turn, is
    told once to come back, and gets the next ones on the next turn (a real
    asyncio loop)."""
    import asyncio

    from crawlproject.scheduling.burst import StartBurst

    async def scenario(size: int):
        nudges: list[int] = []
        burst = StartBurst(size, lambda: nudges.append(1))
        passes = []

        def engine_pass():   # as Scrapy's engine does: asks until refused (or full)
            n = 0
            while n < 100 and burst.allow():
                burst.handed_out()
                n += 1
            passes.append(n)

        for _ in range(3):
            engine_pass()
            engine_pass()            # the same turn: nothing more
            await asyncio.sleep(0)   # the next turn
        return passes, len(nudges)

    assert asyncio.run(scenario(4)) == ([4, 0, 4, 0, 4, 0], 3)
    assert asyncio.run(scenario(0)) == ([100, 100] * 3, 0)   # 0: no limit, never nudged


def test_the_start_burst_setting(redis_url):
    def burst(**settings):
        crawler = get_crawler(MetaSpider, {"REDIS_URL": redis_url, **settings})
        return RedisScheduler.from_crawler(crawler).start_burst.size

    assert burst(CONCURRENT_REQUESTS=16) == 0          # off unless asked for
    assert burst(SCHEDULER_START_BURST="4") == 4
    with pytest.raises(ValueError, match="SCHEDULER_START_BURST"):
        burst(SCHEDULER_START_BURST=-1)


def test_a_crawlspider_rule_without_errback_leaves_a_failed_download_unhandled():
    """CrawlSpider puts its own errback on every rule request, which passes a
    failure on to the rule's errback: with none, nothing handled the failure
    (a refused header flood, a downloader middleware's error), so the request
    is dead-lettered with its reason, not acknowledged as done."""
    from scrapy.linkextractors import LinkExtractor
    from scrapy.spiders import CrawlSpider, Rule
    from twisted.python.failure import Failure

    from crawlproject.scheduling.errback import LeaseErrback

    class Rules(CrawlSpider):
        name = "rules"
        rules = (Rule(LinkExtractor(), callback="parse_item"),
                 Rule(LinkExtractor(), callback="parse_item", errback="on_error"))

        def parse_item(self, response):
            pass

        def on_error(self, failure):
            pass

    spider = Rules.from_crawler(get_crawler(Rules))
    for rule, dead in ((0, True), (1, False)):
        recorded = []
        errback = LeaseErrback(lambda member, reason: recorded.append((member, reason)),
                               "m1", spider._errback)
        failure = Failure(ValueError("1001 response headers"))
        failure.request = Request("http://127.0.0.1/p", meta={"rule": rule})
        errback(failure)
        assert recorded == ([("m1", "ValueError: 1001 response headers")] if dead else []), rule
