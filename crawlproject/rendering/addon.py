"""JavaScript rendering with the system Chromium, for this project or any Scrapy project.

One line in a project's ``settings.py`` turns it on::

    ADDONS = {"crawlproject.rendering.RenderingAddon": 0}

The add-on (:class:`RenderingAddon`) sets, unless the project set them itself:

* ``DOWNLOAD_HANDLERS`` for http and https: :class:`RenderingDownloadHandler`,
  scrapy-playwright's handler that also lets the rendering middleware close
  idle browser contexts (only requests with ``meta["playwright"]`` use the
  browser; the others are downloaded as usual);
* ``PLAYWRIGHT_BROWSER_TYPE`` ``chromium`` and ``PLAYWRIGHT_LAUNCH_OPTIONS``
  (headless, flags that work in containers) with the browser found by
  :func:`chromium_path`: the ``CHROMIUM_PATH`` setting, else the
  ``CHROMIUM_PATH`` environment variable, else the Debian/Ubuntu paths;
* ``DOWNLOADER_MIDDLEWARES``: the rendering middlewares at 620 and 585;
* ``SPIDER_MIDDLEWARES``: ``EmptyItemsMiddleware`` at 800 (items with no data
  are reported, :mod:`crawlproject.rendering.content`);
* ``RETRY_EXCEPTIONS``: plus Playwright's errors, so a page lost to a browser
  crash is retried through the retry middleware like any download error, and
  ``MissingContent`` (a rendered page without its required selector);
* ``PLAYWRIGHT_ABORT_REQUEST``: images, fonts and media (``RENDER_BLOCK_RESOURCES``)
  are never fetched by the browser;
* ``PLAYWRIGHT_PROCESS_REQUEST_HEADERS``: :func:`browser_headers`;
* ``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` 4.

``RENDERING_ENABLED = False`` leaves every setting alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import weakref
from collections import OrderedDict
from contextlib import suppress
from urllib.parse import urlsplit

from scrapy.exceptions import DownloadCancelledError
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.misc import load_object
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler
from scrapy_playwright.headers import use_scrapy_headers

from crawlproject.defaults import RENDER_BLOCK_RESOURCES, setting
from crawlproject.egress.browser import MARKER, EgressProxy
from crawlproject.egress.report import refuse, report_for
from crawlproject.egress.resolver import active_guard, checked_addresses
from crawlproject.limits.headers import HeaderLimitsMixin
from crawlproject.rendering.limits import PageMeter
from crawlproject.rendering.settings import explicit_chromium_path, rendering_enabled

__all__ = ["ContextPool", "RenderingAddon", "RenderingDownloadHandler", "ResourceBlocker",
           "browser_headers", "chromium_path", "handlers_for"]

logger = logging.getLogger(__name__)

HANDLER = "crawlproject.rendering.RenderingDownloadHandler"
PLAYWRIGHT_HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
#: Handlers the add-on replaces with HANDLER (which has the same header bounds).
REPLACEABLE = (None, PLAYWRIGHT_HANDLER, ScrapyPlaywrightDownloadHandler,
               "crawlproject.limits.headers.BoundedHTTP11DownloadHandler")
#: The rendering middlewares and their places (see crawlproject.rendering.middleware).
MIDDLEWARES = {"crawlproject.rendering.middleware.RenderingMiddleware": 620,
               "crawlproject.rendering.middleware.RenderIfMissingMiddleware": 585}
#: The spider middleware that reports items with no data (crawlproject.rendering.content).
SPIDER_MIDDLEWARES = {"crawlproject.rendering.content.EmptyItemsMiddleware": 800}
#: Where Debian and Ubuntu install Chromium (the binary first: it starts faster
#: than the /usr/bin wrapper script).
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium",
                       "/usr/lib/chromium-browser/chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: Playwright's resource types that may be blocked ("document" never: it is the page).
RESOURCE_TYPES = frozenset({"stylesheet", "image", "media", "font", "script", "texttrack",
                            "xhr", "fetch", "eventsource", "websocket", "manifest", "other"})
DEFAULT_BLOCKED = tuple(RENDER_BLOCK_RESOURCES)
#: Playwright's errors (a crashed or disconnected browser, a page that timed out)
#: and a rendered page that never had its required selector.
RETRY_ERRORS = ("playwright.async_api.Error", "crawlproject.rendering.content.MissingContent")

_HANDLERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def chromium_path(settings=None) -> str | None:
    """The Chromium to launch: ``CHROMIUM_PATH`` (setting, then environment
    variable), else the first of :data:`CHROMIUM_CANDIDATES` that exists, else
    ``chromium``/``chromium-browser`` on ``PATH``; None if there is none.

    An explicit path that is not an executable file raises ``ValueError``: a
    typo must not silently fall back to another browser."""
    explicit = explicit_chromium_path(settings)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ValueError(f"CHROMIUM_PATH {explicit!r} is not an executable file")
        return explicit
    for candidate in CHROMIUM_CANDIDATES:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


def blocked_resource_types(settings) -> frozenset[str]:
    """``RENDER_BLOCK_RESOURCES`` checked against Playwright's resource types."""
    types = frozenset(t.strip() for t in setting(settings, "RENDER_BLOCK_RESOURCES") if t.strip())
    unknown = types - RESOURCE_TYPES
    if unknown:
        raise ValueError(f"RENDER_BLOCK_RESOURCES: unknown resource type(s) "
                         f"{', '.join(sorted(unknown))} (allowed: "
                         f"{', '.join(sorted(RESOURCE_TYPES))})")
    return types


class ResourceBlocker:
    """A ``PLAYWRIGHT_ABORT_REQUEST`` callable: abort the browser's requests of
    the given resource types, then ask *fallback* (the project's own
    ``PLAYWRIGHT_ABORT_REQUEST``, if any)."""

    def __init__(self, types, fallback=None):
        self.types = frozenset(types)
        self.fallback = load_object(fallback) if isinstance(fallback, str) else fallback

    async def __call__(self, request) -> bool:
        if request.resource_type in self.types:
            return True
        if self.fallback is None:
            return False
        result = self.fallback(request)
        return bool(await result) if hasattr(result, "__await__") else bool(result)

    def __repr__(self) -> str:
        return f"ResourceBlocker({sorted(self.types)!r})"


async def browser_headers(*, browser_type_name, playwright_request, scrapy_request_data):
    """scrapy-playwright's default header processing, without ``Proxy-Authorization``.

    A rendered request reaches its proxy through the browser context, which
    authenticates itself; a ``Proxy-Authorization`` header put on the Scrapy
    request (``HttpProxyMiddleware``) would otherwise be sent by the browser to
    the site itself inside an HTTPS tunnel."""
    headers = await use_scrapy_headers(browser_type_name=browser_type_name,
                                       playwright_request=playwright_request,
                                       scrapy_request_data=scrapy_request_data)
    return {k: v for k, v in headers.items() if k.lower() != "proxy-authorization"}


class RenderingDownloadHandler(HeaderLimitsMixin, ScrapyPlaywrightDownloadHandler):
    """scrapy-playwright's download handler, with the context operations the
    rendering middleware needs to keep the number of browser contexts bounded,
    and, where the process has the address guard (``DOWNLOAD_ALLOWED_NETWORKS``),
    every browser request through :class:`~crawlproject.egress.browser.EgressProxy`:
    a page whose own host (or its context's proxy) is refused is dead-lettered
    before the browser opens it, one redirected to a refused host is too, and a
    refused resource is not fetched (``egress/browser_refused``).

    (scrapy-playwright keeps a named context until it is closed, and its own
    ``PLAYWRIGHT_MAX_CONTEXTS`` waits for a free slot while holding its
    context lock: with named contexts nothing ever frees one.)

    Limits: requests it does not render are Scrapy's downloads with the header
    bounds of :mod:`crawlproject.limits.headers`. A rendered page is refused
    (:class:`RenderedPageTooLarge`, ``limits/rendered_too_large``) when, while it
    loads, one of its documents goes over ``DOWNLOAD_MAXSIZE`` (or its
    ``meta["download_maxsize"]``) decoded or all it received over
    ``RENDER_MAXSIZE`` (:mod:`crawlproject.rendering.limits` stops it then), or
    when its HTML (``page.content()``) is larger than ``DOWNLOAD_MAXSIZE``."""

    def __init__(self, crawler):
        super().__init__(crawler)
        self._bound_headers(crawler)
        self._render_maxsize = setting(crawler.settings, "RENDER_MAXSIZE")
        self._meters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def download_request(self, request):
        """scrapy-playwright's: rendered by the browser, else Scrapy's download."""
        return await self._bounded_download(super().download_request, request)

    @classmethod
    def from_crawler(cls, crawler):
        """One instance, hence one browser, for http and https (Scrapy builds a
        handler per scheme; scrapy-playwright would launch a browser for each)."""
        handlers = _HANDLERS.setdefault(crawler, [])
        if not handlers:
            handlers.append(cls(crawler))
        return handlers[0]

    # Playwright (its Node.js driver: ~0.8 s of CPU and a process) starts with the
    # first rendered request, not at engine start: a node that renders nothing,
    # or not yet, runs none. The browser itself was already launched on demand.
    def _engine_started(self):
        from twisted.internet.defer import succeed

        return succeed(None)

    async def _maybe_launch_in_thread(self) -> None:
        return None

    async def _download_request(self, request, spider=None):
        try:
            response = await self._render(request, spider)
        except Exception as exc:
            raise self._oversized(request) or exc
        return self._bounded_page(request, response)

    async def _render(self, request, spider):
        await self._started()
        egress = self.__dict__.get("_egress")
        if egress is None:
            return await super()._download_request(request, spider)
        await self._check_connection(request)
        since = time.monotonic()
        try:
            response = await super()._download_request(request, spider)
        except Exception as exc:
            raise self._navigation_refused(request, egress, since) or exc
        if response.headers.get(MARKER) == egress.token.encode():
            # The page is the egress proxy's own 403: its navigation was refused.
            raise self._navigation_refused(request, egress, since, at_least_latest=True)
        self._navigations.pop(request, None)
        return response

    def _maxsize(self, request) -> int:
        return request.meta.get("download_maxsize", self._default_maxsize)

    def _bounded_page(self, request, response):
        refusal = self._oversized(request)
        if refusal is not None:
            raise refusal
        maxsize = self._maxsize(request)
        if maxsize and len(response.body) > maxsize:
            raise self._refuse(request, f"the rendered page ({len(response.body)} bytes) is "
                                        f"larger than {maxsize} bytes (DOWNLOAD_MAXSIZE or "
                                        f"meta download_maxsize)")
        return response

    def _oversized(self, request) -> "RenderedPageTooLarge | None":
        meter = self._meters.pop(request, None)
        return None if meter is None or meter.over is None else self._refuse(request, meter.over)

    def _refuse(self, request, why: str) -> "RenderedPageTooLarge":
        exc = RenderedPageTooLarge(f"{request.url}: {why}")
        self._limit_report.refused(request, exc.reason, "%s", exc)
        return exc

    async def _started(self) -> None:
        # A flag of its own: _launch() sets browser_provider before it has started.
        if self.__dict__.get("_launched"):
            return
        lock = self.__dict__.setdefault("_start_lock", asyncio.Lock())
        async with lock:
            if not self.__dict__.get("_launched"):
                await self._guard_browser()
                await self._launch()
                self._launched = True

    async def _guard_browser(self) -> None:
        """Launch the browser behind the egress proxy (crawlproject.egress.browser)
        when this process has the address guard and the project set no browser
        proxy of its own; WebRTC may then use no UDP outside the proxy."""
        guard = active_guard()
        options = self.config.launch_options
        if guard is None or options.get("proxy") or self.config.cdp_url \
                or self.config.connect_url:
            return
        egress = EgressProxy(guard, report_for(self.crawler).browser_refused)
        server = await egress.start()
        args = [*options.get("args", ()), "--force-webrtc-ip-handling-policy="
                "disable_non_proxied_udp"]
        self.config.launch_options = {**options, "proxy": {"server": server}, "args": args}
        self._egress = egress
        self._navigations: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def _check_connection(self, request) -> None:
        """Check where the browser connects first for *request*: its context's proxy
        (reached by the browser directly), else the page's own host."""
        proxy = (request.meta.get("playwright_context_kwargs") or {}).get("proxy") or {}
        parts = urlsplit(proxy["server"] if proxy.get("server") else request.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        await checked_addresses(self.crawler, request, parts.hostname or "", port)

    async def _create_page(self, request, spider):
        page = await super()._create_page(request, spider)
        if self._maxsize(request) or self._render_maxsize:
            meter = PageMeter(self._maxsize(request), self._render_maxsize)
            if await meter.attach(page):
                self._meters[request] = meter
        navigations = self._navigations.setdefault(request, []) if self.__dict__.get(
            "_egress") else None
        if navigations is not None:
            # The main frame's requests (redirect hops too): which host a failed
            # navigation was refused at.
            page.on("request", lambda r: navigations.append(r.url)
                    if r.is_navigation_request() and r.frame == page.main_frame else None)
        return page

    def _navigation_refused(self, request, egress, since: float, at_least_latest=False):
        """The refusal of *request*'s page (its navigation, redirect hops included,
        refused by the egress proxy since *since*), given up; else None."""
        hosts = [urlsplit(url).hostname or "" for url in self._navigations.pop(request, ())]
        refusal = next((r for r in map(lambda h: egress.refusal(h, since), reversed(hosts))
                        if r is not None), None)
        if refusal is None and at_least_latest:
            refusal = egress.latest(since)
        return None if refusal is None else refuse(self.crawler, request, refusal)

    async def close(self) -> None:
        """Close once, although Scrapy calls it for each scheme."""
        if getattr(self, "_closing", False):
            return
        self._closing = True
        await super().close()
        if self.__dict__.get("_egress") is not None:
            await self._egress.close()

    def context_names(self) -> frozenset[str]:
        """Names of the browser contexts open now."""
        return frozenset(self.context_wrappers)

    def open_pages(self, name: str) -> int:
        """Pages open in context *name* (0 if it is not open)."""
        wrapper = self.context_wrappers.get(name)
        return len(wrapper.context.pages) if wrapper is not None else 0

    async def close_context(self, name: str) -> bool:
        """Close context *name*; False if it was not open."""
        wrapper = self.context_wrappers.get(name)
        if wrapper is None:
            return False
        # A browser that died meanwhile has closed the context already.
        with suppress(Exception):
            await wrapper.context.close()
        self.context_wrappers.pop(name, None)
        return True


class RenderedPageTooLarge(DownloadCancelledError):
    """A rendered page's HTML is larger than its ``DOWNLOAD_MAXSIZE`` (a
    ``DownloadCancelledError``, as Scrapy's own size refusal: not retried)."""

    reason = "rendered_too_large"


def handlers_for(crawler) -> list[RenderingDownloadHandler]:
    """The crawler's :class:`RenderingDownloadHandler` (a list: none before it is built)."""
    return _HANDLERS.get(crawler, [])


class ContextPool:
    """At most *limit* browser contexts in use or open, least recently used first out.

    :meth:`acquire` is awaited before a download needs context *name*:
    if the name is new and the pool is full, the least recently used context
    with no download in flight and no open page is closed (through the handlers
    *get_handlers* returns), or, when every context is busy, the call waits for
    a :meth:`release`. Names whose context the handler no longer has (the
    browser crashed and took them) with nothing in flight are forgotten."""

    def __init__(self, limit: int, get_handlers, stats):
        self.limit = limit
        self._get_handlers = get_handlers
        self.stats = stats
        self._inflight: OrderedDict[str, int] = OrderedDict()
        self._cond = asyncio.Condition()
        self._warned = False

    def __len__(self) -> int:
        return len(self._inflight)

    async def acquire(self, name: str) -> None:
        """Reserve context *name* for one download (see the class docstring)."""
        async with self._cond:
            while name not in self._inflight and len(self._inflight) >= self.limit:
                self._forget_closed()
                if len(self._inflight) < self.limit:
                    break
                victim = self._idle()
                if victim is not None:
                    await self._close(victim)
                    continue
                self._waiting()
                await self._cond.wait()
            self._inflight[name] = self._inflight.get(name, 0) + 1
            self._inflight.move_to_end(name)
            if len(self._inflight) > (self.stats.get_value("rendering/contexts/max") or 0):
                self.stats.set_value("rendering/contexts/max", len(self._inflight))

    async def release(self, name: str) -> None:
        """One download of context *name* is over."""
        async with self._cond:
            if self._inflight.get(name):
                self._inflight[name] -= 1
            self._cond.notify_all()

    def _idle(self) -> str | None:
        handlers = self._get_handlers()
        for name, count in self._inflight.items():  # oldest use first
            if count == 0 and not any(h.open_pages(name) for h in handlers):
                return name
        return None

    async def _close(self, name: str) -> None:
        del self._inflight[name]
        for handler in self._get_handlers():
            if await handler.close_context(name):
                self.stats.inc_value("rendering/contexts/closed_idle")

    def _forget_closed(self) -> None:
        handlers = self._get_handlers()
        if not handlers:
            return
        open_names = frozenset().union(*(h.context_names() for h in handlers))
        for name in [n for n, c in self._inflight.items() if c == 0 and n not in open_names]:
            del self._inflight[name]

    def _waiting(self) -> None:
        self.stats.inc_value("rendering/contexts/waits")
        if not self._warned:
            self._warned = True
            logger.info("All %d browser contexts are busy (RENDER_MAX_CONTEXTS): rendered "
                        "requests of other proxies or identities wait for one", self.limit)


class RenderingAddon:
    """Scrapy add-on: render with the system Chromium (see the module docstring)."""

    def update_settings(self, settings) -> None:
        """Fill in the rendering settings the project did not set itself."""
        if not rendering_enabled(settings):
            return
        handlers = settings["DOWNLOAD_HANDLERS"]
        for scheme in ("http", "https"):
            if handlers.get(scheme) in REPLACEABLE:
                _extend(handlers, scheme, HANDLER)
        settings.set("PLAYWRIGHT_BROWSER_TYPE", "chromium", "addon")
        settings.set("PLAYWRIGHT_MAX_PAGES_PER_CONTEXT", 4, "addon")
        settings.set("PLAYWRIGHT_PROCESS_REQUEST_HEADERS",
                     "crawlproject.rendering.browser_headers", "addon")
        _extend(settings, "PLAYWRIGHT_LAUNCH_OPTIONS", launch_options(settings))
        # A project may name them by their paths before the move
        # (crawlproject.middlewares.rendering): the same class, not added twice.
        named = {load_object(p) for p in settings.getdict("DOWNLOADER_MIDDLEWARES")}
        for path, priority in MIDDLEWARES.items():
            if load_object(path) not in named:
                settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", path,
                                                               priority)
        for path, priority in SPIDER_MIDDLEWARES.items():
            settings.setdefault_in_component_priority_dict("SPIDER_MIDDLEWARES", path, priority)
        retry = settings.getlist("RETRY_EXCEPTIONS")
        _extend(settings, "RETRY_EXCEPTIONS", retry + [e for e in RETRY_ERRORS if e not in retry])
        blocked = blocked_resource_types(settings)
        if blocked:
            _extend(settings, "PLAYWRIGHT_ABORT_REQUEST",
                    ResourceBlocker(blocked, settings.get("PLAYWRIGHT_ABORT_REQUEST")))


def launch_options(settings) -> dict:
    """``PLAYWRIGHT_LAUNCH_OPTIONS`` (default: headless with :data:`CHROMIUM_ARGS`)
    with ``executable_path`` from :func:`chromium_path`; an explicit
    ``CHROMIUM_PATH`` wins over the options' own path."""
    options = dict(settings.getdict("PLAYWRIGHT_LAUNCH_OPTIONS")) or {
        "headless": True, "args": list(CHROMIUM_ARGS)}
    explicit = explicit_chromium_path(settings)
    if explicit or not options.get("executable_path"):
        path = chromium_path(settings)
        if path:
            options["executable_path"] = path
    return options


def _extend(settings, name: str, value) -> None:
    # A value built from the project's own (extended, not replaced) keeps the
    # project's priority, so a lower-priority add-on write is not ignored.
    priority = max(settings.getpriority(name) or 0, SETTINGS_PRIORITIES["addon"])
    settings.set(name, value, priority)
