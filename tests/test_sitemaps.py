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

from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import FEED_SITEMAP_SEEDS
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
    """robots.txt → an index (and a sitemap of another host) → a sitemap and a
    gzipped one → pages 1-10; a disallowed page and one of another host listed,
    page 3 listed twice."""
    site = Site(address, {})
    o = site.origin
    site.pages.update({
        "/robots.txt": (200, "text/plain", (
            f"User-agent: *\nDisallow: /private/\nSitemap: {o}/sitemap_index.xml\n"
            f"Sitemap: http://{other}:9/elsewhere.xml\n").encode()),
        "/": html("home"),
        "/sitemap_index.xml": (200, XML, sitemapindex([f"{o}/sitemaps/a.xml",
                                                       f"{o}/sitemaps/b.xml.gz"])),
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
    watched until the flood site has served 20 pages (the event): the most
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
            while flood.served() < 23:   # robots.txt, /, big.xml and 20 pages
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
    result = SimpleNamespace(
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
    ``lastmod`` reached its request."""
    assert crawl.on == Counter({"/robots.txt": 1, "/": 1, "/sitemap_index.xml": 1,
                                "/sitemaps/a.xml": 1, "/sitemaps/b.xml.gz": 1,
                                **{f"/p/{i}": 1 for i in range(1, 11)}}), crawl.on
    stats = crawl.stats["sitemap_on"]
    assert stats["sitemaps/requested"] == 3 and stats["sitemaps/indexes"] == 1
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
    is crawled at 5 pages a second: until it served 20 pages, the frontier's
    queue and the seed key together never held more than the bound allows,
    while the rest of the sitemap waited in Redis."""
    assert crawl.seen["waiting"] >= FLOOD_PAGES - 200, crawl.seen
    assert crawl.seen["queued"] <= QUEUED_BOUND, crawl.seen
    assert crawl.stats["sitemap_flood"]["sitemaps/urls"] == FLOOD_PAGES
