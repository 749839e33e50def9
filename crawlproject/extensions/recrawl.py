"""Moved to :mod:`crawlproject.recrawl.extension`; this path stays so settings written
before keep working."""

from crawlproject.recrawl.extension import (PROJECTION, WAKE_POLL, MAX_REASON,
                                            DUE_COUNT_MAX, RecrawlFeeder, record_request)

__all__ = ["PROJECTION", "WAKE_POLL", "MAX_REASON", "DUE_COUNT_MAX", "RecrawlFeeder",
           "record_request"]
