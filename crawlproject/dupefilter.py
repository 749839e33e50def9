"""RedisBloomDupeFilter: the shared Bloom filter as a plain ``DUPEFILTER_CLASS``.

For people who keep scrapy-redis' scheduler (or Scrapy's own): the same
scalable, sharded filter as :class:`~crawlproject.scheduler.RedisScheduler`
uses, one Lua call per check-and-add, fingerprints from Scrapy's configured
``REQUEST_FINGERPRINTER_CLASS``. (With ``RedisScheduler`` you do not need it:
there the dedupe happens inside the enqueue call, for whole batches.)

It connects like scrapy-redis does (:func:`~crawlproject.connection.redis_from_settings`:
``REDIS_URL`` setting, then the ``REDIS_URL`` environment variable, then
``REDIS_HOST``/``REDIS_PORT``, plus ``REDIS_PARAMS`` and ``REDIS_CLUSTER``).
Its key is ``SCHEDULER_DUPEFILTER_KEY`` when set (scrapy-redis' name), else
``DUPEFILTER_KEY``, else :data:`crawlproject.keys.DUPEFILTER`
(``"{%(spider)s}:dupefilter"``). Other settings: ``DUPEFILTER_CAPACITY``,
``DUPEFILTER_ERROR_RATE``, ``DUPEFILTER_DEBUG``.
"""

from __future__ import annotations

import logging

from scrapy.dupefilters import BaseDupeFilter

from crawlproject import keys
from crawlproject.connection import (is_cluster_url, redis_cluster_from_settings,
                                     redis_from_settings, redis_url_from_settings)
from crawlproject.defaults import setting
from crawlproject.frontier.bloom import BloomConfig, BloomFilter
from crawlproject.urls import UrlCanonicalizer, canonicalizer_for

logger = logging.getLogger(__name__)


def dupefilter_key(settings, spider_name: str) -> str:
    """The filter's meta key for *spider_name*, from the first of
    ``SCHEDULER_DUPEFILTER_KEY`` and ``DUPEFILTER_KEY`` that is set.

    Raises ``ValueError`` on a Redis Cluster for a key without a hash tag: its
    shards (``<key>:<layer>:<shard>``) would hash to other slots than the key.
    """
    name = "SCHEDULER_DUPEFILTER_KEY" if setting(settings, "SCHEDULER_DUPEFILTER_KEY") \
        else "DUPEFILTER_KEY"
    pattern = setting(settings, name)
    if "%(spider)s" not in pattern and "%(timestamp)s" in pattern:
        pattern = keys.DUPEFILTER  # scrapy-redis' throwaway standalone default
    key = pattern % {"spider": spider_name}
    cluster = is_cluster_url(redis_url_from_settings(settings), redis_cluster_from_settings(settings))
    if cluster and not keys.has_hash_tag(key):
        raise ValueError(
            f"{name} = {pattern!r} has no hash tag: on a Redis Cluster the dupefilter's "
            f"shards would land in other slots than {key!r}. Use a key such as "
            f"'{{%(spider)s}}:dupefilter'.")
    return key


class RedisBloomDupeFilter(BaseDupeFilter):
    """Request dedupe in a Redis Bloom filter shared by every node."""

    def __init__(self, client, key: str, config: BloomConfig, fingerprinter,
                 debug: bool = False, stats=None, urls: UrlCanonicalizer | None = None):
        self.filter = BloomFilter(client, key, config)
        self.fingerprinter = fingerprinter
        #: the URL's canonical form is what is seen (crawlproject/urls.py): another
        #: scheduler fetches the URL as given, but a page is one entry
        self.urls = urls or UrlCanonicalizer()
        self.debug = debug
        self.stats = stats
        self._logged_dupe = False

    @classmethod
    def from_crawler(cls, crawler):
        """Constructor Scrapy's scheduler calls."""
        name = crawler.spider.name if crawler.spider is not None else crawler.spidercls.name
        return cls._build(crawler, name)

    @classmethod
    def from_spider(cls, spider):
        """Constructor scrapy-redis' scheduler calls (the spider's own name
        counts: scrapy-redis does not set ``crawler.spider`` first)."""
        return cls._build(spider.crawler, spider.name)

    @classmethod
    def _build(cls, crawler, spider_name: str):
        s = crawler.settings
        key = dupefilter_key(s, spider_name)
        return cls(redis_from_settings(s), key, BloomConfig.from_settings(s),
                   crawler.request_fingerprinter, s.getbool("DUPEFILTER_DEBUG"), crawler.stats,
                   canonicalizer_for(crawler))

    def request_seen(self, request) -> bool:
        canonical = self.urls.canonical(request).url
        if canonical != request.url:
            request = request.replace(url=canonical)
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
