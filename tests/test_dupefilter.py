"""RedisBloomDupeFilter as a plain DUPEFILTER_CLASS under scrapy-redis' scheduler."""

import hashlib

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler
from scrapy_redis.scheduler import Scheduler as ScrapyRedisScheduler
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
    scheduler = ScrapyRedisScheduler.from_crawler(crawler)
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
