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
from tests.crawl_helpers import ROOT, node_env

XML = "application/xml"


# -- a real site --------------------------------------------------------------------

class Site:
    """Static answers on one loopback address (port 0), every request recorded."""

    def __init__(self, address: str, pages: dict[str, tuple[int, str, bytes]]):
        self.pages = pages
        self.hits: list[str] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                with site.lock:
                    site.hits.append(self.path)
                status, ctype, body = site.pages.get(self.path, (404, "text/plain", b"no"))
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


# -- real crawls ----------------------------------------------------------------------

SETTINGS = ["-s", "SPIDER_MODULES=tests.spiders", "-s", "ROBOTSTXT_OBEY=True",
            "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=2", "-s", "DOWNLOAD_DELAY=0",
            "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=4", "-s", "LOG_LEVEL=INFO",
            "-s", "RANDOMIZE_DOWNLOAD_DELAY=False"]


def spiders_process(tmp_path, env, names, extra=()) -> subprocess.Popen:
    stats = tmp_path / "stats"
    stats.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "tests.run_spiders", "--stats-dir", str(stats),
           "-s", f"LOG_FILE={tmp_path / 'node.log'}", "-s", "NODE_ID=sm1", *SETTINGS, *extra,
           *names]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stats_of(tmp_path, name) -> dict:
    return json.loads((tmp_path / "stats" / f"{name}-sm1.json").read_text())


def test_a_spider_that_asks_crawls_every_listed_page_once_and_one_that_does_not_no_sitemap(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Two spiders in one node. ``sitemap_on`` (``sitemap_seeds = True``),
    seeded with its site's home page only: robots.txt → index → a sitemap and
    a gzipped one → every listed page fetched once (page 3 listed twice), the
    disallowed one not, nor the other host's sitemap or page (counted), and a
    page's ``lastmod`` reached its request. ``sitemap_off`` (the default:
    off): its site's robots.txt lists the same kind of sitemaps; none is
    fetched, only the home page."""
    env = node_env(redis_url, mongo_uri, database.name)
    with small_site("127.0.0.61", "127.0.0.63") as on, \
            small_site("127.0.0.62", "127.0.0.63") as off:
        redis.lpush(start_urls_key("sitemap_on"), f"{on.origin}/")
        redis.lpush(start_urls_key("sitemap_off"), f"{off.origin}/")
        proc = spiders_process(tmp_path, env, ["sitemap_on", "sitemap_off"])
        try:
            assert proc.wait(90) == 0, proc.stderr.read().decode()[-3000:]
        finally:
            proc.kill()
        on_hits, off_hits = on.counts(), off.counts()
    log = (tmp_path / "node.log").read_text()
    assert on_hits == Counter({"/robots.txt": 1, "/": 1, "/sitemap_index.xml": 1,
                               "/sitemaps/a.xml": 1, "/sitemaps/b.xml.gz": 1,
                               **{f"/p/{i}": 1 for i in range(1, 11)}}), (on_hits, log[-3000:])
    assert off_hits == Counter({"/robots.txt": 1, "/": 1}), off_hits
    stats = stats_of(tmp_path, "sitemap_on")
    assert stats["sitemaps/requested"] == 3 and stats["sitemaps/indexes"] == 1
    assert stats["sitemaps/urlsets"] == 2
    assert stats["sitemaps/urls"] == 12      # 10 pages, page 3 again, the disallowed one
    assert stats["sitemaps/refused/other_host"] == 1       # robots.txt's sitemap elsewhere
    assert stats["sitemaps/refused/other_host_urls"] == 1  # a.xml's page elsewhere
    assert stats["robotstxt/forbidden"] == 1
    assert stats["test/lastmod/p/2"] == "2026-11-30T10:00:00+00:00"
    assert "Sitemaps of 127.0.0.61: sitemap http://127.0.0.63:9/elsewhere.xml is on another host" \
        in log
    assert not any(k.startswith("sitemaps/") for k in stats_of(tmp_path, "sitemap_off"))
