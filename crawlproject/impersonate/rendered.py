"""RenderingImpersonateHandler: rendering and impersonation in one download handler.

The rendering middleware needs its download handler to be the rendering add-on's
(:class:`~crawlproject.rendering.addon.RenderingDownloadHandler`: one browser, the
bounded context pool), and a project has one handler per scheme. With both on,
the impersonation add-on installs this subclass of it: requests marked for the
browser (``meta["playwright"]``) are rendered by Chromium as before, every other
request goes to :class:`~crawlproject.impersonate.handler.ImpersonateDownloadHandler`.
Loaded only when rendering is on (it imports scrapy-playwright, the render extra).
"""

from __future__ import annotations

from crawlproject.impersonate.handler import ImpersonateDownloadHandler
from crawlproject.rendering.addon import RenderingDownloadHandler


class RenderingImpersonateHandler(RenderingDownloadHandler):
    """The browser for rendered requests, the identity's browser fingerprint for the rest."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self.impersonating = ImpersonateDownloadHandler.from_crawler(crawler)

    async def download_request(self, request):
        if request.meta.get("playwright"):
            return await super().download_request(request)
        return await self.impersonating.download_request(request)

    async def close(self) -> None:
        await self.impersonating.close()
        await super().close()
