"""RedisBloomDupeFilter as a plain DUPEFILTER_CLASS under scrapy-redis' scheduler."""

import hashlib
from unittest import TestCase, mock

import pytest
import redis as redis_lib
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from scrapy_redis.scheduler import Scheduler
from w3lib.url import url_query_cleaner

from crawlproject.dupefilter import RedisBloomDupeFilter


class QueryBlindFingerprinter:
    """Treats URLs that differ only in their query string as the same page."""

    def fingerprint(self, request):
        return hashlib.sha1(url_query_cleaner(request.url, ()).encode()).digest()


class ShopSpider(Spider):
    name = "shop"


def make_scheduler(redis_url, **extra):
    settings = {
        "REDIS_URL": redis_url,
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "crawlproject.dupefilter.RedisBloomDupeFilter",
        "SCHEDULER_SERIALIZER": "crawlproject.serialization",
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.FifoQueue",
        "DUPEFILTER_CAPACITY": 1000,
        **extra,
    }
    crawler = get_crawler(ShopSpider, settings)
    spider = ShopSpider.from_crawler(crawler)
    crawler.spider = spider
    scheduler = Scheduler.from_crawler(crawler)
    scheduler.open(spider)
    return scheduler, spider


def test_scrapy_redis_scheduler_with_bloom_dupefilter(redis, redis_url):
    scheduler, _ = make_scheduler(redis_url)
    assert isinstance(scheduler.df, RedisBloomDupeFilter)
    assert scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    assert not scheduler.enqueue_request(Request("http://127.0.0.1/a"))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/a", dont_filter=True))
    assert scheduler.enqueue_request(Request("http://127.0.0.1/b"))
    assert redis.exists("{shop}:dupefilter")
    urls = [scheduler.next_request().url for _ in range(3)]
    assert urls == ["http://127.0.0.1/a", "http://127.0.0.1/a", "http://127.0.0.1/b"]
    # Two nodes share the filter.
    other, _ = make_scheduler(redis_url)
    assert not other.enqueue_request(Request("http://127.0.0.1/b"))


def test_uses_the_configured_request_fingerprinter(redis, redis_url):
    scheduler, _ = make_scheduler(
        redis_url, REQUEST_FINGERPRINTER_CLASS="tests.test_dupefilter.QueryBlindFingerprinter")
    assert scheduler.enqueue_request(Request("http://127.0.0.1/p?utm=1"))
    assert not scheduler.enqueue_request(Request("http://127.0.0.1/p?utm=2"))


def filter_for(settings, spider_name="shop"):
    """The dupefilter scrapy-redis' scheduler would build for a spider."""
    crawler = get_crawler(ShopSpider, settings)
    spider = crawler._create_spider(name=spider_name)
    return RedisBloomDupeFilter.from_spider(spider)


def test_key_is_scheduler_dupefilter_key_then_dupefilter_key(redis, redis_server):
    base = {"REDIS_HOST": redis_server.host, "REDIS_PORT": redis_server.port,
            "DUPEFILTER_CAPACITY": 1000}
    df = filter_for({**base, "SCHEDULER_DUPEFILTER_KEY": "sr:%(spider)s:dupefilter",
                     "DUPEFILTER_KEY": "ignored:%(spider)s"}, spider_name="books")
    assert df.filter.meta_key == "sr:books:dupefilter"
    assert not df.request_seen(Request("http://127.0.0.1/a"))
    assert redis.exists("sr:books:dupefilter", "sr:books:dupefilter:0:0") == 2
    assert filter_for({**base, "DUPEFILTER_KEY": "df:%(spider)s"}).filter.meta_key == "df:shop"
    assert filter_for(base, spider_name="books").filter.meta_key == "{books}:dupefilter"


def test_a_key_without_hash_tag_is_refused_on_a_cluster():
    settings = {"REDIS_CLUSTER": True, "SCHEDULER_DUPEFILTER_KEY": "%(spider)s:dupefilter"}
    with pytest.raises(ValueError, match="SCHEDULER_DUPEFILTER_KEY"):
        filter_for(settings)
    with pytest.raises(ValueError, match="DUPEFILTER_KEY"):
        filter_for({"REDIS_URL": "redis://127.0.0.1:1/0?cluster=true",
                    "DUPEFILTER_KEY": "dupefilter:%(spider)s"})


def test_redis_url_environment_variable_is_honoured(redis, redis_url, monkeypatch):
    monkeypatch.setenv("REDIS_URL", redis_url)
    df = filter_for({"DUPEFILTER_CAPACITY": 1000})
    assert not df.request_seen(Request("http://127.0.0.1/a"))
    assert df.request_seen(Request("http://127.0.0.1/a"))
    assert redis.exists("{shop}:dupefilter")
    # The REDIS_URL setting still wins over the environment.
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert filter_for({"REDIS_URL": redis_url}).request_seen(Request("http://127.0.0.1/a"))


# ---------------------------------------------------------------------------
# scrapy-redis' own scheduler tests, run with our dupefilter.
# Vendored from rmax/scrapy-redis, tests/test_scrapy_redis.py (SchedulerTest,
# commit d34e9af), MIT licence, Copyright (c) 2011-2024 R Max Espinoza.
# Changed only: DUPEFILTER_CLASS is ours, the serializer is crawlproject's
# pickle-free one, and REDIS_HOST/REDIS_PORT are the test Redis' (a fixture).


def get_spider(*args, **kwargs):
    crawler = get_crawler(
        spidercls=kwargs.pop("spidercls", None),
        settings_dict=kwargs.pop("settings_dict", None),
    )
    return crawler._create_spider(*args, **kwargs)


class RedisTestMixin:

    @property
    def server(self):
        if not hasattr(self, "_redis"):
            self._redis = redis_lib.Redis(self.REDIS_HOST, self.REDIS_PORT)
        return self._redis

    def clear_keys(self, prefix):
        keys = self.server.keys(prefix + "*")
        if keys:
            self.server.delete(*keys)


class SchedulerTest(RedisTestMixin, TestCase):

    @pytest.fixture(autouse=True)
    def _test_redis(self, redis_server):
        self.REDIS_HOST, self.REDIS_PORT = redis_server.host, redis_server.port

    def setUp(self):
        self.key_prefix = "scrapy_redis:tests:"
        self.queue_key = self.key_prefix + "%(spider)s:requests"
        self.dupefilter_key = self.key_prefix + "%(spider)s:dupefilter"
        self.spider = get_spider(
            name="myspider",
            settings_dict={
                "REDIS_HOST": self.REDIS_HOST,
                "REDIS_PORT": self.REDIS_PORT,
                "SCHEDULER_QUEUE_KEY": self.queue_key,
                "SCHEDULER_DUPEFILTER_KEY": self.dupefilter_key,
                "SCHEDULER_FLUSH_ON_START": False,
                "SCHEDULER_PERSIST": False,
                "SCHEDULER_SERIALIZER": "crawlproject.serialization",
                "DUPEFILTER_CLASS": "crawlproject.dupefilter.RedisBloomDupeFilter",
            },
        )
        self.scheduler = Scheduler.from_crawler(self.spider.crawler)

    def tearDown(self):
        self.clear_keys(self.key_prefix)

    def test_scheduler(self):
        # default no persist
        self.assertFalse(self.scheduler.persist)

        self.scheduler.open(self.spider)
        self.assertEqual(len(self.scheduler), 0)

        req = Request("http://example.com")
        self.scheduler.enqueue_request(req)
        self.assertTrue(self.scheduler.has_pending_requests())
        self.assertEqual(len(self.scheduler), 1)

        # dupefilter in action
        self.scheduler.enqueue_request(req)
        self.assertEqual(len(self.scheduler), 1)

        out = self.scheduler.next_request()
        self.assertEqual(out.url, req.url)

        self.assertFalse(self.scheduler.has_pending_requests())
        self.assertEqual(len(self.scheduler), 0)

        self.scheduler.close("finish")

    def test_scheduler_persistent(self):
        # TODO: Improve this test to avoid the need to check for log messages.
        self.spider.log = mock.Mock(spec=self.spider.log)

        self.scheduler.persist = True
        self.scheduler.open(self.spider)

        self.assertEqual(self.spider.log.call_count, 0)

        self.scheduler.enqueue_request(Request("http://example.com/page1"))
        self.scheduler.enqueue_request(Request("http://example.com/page2"))

        self.assertTrue(self.scheduler.has_pending_requests())
        self.scheduler.close("finish")

        self.scheduler.open(self.spider)
        self.spider.log.assert_has_calls(
            [
                mock.call("Resuming crawl (2 requests scheduled)"),
            ]
        )
        self.assertEqual(len(self.scheduler), 2)

        self.scheduler.persist = False
        self.scheduler.close("finish")

        self.assertEqual(len(self.scheduler), 0)
