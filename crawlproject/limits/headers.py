"""A bound on a response's header section for Scrapy's own HTTP/1.1 client.

Twisted's response parser keeps every header line it is sent until the body
starts: only one line longer than 16 KiB makes it drop the connection (a
``DownloadFailedError``, retried). A site that sends header lines for ever
grew a node by 120 MB in 3 s, and ``DOWNLOAD_TIMEOUT`` (30 s here) was the only
end. :class:`BoundedHTTP11DownloadHandler` (Scrapy's handler) and the rendering
handler refuse a response whose status line and headers exceed
``DOWNLOAD_HEADERS_MAXSIZE`` bytes or ``DOWNLOAD_HEADERS_MAXCOUNT`` lines while
they arrive: the connection is closed and the download fails with
:class:`ResponseHeadersTooLarge` (not retried: the site would send the same;
dead-lettered with the reason, ``limits/headers_too_large``). One header may be
as long as the whole section may (Chrome's bound is the same 256 KiB in all).

libcurl (the impersonating handler) has its own bounds (300 KiB, 5000 headers);
that handler checks these settings on what libcurl accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from scrapy.core.downloader.handlers.http11 import (
    HTTP11DownloadHandler, _LenientHTTP11ClientFactory, _LenientHTTP11ClientProtocol,
    _LenientHTTPClientParser)
from scrapy.exceptions import DownloadCancelledError, DownloadFailedError
from twisted.web._newclient import STATUS

from crawlproject.defaults import setting
from crawlproject.limits import report_for


class ResponseHeadersTooLarge(DownloadCancelledError):
    """The response's header section went over ``DOWNLOAD_HEADERS_MAXSIZE`` or
    ``DOWNLOAD_HEADERS_MAXCOUNT`` (a ``DownloadCancelledError``, as Scrapy's own
    ``DOWNLOAD_MAXSIZE`` refusal: not retried)."""

    reason = "headers_too_large"


@dataclass(frozen=True)
class HeaderLimits:
    """Most bytes (status line and header lines) and header lines; 0: no limit."""

    max_bytes: int
    max_count: int

    @classmethod
    def from_settings(cls, settings) -> "HeaderLimits":
        """``DOWNLOAD_HEADERS_MAXSIZE`` and ``DOWNLOAD_HEADERS_MAXCOUNT``."""
        limits = cls(setting(settings, "DOWNLOAD_HEADERS_MAXSIZE"),
                     setting(settings, "DOWNLOAD_HEADERS_MAXCOUNT"))
        if limits.max_bytes < 0 or limits.max_count < 0:
            raise ValueError(f"DOWNLOAD_HEADERS_MAXSIZE / DOWNLOAD_HEADERS_MAXCOUNT must be "
                             f"0 (no limit) or more, not {limits.max_bytes} / {limits.max_count}")
        return limits

    def check(self, size: int, count: int, url: str) -> None:
        """Raise :class:`ResponseHeadersTooLarge` when *size* or *count* is over."""
        if self.max_bytes and size > self.max_bytes:
            raise ResponseHeadersTooLarge(
                f"{url}: response headers over {self.max_bytes} bytes "
                f"(DOWNLOAD_HEADERS_MAXSIZE), {size} bytes received so far")
        if self.max_count and count > self.max_count:
            raise ResponseHeadersTooLarge(
                f"{url}: more than {self.max_count} response headers "
                f"(DOWNLOAD_HEADERS_MAXCOUNT), {count} received so far")


class _BoundedParser(_LenientHTTPClientParser):
    """Scrapy's parser, counting the header section as it arrives. Its state
    (limits, url, counters) is set by :class:`_BoundedProtocol` on the instance."""

    def lineReceived(self, line: bytes) -> None:
        self._bytes += len(line) + 1
        # the status line is no header; the empty line ending the headers is neither
        if self.state != STATUS and line.rstrip(b"\r"):
            self._headers += 1
        self._limits.check(self._bytes, self._headers, self._url)
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes):
        raise ResponseHeadersTooLarge(
            f"{self._url}: a response header line over {self.MAX_LENGTH} bytes "
            f"(DOWNLOAD_HEADERS_MAXSIZE)")


class _BoundedProtocol(_LenientHTTP11ClientProtocol):
    limits: HeaderLimits

    def request(self, request):
        d = super().request(request)
        # Scrapy replaces the parser's class the same way (_LenientHTTP11ClientProtocol):
        # the only way in, as HTTP11ClientProtocol.request() names the class itself.
        parser = self._parser
        parser.__class__ = _BoundedParser
        parser._limits, parser._headers, parser._bytes = self.limits, 0, 0
        parser._url = request.absoluteURI.decode("latin-1", "replace")
        if self.limits.max_bytes:
            parser.MAX_LENGTH = self.limits.max_bytes
        return d


def _factory(limits: HeaderLimits):
    class Protocol(_BoundedProtocol):
        pass

    Protocol.limits = limits

    class Factory(_LenientHTTP11ClientFactory):
        def buildProtocol(self, addr):
            return Protocol(self._quiescentCallback)

    return Factory


class HeaderLimitsMixin:
    """For download handlers derived from Scrapy's ``HTTP11DownloadHandler``: its
    connection pool builds bounded protocols, and a refusal is raised as
    :class:`ResponseHeadersTooLarge` (Twisted reports it as a failed response)."""

    def _bound_headers(self, crawler) -> None:
        self._header_limits = HeaderLimits.from_settings(crawler.settings)
        self._limit_report = report_for(crawler)
        if self._header_limits.max_bytes or self._header_limits.max_count:
            self._pool._factory = _factory(self._header_limits)

    async def _bounded_download(self, download, request):
        try:
            return await download(request)
        except DownloadFailedError as exc:
            refusal = headers_refusal(exc)
            if refusal is None:
                raise
            self._limit_report.refused(request, refusal.reason, "%s", refusal)
            raise refusal from exc


def headers_refusal(exc: BaseException) -> ResponseHeadersTooLarge | None:
    """The :class:`ResponseHeadersTooLarge` behind Scrapy's ``DownloadFailedError``
    (Twisted's ``ResponseFailed`` of the parser's exception), else None."""
    failed = exc.__cause__
    for failure in getattr(failed, "reasons", ()):
        if failure.check(ResponseHeadersTooLarge):
            return failure.value
    return None


class BoundedHTTP11DownloadHandler(HeaderLimitsMixin, HTTP11DownloadHandler):
    """Scrapy's HTTP/1.1 download handler with the header bounds of this module."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self._bound_headers(crawler)

    async def download_request(self, request):
        """Scrapy's download, a too large header section refused (see the module)."""
        return await self._bounded_download(super().download_request, request)
