"""Meta robots (crawlproject/traps/metarobots.py): ``<meta name="robots">`` and
``X-Robots-Tag``, driven through the project's spider middlewares by Scrapy's
``SpiderMiddlewareManager`` (a whole crawl: tests/test_traps_crawl.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from parsel import Selector
from scrapy import Request, Spider
from scrapy.core.spidermw import SpiderMiddlewareManager
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse, Response
from scrapy.utils.test import get_crawler

from crawlproject.traps.metarobots import (MetaRobotsMiddleware, crawler_names,
                                           header_directives, robots_directives)
from tests.test_traps import traps_only

SITE = "http://127.0.0.53"


def html(meta: str = "", body: str = "", head_extra: str = "") -> bytes:
    return (f"<!doctype html><html><head><title>t</title>{head_extra}{meta}</head>"
            f"<body>{body}<a href='/next'>next</a></body></html>").encode()


def crawl_page(response, settings: dict | None = None) -> tuple[list, dict]:
    """The callback's output for *response* after the project's middlewares:
    two links (one marked ``ignore_meta_robots``) and an item."""
    crawler = get_crawler(Spider, {"SPIDER_MIDDLEWARES": traps_only(), "BOT_NAME": "crawlbot",
                                   **(settings or {})})
    crawler.spider = crawler._create_spider("meta")
    mw = SpiderMiddlewareManager.from_crawler(crawler)

    async def scrape(resp, request):
        return [Request(f"{SITE}/next"), {"url": resp.url},
                Request(f"{SITE}/asked", meta={"ignore_meta_robots": True})]

    async def collect():
        chain = await mw.scrape_response_async(scrape, response, response.request)
        return [o.url if isinstance(o, Request) else o async for o in chain]

    return asyncio.run(collect()), crawler.stats.get_stats()


def page(body: bytes = b"", headers: dict | None = None, cls=HtmlResponse):
    return cls(f"{SITE}/p", body=body, headers=headers, request=Request(f"{SITE}/p"))


ALL = [f"{SITE}/next", {"url": f"{SITE}/p"}, f"{SITE}/asked"]
NOFOLLOW = [{"url": f"{SITE}/p"}, f"{SITE}/asked"]
NOINDEX = [f"{SITE}/next", f"{SITE}/asked"]
NONE = [f"{SITE}/asked"]


@pytest.mark.parametrize("meta, expected", [
    ('<meta name="robots" content="nofollow">', NOFOLLOW),
    ('<meta name="ROBOTS" content="NoIndex, follow">', NOINDEX),
    ('<meta name="robots" content="noindex,nofollow">', NONE),
    ('<meta content="none" name="robots">', NONE),
    ('<meta name="robots" content="noindex nofollow">', NONE),
    ('<meta name="crawlbot" content="nofollow">', NOFOLLOW),        # our bot name
    ('<meta name="otherbot" content="noindex, nofollow">', ALL),     # another crawler's
    ('<meta name="robots" content="all">', ALL),
    ('<meta name="description" content="nofollow noindex robots">', ALL),
    ("", ALL),
])
def test_meta_robots_in_the_head(meta, expected):
    out, stats = crawl_page(page(html(meta)))
    assert out == expected
    assert stats.get("metarobots/nofollow", 0) == (f"{SITE}/next" not in out)
    assert stats.get("metarobots/noindex", 0) == ({"url": f"{SITE}/p"} not in out)


@pytest.mark.parametrize("header, expected", [
    (b"nofollow", NOFOLLOW),
    (b"noindex", NOINDEX),
    (b"none", NONE),
    (b"crawlbot: noindex", NOINDEX),                  # a user-agent prefix naming us
    (b"CrawlBot: noindex, nofollow", NONE),
    (b"otherbot: noindex, nofollow", ALL),            # ... or another crawler
    (b"otherbot: noindex, crawlbot: nofollow", NOFOLLOW),
    (b"unavailable_after: 25 Jun 2010 15:00:00 PST", ALL),
    (b"unavailable_after: 25 Jun 2010 15:00:00 PST, noindex", NOINDEX),
])
def test_x_robots_tag_with_and_without_a_user_agent(header, expected):
    out, _ = crawl_page(page(html(), {"X-Robots-Tag": header}))
    assert out == expected


def test_every_x_robots_tag_header_counts_and_any_response_may_have_one():
    headers = {"X-Robots-Tag": [b"otherbot: nofollow", b"noindex"]}
    assert header_directives([b"otherbot: nofollow", b"noindex"], frozenset({"crawlbot"})) \
        == {"noindex"}
    out, stats = crawl_page(page(b"%PDF-1.4", headers, cls=Response))
    assert out == NOINDEX and stats["metarobots/noindex/items_dropped"] == 1


def test_each_switch_turns_its_half_off():
    nofollow_noindex = page(html('<meta name="robots" content="none">'))
    assert crawl_page(nofollow_noindex, {"META_ROBOTS_ENABLED": False})[0] == ALL
    assert crawl_page(nofollow_noindex, {"META_ROBOTS_NOFOLLOW": False})[0] == NOINDEX
    assert crawl_page(nofollow_noindex, {"META_ROBOTS_NOINDEX": False})[0] == NOFOLLOW
    with pytest.raises(NotConfigured):
        MetaRobotsMiddleware.from_crawler(get_crawler(Spider, {
            "META_ROBOTS_NOFOLLOW": False, "META_ROBOTS_NOINDEX": False}))


def test_our_names_come_from_the_settings():
    settings = get_crawler(Spider, {"BOT_NAME": "shopbot"}).settings
    assert crawler_names(settings) == {"shopbot"}
    settings = get_crawler(Spider, {"ROBOTSTXT_USER_AGENT": "MyCrawler/2.1 (+https://x.example)"}
                           ).settings
    assert crawler_names(settings) == {"mycrawler"}
    settings = get_crawler(Spider, {"META_ROBOTS_NAMES": ["A", "b"]}).settings
    assert crawler_names(settings) == {"a", "b"}


def test_counted_and_said_once_per_site(caplog):
    nofollow = page(html('<meta name="robots" content="nofollow">'))
    with caplog.at_level(logging.DEBUG, logger="crawlproject.traps"):
        crawler = get_crawler(Spider, {"SPIDER_MIDDLEWARES": traps_only()})
        crawler.spider = crawler._create_spider("meta")
        mw = SpiderMiddlewareManager.from_crawler(crawler)

        async def scrape(resp, request):
            return [Request(f"{SITE}/a"), Request(f"{SITE}/b")]

        async def twice():
            for _ in range(2):
                chain = await mw.scrape_response_async(scrape, nofollow, nofollow.request)
                assert [o async for o in chain] == []

        asyncio.run(twice())
    stats = crawler.stats.get_stats()
    assert stats["metarobots/nofollow"] == 2 and stats["metarobots/nofollow/requests_dropped"] == 4
    said = [r.levelname for r in caplog.records if "says nofollow" in r.getMessage()]
    assert said == ["INFO", "DEBUG"]


def test_only_the_head_is_read(monkeypatch):
    """A meta tag past the head is not one, and a page of 7 MB is never parsed
    whole for this: the parser sees the head, at most its first 128 KiB."""
    import crawlproject.traps.metarobots as metarobots

    parsed: list[int] = []

    def selector(text):
        parsed.append(len(text))
        return Selector(text=text)

    monkeypatch.setattr(metarobots, "Selector", selector)
    late = html(body='<meta name="robots" content="noindex,nofollow">')
    assert robots_directives(page(late), frozenset()) == set()
    unclosed = b"<html><head>" + b"<script>x</script>" * 30_000 + \
        b'<meta name="robots" content="noindex">'      # 540 KB into an unclosed head
    assert robots_directives(page(unclosed), frozenset()) == set()
    huge = html('<meta name="robots" content="noindex">', body="<p>robots</p>" * 600_000)
    assert len(huge) > 7_000_000
    assert robots_directives(page(huge), frozenset()) == {"noindex"}
    assert parsed and max(parsed) <= metarobots.HEAD_BYTES
    assert parsed[-1] < 200         # the head only, not the body
