"""ClusterRobotsTxtMiddleware: one robots.txt fetch per site for the whole cluster.

A drop-in replacement for ``scrapy.downloadermiddlewares.robotstxt.RobotsTxtMiddleware``
(same settings, stats and ``robots_parsed`` signal). With
:class:`~crawlproject.scheduler.RedisScheduler` and ``FRONTIER_SECRET`` the first
node that needs a site's robots.txt fetches it through the frontier (under the
site's own limits) and stores the rules, signed, for every node
(``{spider}:robots:<origin>``; :mod:`.record`, :mod:`.rules`); the site's pages
wait for them, and are dead-lettered after ``ROBOTSTXT_MAX_WAIT``. Without
``FRONTIER_SECRET`` each node fetches each site's robots.txt itself; with another
scheduler it behaves as Scrapy's middleware.

How it works (redirects, failures and expiry, the untrusted record) and how to
enable it: ``docs/middlewares.md``, "robots.txt for the cluster
(crawlproject/robots/middleware.py)".
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections import OrderedDict

from scrapy import Request, signals
from scrapy.downloadermiddlewares.robotstxt import RobotsTxtMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler

from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.node import node_id
from crawlproject.robots.body import Bodies
from crawlproject.robots.hops import HOP_META, GiveUp, hop_value, next_hop, read_hop
from crawlproject.robots.record import (ALLOW_ALL, MAX_BODY, RULES, UNAVAILABLE, RobotsRecord,
                                        state_of)
from crawlproject.robots.rules import normalise
from crawlproject.robots.store import RobotsStore
from crawlproject.signing import signer_from_settings

logger = logging.getLogger(__name__)

#: meta of the robots.txt request a node puts in the frontier
FETCH_META = "robotstxt_fetch"
#: meta of a page that went back to the frontier to wait for its site's
#: robots.txt: how many times it looked, and since when it waits (epoch s)
WAITS_META = "robotstxt_waits"
SINCE_META = "robotstxt_since"
#: meta of a robots.txt download a node makes itself (no FRONTIER_SECRET)
HERE_META = "_robotstxt_here"
#: longest look interval of a waiting page (seconds)
MAX_LOOK = 10.0
#: a record whose time is up (its fetch is on the way) is read again this often
STALE_RECHECK = 2.0
#: seconds a node waits for the frontier to have a site's Crawl-delay before it
#: shares the site's rules (Redis away: not longer)
CRAWL_DELAY_FLUSH_WAIT = 5.0


def _crawl_delay(parser, agent: str) -> float | None:
    try:
        return parser.crawl_delay(agent)
    except Exception:  # noqa: BLE001 - a parser that cannot tell: none
        return None


class _Known:
    """What a node knows of one site's robots.txt until *expires* (when it
    reads it again): its *record*, the *parser* of its rules, and whether
    they may be used now (*usable*; else the site's pages wait)."""

    __slots__ = ("record", "parser", "expires", "usable")

    def __init__(self, record: RobotsRecord, parser, expires: float, usable: bool):
        self.record, self.parser, self.expires, self.usable = record, parser, expires, usable

    @property
    def state(self) -> str:
        return self.record.state


def origin_of(request: Request) -> str:
    """``scheme://host[:port]`` of *request*: robots.txt applies per origin."""
    from crawlproject.urls import origin   # one canonical host: no credentials, no :80

    return origin(request.url)


def is_robots_url(request: Request) -> bool:
    url = urlparse_cached(request)
    return url.path == "/robots.txt" and not url.query and url.scheme in ("http", "https")


def _since(value, now: float) -> float:
    """When a page first waited, from its meta (a node's clock may be behind
    another's: never in the future)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return now
    return min(float(value), now)


class ClusterRobotsTxtMiddleware(RobotsTxtMiddleware):
    """robots.txt fetched once per site for the cluster (see docs/middlewares.md)."""

    def __init__(self, crawler):
        super().__init__(crawler)   # NotConfigured unless ROBOTSTXT_OBEY
        s = crawler.settings
        self.cache_ttl = max(1.0, setting(s, "ROBOTSTXT_CACHE_TTL"))
        self.max_age = max(self.cache_ttl, setting(s, "ROBOTSTXT_CACHE_MAX_AGE"))
        self.unavailable_ttl = max(0.1, setting(s, "ROBOTSTXT_UNAVAILABLE_TTL"))
        self.unavailable_max = max(self.unavailable_ttl,
                                   setting(s, "ROBOTSTXT_UNAVAILABLE_MAX_TTL"))
        self.wait = max(0.05, setting(s, "ROBOTSTXT_WAIT"))
        self.max_wait = max(self.wait, setting(s, "ROBOTSTXT_MAX_WAIT"))
        self.lock_ttl = max(1.0, setting(s, "ROBOTSTXT_FETCH_LOCK_TTL"))
        self.local_sites = max(1, setting(s, "ROBOTSTXT_LOCAL_SITES"))
        self.max_rules = max(1, setting(s, "ROBOTSTXT_MAX_RULES"))
        self.max_redirects = max(5, setting(s, "ROBOTSTXT_MAX_REDIRECTS"))   # RFC: at least 5
        #: whose groups a record keeps (and the scheduler's Crawl-delay reads);
        #: pages are checked as this agent too, whatever User-Agent header a
        #: page is sent with (a rotated identity is not another crawler)
        self.agent = self._robotstxt_useragent or self._default_useragent or "*"
        self._robotstxt_useragent = self.agent
        #: None without FRONTIER_SECRET: nothing in Redis is trusted, each node fetches
        self.signer = signer_from_settings(s, crawler.spider.name)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._reading: dict[str, asyncio.Future] = {}
        self._warned: set[str] = set()
        self._records = (RobotsStore(s, crawler.spider, self.signer, crawler.stats,
                                   self.local_sites) if self.signer is not None else None)
        self._downloads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._bodies = Bodies(crawler, self._is_download)   # at most 500 KiB of each
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    # -- which mode ------------------------------------------------------------

    def _scheduler(self):
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        return scheduler if getattr(scheduler, "mark_failed", None) is not None else None

    def _opened(self, spider=None) -> None:
        if self.signer is None and self._scheduler() is not None:
            self.crawler.stats.set_value("robotstxt/per_node", 1)
            logger.warning("FRONTIER_SECRET is not set: robots.txt records in Redis cannot be "
                           "proven; each node fetches robots.txt itself, outside the sites' "
                           "limits, and keeps it in memory", extra={"spider": self.crawler.spider})

    async def _closed(self, spider=None) -> None:
        if self._records is not None:
            await self._records.close()

    # -- the body of a robots.txt download -------------------------------------

    def _is_download(self, request: Request) -> bool:
        """Whether *request* downloads a robots.txt for this middleware (not a
        page whose stored meta claims so): asked once per request."""
        if not (request.meta.get(FETCH_META) or request.meta.get(HERE_META)):
            return False         # a page: nothing remembered for it
        known = self._downloads.get(request)
        if known is None:
            known = self._downloads[request] = bool(request.meta.get(HERE_META)
                                                    or self._fetch_of(request) is not None)
        return known

    # -- requests --------------------------------------------------------------

    async def process_request(self, request: Request, spider=None):
        if self._fetch_of(request) is not None:
            return None                     # the fetch itself, or one of its redirects
        if request.meta.get("dont_obey_robotstxt"):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        if self._scheduler() is None:       # not the shared frontier: Scrapy's way
            return await super().process_request(request)
        origin = origin_of(request)
        if self._waited_enough(request):
            # Its last look: what is known now decides, no new fetch is asked for.
            known = await self._last_look(origin)
        else:
            known = await self._site(origin)
        if known is None or not known.usable:
            return self._wait(request, known)
        self.process_request_2(known.parser, request)   # IgnoreRequest if forbidden
        return None

    async def _site(self, origin: str) -> _Known | None:
        known = self._known.get(origin)
        if known is not None and known.expires > time.time():
            self._known.move_to_end(origin)
            return known
        # (An expired one stays until replaced: its failures and rules are what
        # a failed fetch builds on without FRONTIER_SECRET.)
        # One read per site at a time: its other requests wait for the same one.
        reading = self._reading.get(origin)
        if reading is None:
            reading = self._reading[origin] = asyncio.ensure_future(self._read(origin))
            reading.add_done_callback(lambda _f: self._reading.pop(origin, None))
        return await asyncio.shield(reading)

    def _waited_enough(self, request: Request) -> bool:
        since = request.meta.get(SINCE_META)
        return since is not None and time.time() - _since(since, time.time()) >= self.max_wait

    async def _last_look(self, origin: str) -> _Known | None:
        known = self._known.get(origin)
        if known is not None and known.expires > time.time():
            return known
        if self.signer is None:
            return known
        record = await self._stored(origin)
        return self._remember(origin, record) if record is not None else known

    async def _read(self, origin: str) -> _Known | None:
        if self.signer is None:     # nothing stored can be proven: fetched here
            return await self._fetch_here(origin)
        record = await self._stored(origin)
        if record is None or record.expires <= time.time():
            # its time is up: fetched again, unless a fetch stored it meanwhile
            record = await self._ask_for_fetch(origin) or record
        return self._remember(origin, record) if record is not None else None

    async def _stored(self, origin: str) -> RobotsRecord | None:
        """The proven record of *origin* in Redis, or None."""
        return await self._records.read(origin, time.time())

    def _once(self, what: str) -> bool:
        """Whether *what* (a site, a site and a reason) is said for the first time."""
        if what in self._warned:
            return False
        if len(self._warned) >= self.local_sites:
            self._warned.clear()
        self._warned.add(what)
        return True

    def _remember(self, origin: str, record: RobotsRecord, parser=None) -> _Known:
        now = time.time()
        if record.state == RULES and parser is None:
            parser = build_from_crawler(self._parserimpl, self.crawler, record.body)
        # Rules (or "allow all") while fresh, and while the site cannot be
        # reached, up to ROBOTSTXT_CACHE_MAX_AGE after they were read.
        usable = record.state != UNAVAILABLE and (record.expires > now
                                                  or now < record.fetched + self.max_age)
        # Read again when due; one whose time is up (its fetch on the way) soon.
        expires = (min(record.expires, now + self.cache_ttl) if record.expires > now
                   else now + STALE_RECHECK)
        known = _Known(record, parser, expires, usable)
        self._known[origin] = known
        while len(self._known) > self.local_sites:
            self._known.popitem(last=False)
        self.crawler.stats.inc_value(f"robotstxt/cluster/loaded/{record.state}")
        if usable and record.failures:
            self.crawler.stats.inc_value("robotstxt/cluster/cached_rules")
        return known

    async def _ask_for_fetch(self, origin: str) -> RobotsRecord | None:
        """Put *origin*'s robots.txt request in the frontier, unless another
        node holds its fetch lock (ROBOTS_FETCH_LOCK: free or stale locks only),
        or a fetch stored a fresh record since it was read (returned)."""
        taken = await self._records.take_lock(origin, node_id(self.crawler), self.lock_ttl)
        if not taken:
            return None
        # A fetch that ended between our read and the lock (its record is
        # stored before its lock is released): no second fetch.
        fresh = await self._records.read(origin, time.time(), quiet=True)
        if fresh is not None and fresh.expires > time.time():
            await self._records.release_lock(origin)
            self.crawler.stats.inc_value("robotstxt/cluster/fetched_meanwhile")
            return fresh
        if taken == 2:
            self.crawler.stats.inc_value("robotstxt/cluster/stale_lock")
            logger.warning("The robots.txt fetch lock of %s had no expiry, or a longer one than "
                           "ROBOTSTXT_FETCH_LOCK_TTL (%.0f s): not a node's, taken over",
                           origin, self.lock_ttl, extra={"spider": self.crawler.spider})
        fetch = Request(f"{origin}/robots.txt", priority=self.DOWNLOAD_PRIORITY,
                        dont_filter=True, meta={FETCH_META: True, "dont_redirect": True})
        self.crawler.engine.crawl(fetch)
        self.crawler.stats.inc_value("robotstxt/request_count")
        logger.debug("Asked the frontier for %s/robots.txt", origin,
                     extra={"spider": self.crawler.spider})
        return None

    async def _fetch_here(self, origin: str) -> _Known:
        """Download *origin*'s robots.txt from this node, outside the frontier,
        as Scrapy's middleware does (no record can be proven without a secret),
        following its redirects."""
        chain = [f"{origin}/robots.txt"]
        while True:
            fetch = Request(chain[-1], priority=self.DOWNLOAD_PRIORITY, callback=NO_CALLBACK,
                            meta={"dont_obey_robotstxt": True, HERE_META: True,
                                  "dont_redirect": True})
            self.crawler.stats.inc_value("robotstxt/request_count")
            try:
                response = await self.crawler.engine.download_async(fetch)
            except Exception as exc:  # noqa: BLE001 - any failure: unreachable, said and stored
                return await self._failed(origin, exc)
            hop = self._next_hop(origin, chain, response)
            if not isinstance(hop, Request):
                return await self._answered(origin, fetch, response, hop)
            chain.append(hop.url)

    def _wait(self, request: Request, known: _Known | None) -> Request:
        """*request* back to the frontier until its site's robots.txt is known
        (looks ``ROBOTSTXT_WAIT`` apart, from the fifth twice as long each time), or
        dead-lettered once it waited ``ROBOTSTXT_MAX_WAIT`` seconds since it
        first waited."""
        now = time.time()
        since = _since(request.meta.get(SINCE_META), now)
        waited = now - since
        origin = origin_of(request)
        if waited >= self.max_wait:
            self.crawler.stats.inc_value("robotstxt/cluster/gave_up")
            why = "not fetched yet"
            if known is not None:
                record = known.record
                why = record.reason or f"status {record.status}"
            reason = f"robots.txt of {origin} not available after {waited:.0f} s ({why})"
            if self._once(f"{origin} gave up"):
                logger.warning("Dead-lettering the pages of %s: %s", origin, reason,
                               extra={"spider": self.crawler.spider})
            self._scheduler().mark_failed(request, reason, kind="download")
            raise IgnoreRequest("robots.txt not available")
        self.crawler.stats.inc_value("robotstxt/cluster/waits")
        looks = int(request.meta.get(WAITS_META, 0) or 0)
        if known is not None and known.record.expires > now:
            look = known.record.expires - now        # fetched again then, not before
        else:
            # As often as ROBOTSTXT_WAIT while a fetch is likely on its way
            # (its site's interval), less and less often after that.
            look = self.wait * 2 ** min(max(0, looks - 3), 10)
        again = request.replace(dont_filter=True)
        again.meta[WAITS_META] = looks + 1
        again.meta[SINCE_META] = since
        again.meta[RETRY_DELAY_META] = max(self.wait, min(look, MAX_LOOK,
                                                          self.max_wait - waited))
        return again

    # -- the fetch's answer --------------------------------------------------------

    def _chain(self, request: Request) -> list:
        fetch = self._fetch_of(request)
        return fetch[1] if fetch is not None else [request.url]

    def _fetch_of(self, request: Request) -> tuple[str, list] | None:
        """``(original site, URLs so far)`` of a robots.txt fetch (the first,
        or a redirect hop a node signed: :mod:`.hops`), or None."""
        if not request.meta.get(FETCH_META):
            return None
        hop = read_hop(self.signer, request)
        if isinstance(hop, tuple):
            return hop
        if hop is False:
            self.crawler.stats.inc_value("robotstxt/cluster/unproven_hop")
        if is_robots_url(request):
            return origin_of(request), [request.url]
        return None

    async def process_response(self, request: Request, response, spider=None):
        fetch = self._fetch_of(request)
        if fetch is None:
            return response
        origin, chain = fetch
        hop = self._next_hop(origin, chain, response)
        if isinstance(hop, Request):
            # A request of the target's own site, under its politeness; the
            # original site's fetch lock is held on meanwhile.
            hop.meta[HOP_META] = hop_value(self.signer, origin, [*chain, hop.url])
            await self._records.renew_lock(origin, self.lock_ttl)
            self.crawler.engine.crawl(hop)
            raise IgnoreRequest(f"robots.txt of {origin} redirected to {hop.url}")
        await self._answered(origin, request, response, hop)
        raise IgnoreRequest(f"robots.txt ({response.status}) stored for the cluster")

    def _next_hop(self, origin: str, chain: list, response) -> Request | str | None:
        """The request a redirect of *response* leads to; a reason to stop
        following (allow all: RFC 9309 §2.3.1.2); None when not a redirect."""
        hop = next_hop(response, chain, self.max_redirects, priority=self.DOWNLOAD_PRIORITY,
                       dont_filter=True, meta={FETCH_META: True, "dont_redirect": True})
        if hop is None:
            return None
        self.crawler.stats.inc_value("robotstxt/response_count")
        self.crawler.stats.inc_value(f"robotstxt/response_status_count/{response.status}")
        if isinstance(hop, GiveUp):
            self.crawler.stats.inc_value(f"robotstxt/redirect/{hop.stat}")
            logger.info("robots.txt of %s: %s; unavailable, so allow all (RFC 9309)", origin,
                        hop, extra={"spider": self.crawler.spider})
            return str(hop)
        self.crawler.stats.inc_value("robotstxt/redirects")
        if self.signer is not None:
            self.crawler.stats.inc_value("robotstxt/request_count")
        logger.debug("robots.txt of %s: redirect %d to %s", origin, len(chain), hop.url,
                     extra={"spider": self.crawler.spider})
        return hop

    async def process_exception(self, request: Request, exception, spider=None):
        fetch = self._fetch_of(request)
        if fetch is not None:
            # The retry middleware gave up: unreachable for now, and the
            # exception goes on (the request is dead-lettered with it).
            await self._failed(fetch[0], exception)
        return None

    async def _answered(self, origin: str, request: Request, response,
                        gave_up: str | None = None) -> _Known:
        status = response.status
        if gave_up is None:
            self.crawler.stats.inc_value("robotstxt/response_count")
            self.crawler.stats.inc_value(f"robotstxt/response_status_count/{status}")
        rules = self._rules_of(origin, request, response) if 200 <= status < 300 else b""
        reason = gave_up or ("" if state_of(status) != UNAVAILABLE else f"status {status}")
        if state_of(status) == RULES and origin_of(request) != origin:
            # Reached by redirects: the rules (their Crawl-delay: the
            # scheduler's politeness key) are the original site's.
            request = Request(f"{origin}/robots.txt", dont_filter=True,
                              meta={"robotstxt_redirects": list(self._chain(request))})
        return await self._store(origin, status, rules, reason, request)

    def _rules_of(self, origin: str, request: Request, response) -> bytes:
        """What *response*'s robots.txt means for this crawler (:mod:`.rules`)."""
        try:
            body, truncated = self._bodies.read(request, response)
        except ValueError as exc:
            self.crawler.stats.inc_value("robotstxt/undecodable")
            logger.warning("robots.txt of %s cannot be decoded (%s): no rules", origin, exc,
                           extra={"spider": self.crawler.spider})
            body, truncated = b"", False
        if truncated:
            self.crawler.stats.inc_value("robotstxt/truncated")
            logger.info("robots.txt of %s is longer than %d KiB: the rest is not read (RFC "
                        "9309 §2.5)", origin, MAX_BODY // 1024,
                        extra={"spider": self.crawler.spider})
        rules = normalise(body, self.agent, self.max_rules)
        if rules.dropped:
            self.crawler.stats.inc_value("robotstxt/rules_dropped", rules.dropped)
            logger.warning("robots.txt of %s has more than ROBOTSTXT_MAX_RULES (%d) rules for "
                           "this crawler: %d left out", origin, self.max_rules, rules.dropped,
                           extra={"spider": self.crawler.spider})
        return rules.text

    async def _failed(self, origin: str, exception) -> _Known:
        self.crawler.stats.inc_value(f"robotstxt/exception_count/{type(exception).__name__}")
        reason = f"{type(exception).__name__}: {exception}"[:300]
        return await self._store(origin, 0, b"", reason)

    async def _previous(self, origin: str) -> RobotsRecord | None:
        """The record *origin* had before this answer (its failures so far,
        the rules it gave last)."""
        known = self._known.get(origin)
        if self.signer is None:
            return known.record if known is not None else None
        return await self._stored(origin) or (known.record if known is not None else None)

    async def _store(self, origin: str, status: int, body: bytes, reason: str,
                     request: Request | None = None) -> _Known:
        now = time.time()
        if state_of(status) != UNAVAILABLE:
            expires = now + self.cache_ttl
            record = RobotsRecord(status, body, now, expires, origin,
                                  keep=min(now + self.max_age, expires + self.cache_ttl),
                                  reason=reason)
        else:
            record = await self._unreachable(origin, status, reason, now)
        parser = None
        if record.state == RULES and request is not None:
            parser = await self._announce(record, request)
        if self.signer is not None:
            await self._records.share(record, max(1.0, record.keep - now))
        return self._remember(origin, record, parser)

    async def _announce(self, record: RobotsRecord, request: Request):
        """Send ``robots_parsed`` for *record*'s rules (their Crawl-delay slows
        the site down for every node, through the frontier), and wait, a
        bounded time, until the frontier has it: only then may any page of the
        site go, here or on another node (the record is shared after this), or
        the first ones would be paced by the interval the site had before."""
        parser = build_from_crawler(self._parserimpl, self.crawler, record.body)
        await self.crawler.signals.send_catch_log_async(
            signal=signals.robots_parsed, robotparser=parser, request=request)
        client = getattr(self._scheduler(), "client", None)
        if client is not None and _crawl_delay(parser, self.agent):
            try:
                await asyncio.wait_for(asyncio.shield(client.flushed()), CRAWL_DELAY_FLUSH_WAIT)
            except asyncio.TimeoutError:   # Redis away: the record waits no longer
                self.crawler.stats.inc_value("robotstxt/crawl_delay_unflushed")
        return parser

    async def _unreachable(self, origin: str, status: int, reason: str,
                           now: float) -> RobotsRecord:
        """The record of a site whose robots.txt could not be had: fetched
        again after a backoff that grows with the failures in a row; its last
        rules kept while they are young enough (RFC 9309 §2.4)."""
        previous = await self._previous(origin)
        failures = previous.failures + 1 if previous is not None else 1
        backoff = min(self.unavailable_ttl * 2 ** min(failures - 1, 30), self.unavailable_max)
        expires = now + backoff
        if (previous is not None and previous.state != UNAVAILABLE
                and now < previous.fetched + self.max_age):
            record = RobotsRecord(previous.status, previous.body, previous.fetched, expires,
                                  origin, keep=min(previous.fetched + self.max_age,
                                                   expires + self.unavailable_max),
                                  failures=failures, reason=reason)
            kept = f"its rules of {time.ctime(previous.fetched)} are used meanwhile"
        else:
            # Kept past its expiry for its count of failures (the backoff grows)
            # and its reason (a page given up on says it).
            record = RobotsRecord(status, b"", now, expires, origin,
                                  keep=expires + max(self.unavailable_max, self.max_wait),
                                  failures=failures, reason=reason)
            kept = "its pages wait"
        logger.warning("robots.txt of %s is unavailable (%s, %d time(s) in a row): %s, and "
                       "it is fetched again in %.1f s", origin, reason or status, failures,
                       kept, backoff, extra={"spider": self.crawler.spider})
        return record


__all__ = ["ClusterRobotsTxtMiddleware", "FETCH_META", "HOP_META", "SINCE_META", "WAITS_META",
           "ALLOW_ALL", "origin_of"]
