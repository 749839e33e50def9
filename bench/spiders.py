"""The three benchmark spiders: one parse implementation, three schedulers.

* ``bench_ours``: crawlproject's :class:`~crawlproject.spiders.seeded.RedisSpider`
  on :class:`~crawlproject.scheduler.RedisScheduler` (project defaults).
* ``bench_scrapy_redis``: scrapy-redis 0.9.1 as documented: its ``RedisSpider``,
  ``Scheduler``, ``RFPDupeFilter`` (a Redis SET), ``PriorityQueue`` and the
  default pickle serializer.
* ``bench_plain``: a plain single-process Scrapy spider (in-memory scheduler
  and dupefilter), URLs from ``start_urls``.

Every spider parses the demo site (:mod:`devtools.demo.site`) the same way:
listing pages → product pages → one dict item per product, following the
"next" listing link (priority 10, so that no scheduler's ordering starves the
crawl) and, unless ``-a follow=0``, the related-product links (many
duplicates). ``data-render="js"`` links are followed as normal links: no
Playwright. Spider arguments: ``follow`` (1/0); ``bench_plain`` also takes
``start_url`` or ``seeds_file`` (one URL a line).

The politeness benchmark (:mod:`bench.polite`) crawls the multi-host site
(:mod:`devtools.demo.hosts`) with the same three schedulers:
``bench_hosts_ours``, ``bench_hosts_scrapy_redis`` and ``bench_hosts_plain``
(:class:`HostsParse`); ``bench_hosts_readme`` runs the same parse on the
README's settings block (:mod:`bench.readme_settings`, used by
:mod:`bench.backoff` and :mod:`bench.product`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy_redis.spiders import RedisSpider as ScrapyRedisRedisSpider

import crawlproject.settings as project_settings
from crawlproject.spiders.seeded import RedisSpider as OurRedisSpider

LISTING_PRIORITY = 10

# Our production configuration, as crawlproject/settings.py sets it: the
# scheduler, its retry middleware and every frontier / dupefilter / seed setting.
_OURS_PREFIXES = ("SCHEDULER", "DUPEFILTER_", "SEEDS_", "REDIS_START_URLS_", "RETRY_",
                  "CALLBACK_RETRY_", "DOWNLOADER_MIDDLEWARES")


def _ours_settings() -> dict:
    settings = {name: getattr(project_settings, name) for name in dir(project_settings)
                if name.isupper() and name.startswith(_OURS_PREFIXES)}
    # Like plain Scrapy: its default User-Agent, no browser (no rendering
    # add-on here). bench.middlewares measures the identity, referer and proxy
    # middlewares on and off.
    settings.update(IDENTITY_ENABLED=False, RENDERING_ENABLED=False)
    return settings


class BenchParse:
    """The parse implementation shared by the three spiders."""

    follow = "1"

    def parse(self, response):
        if "/product/" in response.url:
            yield from self.parse_product(response)
            return
        for href in response.css("a.product::attr(href)").getall():
            yield Request(response.urljoin(href), callback=self.parse_product)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield Request(response.urljoin(next_page), callback=self.parse,
                          priority=LISTING_PRIORITY)

    def parse_product(self, response):
        yield {
            "url": response.url,
            "title": " ".join(" ".join(response.css(".title ::text").getall()).split()),
            "price": (response.css(".price::text").get() or "").strip(),
            "published": (response.css(".published::text").get() or "").strip(),
        }
        if str(self.follow) not in ("0", "false", "False", "no"):
            for href in response.css("a.related::attr(href)").getall():
                yield Request(response.urljoin(href), callback=self.parse_product)


class OursSpider(BenchParse, OurRedisSpider):
    name = "bench_ours"
    custom_settings = _ours_settings()
    # 2 s lets a second node wait for work; 1-node runs use 1 s (bench.common).
    custom_settings["MAX_IDLE_TIME_BEFORE_CLOSE"] = 2


class RecrawlBenchSpider(BenchParse, OurRedisSpider):
    """``bench_ours`` storing its items and page records in MongoDB, with the
    recrawl components (bench.recrawl turns them on with ``RECRAWL_ENABLED``)."""

    name = "bench_recrawl"
    custom_settings = {
        **_ours_settings(), "MAX_IDLE_TIME_BEFORE_CLOSE": 2, "MONGO_PIPELINE_ENABLED": True,
        "ITEM_PIPELINES": {"crawlproject.pipelines.mongo.MongoPipeline": 800},
        "SPIDER_MIDDLEWARES": {"crawlproject.recrawl.middleware.RecrawlSpiderMiddleware": 950},
        "EXTENSIONS": {"bench.recorder.BenchRecorder": 0,
                       "crawlproject.recrawl.extension.RecrawlFeeder": 510},
    }


class ScrapyRedisSpider(BenchParse, ScrapyRedisRedisSpider):
    name = "bench_scrapy_redis"
    custom_settings = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
        # Keep the shared queue and dupefilter when the first node closes
        # (the documented setting for several nodes); Redis is flushed per run.
        "SCHEDULER_PERSIST": True,
        "SCHEDULER_IDLE_BEFORE_CLOSE": 0,
        # Its idle close counts from a class attribute set at import time;
        # runs of several nodes use 5 s (one engine heartbeat) so that a
        # second node does not close before work reaches it (bench.common).
        "MAX_IDLE_TIME_BEFORE_CLOSE": 1,
    }


class PlainSpider(BenchParse, Spider):
    name = "bench_plain"
    custom_settings = {
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter",
    }

    def __init__(self, *args, start_url: str | None = None, seeds_file: str | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        urls = [start_url] if start_url else []
        if seeds_file:
            with open(seeds_file) as f:
                urls += [line.strip() for line in f if line.strip()]
        self.start_urls = urls


class HostsParse:
    """The parse of the multi-host site shared by the politeness spiders: one
    item per page (``/p/N``); listing, "next" and page links followed (all
    relative, so on the same host), "next" first so no scheduler starves a
    host's listing chain."""

    def parse(self, response):
        parts = urlsplit(response.url)
        if parts.path.startswith("/p/"):
            yield {"url": response.url, "host": parts.hostname}
        for href in response.css("a.page::attr(href), a.link::attr(href)").getall():
            yield Request(response.urljoin(href), callback=self.parse)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield Request(response.urljoin(next_page), callback=self.parse,
                          priority=LISTING_PRIORITY)


class OursHostsSpider(HostsParse, OursSpider):
    name = "bench_hosts_ours"


class ScrapyRedisHostsSpider(HostsParse, ScrapyRedisSpider):
    name = "bench_hosts_scrapy_redis"


class PlainHostsSpider(HostsParse, PlainSpider):
    name = "bench_hosts_plain"


class ReadmeHostsSpider(HostsParse, OurRedisSpider):
    """The multi-host parse on the README block's settings (``bench.readme_settings``):
    no settings of its own but the idle close (2 s, as ``bench_ours``), so that
    the scheduler, middlewares and pipelines are the block's."""

    name = "bench_hosts_readme"
    custom_settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 2}
