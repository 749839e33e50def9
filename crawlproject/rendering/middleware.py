"""RenderingMiddleware: which requests Chromium renders, and in which browser context.

A request is rendered (scrapy-playwright, ``meta["playwright"] = True``) when:

* its meta asks for it: ``playwright: True`` or ``render: True``
  (``render: False`` opts out of the rules below);
* its URL matches a pattern of ``RENDER_URL_PATTERNS`` or of the spider's
  ``render_rules`` (regular expressions, searched in the URL);
* its static page lacks a selector: ``RENDER_IF_MISSING`` (or the spider's
  ``render_if_missing``) maps URL patterns to CSS selectors; a static 200
  answer to a matching URL without the selector is not passed on
  (:class:`RenderIfMissingMiddleware`, 585): the same request comes back marked
  ``render: True`` (``dont_filter``), through the frontier like any new
  request, and is counted in ``rendering/missing_selector``.

A rendered page is read once it has its required selector
(``meta["render_wait_for"]``, else ``RENDER_WAIT_FOR_SELECTOR``, one selector or
``{url-pattern: selector}``, else the ``RENDER_IF_MISSING`` selector of its URL;
at most ``RENDER_WAIT_TIMEOUT`` seconds, refused and reported without it), or,
with none, once its network is idle (at most ``RENDER_WAIT_IDLE`` seconds):
:mod:`crawlproject.rendering.content`.

**Browser contexts.** A rendered request whose proxy middleware (600) and
identity middleware (610) chose a proxy and an identity gets the browser
context of that pair: ``playwright_context`` is named from the proxy id and
identity id (never the credentials) and ``playwright_context_kwargs`` carries
``proxy``, ``user_agent`` and the identity's language and client-hint headers.
A request with context options of its own (``playwright_context_kwargs``, from
the spider or read back from Redis) but no proxy or identity gets a context
named from a keyed digest of them: the shared ``default`` context is never
opened with a request's options.
These are set for the download only (:func:`crawlproject.serialization.replace_meta`)
and put back when the download ends: credentials never reach the frontier.
At most ``RENDER_MAX_CONTEXTS`` contexts are open: a new one first closes the
least recently used idle one, or waits until one is idle.

Switched off with ``RENDERING_ENABLED = False``; needs the download handler of
:mod:`crawlproject.rendering` (the add-on sets it). Stats under ``rendering/``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re

from parsel import Selector
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.http import TextResponse
from scrapy.utils.misc import load_object

from crawlproject.defaults import setting
from crawlproject.rendering.content import (MissingContent, WarningLimiter, quiet_playwright_log,
                                            required_selector, wait_for_content, wait_for_idle)
from crawlproject.rendering.settings import rendering_enabled
from crawlproject.identity.session import IDENTITY, PROXY_CONTEXT, PROXY_ID
from crawlproject.serialization import replace_meta, restore_meta

logger = logging.getLogger(__name__)

RENDER = "render"
RENDER_WAIT_FOR = "render_wait_for"
#: request headers a rendered navigation never carries
CONDITIONAL_HEADERS = (b"If-None-Match", b"If-Modified-Since")
#: The context this download holds in the pool (transient: never stored).
HELD_CONTEXT = "_crawlproject_render_context"
DEFAULT_CONTEXT = "default"
#: Identity headers that belong to the browser context (the browser sets
#: Accept and Accept-Encoding per resource itself).
CONTEXT_HEADERS = frozenset({"accept-language"})
MAX_SELECTOR = 1000


class RenderRules:
    """URL rules: which URLs render, which need a selector, what to wait for."""

    def __init__(self, patterns=(), if_missing=(), wait_for=()):
        self.patterns = tuple(patterns)      # compiled regexes
        self.if_missing = tuple(if_missing)  # (regex, selector)
        self.wait_for = tuple(wait_for)      # (regex, selector)

    @classmethod
    def from_settings(cls, settings) -> "RenderRules":
        """``RENDER_URL_PATTERNS``, ``RENDER_IF_MISSING``, ``RENDER_WAIT_FOR_SELECTOR``."""
        wait_for = setting(settings, "RENDER_WAIT_FOR_SELECTOR")
        if isinstance(wait_for, str) and wait_for.lstrip().startswith("{"):
            wait_for = json.loads(wait_for)  # JSON from -s
        return cls.from_values(setting(settings, "RENDER_URL_PATTERNS"),
                               setting(settings, "RENDER_IF_MISSING"), wait_for)

    @classmethod
    def from_values(cls, patterns, if_missing, wait_for) -> "RenderRules":
        """Check and compile; a bad pattern or selector raises ``ValueError`` naming it."""
        if isinstance(wait_for, str):
            wait_for = {"": wait_for} if wait_for else {}
        return cls(tuple(_regex(p, "RENDER_URL_PATTERNS") for p in patterns or ()),
                   _pairs(if_missing, "RENDER_IF_MISSING"),
                   _pairs(wait_for or {}, "RENDER_WAIT_FOR_SELECTOR"))

    def extended(self, patterns, if_missing) -> "RenderRules":
        """These rules plus a spider's own."""
        extra = RenderRules.from_values(patterns, if_missing, None)
        return RenderRules(self.patterns + extra.patterns, self.if_missing + extra.if_missing,
                           self.wait_for)

    def wants(self, url: str) -> bool:
        """The URL always renders."""
        return any(p.search(url) for p in self.patterns)

    def missing_selector(self, url: str) -> str | None:
        """The selector a static page of *url* must have, else it renders."""
        return next((sel for p, sel in self.if_missing if p.search(url)), None)

    def wait_selector(self, url: str) -> str | None:
        """The selector a rendered page of *url* waits for."""
        return next((sel for p, sel in self.wait_for if p.search(url)), None)


def _regex(pattern, setting: str):
    try:
        return re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ValueError(f"{setting}: bad URL pattern {pattern!r}: {exc}") from None


def _pairs(mapping, setting: str) -> tuple:
    if not isinstance(mapping, dict):
        raise ValueError(f"{setting} must map URL patterns to CSS selectors, got {mapping!r}")
    pairs = []
    for pattern, selector in mapping.items():
        try:
            Selector(text="<html></html>").css(selector)
        except Exception as exc:  # noqa: BLE001 - cssselect raises several kinds
            raise ValueError(f"{setting}: bad CSS selector {selector!r} for {pattern!r}: "
                             f"{exc}") from None
        pairs.append((_regex(pattern, setting), selector))
    return tuple(pairs)


class RenderingMiddleware:
    """Render the requests that ask for it or match a rule (see the module docstring)."""

    def __init__(self, crawler, rules: RenderRules, max_contexts: int, wait_timeout: float,
                 proxy_bypass: str | None = None, idle_timeout: float = 0.0,
                 limiter: WarningLimiter | None = None):
        self.crawler = crawler
        self.proxy_bypass = proxy_bypass
        self.stats = crawler.stats
        self.rules = rules
        self.wait_timeout = wait_timeout
        self.idle_timeout = idle_timeout
        self.limiter = limiter or WarningLimiter(logger)
        # Imported here, not at the top: Playwright's modules are objects that
        # every full garbage collection walks, on a node that renders nothing
        # (RENDERING_ENABLED off, but the middleware in DOWNLOADER_MIDDLEWARES).
        from crawlproject.rendering import load_addon

        addon = load_addon()
        ContextPool, handlers_for = addon.ContextPool, addon.handlers_for  # noqa: N806
        self.pool = ContextPool(max_contexts, lambda: handlers_for(crawler), crawler.stats)
        # Context names carry a keyed digest of the context options: two proxies
        # with one address but different credentials never share a context, and
        # a name seen in a log reveals nothing about the credentials.
        self._name_key = os.urandom(16)

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not rendering_enabled(s):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        _check_handler(s)
        max_contexts = setting(s, "RENDER_MAX_CONTEXTS")
        if max_contexts < 1:
            raise ValueError(f"RENDER_MAX_CONTEXTS must be at least 1, got {max_contexts}")
        limit = s.getint("PLAYWRIGHT_MAX_CONTEXTS")
        if limit and limit < max_contexts:
            raise ValueError(
                f"PLAYWRIGHT_MAX_CONTEXTS ({limit}) is below RENDER_MAX_CONTEXTS ({max_contexts}): "
                "scrapy-playwright would wait forever for a context to close; set only "
                "RENDER_MAX_CONTEXTS")
        idle = setting(s, "RENDER_WAIT_IDLE")
        if idle < 0:
            raise ValueError(f"RENDER_WAIT_IDLE must be 0 (off) or more seconds, got {idle}")
        mw = cls(crawler, RenderRules.from_settings(s), max_contexts,
                 setting(s, "RENDER_WAIT_TIMEOUT"), setting(s, "RENDER_PROXY_BYPASS") or None,
                 idle)
        crawler.signals.connect(mw.spider_opened, signals.spider_opened)
        quiet_playwright_log()
        return mw

    def spider_opened(self, spider) -> None:
        """Add the spider's ``render_rules`` and ``render_if_missing``."""
        self.rules = self.rules.extended(getattr(spider, "render_rules", None) or (),
                                         getattr(spider, "render_if_missing", None) or {})

    # -- downloads ---------------------------------------------------------------------------
    async def process_request(self, request):
        """Mark the request for rendering and give it its browser context."""
        reason = self._render_reason(request)
        if reason is None:
            return None
        request.meta["playwright"] = True
        # A browser cannot show a 304: a conditional navigation (a revisit's
        # validators, set by the recrawl middleware before this one when the
        # page is rendered by rule) aborts with ERR_ABORTED. The rendered body
        # tells the recrawl whether the page changed.
        for name in CONDITIONAL_HEADERS:
            request.headers.pop(name, None)
        self.stats.inc_value(f"rendering/requests/{reason}")
        self._add_wait(request)
        name = self._set_context(request)
        await self.pool.acquire(name)
        request.meta[HELD_CONTEXT] = name
        return None

    async def process_response(self, request, response):
        """Free the context and put the request's meta back."""
        if await self._finish(request):
            self.stats.inc_value("rendering/responses")
        return response

    async def process_exception(self, request, exception):
        """Free the context; the retry middleware retries the request
        (browser errors and :class:`MissingContent` are in ``RETRY_EXCEPTIONS``)."""
        if await self._finish(request):
            if isinstance(exception, MissingContent):
                self._missing_content(request, exception)
                return None
            name = type(exception).__name__
            self.stats.inc_value(f"rendering/errors/{name}")
            logger.info("Rendering %s failed (%s: %s)", request, name, _first_line(exception),
                        extra={"spider": self.crawler.spider})
        return None

    # -- helpers -------------------------------------------------------------------------------
    def _render_reason(self, request) -> str | None:
        meta = request.meta
        if meta.get("playwright") is True:
            return "meta"
        flag = meta.get(RENDER)
        if flag is True:
            return "meta"
        if flag is False:
            return None
        return "rule" if self.rules.wants(request.url) else None

    def _add_wait(self, request) -> None:
        """The page method the page waits with before it is read, for this download
        only (see crawlproject.rendering.content)."""
        from scrapy_playwright.page import PageMethod

        meta = request.meta
        methods = meta.get("playwright_page_methods") or []
        if isinstance(methods, dict):
            methods = list(methods.values())
        selector = required_selector(request, self.rules, MAX_SELECTOR)
        if selector is not None:
            # A request stored before kept its wait as data: this one replaces it.
            methods = [pm for pm in methods if not (
                getattr(pm, "method", None) == "wait_for_selector" and pm.args[:1] == (selector,))]
            wait = PageMethod(wait_for_content, selector, self.wait_timeout)
            self.stats.inc_value("rendering/waits/selector")
        elif methods or _own_wait_until(meta) or not self.idle_timeout:
            return  # the request's own page methods or goto say how it waits
        else:
            wait = PageMethod(wait_for_idle, self.idle_timeout, self.stats)
            self.stats.inc_value("rendering/waits/idle")
        replace_meta(meta, "playwright_page_methods", [*methods, wait])

    def _missing_content(self, request, exception: MissingContent) -> None:
        self.stats.inc_value("rendering/missing_content")
        self.stats.inc_value("rendering/missing_content/selector")
        self.limiter.warn("selector", "Rendered page %s has no %r after %gs "
                          "(RENDER_WAIT_TIMEOUT): not passed on; retried, then dead-lettered",
                          request.url, exception.selector, exception.timeout,
                          extra={"spider": self.crawler.spider})

    def _set_context(self, request) -> str:
        meta = request.meta
        proxy, identity = meta.get(PROXY_CONTEXT), meta.get(IDENTITY)
        options = context_options(proxy, identity)
        if "proxy" in options and self.proxy_bypass:
            # Chromium's own list of hosts reached directly, not through the proxy.
            options["proxy"]["bypass"] = self.proxy_bypass
        own = meta.get("playwright_context_kwargs")
        if not options:
            name = meta.get("playwright_context") or DEFAULT_CONTEXT
            if own and name == DEFAULT_CONTEXT:
                # Context options a request carries (read back from Redis, maybe:
                # offline, extra_http_headers, java_script_enabled...) would become
                # the shared context's if this request were the first to open it,
                # for every request after it: they get a context of their own.
                name = self._context_name(None, None, own)
            # Set for the download only: scrapy-playwright would otherwise leave
            # "default" in meta, which a dead letter or retry then cannot store.
            replace_meta(meta, "playwright_context", name)
            return name
        if isinstance(own, dict):  # the spider's own options (viewport...) stay
            options = {**own, **options}
        name = self._context_name(meta.get(PROXY_ID), identity, options)
        replace_meta(meta, "playwright_context", name)
        replace_meta(meta, "playwright_context_kwargs", options)
        return name

    def _context_name(self, proxy_id, identity, options: dict) -> str:
        text = json.dumps(options, sort_keys=True, default=repr).encode()
        digest = hmac.new(self._name_key, text, hashlib.sha256).hexdigest()[:12]
        ident = identity.get("id") if isinstance(identity, dict) else None
        return f"r:{_label(proxy_id)}:{_label(ident)}:{digest}"

    async def _finish(self, request) -> bool:
        """Put the request's meta back; free its context. True if it held one."""
        name = request.meta.pop(HELD_CONTEXT, None)
        restore_meta(request.meta)
        if name is None:
            return False
        await self.pool.release(name)
        return True



class RenderIfMissingMiddleware:
    """Send a static page that lacks its selector back to be rendered.

    Its own place in the chain (585): a response is checked after
    ``HttpCompressionMiddleware`` (590) decoded its body and redirects (600)
    were followed, i.e. as the callback would see it."""

    def __init__(self, crawler, rules: RenderRules):
        self.stats = crawler.stats
        self.rules = rules

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not rendering_enabled(s):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        mw = cls(crawler, RenderRules.from_settings(s))
        crawler.signals.connect(mw.spider_opened, signals.spider_opened)
        return mw

    def spider_opened(self, spider) -> None:
        """Add the spider's ``render_if_missing``."""
        self.rules = self.rules.extended((), getattr(spider, "render_if_missing", None) or {})

    def process_response(self, request, response):
        """The same request marked ``render: True`` if the page lacks its selector."""
        if ("playwright" in response.flags or request.meta.get(RENDER) is False
                or response.status != 200 or not isinstance(response, TextResponse)):
            return response
        selector = self.rules.missing_selector(request.url)
        if selector is None or response.css(selector):
            return response
        self.stats.inc_value("rendering/missing_selector")
        meta = {**request.meta, RENDER: True}
        meta.setdefault(RENDER_WAIT_FOR, selector)
        return request.replace(meta=meta, dont_filter=True)


def context_options(proxy, identity) -> dict:
    """``playwright_context_kwargs`` for a proxy (``server``, ``username``,
    ``password``) and an identity (``user_agent``, ``headers``); {} for neither."""
    options = {}
    if isinstance(proxy, dict) and isinstance(proxy.get("server"), str) and proxy["server"]:
        options["proxy"] = {k: proxy[k] for k in ("server", "username", "password", "bypass")
                            if isinstance(proxy.get(k), str)}
    if isinstance(identity, dict):
        agent = identity.get("user_agent")
        if isinstance(agent, str) and agent:
            options["user_agent"] = agent
        headers = _context_headers(identity.get("headers"))
        if headers:
            options["extra_http_headers"] = headers
    return options


def _context_headers(headers) -> dict[str, str]:
    out = {}
    for key, value in (headers.items() if isinstance(headers, dict) else ()):
        key, value = _text(key), _text(value[0] if isinstance(value, list) and value else value)
        lower = (key or "").lower()
        if value and (lower in CONTEXT_HEADERS or lower.startswith("sec-ch-ua")):
            out[key] = value
    return out


def _text(value) -> str | None:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None


def _label(value) -> str:
    text = re.sub(r"[^A-Za-z0-9_.:-]", "_", value) if isinstance(value, str) else ""
    return text[:24] or "-"


def _own_wait_until(meta) -> bool:
    goto = meta.get("playwright_page_goto_kwargs")
    return isinstance(goto, dict) and bool(goto.get("wait_until"))


def _first_line(exception) -> str:
    return (str(exception).splitlines() or [""])[0][:200]


def _check_handler(settings) -> None:
    from crawlproject.rendering import load_addon

    RenderingDownloadHandler = load_addon().RenderingDownloadHandler  # noqa: N806

    handlers = settings.getwithbase("DOWNLOAD_HANDLERS")
    for scheme in ("http", "https"):
        path = handlers.get(scheme)
        cls = load_object(path) if path else None
        if not (isinstance(cls, type) and issubclass(cls, RenderingDownloadHandler)):
            raise NotConfigured(
                f"DOWNLOAD_HANDLERS[{scheme!r}] is not crawlproject.rendering."
                "RenderingDownloadHandler: add ADDONS = {'crawlproject.rendering."
                "RenderingAddon': 0} to the settings (see docs/middlewares.md)")
