"""Cookies that follow an explicit session across nodes.

Scrapy's ``CookiesMiddleware`` keeps its cookie jars in the memory of one
process. In a cluster the next request of a login flow (``meta["session"]``,
see :mod:`crawlproject.identity.session`) may be downloaded by another node,
whose jar for that session is empty. Two small parts carry the cookies with the
request instead:

* :class:`SessionCookiesSpiderMiddleware` (spider middleware): a request the
  callback of a session's page yields *for the same session* gets the cookies
  the session's jar would send to its URL, as ``meta["session_cookies"]``
  (name → value), and ``meta["cookiejar"]`` = the session (one jar per session
  on every node). This happens before the request is stored in the frontier.
* :class:`SessionCookiesMiddleware` (downloader middleware, 690, before
  ``CookiesMiddleware`` at 700): on whichever node downloads it, the cookies the
  local jar does not have yet are added to the request's own ``cookies``; the
  cookies middleware puts them in the jar and sends them. A cookie the jar
  already has wins: a node that saw the site rotate a token keeps the new one.

Session cookies are stored in the frontier with their request (as
``Request.cookies`` would be). Off with ``SESSION_COOKIES_ENABLED = False``, and
when ``COOKIES_ENABLED`` is off. Stats: ``session_cookies/attached``,
``session_cookies/restored``.
"""

from __future__ import annotations

import scrapy.downloadermiddlewares.cookies as scrapy_cookies
from scrapy import Request
from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from tldextract import TLDExtract

from crawlproject.defaults import setting
from crawlproject.identity.session import explicit_session

# Scrapy's CookiesMiddleware asks a default TLDExtract whether a cookie's domain
# is a public suffix; the first cookie with a domain then downloads the public
# suffix list from the network, synchronously in the reactor thread (a stalled
# connection stalls the node; offline it logs a traceback). The list bundled
# with tldextract is enough: the same answer with no network (as the frontier's
# "domain" politeness key, crawlproject.frontier.sitelimits).
scrapy_cookies._split_domain = TLDExtract(suffix_list_urls=(), cache_dir=None,
                                          include_psl_private_domains=True)

SESSION_COOKIES = "session_cookies"
MAX_COOKIES = 50
MAX_VALUE = 4096


def _enabled(settings) -> bool:
    return setting(settings, "SESSION_COOKIES_ENABLED") and settings.getbool(
        "COOKIES_ENABLED")


def _cookies_middleware(crawler) -> CookiesMiddleware | None:
    downloader = getattr(crawler.engine, "downloader", None)
    manager = getattr(downloader, "middleware", None)
    for mw in getattr(manager, "middlewares", ()):
        if isinstance(mw, CookiesMiddleware):
            return mw
    return None


def _jar_cookies(jar, url: str) -> dict[str, str]:
    """The cookies *jar* would send with a request to *url*."""
    probe = Request(url)
    jar.add_cookie_header(probe)
    header = probe.headers.get("Cookie")
    out = {}
    for part in (header or b"").decode("latin-1").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name:
            out[name] = value
    return out


class _SessionCookies:
    """What both halves share: the switch and the node's CookiesMiddleware."""

    def __init__(self, crawler):
        self.crawler = crawler
        self.stats = crawler.stats
        self._cookies_mw: CookiesMiddleware | None = None

    @classmethod
    def from_crawler(cls, crawler):
        if not _enabled(crawler.settings):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        return cls(crawler)

    def _jars(self):
        """The cookie jars of this node (found once the engine is up), or None."""
        if self._cookies_mw is None:
            self._cookies_mw = _cookies_middleware(self.crawler)
        return self._cookies_mw.jars if self._cookies_mw is not None else None


class SessionCookiesSpiderMiddleware(_SessionCookies):
    """Attach a session's cookies to the session's next requests (see the module docstring)."""

    def _attach(self, request, response):
        if not isinstance(request, Request):
            return request
        session = explicit_session(request)
        if session is None or request.meta.get("dont_merge_cookies"):
            return request
        request.meta.setdefault("cookiejar", session)
        jars = self._jars()
        jar = jars.get(request.meta["cookiejar"]) if jars is not None else None
        if jar is not None and len(jar):
            cookies = _jar_cookies(jar, request.url)
            if cookies:
                request.meta[SESSION_COOKIES] = cookies
                self.stats.inc_value("session_cookies/attached")
        return request

    def process_spider_output(self, response, result, spider=None):
        for request in result:
            yield self._attach(request, response)

    async def process_spider_output_async(self, response, result, spider=None):
        async for request in result:
            yield self._attach(request, response)


class SessionCookiesMiddleware(_SessionCookies):
    """Give the local jar the session cookies a request carries (see the module docstring)."""

    def process_request(self, request, spider=None):
        carried = request.meta.get(SESSION_COOKIES)
        if not isinstance(carried, dict) or not carried or request.meta.get("dont_merge_cookies"):
            return None
        jars = self._jars()
        if jars is None:
            return None
        jar = jars[request.meta.get("cookiejar")]
        have = _jar_cookies(jar, request.url) if len(jar) else {}
        # Data from Redis: only short text pairs, and never more than a browser would keep.
        missing = {k: v for k, v in list(carried.items())[:MAX_COOKIES]
                   if isinstance(k, str) and isinstance(v, str) and k not in have
                   and len(k) + len(v) <= MAX_VALUE and "=" not in k and ";" not in k + v}
        if not missing:
            return None
        own = request.cookies
        if isinstance(own, dict):
            request.cookies = {**missing, **own}
        elif isinstance(own, list):
            request.cookies = [{"name": k, "value": v} for k, v in missing.items()] + own
        self.stats.inc_value("session_cookies/restored", len(missing))
        return None
