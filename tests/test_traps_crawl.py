"""Crawler traps and meta robots in a whole crawl: a user's project (the README's
settings block pasted as written) with a ``CrawlSpider`` that follows every link,
on the shared frontier (Redis) and storing in MongoDB, against local sites:

* a site whose every page links ``a/b/`` relative to itself (``/a/b/a/b/…`` for
  ever): ends after 3 pages (``PATH_REPEAT_LIMIT = 2``);
* a calendar with endless next- and previous-month links: ends at its site budget;
* a page of 12,000 links: at most ``PAGE_REQUESTS_LIMIT`` (10,000) of them
  reach the frontier, the rest are counted;
* meta robots and ``X-Robots-Tag`` pages: a nofollow page's links are not
  fetched, a noindex page's item is not stored, another crawler's header is not ours.

The crawl ends by itself (``finished``). Each trap unit by unit, and the page of
100,000 links against another site's page: tests/test_traps.py,
tests/test_meta_robots.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crawlproject.keys import FrontierKeys
from tests.crawl_helpers import ROOT, user_project

pytestmark = pytest.mark.slow

LOOP, CALENDAR, BIG, META = "127.0.0.71", "127.0.0.72", "127.0.0.73", "127.0.0.74"
BIG_LINKS = 12_000
#: budgets of the trap sites (the default, 100,000, would take a while): the
#: loop site's only ends it on code without the path check
BUDGETS = {LOOP: 40, CALENDAR: 25, BIG: 30}
#: meta site: page -> (meta robots content, X-Robots-Tag header)
META_PAGES = {"nofollow": ("nofollow", None), "noindex": ("noindex", None),
              "none": ("none", None), "ours": (None, "crawlbot: nofollow"),
              "other": (None, "otherbot: noindex, nofollow"), "xnoindex": (None, "noindex")}

SPIDERS = '''
import json
import os

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class Traps(CrawlSpider):
    name = "traps"
    start_urls = json.loads(os.environ["TRAP_SITES"])
    rules = (Rule(LinkExtractor(), callback="parse_item", follow=True),)

    def parse_start_url(self, response):
        return self.parse_item(response)

    def parse_item(self, response):
        yield {"url": response.url}
'''


def _html(body: str, meta: str | None = None) -> bytes:
    head = f'<meta name="robots" content="{meta}">' if meta else ""
    return f"<!doctype html><html><head><title>t</title>{head}</head><body>{body}</body></html>" \
        .encode()


def render(host: str, path: str) -> tuple[int, dict, bytes]:
    if path == "/robots.txt":
        return 200, {"Content-Type": "text/plain"}, b"User-agent: *\nAllow: /\n"
    html = {"Content-Type": "text/html; charset=utf-8"}
    if host == LOOP and path.endswith("/"):
        return 200, html, _html('<a href="a/b/">deeper</a>')
    if host == CALENDAR and (path == "/" or path.startswith("/cal/")):
        year, month = (2026, 1) if path == "/" else map(int, path.split("/")[2:4])
        nxt = (year + month // 12, month % 12 + 1)
        prev = (year - (month == 1), (month - 2) % 12 + 1)
        return 200, html, _html(f'<a href="/cal/{nxt[0]}/{nxt[1]}">next</a>'
                                f'<a href="/cal/{prev[0]}/{prev[1]}">previous</a>')
    if host == BIG and path == "/":
        return 200, html, _html("".join(f'<a href="/p/{i}">{i}</a>' for i in range(BIG_LINKS)))
    if host == BIG and path.startswith("/p/"):
        return 200, html, _html("leaf")
    if host == META and path == "/":
        return 200, html, _html("".join(f'<a href="/{name}">{name}</a>' for name in META_PAGES))
    if host == META and path.lstrip("/") in META_PAGES:
        name = path.lstrip("/")
        meta, header = META_PAGES[name]
        headers = {**html, **({"X-Robots-Tag": header} if header else {})}
        return 200, headers, _html(f'<a href="/behind/{name}">behind</a>', meta)
    if host == META and path.startswith("/behind/"):
        return 200, html, _html("behind")
    return 404, html, _html("not found")


class TrapWeb:
    """The four sites, each on its own loopback address (port 0), in threads
    of the test process; every request recorded as ``(host, path)``."""

    def __init__(self):
        self.hits: Counter = Counter()
        self.lock = threading.Lock()
        self.servers: list[ThreadingHTTPServer] = []
        self.urls: dict[str, str] = {}

    def __enter__(self):
        web = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                host = self.server.server_address[0]
                with web.lock:
                    web.hits[(host, self.path)] += 1
                status, headers, body = render(host, self.path)
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        for host in (LOOP, CALENDAR, BIG, META):
            server = ThreadingHTTPServer((host, 0), Handler)
            server.daemon_threads = True
            self.servers.append(server)
            self.urls[host] = f"http://{host}:{server.server_address[1]}/"
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        for server in self.servers:
            server.shutdown()
            server.server_close()

    def pages(self, host: str) -> set[str]:
        with self.lock:
            return {path for (h, path) in self.hits if h == host and path != "/robots.txt"}


def test_traps_end_and_meta_robots_hold_in_a_crawl(redis_url, redis, mongo_uri, database,
                                                   tmp_path):
    with TrapWeb() as web:
        project = user_project(tmp_path / "project", "crawlbot", SPIDERS)
        stats_dir = tmp_path / "stats"
        stats_dir.mkdir()
        env = {**os.environ, "TRAP_SITES": json.dumps(list(web.urls.values())),
               "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
        limits = {host: {"budget": n} for host, n in BUDGETS.items()}
        settings = {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri,
                    "MONGO_DATABASE": database.name, "DOWNLOAD_DELAY": "0",
                    "CONCURRENT_REQUESTS_PER_DOMAIN": "8", "LOG_LEVEL": "INFO",
                    "FRONTIER_HOST_LIMITS": json.dumps(limits), "NODE_ID": "node-1",
                    "LOG_FILE": str(stats_dir / "node-1.log")}
        cmd = [sys.executable, "-m", "tests.run_spiders", "--stats-dir", str(stats_dir)]
        for name, value in settings.items():
            cmd += ["-s", f"{name}={value}"]
        proc = subprocess.run([*cmd, "traps"], cwd=project, env=env, capture_output=True,
                              timeout=240)
        log = (stats_dir / "node-1.log").read_text(errors="replace")
        assert proc.returncode == 0, proc.stderr[-3000:]
        stats = json.loads((stats_dir / "traps-node-1.json").read_text())
        assert stats["finish_reason"] == "finished"
        assert "Traceback" not in log and "] ERROR:" not in log, log[-3000:]

        # The path loop ends after 3 pages (/a/b/a/b/a/b/ is the third run in a row).
        assert web.pages(LOOP) == {"/", "/a/b/", "/a/b/a/b/"}
        assert stats["traps/path_repeat"] == 1
        # The endless calendar ends at its site budget, the rest refused and counted.
        assert len(web.pages(CALENDAR)) == BUDGETS[CALENDAR]
        budget = {k.decode(): v.decode() for k, v in
                  redis.hgetall(FrontierKeys("traps", 0, 1).budget).items()}
        admitted, refused = map(int, budget[CALENDAR].split("|"))
        assert admitted == BUDGETS[CALENDAR] and refused > 0
        # The page of 12,000 links: its first 10,000 reached the frontier (30 admitted
        # by the site's budget, the rest refused there), the other 10,000 were dropped.
        assert stats["traps/page_requests_dropped"] == BIG_LINKS - 10_000
        assert stats["traps/pages_over_limit"] == 1
        admitted, refused = map(int, budget[BIG].split("|"))
        assert (admitted, admitted + refused) == (BUDGETS[BIG], 1 + 10_000)
        assert len(web.pages(BIG)) == BUDGETS[BIG]
        assert log.count("(PAGE_REQUESTS_LIMIT;") == 1

        # Meta robots: nofollow pages' links not fetched, noindex pages' items not stored.
        assert web.pages(META) == {"/", *(f"/{name}" for name in META_PAGES),
                                   "/behind/noindex", "/behind/other", "/behind/xnoindex"}
        stored = {d["url"] for d in database["traps"].find({}, {"url": 1})}
        meta_site = web.urls[META].rstrip("/")
        assert {u[len(meta_site):] for u in stored if u.startswith(meta_site)} == {
            "/", "/nofollow", "/ours", "/other", "/behind/noindex", "/behind/other",
            "/behind/xnoindex"}
        assert stats["metarobots/nofollow"] == 3 and stats["metarobots/noindex"] == 3
        assert stats["metarobots/noindex/items_dropped"] == 3
