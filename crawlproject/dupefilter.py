"""RedisBloomDupeFilter: the shared Bloom filter as a plain ``DUPEFILTER_CLASS``.

For people who keep scrapy-redis' scheduler (or Scrapy's own): the same
scalable, sharded filter as :class:`~crawlproject.scheduler.RedisScheduler`
uses, one Lua call per check-and-add, fingerprints from Scrapy's configured
``REQUEST_FINGERPRINTER_CLASS``. (With ``RedisScheduler`` you do not need it:
there the dedupe happens inside the enqueue call, for whole batches.)

Settings: ``DUPEFILTER_KEY`` (default ``"{%(spider)s}:dupefilter"``),
``DUPEFILTER_CAPACITY``, ``DUPEFILTER_ERROR_RATE``, ``DUPEFILTER_DEBUG``.
"""

from __future__ import annotations

import logging

from scrapy.dupefilters import BaseDupeFilter

from crawlproject.connection import redis_from_settings
from crawlproject.frontier.bloom import BloomConfig, BloomFilter

logger = logging.getLogger(__name__)


class RedisBloomDupeFilter(BaseDupeFilter):
    """Request dedupe in a Redis Bloom filter shared by every node."""

    def __init__(self, client, key: str, config: BloomConfig, fingerprinter,
                 debug: bool = False, stats=None):
        self.filter = BloomFilter(client, key, config)
        self.fingerprinter = fingerprinter
        self.debug = debug
        self.stats = stats
        self._logged_dupe = False

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        name = crawler.spider.name if crawler.spider is not None else crawler.spidercls.name
        key = s.get("DUPEFILTER_KEY") or "{%(spider)s}:dupefilter"
        if "%(spider)s" not in key and "%(timestamp)s" in key:
            key = "{%(spider)s}:dupefilter"  # scrapy-redis' throwaway default
        return cls(redis_from_settings(s), key % {"spider": name}, BloomConfig.from_settings(s),
                   crawler.request_fingerprinter, s.getbool("DUPEFILTER_DEBUG"), crawler.stats)

    @classmethod
    def from_spider(cls, spider):
        """Constructor scrapy-redis' scheduler calls."""
        return cls.from_crawler(spider.crawler)

    def request_seen(self, request) -> bool:
        return not self.filter.add(self.fingerprinter.fingerprint(request))

    def clear(self) -> None:
        """Delete the filter (scrapy-redis calls this when it flushes)."""
        self.filter.clear()

    def close(self, reason: str = "") -> None:
        est = self.filter.estimates()
        if self.stats is not None and est["layers"]:
            self.stats.set_value("bloom/fill_ratio", round(est["fill_ratio"], 6))
            self.stats.set_value("bloom/est_fp_rate", est["est_fp_rate"])

    def log(self, request, spider=None) -> None:
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request})
        elif not self._logged_dupe:
            logger.debug("Filtered duplicate request %(request)s - no more duplicates will be "
                         "shown (see DUPEFILTER_DEBUG to show all duplicates)", {"request": request})
            self._logged_dupe = True
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")
