"""Referer: Scrapy's RefererMiddleware for followed requests, defaults for seeds
(crawlproject.middlewares.referer).

Unit tests drive the spider middleware as Scrapy does (``process_start`` for
seeds, ``process_spider_output`` for followed requests); the end-to-end test
crawls the multi-host demo site with two real nodes and compares every
recorded Referer with the site's link graph."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter, defaultdict
from urllib.parse import urlsplit

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.spidermiddlewares.referer import RefererMiddleware
from scrapy.utils.test import get_crawler

from crawlproject.middlewares.referer import SeedReferers, SeedRefererMiddleware
from crawlproject.serialization import request_from_json, request_to_json

SEARCH = "https://search.example/?q={domain}&from={host}"


def middleware(settings: dict | None = None, cls=SeedRefererMiddleware):
    return cls.from_crawler(get_crawler(Spider, settings or {}))


def through_start(mw, *requests: Request) -> list[Request]:
    async def start():
        for request in requests:
            yield request

    async def collect():
        return [r async for r in mw.process_start(start())]

    return asyncio.run(collect())


def referer(request: Request) -> str | None:
    value = request.headers.get(b"Referer")
    return value.decode() if value is not None else None


# ------------------------------------------------------------------ seed defaults


def test_seed_mode_by_domain_longest_match_wins():
    seeds = SeedReferers("search", {"example.com": "root", "shop.example.com": "none",
                                    "127.0.0.3": "root"})
    assert seeds.mode("example.com") == "root"
    assert seeds.mode("www.Example.com") == "root"
    assert seeds.mode("a.shop.example.com") == "none"
    assert seeds.mode("example.org") == "search"
    assert seeds.mode("127.0.0.3") == "root" and seeds.mode("127.0.0.4") == "search"
    assert seeds.mode("10.127.0.0.3") == "search"


def test_seed_referer_urls():
    seeds = SeedReferers("search", {"example.com": "root"}, SEARCH)
    root = seeds.referer(Request("http://user:pw@www.example.com:8080/a/b?c=1"))
    assert root == ("root", "http://www.example.com:8080/")
    assert seeds.referer(Request("https://shop.example.co.uk/x")) == (
        "search", "https://search.example/?q=example.co.uk&from=shop.example.co.uk")
    with_url = SeedReferers("search", search_url="https://s.example/?u={url}")
    assert with_url.referer(Request("https://a.example/x?y=1"))[1] == \
        "https://s.example/?u=https%3A%2F%2Fa.example%2Fx%3Fy%3D1"
    assert SeedReferers().referer(Request("https://a.example/")) == ("none", None)


@pytest.mark.parametrize("settings, message", [
    ({"REFERER_SEED_DEFAULT": "google"}, "REFERER_SEED_DEFAULT must be one of"),
    ({"REFERER_SEED_BY_DOMAIN": {"a.example": "home"}}, r"REFERER_SEED_BY_DOMAIN\['a.example'\]"),
    ({"REFERER_SEED_SEARCH_URL": "https://s.example/?q={query}"}, r"may use only"),
    ({"REFERER_SEED_SEARCH_URL": "https://s.example/?q={domain"}, r"REFERER_SEED_SEARCH_URL"),
    ({"REFERER_SEED_SEARCH_URL": "file:///etc/passwd"}, r"must be an http\(s\) URL"),
])
def test_bad_settings_are_clear_errors(settings, message):
    with pytest.raises(ValueError, match=message):
        middleware(settings)


def test_seeds_get_the_default_of_their_domain_unless_they_bring_their_own():
    mw = middleware({"REFERER_SEED_DEFAULT": "search", "REFERER_SEED_SEARCH_URL": SEARCH,
                     "REFERER_SEED_BY_DOMAIN": json.dumps({"b.example": "root",
                                                           "c.example": "none"})})
    out = through_start(
        mw, Request("https://a.example/x"), Request("https://www.b.example/y"),
        Request("https://c.example/z"),
        Request("https://a.example/own", headers={"Referer": "https://mine.example/"}),
        Request("https://a.example/nr", meta={"referrer_policy": "no-referrer"}))
    assert [referer(r) for r in out] == [
        "https://search.example/?q=a.example&from=a.example", "https://www.b.example/",
        None, "https://mine.example/", None]
    stats = mw.crawler.stats
    assert (stats.get_value("referer/seed/search"), stats.get_value("referer/seed/root")) == (1, 1)
    # Scrapy's own middleware leaves seeds alone: the defaults are ours.
    plain = through_start(middleware(cls=RefererMiddleware), Request("https://a.example/x"))
    assert referer(plain[0]) is None


def test_followed_requests_keep_scrapys_referrer_policy():
    mw = middleware({"REFERER_SEED_DEFAULT": "root"})
    page = HtmlResponse("https://a.example/list/2?x=1#top", body=b"")
    out = list(mw.process_spider_output(page, [
        Request("https://a.example/p/1"),
        Request("http://a.example/p/2"),                               # a downgrade
        Request("https://b.example/p/3", meta={"referrer_policy": "origin"}),
        Request("https://a.example/p/4", headers={"Referer": "https://mine.example/"}),
    ]))
    assert [referer(r) for r in out] == ["https://a.example/list/2?x=1", None,
                                         "https://a.example/", "https://mine.example/"]
    # The page's Referrer-Policy header counts, as in Scrapy.
    strict = HtmlResponse("https://a.example/", body=b"", headers={"Referrer-Policy": "no-referrer"})
    assert referer(next(mw.process_spider_output(strict, [Request("https://a.example/q")]))) is None


def test_a_policy_import_path_in_meta_is_never_imported():
    """Meta may come from Redis (a redirect keeps a stored request's meta):
    Scrapy would import the module it names; this middleware refuses it."""
    module = "xml.dom.pulldom"
    assert module not in sys.modules
    request = Request("https://a.example/next", meta={"referrer_policy": f"{module}.PullDOM"})
    page = HtmlResponse("https://a.example/page", body=b"")
    mw = middleware()
    out = list(mw.process_spider_output(page, [request]))
    assert module not in sys.modules
    assert referer(out[0]) == "https://a.example/page"     # the default policy applied
    assert mw.crawler.stats.get_value("referer/policy_refused") == 1
    odd = Request("https://a.example/n2", meta={"referrer_policy": ["not", "a", "name"]})
    assert referer(next(mw.process_spider_output(page, [odd]))) == "https://a.example/page"
    # A configured policy class may still be named in meta, by its setting name.
    custom = middleware({"REFERRER_POLICIES": {
        "mine": "scrapy.spidermiddlewares.referer.OriginPolicy"}})
    named = Request("https://a.example/n3", meta={"referrer_policy": "mine"})
    assert referer(next(custom.process_spider_output(page, [named]))) == "https://a.example/"


def test_referer_survives_the_frontier_and_can_be_switched_off():
    seed = through_start(middleware({"REFERER_SEED_DEFAULT": "root"}), Request("https://a.example/x"))[0]
    assert referer(request_from_json(request_to_json(seed, None), None)) == "https://a.example/"
    with pytest.raises(NotConfigured):
        middleware({"REFERER_ENABLED": False})


# ------------------------------------------------------------------ end to end


def links_of(site, host: str, path: str) -> set[str]:
    """Paths the page at *path* links to, as the hosts spider follows them."""
    from devtools.demo.hosts import listing_count, page_links

    pages, per_page = site.pages[host], site.per_page
    if path.startswith("/p/"):
        return {f"/p/{m}" for m in page_links(host, int(path[3:]), pages)}
    n = 1 if path == "/" else int(path.rsplit("/", 1)[1])
    first = (n - 1) * per_page + 1
    links = {f"/p/{i}" for i in range(first, min(first + per_page, pages + 1))}
    if n < listing_count(pages, per_page):
        links.add(f"/list/{n + 1}")
    return links


@pytest.mark.slow
def test_referer_chain_of_a_crawl_matches_the_link_graph(redis, redis_url, mongo_uri, database,
                                                         tmp_path):
    from devtools.demo.hosts import MultiHostSite
    from crawlproject.keys import start_urls_key
    from tests.crawl_helpers import Node, crawl_until_done, node_env

    searched, rooted, bare = hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    env = node_env(redis_url, mongo_uri, database.name)
    settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "LOG_LEVEL": "INFO",
                "REFERER_SEED_DEFAULT": "search",
                "REFERER_SEED_SEARCH_URL": "https://search.example/?q={host}",
                "REFERER_SEED_BY_DOMAIN": json.dumps({rooted: "root", bare: "none"})}
    with MultiHostSite(hosts, pages=40, per_page=10, latency_ms=10, record_headers=True) as site:
        nodes = [Node(f"n{i}", tmp_path, env, spider="hosts", settings=settings) for i in (1, 2)]
        codes = crawl_until_done(
            nodes, lambda: redis.lpush(start_urls_key("hosts"), *site.root_urls()))
        seen = site.seen()
        urls = dict(site.urls)
        expected = {h: site.expected_paths(h) for h in hosts}
        graph = {h: {p: links_of(site, h, p) for p in expected[h]} for h in hosts}
    assert codes == [0, 0], [n.tail() for n in nodes]
    by_host = defaultdict(list)
    for record in seen:
        by_host[record.host].append(record)
    seed_referers = {searched: f"https://search.example/?q={searched}", rooted: urls[rooted],
                     bare: None}
    for host in hosts:
        records = by_host[host]
        assert Counter(r.path for r in records) == Counter(expected[host]), host
        for record in records:
            ref = record.headers.get("referer")
            if record.path == "/":                             # the seed
                assert ref == seed_referers[host], (host, ref)
                continue
            assert ref is not None, (host, record.path)
            parts = urlsplit(ref)
            assert f"{parts.scheme}://{parts.netloc}/" == urls[host], (host, ref)
            source = parts.path + (f"?{parts.query}" if parts.query else "")
            assert record.path in graph[host][source], (host, source, record.path)
