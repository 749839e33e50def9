"""scrapy-redis' settings and hooks in a project that moved to RedisScheduler
(crawlproject/scheduling/compat.py, crawlproject/seeds.py): each honoured, or
refused with a message that says what to use instead."""

import json
import logging

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import DontCloseSpider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from crawlproject.policy import InputPolicy
from crawlproject.scheduler import RedisScheduler
from crawlproject.scheduling.compat import idle_before_close, scrapy_redis_notes
from crawlproject.seeds import InvalidSeed, request_from_seed
from crawlproject.spiders import RedisSpider


def notes(**settings):
    return {level: [m for lv, m in scrapy_redis_notes(Settings(settings)) if lv == level]
            for level in (logging.WARNING, logging.INFO)}


def test_what_the_frontier_does_anyway_is_silent():
    assert notes(SCHEDULER_PERSIST=True) == {logging.WARNING: [], logging.INFO: []}
    assert notes() == {logging.WARNING: [], logging.INFO: []}


@pytest.mark.parametrize("settings, says", [
    ({"SCHEDULER_PERSIST": False}, "crawlproject.cli reset SPIDER --yes --keep-seeds"),
    ({"SCHEDULER_FLUSH_ON_START": True}, "crawlproject.cli reset SPIDER --yes --keep-seeds"),
    ({"SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.SpiderStack"}, "DEPTH_PRIORITY"),
    ({"SCHEDULER_QUEUE_KEY": "%(spider)s:requests"}, "DEPTH_PRIORITY"),
    ({"SCHEDULER_SERIALIZER": "pickle"}, "never pickle"),
])
def test_what_is_refused_says_what_to_use_instead(settings, says):
    got = notes(**settings)
    assert len(got[logging.WARNING]) == 1 and says in got[logging.WARNING][0]


def test_scrapy_redis_dupefilter_settings_are_named_as_unused():
    got = notes(DUPEFILTER_CLASS="scrapy_redis.dupefilter.RFPDupeFilter",
                SCHEDULER_DUPEFILTER_KEY="%(spider)s:dupefilter")
    assert len(got[logging.INFO]) == 2 and not got[logging.WARNING]
    assert not notes(DUPEFILTER_CLASS="scrapy.dupefilters.RFPDupeFilter")[logging.INFO]


class Plain(Spider):
    name = "plain"


def test_idle_before_close_holds_a_done_node_that_long(redis_url):
    assert idle_before_close(Settings({"SCHEDULER_IDLE_BEFORE_CLOSE": "2.5"})) == 2.5
    crawler = get_crawler(Plain, {"REDIS_URL": redis_url, "SCHEDULER_IDLE_BEFORE_CLOSE": 30})
    crawler.spider = Plain.from_crawler(crawler)
    scheduler = RedisScheduler.from_crawler(crawler)
    scheduler.setup(crawler.spider)
    scheduler.start_state.held = None
    control = scheduler.node_control
    control.nudge = lambda: None

    async def check():
        with pytest.raises(DontCloseSpider):
            control.on_spider_idle()             # done just now: wait
        control.done_since -= 31
        control.on_spider_idle()                 # done for longer than the wait: close
    import asyncio
    asyncio.run(check())
    control.idle_before_close = 0
    control.on_spider_idle()                     # no wait set: close at once


class FromData(RedisSpider):
    """A spider moved from scrapy-redis that kept its make_request_from_data."""
    name = "fromdata"

    def make_request_from_data(self, data):
        fields = json.loads(data)
        if "url" not in fields:
            return []                            # scrapy-redis' answer for no URL
        return Request(fields["url"], method="POST", body=fields.get("q", "").encode(),
                       callback=self._parse_result, meta={"job": fields.get("job")})

    def _parse_result(self, response):
        pass


def test_make_request_from_data_makes_a_seeds_request():
    spider = FromData()
    policy = InputPolicy.from_settings(Settings(), FromData)
    request = request_from_seed(b'{"url": "http://127.0.0.1/s", "q": "x", "job": 7}', spider,
                                policy)
    # The spider's own code made it: its private callback, POST and meta stand.
    assert (request.method, request.body, request.meta) == ("POST", b"x", {"job": 7})
    assert request.callback == spider._parse_result
    with pytest.raises(InvalidSeed) as info:
        request_from_seed(b'{"job": 7}', spider, policy)
    assert info.value.code == "no_request"
    with pytest.raises(InvalidSeed) as info:
        request_from_seed(b"not json", spider, policy)      # its own error: a reason, no crash
    assert info.value.code == "error"
