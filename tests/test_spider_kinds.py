"""Every spider a Scrapy user has, on the shared scheduler, unchanged.

A user's project (the README's settings block pasted as written) with one
spider of each kind, each on a host of its own of a local shop
(:mod:`tests.kinds_site`): ``scrapy.Spider`` with ``start_urls`` and public
callbacks; with private callbacks, a mixin's errback, ``cb_kwargs``, meta and
a ``lambda`` callback; with ``start()`` and ``FormRequest``; with
``start_requests`` and ``JsonRequest``; ``CrawlSpider``; ``SitemapSpider``
(from robots.txt, through a sitemap index); ``XMLFeedSpider``;
``CSVFeedSpider``; scrapy-redis' ``RedisSpider`` and ``RedisCrawlSpider``;
this project's ``RedisSpider``. Two nodes run them all at once (two
processes, each running every spider: :mod:`tests.run_spiders`). Every
product of every spider is stored once, every page fetched once (a start
request once per node: Scrapy's start requests are ``dont_filter``), and
every crawl ends by itself when the cluster's frontier for it is done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import redis as redis_lib

from tests import kinds_site
from tests.crawl_helpers import ROOT, user_project
from tests.kinds_site import KindsSite

SPIDERS = '''
import json
import os

import scrapy
from scrapy.http import JsonRequest
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, CSVFeedSpider, Rule, SitemapSpider, XMLFeedSpider
from scrapy_redis.spiders import RedisCrawlSpider
from scrapy_redis.spiders import RedisSpider as ScrapyRedisSpider

from crawlproject.spiders import RedisSpider

SITE = json.loads(os.environ["KINDS_SITE"])    # spider name -> its host's base URL


def product(response, **extra):
    return {"url": response.url, "title": response.css("h1.title::text").get(), **extra}


class Plain(scrapy.Spider):
    name = "plain"
    start_urls = [SITE["plain"]]

    def parse(self, response):
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, self.parse_product)
        yield from response.follow_all(css="a.next", callback=self.parse)

    def parse_product(self, response):
        yield product(response)


class Failures:
    def _failed(self, failure):
        self.logger.error("download failed: %s", failure)


class Private(Failures, scrapy.Spider):
    name = "private"
    start_urls = [SITE["private"]]

    def parse(self, response):
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, self._parse_product, errback=self._failed,
                                  cb_kwargs={"listing": response.url},
                                  meta={"found_on": {"url": response.url}})
        yield from response.follow_all(css="a.next", callback=self.parse)
        if response.url == SITE["private"]:
            # No node could store this callback: the node that made it crawls it.
            yield response.follow("product/1?via=lambda",
                                  callback=lambda r: product(r, via="lambda"))

    def _parse_product(self, response, listing):
        yield product(response, listing=listing, found_on=response.meta["found_on"]["url"])


class Start(scrapy.Spider):
    name = "start"

    async def start(self):
        yield scrapy.FormRequest(SITE["start"] + "search", formdata={"page": "1"},
                                 callback=self.parse_search, cb_kwargs={"page": 1})

    def parse_search(self, response, page):
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, self.parse_product)
        if response.css("a.next"):
            yield scrapy.FormRequest(SITE["start"] + "search", formdata={"page": str(page + 1)},
                                     callback=self.parse_search, cb_kwargs={"page": page + 1})

    def parse_product(self, response):
        yield product(response)


class Api(scrapy.Spider):
    name = "api"

    def start_requests(self):      # Scrapy < 2.13
        yield JsonRequest(SITE["api"] + "api/products", data={"page": 1}, callback=self._page)

    async def start(self):
        for request in self.start_requests():
            yield request

    def _page(self, response):
        data = response.json()
        for path in data["products"]:
            yield response.follow(path, self._product)
        if data["next"]:
            yield JsonRequest(SITE["api"] + "api/products", data={"page": data["next"]},
                              callback=self._page)

    def _product(self, response):
        yield product(response)


class Crawl(CrawlSpider):
    name = "crawl"
    start_urls = [SITE["crawl"]]
    rules = (Rule(LinkExtractor(restrict_css="a.product"), callback="parse_item"),
             Rule(LinkExtractor(restrict_css="a.next")))

    def parse_item(self, response):
        yield product(response)


class Sitemap(SitemapSpider):
    name = "sitemap"
    sitemap_urls = [SITE["sitemap"] + "robots.txt"]
    sitemap_rules = [("/product/", "parse_product")]

    def parse_product(self, response):
        yield product(response)


class Feed(XMLFeedSpider):
    name = "xmlfeed"
    start_urls = [SITE["xmlfeed"] + "feed.xml"]
    itertag = "item"

    def parse_node(self, response, node):
        yield response.follow(node.xpath("link/text()").get(), self.parse_product)

    def parse_product(self, response):
        yield product(response)


class Csv(CSVFeedSpider):
    name = "csvfeed"
    start_urls = [SITE["csvfeed"] + "feed.csv"]

    def parse_row(self, response, row):
        yield scrapy.Request(row["url"], callback=self.parse_product)

    def parse_product(self, response):
        yield product(response)


class ScrapyRedis(ScrapyRedisSpider):
    name = "sr_spider"

    def parse(self, response):
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, self.parse_product)
        yield from response.follow_all(css="a.next", callback=self.parse)

    def parse_product(self, response):
        yield product(response)


class ScrapyRedisCrawl(RedisCrawlSpider):
    name = "sr_crawl"
    rules = (Rule(LinkExtractor(restrict_css="a.product"), callback="parse_item"),
             Rule(LinkExtractor(restrict_css="a.next")))

    def parse_item(self, response):
        yield product(response)


class Ours(RedisSpider):
    name = "ours"

    def parse(self, response):
        for href in response.css("a.product::attr(href)").getall():
            yield response.follow(href, self._parse_product)
        yield from response.follow_all(css="a.next", callback=self.parse)

    def _parse_product(self, response):
        yield product(response)
'''

#: spider -> its start page(s), and whether it is fed from Redis
KINDS = {
    "plain": ["/"], "private": ["/"], "start": [], "api": [], "crawl": ["/"],
    "sitemap": ["/robots.txt"], "xmlfeed": ["/feed.xml"], "csvfeed": ["/feed.csv"],
    "sr_spider": [], "sr_crawl": [], "ours": [],
}
FED = ("sr_spider", "sr_crawl", "ours")
HOSTS = {name: f"127.0.{45 + n // 200}.{n % 200 + 10}" for n, name in enumerate(KINDS)}


def expected_pages(name: str) -> dict[tuple[str, str], int]:
    """(method, path) -> most fetches of it in a correct crawl of spider *name*
    on two nodes: a start request once per node, robots.txt once for the
    cluster (ROBOTSTXT_OBEY), every other page once."""
    pages = {page: 1 for page in _pages(name)}
    for path in KINDS[name]:
        pages[("GET", path)] = 2
    pages[("GET", "/robots.txt")] = pages.get(("GET", "/robots.txt"), 0) + 1
    return pages


def _pages(name: str) -> set[tuple[str, str]]:
    products = {("GET", p) for p in kinds_site.product_paths()}
    lists = {("GET", f"/list/{n}") for n in range(2, kinds_site.pages() + 1)}
    first = {("GET", "/")}
    if name == "start":
        return products | {("POST", f"/search#page={n}") for n in range(1, kinds_site.pages() + 1)}
    if name == "api":
        return products | {("POST", "/api/products#" + json.dumps({"page": n}, sort_keys=True))
                           for n in range(1, kinds_site.pages() + 1)}
    if name == "sitemap":
        return products | {("GET", "/robots.txt"), ("GET", "/sitemap.xml"),
                           ("GET", "/sitemap-products.xml")}
    if name in ("xmlfeed", "csvfeed"):
        return products | {("GET", KINDS[name][0])}
    if name == "private":
        return products | lists | first | {("GET", "/product/1?via=lambda")}
    return products | lists | first


def run_nodes(project, stats_dir, env, names, count=2, extra=()):
    procs = []
    for n in range(1, count + 1):
        cmd = [sys.executable, "-m", "tests.run_spiders", "--stats-dir", str(stats_dir),
               "-s", f"NODE_ID=node-{n}", "-s", f"LOG_FILE={stats_dir / f'node-{n}.log'}",
               *extra, *names]
        procs.append(subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    return procs


@pytest.mark.slow
def test_every_kind_of_spider_crawls_its_site_completely_on_two_nodes(
        redis_url, mongo_uri, database, tmp_path, redis):
    with KindsSite(list(HOSTS.values())) as site:
        urls = {name: site.urls[host] for name, host in HOSTS.items()}
        project = user_project(tmp_path / "project", "userproj", SPIDERS)
        stats_dir = tmp_path / "stats"
        stats_dir.mkdir()
        env = {**os.environ, "KINDS_SITE": json.dumps(urls),
               "PYTHONPATH": os.pathsep.join([str(project), os.path.dirname(
                   os.path.dirname(os.path.abspath(__file__)))])}
        # The README block names local servers: pointed at the test's own with -s, and
        # the README's 1 s between a site's requests made 0 (a suite of its own is slow).
        extra = ["-s", f"REDIS_URL={redis_url}", "-s", f"MONGO_URI={mongo_uri}",
                 "-s", f"MONGO_DATABASE={database.name}", "-s", "DOWNLOAD_DELAY=0",
                 "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3", "-s", "LOG_LEVEL=INFO"]
        procs = run_nodes(project, stats_dir, env, list(KINDS), extra=extra)
        try:
            # Redis-fed spiders: seeds pushed the way their users push them.
            redis.lpush("sr_spider:start_urls", urls["sr_spider"])
            redis.lpush("sr_crawl:start_urls", urls["sr_crawl"])
            redis.lpush("ours:start_urls", urls["ours"])
            codes = [p.wait(240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        logs = {p: (stats_dir / f"node-{n}.log").read_text(errors="replace")
                for n, p in enumerate(procs, 1)}
        assert codes == [0, 0], [p.stderr.read()[-3000:] for p in procs]
        problems = []
        for name, host in HOSTS.items():
            stats = [json.loads((stats_dir / f"{name}-node-{n}.json").read_text())
                     for n in (1, 2)]
            reasons = {s["finish_reason"] for s in stats}
            scraped = sum(s.get("item_scraped_count", 0) for s in stats)
            upserted = sum(s.get("mongo/upserted", 0) for s in stats)
            stored = {d["url"] for d in database[name].find({}, {"url": 1})}
            want = {urls[name].rstrip("/") + p for p in kinds_site.product_paths()}
            if name == "private":
                want.add(urls[name] + "product/1?via=lambda")
            fetched = site.fetched(host)
            pages = expected_pages(name)
            wrong = {page: n for page, n in fetched.items() if n > pages.get(page, 0)}
            missing = set(pages) - set(fetched)
            if reasons != {"finished"} or stored != want or scraped != len(want) \
                    or upserted != len(want) or wrong or missing:
                problems.append(f"{name}: finish {reasons}, stored {len(stored)}/{len(want)}, "
                                f"scraped {scraped}, upserted {upserted}, wrong {wrong}, "
                                f"missing {sorted(missing)[:5]}")
        assert not problems, "\n".join(problems)
        # Each node that parsed the start page (once per node: dont_filter) kept its
        # lambda request; the cluster's filter let one of them fetch it (above).
        lambdas = [json.loads((stats_dir / f"private-node-{n}.json").read_text())
                   .get("scheduler/kept_local/not_storable", 0) for n in (1, 2)]
        assert lambdas in ([1, 0], [0, 1], [1, 1])
        for text in logs.values():
            assert "Traceback" not in text and "] ERROR:" not in text, text[-3000:]
            assert "FRONTIER_SECRET is not set" not in text
        assert sum("Kept on this node" in t for t in logs.values()) == sum(lambdas)


CRAWL_ONLY = '''
import json
import os

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule

SITE = json.loads(os.environ["KINDS_SITE"])


class Crawl(CrawlSpider):
    name = "crawl"
    start_urls = [SITE["crawl"]]
    rules = (Rule(LinkExtractor(restrict_css="a.product, a.related"), callback="parse_item",
                  follow=True),
             Rule(LinkExtractor(restrict_css="a.next")))

    def parse_item(self, response):
        yield {"url": response.url, "title": response.css("h1.title::text").get()}
'''


def scrapy_crawl(project, name, env, log, settings):
    cmd = [sys.executable, "-m", "scrapy", "crawl", "crawl", "-s", f"LOG_FILE={log}",
           "-s", f"NODE_ID={name}"]
    for key, value in settings.items():
        cmd += ["-s", f"{key}={value}"]
    return subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


@pytest.mark.slow
def test_a_node_killed_during_a_crawlspider_crawl_loses_nothing(
        redis_url, mongo_uri, database, tmp_path, redis):
    """Two ``scrapy crawl`` nodes of a CrawlSpider (rule callbacks are the
    spider's private ``_callback``: they must survive the round trip through
    Redis to be reclaimed by the other node); one is SIGKILLed while it holds
    leases: the other finishes the crawl, every product stored, no page
    fetched more than twice (once by the dead node, once after its lease came
    back)."""
    from tests.crawl_helpers import leases_held

    host = "127.0.46.10"
    with KindsSite([host]) as site:
        project = user_project(tmp_path / "project", "userproj", CRAWL_ONLY)
        env = {**os.environ, "KINDS_SITE": json.dumps({"crawl": site.urls[host]}),
               "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)])}
        settings = {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri,
                    "MONGO_DATABASE": database.name, "DOWNLOAD_DELAY": "0.05",
                    "SCHEDULER_LEASE_TTL": "3", "SCHEDULER_HEARTBEAT_INTERVAL": "1",
                    "LOG_LEVEL": "INFO"}
        victim = scrapy_crawl(project, "victim", env, tmp_path / "victim.log", settings)
        survivor = None
        try:
            deadline = time.monotonic() + 90
            while not (leases_held(redis, "victim") and len(site.fetched(host)) >= 8):
                assert victim.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "victim.log").read_text()[-3000:]
                time.sleep(0.01)
            survivor = scrapy_crawl(project, "survivor", env, tmp_path / "survivor.log",
                                    settings)
            held = leases_held(redis, "victim")
            victim.kill()
            victim.wait()
            assert survivor.wait(180) == 0, survivor.stderr.read()[-3000:]
        finally:
            for proc in (victim, survivor):
                if proc is not None and proc.poll() is None:
                    proc.kill()
        log = (tmp_path / "survivor.log").read_text()
        stored = {d["url"] for d in database["crawl"].find({}, {"url": 1})}
        assert stored == {site.urls[host].rstrip("/") + p for p in kinds_site.product_paths()}
        fetched = site.fetched(host)
        twice = {page for page, n in fetched.items() if n > 1 and page != ("GET", "/")}
        assert all(n <= 2 for n in fetched.values()), fetched
        assert len(twice) <= held, (twice, held)
        assert "'scheduler/reclaimed'" in log and "'finish_reason': 'finished'" in log
        assert redis.hlen("{crawl}:payloads") == 0 and redis.hlen("{crawl}:inflight") == 0
