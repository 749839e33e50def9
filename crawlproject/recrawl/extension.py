"""RecrawlFeeder: due pages back into the shared frontier, a bounded batch at a time.

Every node runs the feeder; one at a time does a cycle (a Redis lock,
``{spider}:recrawl:lock``). A cycle, every ``RECRAWL_CHECK_INTERVAL`` seconds
(at once after ``crawlctl recrawl --now``, and again at once while due pages
remain):

1. skips when the operator paused, stopped or drained the crawl, or when the
   frontier already holds ``RECRAWL_MAX_QUEUED`` requests (revisits never flood it);
2. reads at most ``RECRAWL_BATCH_SIZE`` page records due now, oldest due first
   (MongoDB, index on ``next_visit``);
3. *claims* them: ``next_visit`` moves ``RECRAWL_CLAIM_TIMEOUT`` ahead, so a
   page fed but never visited (its request dead-lettered, its node gone before
   the request reached Redis) is due again then: nothing is lost, nothing is
   fed twice meanwhile;
4. rebuilds each page's request from its record (untrusted: decoded with the
   spider's input policy, like a frontier payload, and it must fetch the
   record's own site: :func:`record_request`; a record refused is counted in
   ``recrawl/invalid_records/<reason>``, logged, and marked ``invalid`` with
   its reason and no ``next_visit``, so no cycle reads it again until a visit
   of the page stores a new request), with the page's state in
   ``meta["recrawl"]`` (validators, interval, counters), ``dont_filter`` (a
   revisit is not a duplicate) and the rule's priority (below fresh
   discoveries by default), and schedules it: it is as polite as any request;
5. reports ``pages`` and ``due`` to ``{spider}:recrawl`` (``crawlctl status``).

A sitemap read on this node can make known pages due before their time
(:meth:`RecrawlFeeder.make_due`: their ``lastmod`` is newer than their last
fetch; one read and one write per batch of URLs); the next cycle follows at once.

A node that would close when idle (``MAX_IDLE_TIME_BEFORE_CLOSE``) stays open
until its feeder has looked once, while a cycle runs, and while its last cycle
left pages due now: a node started to recrawl does not close before the
revisits it could feed are in the frontier.

A cycle that fails (MongoDB or Redis unreachable) is logged and retried at the
next one; the crawl goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any

from pymongo import ASCENDING
from pymongo.errors import PyMongoError
from redis.exceptions import LockError
from scrapy import signals
from scrapy.exceptions import DontCloseSpider, NotConfigured

from crawlproject.connection import (
    REDIS_FAILURES,
    mongo_database_from_settings,
    mongo_uri_from_settings,
    redis_from_settings,
)
from crawlproject.defaults import setting
from crawlproject.node import node_id
from crawlproject.keys import FrontierKeys
from crawlproject.connection import collection_name
from crawlproject.policy import InputPolicy, Refused
from crawlproject.recrawl.schedule import (STATE_META, PageVisit, RecrawlPolicy,
                                           lastmod_due, utc_now)
from crawlproject.serialization import RequestDecodeError, request_from_json
from crawlproject.signing import Signer, signer_from_settings

logger = logging.getLogger(__name__)

#: Fields of a page record the feeder reads.
PROJECTION = {"request": 1, "url": 1, "etag": 1, "last_modified": 1, "body_hash": 1,
              "interval": 1, "checks": 1, "changes": 1, "gone_at": 1, "items": 1}
WAKE_POLL = 1.0
MAX_REASON = 300
#: Due pages are counted up to this many (an index range scan every cycle).
DUE_COUNT_MAX = 1_000_000


class RecrawlFeeder:
    """See the module docstring. Settings: ``RECRAWL_ENABLED``,
    ``RECRAWL_CHECK_INTERVAL``, ``RECRAWL_BATCH_SIZE``, ``RECRAWL_MAX_QUEUED``,
    ``RECRAWL_CLAIM_TIMEOUT``, and the rules (:class:`RecrawlPolicy`)."""

    def __init__(self, crawler, *, policy: RecrawlPolicy, mongo_uri: str, database: str,
                 check_interval: float, batch_size: int, max_queued: int,
                 claim_timeout: float, key_as_id: bool = True):
        self.crawler = crawler
        self.key_field = "_id" if key_as_id else "url"   # how a page record is keyed
        self.stats = crawler.stats
        self.policy = policy
        self.mongo_uri, self.database = mongo_uri, database
        self.check_interval, self.batch_size = check_interval, batch_size
        self.max_queued, self.claim_timeout = max_queued, claim_timeout
        self.input_policy: InputPolicy | None = None
        self.signer: Signer | None = None
        self.redis = None
        self.mongo = None
        self.keys: FrontierKeys | None = None
        self._task: asyncio.Task | None = None
        self._closing = False
        self._wake_seen: Any = None
        self._looked = False      # a first cycle was tried
        self._busy = False        # a cycle runs now
        self._due_left = 0        # pages due and not fed at the last cycle
        self._soon = False        # pages were made due here: cycle at once

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not setting(s, "RECRAWL_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        policy = RecrawlPolicy.from_settings(s, crawler.spidercls)
        if not policy:
            raise NotConfigured("no revisit rule")
        feeder = cls(crawler, policy=policy, mongo_uri=mongo_uri_from_settings(s),
                     database=mongo_database_from_settings(s),
                     check_interval=max(0.2, setting(s, "RECRAWL_CHECK_INTERVAL")),
                     batch_size=max(1, setting(s, "RECRAWL_BATCH_SIZE")),
                     max_queued=max(1, setting(s, "RECRAWL_MAX_QUEUED")),
                     claim_timeout=max(1.0, setting(s, "RECRAWL_CLAIM_TIMEOUT")),
                     key_as_id=setting(s, "MONGO_KEY_AS_ID"))
        crawler.signals.connect(feeder.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(feeder.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(feeder.spider_idle, signal=signals.spider_idle)
        return feeder

    # -- lifecycle ------------------------------------------------------------
    def spider_opened(self, spider) -> None:
        from crawlproject.connection import mongo_client

        self.input_policy = InputPolicy.from_settings(self.crawler.settings, type(spider))
        self.signer = signer_from_settings(self.crawler.settings, spider.name)
        self.redis = redis_from_settings(self.crawler.settings, asyncio=True)
        self.mongo = mongo_client(self.mongo_uri, asyncio=True, settings=self.crawler.settings)
        self.keys = FrontierKeys(spider.name)
        self._task = asyncio.ensure_future(self._run())

    async def spider_closed(self, spider) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self.redis is not None:
            await self.redis.aclose()
        if self.mongo is not None:
            await self.mongo.close()

    def spider_idle(self) -> None:
        """Hold an idle close while revisits may still be fed (module docstring)."""
        if self._closing or getattr(self._scheduler(), "control_state", "run") != "run":
            return  # drained, paused or stopped by the operator: no more revisits now
        if not self._looked or self._busy or self._due_left > 0:
            raise DontCloseSpider

    @property
    def pages(self):
        name = collection_name("%(spider)s", PageVisit, self.crawler.spider.name)
        return self.mongo[self.database][name]

    # -- the loop -------------------------------------------------------------
    async def _run(self) -> None:
        indexed = False
        next_cycle = float("-inf")   # the first cycle at once (0.0 relied on the boot time)
        while not self._closing:
            now = time.monotonic()
            soon, self._soon = self._soon, False
            if now >= next_cycle or soon or await self._woken():
                more = False
                self._busy = True
                try:
                    if not indexed:
                        await self.pages.create_index([("next_visit", ASCENDING)])
                        indexed = True
                    more = await self.cycle()
                except (PyMongoError, *REDIS_FAILURES) as exc:
                    self.stats.inc_value("recrawl/errors")
                    logger.warning("Revisit cycle failed (%s: %s); next try in %.0fs",
                                   type(exc).__name__, exc, self.check_interval,
                                   extra={"spider": self.crawler.spider})
                except Exception:  # a bug: say so, keep the crawl and the loop going
                    self.stats.inc_value("recrawl/errors")
                    logger.exception("Revisit cycle failed", extra={"spider": self.crawler.spider})
                finally:
                    self._busy = False
                    self._looked = True
                next_cycle = time.monotonic() + (0.0 if more else self.check_interval)
            await asyncio.sleep(min(WAKE_POLL, max(0.05, next_cycle - time.monotonic())))

    async def _woken(self) -> bool:
        """True when ``crawlctl recrawl --now`` raised the wake counter."""
        try:
            wake = await self.redis.hget(self.keys.recrawl, "wake")
        except REDIS_FAILURES:
            return False
        seen, self._wake_seen = self._wake_seen, wake
        return seen is not None and wake != seen

    async def make_due(self, pages, now=None) -> int:
        """Make the known pages of *pages* (``(url, lastmod)``, URLs as the
        page records key them) due now when their ``lastmod`` is newer than
        their last fetch (:func:`~crawlproject.recrawl.schedule.lastmod_due`
        says which): for the whole batch one read of the records (by key, a
        projection) and one ``update_many``, never a round trip per URL.
        Returns how many were made due; raises PyMongoError. Unknown pages
        are untouched (they are new seeds)."""
        if self.mongo is None or self._closing:
            return 0
        lastmods = {}
        for url, lastmod in pages:
            if self.policy.rule_for(url) is not None:
                lastmods[url] = max(lastmod, lastmods.get(url, lastmod))
        if not lastmods:
            return 0
        now = now or utc_now()
        records = await self.pages.find(
            {self.key_field: {"$in": list(lastmods)}},
            {"url": 1, "last_checked": 1, "next_visit": 1, "sitemap_due_at": 1}).to_list(None)
        due = lastmod_due(records, lastmods, self.policy, now)
        if not due:
            return 0
        # Not due meanwhile (a claim, a cycle): only then.
        result = await self.pages.update_many(
            {"_id": {"$in": due}, "next_visit": {"$gt": now}},
            {"$set": {"next_visit": now, "sitemap_due_at": now}})
        if result.modified_count:
            self._soon = True
        return result.modified_count

    def _scheduler(self):
        return getattr(self.crawler.engine, "scheduler", None)

    def _may_feed(self) -> int:
        """How many requests the frontier may take now (0: skip this cycle)."""
        scheduler = self._scheduler()
        if scheduler is None:
            return 0
        if getattr(scheduler, "control_state", "run") != "run":
            return 0
        return min(self.batch_size, max(0, self.max_queued - len(scheduler)))

    async def cycle(self) -> bool:
        """One cycle (see the module docstring); True when due pages remain
        and the frontier has room (the next cycle should follow at once)."""
        room = self._may_feed()
        if room <= 0:
            return False
        lock = self.redis.lock(self.keys.recrawl_lock, timeout=max(30.0, 3 * self.check_interval),
                               blocking=False)
        if not await lock.acquire(token=node_id(self.crawler).encode()):
            return False
        try:
            fed, due = await self._feed(room)
        finally:
            try:
                await lock.release()
            except LockError:  # expired meanwhile: another node may feed now (claims hold)
                pass
        return fed >= room and due > 0

    async def _feed(self, room: int) -> tuple[int, int]:
        now = utc_now()
        docs = await self.pages.find({"next_visit": {"$lte": now}}, PROJECTION) \
            .sort("next_visit", ASCENDING).limit(room).to_list(None)
        fed = 0
        if docs:
            until = now + timedelta(seconds=self.claim_timeout)
            await self.pages.update_many({"_id": {"$in": [d["_id"] for d in docs]},
                                          "next_visit": {"$lte": now}},
                                         {"$set": {"next_visit": until}})
            refused = []
            for doc in docs:
                fed += self._schedule(doc, refused)
            for doc_id, code, reason in refused:
                # Set aside until a visit stores a request again: not read every cycle.
                await self.pages.update_one({"_id": doc_id}, {
                    "$set": {"invalid": {"code": code, "reason": reason[:MAX_REASON],
                                         "at": now}},
                    "$unset": {"next_visit": ""}})
            scheduler = self._scheduler()
            if fed and hasattr(scheduler, "flushed"):
                await asyncio.wait_for(asyncio.shield(scheduler.flushed()), 60)
        due = await self.pages.count_documents({"next_visit": {"$lte": now}}, limit=DUE_COUNT_MAX)
        self._due_left = due
        total = await self.pages.estimated_document_count()
        self.stats.inc_value("recrawl/cycles")
        self.stats.set_value("recrawl/due", due)
        await self.redis.hset(self.keys.recrawl, mapping={
            "pages": total, "due": due, "at": int(time.time() * 1000),
            "node": node_id(self.crawler)})
        if fed:
            await self.redis.hincrby(self.keys.recrawl, "fed", fed)
            logger.info("Revisits: %d due page(s) back in the frontier, %d more due", fed, due,
                        extra={"spider": self.crawler.spider})
        return fed, due

    def _schedule(self, doc: dict, refused: list) -> int:
        """Schedule the revisit of one page record; 1 if scheduled (a record
        refused is added to *refused* as ``(_id, code, reason)``)."""
        url = doc.get("url")
        rule = self.policy.rule_for(url) if isinstance(url, str) else None
        payload = doc.get("request")
        if rule is None or not isinstance(payload, str):
            # No rule covers it any more, or no request to fetch it with: the
            # claim keeps it out of the way; counted, not an error.
            self.stats.inc_value("recrawl/not_revisitable")
            return 0
        try:
            request = record_request(url, payload, self.crawler.spider, self.input_policy,
                                     self.signer)
        except RequestDecodeError as exc:
            self.stats.inc_value("recrawl/invalid_records")
            self.stats.inc_value(f"recrawl/invalid_records/{exc.code}")
            logger.error("Page record %s holds no request this spider may run (set aside, "
                         "marked invalid): %s", url[:200], exc,
                         extra={"spider": self.crawler.spider})
            refused.append((doc.get("_id"), exc.code, str(exc)))
            return 0
        state = {k: doc.get(k) for k in ("etag", "last_modified", "body_hash", "interval",
                                         "checks", "changes", "items") if doc.get(k) is not None}
        if doc.get("gone_at") is not None:
            state["gone"] = True
        meta = dict(request.meta)
        meta[STATE_META] = state
        self.crawler.engine.crawl(request.replace(meta=meta, dont_filter=True,
                                                  priority=rule.priority))
        self.stats.inc_value("recrawl/fed")
        return 1


def record_request(url: str, payload: str, spider, policy: InputPolicy,
                   signer: Signer | None = None):
    """The request of a page record kept under *url* (from MongoDB): whole if
    a node of the crawl signed it, else a request *spider* may run under the
    seed policy (:func:`request_from_json`); either way it must fetch the
    record's own site (a signed request moved to another record is not).
    Raises :class:`RequestDecodeError`, and only that."""
    request = request_from_json(payload, spider, policy, signer)
    try:
        policy.check_same_site(request.url, url)
    except Refused as exc:
        raise RequestDecodeError(str(exc), exc.code) from None
    return request
