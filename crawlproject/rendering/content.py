"""What a rendered page waits for before it is read, and what a page that lacks
its content does: it is reported, never passed on as if nothing were wrong.

scrapy-playwright reads a page (``page.content()``) once its ``load`` event
fired, before the timers and requests of its scripts: content a script writes
50 ms later is not there. The rendering middleware adds, for the download only
(never stored with the request), one wait:

* the page's **required selector** (:func:`required_selector`): it waits until
  the selector is in the page, at most ``RENDER_WAIT_TIMEOUT`` seconds; a page
  that never has it is *missing content*: :class:`MissingContent` fails the
  download (retried, then dead-lettered with the reason), counted in
  ``rendering/missing_content`` and ``rendering/missing_content/selector``, and
  reported by a WARNING naming the URL and the selector;
* else, unless the request brings page methods or a ``wait_until`` of its own,
  **network idle** (Playwright's ``networkidle``: no request for 500 ms, which
  covers a script's timers and the requests they make), at most
  ``RENDER_WAIT_IDLE`` seconds; a page still busy then is read as it is
  (``rendering/idle_timeout``).

With no selector the content a page must have is what its callback makes of it:
:class:`EmptyItemsMiddleware` reports an item with no data (every field but the
URL and true/false flags empty): from a rendered page as missing content
(``rendering/missing_content/empty_item``), from a static one as a hint that it
may need rendering (``rendering/static_empty_items``). The item goes on: the
pipelines decide (the validation pipeline drops an item without its required
fields).

Warnings are rate-limited (:class:`WarningLimiter`): the first at once, then one a
minute at most with the number of those in between; the others are DEBUG lines.
No Playwright import at module level: the add-on names this module in
``RETRY_EXCEPTIONS`` and ``SPIDER_MIDDLEWARES``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from itemadapter import ItemAdapter, is_item
from scrapy.exceptions import NotConfigured

from crawlproject.rendering.settings import rendering_enabled

logger = logging.getLogger(__name__)

REPORT_INTERVAL = 60.0
SELECTORS_NAMED = ("RENDER_WAIT_FOR_SELECTOR, RENDER_IF_MISSING or meta['render_wait_for']")


class MissingContent(Exception):
    """A rendered page that never had its required selector."""

    def __init__(self, selector: str, timeout: float):
        super().__init__(f"the rendered page has no {selector!r} after {timeout:g}s "
                         "(RENDER_WAIT_TIMEOUT)")
        self.selector, self.timeout = selector, timeout


def required_selector(request, rules, max_length: int) -> str | None:
    """The selector a rendered *request* must have: ``meta["render_wait_for"]``,
    else ``RENDER_WAIT_FOR_SELECTOR``'s, else ``RENDER_IF_MISSING``'s for its URL."""
    selector = request.meta.get("render_wait_for")
    if isinstance(selector, str) and 0 < len(selector) <= max_length:
        return selector
    return rules.wait_selector(request.url) or rules.missing_selector(request.url)


async def wait_for_content(page, selector: str, timeout: float) -> None:
    """Page method: wait until *selector* is in the page; :class:`MissingContent` if
    it is not after *timeout* seconds."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_selector(selector, state="attached", timeout=timeout * 1000)
    except PlaywrightTimeout:
        raise MissingContent(selector, timeout) from None


async def wait_for_idle(page, timeout: float, stats) -> None:
    """Page method: wait for network idle, at most *timeout* seconds (then go on)."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_load_state("networkidle", timeout=timeout * 1000)
    except PlaywrightTimeout:
        stats.inc_value("rendering/idle_timeout")


class WarningLimiter:
    """WARNINGs of one kind: the first at once, then one per *interval* seconds at
    most, telling how many were held back since; the held-back ones are DEBUG."""

    def __init__(self, log: logging.Logger = logger, interval: float = REPORT_INTERVAL,
                 clock=time.monotonic):
        self.log, self.interval, self.clock = log, interval, clock
        self._next: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def warn(self, kind: str, message: str, *args, extra: dict | None = None) -> None:
        now = self.clock()
        if now < self._next.get(kind, now):
            self._held[kind] += 1
            self.log.debug(message, *args, extra=extra)
            return
        self._next[kind] = now + self.interval
        held = self._held.pop(kind, 0)
        if held:
            message += " (%d more like it in the last %gs: DEBUG lines)"
            args += (held, self.interval)
        self.log.warning(message, *args, extra=extra)


class _DropMissingContentTraceback(logging.Filter):
    """scrapy-playwright logs every failed page as a WARNING with its traceback;
    a page missing its content is reported once by the rendering middleware."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(getattr(record, "exception", None), MissingContent)


PLAYWRIGHT_LOG_FILTER = _DropMissingContentTraceback()


def quiet_playwright_log() -> None:
    """Install :data:`PLAYWRIGHT_LOG_FILTER` on scrapy-playwright's logger (once)."""
    logging.getLogger("scrapy-playwright").addFilter(PLAYWRIGHT_LOG_FILTER)


def empty_fields(item, response) -> list[str]:
    """The content fields of *item* when none has a value; [] when one has (or it
    has none). A field named ``url``, one holding the page's URL and a true/false
    flag are not content."""
    adapter = ItemAdapter(item)
    urls = {response.url, getattr(response.request, "url", None)}
    names = []
    for name in adapter.field_names():
        value = adapter.get(name)
        if name == "url" or isinstance(value, bool) or (isinstance(value, str) and value in urls):
            continue
        if _has_value(value):
            return []
        names.append(name)
    return names


def _has_value(value) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return bool(value.strip())
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return any(_has_value(v) for v in (value.values() if isinstance(value, dict) else value))
    return True


class EmptyItemsMiddleware:
    """Spider middleware: report items with no data (see the module docstring)."""

    def __init__(self, crawler, limiter: WarningLimiter | None = None):
        self.crawler = crawler
        self.stats = crawler.stats
        self.limiter = limiter or WarningLimiter()

    @classmethod
    def from_crawler(cls, crawler):
        if not rendering_enabled(crawler.settings):
            raise NotConfigured
        return cls(crawler)

    def process_spider_output(self, response, result, spider=None):
        for obj in result:
            self._check(obj, response)
            yield obj

    async def process_spider_output_async(self, response, result, spider=None):
        async for obj in result:
            self._check(obj, response)
            yield obj

    def _check(self, obj, response) -> None:
        if not is_item(obj):
            return
        fields = empty_fields(obj, response)
        if not fields:
            return
        extra = {"spider": self.crawler.spider}
        if "playwright" in response.flags:
            self.stats.inc_value("rendering/missing_content")
            self.stats.inc_value("rendering/missing_content/empty_item")
            self.limiter.warn(
                "rendered", "Rendered page %s gave an item with no data (%s empty): read "
                "before its content came, or it has none. Name the selector it must have (%s): "
                "it then waits for it and is refused without it", response.url,
                ", ".join(fields), SELECTORS_NAMED, extra=extra)
        else:
            self.stats.inc_value("rendering/static_empty_items")
            self.limiter.warn(
                "static", "Page %s (not rendered) gave an item with no data (%s empty): if a "
                "script writes its content, render it (RENDER_IF_MISSING, RENDER_URL_PATTERNS "
                "or meta['render']; docs/middlewares.md, Rendering)", response.url,
                ", ".join(fields), extra=extra)
