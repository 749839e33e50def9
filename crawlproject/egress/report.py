"""What happens to a request the address policy refused: counted, logged once per
host, dead-lettered with its reason, never retried and never silently dropped.

:func:`refuse` is the one way every component (the egress and retry
middlewares, the impersonating and rendering handlers) gives a refused request
up: with :class:`~crawlproject.scheduler.RedisScheduler` it is dead-lettered
(``scheduler.mark_failed``) with the reason, e.g. ``address_refused: 127.0.0.1
is loopback (DOWNLOAD_ALLOWED_NETWORKS)``; with another scheduler it is
ignored. Either way the exception raised is :class:`AddressRefused`, an
``IgnoreRequest``: no retry middleware retries it.
"""

from __future__ import annotations

import logging
import weakref
from urllib.parse import urlsplit

from scrapy.exceptions import CannotResolveHostError, IgnoreRequest
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.error import DNSLookupError
from w3lib.url import add_http_if_no_scheme

from crawlproject.egress.policy import Refusal
from crawlproject.scheduling.errback import dead_letter

logger = logging.getLogger(__name__)

#: Hosts named in a WARNING (the others are counted only); bounded.
MAX_WARNED = 10_000
#: What a connection error of a refused host looks like to the download handlers.
DNS_ERRORS = (DNSLookupError, CannotResolveHostError)


class AddressRefused(IgnoreRequest):
    """The address a request would connect to is refused by ``DOWNLOAD_ALLOWED_NETWORKS``."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.reason)
        self.refusal = refusal


class EgressReport:
    """A crawler's stats and log lines of refused connections."""

    def __init__(self, crawler):
        self.crawler = crawler
        self._warned: set[str] = set()

    def refused(self, request, refusal: Refusal) -> None:
        """Count *request*'s refusal (``egress/refused``, ``egress/refused/<group>``)."""
        stats = self.crawler.stats
        stats.inc_value("egress/refused")
        stats.inc_value(f"egress/refused/{refusal.group}")
        self._warn(refusal, "%s refused: %s; given up (dead-lettered by the shared frontier), "
                   "never retried; more are counted in egress/refused", request.url)

    def browser_refused(self, refusal: Refusal) -> None:
        """A request of the browser (a page's resource) was refused."""
        stats = self.crawler.stats
        stats.inc_value("egress/browser_refused")
        stats.inc_value(f"egress/browser_refused/{refusal.group}")
        self._warn(refusal, "Browser request to %s refused: %s (counted in "
                   "egress/browser_refused)", refusal.host)

    def resolver_refused(self, refusal: Refusal) -> None:
        """The guard found only refused addresses for a connection."""
        self._warn(refusal, "Connection to %s refused: %s", refusal.host)

    def _warn(self, refusal: Refusal, message: str, what: str) -> None:
        if refusal.host in self._warned or len(self._warned) >= MAX_WARNED:
            return
        self._warned.add(refusal.host)
        logger.warning(message, what, refusal.reason, extra={"spider": self.crawler.spider})


_REPORTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def report_for(crawler) -> EgressReport:
    """*crawler*'s :class:`EgressReport` (one per crawler)."""
    report = _REPORTS.get(crawler)
    if report is None:
        report = _REPORTS[crawler] = EgressReport(crawler)
    return report


def refuse(crawler, request, refusal: Refusal) -> AddressRefused:
    """Count, log and dead-letter *request*; the exception to raise for it."""
    report_for(crawler).refused(request, refusal)
    dead_letter(crawler, request, refusal.reason)
    return AddressRefused(refusal)


def connection_endpoint(request) -> tuple[str, int]:
    """``(host, port)`` the downloader connects to for *request*: its proxy, or its URL."""
    proxy = request.meta.get("proxy")
    if proxy:
        parts = urlsplit(add_http_if_no_scheme(proxy))
        default = 443 if parts.scheme == "https" else 80
    else:
        parts = urlparse_cached(request)
        default = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default
    except ValueError:
        port = default
    return parts.hostname or "", port
