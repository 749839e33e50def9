"""The errback every leased request carries: a download that failed in any
downloader middleware is recorded for the frontier (retried, then
dead-lettered with its reason), never acknowledged as done."""

from __future__ import annotations


from scrapy.exceptions import IgnoreRequest
from scrapy.spiders import CrawlSpider


def dead_letter(crawler, request, reason: str, kind: str = "download") -> bool:
    """Have the shared frontier dead-letter *request* with *reason* when it
    leaves the engine (a refusal raised as ``IgnoreRequest`` would otherwise
    be taken for done); False without that scheduler (nothing to tell)."""
    try:
        scheduler = crawler.engine.scheduler
    except (AttributeError, RuntimeError):   # no crawl running (Scrapy 2.19 raises)
        return False
    mark_failed = getattr(scheduler, "mark_failed", None)
    if mark_failed is None:
        return False
    mark_failed(request, reason, kind=kind)
    return True


def _rule_without_errback(errback, failure) -> bool:
    """Whether *errback* is ``CrawlSpider``'s own, for a request of a rule with
    no errback: it passes the failure to nobody (Scrapy then logs nothing
    either), so the download failed unhandled."""
    spider = getattr(errback, "__self__", None)
    if not isinstance(spider, CrawlSpider) or getattr(errback, "__func__", None) \
            is not CrawlSpider._errback:
        return False
    try:
        return spider._rules[failure.request.meta["rule"]].errback is None
    except (AttributeError, KeyError, IndexError, TypeError):
        return False


class LeaseErrback:
    """The errback of a leased request: a download that failed is never taken
    for done.

    Scrapy hands a download's failure to the request's errback, or logs it
    when there is none; either way the request then leaves the engine, and
    the scheduler would acknowledge it. A failure the retry middleware did not
    turn into a retry (an exception raised by any downloader middleware, a
    ``dont_retry`` request's timeout...) would so be lost. This wrapper, set on
    every request taken from the frontier, records such a failure (*record*:
    ``(member, reason)``) before the spider's own errback sees it, so that the
    request is dead-lettered with the reason instead. ``IgnoreRequest`` (and
    ``HttpError``, its subclass) is a decision, not a failure: the request is
    done. A spider errback that handles the failure (returns) makes it done
    too, as in Scrapy; one that raises another exception is a callback error.
    It is never stored: :mod:`crawlproject.serialization` stores what
    ``stored_as`` names instead, the spider's own errback (or none).
    """

    __slots__ = ("record", "member", "original")

    def __init__(self, record, member: str, original):
        self.record, self.member, self.original = record, member, original

    @property
    def stored_as(self):
        """The errback a copy of the request is stored with (retries, redirects)."""
        return self.original

    def __call__(self, failure):
        if self.original is None:
            self._unhandled(failure)
            failure.raiseException()
        if _rule_without_errback(self.original, failure):
            self._unhandled(failure)   # CrawlSpider's own errback: it only passes it on
        try:
            return self.original(failure)
        except Exception as exc:
            if exc is failure.value:  # re-raised by the spider: still the download's
                self._unhandled(failure)
            raise

    def _unhandled(self, failure) -> None:
        if not failure.check(IgnoreRequest):
            exc = failure.value
            self.record(self.member, f"{type(exc).__name__}: {exc}")
