"""Crawler traps (crawlproject/traps/): long links, repeating paths, a page of
100,000 links, and the per-site budget's default.

The middlewares are driven as Scrapy drives them: the project's
``SPIDER_MIDDLEWARES`` (the trap entries of crawlproject/settings.py) built by
Scrapy's ``SpiderMiddlewareManager`` around a callback's output, start requests
through ``process_start``. Whole crawls against trap sites, with the frontier:
tests/test_traps_crawl.py."""

from __future__ import annotations

import asyncio
import logging

import pytest
from scrapy import Request, Spider
from scrapy.core.spidermw import SpiderMiddlewareManager
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.spiders import SitemapSpider
from scrapy.utils.test import get_crawler

from crawlproject import settings as project_settings
from crawlproject.scheduling.sitepoliteness import SitePoliteness
from crawlproject.traps.pace import DROPS_PER_TURN
from crawlproject.traps.pagerequests import PageRequestsMiddleware
from crawlproject.traps.pathrepeat import PathRepeatMiddleware, repeat_pattern, repeats

SITE = "http://127.0.0.51"


def traps_only() -> dict:
    """The trap and meta robots entries of the project's SPIDER_MIDDLEWARES
    (also proves they are listed there, and Scrapy's URL-length check is not)."""
    mws = {path: order for path, order in project_settings.SPIDER_MIDDLEWARES.items()
           if ".traps." in path or path.endswith("UrlLengthMiddleware")}
    assert mws["scrapy.spidermiddlewares.urllength.UrlLengthMiddleware"] is None
    assert {"crawlproject.traps.urllength.UrlLengthMiddleware",
            "crawlproject.traps.pathrepeat.PathRepeatMiddleware",
            "crawlproject.traps.pagerequests.PageRequestsMiddleware",
            "crawlproject.traps.metarobots.MetaRobotsMiddleware"} <= set(mws)
    return mws


def manager(settings: dict | None = None, spidercls=Spider):
    crawler = get_crawler(spidercls, {"SPIDER_MIDDLEWARES": traps_only(), **(settings or {})})
    crawler.spider = crawler._create_spider("traps")
    return crawler, SpiderMiddlewareManager.from_crawler(crawler)


def page(url: str = f"{SITE}/", body: bytes = b"<html><body>hi</body></html>",
         headers: dict | None = None, meta: dict | None = None) -> HtmlResponse:
    return HtmlResponse(url, body=body, headers=headers, encoding="utf-8",
                        request=Request(url, meta=meta or {}))


async def outputs(mw: SpiderMiddlewareManager, response, callback) -> list:
    async def scrape(resp, request):
        return callback(resp)

    chain = await mw.scrape_response_async(scrape, response, response.request)
    return [o async for o in chain]


def run(settings: dict | None, response, callback) -> tuple[list, dict]:
    crawler, mw = manager(settings)
    out = asyncio.run(outputs(mw, response, callback))
    return out, crawler.stats.get_stats()


# --- repeating path segments ------------------------------------------------------

@pytest.mark.parametrize("path, trapped", [
    ("/a/b/a/b/a/b", True), ("/a/b/a/b/a/b/", True), ("/x/x/x", True),
    ("/x/x/x/y.html", True), ("/shop/a/b/c/b/c/b/c/item", True),
    ("/p/q/r/s/t/u/v/w/x/y/p/q/r/s/t/u/v/w/x/y/p/q/r/s/t/u/v/w/x/y/", True),   # a run of 10
    ("/a////b", True),                       # three empty segments in a row
    ("/x/x", False), ("/x/x/", False), ("/x/x/x.html", False), ("/2024/01/01/", False),
    ("/a/b/a/b/", False), ("/a/b/c/a/b/c/", False), ("/a//b", False), ("/", False), ("", False),
    ("/docs/api/v1/docs/api/v1/", False),
])
def test_a_segment_run_may_occur_twice_in_a_row_not_three_times(path, trapped):
    """Heritrix's PathologicalPathDecideRule with maxRepetitions = 2."""
    assert repeats(path, repeat_pattern(2)) is trapped


def test_the_limit_is_a_setting_and_zero_turns_the_check_off():
    assert not repeats("/x/x/x", repeat_pattern(3)) and repeats("/x/x/x/x", repeat_pattern(3))
    assert repeats("/x/x", repeat_pattern(1))
    with pytest.raises(NotConfigured):
        PathRepeatMiddleware.from_crawler(get_crawler(Spider, {"PATH_REPEAT_LIMIT": 0}))


def test_a_long_adversarial_path_is_checked_in_linear_time():
    """A path of 1,000 segments without any cube (Thue-Morse) is the worst case:
    the run length is bounded, so the search is linear in the path."""
    thue_morse = "/".join("ab"[bin(i).count("1") % 2] for i in range(1000))
    assert not repeats("/" + thue_morse + "/", repeat_pattern(2))


def test_links_with_repeating_paths_are_dropped_counted_and_said_once_per_site(caplog):
    """From a page's output only: seeds and start requests are pages asked for."""
    def callback(response):
        yield Request(f"{SITE}/a/b/a/b/a/b/")
        yield Request(f"{SITE}/a/b/a/b/")
        yield {"url": response.url}
        yield Request(f"{SITE}/x/x/x/x")

    with caplog.at_level(logging.DEBUG, logger="crawlproject.traps"):
        out, stats = run(None, page(f"{SITE}/a/b/a/b/"), callback)
    assert [getattr(o, "url", o) for o in out] == [f"{SITE}/a/b/a/b/", {"url": f"{SITE}/a/b/a/b/"}]
    assert stats["traps/path_repeat"] == 2
    said = [r for r in caplog.records if "repeats a segment run" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]
    assert [r.levelname for r in caplog.records if "repeats itself" in r.getMessage()] == ["DEBUG"]


def test_seeds_and_start_requests_pass_every_trap_check():
    """A seed is a page someone asked for: neither its length (up to the seed
    policy's 8,192 characters) nor its path drops it."""
    long_url = f"{SITE}/" + "q" * 3000

    class Seeds(Spider):
        async def start(self):
            yield Request(long_url)
            yield Request(f"{SITE}/x/x/x/x")

    crawler, mw = manager(spidercls=Seeds)

    async def collect():
        return [r.url async for r in await mw.process_start()]

    assert asyncio.run(collect()) == [long_url, f"{SITE}/x/x/x/x"]


# --- long links -------------------------------------------------------------------

def test_long_links_are_dropped_counted_and_said_once_per_site_not_each(caplog):
    """Scrapy's UrlLengthMiddleware logged every dropped link at INFO."""
    def callback(response):
        for i in range(5):
            yield Request(f"{SITE}/{i}/" + "l" * 2100)
        yield Request(f"{SITE}/short")

    with caplog.at_level(logging.DEBUG):
        out, stats = run(None, page(), callback)
    assert [o.url for o in out] == [f"{SITE}/short"]
    assert stats["urllength/request_ignored_count"] == 5
    info = [r for r in caplog.records if r.levelno >= logging.INFO and "URLLENGTH_LIMIT" in
            r.getMessage()]
    assert len(info) == 1 and "127.0.0.51" in info[0].getMessage()
    out, stats = run({"URLLENGTH_LIMIT": 0}, page(), callback)
    assert len(out) == 6


# --- requests per page ------------------------------------------------------------

def test_a_page_of_100000_links_adds_the_limit_and_the_loop_turns_while_the_rest_is_dropped():
    """The first PAGE_REQUESTS_LIMIT (10,000) requests go on, the other 90,000
    are counted; an item after them still gets through. While they are
    dropped, another site's page (a real local HTTP server, fetched once the
    limit is reached) arrives: without loop turns while dropping (11 s held
    in a measured crawl), it could arrive only after the last drop."""
    events: list[str] = []

    def callback(response):
        for i in range(100_000):
            yield Request(f"{SITE}/p/{i}")
        events.append("output ended")
        yield {"url": response.url}

    async def scenario():
        crawler, mw = manager()
        chain = await mw.scrape_response_async(
            lambda resp, req: _resolved(callback(resp)), page(), page().request)
        kept, fetch = [], None
        async with _OtherSite() as other:
            async for output in chain:
                kept.append(output)
                if len(kept) == 10_000:   # the limit is reached: fetch the other site's page
                    fetch = asyncio.ensure_future(other.fetch(events))
                await asyncio.sleep(0)    # the engine takes each output in a loop turn
            await fetch
        return kept, crawler.stats.get_stats()

    kept, stats = asyncio.run(scenario())
    assert len([o for o in kept if isinstance(o, Request)]) == 10_000
    assert kept[-1] == {"url": f"{SITE}/"}
    assert stats["traps/page_requests_dropped"] == 90_000
    assert stats["traps/pages_over_limit"] == 1
    assert events == ["other site's page", "output ended"]


async def _resolved(value):
    return value


class _OtherSite:
    """Another site on 127.0.0.52: an HTTP server on the test's own event loop
    (its answer needs only loop turns, not another thread's share of the
    CPU), fetched over a real socket."""

    async def __aenter__(self):
        async def answer(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            body = b"<html><body>other</body></html>"
            writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.52", 0)
        self.address = self.server.sockets[0].getsockname()[:2]
        return self

    async def __aexit__(self, *exc):
        self.server.close()
        await self.server.wait_closed()

    async def fetch(self, events: list[str]) -> None:
        reader, writer = await asyncio.open_connection(*self.address)
        writer.write(b"GET / HTTP/1.0\r\nHost: 127.0.0.52\r\n\r\n")
        await writer.drain()
        assert b"other" in await reader.read()
        events.append("other site's page")
        writer.close()


def test_the_limit_is_a_setting_and_a_sitemap_may_list_50000():
    def callback(response):
        return [Request(f"{SITE}/p/{i}") for i in range(60)]

    out, stats = run({"PAGE_REQUESTS_LIMIT": 50}, page(), callback)
    assert len(out) == 50 and stats["traps/page_requests_dropped"] == 10
    out, _ = run({"PAGE_REQUESTS_LIMIT": 50}, page(meta={"page_requests_limit": 55}), callback)
    assert len(out) == 55     # a request's own limit for its response
    out, _ = run({"PAGE_REQUESTS_LIMIT": 0}, page(), callback)
    assert len(out) == 60
    crawler = get_crawler(SitemapSpider, {"PAGE_REQUESTS_LIMIT": 50})
    crawler.spider = crawler._create_spider("maps", sitemap_urls=[f"{SITE}/sitemap.xml"])
    sitemap = page(f"{SITE}/sitemap.xml")
    sitemap.request.callback = crawler.spider._parse_sitemap
    assert PageRequestsMiddleware.from_crawler(crawler).limit_for(sitemap) == 50_000


def test_dropping_lets_the_loop_turn_every_few_dozen_outputs():
    """Counted with a task that only counts turns: at least one per
    DROPS_PER_TURN requests dropped."""
    turns = 0

    async def scenario():
        nonlocal turns
        done = asyncio.Event()

        async def ticker():
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        tick = asyncio.ensure_future(ticker())
        crawler, mw = manager({"PAGE_REQUESTS_LIMIT": 1})
        chain = await mw.scrape_response_async(
            lambda resp, req: _resolved(Request(f"{SITE}/p/{i}") for i in range(6401)),
            page(), page().request)
        out = [o async for o in chain]    # no turn of its own
        done.set()
        await tick
        return out

    assert len(asyncio.run(scenario())) == 1
    assert turns >= 6400 // DROPS_PER_TURN


# --- calendars: the per-site budget -----------------------------------------------

def test_every_site_has_a_budget_of_100000_new_pages_by_default():
    """An endless calendar or faceted search of one site stops there (the
    frontier's budget: tests/test_politeness.py, tests/test_traps_crawl.py)."""
    assert SitePoliteness.from_settings(Settings()).default.budget == 100_000
    assert SitePoliteness.from_settings(Settings({"FRONTIER_SITE_BUDGET": 0})).default.budget == 0
