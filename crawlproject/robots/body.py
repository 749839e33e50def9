"""A robots.txt body read no further than RFC 9309 §2.5 asks: 500 KiB.

Only the first :data:`~crawlproject.robots.record.MAX_BODY` bytes of a
robots.txt are parsed, so no more are downloaded (the ``bytes_received``
signal stops the download there, keeping what came: Scrapy's
``StopDownload(fail=False)``) nor decompressed: the ``Content-Encoding`` of a
robots.txt response is set aside when the downloader hands it over
(``response_downloaded``, before any downloader middleware), so Scrapy's
``HttpCompressionMiddleware`` does not decode it (up to ``DOWNLOAD_MAXSIZE``,
or an ``IgnoreRequest`` the robots.txt middleware would never see), and
:meth:`Bodies.read` undoes it up to 500 KiB
(:func:`crawlproject.robots.rules.decode_body`): a gzip or brotli bomb costs
that much, never more.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from scrapy import Request, signals
from scrapy.exceptions import StopDownload

from crawlproject.robots.record import MAX_BODY
from crawlproject.robots.rules import decode_body


class Bodies:
    """The bodies of the downloads *is_download* says are robots.txt fetches."""

    def __init__(self, crawler, is_download: Callable[[Request], bool]):
        self.is_download = is_download
        # Per download in flight: bytes received, Content-Encoding set aside.
        self._received: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._encodings: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        crawler.signals.connect(self.bytes_received, signal=signals.bytes_received)
        crawler.signals.connect(self.downloaded, signal=signals.response_downloaded)

    def bytes_received(self, data, request, spider=None, **kwargs) -> None:
        """Stop a robots.txt download once :data:`MAX_BODY` bytes came."""
        if not self.is_download(request):
            return
        received = self._received.get(request, 0) + len(data)
        self._received[request] = received
        if received >= MAX_BODY:
            raise StopDownload(fail=False)

    def downloaded(self, response, request, spider=None, **kwargs) -> None:
        """Set a robots.txt response's Content-Encoding aside (:meth:`read` undoes it)."""
        if self.is_download(request) and b"Content-Encoding" in response.headers:
            self._encodings[request] = [e.decode("latin-1") for e in
                                        response.headers.getlist(b"Content-Encoding")]
            del response.headers[b"Content-Encoding"]

    def read(self, request: Request, response) -> tuple[bytes, bool]:
        """``(body, truncated)``: *response*'s body decoded, at most
        :data:`MAX_BODY` bytes of it, and whether there was more; ``ValueError``
        when it cannot be decoded."""
        encodings = self._encodings.pop(request, None) or []
        body = decode_body(response.body, encodings, MAX_BODY + 1)
        truncated = "download_stopped" in response.flags or len(body) > MAX_BODY
        return body[:MAX_BODY], truncated
