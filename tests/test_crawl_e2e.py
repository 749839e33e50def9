"""End to end, as a user runs it: two ``scrapy crawl products`` nodes on one Redis,
seeded with ``LPUSH``, storing into a MongoDB-wire server, on the demo site."""

import pytest

from devtools.demo.site import DemoSite, expected_items
from tests.crawl_helpers import (
    Node,
    assert_fetched_once,
    assert_matches_catalog,
    assert_written_once,
    node_env,
    stored_products,
)

pytestmark = pytest.mark.slow
PRODUCTS = 60



# SCHEDULER_START_BURST=1: the engine gets one request a turn of the event
# loop and must come back for every other one (crawlproject.scheduling.burst.StartBurst).
@pytest.mark.parametrize("extra", [{}, {"SCHEDULER_START_BURST": 1}],
                         ids=["defaults", "one-start-a-loop-turn"])
def test_two_nodes_crawl_every_product_exactly_once(redis, redis_url, mongo_uri, database, tmp_path,
                                                     extra):
    with DemoSite(products=PRODUCTS, latency_ms=150) as site:
        env = node_env(redis_url, mongo_uri, database.name)
        # A small concurrency and buffer per node, so that one node cannot swallow
        # the whole (small) crawl before the other polls the frontier: a node
        # takes what it adds in the same call, so with the default buffer of 16
        # a node could take each list page's 11 new entries as they came and
        # the other never find one queued (seen once in a CPU-bound suite run).
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4,
                    "SCHEDULER_PREFETCH": 4, **extra}
        nodes = [Node(f"node-{i}", tmp_path, env, settings=settings) for i in (1, 2)]
        try:
            for node in nodes:
                node.wait_for_log("Reading seeds from")
            redis.lpush("products:start_urls", site.url, "not a url")
            codes = [node.wait(240) for node in nodes]
        finally:
            for node in nodes:
                node.stop()
        served = site.stats()
    assert codes == [0, 0], [n.tail() for n in nodes]
    assert_matches_catalog(stored_products(database["products"]), expected_items(site.url, PRODUCTS))
    # Each page fetched exactly as often as a correct crawl does (the 503-once
    # pages twice), each item scraped once and inserted once: a page crawled
    # twice by the two nodes would show in the site's counts and the writes.
    assert_fetched_once(served, PRODUCTS)
    assert served.get("/product/999999") == 1
    assert all(served.get(f"/list/{n}", 0) == 1 for n in range(2, PRODUCTS // 10 + 1))
    assert_written_once(nodes, PRODUCTS)
    # Both nodes worked (the crawl lasts seconds at 150 ms a page; a node polls
    # an empty frontier every 0.2 s); the JavaScript page was rendered by Chromium.
    assert all(n.stat("item_scraped_count") > 0 for n in nodes), [n.tail() for n in nodes]
    # The project's settings freeze the start-up heap (extensions/gctuning.py).
    assert all(n.stat("gc/frozen_objects") > 10_000 for n in nodes)
    js = database["products"].find_one({"url": f"{site.url}product/7"})
    assert js["rendered"] is True and js["title"]
    # The malformed seed was reported and kept aside, not lost.
    assert sum(n.stat("seeds/invalid") for n in nodes) == 1
    assert redis.llen("products:start_urls:invalid") == 1
    assert redis.hlen("{products:start_urls}:claims") == 0      # seed claims released
    assert not [e for n in nodes for e in n.errors()]
    limit = f"{extra['SCHEDULER_START_BURST']} starts" if extra else "unlimited starts"
    assert all(f"{limit} a loop turn" in n.text() for n in nodes)
