"""BackoffRetryMiddleware: Scrapy's retries, waiting out an exponential backoff.

A drop-in replacement for ``scrapy.downloadermiddlewares.retry.RetryMiddleware``
(same settings: ``RETRY_TIMES``, ``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS``,
``meta["dont_retry"]``...). With :class:`~crawlproject.scheduler.RedisScheduler`
the retry waits ``RETRY_BACKOFF_BASE * 2^(n-1)`` seconds (with jitter, at most
``RETRY_BACKOFF_MAX``) in the frontier's delayed set in Redis, not in node
memory, so any node may pick it up; when retries are exhausted the request is
dead-lettered with its reason and attempt count (see
:mod:`crawlproject.frontier.retrypolicy`).

A slow-down answer (429/503 that the frontier's politeness middleware reported,
``FRONTIER_BACKOFF_HTTP_CODES``) is retried without that wait: the frontier
paces the site for every node from its recent rate of such answers (and blocks
it for a ``Retry-After``), so a per-request wait on top would only hold this
page back — a listing page's retry would hold up every page it links to.

A body that did not come whole within ``DOWNLOAD_TIMEOUT`` although the
server had answered (its headers came: it drips bytes, or sends for ever) is
not retried either: another try would hold a slot of the site as long again,
for the same end (``retry/dripping``, dead-lettered with the reason). A
timeout before any answer is retried as Scrapy does.

A connection the address guard refused (``DOWNLOAD_ALLOWED_NETWORKS``,
:mod:`crawlproject.egress`) is never retried: dead-lettered with its reason.
"""

from __future__ import annotations

import weakref

from scrapy import Request, signals
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import DownloadTimeoutError

from crawlproject.egress.report import refuse
from crawlproject.egress.resolver import refusal_of
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META, SLOW_DOWN_META, RetryPolicy
from crawlproject.scheduling.errback import dead_letter


class BackoffRetryMiddleware(RetryMiddleware):
    """Retry with backoff through the shared frontier; dead-letter when exhausted."""

    @classmethod
    def from_crawler(cls, crawler):
        mw = super().from_crawler(crawler)
        mw.policy = RetryPolicy.from_settings(crawler.settings)
        #: downloads whose response headers came (the server answered)
        mw._answered = weakref.WeakSet()
        crawler.signals.connect(mw._headers_received, signal=signals.headers_received)
        return mw

    def _headers_received(self, headers, body_length, request, spider=None, **kwargs):
        self._answered.add(request)

    def process_exception(self, request: Request, exception, spider=None):
        # A host the address guard emptied looks like a DNS error, which Scrapy
        # retries: it is a refusal, given up at once with its reason (when
        # EgressMiddleware, 760, is not there to do it first).
        refusal = refusal_of(request, exception)
        if refusal is not None:
            raise refuse(self.crawler, request, refusal)
        if request in self._answered and _is_timeout(exception):
            return self._dripped(request, exception)
        return super().process_exception(request, exception)

    def _dripped(self, request: Request, exception) -> None:
        """The server answered, its body did not come within the deadline:
        given up now (the exception goes on to the errback)."""
        self.crawler.stats.inc_value("retry/dripping")
        dead_letter(self.crawler, request, f"the body did not come whole within the download "
                    f"deadline (DOWNLOAD_TIMEOUT), the server having answered: not retried "
                    f"({type(exception).__name__}: {exception})")
        return None

    def _retry(self, request: Request, reason) -> Request | None:
        new = super()._retry(request, reason)
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        mark_failed = getattr(scheduler, "mark_failed", None)
        if mark_failed is None:  # not the shared frontier: Scrapy's own retries
            return new
        if new is None:
            text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
            mark_failed(request, text, kind="download")
            return None
        new.meta[RETRY_DELAY_META] = (0.0 if request.meta.get(SLOW_DOWN_META)
                                      else self.policy.delay(new.meta.get("retry_times", 1)))
        return new


def _is_timeout(exception) -> bool:
    """A download deadline (Scrapy's handler, the impersonating one, Twisted's)."""
    return isinstance(exception, DownloadTimeoutError) or "Timeout" in type(exception).__name__
