"""FrontierPolitenessMiddleware: what a site says about its load reaches every node.

A response whose status is in ``FRONTIER_BACKOFF_HTTP_CODES`` (429 and 503 by
default) tells the shared frontier to slow that site's politeness key down for
every node: with a ``Retry-After`` header (seconds or an HTTP date) the key is
blocked that long (at most ``FRONTIER_RETRY_AFTER_MAX``); without it, the answer
counts towards the key's recent error rate, and only a rate over
``FRONTIER_BACKOFF_TOLERANCE`` doubles its interval (at most
``FRONTIER_BACKOFF_MAX``); successes relax it again. The response itself goes on to the retry middleware as usual.

Put it above :class:`~crawlproject.middlewares.retry.BackoffRetryMiddleware`
(550) so that it sees responses before they are turned into retries (the
project uses 560). Switched off with ``FRONTIER_POLITENESS = False``; does
nothing with a scheduler other than :class:`~crawlproject.scheduler.RedisScheduler`.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from scrapy.exceptions import NotConfigured

from crawlproject.scheduling.sitepoliteness import SitePoliteness


def retry_after_seconds(value: bytes | str | None, now: datetime | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks for, or None when absent or unreadable."""
    if not value:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


class FrontierPolitenessMiddleware:
    """Report slow-down answers (see the module docstring)."""

    def __init__(self, crawler, codes: frozenset[int]):
        self.crawler = crawler
        self.codes = codes

    @classmethod
    def from_crawler(cls, crawler):
        config = SitePoliteness.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        return cls(crawler, config.backoff_codes)

    def process_response(self, request, response, spider=None):
        if response.status in self.codes:
            scheduler = getattr(self.crawler.engine, "scheduler", None)
            slow_down = getattr(scheduler, "slow_down", None)
            if slow_down is not None:
                slow_down(request, retry_after_seconds(response.headers.get(b"Retry-After")))
        return response
