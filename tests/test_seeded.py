"""RedisSpider on a live node: hostile seeds and payloads pushed by whoever can
write to Redis never stop the node, never reach spider internals, never write
files; every seed ends up crawled or set aside with a reason."""

import json
import random

import pytest

from devtools.demo.site import DemoSite
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import SeedKeys, start_urls_key
from tests.crawl_helpers import Node, node_env

pytestmark = pytest.mark.slow
GOOD = 60
BAD = 300


def hostile_seeds(count: int, url: str, rng: random.Random) -> list:
    """Seeds that no node may turn into a request, in many shapes."""
    makers = [
        lambda: json.dumps({"url": url, "headers": {"X-A": [rng.randint(0, 9), {}]}}),
        lambda: json.dumps({"url": url, "headers": {"X-A": rng.random()}}),
        lambda: f"http://[::{rng.randint(0, 999)}",
        lambda: json.dumps({"url": f"http://[::1/{rng.randint(0, 999)}"}),
        lambda: json.dumps({"url": url, "callback": rng.choice(
            ["__init__", "_set_crawler", "close", "closed", "start", "from_crawler", "log",
             "_parse", "make_request_from_seed", "start_requests", f"nope_{rng.randint(0, 99)}"])}),
        lambda: json.dumps({"url": url, "errback": rng.choice(["__init__", "_set_crawler"])}),
        lambda: json.dumps({"url": url, "meta": {rng.choice(
            ["proxy", "download_slot", "dont_filter", "cookiejar", "download_timeout",
             "crawlproject_callback_attempts", "_crawlproject_lease", "playwright"]): "x"}}),
        lambda: json.dumps({"url": url, "meta": {"playwright_context_kwargs": {
            "record_har_path": f"/tmp/pwned-{rng.randint(0, 99)}.har"}}}),
        lambda: json.dumps({"url": url, "priority": rng.choice([10**6, "high", 1.5, -10**9])}),
        lambda: json.dumps({"url": url, "method": rng.choice(["EXPLODE", 5, None])}),
        lambda: json.dumps({"url": url, "field": {"nested": rng.randint(0, 9)}}),
        lambda: json.dumps([url]),
        lambda: "{" + "".join(rng.choice('"{}[]:,x') for _ in range(rng.randint(1, 30))),
        lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40))),
        lambda: "ftp://127.0.0.1/" + str(rng.randint(0, 99)),
        lambda: json.dumps({"url": url * 2000}),
    ]
    return [rng.choice(makers)() for _ in range(count)]


def test_hostile_seeds_and_payloads_never_stop_a_node(redis, redis_url, mongo_uri, database,
                                                      tmp_path):
    rng = random.Random(20261130)
    pwned = tmp_path / "pwned.png"
    with DemoSite(products=GOOD, latency_ms=5, faults=False) as site:
        good = [f"{site.url}product/{i}" for i in range(1, GOOD + 1)]
        bad = hostile_seeds(BAD, good[0], rng)
        seeds = good + bad
        rng.shuffle(seeds)
        # Payloads written straight into the frontier by an attacker.
        frontier = Frontier(redis, "leaf", "attacker")
        hostile_payloads = [
            {"url": good[0], "callback": "_set_crawler"},
            {"url": good[0], "callback": "__init__"},
            {"url": good[0], "meta": {"playwright": True, "playwright_page_methods": [
                {"__t__": "PageMethod", "method": "screenshot", "args": [],
                 "kwargs": {"path": str(pwned)}}]}},
            {"url": good[0], "meta": {"playwright": True, "playwright_page_methods": [
                {"__t__": "PageMethod", "method": "goto", "args": ["file:///etc/passwd"],
                 "kwargs": {}}]}},
        ]
        for p in hostile_payloads:
            frontier.push(json.dumps(p))
        redis.lpush(start_urls_key("leaf"), *seeds)
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name), spider="leaf",
                    settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "ROBOTSTXT_OBEY": False,
                              "SPIDER_MODULES": "tests.spiders"})
        try:
            assert node.wait(240) == 0, node.tail()
        finally:
            node.stop()
        served = site.stats()
    log = node.text()
    assert "'finish_reason': 'finished'" in log, node.tail()
    # Every good seed crawled and stored; every bad one set aside with a reason.
    assert database["leaf"].count_documents({}) == GOOD
    assert all(served.get(f"/product/{i}", 0) >= 1 for i in range(1, GOOD + 1))
    keys = SeedKeys(start_urls_key("leaf"))
    invalid = [json.loads(r) for r in redis.lrange(keys.invalid, 0, -1)]
    assert len(invalid) == BAD and all(r["reason"] and r["error"] for r in invalid)
    assert node.stat("seeds/invalid") == BAD and node.stat("seeds/read") == GOOD
    assert redis.llen(keys.seeds) == 0 and redis.hlen(keys.claims) == 0
    # The hostile payloads were moved aside, never run.
    assert len(frontier.invalid_entries()) == len(hostile_payloads)
    assert node.stat("scheduler/invalid") == len(hostile_payloads)
    assert not pwned.exists()
    assert "Spider closed (finished)" in log and "start_error" not in log


def test_a_broken_start_exits_non_zero(redis_url, mongo_uri, database, tmp_path):
    node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                spider="broken_start", settings={"SPIDER_MODULES": "tests.spiders"})
    try:
        assert node.wait(120) == 1, node.tail()
    finally:
        node.stop()
    assert "finish reason 'start_error'" in node.text()


def test_a_seed_key_of_the_wrong_type_is_reported_and_keeps_its_seeds(redis, redis_url, mongo_uri,
                                                                      database, tmp_path):
    """Seeds pushed with SADD to a spider that reads a list: Redis answers every
    claim with an error. That is not an outage (the node would wait forever for
    Redis to come back): the node says which key is wrong and how to fix it,
    takes nothing, and closes when idle; the seeds stay in Redis."""
    key = start_urls_key("leaf")
    redis.sadd(key, "http://127.0.0.1:9/a", "http://127.0.0.1:9/b")
    node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name), spider="leaf",
                settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "SEEDS_POLL_INTERVAL": 0.2,
                          "SPIDER_MODULES": "tests.spiders"})
    try:
        assert node.wait(120) == 0, node.tail()
    finally:
        node.stop()
    log = node.text()
    assert f"No seed can be read: {key} is a set, not a list" in log, node.tail()
    assert "REDIS_START_URLS_AS_SET" in log and "unreachable" not in log
    assert node.stat("seeds/bad_keys") >= 1 and not node.stat("seeds/redis_errors")
    assert redis.type(key) == b"set" and redis.scard(key) == 2
    assert "Spider closed (finished)" in log
