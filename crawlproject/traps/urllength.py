"""Scrapy's ``UrlLengthMiddleware`` for links found on pages, said once per site.

Scrapy's own (``URLLENGTH_LIMIT = 2083``, on by default) logs every link it
drops at INFO, so a site whose links grow without end floods the log, and it
drops start requests too: a seed longer than the limit vanished with one INFO
line. This one drops only requests a callback yielded; seeds are pages someone
asked for (the seed policy refuses those over 8,192 characters, with a reason,
in ``<spider>:start_urls:invalid``). Same setting, same stat
(``urllength/request_ignored_count``); the first link dropped of a site is
said at INFO, the others at DEBUG; dropping many in a row lets the event loop turn
(:mod:`crawlproject.traps.pace`).
"""

from __future__ import annotations

import logging

from scrapy.spidermiddlewares import urllength

from crawlproject.traps.once import OncePerSite, site_of
from crawlproject.traps.pace import PacedFilter

logger = logging.getLogger(__name__)


class UrlLengthMiddleware(PacedFilter, urllength.UrlLengthMiddleware):
    """Spider middleware: links longer than ``URLLENGTH_LIMIT`` are dropped, counted."""

    @classmethod
    def from_crawler(cls, crawler):
        middleware = super().from_crawler(crawler)   # NotConfigured with URLLENGTH_LIMIT = 0
        middleware.said = OncePerSite()
        return middleware

    def get_processed_request(self, request, response):
        if response is None or len(request.url) <= self.maxlength:
            return request   # a start request or seed: asked for, not found on a page
        self.crawler.stats.inc_value("urllength/request_ignored_count")
        site = site_of(response)
        if self.said.first("urllength", site):
            logger.info("Dropping links of %s longer than URLLENGTH_LIMIT (%d characters), "
                        "e.g. %s... from %s (said once per site; counted in "
                        "urllength/request_ignored_count)", site, self.maxlength,
                        request.url[:200], response.url[:200],
                        extra={"spider": self.crawler.spider})
        else:
            logger.debug("Dropped a link longer than %d characters: %s...", self.maxlength,
                         request.url[:200], extra={"spider": self.crawler.spider})
        return None
