"""Moved to :mod:`crawlproject.recrawl.extension`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.recrawl.extension import (PROJECTION, WAKE_POLL, MAX_REASON,
                                            DUE_COUNT_MAX, RecrawlFeeder, record_request)

__all__ = ["PROJECTION", "WAKE_POLL", "MAX_REASON", "DUE_COUNT_MAX", "RecrawlFeeder",
           "record_request"]

moved(__name__, "crawlproject.recrawl.extension")
