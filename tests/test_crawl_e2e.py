"""End to end, as a user runs it: two ``scrapy crawl products`` nodes on one Redis,
seeded with ``LPUSH``, storing into a MongoDB-wire server, on the demo site."""

import pytest

from crawlproject.demo.site import DemoSite, expected_items
from tests.crawl_helpers import Node, assert_matches_catalog, node_env, stored_products

pytestmark = pytest.mark.slow
PRODUCTS = 60



def test_two_nodes_crawl_every_product_exactly_once(redis, redis_url, mongo_uri, database, tmp_path):
    with DemoSite(products=PRODUCTS, latency_ms=50) as site:
        env = node_env(redis_url, mongo_uri, database.name)
        # A small concurrency per node, so that one node cannot swallow the
        # whole (small) crawl before the other polls the frontier.
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4}
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
    # The site saw every page: all listings, every product, the dead link.
    for pid in range(1, PRODUCTS + 1):
        assert served.get(f"/product/{pid}", 0) >= 1, pid
        if pid % 17 == 0:
            assert served[f"/product/{pid}"] >= 2     # 503 once, then retried
    assert served.get("/product/999999") == 1
    assert all(served.get(f"/list/{n}", 0) >= 1 for n in range(2, PRODUCTS // 10 + 1))
    # Both nodes worked; the JavaScript page was rendered by Chromium.
    assert all(n.stat("item_scraped_count") > 0 for n in nodes), [n.tail() for n in nodes]
    assert sum(n.stat("item_scraped_count") for n in nodes) >= PRODUCTS
    js = database["products"].find_one({"url": f"{site.url}product/7"})
    assert js["rendered"] is True and js["title"]
    # The malformed seed was reported and kept aside, not lost.
    assert sum(n.stat("seeds/invalid") for n in nodes) == 1
    assert redis.llen("products:start_urls:invalid") == 1
    assert redis.hlen("{products:start_urls}:claims") == 0      # seed claims released
    assert not [e for n in nodes for e in n.errors()]
