"""SitemapSeeds: the sitemaps a site lists in robots.txt as a source of seeds.

Off unless asked (``SITEMAPS_ENABLED``, or ``sitemap_seeds = True`` on the
spider). On the node that parsed a site's robots.txt, its ``Sitemap:`` URLs
become requests of their own host through the frontier; this downloader
middleware reads each sitemap as it arrives (bounded: ``SITEMAPS_MAX_*``),
follows an index's sitemaps, and turns page URLs into JSON seeds that a
feeder moves into the seed key only as fast as the crawl takes them; with
the recrawl on, a newer ``lastmod`` makes a known page due now. Same site
only unless ``SITEMAPS_OTHER_HOSTS``; every limit has a stat.

Downloader middleware, between HttpCompressionMiddleware (590) and the
recrawl middleware (580): ``{"crawlproject.sitemaps.SitemapSeeds": 587}``.
Needs a :class:`~crawlproject.spiders.seeded.RedisSpider` and
``ROBOTSTXT_OBEY``. The steps and limits in full: ``docs/sitemaps.md``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import timedelta
from itertools import islice

from scrapy import Request, signals
from pymongo.errors import PyMongoError
from scrapy.exceptions import IgnoreRequest, NotConfigured

from crawlproject.connection import REDIS_FAILURES, redis_from_settings
from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.recrawl.schedule import utc_now
from crawlproject.sitemaps.parse import (LASTMOD_META, SitemapTooLarge, check_loc,
                                         lastmod_datetime, read_sitemap, robots_sitemaps,
                                         site_host, sitemap_body)
from crawlproject.sitemaps.store import SitemapStore
from crawlproject.urls import canonicalizer_for

logger = logging.getLogger(__name__)

#: meta of a sitemap request: ``{"hosts": [the site's hosts], "depth": n}``
SITEMAP_META = "sitemap"
#: frontier priority of sitemap requests: before the site's pages (0), after robots.txt
PRIORITY = 100
FEED_INTERVAL = 1.0     # seconds between a node's looks at the frontier's room
FEED_BATCH = 500        # seeds moved per look at most
PUSH_CHUNK = 1000       # seeds per LPUSH while a sitemap is read
YIELD_EVERY = 500       # entries parsed between two turns of the event loop
WAIT = 30.0             # seconds a sitemap waits in the frontier while too many seeds wait
MAX_SAID = 10_000       # (site, reason) pairs logged; beyond: counted only
MAX_HOSTS = 4


class SitemapSeeds:
    """See the module docstring and docs/sitemaps.md."""

    def __init__(self, crawler, *, try_default: bool, max_per_site: int, max_depth: int,
                 max_urls: int, max_size: int, other_hosts: bool, max_queued: int,
                 max_pending: int, lastmod_skew: float = 300.0):
        self.crawler = crawler
        self.lastmod_skew = timedelta(seconds=lastmod_skew)
        self.recrawl = None         # the recrawl's feeder on this node (RECRAWL_ENABLED)
        self.stats = crawler.stats
        self.try_default, self.other_hosts = try_default, other_hosts
        self.max_per_site, self.max_depth = max_per_site, max_depth
        self.max_urls, self.max_size = max_urls, max_size
        self.max_queued, self.max_pending = max_queued, max_pending
        self.store: SitemapStore | None = None
        self.waiting = 0            # seeds waiting in Redis at the last look (every node's)
        self._redis = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._said: set[tuple[str, str]] = set()
        self._errors_said_at = float("-inf")

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        wanted = getattr(crawler.spidercls, "sitemap_seeds", None)
        if not (setting(s, "SITEMAPS_ENABLED") if wanted is None else bool(wanted)):
            raise NotConfigured  # off by choice: bare, as Scrapy's own
        from crawlproject.spiders.seeded import RedisSpider

        if not issubclass(crawler.spidercls, RedisSpider):
            logger.warning("Sitemap seeds are on but spider %s is not a RedisSpider (they "
                           "take its seed path): off", crawler.spidercls.name)
            raise NotConfigured("not a RedisSpider")
        max_size = setting(s, "SITEMAPS_MAX_SIZE")
        download_max = s.getint("DOWNLOAD_MAXSIZE")
        if download_max and (not max_size or download_max < max_size):
            max_size = download_max   # never more than any download may be
        mw = cls(crawler, try_default=setting(s, "SITEMAPS_TRY_DEFAULT"),
                 max_per_site=max(0, setting(s, "SITEMAPS_MAX_PER_SITE")),
                 max_depth=max(0, setting(s, "SITEMAPS_MAX_DEPTH")),
                 max_urls=max(0, setting(s, "SITEMAPS_MAX_URLS")), max_size=max(0, max_size),
                 other_hosts=setting(s, "SITEMAPS_OTHER_HOSTS"),
                 max_queued=max(1, setting(s, "SITEMAPS_MAX_QUEUED")),
                 max_pending=max(1, setting(s, "SITEMAPS_MAX_PENDING")),
                 lastmod_skew=max(0.0, setting(s, "SITEMAPS_LASTMOD_SKEW")))
        if not s.getbool("ROBOTSTXT_OBEY"):
            logger.warning("Sitemap seeds are on but ROBOTSTXT_OBEY is off: no robots.txt, "
                           "no Sitemap: lines, no sitemap seeds")
        crawler.signals.connect(mw.robots_parsed, signal=signals.robots_parsed)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # -- lifecycle ------------------------------------------------------------
    def spider_opened(self, spider) -> None:
        self._redis = redis_from_settings(self.crawler.settings, asyncio=True)
        self.store = SitemapStore(self._redis, spider.name, spider.redis_key,
                                  spider.seed_queue.kind)
        # The seed reader does not idle-close while sitemap seeds wait for room.
        spider.seed_sources.append(lambda: self.waiting > 0)
        self._task = asyncio.ensure_future(self._feed_loop())
        from crawlproject.recrawl.extension import RecrawlFeeder

        try:
            self.recrawl = self.crawler.get_extension(RecrawlFeeder)
        except RuntimeError:   # no extension manager (a bare crawler): no recrawl
            self.recrawl = None

    async def spider_closed(self, spider) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()

    # -- robots.txt: where sitemaps come from ---------------------------------
    async def robots_parsed(self, robotparser, request: Request, **kwargs) -> None:
        """Request the sitemaps a site's robots.txt lists (on the node that parsed
        it). Awaited by the robots.txt middleware: the robots.txt request is
        done only once its sitemaps' requests are in the scheduler."""
        if self.store is None or self._closing:
            return
        hosts = site_hosts(request)
        if not hosts:
            return
        listed = robots_sitemaps(robotparser, request.url)
        urls = list(islice(listed, self.max_per_site))
        beyond = sum(1 for _ in islice(listed, 100_000))
        if beyond:
            self._refused(hosts[0], "per_site", beyond, f"robots.txt lists more than "
                          f"SITEMAPS_MAX_PER_SITE ({self.max_per_site}) sitemaps")
        if not urls and self.try_default:
            urls = [request.url.split("/robots.txt", 1)[0] + "/sitemap.xml"]
        if urls:
            self.stats.inc_value("sitemaps/robots")
            urls = [url for url in (self._allowed(u, hosts, request.url) for u in urls) if url]
            try:
                await self.store.count_listed(hosts[0], len(urls))
                await self._request_all(urls, hosts, 0, request.url, counted=True)
            except REDIS_FAILURES as exc:   # its sitemaps are not read; the crawl goes on
                self._error(f"requesting the sitemaps of {hosts[0]}", exc)

    async def _request_all(self, locs, hosts: list[str], depth: int, base: str,
                           counted: bool = False) -> None:
        """Request the sitemaps *locs* (an index's, robots.txt's) within the
        site's budget (*counted*: robots.txt's, already in it)."""
        for n, loc in enumerate(locs):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)   # an index of junk does not hold the event loop
            url = loc if counted else self._allowed(loc, hosts, base)
            if url is None:
                continue
            if not counted and await self.store.count_sitemap(hosts[0]) > self.max_per_site:
                left = len(locs) - n if isinstance(locs, list) else 1 + await _count(locs)
                self._refused(hosts[0], "per_site", left, f"more than SITEMAPS_MAX_PER_SITE "
                              f"({self.max_per_site}) sitemaps")
                return
            meta = {SITEMAP_META: {"hosts": hosts, "depth": depth}}
            if self.max_size:
                meta["download_maxsize"] = self.max_size
            self.crawler.engine.crawl(Request(url, priority=PRIORITY, meta=meta))
            self.stats.inc_value("sitemaps/requested")

    def _allowed(self, loc, hosts: list[str], base: str) -> str | None:
        """*loc* as the URL of a sitemap of the site, or None (counted, said)."""
        url = check_loc(loc, base)
        if url is None:
            self.stats.inc_value("sitemaps/refused/bad_url")
        elif not self.other_hosts and site_host(url) not in hosts:
            self._refused(hosts[0], "other_host", 1, f"sitemap {url[:200]} is on another "
                          f"host (SITEMAPS_OTHER_HOSTS is off)")
            url = None
        return url

    # -- a sitemap's download ---------------------------------------------------
    def process_request(self, request: Request, spider=None):
        if SITEMAP_META not in request.meta or self.waiting < self.max_pending:
            return None
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        if getattr(scheduler, "mark_failed", None) is None:
            return None   # no frontier to wait in: read it anyway
        # Too many seeds wait already: download it later, not now (its URLs
        # would only wait in Redis).
        self.stats.inc_value("sitemaps/waits")
        again = request.replace(dont_filter=True)
        again.meta[RETRY_DELAY_META] = WAIT
        return again

    async def process_response(self, request: Request, response, spider=None):
        raw = request.meta.get(SITEMAP_META)
        if raw is None or not 200 <= response.status < 300:
            return response   # not a sitemap; errors and redirects are handled as any
        info = checked_info(raw, self.max_depth)
        if info is None:
            self._dead(request, "invalid_meta", f"sitemap meta {str(raw)[:100]!r} is not ours")
        self.stats.inc_value("sitemaps/fetched")
        try:
            # Up to SITEMAPS_MAX_SIZE of gunzip: in a thread, not on the event loop.
            body = await asyncio.to_thread(sitemap_body, response, self.max_size)
        except SitemapTooLarge as exc:
            self._dead(request, "too_large", f"sitemap {request.url[:200]} is larger than "
                       f"{self.max_size} bytes decompressed (SITEMAPS_MAX_SIZE): {exc}")
        kind, entries = read_sitemap(body) if body else ("", iter(()))
        if kind == "urlset":
            self.stats.inc_value("sitemaps/urlsets")
            await self._read_urlset(entries, info, response.url)
        elif kind == "sitemapindex":
            self.stats.inc_value("sitemaps/indexes")
            await self._read_index(entries, info, response.url)
        else:
            self._dead(request, "invalid", f"{request.url[:200]} is not a sitemap")
        raise IgnoreRequest(f"sitemap {request.url[:200]} read")

    async def _read_index(self, entries, info: dict, base: str) -> None:
        hosts, depth = info["hosts"], info["depth"] + 1
        if depth > self.max_depth:
            left = await _count(islice(entries, self.max_urls))
            self._refused(hosts[0], "depth", left, f"sitemap index below SITEMAPS_MAX_DEPTH "
                          f"({self.max_depth}) levels: its {left} sitemaps are not read")
            return
        locs = (e.get("loc") for e in islice(entries, self.max_urls))
        await self._request_all(locs, hosts, depth, base)

    async def _read_urlset(self, entries, info: dict, base: str) -> None:
        hosts = info["hosts"]
        chunk: list[str] = []
        due: list[tuple[str, object]] = []   # (URL, lastmod) for the recrawl schedule
        read = other = bad = future = 0
        latest = utc_now() + self.lastmod_skew
        for entry in entries:
            if read >= self.max_urls:
                self._refused(hosts[0], "truncated", 1, f"a sitemap lists more than "
                              f"SITEMAPS_MAX_URLS ({self.max_urls}) URLs: the rest is not read")
                break
            read += 1
            if read % YIELD_EVERY == 0:
                await asyncio.sleep(0)   # a long sitemap does not hold the event loop
            url = check_loc(entry.get("loc"), base)
            if url is None:
                bad += 1
                continue
            if not self.other_hosts and site_host(url) not in hosts:
                other += 1
                continue
            seed = {"url": url, "dont_filter": False}
            lastmod = entry.get("lastmod")
            when = lastmod_datetime(lastmod)
            if when is not None and when > latest:
                # A date to come is no news of a change (and a hostile sitemap's
                # way to make every page due): ignored, not carried.
                future += 1
            elif when is not None:
                seed["meta"] = {LASTMOD_META: lastmod.strip()}
                if self.recrawl is not None:
                    due.append((url, when))
            chunk.append(json.dumps(seed, separators=(",", ":")))
            if len(chunk) >= PUSH_CHUNK:
                self.waiting = await self.store.push(chunk)
                self.stats.inc_value("sitemaps/urls", len(chunk))
                chunk = []
                due = await self._make_due(due)
        if chunk:
            self.waiting = await self.store.push(chunk)
            self.stats.inc_value("sitemaps/urls", len(chunk))
        await self._make_due(due)
        if future:
            self._refused(hosts[0], "lastmod_future", future, f"{future} lastmod(s) more than "
                          f"SITEMAPS_LASTMOD_SKEW ({self.lastmod_skew.total_seconds():.0f} s) "
                          f"ahead of now ignored")
        if bad:
            self.stats.inc_value("sitemaps/urls_invalid", bad)
        if other:
            self._refused(hosts[0], "other_host_urls", other, f"{other} URL(s) of another host "
                          f"in a sitemap of the site left out (SITEMAPS_OTHER_HOSTS is off)")

    async def _make_due(self, due: list) -> list:
        """Known pages of *due* whose ``lastmod`` is newer than their last fetch:
        due now (one read, one write); returns an empty batch. A MongoDB failure
        is said and counted (``sitemaps/errors``): the seeds are in Redis
        already, the pages keep their schedule."""
        if not due or self.recrawl is None:
            return []
        canonical = canonicalizer_for(self.crawler)
        pages = []
        for url, when in due:
            try:   # the URL the page record is kept under: the seed path's request's
                pages.append((canonical.canonical(Request(url)).url, when))
            except ValueError:
                continue
        try:
            made = await self.recrawl.make_due(pages)
        except (PyMongoError, Exception) as exc:   # a bug too: the rest of the sitemap is read
            self._error("making known pages due by their lastmod", exc, again=False)
        else:
            if made:
                self.stats.inc_value("sitemaps/lastmod_due", made)
        return []

    # -- the feeder: sitemap seeds into the seed key while the frontier has room -
    async def _feed_loop(self) -> None:
        while not self._closing:
            full = False
            try:
                full = await self.feed_once()
            except REDIS_FAILURES as exc:
                self._error("feeding sitemap seeds", exc)
            except Exception as exc:  # a bug: said, the crawl and the loop go on
                self._error("feeding sitemap seeds", exc)
            await asyncio.sleep(0.05 if full else FEED_INTERVAL)

    async def feed_once(self) -> bool:
        """One look: move what fits; True when a full batch moved (look again soon)."""
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        room = 0
        if getattr(scheduler, "control_state", "run") == "run":
            try:
                room = self.max_queued - len(scheduler)
            except TypeError:
                room = self.max_queued
        moved, self.waiting = await self.store.feed(min(FEED_BATCH, room), room)
        self.stats.set_value("sitemaps/waiting", self.waiting)
        if moved:
            self.stats.inc_value("sitemaps/fed", moved)
        return moved >= FEED_BATCH

    # -- saying it --------------------------------------------------------------
    def _refused(self, host: str, reason: str, count: int, message: str) -> None:
        self.stats.inc_value(f"sitemaps/refused/{reason}", count)
        if (host, reason) not in self._said and len(self._said) < MAX_SAID:
            self._said.add((host, reason))
            logger.warning("Sitemaps of %s: %s (said once per site)", host, message,
                           extra={"spider": self.crawler.spider})

    def _dead(self, request: Request, reason: str, message: str):
        """Refuse a whole sitemap: counted, said, dead-lettered with the reason."""
        self.stats.inc_value(f"sitemaps/refused/{reason}")
        self._refused(site_host(request.url), reason, 0, message)
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        if getattr(scheduler, "mark_failed", None) is not None:
            scheduler.mark_failed(request, message, kind="sitemap")
        raise IgnoreRequest(message)

    def _error(self, what: str, exc: BaseException, again: bool = True) -> None:
        self.stats.inc_value("sitemaps/errors")
        now = time.monotonic()
        if now - self._errors_said_at >= 60:
            self._errors_said_at = now
            logger.warning("Sitemap seeds: %s failed (%s: %s); %s", what,
                           type(exc).__name__, exc,
                           "trying again" if again else "the pages keep their schedule",
                           extra={"spider": self.crawler.spider})


async def _count(entries) -> int:
    """How many *entries* are left (an index parsed to its end, turning the
    event loop every ``YIELD_EVERY``)."""
    n = 0
    for _ in entries:
        n += 1
        if n % YIELD_EVERY == 0:
            await asyncio.sleep(0)
    return n


def site_hosts(request: Request) -> list[str]:
    """The hosts of the site whose robots.txt *request* fetched: its own and,
    after redirects, the host it was first asked of (``example.com`` →
    ``www.example.com``: both)."""
    urls = [*(request.meta.get("redirect_urls") or ())[:1], request.url]
    hosts: list[str] = []
    for url in urls:
        host = site_host(url) if isinstance(url, str) else ""
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def checked_info(raw, max_depth: int) -> dict | None:
    """The sitemap meta of a request read back from Redis, if well-formed."""
    if not isinstance(raw, dict):
        return None
    hosts, depth = raw.get("hosts"), raw.get("depth")
    if (not isinstance(hosts, list) or not 0 < len(hosts) <= MAX_HOSTS
            or not all(isinstance(h, str) and 0 < len(h) <= 253 for h in hosts)
            or isinstance(depth, bool) or not isinstance(depth, int)
            or not 0 <= depth <= max_depth):
        return None
    return {"hosts": hosts, "depth": depth}
