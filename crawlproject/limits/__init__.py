"""Limits on what one response may cost a node: body, decompressed body, headers.

Scrapy bounds the body on the wire (``DOWNLOAD_MAXSIZE``, per request
``meta["download_maxsize"]``), the decompressed body while it decompresses
(``HttpCompressionMiddleware``) and the whole download in time
(``DOWNLOAD_TIMEOUT``, a deadline, not an idle timeout); this package adds what
it lacks:

* :mod:`~crawlproject.limits.headers`: ``DOWNLOAD_HEADERS_MAXSIZE`` and
  ``DOWNLOAD_HEADERS_MAXCOUNT`` for Scrapy's own HTTP/1.1 client (Twisted has
  no bound on the header section: a site sending header lines for ever takes
  the node's memory until the download times out);
* :mod:`~crawlproject.limits.compression`: Scrapy's decompression, with a stat,
  a log line once per site and a dead letter for a page refused as too large
  once decompressed (Scrapy only logs and ignores it);
* :class:`LimitReport`: how each refusal is told (``limits/<reason>`` stat, a
  WARNING once per site and reason).

The impersonating handler (:mod:`crawlproject.impersonate.handler`) and the
rendering handler (:mod:`crawlproject.rendering.addon`) apply the same limits
(docs/middlewares.md, "Download limits").
"""

from __future__ import annotations

import logging
import weakref

from scrapy.utils.httpobj import urlparse_cached

from crawlproject.scheduling.errback import dead_letter

logger = logging.getLogger(__name__)


class LimitReport:
    """Counts each refusal in ``limits/<reason>`` and logs it at WARNING once per
    site and reason (a hostile site would otherwise flood the log)."""

    MAX_TOLD = 10_000

    def __init__(self, crawler):
        self.crawler = crawler
        self._told: set[tuple[str, str]] = set()

    def refused(self, request, reason: str, message: str = "", *args) -> None:
        """Count and (once per site and *reason*) log a refusal of *request*; no
        *message*: counted only (Scrapy logged it already)."""
        self.crawler.stats.inc_value(f"limits/{reason}")
        if not message:
            return
        site = urlparse_cached(request).netloc
        if (site, reason) in self._told:
            return
        if len(self._told) >= self.MAX_TOLD:
            self._told.clear()
        self._told.add((site, reason))
        logger.warning(message + " (further refusals of this site for this reason are "
                       "counted in limits/%s, not logged)", *args, reason,
                       extra={"spider": self.crawler.spider})

    def dead_letter(self, request, reason: str) -> None:
        """Dead-letter *request* with *reason* when it leaves the engine (a refusal
        raised as ``IgnoreRequest`` would otherwise be taken for done)."""
        dead_letter(self.crawler, request, reason)


_REPORTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def report_for(crawler) -> LimitReport:
    """*crawler*'s :class:`LimitReport` (one per crawler, shared by handlers and middlewares)."""
    report = _REPORTS.get(crawler)
    if report is None:
        report = _REPORTS[crawler] = LimitReport(crawler)
    return report
