"""Moved to :mod:`crawlproject.recrawl.middleware`; this path stays so settings written
before keep working, with a deprecation warning, until
:data:`crawlproject.deprecation.REMOVED_IN`."""

from crawlproject.deprecation import moved
from crawlproject.recrawl.middleware import (GONE_CODES, record_url, RecrawlMiddleware,
                                             item_collections_pattern, page_record,
                                             DOWNLOAD_META, DOWNLOAD_HEADERS,
                                             stored_payload, RecrawlSpiderMiddleware)

__all__ = ["GONE_CODES", "record_url", "RecrawlMiddleware", "item_collections_pattern",
           "page_record", "DOWNLOAD_META", "DOWNLOAD_HEADERS", "stored_payload",
           "RecrawlSpiderMiddleware"]

moved(__name__, "crawlproject.recrawl.middleware")
