"""``RedisSpider``: a spider whose start requests stream in from Redis.

Unlike scrapy-redis' ``RedisSpider`` (which reads seeds only when the node is
idle, with a blocking client), seeds are read here in batches by ``start()``
while the crawl runs, with an asyncio Redis client (the reactor never waits
on Redis), and with back-pressure: a batch is taken only while this node holds
fewer than ``SEEDS_MAX_PENDING`` requests not yet in the shared frontier.

A node is long-lived: it keeps polling for seeds. With
``MAX_IDLE_TIME_BEFORE_CLOSE = N`` (seconds, 0 = never) it closes once it has
had nothing at all to do for N seconds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, AsyncIterator

from scrapy import Request, Spider
from scrapy.http import FormRequest

from crawlproject.connection import redact_url, redis_from_settings
from crawlproject.seeds import InvalidSeed, Seed, SeedQueue, parse_seed

logger = logging.getLogger(__name__)


class RedisSpider(Spider):
    """Base class: set ``name`` and ``parse``; seeds come from Redis.

    Attributes (each overrides the setting of the same meaning):
    ``redis_key`` (``REDIS_START_URLS_KEY``, default ``"<name>:start_urls"``),
    ``redis_batch_size`` (``REDIS_START_URLS_BATCH_SIZE``),
    ``max_idle_time`` (``MAX_IDLE_TIME_BEFORE_CLOSE``).
    """

    redis_key: str | None = None
    redis_batch_size: int | None = None
    max_idle_time: float | None = None

    @classmethod
    def from_crawler(cls, crawler, *args: Any, **kwargs: Any):
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._setup_seeds(crawler)
        return spider

    def _setup_seeds(self, crawler) -> None:
        s = crawler.settings
        key = self.redis_key or s.get("REDIS_START_URLS_KEY", "%(name)s:start_urls")
        self.redis_key = key % {"name": self.name, "spider": self.name}
        if s.getbool("REDIS_START_URLS_AS_SET"):
            kind = "set"
        elif s.getbool("REDIS_START_URLS_AS_ZSET"):
            kind = "zset"
        else:
            kind = "list"
        self.redis_batch_size = min(1000, int(
            self.redis_batch_size or s.getint("REDIS_START_URLS_BATCH_SIZE") or 100
        ))
        if self.max_idle_time is None:
            self.max_idle_time = s.getfloat("MAX_IDLE_TIME_BEFORE_CLOSE", 0)
        self.seed_poll_interval = s.getfloat("SEEDS_POLL_INTERVAL", 1.0)
        self.seed_max_pending = s.getint("SEEDS_MAX_PENDING") or 2 * self.redis_batch_size
        self.seed_encoding = s.get("REDIS_ENCODING", "utf-8")
        self.node_id = s.get("NODE_ID") or f"{socket.gethostname()}:{id(self):x}"
        client = redis_from_settings(s, asyncio=True)
        self.seed_queue = SeedQueue(client, self.redis_key, kind,
                                    claim_ttl=s.getfloat("SEEDS_CLAIM_TTL", 60.0))
        logger.info(
            "Reading seeds from %s key %r of %s (batch %d, idle close %ss)",
            kind, self.redis_key, redact_url(s.get("REDIS_URL")),
            self.redis_batch_size, self.max_idle_time or "never",
            extra={"spider": self},
        )

    async def start(self) -> AsyncIterator[Any]:
        """Stream seeds from Redis until the node has been idle long enough."""
        idle_since: float | None = None
        while True:
            if self._scheduler_backlog() >= self.seed_max_pending:
                await asyncio.sleep(0.05)  # back-pressure: let the crawl catch up
                continue
            batch, claims = await self._next_seed_batch()
            if claims:
                idle_since = None
                for request in batch:
                    yield request
                # Seeds stay claimed in Redis until their requests are stored.
                await self._release_when_stored(claims)
                continue
            if not self._node_is_idle():
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif self.max_idle_time and time.monotonic() - idle_since >= self.max_idle_time:
                logger.info("No seeds and nothing to do for %ss: closing", self.max_idle_time,
                            extra={"spider": self})
                return
            await asyncio.sleep(self.seed_poll_interval)

    async def _next_seed_batch(self) -> tuple[list[Request], list[str]]:
        try:
            restored, claimed = await self.seed_queue.claim(self.redis_batch_size)
        except Exception as exc:  # Redis down: keep the node alive, retry later
            logger.error("Cannot read seeds from Redis: %s", exc, extra={"spider": self})
            self.crawler.stats.inc_value("seeds/redis_errors")
            return [], []
        if restored:
            logger.warning("Put back %d seeds claimed by a node that died", restored,
                           extra={"spider": self})
            self.crawler.stats.inc_value("seeds/restored", restored)
        requests = []
        for _claim_id, raw in claimed:
            request = await self._request_from_raw(raw)
            if request is not None:
                requests.append(request)
        return requests, [claim_id for claim_id, _ in claimed]

    async def _release_when_stored(self, claims: list[str]) -> None:
        flushed = getattr(self.crawler.engine.scheduler, "flushed", None)
        try:
            if flushed is not None:
                await flushed()
            await self.seed_queue.release(claims)
        except Exception as exc:  # the claims expire and the seeds come back
            logger.error("Cannot release seed claims: %s", exc, extra={"spider": self})

    async def _request_from_raw(self, raw: bytes) -> Request | None:
        stats = self.crawler.stats
        try:
            request = self.make_request_from_seed(parse_seed(raw, self.seed_encoding))
        except InvalidSeed as exc:
            logger.warning("Invalid seed %r moved to %s: %s", raw[:200],
                           self.seed_queue.invalid_key, exc, extra={"spider": self})
            stats.inc_value("seeds/invalid")
            stats.inc_value(f"seeds/invalid/{exc.code}")
            await self.seed_queue.reject(raw, exc, self.node_id)
            return None
        stats.inc_value("seeds/read")
        return request

    def make_request_from_seed(self, seed: Seed) -> Request:
        """Build the request for a parsed seed; override to customise."""
        callback = self._method(seed.callback, "callback") if seed.callback else None
        errback = self._method(seed.errback, "errback") if seed.errback else None
        common = dict(
            method=seed.method, headers=seed.headers or None, meta=seed.meta,
            priority=seed.priority, dont_filter=seed.dont_filter,
            callback=callback, errback=errback, cb_kwargs=seed.cb_kwargs,
        )
        if seed.formdata:
            return FormRequest(seed.url, formdata=seed.formdata, **common)
        return Request(seed.url, body=seed.body, **common)

    def _method(self, name: str, what: str):
        method = getattr(self, name, None)
        if not callable(method):
            raise InvalidSeed("unknown_callback", f"{what} {name!r} is not a method of {self.name}")
        return method

    def _scheduler_backlog(self) -> int:
        # This node's own backlog: the shared queue may hold millions of
        # requests, and a seed pushed with a high priority must not wait for it.
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        local = getattr(scheduler, "local_backlog", None)
        if local is not None:
            return local()
        try:
            return len(scheduler) if scheduler is not None else 0
        except TypeError:
            return 0

    def _node_is_idle(self) -> bool:
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        if slot is not None and slot.inprogress:
            return False
        if engine.downloader.active or not engine.scraper.slot.is_idle():
            return False
        scheduler = engine.scheduler
        return scheduler is None or not scheduler.has_pending_requests()
