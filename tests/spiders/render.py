"""Spiders for the rendering tests (tests/test_rendering.py)."""

from crawlproject.identity.session import IDENTITY, PROXY_CONTEXT, PROXY_ID
from crawlproject.spiders.seeded import RedisSpider


class RenderSpider(RedisSpider):
    """One item per seed page: its title, the browser's navigator.userAgent as
    the page's script wrote it, and whether Chromium rendered it."""

    name = "render"

    def parse(self, response):
        yield {"url": response.url, "title": response.css(".title::text").get(),
               "ua": response.css("#ua::text").get(),
               "rendered": "playwright" in response.flags}


class SessionStandInMiddleware:
    """Stands in for the proxy (600) and identity (610) middlewares, written in
    parallel: a page's ``?who=N`` query picks identity N (and, with
    ``TEST_PROXY_URL`` set, that proxy with its credentials), set in the meta
    keys of the session contract exactly as they will."""

    def __init__(self, proxy):
        self.proxy = proxy

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.settings.getdict("TEST_PROXY"))

    def process_request(self, request):
        who = request.url.rpartition("who=")[2] if "who=" in request.url else None
        if who is None:
            return None
        request.meta[IDENTITY] = {"id": f"id{who}", "user_agent": f"RenderTestAgent/{who}",
                                  "headers": {"Accept-Language": "de-DE,de;q=0.9",
                                              "Accept": "text/html"}}
        if self.proxy:
            request.meta[PROXY_ID] = self.proxy["id"]
            request.meta[PROXY_CONTEXT] = {k: self.proxy[k]
                                           for k in ("server", "username", "password")}
        return None


class RenderSessionsSpider(RenderSpider):
    name = "render_sessions"
    # The stand-in gives each session its User-Agent: the identity middleware
    # (installed by crawlproject's add-on whatever a spider's own dict says,
    # unless the dict turns it off) would rotate it.
    custom_settings = {"DOWNLOADER_MIDDLEWARES": {
        "tests.spiders.render.SessionStandInMiddleware": 605,
        "crawlproject.identity.middleware.IdentityMiddleware": None}}
