"""ClusterRobotsTxtMiddleware: one robots.txt fetch per site for the whole cluster.

A drop-in replacement for ``scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware``
(same settings: ``ROBOTSTXT_OBEY``, ``ROBOTSTXT_PARSER``, ``ROBOTSTXT_USER_AGENT``,
``meta["dont_obey_robotstxt"]``; same stats ``robotstxt/forbidden`` and
``robotstxt/response_status_count/<status>``, and the ``robots_parsed`` signal
on the node that fetched it). With
:class:`~crawlproject.scheduler.RedisScheduler` and ``FRONTIER_SECRET``:

1. A request of a site whose robots.txt this node does not know reads the
   site's record in Redis (``{spider}:robots:<origin>``, one read per site and
   node, shared by the site's requests waiting at that moment).
2. No record: the first node to take the site's fetch lock puts the
   robots.txt request in the frontier, first in the site's queue
   (``priority`` 1000). It is leased, delayed and limited like any request of
   the site: it counts against the site's interval and concurrency, for every
   node, and a 429/503 to it slows the site down. The page goes back to the
   frontier for ``ROBOTSTXT_WAIT`` seconds (its slot is free meanwhile), and
   looks again then. A lock expires after ``ROBOTSTXT_FETCH_LOCK_TTL`` (a node
   killed meanwhile holds no site); one with no expiry or a longer one was not
   written by a node and is taken over (``robotstxt/cluster/stale_lock``).
3. The node that downloads robots.txt stores the answer for every node, signed
   and with an expiry (RFC 9309): 2xx — its rules (the first 500 KiB), for
   ``ROBOTSTXT_CACHE_TTL`` (24 h); 4xx — allow all, as long; 429 or 5xx (after
   the retry middleware's retries) — *unavailable*: the site's pages keep
   waiting in the frontier, and robots.txt is fetched again after
   ``ROBOTSTXT_UNAVAILABLE_TTL``; a page that waited ``ROBOTSTXT_MAX_WAIT``
   seconds in all is dead-lettered with its reason (``crawlctl dead``,
   ``crawlctl replay``), never dropped. No answer at all (connection refused,
   DNS, timeouts): the site's pages are dead-lettered at once, with the reason,
   for as long.
4. Each node keeps the parsed rules until the record expires (at most
   ``ROBOTSTXT_LOCAL_SITES`` sites, least recently used first out).

The stored record is untrusted (:mod:`crawlproject.robots.record` reads it):
one that no node of this crawl signed for this very site (unsigned, another
secret or spider, altered, moved from another site's key) or whose expiry has
passed is treated as absent — said once per site, counted
(``robotstxt/cluster/unproven_record``), fetched again and written over;
so is a malformed one (``robotstxt/cluster/invalid_record``), and a key of
the wrong type (an ERROR naming it, at most one a minute:
``robotstxt/cluster/bad_key``; a wrong-type index is skipped). The robots.txt
request carries ``meta["robotstxt_fetch"]``, honoured only on a
``/robots.txt`` URL, so a stored payload cannot use it to skip the rules of a
page.

Without ``FRONTIER_SECRET`` no record can be proven, so none is read or
written: each node fetches each site's robots.txt itself, outside the
frontier (and the site's limits) as Scrapy's middleware does, once per site
and expiry, and keeps the rules in memory; the rest is as above. A WARNING
at start says so (``robotstxt/per_node``).

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

from redis.exceptions import ResponseError
from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler

from crawlproject.connection import redis_from_settings
from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import ROBOTS_FETCH_LOCK
from crawlproject.keys import RobotsKeys
from crawlproject.node import node_id
from crawlproject.robots.record import (ALLOW_ALL, MAX_BODY, MAX_RECORD, RULES, UNAVAILABLE,
                                        RobotsRecord, UnprovenRecord, decode_record,
                                        encode_record)
from crawlproject.signing import signer_from_settings

logger = logging.getLogger(__name__)

#: meta of the robots.txt request a node puts in the frontier
FETCH_META = "robotstxt_fetch"
#: meta of a page that went back to the frontier to wait for its site's robots.txt
WAITS_META = "robotstxt_waits"
#: seconds between two ERRORs about Redis keys of the wrong type
BAD_KEY_LOG_INTERVAL = 60.0


class _Known:
    """What a node knows of one site's robots.txt until *expires*."""

    __slots__ = ("state", "parser", "expires", "status", "reason")

    def __init__(self, state: str, parser, expires: float, status: int = 200, reason: str = ""):
        self.state, self.parser, self.expires = state, parser, expires
        self.status, self.reason = status, reason


def origin_of(request: Request) -> str:
    """``scheme://host[:port]`` of *request*: robots.txt applies per origin."""
    from crawlproject.urls import origin   # one canonical host: no credentials, no :80

    return origin(request.url)


def is_robots_url(request: Request) -> bool:
    url = urlparse_cached(request)
    return url.path == "/robots.txt" and not url.query and url.scheme in ("http", "https")


def _wrong_type(exc: ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")


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
        #: None without FRONTIER_SECRET: nothing in Redis is trusted, each node fetches
        self.signer = signer_from_settings(s, crawler.spider.name)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._reading: dict[str, asyncio.Future] = {}
        self._warned: set[str] = set()
        self._bad_key_said: float | None = None   # monotonic time of the last ERROR
        self._bad_keys_unsaid = 0
        self._redis = None
        self._keys: RobotsKeys | None = None
        self._take_lock = None
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    # -- which mode ------------------------------------------------------------

    def _scheduler(self):
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        return scheduler if getattr(scheduler, "mark_failed", None) is not None else None

    def _client(self):
        if self._redis is None:
            self._redis = redis_from_settings(self.crawler.settings, asyncio=True)
            self._keys = RobotsKeys(self.crawler.spider.name)
            self._take_lock = script(self._redis, ROBOTS_FETCH_LOCK)
        return self._redis

    def _opened(self, spider=None) -> None:
        if self.signer is None and self._scheduler() is not None:
            self.crawler.stats.set_value("robotstxt/per_node", 1)
            logger.warning("FRONTIER_SECRET is not set: robots.txt records in Redis cannot be "
                           "proven; each node fetches robots.txt itself, outside the sites' "
                           "limits, and keeps it in memory", extra={"spider": self.crawler.spider})

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
        if self.signer is None:     # nothing stored can be proven: fetched here
            return await self._fetch_here(origin)
        client = self._client()
        key = self._keys.record(origin)
        try:
            # GETRANGE: a huge value is never read whole (refused for its length)
            raw = await client.getrange(key, 0, MAX_RECORD)
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            await self._bad_key(key, "a string", "ignored, the site's robots.txt is fetched "
                                "again and stored over it")
            raw = b""
        record = self._decode(origin, raw) if raw else None
        if record is None:
            await self._ask_for_fetch(origin)
            return None
        return self._remember(origin, record)

    def _decode(self, origin: str, raw) -> RobotsRecord | None:
        try:
            record = decode_record(raw, self.signer, origin)
        except UnprovenRecord as exc:
            return self._refused(origin, "unproven_record", str(exc))
        except ValueError as exc:
            return self._refused(origin, "invalid_record", str(exc))
        if record.expires <= time.time():   # a node's record is gone by then: replayed
            return self._refused(origin, "unproven_record", "its expiry has passed: stored "
                                 "again, or this node's clock is ahead")
        return record

    def _refused(self, origin: str, stat: str, why: str) -> None:
        self.crawler.stats.inc_value(f"robotstxt/cluster/{stat}")
        if origin not in self._warned:
            if len(self._warned) >= self.local_sites:
                self._warned.clear()
            self._warned.add(origin)
            logger.warning("Ignoring the stored robots.txt of %s (%s): fetching it again",
                           origin, why, extra={"spider": self.crawler.spider})

    async def _bad_key(self, key: str, expected: str, then: str) -> None:
        """Say that *key* holds another type than *expected*, at most once a
        minute (whoever wrote it may write many)."""
        self.crawler.stats.inc_value("robotstxt/cluster/bad_key")
        now = time.monotonic()
        if self._bad_key_said is not None and now - self._bad_key_said < BAD_KEY_LOG_INTERVAL:
            self._bad_keys_unsaid += 1
            return
        self._bad_key_said, unsaid, self._bad_keys_unsaid = now, self._bad_keys_unsaid, 0
        try:
            kind = await self._client().type(key)
            kind = kind.decode() if isinstance(kind, bytes) else kind
        except Exception:   # noqa: BLE001 - only for the message
            kind = "key of another type"
        logger.error("Redis key %s is a %s, not %s: %s (%d more key(s) of the wrong type "
                     "since the last such message)", key, kind, expected, then, unsaid,
                     extra={"spider": self.crawler.spider})

    def _remember(self, origin: str, record: RobotsRecord) -> _Known:
        parser = None
        if record.state == RULES:
            parser = build_from_crawler(self._parserimpl, self.crawler, record.body)
        reason = record.body[:300].decode("utf-8", "replace") if record.status == 0 else ""
        known = _Known(record.state, parser, min(record.expires, time.time() + self.cache_ttl),
                       record.status, reason)
        self._known[origin] = known
        while len(self._known) > self.local_sites:
            self._known.popitem(last=False)
        self.crawler.stats.inc_value(f"robotstxt/cluster/loaded/{record.state}")
        return known

    async def _ask_for_fetch(self, origin: str) -> None:
        """Put *origin*'s robots.txt request in the frontier, unless another
        node holds its fetch lock (ROBOTS_FETCH_LOCK: free or stale locks only)."""
        self._client()
        taken = await self._take_lock(keys=[self._keys.fetch_lock(origin)],
                                      args=[node_id(self.crawler), int(self.lock_ttl * 1000)])
        if not taken:
            return
        if taken == 2:
            self.crawler.stats.inc_value("robotstxt/cluster/stale_lock")
            logger.warning("The robots.txt fetch lock of %s had no expiry, or a longer one than "
                           "ROBOTSTXT_FETCH_LOCK_TTL (%.0f s): not a node's, taken over",
                           origin, self.lock_ttl, extra={"spider": self.crawler.spider})
        fetch = Request(f"{origin}/robots.txt", priority=self.DOWNLOAD_PRIORITY,
                        dont_filter=True, meta={FETCH_META: True})
        self.crawler.engine.crawl(fetch)
        self.crawler.stats.inc_value("robotstxt/request_count")
        logger.debug("Asked the frontier for %s/robots.txt", origin,
                     extra={"spider": self.crawler.spider})

    async def _fetch_here(self, origin: str) -> _Known:
        """Download *origin*'s robots.txt from this node, outside the frontier,
        as Scrapy's middleware does (no record can be proven without a secret)."""
        fetch = Request(f"{origin}/robots.txt", priority=self.DOWNLOAD_PRIORITY,
                        meta={"dont_obey_robotstxt": True}, callback=NO_CALLBACK)
        self.crawler.stats.inc_value("robotstxt/request_count")
        try:
            response = await self.crawler.engine.download_async(fetch)
        except Exception as exc:  # noqa: BLE001 - any failure: unreachable, said and stored
            return await self._failed(origin, exc)
        return await self._answered(origin, fetch, response)

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
        await self._answered(origin_of(request), request, response)
        raise IgnoreRequest(f"robots.txt ({response.status}) stored for the cluster")

    async def process_exception(self, request: Request, exception, spider=None):
        if request.meta.get(FETCH_META) and is_robots_url(request):
            # The retry middleware gave up: unavailable for now, and the
            # exception goes on (the request is dead-lettered with it).
            await self._failed(origin_of(request), exception)
        return None

    async def _answered(self, origin: str, request: Request, response) -> _Known:
        status = response.status
        self.crawler.stats.inc_value("robotstxt/response_count")
        self.crawler.stats.inc_value(f"robotstxt/response_status_count/{status}")
        # The first MAX_BODY bytes are parsed and stored (RFC 9309 2.5), never more.
        body = response.body[:MAX_BODY] if 200 <= status < 300 else b""
        known = await self._store(origin, status, body)
        if known.state == RULES:
            await self.crawler.signals.send_catch_log_async(
                signal=signals.robots_parsed, robotparser=known.parser, request=request)
        return known

    async def _failed(self, origin: str, exception) -> _Known:
        self.crawler.stats.inc_value(f"robotstxt/exception_count/{type(exception).__name__}")
        reason = f"{type(exception).__name__}: {exception}"[:300]
        return await self._store(origin, 0, reason.encode("utf-8"))

    async def _store(self, origin: str, status: int, body: bytes) -> _Known:
        now = time.time()
        unavailable = RobotsRecord(status, b"", now, now).state == UNAVAILABLE
        ttl = self.unavailable_ttl if unavailable else self.cache_ttl
        record = RobotsRecord(status, body, now, now + ttl, origin)
        if self.signer is not None:
            await self._share(record, ttl)
        if unavailable:
            logger.warning("robots.txt of %s is unavailable (%s): its pages wait, and it is "
                           "fetched again in %.0f s", origin, status or "unreachable", ttl,
                           extra={"spider": self.crawler.spider})
        return self._remember(origin, record)

    async def _share(self, record: RobotsRecord, ttl: float) -> None:
        """*record* for every node (SET replaces a key of any type), the
        site's fetch lock released, the index for ``crawlctl politeness``."""
        origin = record.origin
        host = (origin.split("://", 1)[1].rsplit(":", 1)[0] if not origin.endswith("]")
                else origin.split("://", 1)[1])
        pipe = self._client().pipeline(transaction=False)
        pipe.set(self._keys.record(origin), encode_record(record, self.signer),
                 px=int(ttl * 1000))
        pipe.delete(self._keys.fetch_lock(origin))
        pipe.hset(self._keys.index, host,
                  json.dumps({"origin": origin, "status": record.status,
                              "fetched": record.fetched, "expires": record.expires}))
        stored, released, indexed = await pipe.execute(raise_on_error=False)
        for result in (stored, released):
            if isinstance(result, Exception):
                raise result
        if isinstance(indexed, Exception):
            if not (isinstance(indexed, ResponseError) and _wrong_type(indexed)):
                raise indexed
            await self._bad_key(self._keys.index, "a hash", "skipped, crawlctl politeness "
                                "shows no robots.txt state until it is deleted")
        self.crawler.stats.inc_value(f"robotstxt/cluster/stored/{record.state}")


__all__ = ["ClusterRobotsTxtMiddleware", "FETCH_META", "WAITS_META", "ALLOW_ALL"]
