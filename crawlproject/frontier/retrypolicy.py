"""How requests that failed are tried again through the frontier (no Scrapy).

A download that failed (Scrapy's ``RETRY_TIMES`` / ``RETRY_HTTP_CODES``, see
:mod:`crawlproject.middlewares.retry`) or a callback that raised
(``CALLBACK_RETRY_TIMES``) is retried after ``RETRY_BACKOFF_BASE * 2^(n-1)``
seconds (jittered, at most ``RETRY_BACKOFF_MAX``), waiting in the frontier's
delayed set in Redis so that any node may pick it up; when the retries are
used up it is dead-lettered. The meta keys below carry that state.
"""

from __future__ import annotations

from dataclasses import dataclass

from crawlproject import defaults
from crawlproject.backoff import backoff_delay
from crawlproject.defaults import setting

#: The frontier member a request was leased as (never stored).
LEASE_META = "_crawlproject_lease"
#: Seconds a retried request waits in the delayed set (never stored).
RETRY_DELAY_META = "_crawlproject_retry_delay"
#: The response asked the site's politeness key to slow down (never stored).
SLOW_DOWN_META = "_crawlproject_slow_down"
#: The payload the request was leased with, as stored (never stored again).
PAYLOAD_META = "_crawlproject_payload"
#: The member of the leased request whose callback yielded this one (never stored).
PARENT_META = "_crawlproject_parent"
#: Callback attempts so far (stored: a retried request carries it).
CALLBACK_ATTEMPTS_META = "crawlproject_callback_attempts"


@dataclass(frozen=True)
class RetryPolicy:
    """Retry counts and backoff of a crawl (read once from settings)."""

    callback_retry_times: int = defaults.CALLBACK_RETRY_TIMES
    backoff_base: float = defaults.RETRY_BACKOFF_BASE
    backoff_max: float = defaults.RETRY_BACKOFF_MAX

    @classmethod
    def from_settings(cls, settings) -> "RetryPolicy":
        return cls(callback_retry_times=setting(settings, "CALLBACK_RETRY_TIMES"),
                   backoff_base=setting(settings, "RETRY_BACKOFF_BASE"),
                   backoff_max=setting(settings, "RETRY_BACKOFF_MAX"))

    def delay(self, attempt: int) -> float:
        """Seconds retry *attempt* (1, 2, ...) waits."""
        return backoff_delay(attempt, self.backoff_base, self.backoff_max)

    def retry_callback(self, attempts: int) -> bool:
        """Whether a request whose callback raised *attempts* times is tried again."""
        return attempts <= self.callback_retry_times
