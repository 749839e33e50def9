"""LineageMiddleware and the scheduler: an ack waits only for its own requests."""

import asyncio
import json

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from crawlproject.frontier.client import Entry
from crawlproject.frontier.retrypolicy import LEASE_META, PARENT_META
from crawlproject.middlewares.lineage import LineageMiddleware
from crawlproject.scheduler import RedisScheduler
from crawlproject.signing import unwrap


class LinkSpider(Spider):
    name = "lineage"

    def parse(self, response):
        pass


def test_requests_a_callback_yields_name_the_leased_request_they_came_from():
    crawler = get_crawler(LinkSpider, {"FRONTIER_PARTITIONS": 4})
    middleware = LineageMiddleware.from_crawler(crawler)
    leased = Request("http://127.0.0.1/list", meta={LEASE_META: "0:7@127.0.0.1"})
    response = HtmlResponse(leased.url, body=b"<html></html>", request=leased)

    async def output():
        yield Request("http://127.0.0.1/a")
        yield {"title": "an item"}
        yield Request("http://127.0.0.1/b")

    async def collect(result):
        return [x async for x in result]

    out = asyncio.run(collect(middleware.process_spider_output(response, output())))
    assert [r.meta.get(PARENT_META) for r in out if isinstance(r, Request)] == ["0:7@127.0.0.1"] * 2
    assert out[1] == {"title": "an item"}
    unleased = HtmlResponse(leased.url, body=b"", request=Request(leased.url))
    out = asyncio.run(collect(middleware.process_spider_output(unleased, output())))
    assert all(PARENT_META not in r.meta for r in out if isinstance(r, Request))


@pytest.mark.parametrize("settings", [{"FRONTIER_PARTITIONS": 1},
                                      {"FRONTIER_PARTITIONS": 4, "FRONTIER_LINEAGE_ENABLED": False}])
def test_the_lineage_middleware_is_off_where_it_gains_nothing(settings):
    with pytest.raises(NotConfigured):
        LineageMiddleware.from_crawler(get_crawler(LinkSpider, settings))


def test_the_scheduler_records_a_request_s_parent_only_if_it_holds_it(redis_url):
    """The mark is never stored; a parent this node does not hold (any more)
    leaves the request waited for by every ack, as without a mark."""
    crawler = get_crawler(LinkSpider, {"REDIS_URL": redis_url, "FRONTIER_PARTITIONS": 2})
    crawler.spider = LinkSpider.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    crawler.stats.open_spider()
    client = scheduler.client
    mine = "0:1@127.0.0.1"
    client.held[mine] = Entry(mine, client.partition_of("127.0.0.1"), Request("http://127.0.0.1/"))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/child", meta={PARENT_META: mine}))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/other",
                                             meta={PARENT_META: "0:9@127.0.0.1"}))
    assert list(client.acks.children) == [mine]
    payloads = [a[3] for batch in client.outbox for a in batch.adds]
    assert len(payloads) == 2
    assert all(PARENT_META not in json.loads(unwrap(p)).get("meta", {}) for p in payloads)
    assert sum(len(s.unsent_orphans) for s in client.parts) == 1     # the one not ours
