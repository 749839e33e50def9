"""``RedisSpider``: a spider whose start requests stream in from Redis.

Unlike scrapy-redis' ``RedisSpider`` (which reads seeds only when the node is
idle, with a blocking client), seeds are read here in batches by ``start()``
while the crawl runs, with an asyncio Redis client (the reactor never waits
on Redis), and with back-pressure: a batch is taken only while this node holds
fewer than ``SEEDS_MAX_PENDING`` requests not yet in the shared frontier.

A node is long-lived: it keeps polling for seeds. With
``MAX_IDLE_TIME_BEFORE_CLOSE = N`` (seconds, 0 = never; setting or environment
variable) it closes once it has had nothing at all to do for N seconds.

Seeds are untrusted (see :mod:`crawlproject.policy`): one that cannot become
a request the spider published, for any reason, is set aside in
``<spider>:start_urls:invalid`` with the reason, and the rest of its batch
goes on. Nothing a seed holds can stop the seed reader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

from redis.exceptions import ResponseError
from scrapy import Request, Spider

from crawlproject.connection import redact_url, redis_from_settings, redis_url_from_settings
from crawlproject.defaults import setting
from crawlproject.node import node_id
from crawlproject.outage import outage_log
from crawlproject.policy import InputPolicy
from crawlproject.seeds import (InvalidSeed, Seed, SeedQueue, build_request, request_from_seed,
                               seed_key)
from crawlproject.serialization import node_storable, request_to_json
from crawlproject.urls import redact_userinfo

logger = logging.getLogger(__name__)


class RedisSpider(Spider):
    """Base class: set ``name`` and ``parse``; seeds come from Redis.

    Attributes (each overrides the setting of the same meaning):
    ``redis_key`` (``REDIS_START_URLS_KEY``, default ``"<name>:start_urls"``),
    ``redis_batch_size`` (``REDIS_START_URLS_BATCH_SIZE``),
    ``max_idle_time`` (``MAX_IDLE_TIME_BEFORE_CLOSE``),
    ``seed_meta_allow`` (added to ``SEED_META_ALLOW``: the meta keys a seed may set),
    ``sitemap_seeds`` (``SITEMAPS_ENABLED``: the sitemaps robots.txt lists as
    seeds, :mod:`crawlproject.sitemaps`),
    ``allowed_callbacks`` (when set, exactly the callbacks seeds and stored
    requests may name; by default every public method of the spider's own
    classes).
    """

    redis_key: str | None = None
    redis_batch_size: int | None = None
    max_idle_time: float | None = None
    seed_meta_allow: tuple[str, ...] = ()
    sitemap_seeds: bool | None = None     # None: SITEMAPS_ENABLED decides

    @classmethod
    def from_crawler(cls, crawler, *args: Any, **kwargs: Any):
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider._setup_seeds(crawler)
        return spider

    def _setup_seeds(self, crawler) -> None:
        s = crawler.settings
        self.redis_key = seed_key(self.name, s, self.redis_key)
        if setting(s, "REDIS_START_URLS_AS_SET"):
            kind = "set"
        elif setting(s, "REDIS_START_URLS_AS_ZSET"):
            kind = "zset"
        else:
            kind = "list"
        self.redis_batch_size = min(1000, int(
            self.redis_batch_size or setting(s, "REDIS_START_URLS_BATCH_SIZE") or 1
        ))
        if self.max_idle_time is None:
            self.max_idle_time = setting(s, "MAX_IDLE_TIME_BEFORE_CLOSE")
        self.seed_poll_interval = setting(s, "SEEDS_POLL_INTERVAL")
        self.seed_max_pending = setting(s, "SEEDS_MAX_PENDING") or 2 * self.redis_batch_size
        self.seed_encoding = setting(s, "REDIS_ENCODING")
        self.seed_policy = InputPolicy.from_settings(s, type(self))
        # Callables saying "more seeds are on their way" (sitemap seeds waiting
        # for room in the frontier): the node is not idle while one says so.
        self.seed_sources: list = []
        self.node_id = node_id(crawler)
        url = redact_url(redis_url_from_settings(s))
        self._redis_outage = outage_log(crawler, "redis", f"Redis at {url}")
        client = redis_from_settings(s, asyncio=True)
        self._bad_keys_logged_at = float("-inf")
        self.seed_queue = SeedQueue(client, self.redis_key, kind,
                                    claim_ttl=setting(s, "SEEDS_CLAIM_TTL"),
                                    invalid_max=setting(s, "SEEDS_INVALID_MAX"))
        logger.info(
            "Reading seeds from %s key %r of %s (batch %d, idle close: %s)",
            kind, self.redis_key, url, self.redis_batch_size,
            f"after {self.max_idle_time:g} s idle" if self.max_idle_time else "never",
            extra={"spider": self},
        )

    async def start(self) -> AsyncIterator[Any]:
        """Stream seeds from Redis until the node has been idle long enough."""
        idle_since: float | None = None
        while True:
            control = self._control_state()
            if control in ("pause", "stop"):  # no seed while the operator says so
                idle_since = None
                await asyncio.sleep(self.seed_poll_interval)
                continue
            if control == "drain":
                # No more seeds: close once the cluster's frontier is done (a
                # node held by the drain it started into waits instead).
                if self._node_is_idle() and not self._control_holds():
                    logger.info("Drained: no seeds taken, nothing left to do: closing",
                                extra={"spider": self})
                    return
                await asyncio.sleep(self.seed_poll_interval)
                continue
            if self._scheduler_backlog() >= self.seed_max_pending:
                await asyncio.sleep(0.05)  # back-pressure: let the crawl catch up
                continue
            try:
                batch, claims = await self._next_seed_batch()
            except Exception:  # a bug must not end the seed reader: log, go on
                logger.exception("Reading seeds failed; retrying", extra={"spider": self})
                self.crawler.stats.inc_value("seeds/errors")
                await asyncio.sleep(self.seed_poll_interval)
                continue
            if claims:
                idle_since = None
                for request in batch:
                    yield request
                # Seeds stay claimed in Redis until their requests are stored.
                await self._release_when_stored(claims)
                continue
            if not self._node_is_idle() or any(source() for source in self.seed_sources):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif self.max_idle_time and time.monotonic() - idle_since >= self.max_idle_time:
                logger.info("No seeds and nothing to do for %ss: closing", self.max_idle_time,
                            extra={"spider": self})
                return
            await asyncio.sleep(self.seed_poll_interval)

    async def _next_seed_batch(self) -> tuple[list[Request], list[str]]:
        """Claim a batch; returns its requests and the claims to release once
        they are stored (a rejected seed's claim too, once it is set aside)."""
        try:
            restored, claimed = await self.seed_queue.claim(self.redis_batch_size)
        except ResponseError as exc:  # Redis answered: a key may hold the wrong thing
            if not await self._bad_seed_keys(exc):
                self._redis_outage.failed("reading seeds", exc, {"spider": self}, source="seeds")
                self.crawler.stats.inc_value("seeds/redis_errors")
            return [], []
        except Exception as exc:  # Redis down: keep the node alive, retry later
            self._redis_outage.failed("reading seeds", exc, {"spider": self}, source="seeds")
            self.crawler.stats.inc_value("seeds/redis_errors")
            return [], []
        self._redis_outage.ok({"spider": self}, source="seeds")
        if restored:
            logger.warning("Put back %d seeds claimed by a node that died", restored,
                           extra={"spider": self})
            self.crawler.stats.inc_value("seeds/restored", restored)
        requests, release = [], []
        for claim_id, raw in claimed:
            request, settled = await self._request_from_raw(raw)
            if request is not None:
                requests.append(request)
            if settled:
                release.append(claim_id)
        return requests, release

    async def _bad_seed_keys(self, exc: Exception) -> bool:
        """After a claim failed with an error reply: whether a seed or claim key
        holds the wrong type or junk. If so, say so (ERROR, at most once a
        minute while it lasts) and read no seed: nothing was taken, the seeds
        stay where they are, and the node is not in a Redis outage (it may
        close when idle). Retrying cannot mend such a key; the operator can."""
        try:
            problems = await self.seed_queue.diagnose()
        except Exception:  # noqa: BLE001 - Redis went away meanwhile: an outage
            return False
        if not problems:
            return False
        self._redis_outage.ok({"spider": self}, source="seeds")
        self.crawler.stats.inc_value("seeds/bad_keys")
        now = time.monotonic()
        if now - self._bad_keys_logged_at >= 60:
            self._bad_keys_logged_at = now
            logger.error("No seed can be read: %s (Redis said: %s). The seeds are left in "
                         "place; fix or delete the key", "; ".join(problems), exc,
                         extra={"spider": self})
        return True

    async def _release_when_stored(self, claims: list[str]) -> None:
        """Release *claims* once their requests are in the frontier, renewing
        them meanwhile (a slow flush must not make live claims expire)."""
        flushed = getattr(self.crawler.engine.scheduler, "flushed", None)
        renew_every = max(0.5, self.seed_queue.claim_ttl_ms / 3000)
        try:
            if flushed is not None:
                done = asyncio.ensure_future(flushed())
                while True:
                    finished, _ = await asyncio.wait({done}, timeout=renew_every)
                    if finished:
                        done.result()
                        break
                    try:
                        await self.seed_queue.renew(claims)
                    except Exception as exc:
                        self._redis_outage.failed("renewing seed claims", exc, {"spider": self},
                                                  source="seeds")
            await self.seed_queue.release(claims)
        except Exception as exc:  # the claims expire and the seeds come back
            self._redis_outage.failed("releasing seed claims", exc, {"spider": self},
                                      source="seeds")

    async def _request_from_raw(self, raw: bytes) -> tuple[Request | None, bool]:
        """(request or None, whether the seed is settled: a request to store,
        or a rejected seed safely kept in the invalid list)."""
        stats = self.crawler.stats
        try:
            request = request_from_seed(raw, self, self.seed_policy, self.seed_encoding,
                                        check=self._check_storable)
        except InvalidSeed as exc:
            logger.warning("Invalid seed %r moved to %s: %s", redact_userinfo(raw[:200]),
                           self.seed_queue.invalid_key, redact_userinfo(str(exc)),
                           extra={"spider": self})
            stats.inc_value("seeds/invalid")
            stats.inc_value(f"seeds/invalid/{exc.code}")
            try:
                trimmed = await self.seed_queue.reject(raw, exc, self.node_id)
            except Exception as err:  # keep it claimed: it comes back after the claim TTL
                self._redis_outage.failed("setting an invalid seed aside", err, {"spider": self},
                                          source="seeds")
                return None, False
            if trimmed:
                stats.inc_value("seeds/invalid_trimmed", trimmed)
            return None, True
        stats.inc_value("seeds/read")
        return request, True

    def _check_storable(self, request: Request) -> None:
        # A request no node can store (a spider's make_request_from_seed gave
        # it a lambda callback, an object in meta) would be kept in this
        # node's memory only, and its seed released: refuse it here, with the
        # seed, which then stays in the invalid list.
        if not node_storable(request, self):
            request_to_json(request, self, self.seed_policy)   # raises, with the reason

    def make_request_from_seed(self, seed: Seed) -> Request:
        """Build the request for a parsed seed; override to customise.

        Callbacks, errbacks and meta are checked against the spider's input
        policy (:mod:`crawlproject.policy`); raise :class:`InvalidSeed` to
        reject a seed with a reason.
        """
        return build_request(seed, self, self.seed_policy)

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

    def _control_state(self) -> str:
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        return getattr(scheduler, "control_state", "run")

    def _control_holds(self) -> bool:
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        return getattr(scheduler, "control_holds", False)

    def _node_is_idle(self) -> bool:
        if self._redis_outage.down:
            return False  # cannot tell whether the cluster has work: never idle-close blind
        engine = self.crawler.engine
        slot = getattr(engine, "_slot", None)
        if slot is not None and slot.inprogress:
            return False
        if engine.downloader.active or not engine.scraper.slot.is_idle():
            return False
        scheduler = engine.scheduler
        return scheduler is None or not scheduler.has_pending_requests()
