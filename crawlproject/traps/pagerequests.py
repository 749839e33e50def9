"""At most ``PAGE_REQUESTS_LIMIT`` requests added per response.

A page of 100,000 links (a site map of a whole shop, a generated trap) would
put 100,000 requests of one site into the frontier from one response: CPU of
the node for each (middlewares, fingerprint, signature, JSON), Redis memory for
each, and a frontier that then holds mostly that site. The first
``PAGE_REQUESTS_LIMIT`` requests a callback yields for one response go on; the
rest are dropped, counted (``traps/page_requests_dropped``, and the pages in
``traps/pages_over_limit``) and said once per site. Items are never held back:
the callback's whole output is read, only requests over the limit are left out.
Placed next to the spider (960, after meta robots), it drops what is over
before any other middleware spends work on it (Scrapy's referer policy alone
cost 80 µs a request: 100,000 requests held the chain 10 s, 90,000 dropped
first 1.4 s); dropping lets the event loop turn (:mod:`crawlproject.traps.pace`).

What it cannot shorten is the callback's own work before its first yield: a
``LinkExtractor`` extracts every link of the page at once (about 40 µs each,
docs/traps.md); the body-size limit bounds that.

A sitemap (Scrapy's ``SitemapSpider``) may list 50,000 URLs by its protocol:
its responses get at least :data:`SITEMAP_LIMIT`. A request may carry its own
limit for its response in ``meta["page_requests_limit"]`` (0: none).
"""

from __future__ import annotations

import logging
from typing import AsyncIterator

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.spiders import SitemapSpider

from crawlproject.defaults import setting
from crawlproject.traps.once import OncePerSite, site_of
from crawlproject.traps.pace import Pace

logger = logging.getLogger(__name__)

#: URLs a sitemap file may list (sitemaps.org protocol).
SITEMAP_LIMIT = 50_000
#: The request meta key that sets the limit for its own response.
LIMIT_META = "page_requests_limit"


class PageRequestsMiddleware:
    """Spider middleware: the requests of one response beyond the limit are dropped."""

    def __init__(self, crawler, limit: int):
        self.crawler = crawler
        self.limit = limit
        self.said = OncePerSite()

    @classmethod
    def from_crawler(cls, crawler):
        limit = setting(crawler.settings, "PAGE_REQUESTS_LIMIT")
        if limit <= 0:
            raise NotConfigured
        return cls(crawler, limit)

    def limit_for(self, response) -> int:
        """The most requests *response*'s callback may add (0: no limit)."""
        request = response.request
        meta = request.meta if request is not None else {}
        own = meta.get(LIMIT_META)
        if isinstance(own, int) and not isinstance(own, bool) and own >= 0:
            return own
        callback = getattr(request, "callback", None)
        if (getattr(callback, "__name__", "") == "_parse_sitemap"
                and isinstance(self.crawler.spider, SitemapSpider)):
            return max(self.limit, SITEMAP_LIMIT)
        return self.limit

    async def process_spider_output(self, response, result: AsyncIterator):
        limit = self.limit_for(response)
        requests, pace = 0, Pace()
        async for output in result:
            if isinstance(output, Request):
                requests += 1
                if limit and requests > limit:
                    await pace.dropped()   # the rest may still hold items: read on
                    continue
            yield output
        if limit and requests > limit:
            self._dropped(response, requests, limit)

    def _dropped(self, response, requests: int, limit: int) -> None:
        stats = self.crawler.stats
        stats.inc_value("traps/page_requests_dropped", requests - limit)
        stats.inc_value("traps/pages_over_limit")
        site = site_of(response)
        level = logging.INFO if self.said.first("page_requests", site) else logging.DEBUG
        logger.log(level, "%s yielded %d requests: the first %d were kept, %d dropped "
                   "(PAGE_REQUESTS_LIMIT; said once per site at INFO, counted in "
                   "traps/page_requests_dropped)", response.url[:200], requests, limit,
                   requests - limit, extra={"spider": self.crawler.spider})
