"""Rendering: crawlproject.rendering.addon (add-on, handler, context pool) and
crawlproject.rendering.middleware.

The first tests build the middleware on its own; the others run real
``scrapy crawl`` nodes with the system Chromium against the demo site and
tests/render_site.py. Chromium is slow on a loaded 2-core machine: few pages,
and waits on events, not sleeps."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter

import psutil
import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from devtools.demo.proxy import ForwardProxy
from devtools.demo.site import JS_PRODUCT_ID, DemoSite
from crawlproject.keys import FrontierKeys, start_urls_key
from crawlproject.rendering.content import (EmptyItemsMiddleware, MissingContent, WarningLimiter,
                                            empty_fields, wait_for_content, wait_for_idle)
from crawlproject.rendering.middleware import RenderIfMissingMiddleware, RenderingMiddleware
from crawlproject.identity.session import IDENTITY, PROXY_CONTEXT, PROXY_ID
from crawlproject.policy import InputPolicy, Refused
from crawlproject.rendering.addon import HANDLER, ContextPool, RenderingAddon, chromium_path
from crawlproject.serialization import (
    RequestDecodeError,
    RequestEncodeError,
    decode_request_dict,
    request_from_json,
    request_to_json,
)
from tests.crawl_helpers import ROOT, Node, node_env
from tests.render_site import RenderSite

SECRET = "s3cr3t-pass"
MW_SETTINGS = {"DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER},
               "RENDER_BLOCK_RESOURCES": []}
NODE = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4, "RETRY_BACKOFF_BASE": 0.1,
        "LOG_LEVEL": "INFO"}


def middleware(cls=RenderingMiddleware, **settings):
    crawler = get_crawler(Spider, {**MW_SETTINGS, **settings})
    return cls.from_crawler(crawler)


def proxied(url: str, password: str = SECRET, who: str = "1") -> Request:
    return Request(url, meta={
        PROXY_ID: "127.0.0.9:3128",
        PROXY_CONTEXT: {"server": "http://127.0.0.9:3128", "username": "user",
                        "password": password},
        IDENTITY: {"id": f"id{who}", "user_agent": f"Agent/{who}",
                   "headers": {"Accept-Language": "de-DE", "Accept": "text/html",
                               "Sec-CH-UA": '"Chromium";v="120"'}},
        "render": True, "playwright_context_kwargs": {"viewport": {"width": 800, "height": 600}}})


# -- the middleware on its own ---------------------------------------------------------------

def test_browser_context_per_proxy_and_identity_and_credentials_never_stored():
    mw = middleware()

    async def scenario():
        request = proxied("http://127.0.0.1/a")
        await mw.process_request(request)
        meta = request.meta
        name, options = meta["playwright_context"], meta["playwright_context_kwargs"]
        assert meta["playwright"] is True
        assert "127.0.0.9:3128" in name and "id1" in name and SECRET not in name
        assert options == {"viewport": {"width": 800, "height": 600},
                           "proxy": {"server": "http://127.0.0.9:3128", "username": "user",
                                     "password": SECRET},
                           "user_agent": "Agent/1",
                           "extra_http_headers": {"Accept-Language": "de-DE",
                                                  "Sec-CH-UA": '"Chromium";v="120"'}}
        # Stored mid-download (a copy taken by another component): no credentials,
        # and the spider's own context options are what is stored.
        payload = request_to_json(request, None)
        assert SECRET not in payload and "user" not in payload
        assert "_crawlproject" not in payload and "r:127" not in payload
        back = request_from_json(payload, None)
        assert back.meta["playwright_context_kwargs"] == {"viewport": {"width": 800, "height": 600}}
        assert "playwright_context" not in back.meta and back.meta["render"] is True
        # Same proxy and identity: same context; other credentials: another one.
        same, other = proxied("http://127.0.0.1/b"), proxied("http://127.0.0.1/c", "other")
        await mw.process_request(same)
        await mw.process_request(other)
        assert same.meta["playwright_context"] == name != other.meta["playwright_context"]
        # After the download the request holds what it held before (a retry copy is clean).
        response = HtmlResponse(request.url, body=b"<html></html>", request=request,
                                flags=["playwright"])
        assert await mw.process_response(request, response) is response
        assert "playwright_context" not in request.meta
        assert request.meta["playwright_context_kwargs"] == {"viewport": {"width": 800,
                                                                          "height": 600}}
        def mine(meta):  # the proxy middleware's own transient key aside
            return repr({k: v for k, v in meta.items() if k != PROXY_CONTEXT})

        assert SECRET not in mine(request.meta)
        await mw.process_exception(other, RuntimeError("x"))
        assert "other" not in mine(other.meta)

    asyncio.run(scenario())


def test_context_options_of_a_request_never_open_the_shared_context():
    """scrapy-playwright opens a context with the options of the first request
    naming it: a request's own options (stored ones too: offline, headers...)
    get a context of their own, never "default"; the name is for the download only."""
    mw = middleware(IDENTITY_ENABLED=False)

    async def scenario():
        offline = Request("http://127.0.0.1/a", meta={
            "render": True, "playwright_context_kwargs": {"offline": True}})
        again = Request("http://127.0.0.1/b", meta={
            "render": True, "playwright_context_kwargs": {"offline": True}})
        plain = Request("http://127.0.0.1/c", meta={"render": True})
        for request in (offline, again, plain):
            await mw.process_request(request)
        name = offline.meta["playwright_context"]
        assert name.startswith("r:-:-:") and again.meta["playwright_context"] == name
        assert plain.meta["playwright_context"] == "default"
        for request in (offline, plain):
            await mw.process_exception(request, RuntimeError("x"))
            assert "playwright_context" not in request.meta     # storable as it came
        assert offline.meta["playwright_context_kwargs"] == {"offline": True}

    asyncio.run(scenario())


def test_proxy_bypass_list_goes_into_proxied_contexts_only():
    mw = middleware(RENDER_PROXY_BYPASS=".internal,10.0.0.0/8")

    async def scenario():
        proxied_request, direct = proxied("http://127.0.0.1/a"), Request(
            "http://127.0.0.1/b", meta={"render": True})
        await mw.process_request(proxied_request)
        await mw.process_request(direct)
        options = proxied_request.meta["playwright_context_kwargs"]
        assert options["proxy"]["bypass"] == ".internal,10.0.0.0/8"
        assert "proxy" not in (direct.meta.get("playwright_context_kwargs") or {})

    asyncio.run(scenario())


def test_context_proxies_and_credentials_from_redis_are_refused():
    for options in ({"proxy": {"server": "http://evil:1"}},
                    {"http_credentials": {"username": "a", "password": "b"}}):
        payload = {"url": "http://127.0.0.1/", "meta": {"playwright": True,
                                                        "playwright_context_kwargs": options}}
        with pytest.raises(RequestDecodeError, match="not allowed"):
            decode_request_dict(payload)
        policy = InputPolicy.from_settings(Settings({"SEED_META_ALLOW": [
            "playwright", "playwright_context_kwargs"]}))
        with pytest.raises(Refused):
            policy.check_seed_meta(payload["meta"])
    # and a spider's own request cannot put one there either (clear error at enqueue)
    with pytest.raises(RequestEncodeError, match="proxy"):
        request_to_json(Request("http://127.0.0.1/", meta={
            "playwright_context_kwargs": {"proxy": {"server": "http://x:1"}}}), None)


def test_rules_decide_what_renders_and_a_page_missing_its_selector_comes_back_marked():
    rules = {"RENDER_URL_PATTERNS": [r"/always/"], "RENDER_IF_MISSING": {r"/item/": ".price"},
             "RENDER_WAIT_FOR_SELECTOR": {r"/always/": "#app"}}
    mw = middleware(**rules)
    missing = middleware(RenderIfMissingMiddleware, **rules)

    class OwnRules(Spider):
        name = "own"
        render_rules = [r"/spider-rule/"]
        render_if_missing = {r"/spider-item/": "h1"}

    mw.spider_opened(OwnRules())
    missing.spider_opened(OwnRules())

    async def scenario():
        decided = {}
        for url, meta in [("http://h/always/1", {}), ("http://h/spider-rule/1", {}),
                          ("http://h/other", {}), ("http://h/other", {"render": True}),
                          ("http://h/always/2", {"render": False})]:
            request = Request(url, meta=dict(meta))
            await mw.process_request(request)
            decided[(url, str(meta))] = request.meta.get("playwright", False)
        assert list(decided.values()) == [True, True, False, True, False]
        # The wait for the selector is a page method of the download only: once
        # (a retry does not add another), never stored with the request.
        request = Request("http://h/always/3")
        await mw.process_request(request)
        await mw.process_response(request, HtmlResponse(request.url, body=b"", request=request,
                                                        flags=["playwright"]))
        assert "playwright_page_methods" not in request.meta
        await mw.process_request(request)
        (wait,) = request.meta["playwright_page_methods"]
        assert (wait.method, wait.args) == (wait_for_content, ("#app", 15.0))
        assert "playwright_page_methods" not in request_from_json(
            request_to_json(request, None), None).meta

        static = Request("http://h/item/1")
        await mw.process_request(static)
        assert "playwright" not in static.meta
        lacking = HtmlResponse(static.url, body=b"<p>no price</p>", request=static)
        again = missing.process_response(static, lacking)
        assert isinstance(again, Request) and again.dont_filter and again.url == static.url
        assert again.meta["render"] is True and again.meta["render_wait_for"] == ".price"
        assert missing.stats.get_value("rendering/missing_selector") == 1
        request_from_json(request_to_json(again, None), None)    # it can go through Redis
        having = HtmlResponse(static.url, body=b'<p class="price">1</p>', request=static)
        assert missing.process_response(static, having) is having
        await mw.process_request(again)  # rendered: a missing selector is not asked again
        assert again.meta["playwright"] is True
        rendered = HtmlResponse(again.url, body=b"<p></p>", request=again, flags=["playwright"])
        assert missing.process_response(again, rendered) is rendered
        gone = HtmlResponse(static.url, status=404, body=b"", request=static)
        assert missing.process_response(static, gone) is gone
        spider_rule = Request("http://h/spider-item/1")
        assert isinstance(missing.process_response(spider_rule, HtmlResponse(
            spider_rule.url, body=b"<p></p>", request=spider_rule)), Request)

    asyncio.run(scenario())


def test_a_rendered_request_carries_no_validators_a_static_one_keeps_them():
    """A browser cannot show a 304 (the navigation aborts with ERR_ABORTED): a
    revisit's If-None-Match / If-Modified-Since, set by the recrawl middleware
    before this one, are dropped from a request rendered by rule or by meta."""
    mw = middleware(RENDER_URL_PATTERNS=[r"/js/"])
    validators = {"If-None-Match": '"v1"', "If-Modified-Since": "Sat, 05 Dec 2026 10:00:00 GMT"}

    async def scenario():
        by_rule = Request("http://h/js/1", headers=validators)
        by_meta = Request("http://h/page", headers=validators, meta={"render": True})
        static = Request("http://h/page", headers=validators)
        for request in (by_rule, by_meta, static):
            await mw.process_request(request)
        for request in (by_rule, by_meta):
            assert request.meta["playwright"] is True
            assert b"If-None-Match" not in request.headers
            assert b"If-Modified-Since" not in request.headers
        assert static.headers[b"If-None-Match"] == b'"v1"'

    asyncio.run(scenario())



def test_a_rendered_page_waits_for_its_selector_else_for_network_idle_for_the_download_only():
    """What a rendered page waits for before it is read (crawlproject.rendering.content)."""
    from scrapy_playwright.page import PageMethod

    rules = {"RENDER_URL_PATTERNS": [r"/r/"], "RENDER_WAIT_FOR_SELECTOR": {r"/r/sel": "#sel"},
             "RENDER_IF_MISSING": {r"/r/item": ".price"}, "RENDER_WAIT_TIMEOUT": 3}
    mw = middleware(**rules)

    def described(meta):
        return [(pm.method if isinstance(pm.method, str) else pm.method.__name__, pm.args[:1])
                for pm in meta.get("playwright_page_methods") or []]

    async def waits(url, **meta):
        request = Request(url, meta=meta)
        await mw.process_request(request)
        methods = described(request.meta)
        stored = request_from_json(request_to_json(request, None), None).meta
        await mw.process_response(request, HtmlResponse(url, body=b"", request=request,
                                                        flags=["playwright"]))
        # never stored, and back as they were once the download is over
        assert described(stored) == described(request.meta) == described(meta)
        return methods

    async def scenario():
        assert await waits("http://h/r/plain") == [("wait_for_idle", (2.0,))]
        assert await waits("http://h/r/sel") == [("wait_for_content", ("#sel",))]
        assert await waits("http://h/r/item/1") == [("wait_for_content", (".price",))]
        assert await waits("http://h/r/plain", render_wait_for="h1") == [
            ("wait_for_content", ("h1",))]
        # The request's own page methods or wait_until say how it waits...
        own = [PageMethod("wait_for_timeout", 100)]
        assert await waits("http://h/r/plain", playwright_page_methods=own) == [
            ("wait_for_timeout", (100,))]
        assert await waits("http://h/r/plain",
                           playwright_page_goto_kwargs={"wait_until": "networkidle"}) == []
        # ... a selector wait comes after them; one stored as data before is replaced.
        old = [PageMethod("click", "#more"), PageMethod("wait_for_selector", "h1")]
        assert await waits("http://h/r/plain", render_wait_for="h1",
                           playwright_page_methods=old) == [("click", ("#more",)),
                                                            ("wait_for_content", ("h1",))]
        assert await waits("http://h/static") == []        # not rendered at all
        assert mw.stats.get_value("rendering/waits/idle") == 1
        assert mw.stats.get_value("rendering/waits/selector") == 4
        off = middleware(RENDER_URL_PATTERNS=[r"/r/"], RENDER_WAIT_IDLE=0)
        request = Request("http://h/r/plain")
        await off.process_request(request)
        assert "playwright_page_methods" not in request.meta

    asyncio.run(scenario())


class _Page:
    """Stands in for a Playwright page whose waits time out (Chromium's timing
    is the crawl tests' business)."""

    def __init__(self):
        self.calls = []

    async def wait_for_selector(self, selector, **kwargs):
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        self.calls.append(("wait_for_selector", selector, kwargs))
        raise PlaywrightTimeout("Timeout exceeded")

    async def wait_for_load_state(self, state, **kwargs):
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        self.calls.append(("wait_for_load_state", state, kwargs))
        raise PlaywrightTimeout("Timeout exceeded")


def test_a_selector_that_never_comes_is_missing_content_and_a_busy_network_is_not_an_error():
    page, stats = _Page(), get_crawler(Spider).stats

    async def scenario():
        with pytest.raises(MissingContent, match=r"no '\.price' after 2s"):
            await wait_for_content(page, ".price", 2.0)
        await wait_for_idle(page, 1.5, stats)               # read as it is
        assert page.calls == [("wait_for_selector", ".price",
                               {"state": "attached", "timeout": 2000.0}),
                              ("wait_for_load_state", "networkidle", {"timeout": 1500.0})]
        assert stats.get_value("rendering/idle_timeout") == 1

    asyncio.run(scenario())


def test_missing_content_is_counted_and_warned_once_a_minute(caplog):
    now = [100.0]
    mw = middleware(RENDER_URL_PATTERNS=[r"/r/"])
    mw.limiter = WarningLimiter(mw.limiter.log, clock=lambda: now[0])

    async def fail(url):
        request = Request(url)
        await mw.process_request(request)
        assert await mw.process_exception(request, MissingContent(".price", 15.0)) is None
        assert "playwright_page_methods" not in request.meta    # the retry copy is clean

    async def scenario():
        with caplog.at_level("DEBUG", logger="crawlproject.rendering.middleware"):
            for n in range(3):
                await fail(f"http://h/r/{n}")
            now[0] += 61
            await fail("http://h/r/3")
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 2, warnings
        assert "http://h/r/0" in warnings[0] and "'.price'" in warnings[0]
        assert "http://h/r/3" in warnings[1] and "2 more like it" in warnings[1]
        assert mw.stats.get_value("rendering/missing_content") == 4
        assert mw.stats.get_value("rendering/missing_content/selector") == 4
        assert not mw.stats.get_value("rendering/errors/MissingContent")

    asyncio.run(scenario())


def test_empty_items_are_reported_rendered_as_missing_content_static_as_a_hint(caplog):
    from scrapy import Field, Item

    class Product(Item):
        url, title, price, rendered = Field(), Field(), Field(), Field()

    url = "http://h/product/1"
    static = HtmlResponse(url, body=b"", request=Request(url))
    rendered = HtmlResponse(url, body=b"", request=Request(url), flags=["playwright"])
    assert empty_fields({"url": url, "title": None, "price": " "}, static) == ["title", "price"]
    assert empty_fields(Product(url=url, rendered=True), static) == ["title", "price"]
    assert empty_fields({"link": url, "tags": ["", None], "n": None}, static) == ["tags", "n"]
    assert empty_fields({"url": url, "title": "T", "price": None}, static) == []
    assert empty_fields({"url": url, "price": 0}, static) == []          # 0 is data
    assert empty_fields({"url": url}, static) == []                       # nothing to miss
    crawler = get_crawler(Spider, MW_SETTINGS)
    mw = EmptyItemsMiddleware.from_crawler(crawler)
    items = [{"url": url, "title": None}, Request(url), {"url": url, "title": "T"}]
    with caplog.at_level("WARNING", logger="crawlproject.rendering.content"):
        assert list(mw.process_spider_output(rendered, items)) == items
        assert list(mw.process_spider_output(rendered, items)) == items
        assert list(mw.process_spider_output(static, items)) == items
    stats = crawler.stats
    assert stats.get_value("rendering/missing_content/empty_item") == 2
    assert stats.get_value("rendering/missing_content") == 2
    assert stats.get_value("rendering/static_empty_items") == 1
    first, hint = [r.getMessage() for r in caplog.records]          # rate-limited per kind
    assert first.startswith(f"Rendered page {url} gave an item with no data (title empty)")
    assert hint.startswith(f"Page {url} (not rendered)") and "RENDER_IF_MISSING" in hint
    with pytest.raises(NotConfigured):
        EmptyItemsMiddleware.from_crawler(get_crawler(Spider, {"RENDERING_ENABLED": False}))


@pytest.mark.parametrize("settings, message", [
    ({"RENDER_URL_PATTERNS": ["(unclosed"]}, "RENDER_URL_PATTERNS"),
    ({"RENDER_IF_MISSING": {"/x": "div[[["}}, "RENDER_IF_MISSING"),
    ({"RENDER_MAX_CONTEXTS": 0}, "RENDER_MAX_CONTEXTS"),
    ({"RENDER_WAIT_IDLE": -1}, "RENDER_WAIT_IDLE"),
    ({"PLAYWRIGHT_MAX_CONTEXTS": 2, "RENDER_MAX_CONTEXTS": 8}, "PLAYWRIGHT_MAX_CONTEXTS"),
])
def test_bad_settings_are_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        middleware(**settings)


def test_addon_settings_and_their_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("CHROMIUM_PATH", raising=False)
    settings = Settings({"RENDER_BLOCK_RESOURCES": ["image"]})
    RenderingAddon().update_settings(settings)
    assert settings.getwithbase("DOWNLOAD_HANDLERS")["https"] == HANDLER
    assert settings["PLAYWRIGHT_LAUNCH_OPTIONS"]["executable_path"] == chromium_path()
    assert "playwright.async_api.Error" in settings.getlist("RETRY_EXCEPTIONS")
    assert "crawlproject.rendering.content.MissingContent" in settings.getlist("RETRY_EXCEPTIONS")
    spider_middlewares = settings.getwithbase("SPIDER_MIDDLEWARES")
    assert spider_middlewares["crawlproject.rendering.content.EmptyItemsMiddleware"] == 800
    middlewares = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    assert middlewares["crawlproject.rendering.middleware.RenderingMiddleware"] == 620
    assert middlewares["crawlproject.rendering.middleware.RenderIfMissingMiddleware"] == 585
    with pytest.raises(ValueError, match="CHROMIUM_PATH"):
        RenderingAddon().update_settings(Settings({"CHROMIUM_PATH": str(tmp_path / "nope")}))
    with pytest.raises(ValueError, match="RENDER_BLOCK_RESOURCES"):
        RenderingAddon().update_settings(Settings({"RENDER_BLOCK_RESOURCES": ["document"]}))
    off = Settings({"RENDERING_ENABLED": False})
    RenderingAddon().update_settings(off)
    assert "http" not in off.getwithbase("DOWNLOAD_HANDLERS") or \
        off.getwithbase("DOWNLOAD_HANDLERS")["http"] != HANDLER


class _Contexts:
    """Stands in for the download handler's open contexts: the order in which
    the pool closes and waits is checked here without Chromium's timing."""

    def __init__(self):
        self.open, self.closed = set(), []

    def context_names(self):
        return frozenset(self.open)

    def open_pages(self, name):
        return 0

    async def close_context(self, name):
        self.closed.append(name)
        self.open.discard(name)
        return True


def test_pool_closes_the_least_recently_used_idle_context_or_waits():
    contexts = _Contexts()
    stats = get_crawler(Spider).stats
    pool = ContextPool(2, lambda: [contexts], stats)

    async def scenario():
        for name in ("a", "b"):
            await pool.acquire(name)
            contexts.open.add(name)
        await pool.release("a")
        await pool.release("b")
        await pool.acquire("a")             # a is now the most recently used
        await pool.release("a")
        await pool.acquire("c")             # closes b, the least recently used idle one
        contexts.open.add("c")
        assert contexts.closed == ["b"] and len(pool) == 2
        await pool.acquire("a")             # a and c busy: d must wait
        waiter = asyncio.ensure_future(pool.acquire("d"))
        await asyncio.sleep(0)
        assert not waiter.done() and stats.get_value("rendering/contexts/waits") == 1
        await pool.release("c")
        await asyncio.wait_for(waiter, 5)
        assert contexts.closed == ["b", "c"] and len(pool) == 2

    asyncio.run(scenario())



def test_a_node_that_renders_nothing_does_not_load_playwright():
    # Playwright's modules are objects that every full garbage collection
    # walks: with RENDERING_ENABLED off, the project's middleware list must not
    # import them (a fresh interpreter: this one has them loaded already).
    script = textwrap.dedent("""
        import sys
        from scrapy import Spider
        from scrapy.core.downloader.middleware import DownloaderMiddlewareManager
        from scrapy.utils.test import get_crawler
        import crawlproject.settings as project
        crawler = get_crawler(Spider, {"DOWNLOADER_MIDDLEWARES": project.DOWNLOADER_MIDDLEWARES,
                                       "RENDERING_ENABLED": False, "IDENTITY_ENABLED": False})
        manager = DownloaderMiddlewareManager.from_crawler(crawler)
        names = [type(m).__name__ for m in manager.middlewares]
        assert "RenderingMiddleware" not in names, names
        loaded = sorted(m for m in sys.modules
                        if m.split(".")[0] in ("playwright", "scrapy_playwright"))
        print(len(names), loaded)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, loaded = out.stdout.split(" ", 1)
    assert int(count) > 5 and loaded.strip() == "[]", out.stdout

# -- real crawls with Chromium ----------------------------------------------------------------

def run_node(tmp_path, env, name, spider, settings, seeds, redis, timeout=240):
    node = Node(name, tmp_path, env, spider=spider, settings={**NODE, **settings})
    try:
        node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key(spider), *seeds)
        assert node.wait(timeout) == 0, node.tail()
    finally:
        node.stop()
    return node


@pytest.mark.slow
def test_demo_javascript_page_yields_its_data_only_when_rendered(redis, redis_url, mongo_uri,
                                                                 database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    js_url = None
    with DemoSite(products=JS_PRODUCT_ID, per_page=10, faults=False) as site:
        js_url = f"{site.url}product/{JS_PRODUCT_ID}"
        own = {"SPIDER_MODULES": "crawlproject.spiders"}
        node = run_node(tmp_path, env, "on", "products", own, [site.url], redis)
        rendered = database["products"].find_one({"url": js_url})
        assert rendered and rendered["rendered"] is True and rendered["title"], node.tail()
        assert node.stat("rendering/requests/meta") == 1
        assert database["products"].count_documents({}) == JS_PRODUCT_ID
        redis.flushall()
        database["products"].drop()
        off = run_node(tmp_path, env, "off", "products", {**own, "RENDERING_ENABLED": False},
                       [site.url], redis)
    # Without rendering the page has no title or price: the item is invalid and dropped.
    assert database["products"].find_one({"url": js_url}) is None
    assert database["products"].count_documents({}) == JS_PRODUCT_ID - 1
    assert off.stat("validation/dropped/ProductItem/title_missing") == 1, off.tail()


@pytest.mark.slow
def test_render_if_missing_renders_exactly_the_pages_lacking_the_selector_without_media(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    # The site gzips its pages: the selector is looked for in the decoded page.
    settings = {"RENDER_IF_MISSING": json.dumps({r"/(static|js)/": ".title"})}
    with RenderSite() as site:
        seeds = [f"{site.url}{kind}/{n}" for kind in ("static", "js") for n in (1, 2)]
        node = run_node(tmp_path, env, "missing", "render", settings, seeds, redis)
        hits = site.hits()
    items = {d["url"]: d for d in database["render"].find({}, {"_id": 0})}
    assert {u: (d["title"], d["rendered"]) for u, d in items.items()} == {
        f"{site.url}static/1": ("Static 1", False), f"{site.url}static/2": ("Static 2", False),
        f"{site.url}js/1": ("Rendered 1", True), f"{site.url}js/2": ("Rendered 2", True)}
    # Static pages fetched once; the others once statically, once by the browser
    # (which also fetched their script).
    assert [hits[f"/static/{n}"] for n in (1, 2)] == [1, 1]
    assert [hits[f"/js/{n}"] for n in (1, 2)] == [2, 2]
    assert hits["/app.js"] >= 1
    assert node.stat("rendering/missing_selector") == 2
    # Images, fonts and media were asked for by the pages and never fetched.
    assert node.stat("playwright/request_count/aborted") >= 2
    assert not [p for p in hits if p.startswith(("/img/", "/font/", "/media/"))], hits


def chromium_browsers(pid: int) -> list[psutil.Process]:
    """The browser processes (not their renderers) started under node *pid*."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if "chrom" in proc.name() and "--type=" not in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
def test_a_killed_browser_is_restarted_and_the_page_retried(redis, redis_url, mongo_uri,
                                                            database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    # The page's script writes the title 30 ms after load: wait for it (without
    # it the page may be read before, more often the faster the machine).
    settings = {"RENDER_URL_PATTERNS": "/hang/", "RENDER_WAIT_FOR_SELECTOR": ".title"}
    with RenderSite() as site:
        node = Node("crash", tmp_path, env, spider="render", settings={**NODE, **settings})
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("render"), f"{site.url}hang/1", f"{site.url}js/1")
            # The browser is rendering /hang/1 (held by the site) when it dies.
            site.wait_for(lambda s: s.hits()["/hang/1"] >= 1)
            browsers = chromium_browsers(node.proc.pid)
            assert browsers, "no Chromium under the node"
            for proc in browsers:
                proc.kill()
            psutil.wait_procs(browsers, timeout=30)
            site.release()
            assert node.wait(240) == 0, node.tail()
        finally:
            node.stop()
        hits = site.hits()
    item = database["render"].find_one({"url": f"{site.url}hang/1"})
    assert item and item["title"] == "Rendered 1" and item["rendered"] is True, node.tail(80)
    assert hits["/hang/1"] >= 2
    assert node.stat("playwright/browser_count") >= 2       # a new browser was launched
    assert database["render"].count_documents({}) == 2


@pytest.mark.slow
def test_browser_contexts_follow_the_identity_and_stay_within_the_bound(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    settings = {"RENDER_URL_PATTERNS": "/js/", "RENDER_MAX_CONTEXTS": 2,
                "RENDER_WAIT_FOR_SELECTOR": ".title"}
    with RenderSite() as site:
        seeds = [f"{site.url}js/{n}?who={n}" for n in range(1, 6)] + [f"{site.url}js/6?who=1"]
        node = run_node(tmp_path, env, "ctx", "render_sessions", settings, seeds, redis)
    items = {d["url"]: d for d in database["render_sessions"].find({}, {"_id": 0})}
    assert len(items) == 6, node.tail()
    for url, item in items.items():
        who = url.rpartition("=")[2]
        assert item["rendered"] and item["ua"] == f"RenderTestAgent/{who}", item
    assert node.stat("playwright/context_count") >= 5
    assert node.stat("playwright/context_count/max_concurrent") <= 2
    assert node.stat("rendering/contexts/max") == 2
    assert node.stat("rendering/contexts/closed_idle") >= 3


@pytest.mark.slow
def test_a_users_own_project_renders_with_one_settings_line_and_its_chromium_path(tmp_path):
    project = tmp_path / "userproj"
    (project / "userproj" / "spiders").mkdir(parents=True)
    (project / "scrapy.cfg").write_text("[settings]\ndefault = userproj.settings\n")
    (project / "userproj" / "__init__.py").write_text("")
    (project / "userproj" / "spiders" / "__init__.py").write_text("")
    marker = tmp_path / "chromium-used"
    wrapper = tmp_path / "my-chromium"
    wrapper.write_text(f"#!/bin/sh\necho used >> {marker}\nexec {chromium_path()} \"$@\"\n")
    wrapper.chmod(0o755)
    (project / "userproj" / "settings.py").write_text(textwrap.dedent(f"""
        SPIDER_MODULES = ["userproj.spiders"]
        ROBOTSTXT_OBEY = False
        ADDONS = {{"crawlproject.rendering.RenderingAddon": 0}}
        CHROMIUM_PATH = {str(wrapper)!r}
    """))
    (project / "userproj" / "spiders" / "shop.py").write_text(textwrap.dedent("""
        import scrapy

        class Shop(scrapy.Spider):
            name = "shop"

            async def start(self):
                yield scrapy.Request(self.url, meta={"render": True,
                                                     "render_wait_for": ".title"})

            def parse(self, response):
                yield {"title": response.css(".title::text").get()}
    """))
    out = tmp_path / "items.jsonl"
    with RenderSite() as site:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
        env.pop("CHROMIUM_PATH", None)
        env.pop("SCRAPY_SETTINGS_MODULE", None)   # the user's project, from its scrapy.cfg
        done = subprocess.run(
            [sys.executable, "-m", "scrapy", "crawl", "shop", "-a", f"url={site.url}js/1",
             "-O", f"{out}:jsonlines", "-s", "LOG_LEVEL=INFO"],
            cwd=project, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"title": "Rendered 1"}], done.stderr[-3000:]
    assert marker.exists(), "CHROMIUM_PATH was not the browser launched"


@pytest.mark.slow
def test_rendered_pages_go_through_the_pool_proxy_with_the_sessions_identity(
        redis, redis_url, mongo_uri, database, tmp_path):
    """The real proxy (600) and identity (610) middlewares, not stand-ins: the
    browser context of a rendered page uses the pool's proxy with its
    credentials and the session's identity, the same one the static pages of
    the session were fetched with; the credentials appear nowhere."""
    env = node_env(redis_url, mongo_uri, database.name)
    password = "Rend3r-Pr0xy-Secret"
    with RenderSite() as site, ForwardProxy("rend", password) as proxy:
        settings = {"RENDER_URL_PATTERNS": "/js/", "PROXY_POOL_ENABLED": True,
                    "PROXY_POOL": proxy.url, "IDENTITY_ENABLED": True,
                    "RENDER_WAIT_FOR_SELECTOR": ".title"}
        seeds = [f"{site.url}static/1", f"{site.url}js/1", f"{site.url}js/2"]
        node = run_node(tmp_path, env, "via", "render", settings, seeds, redis)
        hits = site.hits()
        relayed = Counter(r.path for r in proxy.relayed())
        agents = {path: set(site.agents(path)) for path in ("/static/1", "/js/1", "/js/2")}
    items = {d["url"].rpartition("/")[0].rpartition("/")[2] + "/" + d["url"].rpartition("/")[2]: d
             for d in database["render"].find({}, {"_id": 0})}
    assert {k: (d["title"], d["rendered"]) for k, d in items.items()} == {
        "static/1": ("Static 1", False), "js/1": ("Rendered 1", True),
        "js/2": ("Rendered 2", True)}, node.tail(80)
    # Every request the site saw came through the proxy: the downloader's and the browser's
    # (the page and its script).
    for path in ("/static/1", "/js/1", "/js/2", "/app.js"):
        assert hits[path] >= 1 and relayed[path] == hits[path], (path, hits, relayed)
    # One session (one proxy): one identity, a real browser's, in the headers of the
    # static page and as navigator.userAgent of the rendered ones.
    static_ua = agents["/static/1"]
    assert len(static_ua) == 1 and "Scrapy" not in next(iter(static_ua))
    assert agents["/js/1"] == agents["/js/2"] == static_ua, agents
    assert {items["js/1"]["ua"], items["js/2"]["ua"]} == static_ua
    assert "HeadlessChrome" not in items["js/1"]["ua"]
    assert node.stat("rendering/requests/rule") == 2
    stored = "\n".join(f"{k!r} {redis.dump(k)!r}" for k in redis.scan_iter(count=1000))
    leaks = [where for where, text in (("log", node.text()), ("redis", stored))
             if password in text or base64.b64encode(f"rend:{password}".encode()).decode() in text]
    assert not leaks, leaks


@pytest.mark.slow
def test_a_rendered_request_survives_a_node_kill(redis, redis_url, mongo_uri, database,
                                                 tmp_path):
    """SIGKILL a node (and its browser) while Chromium renders a page: the
    page's lease comes back to the frontier and a second node renders it; every
    page is stored, none written twice."""
    env = node_env(redis_url, mongo_uri, database.name)
    # Short leases keep the test quick; the mechanism is the default one.
    settings = {**NODE, "RENDER_URL_PATTERNS": "/(js|hang)/", "SCHEDULER_LEASE_TTL": 4,
                "SCHEDULER_HEARTBEAT_INTERVAL": 1, "RENDER_WAIT_FOR_SELECTOR": ".title"}
    with RenderSite() as site:
        seeds = [f"{site.url}hang/1", f"{site.url}js/1", f"{site.url}js/2", f"{site.url}static/1"]
        victim = Node("victim", tmp_path, env, spider="render", settings=settings)
        survivor = None
        try:
            victim.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("render"), *seeds)
            # The victim's browser is rendering /hang/1 (held by the site) when it dies.
            site.wait_for(lambda s: s.hits()["/hang/1"] >= 1)
            inflight = redis.hgetall(FrontierKeys("render").inflight)
            assert any(owner.decode().startswith("victim-") for owner in inflight.values()), (
                "the victim held no lease: the test proves nothing")
            browsers = chromium_browsers(victim.proc.pid)
            victim.kill()
            for proc in browsers:  # an orphaned browser would go on rendering
                proc.kill()
            psutil.wait_procs(browsers, timeout=30)
            site.release()
            survivor = Node("survivor", tmp_path, env, spider="render", settings=settings)
            assert survivor.wait(240) == 0, survivor.tail()
        finally:
            victim.stop()
            if survivor is not None:
                survivor.stop()
        hits = site.hits()
    items = {d["url"]: d for d in database["render"].find({}, {"_id": 0})}
    assert set(items) == set(seeds), survivor.tail(80)
    hang = items[f"{site.url}hang/1"]
    assert hang["title"] == "Rendered 1" and hang["rendered"] is True
    assert hits["/hang/1"] == 2                       # the victim's try, the survivor's
    assert survivor.stat("scheduler/reclaimed") >= 1
    assert survivor.stat("mongo/modified") == 0        # nothing stored twice with changes


# -- a user's own project made by `scrapy startproject`, with the README's settings ---------

USER_SPIDER = '''
from crawlproject.spiders import RedisSpider


class Shop(RedisSpider):
    name = "shop"

    def parse(self, response):
        yield {"url": response.url, "title": response.css(".title::text").get(),
               "price": response.css(".price::text").get()}
'''


def readme_settings_block() -> str:
    """The settings block of README.md's "Use it in your own Scrapy project", as
    written there (the test breaks when the README changes it)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Use it in your own Scrapy project", 1)[1]
    block = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert "crawlproject.rendering.RenderingAddon" in block, block
    return block


def user_project(tmp_path, redis_url, mongo_uri, database) -> tuple:
    """``scrapy startproject shop``; its settings.py gets the README's block and
    where the local Redis and MongoDB are; a spider as a user writes one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SCRAPY_SETTINGS_MODULE", None)
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "shop"], cwd=tmp_path,
                   env=env, check=True, capture_output=True, timeout=60)
    project = tmp_path / "shop"
    settings = project / "shop" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + readme_settings_block() + "\n"
                        'DOWNLOAD_ALLOWED_NETWORKS = ["loopback"]\n'   # the test sites
                        f"REDIS_URL = {redis_url!r}\nMONGO_URI = {mongo_uri!r}\n"
                        f"MONGO_DATABASE = {database.name!r}\n")
    (project / "shop" / "spiders" / "shop.py").write_text(USER_SPIDER)
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    return project, env


def crawl_user_project(project, env, name, *settings, timeout=240):
    """``scrapy crawl shop`` in the project until it is idle; its log text."""
    log = project / f"{name}.log"
    cmd = [sys.executable, "-m", "scrapy", "crawl", "shop", "-s", f"LOG_FILE={log}",
           "-s", "LOG_LEVEL=INFO", "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3"]
    for value in settings:
        cmd += ["-s", value]
    done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)
    text = log.read_text(errors="replace") if log.exists() else ""
    assert done.returncode == 0, done.stderr[-3000:] + text[-3000:]
    return text


def log_stat(text: str, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", text)
    return int(match.group(1)) if match else 0


def warnings_naming(text: str, *words: str) -> list[str]:
    return [line for line in text.splitlines()
            if "] WARNING:" in line and all(w in line for w in words)]


@pytest.mark.slow
def test_the_readme_recipe_renders_a_product_page_written_after_load_and_reports_one_without(
        redis, redis_url, mongo_uri, database, tmp_path):
    """The issue as a user found it: a fresh ``scrapy startproject`` with the
    README's block pasted; a product page whose title and price a script writes
    50 ms after load is stored with them; a product page that never gets its
    price is reported (stat, one WARNING naming it and the selector), retried,
    dead-lettered, and not stored empty."""
    project, env = user_project(tmp_path, redis_url, mongo_uri, database)
    with RenderSite() as site:
        good, gone = f"{site.url}product/1", f"{site.url}product/gone-1"
        redis.lpush(start_urls_key("shop"), good, gone)
        log = crawl_user_project(project, env, "readme", "RENDER_WAIT_TIMEOUT=2",
                                 "RETRY_TIMES=1")
        hits = site.hits("/product/")
    items = {d["url"]: d for d in database["shop"].find({}, {"_id": 0})}
    assert set(items) == {good}, log[-4000:]
    assert (items[good]["title"], items[good]["price"]) == ("Product 1", "19.99")
    assert hits == {"/product/1": 2, "/product/gone-1": 3}   # static, then rendered (gone: twice)
    assert log_stat(log, "rendering/missing_content") == 2, log[-4000:]
    assert len(warnings_naming(log, gone, ".price")) == 1, log[-4000:]
    (dead,) = [json.loads(d) for d in redis.lrange(FrontierKeys("shop").dead, 0, -1)]
    assert gone in json.dumps(dead) and ".price" in json.dumps(dead), dead


@pytest.mark.slow
def test_a_page_rendered_by_url_rule_alone_is_read_after_its_script_and_an_empty_one_reported(
        redis, redis_url, mongo_uri, database, tmp_path):
    """The issue's second case: no selector at all, only ``RENDER_URL_PATTERNS``.
    The page is read once its network is idle (the script's write 50 ms after
    load included); a rendered page whose item has no data is reported."""
    project, env = user_project(tmp_path, redis_url, mongo_uri, database)
    with RenderSite() as site:
        good, gone = f"{site.url}product/2", f"{site.url}product/gone-2"
        redis.lpush(start_urls_key("shop"), good, gone)
        log = crawl_user_project(project, env, "rule", "RENDER_IF_MISSING={}",
                                 "RENDER_URL_PATTERNS=/product/")
        hits = site.hits("/product/")
    items = {d["url"]: d for d in database["shop"].find({}, {"_id": 0})}
    assert (items[good]["title"], items[good]["price"]) == ("Product 2", "29.99"), log[-4000:]
    assert (items[gone]["title"], items[gone]["price"]) == (None, None)
    assert hits == {"/product/2": 1, "/product/gone-2": 1}   # rendered only
    assert log_stat(log, "rendering/missing_content/empty_item") == 1, log[-4000:]
    assert len(warnings_naming(log, gone)) == 1, log[-4000:]
    assert not warnings_naming(log, good)
