"""LimitedHttpCompressionMiddleware: Scrapy's decompression, its refusals told.

Scrapy 2.19's ``HttpCompressionMiddleware`` decompresses gzip, deflate, brotli
and zstd in 64 KiB steps and stops as soon as the decompressed size passes
``DOWNLOAD_MAXSIZE`` (or the request's ``meta["download_maxsize"]``), so a bomb
costs at most the limit, whichever download handler fetched it (Scrapy's,
the impersonating one: libcurl is told not to decode, or the rendering
handler's Scrapy path). It then only logs a WARNING and raises
``IgnoreRequest``, which the frontier takes for "done": the page would vanish.
This subclass counts the refusal (``limits/decompressed_too_large``) and
dead-letters the page with the reason (Scrapy's WARNING is the log line).

It replaces Scrapy's at the same place (590); ``COMPRESSION_ENABLED`` switches
it off as it does Scrapy's.
"""

from __future__ import annotations

from scrapy.downloadermiddlewares.httpcompression import HttpCompressionMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.utils._compression import _DecompressionMaxSizeExceeded

from crawlproject.limits import report_for

REASON = "decompressed_too_large"


class LimitedHttpCompressionMiddleware(HttpCompressionMiddleware):
    """Scrapy's ``HttpCompressionMiddleware``; a body refused for its decompressed
    size is counted and dead-lettered (see the module)."""

    def __init__(self, stats=None, *, crawler=None):
        super().__init__(stats, crawler=crawler)
        self.report = report_for(crawler)

    def process_response(self, request, response, spider=None):
        """Decode *response*; a refusal is dead-lettered with its reason."""
        try:
            return super().process_response(request, response)
        except IgnoreRequest as exc:
            cause = exc.__cause__
            if not isinstance(cause, _DecompressionMaxSizeExceeded):
                raise
            reason = (f"{REASON}: more than {cause.max_size} bytes once decompressed "
                      f"({len(response.body)} bytes on the wire; DOWNLOAD_MAXSIZE or "
                      f"meta download_maxsize)")
            self.report.refused(request, REASON)   # Scrapy logged it (WARNING)
            self.report.dead_letter(request, reason)
            raise
