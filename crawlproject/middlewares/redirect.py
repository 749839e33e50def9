"""Scrapy's redirects for the shared frontier: each hop is a request of its own
host, and a chain that goes nowhere ends with a reason.

:class:`FrontierRedirectMiddleware` (3xx ``Location``) and
:class:`FrontierMetaRefreshMiddleware` (``<meta http-equiv="refresh">``) are
Scrapy's ``RedirectMiddleware`` and ``MetaRefreshMiddleware``, same settings,
except that a hop to another host leaves the source's download slot behind
(``redirect/other_host``); a loop, a chain over ``REDIRECT_MAX_TIMES`` and a
3xx to a scheme other than http(s) are given up with a reason (dead-lettered
with :class:`~crawlproject.scheduler.RedisScheduler`); and ``dont_filter`` is
not carried to the hops (``redirect/deduplicated``).

The differences in full, and how to enable them in place of Scrapy's:
``docs/middlewares.md``, "Redirects (crawlproject/middlewares/redirect.py)".
"""

from __future__ import annotations

import logging
from http.cookies import CookieError, SimpleCookie

from scrapy import Request
from scrapy.downloadermiddlewares.redirect import MetaRefreshMiddleware, RedirectMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.url import strip_url
from w3lib.url import canonicalize_url

from crawlproject.robots.middleware import FETCH_META as ROBOTS_FETCH_META
from crawlproject.scheduling.errback import dead_letter

logger = logging.getLogger(__name__)

#: the dead letters' kind
KIND = "redirect"
URL_CHARS = 160      # of each URL in a reason
CHAIN_HEAD, CHAIN_TAIL = 3, 2   # URLs of a long chain named in a reason
SAID_MAX = 1000      # (reason, host) pairs logged at INFO, then DEBUG only


def chain_text(urls: list[str]) -> str:
    """``a → b → c``: the URLs without credentials or fragment, each cut to
    ``URL_CHARS``, a long chain shortened to its first and last hops."""
    shown = [_shown(u) for u in urls]
    if len(shown) > CHAIN_HEAD + CHAIN_TAIL + 1:
        skipped = len(shown) - CHAIN_HEAD - CHAIN_TAIL
        shown = [*shown[:CHAIN_HEAD], f"… ({skipped} more) …", *shown[-CHAIN_TAIL:]]
    return " → ".join(shown)


def _shown(url: str) -> str:
    try:
        url = strip_url(url, strip_credentials=True, strip_default_port=False)
    except ValueError:   # not a URL urlparse reads: shown cut, as it is
        pass
    return url if len(url) <= URL_CHARS else url[:URL_CHARS - 1] + "…"


def _same_page(url: str) -> str:
    try:
        return canonicalize_url(url)
    except ValueError:
        return url


#: cookies of a cookie wall carried with its hop, and their longest value
MAX_WALL_COOKIES, MAX_WALL_COOKIE = 20, 4096


def _set_cookies(response: Response) -> list[dict[str, str]]:
    """The cookies *response* sets, in ``Request.cookies``' list form, with
    their path (bounded; junk skipped): without it a cookie would take the
    request's directory as its path, and go twice beside the jar's own."""
    found: list[dict[str, str]] = []
    for header in response.headers.getlist(b"Set-Cookie")[:MAX_WALL_COOKIES]:
        cookie = SimpleCookie()
        try:
            cookie.load(header.decode("latin-1"))
        except CookieError:
            continue
        for name, morsel in cookie.items():
            if len(morsel.value) <= MAX_WALL_COOKIE and len(found) < MAX_WALL_COOKIES:
                found.append({"name": name, "value": morsel.value,
                              **({"path": morsel["path"]} if morsel["path"] else {})})
    return found


class _Reload(Exception):
    """A meta refresh to the page itself: the page is kept (internal)."""


class _NotHttp(Exception):
    """A redirect to a URL that is not http(s) (internal): the URL."""


class _ChainRules:
    """What both redirect middlewares add to Scrapy's (see docs/middlewares.md)."""

    def __init__(self, settings):
        super().__init__(settings)
        self._said: set[tuple[str, str]] = set()
        #: the cookies the response being redirected set (read by _redirect, in
        #: the same synchronous call of process_response)
        self._set_cookies: list[dict[str, str]] = []

    def _build_redirect_request(self, source_request: Request, response: Response, *,
                                url: str, **kwargs) -> Request:
        self._set_cookies = _set_cookies(response)
        try:
            redirected = super()._build_redirect_request(source_request, response, url=url,
                                                         **kwargs)
        except ValueError:   # "Missing scheme": mailto:, javascript:, tel:...
            raise _NotHttp(url) from None
        if urlparse_cached(redirected).scheme not in ("http", "https"):
            raise _NotHttp(url)
        # The URL the scheduler stores (crawlproject.urls), before Scrapy logs it:
        # no credentials in the log line, one spelling in the chain.
        from crawlproject.urls import canonicalizer_for
        redirected = canonicalizer_for(self.crawler).request(redirected)
        if urlparse_cached(redirected).hostname != urlparse_cached(source_request).hostname:
            # Scrapy's downloader set the source host's slot in meta: not this host's.
            if redirected.meta.pop("download_slot", None) is not None:
                self.crawler.stats.inc_value("redirect/other_host")
        return redirected

    def _redirect(self, redirected: Request, request: Request, reason) -> Request:
        if request.meta.get(ROBOTS_FETCH_META):
            return super()._redirect(redirected, request, reason)
        chain = [*request.meta.get("redirect_urls", []), request.url]
        target = _same_page(redirected.url)
        seen = {_same_page(u) for u in chain}
        if target in seen and redirected.method == request.method:
            if reason == "meta refresh" and target == _same_page(request.url):
                raise _Reload
            if (self._set_cookies and target == _same_page(request.url)
                    and [_same_page(u) for u in chain].count(target) == 1):
                # A cookie wall: the page sets a cookie and asks for itself
                # again. Followed once, as a browser does, the cookies with the
                # hop itself (stored with it in the frontier: the node that
                # downloads it may not be the one whose jar got them); a
                # second time it is a loop.
                self.crawler.stats.inc_value("redirect/cookie_wall")
                hop = super()._redirect(redirected, request, reason)
                hop.dont_filter = True
                own = hop.cookies or []
                if isinstance(own, dict):
                    own = [{"name": k, "value": v} for k, v in own.items()]
                hop.cookies = [*own, *self._set_cookies]
                return hop
            self._give_up(request, "loop", f"redirect loop ({reason}): "
                          f"{chain_text([*chain, redirected.url])}")
        try:
            hop = super()._redirect(redirected, request, reason)
        except IgnoreRequest:
            self._give_up(request, "max_times", f"more than {self.max_redirect_times} "
                          f"redirects (REDIRECT_MAX_TIMES): "
                          f"{chain_text([*chain, redirected.url])}")
        return self._deduplicated(hop, request)

    def _deduplicated(self, hop: Request, request: Request) -> Request:
        """*hop* deduplicated like a link when *request* was not only for its
        own page (Scrapy copies ``dont_filter`` to every hop)."""
        if (hop.dont_filter and request.method in ("GET", "HEAD")
                and not request.meta.get("dont_filter_redirects")
                and not request.meta.get("recrawl")
                and _same_page(hop.url) != _same_page(request.url)):
            hop.dont_filter = False
            self.crawler.stats.inc_value("redirect/deduplicated")
        return hop

    def _give_up(self, request: Request, what: str, reason: str):
        """Count, dead-letter (with the shared frontier) and drop *request*."""
        stats = self.crawler.stats
        stats.inc_value(f"redirect/{what}")
        dead = dead_letter(self.crawler, request, reason, KIND)  # (the scheduler logs it)
        self._say(request, what, reason, dead=dead)
        raise IgnoreRequest(reason)

    def _say(self, request: Request, what: str, reason: str, dead: bool) -> None:
        # Once per (kind, host) at INFO: a site whose every page loops would
        # flood the log (each dead letter is logged by the scheduler anyway).
        said = self._said
        host = urlparse_cached(request).hostname or ""
        level = logging.DEBUG
        if (what, host) not in said and len(said) < SAID_MAX:
            said.add((what, host))
            level = logging.INFO
        logger.log(level, "Redirect given up (%s): %s; counted in redirect/%s%s; said once "
                   "per site", what, reason, what, ", dead-lettered" if dead else "",
                   extra={"spider": self.crawler.spider})


class FrontierRedirectMiddleware(_ChainRules, RedirectMiddleware):
    """Scrapy's 3xx redirects, per host and ending with a reason (docs/middlewares.md)."""

    def process_response(self, request: Request, response: Response, spider=None):
        try:
            return super().process_response(request, response)
        except _NotHttp as exc:
            if request.meta.get(ROBOTS_FETCH_META):
                return response   # Scrapy's way: the robots middleware judges it
            url = str(exc)
            self._give_up(request, "scheme_refused",
                          f"redirect ({response.status}) to a URL that is not http(s): "
                          f"{chain_text([request.url, url])}")


class FrontierMetaRefreshMiddleware(_ChainRules, MetaRefreshMiddleware):
    """Scrapy's meta refresh, per host and ending with a reason (docs/middlewares.md)."""

    def process_response(self, request: Request, response: Response, spider=None):
        try:
            return super().process_response(request, response)
        except _NotHttp:   # (Scrapy: ignored, or an error for a URL without "://")
            return response
        except _Reload:   # a refresh of the page itself: the page is the content
            self.crawler.stats.inc_value("redirect/meta_refresh_self")
            return response
