"""Outage logging: a Redis outage is one WARNING, reminders at most every
minute, and one INFO with the downtime when Redis answers again."""

import re
import time

import pytest

from crawlproject.keys import start_urls_key
from devtools.demo.site import DemoSite
from crawlproject.outage import OutageLog
from devtools.services import RedisServer
from tests.crawl_helpers import Node, assert_fetched_once, node_env


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


class Stats(dict):
    def inc_value(self, key, value=1):
        self[key] = self.get(key, 0) + value


def test_one_warning_reminders_and_one_info_with_the_downtime(caplog):
    clock, stats = Clock(), Stats()
    log = OutageLog("Redis at redis://h:1/0", name="redis", stats=stats, clock=clock,
                    reminder_interval=60)
    with caplog.at_level("INFO"):
        for _ in range(100):                        # 100 failed calls over 150 s
            log.failed("reading seeds", ConnectionError("refused"))
            clock.now += 1.5
        log.ok()
        log.ok()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [lvl for lvl, _ in lines] == ["WARNING", "WARNING", "WARNING", "INFO"]
    assert "is unreachable" in lines[0][1] and "still unreachable after 60s" in lines[1][1]
    assert re.search(r"answers again after 150\.0s \(100 failed calls\)", lines[-1][1])
    assert stats == {"redis/outages": 1, "redis/outage_seconds": 150.0}


@pytest.mark.slow
def test_a_redis_outage_mid_crawl_is_logged_once(mongo_uri, database, tmp_path):
    server = RedisServer(data_dir=tmp_path / "redis", appendonly=True)
    server.start()
    products = 40
    try:
        with DemoSite(products=products, latency_ms=150) as site:
            node = Node("n1", tmp_path, node_env(server.url, mongo_uri, database.name),
                        settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "CONCURRENT_REQUESTS": 2})
            try:
                node.wait_for_log("Reading seeds from")
                client = server.client()
                client.lpush(start_urls_key("products"), site.url)
                deadline = time.monotonic() + 60
                while database["products"].count_documents({}) < 5:
                    assert time.monotonic() < deadline, node.tail()
                    time.sleep(0.1)
                server.stop()
                node.wait_for_log("is unreachable")
                # The outage goes on; every component keeps failing meanwhile
                # (no assertion depends on how long this lasts).
                time.sleep(4)
                server.start()
                node.wait_for_log(r"answers again after \d+\.\ds")
                assert node.wait(180) == 0, node.tail()
                served = site.stats()
            finally:
                node.stop()
    finally:
        server.stop()
    text = node.text()
    assert len(re.findall(r"WARNING: Redis at redis://127\.0\.0\.1:\d+/0 is unreachable", text)) == 1
    assert len(re.findall("answers again after", text)) == 1
    assert not [line for line in node.errors() if "Redis" in line or "Frontier" in line], \
        node.errors()
    assert database["products"].count_documents({}) == products
    assert node.stat("redis/outages") == 1
    # The node kept its leases through the outage (it adopted them under its
    # new id): no acknowledgement was refused, and no page was fetched twice
    # (a lease left under the old id would come back when it expired and be
    # crawled again). What the old id took in a call whose reply the outage
    # cut off was never seen here: it is reclaimed at expiry, fetched once
    # (so "scheduler/reclaimed" may be above 0: the stop can land mid-call).
    assert node.stat("scheduler/stale") == 0
    assert_fetched_once(served, products)


def test_one_components_success_does_not_end_anothers_outage(caplog):
    """A Redis Cluster can be partly down: the seeds reader's calls to a healthy
    master succeed while the frontier's calls to a dead one fail. Redis "answers
    again" only once every component that saw it fail has succeeded since; the
    code before logged it after each seed read (one outage counted per flap)."""
    clock, stats = Clock(), Stats()
    log = OutageLog("Redis at redis://h:1/0", name="redis", stats=stats, clock=clock)
    with caplog.at_level("INFO"):
        for _ in range(10):
            log.failed("frontier call (partition 5)", ConnectionError("refused"),
                       source="frontier")
            clock.now += 1.0
            log.ok(source="seeds")
            assert log.down
        log.ok(source="frontier")
    assert not log.down
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [lvl for lvl, _ in lines] == ["WARNING", "INFO"]
    assert re.search(r"answers again after 10\.0s \(10 failed calls\)", lines[-1][1])
    assert stats == {"redis/outages": 1, "redis/outage_seconds": 10.0}
