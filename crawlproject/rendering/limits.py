"""What a rendered page may cost: bytes the browser receives, counted while they arrive.

scrapy-playwright bounds a rendered page by time only (the navigation timeout);
Chromium decodes the document and its resources itself, so a compression bomb
rendered, or a page pulling endless resources, would fill the browser and then,
serialised by ``page.content()``, the node. :class:`PageMeter` listens to the
page's own DevTools session (``Network.dataReceived``: bytes after decoding, as
they arrive) and takes the page offline (``Network.emulateNetworkConditions``,
which fails every transfer in flight) once

* one document (the page or a frame) went over ``DOWNLOAD_MAXSIZE`` (or the
  request's ``meta["download_maxsize"]``), or
* everything the page received went over ``RENDER_MAXSIZE``.

The handler then refuses the page (:class:`~crawlproject.rendering.addon.RenderedPageTooLarge`).
Chromium only (the DevTools protocol); the events arrive some milliseconds after
the bytes, so a page may go a little over before it is stopped.
"""

from __future__ import annotations

import asyncio
import logging

logger = logging.getLogger(__name__)

OFFLINE = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}


class PageMeter:
    """Counts the bytes one rendered page receives; stops it past a limit (0: none)."""

    def __init__(self, document_limit: int, total_limit: int):
        self.document_limit, self.total_limit = document_limit, total_limit
        self.documents: dict[str, int] = {}     # requestId -> decoded bytes
        self.total = 0
        self.over: str | None = None            # why the page was stopped
        self._session = None
        self._stopping = None

    async def attach(self, page) -> bool:
        """Listen to *page*'s network; False where there is no DevTools session."""
        try:
            self._session = await page.context.new_cdp_session(page)
            await self._session.send("Network.enable")
        except Exception as exc:   # not Chromium, or the page is gone already
            logger.debug("No DevTools session for the page size limits: %s", exc)
            return False
        self._session.on("Network.requestWillBeSent", self._request)
        self._session.on("Network.dataReceived", self._data)
        return True

    def _request(self, params: dict) -> None:
        if params.get("type") == "Document":
            self.documents.setdefault(params.get("requestId"), 0)

    def _data(self, params: dict) -> None:
        size = int(params.get("dataLength") or 0)
        self.total += size
        request_id = params.get("requestId")
        if request_id in self.documents:
            self.documents[request_id] += size
            if self.document_limit and self.documents[request_id] > self.document_limit:
                self._stop(f"a document of the page went over {self.document_limit} bytes "
                           f"(DOWNLOAD_MAXSIZE or meta download_maxsize) while rendering")
        if self.total_limit and self.total > self.total_limit:
            self._stop(f"the page received more than {self.total_limit} bytes in all "
                       f"(RENDER_MAXSIZE) while rendering")

    def _stop(self, why: str) -> None:
        if self.over is not None:
            return
        self.over = why
        self._stopping = asyncio.ensure_future(self._offline())

    async def _offline(self) -> None:
        try:
            await self._session.send("Network.emulateNetworkConditions", OFFLINE)
        except Exception as exc:   # the page closed meanwhile: nothing more comes
            logger.debug("Could not take an oversized page offline: %s", exc)
