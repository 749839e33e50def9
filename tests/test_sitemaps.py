"""Sitemaps as a seed source (crawlproject.sitemaps): real Redis, real HTTP
sites on 127.0.0.x (a threaded server in the test process, every request
recorded), real ``scrapy crawl`` nodes for the crawls; the middleware itself on
a real Redis with a stand-in engine for the limits (what it requests, what it
dead-letters)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response, XmlResponse
from scrapy.utils.test import get_crawler

from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.keys import FrontierKeys, SitemapKeys, start_urls_key
from crawlproject.policy import InputPolicy
from crawlproject.seeds import parse_seed, build_request
from crawlproject.sitemaps import LASTMOD_META, SITEMAP_META, SitemapSeeds
from crawlproject.sitemaps.store import SitemapStore
from crawlproject.spiders.seeded import RedisSpider
from tests.crawl_helpers import ROOT, Node, node_env

XML = "application/xml"


# -- a real site --------------------------------------------------------------------

class Site:
    """Static answers on one loopback address (port 0), every request recorded."""

    def __init__(self, address: str, pages: dict[str, tuple[int, str, bytes]], default=None):
        self.pages = pages
        self.default = default or (lambda path: (404, "text/plain", b"no"))
        self.hits: list[str] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                with site.lock:
                    site.hits.append(self.path)
                answer = site.pages.get(self.path) or site.default(self.path)
                status, ctype, body = answer
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.server.daemon_threads = True
        self.origin = f"http://{address}:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def counts(self) -> Counter:
        with self.lock:
            return Counter(self.hits)

    def served(self) -> int:
        with self.lock:
            return len(self.hits)


def urlset(urls, lastmods=None) -> bytes:
    lastmods = lastmods or {}
    rows = "".join(f"<url><loc>{u}</loc>" + (f"<lastmod>{lastmods[u]}</lastmod>" if u in lastmods
                                               else "") + "</url>" for u in urls)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/'
            f'schemas/sitemap/0.9">{rows}</urlset>').encode()


def sitemapindex(urls) -> bytes:
    rows = "".join(f"<sitemap><loc>{u}</loc></sitemap>" for u in urls)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex xmlns="http://www.sitemaps'
            f'.org/schemas/sitemap/0.9">{rows}</sitemapindex>').encode()


def html(text="page") -> tuple[int, str, bytes]:
    return 200, "text/html", f"<html><body>{text} <a href='/unlisted'>x</a></body></html>".encode()


def small_site(address: str, other: str) -> Site:
    """robots.txt → an index (and a sitemap of another host) → a sitemap, a
    gzipped one and a gzipped one too large → pages 1-10; a disallowed page and
    one of another host listed, page 3 listed twice."""
    site = Site(address, {})
    o = site.origin
    site.pages.update({
        "/robots.txt": (200, "text/plain", (
            f"User-agent: *\nDisallow: /private/\nSitemap: {o}/sitemap_index.xml\n"
            f"Sitemap: http://{other}:9/elsewhere.xml\n").encode()),
        "/": html("home"),
        "/sitemap_index.xml": (200, XML, sitemapindex([f"{o}/sitemaps/a.xml",
                                                       f"{o}/sitemaps/b.xml.gz",
                                                       f"{o}/sitemaps/bomb.xml.gz"])),
        # 2 MiB of XML, past the spider's SITEMAPS_MAX_SIZE (1 MiB)
        "/sitemaps/bomb.xml.gz": (200, "application/x-gzip", gzip.compress(
            urlset([f"{o}/p/bomb"]) + b" " * (2 << 20))),
        "/sitemaps/a.xml": (200, XML, urlset(
            [f"{o}/p/{i}" for i in range(1, 6)] + [f"{o}/private/secret",
                                                   f"http://{other}:9/p/1"],
            {f"{o}/p/2": "2026-11-30T10:00:00+00:00"})),
        "/sitemaps/b.xml.gz": (200, "application/x-gzip", gzip.compress(urlset(
            [f"{o}/p/{i}" for i in range(6, 11)] + [f"{o}/p/3"]))),
        **{f"/p/{i}": html(f"p{i}") for i in range(1, 11)},
        "/private/secret": html("secret"),
        "/unlisted": html("unlisted"),
    })
    return site


# -- real crawls: three spiders in one node --------------------------------------------

FLOOD_PAGES = 20_000
QUEUED_BOUND = 120   # SITEMAPS_MAX_QUEUED (60) + one look's staleness of the node's count


@pytest.fixture(scope="module")
def crawl(redis_url, mongo_uri, tmp_path_factory):
    """One node (``tests.run_spiders``) running ``sitemap_on``, ``sitemap_off``
    and ``sitemap_flood`` against their own sites. While it runs, Redis is
    watched until the flood site has served 15 pages (the event): the most
    requests the frontier's queue and the flood spider's seed key held
    together, the most seeds waiting in the sitemap list."""
    import redis as redis_lib

    tmp = tmp_path_factory.mktemp("sitemaps")
    client = redis_lib.Redis.from_url(redis_url)
    client.flushdb()
    env = node_env(redis_url, mongo_uri, "sitemaps_test")
    flood = Site("127.0.0.64", {}, default=lambda path: html(path))
    flood.pages.update({"/robots.txt": (200, "text/plain",
                                        f"Sitemap: {flood.origin}/big.xml\n".encode()),
                        "/big.xml": (200, XML, urlset(
                            [f"{flood.origin}/p/{i}" for i in range(FLOOD_PAGES)]))})
    keys = FrontierKeys("sitemap_flood")
    seeds = start_urls_key("sitemap_flood")
    pending = SitemapKeys("sitemap_flood", seeds).pending
    seen = {"queued": 0, "waiting": 0}
    with small_site("127.0.0.61", "127.0.0.63") as on, \
            small_site("127.0.0.62", "127.0.0.63") as off, flood:
        client.lpush(start_urls_key("sitemap_on"), f"{on.origin}/")
        client.lpush(start_urls_key("sitemap_off"), f"{off.origin}/")
        client.lpush(seeds, f"{flood.origin}/")
        stats = tmp / "stats"
        stats.mkdir()
        cmd = [sys.executable, "-m", "tests.run_spiders", "--stats-dir", str(stats),
               "-s", f"LOG_FILE={tmp / 'node.log'}", "-s", "NODE_ID=sm1",
               "-s", "SPIDER_MODULES=tests.spiders", "-s", "ROBOTSTXT_OBEY=True",
               "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=2", "-s", "LOG_LEVEL=INFO",
               "sitemap_on", "sitemap_off", "sitemap_flood"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 90
            while flood.served() < 18:   # robots.txt, /, big.xml and 15 pages
                assert time.monotonic() < deadline and proc.poll() is None, \
                    proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "slow"
                queued = int(client.hget(keys.kstate, "||qlen") or 0) + client.llen(seeds)
                seen["queued"] = max(seen["queued"], queued)
                seen["waiting"] = max(seen["waiting"], client.llen(pending))
                time.sleep(0.02)
            assert proc.wait(90) == 0, proc.stderr.read().decode()[-3000:]
        finally:
            proc.kill()
            proc.wait()
    log = (tmp / "node.log").read_text()
    dead = [json.loads(d) for d in client.lrange(FrontierKeys("sitemap_on").dead, 0, -1)]
    result = SimpleNamespace(dead=dead,
        on=on.counts(), off=off.counts(), seen=seen, log=log,
        stats={name: json.loads((stats / f"{name}-sm1.json").read_text())
               for name in ("sitemap_on", "sitemap_off", "sitemap_flood")})
    client.flushdb()
    client.close()
    return result


def test_a_spider_that_asks_crawls_every_listed_page_once_and_only_those(crawl):
    """``sitemap_on`` (``sitemap_seeds = True``), seeded with its site's home
    page only: robots.txt → index → a sitemap and a gzipped one → every listed
    page fetched once (page 3 is listed twice), the one robots.txt disallows
    not, nor the other host's sitemap or page (counted, said); a page's
    ``lastmod`` reached its request. The index's third sitemap decompresses
    past the spider's ``SITEMAPS_MAX_SIZE``: fetched once, dead-lettered with
    the reason, none of its pages fetched."""
    assert crawl.on == Counter({"/robots.txt": 1, "/": 1, "/sitemap_index.xml": 1,
                                "/sitemaps/a.xml": 1, "/sitemaps/b.xml.gz": 1,
                                "/sitemaps/bomb.xml.gz": 1,
                                **{f"/p/{i}": 1 for i in range(1, 11)}}), crawl.on
    [dead] = crawl.dead
    assert dead["url"].endswith("/sitemaps/bomb.xml.gz") and dead["kind"] == "sitemap"
    assert "larger than 1048576 bytes decompressed (SITEMAPS_MAX_SIZE)" in dead["reason"]
    stats = crawl.stats["sitemap_on"]
    assert stats["sitemaps/refused/too_large"] == 1 and stats["scheduler/dead/sitemap"] == 1
    assert stats["sitemaps/requested"] == 4 and stats["sitemaps/indexes"] == 1
    assert stats["sitemaps/urlsets"] == 2
    assert stats["sitemaps/urls"] == 12      # 10 pages, page 3 again, the disallowed one
    assert stats["sitemaps/refused/other_host"] == 1       # robots.txt's sitemap elsewhere
    assert stats["sitemaps/refused/other_host_urls"] == 1  # a.xml's page elsewhere
    assert stats["robotstxt/forbidden"] == 1
    assert stats["test/lastmod/p/2"] == "2026-11-30T10:00:00+00:00"
    assert ("Sitemaps of 127.0.0.61: sitemap http://127.0.0.63:9/elsewhere.xml is on another "
            "host") in crawl.log


def test_a_spider_that_does_not_ask_fetches_no_sitemap(crawl):
    """``sitemap_off`` (the default: off): its site's robots.txt lists the
    same sitemaps; none is fetched, only the home page."""
    assert crawl.off == Counter({"/robots.txt": 1, "/": 1}), crawl.off
    assert not any(k.startswith("sitemaps/") for k in crawl.stats["sitemap_off"])


def test_a_sitemap_of_20000_urls_flows_in_at_the_crawl_s_pace_not_at_once(crawl):
    """One sitemap lists 20,000 pages, ``SITEMAPS_MAX_QUEUED = 60``, the site
    is crawled at 5 pages a second: until it served 15 pages, the frontier's
    queue and the seed key together never held more than the bound allows,
    while the rest of the sitemap waited in Redis."""
    assert crawl.seen["waiting"] >= FLOOD_PAGES - 200, crawl.seen
    assert crawl.seen["queued"] <= QUEUED_BOUND, crawl.seen
    assert crawl.stats["sitemap_flood"]["sitemaps/urls"] == FLOOD_PAGES


# -- the middleware's limits on a real Redis, with a stand-in engine -----------------

SITE = "http://127.0.0.65:8001"


class UnitSpider(RedisSpider):
    name = "smunit"
    sitemap_seeds = True


class Engine:
    """What the middleware uses of Scrapy's engine, recorded: ``crawl`` (a
    request into the frontier) and the scheduler's ``mark_failed`` (a dead letter)."""

    def __init__(self):
        self.crawled, self.failed = [], []
        self.scheduler = SimpleNamespace(mark_failed=lambda r, reason, kind: self.failed.append(
            (r.url, reason, kind)), control_state="run")

    def crawl(self, request):
        self.crawled.append(request)


def node(redis_url, **settings) -> SitemapSeeds:
    crawler = get_crawler(UnitSpider, {"ROBOTSTXT_OBEY": True, "REDIS_URL": redis_url,
                                       **settings})
    crawler.spider = UnitSpider.from_crawler(crawler)
    crawler.engine = Engine()
    return SitemapSeeds.from_crawler(crawler)


def opened(mw) -> SitemapSeeds:
    mw.spider_opened(mw.crawler.spider)
    mw._task.cancel()   # the feeder is driven by hand here (feed_once)
    return mw


async def read(mw, url, body, depth=0, hosts=("127.0.0.65",), meta=None):
    """Download *url* as a sitemap request answered with *body*."""
    request = Request(url, meta=meta or {SITEMAP_META: {"hosts": list(hosts), "depth": depth}})
    cls = Response if body[:2] == b"\x1f\x8b" else XmlResponse
    with pytest.raises(IgnoreRequest):
        await mw.process_response(request, cls(url, body=body, request=request))


def stat(mw, name):
    return mw.crawler.stats.get_value(f"sitemaps/{name}", 0)


def waiting_seeds(redis) -> list[dict]:
    pending = SitemapKeys("smunit", start_urls_key("smunit")).pending
    return [json.loads(s) for s in reversed(redis.lrange(pending, 0, -1))]


def test_off_unless_the_setting_or_the_spider_asks(redis_url):
    class Plain(UnitSpider):
        sitemap_seeds = None

    class Refuses(UnitSpider):
        sitemap_seeds = False

    for spidercls, settings in ((Plain, {}), (Refuses, {"SITEMAPS_ENABLED": True})):
        with pytest.raises(NotConfigured):
            SitemapSeeds.from_crawler(get_crawler(spidercls, {"REDIS_URL": redis_url,
                                                              **settings}))
    assert SitemapSeeds.from_crawler(get_crawler(Plain, {"REDIS_URL": redis_url,
                                                         "SITEMAPS_ENABLED": True}))


def test_a_gzip_bomb_is_stopped_while_decompressing_and_dead_lettered(redis, redis_url):
    """20 MiB of XML in 20 KiB of gzip, ``SITEMAPS_MAX_SIZE`` 1 MiB: refused
    at the limit, counted, dead-lettered with the reason, nothing queued. The
    lower of it and ``DOWNLOAD_MAXSIZE`` is the limit (and the sitemap
    requests' ``download_maxsize``)."""
    bomb = gzip.compress(b"<urlset>" + b" " * (20 << 20) + b"</urlset>")
    assert len(bomb) < 64 << 10

    async def scenario():
        mw = opened(node(redis_url, SITEMAPS_MAX_SIZE=1 << 20))
        await read(mw, f"{SITE}/bomb.xml.gz", bomb)
        assert node(redis_url, DOWNLOAD_MAXSIZE=4096).max_size == 4096
        await mw.spider_closed(mw.crawler.spider)
        return mw

    mw = asyncio.run(scenario())
    [(url, reason, kind)] = mw.crawler.engine.failed
    assert url == f"{SITE}/bomb.xml.gz" and kind == "sitemap"
    assert "larger than 1048576 bytes decompressed (SITEMAPS_MAX_SIZE)" in reason
    assert stat(mw, "refused/too_large") == 1 and waiting_seeds(redis) == []


def test_a_sitemap_is_read_up_to_its_limit_and_its_seeds_pass_the_seed_policy(
        redis, redis_url, caplog):
    """``SITEMAPS_MAX_URLS`` 100 of 150 entries, among them two pages of
    another host and a ``javascript:`` one: 97 seeds wait, each a JSON seed
    that is not ``dont_filter`` and carries its valid ``lastmod`` (a junk
    one is dropped); the seed policy takes them as they are."""
    urls = ([f"http://127.0.0.66:8001/p/{i}" for i in range(2)] + ["javascript:alert(1)"]
            + [f"{SITE}/p/{i}" for i in range(147)])
    lastmods = {f"{SITE}/p/0": "2026-01-02", f"{SITE}/p/1": "yesterday"}

    async def scenario():
        mw = opened(node(redis_url, SITEMAPS_MAX_URLS=100))
        await read(mw, f"{SITE}/s.xml", urlset(urls, lastmods))
        await mw.spider_closed(mw.crawler.spider)
        return mw

    mw = asyncio.run(scenario())
    seeds = waiting_seeds(redis)
    assert [s["url"] for s in seeds] == [f"{SITE}/p/{i}" for i in range(97)]
    assert seeds[0] == {"url": f"{SITE}/p/0", "dont_filter": False,
                        "meta": {LASTMOD_META: "2026-01-02"}}
    assert seeds[1] == {"url": f"{SITE}/p/1", "dont_filter": False}
    assert (stat(mw, "urls"), stat(mw, "urls_invalid"), stat(mw, "refused/other_host_urls"),
            stat(mw, "refused/truncated")) == (97, 1, 2, 1)
    assert "lists more than SITEMAPS_MAX_URLS (100) URLs" in caplog.text
    policy = InputPolicy.from_settings(mw.crawler.settings, UnitSpider)
    request = build_request(parse_seed(json.dumps(seeds[0])), None, policy)
    assert request.meta == {LASTMOD_META: "2026-01-02"} and not request.dont_filter


def test_indexes_are_followed_within_the_depth_and_the_site_s_budget_of_every_node(
        redis, redis_url):
    """``SITEMAPS_MAX_PER_SITE`` 3, ``SITEMAPS_MAX_DEPTH`` 1. Node 1 parses
    robots.txt (two sitemaps of the site, one of another host): two requests
    of the site, first in its queue. Node 2 reads the index: one more of its
    four sitemaps fits the site's budget (counted in Redis for both nodes; node
    2 parsing the same robots.txt again, as nodes without ``FRONTIER_SECRET``
    do, uses none of it). An index one level down: its sitemaps are not
    requested."""
    from scrapy.robotstxt import ProtegoRobotParser

    async def scenario():
        one = opened(node(redis_url, SITEMAPS_MAX_PER_SITE=3, SITEMAPS_MAX_DEPTH=1))
        two = opened(node(redis_url, SITEMAPS_MAX_PER_SITE=3, SITEMAPS_MAX_DEPTH=1))
        robots = (f"Sitemap: {SITE}/index.xml\nSitemap: /a.xml\n"
                  f"Sitemap: http://127.0.0.66/b.xml\n").encode()
        parser = ProtegoRobotParser.from_crawler(one.crawler, robots)
        await one.robots_parsed(parser, Request(f"{SITE}/robots.txt"))
        # Without FRONTIER_SECRET each node parses robots.txt: repeats, not counted twice.
        await two.robots_parsed(parser, Request(f"{SITE}/robots.txt"))
        await read(two, f"{SITE}/index.xml", sitemapindex([f"{SITE}/s{i}.xml" for i in range(4)]))
        await read(two, f"{SITE}/s0.xml", sitemapindex([f"{SITE}/deep.xml"]), depth=1)
        for mw in (one, two):
            await mw.spider_closed(mw.crawler.spider)
        return one, two

    one, two = asyncio.run(scenario())
    assert [r.url for r in one.crawler.engine.crawled] == [f"{SITE}/index.xml", f"{SITE}/a.xml"]
    first = one.crawler.engine.crawled[0]
    assert first.priority == 100 and not first.dont_filter
    assert first.meta == {SITEMAP_META: {"hosts": ["127.0.0.65"], "depth": 0},
                          "download_maxsize": 50 << 20}
    assert stat(one, "refused/other_host") == 1
    assert [(r.url, r.meta[SITEMAP_META]["depth"]) for r in two.crawler.engine.crawled] == [
        (f"{SITE}/index.xml", 0), (f"{SITE}/a.xml", 0), (f"{SITE}/s0.xml", 1)]
    assert stat(two, "refused/per_site") == 3 and stat(two, "refused/depth") == 1


def test_a_forged_or_junk_sitemap_is_dead_lettered_and_downloads_wait_for_room(
        redis, redis_url):
    """A request whose sitemap meta no node wrote (a depth beyond the bound)
    and a page that is no sitemap: dead-lettered with the reason. While
    ``SITEMAPS_MAX_PENDING`` seeds wait, a sitemap is not downloaded: it goes
    back to the frontier for later (other requests go on)."""
    async def scenario():
        mw = opened(node(redis_url, SITEMAPS_MAX_PENDING=10))
        await read(mw, f"{SITE}/forged.xml", urlset([f"{SITE}/p/1"]),
                   meta={SITEMAP_META: {"hosts": ["127.0.0.65"], "depth": 99}})
        await read(mw, f"{SITE}/page.xml", b"just text, no XML")
        mw.waiting = 10
        later = mw.process_request(Request(f"{SITE}/s.xml", meta={SITEMAP_META: {}}))
        page = mw.process_request(Request(f"{SITE}/p/1"))
        await mw.spider_closed(mw.crawler.spider)
        return mw, later, page

    mw, later, page = asyncio.run(scenario())
    assert [(url, kind) for url, _, kind in mw.crawler.engine.failed] == [
        (f"{SITE}/forged.xml", "sitemap"), (f"{SITE}/page.xml", "sitemap")]
    assert stat(mw, "refused/invalid_meta") == 1 and stat(mw, "refused/invalid") == 1
    assert waiting_seeds(redis) == []
    assert isinstance(later, Request) and later.meta[RETRY_DELAY_META] == 30.0
    assert page is None and stat(mw, "waits") == 1


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_the_feed_moves_the_oldest_seeds_and_never_fills_the_seed_key_past_its_room(
        redis, redis_url, kind):
    """FEED_SITEMAP_SEEDS: at most *count*, and the seed key at most *room*
    long after the move, oldest first; a seed key of the wrong type: an error
    and nothing moved."""
    import redis.asyncio as aioredis

    seeds = start_urls_key("smunit")

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        store = SitemapStore(client, "smunit", seeds, kind)
        assert await store.push([f"s{i}" for i in range(10)]) == 10
        {"list": redis.lpush, "set": redis.sadd}.get(kind, lambda k, v: redis.zadd(k, {v: 5}))(
            seeds, "user-seed")
        first = await store.feed(5, 4)      # room for 3 next to the user's seed
        second = await store.feed(5, 100)
        redis.delete(seeds)
        redis.set(seeds, "junk")
        with pytest.raises(Exception):
            await store.feed(5, 100)
        left = await store.waiting()
        await client.aclose()
        return first, second, left

    first, second, left = asyncio.run(scenario())
    assert (first, second, left) == ((3, 7), (5, 2), 2)


def test_a_sitemap_s_lastmod_reaches_the_page_record_not_the_revisit_request():
    """A page fetched from a sitemap seed: its ``lastmod`` is kept in the page
    record (``sitemap_lastmod``, UTC) for the recrawl schedule; the request
    stored to revisit the page does not carry it (it was one visit's word)."""
    from datetime import datetime, timezone

    from crawlproject.recrawl.middleware import page_record
    from crawlproject.recrawl.schedule import RecrawlPolicy, RevisitRule

    spider = Spider("pages")
    policy = RecrawlPolicy([RevisitRule(pattern="/p/", interval=3600)])
    request = Request(f"{SITE}/p/1", meta={LASTMOD_META: "2026-11-30T10:00:00+02:00"})
    visit = {"outcome": "new", "url": request.url, "status": 200, "hash": "0" * 40,
             "etag": None, "last_modified": None}
    record = page_record(spider, request, visit, policy,
                         InputPolicy.from_settings(get_crawler(Spider).settings, Spider))
    assert record["sitemap_lastmod"] == datetime(2026, 11, 30, 8, tzinfo=timezone.utc)
    assert LASTMOD_META not in json.loads(record["request"]).get("meta", {})
    junk = request.replace(meta={LASTMOD_META: "2026-13-45"})
    assert "sitemap_lastmod" not in page_record(spider, junk, visit, policy,
                                                InputPolicy.from_settings(None, Spider))


def test_sitemap_xml_is_tried_only_when_asked_and_robots_txt_lists_none(redis, redis_url):
    """``SITEMAPS_TRY_DEFAULT``: a robots.txt without ``Sitemap:`` lines makes
    a request of the site's ``/sitemap.xml``; off (the default), nothing."""
    from scrapy.robotstxt import ProtegoRobotParser

    async def scenario():
        out = []
        for guess in (False, True):
            mw = opened(node(redis_url, SITEMAPS_TRY_DEFAULT=guess))
            parser = ProtegoRobotParser.from_crawler(mw.crawler, b"User-agent: *\nAllow: /\n")
            await mw.robots_parsed(parser, Request(f"{SITE}/robots.txt"))
            await mw.spider_closed(mw.crawler.spider)
            out.append([r.url for r in mw.crawler.engine.crawled])
        return out

    assert asyncio.run(scenario()) == [[], [f"{SITE}/sitemap.xml"]]


def test_a_reset_forgets_the_waiting_seeds_and_the_site_counts(redis):
    """``crawlctl reset`` (:func:`reset_spider`) deletes both keys of sitemap seeds."""
    from crawlproject.keys import reset_spider

    keys = SitemapKeys("smunit", start_urls_key("smunit"))
    redis.lpush(keys.pending, '{"url": "http://127.0.0.65/"}')
    redis.hset(keys.sites, "127.0.0.65", 3)
    assert reset_spider(redis, "smunit") == 2
    assert not redis.exists(keys.pending, keys.sites)


def test_a_newer_lastmod_makes_a_known_page_due_an_older_or_future_one_does_not(
        redis, redis_url, mongo_uri, database):
    """Pages fetched two hours ago (page records as the pipeline keeps them,
    in the real MongoDB-wire server): a sitemap gives one a ``lastmod`` an hour
    ago, one three hours ago, one tomorrow, and lists a page no record holds.
    After the read (one find, one update_many) only the first is due now; the
    future ``lastmod`` is ignored (counted, not carried by the seed), the
    unknown page gets no record. The feeder's own cycle brings the due page
    back as a conditional revisit. The same sitemap read again within the
    rule's minimum interval (the page claimed, not yet fetched) does not make
    it due again."""
    from datetime import datetime, timedelta, timezone

    from crawlproject.recrawl.extension import RecrawlFeeder
    from crawlproject.recrawl.middleware import RecrawlMiddleware
    from crawlproject.recrawl.schedule import STATE_META

    now = datetime.now(timezone.utc).replace(microsecond=0)
    fetched = now - timedelta(hours=2)
    pages = database["smunit_pages"]
    for name in ("newer", "older", "future"):
        url = f"{SITE}/p/{name}"
        pages.insert_one({"_id": url, "url": url, "last_checked": fetched, "interval": 86400.0,
                          "next_visit": fetched + timedelta(days=1), "etag": f'"{name}"',
                          "request": json.dumps({"url": url, "dont_filter": True})})
    lastmods = {f"{SITE}/p/newer": (now - timedelta(hours=1)).isoformat(),
                f"{SITE}/p/older": (now - timedelta(hours=3)).isoformat(),
                f"{SITE}/p/future": (now + timedelta(days=1)).isoformat(),
                f"{SITE}/p/unknown": (now - timedelta(hours=1)).isoformat()}
    body = urlset(list(lastmods), lastmods)

    async def scenario():
        mw = node(redis_url, RECRAWL_ENABLED=True, RECRAWL_INTERVAL=86400,
                  RECRAWL_MIN_INTERVAL=3600, MONGO_URI=mongo_uri, MONGO_DATABASE=database.name,
                  EXTENSIONS={"crawlproject.recrawl.extension.RecrawlFeeder": 520})
        feeder = mw.crawler.get_extension(RecrawlFeeder)
        feeder.spider_opened(mw.crawler.spider)
        feeder._task.cancel()   # its cycle is run by hand below
        opened(mw)
        await read(mw, f"{SITE}/s.xml", body)
        due_now = {d["_id"] for d in pages.find({"next_visit": {"$lte": utc()}})}
        await feeder._feed(10)  # the recrawl's own cycle: due pages into the frontier
        fed = list(mw.crawler.engine.crawled)
        await read(mw, f"{SITE}/s.xml", body)   # again, while the revisit is claimed
        due_again = pages.count_documents({"next_visit": {"$lte": utc()}})
        await mw.spider_closed(mw.crawler.spider)
        await feeder.spider_closed(mw.crawler.spider)
        return mw, due_now, fed, due_again

    def utc():
        return datetime.now(timezone.utc)

    mw, due_now, fed, due_again = asyncio.run(scenario())
    assert due_now == {f"{SITE}/p/newer"}
    assert pages.find_one({"_id": f"{SITE}/p/older"})["next_visit"] > now
    assert pages.find_one({"_id": f"{SITE}/p/future"})["next_visit"] > now
    assert pages.count_documents({}) == 3                       # no record for the unknown page
    assert (stat(mw, "lastmod_due"), stat(mw, "refused/lastmod_future")) == (1, 2)
    seeds = {s["url"]: s for s in waiting_seeds(redis)}
    assert "meta" not in seeds[f"{SITE}/p/future"]              # not carried either
    assert [r.url for r in fed] == [f"{SITE}/p/newer"]
    revisit = fed[0]
    assert revisit.dont_filter and revisit.meta[STATE_META]["etag"] == '"newer"'
    RecrawlMiddleware.from_crawler(mw.crawler).process_request(revisit)
    assert revisit.headers[b"If-None-Match"] == b'"newer"'       # a conditional request
    assert due_again == 0
