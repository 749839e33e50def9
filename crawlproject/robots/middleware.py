"""ClusterRobotsTxtMiddleware: one robots.txt fetch per site for the whole cluster.

A drop-in replacement for ``scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware``
(same settings: ``ROBOTSTXT_OBEY``, ``ROBOTSTXT_PARSER``, ``ROBOTSTXT_USER_AGENT``,
``meta["dont_obey_robotstxt"]``; same stats ``robotstxt/forbidden`` and
``robotstxt/response_status_count/<status>``, and the ``robots_parsed`` signal
on the node that fetched it). With
:class:`~crawlproject.scheduler.RedisScheduler`:

1. A request of a site whose robots.txt this node does not know reads the
   site's record in Redis (``{spider}:robots:<origin>``, one read per site and
   node, shared by the site's requests waiting at that moment).
2. No record: the first node to take the site's fetch lock (``SET NX``) puts
   the robots.txt request in the frontier, first in the site's queue
   (``priority`` 1000). It is leased, delayed and limited like any request of
   the site: it counts against the site's interval and concurrency, for every
   node, and a 429/503 to it slows the site down. The page goes back to the
   frontier for ``ROBOTSTXT_WAIT`` seconds (its slot is free meanwhile), and
   looks again then.
3. The node that downloads robots.txt stores the answer for every node, with
   an expiry (RFC 9309): 2xx — its rules, for ``ROBOTSTXT_CACHE_TTL`` (24 h);
   4xx — allow all, as long; 429 or 5xx (after the retry middleware's retries)
   — *unavailable*: the site's pages keep waiting in the frontier, and
   robots.txt is fetched again after ``ROBOTSTXT_UNAVAILABLE_TTL``; a page that
   waited ``ROBOTSTXT_MAX_WAIT`` seconds in all is dead-lettered with its
   reason (``crawlctl dead``, ``crawlctl replay``), never dropped. No answer
   at all (connection refused, DNS, timeouts): the site's pages are
   dead-lettered at once, with the reason, for as long.
4. Each node keeps the parsed rules until the record expires (at most
   ``ROBOTSTXT_LOCAL_SITES`` sites, least recently used first out).

The stored record is untrusted (:mod:`crawlproject.robots.record` decodes it
strictly); a malformed one is said once per site, counted
(``robotstxt/cluster/invalid_record``) and fetched again. The robots.txt
request carries ``meta["robotstxt_fetch"]``, honoured only on a ``/robots.txt``
URL, so a stored payload cannot use it to skip the rules of a page.

Enable it in place of Scrapy's::

    DOWNLOADER_MIDDLEWARES = {
        "scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware": None,
        "crawlproject.robots.ClusterRobotsTxtMiddleware": 100,
    }

With another scheduler it behaves as Scrapy's middleware.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict

from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler

from crawlproject.connection import redis_from_settings
from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.keys import RobotsKeys
from crawlproject.node import node_id
from crawlproject.robots.record import (ALLOW_ALL, MAX_BODY, RULES, UNAVAILABLE,
                                        RobotsRecord, decode_record, encode_record)

logger = logging.getLogger(__name__)

#: meta of the robots.txt request a node puts in the frontier
FETCH_META = "robotstxt_fetch"
#: meta of a page that went back to the frontier to wait for its site's robots.txt
WAITS_META = "robotstxt_waits"


class _Known:
    """What a node knows of one site's robots.txt until *expires*."""

    __slots__ = ("state", "parser", "expires", "status", "reason")

    def __init__(self, state: str, parser, expires: float, status: int = 200, reason: str = ""):
        self.state, self.parser, self.expires = state, parser, expires
        self.status, self.reason = status, reason


def origin_of(request: Request) -> str:
    """``scheme://host[:port]`` of *request*: robots.txt applies per origin."""
    url = urlparse_cached(request)
    return f"{url.scheme}://{url.netloc}".lower()


def is_robots_url(request: Request) -> bool:
    url = urlparse_cached(request)
    return url.path == "/robots.txt" and not url.query and url.scheme in ("http", "https")


class ClusterRobotsTxtMiddleware(RobotsTxtMiddleware):
    """robots.txt fetched once per site for the cluster (see the module docstring)."""

    def __init__(self, crawler):
        super().__init__(crawler)   # NotConfigured unless ROBOTSTXT_OBEY
        s = crawler.settings
        self.cache_ttl = max(1.0, setting(s, "ROBOTSTXT_CACHE_TTL"))
        self.unavailable_ttl = max(1.0, setting(s, "ROBOTSTXT_UNAVAILABLE_TTL"))
        self.wait = max(0.05, setting(s, "ROBOTSTXT_WAIT"))
        self.max_wait = max(self.wait, setting(s, "ROBOTSTXT_MAX_WAIT"))
        self.lock_ttl = max(1.0, setting(s, "ROBOTSTXT_FETCH_LOCK_TTL"))
        self.local_sites = max(1, setting(s, "ROBOTSTXT_LOCAL_SITES"))
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._reading: dict[str, asyncio.Future] = {}
        self._warned: set[str] = set()
        self._redis = None
        self._keys: RobotsKeys | None = None
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    # -- which mode ------------------------------------------------------------

    def _scheduler(self):
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        return scheduler if getattr(scheduler, "mark_failed", None) is not None else None

    def _client(self):
        if self._redis is None:
            self._redis = redis_from_settings(self.crawler.settings, asyncio=True)
            self._keys = RobotsKeys(self.crawler.spider.name)
        return self._redis

    async def _closed(self, spider=None) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    # -- requests --------------------------------------------------------------

    async def process_request(self, request: Request, spider=None):
        if request.meta.get(FETCH_META) and is_robots_url(request):
            return None                     # the fetch itself
        if request.meta.get("dont_obey_robotstxt"):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        if self._scheduler() is None:       # not the shared frontier: Scrapy's way
            return await super().process_request(request)
        known = await self._site(origin_of(request))
        if known is not None and known.state == UNAVAILABLE and known.status == 0:
            return self._unreachable(request, known)
        if known is None or known.state == UNAVAILABLE:
            return self._wait(request)
        self.process_request_2(known.parser, request)   # IgnoreRequest if forbidden
        return None

    async def _site(self, origin: str) -> _Known | None:
        known = self._known.get(origin)
        if known is not None and known.expires > time.time():
            self._known.move_to_end(origin)
            return known
        self._known.pop(origin, None)
        # One read per site at a time: its other requests wait for the same one.
        reading = self._reading.get(origin)
        if reading is None:
            reading = self._reading[origin] = asyncio.ensure_future(self._read(origin))
            reading.add_done_callback(lambda _f: self._reading.pop(origin, None))
        return await asyncio.shield(reading)

    async def _read(self, origin: str) -> _Known | None:
        client = self._client()
        raw = await client.get(self._keys.record(origin))
        record = self._decode(origin, raw) if raw is not None else None
        if record is None:
            await self._ask_for_fetch(origin)
            return None
        return self._remember(origin, record)

    def _decode(self, origin: str, raw) -> RobotsRecord | None:
        try:
            return decode_record(raw)
        except ValueError as exc:
            self.crawler.stats.inc_value("robotstxt/cluster/invalid_record")
            if origin not in self._warned:
                self._warned.add(origin)
                logger.warning("Ignoring the stored robots.txt of %s (%s): fetching it again",
                               origin, exc, extra={"spider": self.crawler.spider})
            return None

    def _remember(self, origin: str, record: RobotsRecord) -> _Known:
        parser = None
        if record.state == RULES:
            parser = build_from_crawler(self._parserimpl, self.crawler,
                                        record.body.encode("utf-8"))
        known = _Known(record.state, parser, min(record.expires, time.time() + self.cache_ttl),
                       record.status, record.body[:300] if record.status == 0 else "")
        self._known[origin] = known
        while len(self._known) > self.local_sites:
            self._known.popitem(last=False)
        self.crawler.stats.inc_value(f"robotstxt/cluster/loaded/{record.state}")
        return known

    async def _ask_for_fetch(self, origin: str) -> None:
        """Put *origin*'s robots.txt request in the frontier, unless another
        node did (the lock expires, so a node killed meanwhile holds no site)."""
        client = self._client()
        won = await client.set(self._keys.fetch_lock(origin), node_id(self.crawler),
                               nx=True, px=int(self.lock_ttl * 1000))
        if not won:
            return
        fetch = Request(f"{origin}/robots.txt", priority=self.DOWNLOAD_PRIORITY,
                        dont_filter=True, meta={FETCH_META: True})
        self.crawler.engine.crawl(fetch)
        self.crawler.stats.inc_value("robotstxt/request_count")
        logger.debug("Asked the frontier for %s/robots.txt", origin,
                     extra={"spider": self.crawler.spider})

    def _unreachable(self, request: Request, known: _Known):
        """The site did not answer at all (connection refused, DNS, timeouts,
        after the retry middleware's retries): its pages would only hammer a
        dead host. Dead-lettered at once with the reason (``crawlctl replay``
        sends them again), never dropped."""
        self.crawler.stats.inc_value("robotstxt/cluster/unreachable_pages")
        self._scheduler().mark_failed(
            request, f"robots.txt of {origin_of(request)} unreachable: {known.reason}",
            kind="download")
        raise IgnoreRequest("robots.txt unreachable")

    def _wait(self, request: Request) -> Request:
        """*request* back to the frontier for ``ROBOTSTXT_WAIT`` seconds (or
        dead-lettered once it waited ``ROBOTSTXT_MAX_WAIT`` in all)."""
        waits = int(request.meta.get(WAITS_META, 0) or 0)
        if (waits + 1) * self.wait > self.max_wait:
            self.crawler.stats.inc_value("robotstxt/cluster/gave_up")
            self._scheduler().mark_failed(
                request, f"robots.txt of {origin_of(request)} not available after "
                f"{waits * self.wait:.0f} s", kind="download")
            raise IgnoreRequest("robots.txt not available")
        self.crawler.stats.inc_value("robotstxt/cluster/waits")
        again = request.replace(dont_filter=True)
        again.meta[WAITS_META] = waits + 1
        again.meta[RETRY_DELAY_META] = self.wait
        return again

    # -- the fetch's answer --------------------------------------------------------

    async def process_response(self, request: Request, response, spider=None):
        if not (request.meta.get(FETCH_META) and is_robots_url(request)):
            return response
        status = response.status
        self.crawler.stats.inc_value("robotstxt/response_count")
        self.crawler.stats.inc_value(f"robotstxt/response_status_count/{status}")
        body = response.body[:MAX_BODY].decode("utf-8", "replace") if 200 <= status < 300 else ""
        known = await self._store(origin_of(request), status, body)
        if known.state == RULES:
            await self.crawler.signals.send_catch_log_async(
                signal=signals.robots_parsed, robotparser=known.parser, request=request)
        raise IgnoreRequest(f"robots.txt ({status}) stored for the cluster")

    async def process_exception(self, request: Request, exception, spider=None):
        if request.meta.get(FETCH_META) and is_robots_url(request):
            # The retry middleware gave up: unavailable for now, and the
            # exception goes on (the request is dead-lettered with it).
            self.crawler.stats.inc_value(
                f"robotstxt/exception_count/{type(exception).__name__}")
            await self._store(origin_of(request), 0,
                              f"{type(exception).__name__}: {exception}"[:300])
        return None

    async def _store(self, origin: str, status: int, body: str) -> _Known:
        now = time.time()
        record = RobotsRecord(status, body, now, 0.0)
        ttl = self.cache_ttl if record.state != UNAVAILABLE else self.unavailable_ttl
        record = RobotsRecord(status, body, now, now + ttl)
        client = self._client()
        pipe = client.pipeline(transaction=False)
        pipe.set(self._keys.record(origin), encode_record(record), px=int(ttl * 1000))
        pipe.delete(self._keys.fetch_lock(origin))
        pipe.hset(self._keys.index, origin.split("://", 1)[1].rsplit(":", 1)[0]
                  if not origin.endswith("]") else origin.split("://", 1)[1],
                  json.dumps({"origin": origin, "status": status, "fetched": record.fetched,
                              "expires": record.expires}))
        await pipe.execute()
        self.crawler.stats.inc_value(f"robotstxt/cluster/stored/{record.state}")
        if record.state == UNAVAILABLE:
            logger.warning("robots.txt of %s is unavailable (%s): its pages wait, and it is "
                           "fetched again in %.0f s", origin, status or "unreachable", ttl,
                           extra={"spider": self.crawler.spider})
        return self._remember(origin, record)


__all__ = ["ClusterRobotsTxtMiddleware", "FETCH_META", "WAITS_META", "ALLOW_ALL"]
