"""RedisScheduler: Scrapy's scheduler over the shared Redis frontier.

A thin adapter over :class:`crawlproject.frontier.queue.AsyncFrontier`:

* ``next_request()`` returns from a local prefetch buffer, never waiting on
  Redis; a background task refills it, sends new requests (deduplicated and
  enqueued in the same atomic call, in batches), acknowledges finished ones
  and renews this node's lease: one round trip per batch.
* A request is acknowledged only when it has left the engine: downloaded, its
  callback's output consumed, its new requests handed to this scheduler (and
  sent in the same call as the ack) and its items through the pipelines.
  A node killed at any moment loses nothing: its leased requests are put
  back by any other node once its lease (``SCHEDULER_LEASE_TTL``, 10 s by
  default, renewed every ``SCHEDULER_HEARTBEAT_INTERVAL``) expires.
* Downloads that keep failing are retried with exponential backoff through
  Redis (see :mod:`crawlproject.middlewares.retry`), then dead-lettered; a
  callback that keeps crashing is retried ``CALLBACK_RETRY_TIMES`` times,
  then dead-lettered too (``python -m crawlproject.cli dead`` / ``replay``).
* Requests travel as JSON (:mod:`crawlproject.serialization`); a request that
  cannot be serialised is refused at enqueue time with the offending key. A
  stored payload is untrusted: one that does not decode into a request the
  spider published (:mod:`crawlproject.policy`) is moved to ``{spider}:invalid``.
* Acknowledgements rely on the engine's private slot (``_slot.inprogress`` and
  ``_slot.nextcall``, Scrapy 2.13–2.19); :meth:`RedisScheduler.open` refuses
  to start, with a clear message, on a Scrapy without them rather than never
  acknowledging anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import scrapy
from scrapy import Request, signals
from scrapy.core.scheduler import BaseScheduler
from redis.exceptions import RedisError
from scrapy.utils.defer import deferred_from_coro

from crawlproject.backoff import backoff_delay
from crawlproject.connection import redact_url, redis_from_settings, redis_url_from_settings
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.queue import (
    DEAD_MAX,
    INVALID_MAX,
    MAX_PRIORITY,
    AsyncFrontier,
    Batch,
)
from crawlproject.identity import node_id
from crawlproject.outage import outage_log
from crawlproject.policy import InputPolicy
from crawlproject.serialization import (
    RequestDecodeError,
    RequestEncodeError,
    request_from_json,
    request_to_json,
)

logger = logging.getLogger(__name__)

LEASE_META = "_crawlproject_lease"
RETRY_DELAY_META = "_crawlproject_retry_delay"
CALLBACK_ATTEMPTS_META = "crawlproject_callback_attempts"
#: Scrapy versions whose engine internals the acknowledgements were checked on.
SUPPORTED_SCRAPY = ((2, 13), (2, 19))


def _resolve(waiters: list[asyncio.Future]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


class RedisScheduler(BaseScheduler):
    """Scheduler shared by every node through Redis (see module docstring)."""

    def __init__(self, crawler, *, prefetch: int, batch_size: int, flush_interval: float,
                 min_sync_interval: float, idle_poll: float, local_dedupe_size: int,
                 lease_ttl: float, heartbeat: float, bloom: BloomConfig,
                 callback_retry_times: int, backoff_base: float, backoff_max: float,
                 node_id: str, dead_max: int = DEAD_MAX, invalid_max: int = INVALID_MAX):
        if heartbeat <= 0 or heartbeat >= lease_ttl:
            raise ValueError(f"SCHEDULER_HEARTBEAT_INTERVAL ({heartbeat}s) must be above 0 and "
                             f"well under SCHEDULER_LEASE_TTL ({lease_ttl}s)")
        self.crawler = crawler
        self.stats = crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.max_call_adds = max(batch_size, 1000)
        self.local_dedupe_size = local_dedupe_size
        self._recent: set[int] = set()
        self._recent_old: set[int] = set()
        self.min_sync_interval = min_sync_interval
        self.idle_poll = idle_poll
        self.lease_ttl = lease_ttl
        self.heartbeat = heartbeat
        self.dead_max = dead_max
        self.invalid_max = invalid_max
        self.bloom = bloom
        self.callback_retry_times = callback_retry_times
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.node_base = node_id
        self._incarnation = 0
        self.spider = None
        self.policy: InputPolicy | None = None
        self._redis_outage = outage_log(crawler, "redis",
                                        f"Redis at {redact_url(redis_url_from_settings(crawler.settings))}")
        self._last_sweep = time.monotonic()
        self._warned_priority = False
        self.frontier: AsyncFrontier | None = None
        self._buffer: deque[tuple[str, Request]] = deque()
        self._held: dict[str, Request] = {}
        #: member -> the node id it was leased under (changes after a failed call)
        self._owners: dict[str, str] = {}
        self._scraping: set[str] = set()
        self._replaced: set[str] = set()
        self._failed: dict[str, tuple[str, str]] = {}
        self._outbox = Batch()
        self._remote_pending = 0
        self._remote_queued = 0
        self._remote_delayed = -1
        self._remote_inflight = 0
        self._stat_deltas: dict[str, int] = {}
        self._last_sync = 0.0
        self._last_maintenance = 0.0
        self._last_empty_take = 0.0
        self._last_report = time.monotonic()
        self.report_interval = crawler.settings.getfloat("SCHEDULER_LOG_INTERVAL", 60.0)
        self._closing = False
        self._flush_waiters: list[asyncio.Future] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Future | None = None

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        concurrency = s.getint("CONCURRENT_REQUESTS")
        return cls(
            crawler,
            prefetch=s.getint("SCHEDULER_PREFETCH") or max(4, concurrency // 4),
            batch_size=s.getint("SCHEDULER_BATCH_SIZE", 100),
            flush_interval=s.getfloat("SCHEDULER_FLUSH_INTERVAL", 0.05),
            min_sync_interval=s.getfloat("SCHEDULER_MIN_SYNC_INTERVAL", 0.02),
            local_dedupe_size=s.getint("SCHEDULER_LOCAL_DEDUPE_SIZE", 20_000),
            idle_poll=s.getfloat("SCHEDULER_IDLE_POLL", 0.2),
            lease_ttl=s.getfloat("SCHEDULER_LEASE_TTL", 10.0),
            heartbeat=s.getfloat("SCHEDULER_HEARTBEAT_INTERVAL", 2.0),
            bloom=BloomConfig.from_settings(s),
            callback_retry_times=s.getint("CALLBACK_RETRY_TIMES", 2),
            backoff_base=s.getfloat("RETRY_BACKOFF_BASE", 1.0),
            backoff_max=s.getfloat("RETRY_BACKOFF_MAX", 60.0),
            node_id=node_id(crawler),
            dead_max=s.getint("SCHEDULER_DEAD_MAX", DEAD_MAX),
            invalid_max=s.getint("SCHEDULER_INVALID_MAX", INVALID_MAX),
        )

    # -- Scrapy scheduler interface ------------------------------------------
    def open(self, spider):
        self._check_engine()
        self.spider = spider
        self.policy = InputPolicy.from_settings(self.crawler.settings, type(spider))
        client = redis_from_settings(self.crawler.settings, asyncio=True)
        self.frontier = AsyncFrontier(client, spider.name, self._node_id(),
                                      lease_ttl=self.lease_ttl, bloom=self.bloom,
                                      dead_max=self.dead_max, invalid_max=self.invalid_max)
        self.crawler.signals.connect(self._on_response, signal=signals.response_received)
        self.crawler.signals.connect(self._on_spider_error, signal=signals.spider_error)
        logger.info("Shared frontier for %r on %s as node %s (prefetch %d, lease %ss, "
                    "heartbeat %ss)", spider.name,
                    redact_url(redis_url_from_settings(self.crawler.settings)),
                    self.frontier.node, self.prefetch, self.lease_ttl, self.heartbeat,
                    extra={"spider": spider})
        self._task = asyncio.ensure_future(self._run())
        return None

    def close(self, reason: str):
        return deferred_from_coro(self._close(reason))

    def _check_engine(self) -> None:
        """Fail at open, loudly, if the engine lacks what acknowledgements need.

        A request is acknowledged once it leaves the engine's slot
        (``engine._slot.inprogress``, private to Scrapy); without it nothing
        would ever be acknowledged, silently.
        """
        slot = getattr(self.crawler.engine, "_slot", None)
        inprogress = getattr(slot, "inprogress", None)
        nextcall = getattr(slot, "nextcall", None)
        if not isinstance(inprogress, set) or not callable(getattr(nextcall, "schedule", None)):
            (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_SCRAPY
            raise RuntimeError(
                f"crawlproject.scheduler.RedisScheduler cannot run on Scrapy "
                f"{scrapy.__version__}: its engine has no _slot.inprogress set / "
                f"_slot.nextcall, which tell when a request is done (supported: Scrapy "
                f"{lo_major}.{lo_minor} to {hi_major}.{hi_minor}; see requirements.txt)")

    def has_pending_requests(self) -> bool:
        return bool(self._buffer or self._outbox.adds or self._remote_pending > 0)

    def enqueue_request(self, request: Request) -> bool:
        try:
            return self._enqueue(request)
        except Exception:  # never into the engine: it would stop reading start()
            logger.exception("Cannot enqueue %s", request, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/enqueue_errors")
            return False

    def _enqueue(self, request: Request) -> bool:
        member = request.meta.pop(LEASE_META, None)
        delay = request.meta.pop(RETRY_DELAY_META, 0)
        fp = None if request.dont_filter else self.fingerprinter.fingerprint(request)
        if fp is not None and self._seen_here(fp):
            # This node already sent it: the shared filter has it (or will have
            # it with the pending call); skip the encoding and the round trip.
            self._count("dupefilter/filtered")
            self.stats.inc_value("dupefilter/filtered_locally")
            return False
        try:
            payload = request_to_json(request, self.spider, self.policy)
        except RequestEncodeError as exc:
            logger.error("Cannot enqueue %s: %s", request, exc, extra={"spider": self.spider})
            self.stats.inc_value("scheduler/unserialisable")
            return False
        if member is not None and member in self._held and member not in self._scraping:
            # A downloader middleware (redirect, retry) replaced a leased request:
            # the old entry is done once the new one is in, in the same call.
            self._replaced.add(member)
            self._outbox.acks.append(member)
        if fp is not None:
            self._remember(fp)
        if abs(request.priority) > MAX_PRIORITY:
            self._priority_clamped(request)
        self._outbox.add(payload, fp, request.priority, int(delay * 1000))
        self.stats.inc_value("scheduler/enqueued/redis")
        if len(self._outbox.adds) >= self.batch_size or not self._buffer:
            # A full batch, or nothing prefetched: the engine may be waiting for
            # exactly these requests (e.g. the next listing page).
            self._wake.set()
        return True

    def _priority_clamped(self, request: Request) -> None:
        self.stats.inc_value("scheduler/priority_clamped")
        if not self._warned_priority:
            self._warned_priority = True
            logger.warning("Request priority %d of %s is outside ±%d: queued at ±%d (priorities "
                           "beyond that keep their order only up to the bound; counted in "
                           "scheduler/priority_clamped, not logged again)", request.priority,
                           request, MAX_PRIORITY, MAX_PRIORITY, extra={"spider": self.spider})

    def next_request(self) -> Request | None:
        if not self._buffer:
            self._wake.set()
            return None
        member, request = self._buffer.popleft()
        self._held[member] = request
        self.stats.inc_value("scheduler/dequeued/redis")
        if len(self._buffer) <= self.prefetch // 2:
            self._wake.set()
        return request

    def __len__(self) -> int:
        return len(self._buffer) + len(self._outbox.adds) + self._remote_queued

    def _seen_here(self, fp: bytes) -> bool:
        key = hash(fp)
        return key in self._recent or key in self._recent_old

    def _remember(self, fp: bytes) -> None:
        # Two generations of at most local_dedupe_size hashes each: bounded
        # memory, and the most recent fingerprints are always remembered.
        if len(self._recent) >= self.local_dedupe_size:
            self._recent_old, self._recent = self._recent, set()
        self._recent.add(hash(fp))

    def local_backlog(self) -> int:
        """Requests this node holds that Redis has not handed to the engine yet."""
        return len(self._buffer) + len(self._outbox.adds)

    def flushed(self) -> asyncio.Future:
        """A future that resolves once everything enqueued so far is in Redis."""
        future = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(future)
        self._wake.set()
        return future

    # -- failures reported by middlewares and signals --------------------------
    def mark_failed(self, request: Request, reason: str, kind: str = "download") -> None:
        """Dead-letter *request* when it leaves the engine (retries exhausted)."""
        member = request.meta.get(LEASE_META)
        if member in self._held:
            self._failed[member] = (kind, reason)

    def _on_response(self, response, request, spider):
        member = request.meta.get(LEASE_META)
        if member in self._held:
            self._scraping.add(member)

    def _on_spider_error(self, failure, response, spider):
        request = getattr(response, "request", None)
        member = request.meta.get(LEASE_META) if request is not None else None
        if member in self._held:
            exc = failure.value
            self._failed[member] = ("callback", f"{type(exc).__name__}: {exc}")

    # -- background loop ---------------------------------------------------------
    async def _run(self) -> None:
        errors = 0
        while not self._closing:
            try:
                pause = await self._tick()
                errors = 0
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                # Redis unreachable: keep everything, retry
                errors += 1
                self.stats.inc_value("scheduler/redis_errors")
                self._redis_outage.failed("frontier call", exc, {"spider": self.spider})
                await asyncio.sleep(backoff_delay(errors, 0.4, 5.0))
                continue
            except Exception:  # a bug: say so, keep the loop (and the leases) alive
                errors += 1
                self.stats.inc_value("scheduler/loop_errors")
                logger.exception("Frontier loop error; retrying", extra={"spider": self.spider})
                await asyncio.sleep(backoff_delay(errors, 0.4, 5.0))
                continue
            if pause:
                await asyncio.sleep(pause)
            else:
                await self._wait()

    async def _wait(self) -> None:
        busy = self._held or self._outbox or len(self._buffer) <= self.prefetch // 2
        timeout = self.flush_interval if busy else self.idle_poll
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _tick(self) -> float:
        """Send what is pending if it is time to; return how long to pause."""
        self._collect_done()
        now = time.monotonic()
        want = self.prefetch - len(self._buffer) if len(self._buffer) <= self.prefetch // 2 else 0
        if want and self._remote_queued == 0 and now - self._last_empty_take < self.idle_poll:
            want = 0  # the queue was empty a moment ago: poll it at idle pace
        maintenance = now - self._last_maintenance >= self.heartbeat or not (
            self._held or self._buffer)
        urgent = (not self._buffer and want) or self._flush_waiters or maintenance
        if not (self._outbox or want or urgent):
            return 0.0
        gap = self.min_sync_interval - (now - self._last_sync)
        if gap > 0 and not urgent and len(self._outbox.adds) < self.batch_size:
            return gap  # coalesce: more work per round trip
        waiters, self._flush_waiters = self._flush_waiters, []
        batch = self._next_batch()
        batch.adopt = self._adoptions()
        if self._outbox:
            waiters, self._flush_waiters = [], waiters  # resolved by a later call
            self._wake.set()
        batch.take = max(0, want)
        batch.maintenance = maintenance
        batch.sweep = maintenance and self._sweep_due(now)
        batch.promote = maintenance or self._remote_delayed != 0 or any(a[3] for a in batch.adds)
        try:
            result = await self.frontier.sync(batch)
        except Exception:
            self._requeue_batch(batch)
            self._flush_waiters[:0] = waiters
            raise
        self._redis_outage.ok({"spider": self.spider})
        for member, _ in batch.adopt:
            if member in self._owners:
                self._owners[member] = self.frontier.node
        # Forgotten only once the call that settles them went through: until
        # then a changed id must still adopt them for the settling call to count.
        for member in (*batch.acks, *(f[0] for f in batch.fails), *batch.nacks):
            self._owners.pop(member, None)
        self._last_sync = now
        if maintenance:
            self._last_maintenance = now
        if batch.sweep:
            self._last_sweep = now
        _resolve(waiters)
        self._apply(result, asked=batch.take)
        if now - self._last_report >= self.report_interval:
            self._last_report = now
            await self._report()
        return 0.0

    def _adoptions(self) -> list[tuple[str, str]]:
        """Leases this node holds under a former id of its own (see _requeue_batch)."""
        current = self.frontier.node
        return [(m, owner) for m, owner in self._owners.items() if owner != current]

    def _sweep_due(self, now: float) -> bool:
        # Entries held by an id that is not a registered node (an old frontier,
        # a hand-edited key) would never come back and would keep every node
        # from idle-closing. While this node holds nothing and others seem to,
        # check for such entries once per lease TTL.
        return (not self._held and self._remote_inflight > 0
                and now - self._last_sweep >= self.lease_ttl)

    def _next_batch(self) -> Batch:
        """The outbox, or its first ``max_call_adds`` new requests.

        One script call blocks Redis for every node while it runs, so a huge
        outbox (a callback yielding 10,000 links, or work kept through an
        outage) is sent in several calls. Acknowledgements wait for the last
        one: a request is never acknowledged before all its new requests are in.
        """
        if len(self._outbox.adds) <= self.max_call_adds:
            batch, self._outbox = self._outbox, Batch()
            return batch
        batch = Batch(adds=self._outbox.adds[:self.max_call_adds])
        self._outbox.adds = self._outbox.adds[self.max_call_adds:]
        return batch

    async def _report(self) -> None:
        logger.info("Frontier: %d queued, %d delayed, %d in flight across nodes; "
                    "%d prefetched here", self._remote_queued, max(0, self._remote_delayed),
                    self._remote_inflight, len(self._buffer), extra={"spider": self.spider})
        deltas, self._stat_deltas = self._stat_deltas, {}
        try:
            await self.frontier.add_stats(deltas)
        except Exception:
            self._stat_deltas = deltas
        await self._record_bloom_stats()

    def _requeue_batch(self, batch: Batch) -> None:
        """Keep the unsent work, and change identity: entries a lost reply may
        have leased to the old identity are reclaimed when its lease expires."""
        batch.take = 0
        batch.adopt = []  # recomputed for the next call
        batch.merge(self._outbox)
        self._outbox = batch
        self._incarnation += 1
        self.frontier.node = self._node_id()
        # The next call adopts what this node knows it holds (buffer, engine);
        # whatever else the old id got from a lost reply is reclaimed when the
        # old id expires.
        self._last_maintenance = 0.0  # register the new id at once

    def _count(self, name: str, value: int = 1) -> None:
        """A scheduler stat, also added to the cluster-wide counters."""
        if value:
            self.stats.inc_value(name, value)
            self._stat_deltas[name] = self._stat_deltas.get(name, 0) + value

    def _apply(self, result, asked: int) -> None:
        self._remote_queued = result.queued
        if result.delayed >= 0:
            self._remote_delayed = result.delayed
            self._remote_inflight = result.inflight
            self._remote_pending = (result.queued + result.delayed
                                    + max(0, result.inflight - len(self._held)))
        else:
            self._remote_pending = result.queued + max(0, self._remote_delayed)
        self._count("scheduler/added", result.added)
        self._count("dupefilter/filtered", result.duplicates)
        self._count("scheduler/stale", result.stale)
        self._count("scheduler/trimmed", result.trimmed)
        if result.stale:
            logger.warning("%d acknowledgement(s) for requests this node no longer held (its "
                           "lease had expired and another node took them): ignored",
                           result.stale, extra={"spider": self.spider})
        if result.missing:
            self._count("scheduler/invalid", result.missing)
            logger.error("%d queue entries had no payload: moved to %s", result.missing,
                         self.frontier.keys.invalid, extra={"spider": self.spider})
        if result.reclaimed:
            self._count("scheduler/reclaimed", result.reclaimed)
            logger.warning("Reclaimed %d requests leased by nodes that stopped answering",
                           result.reclaimed, extra={"spider": self.spider})
        if asked and not result.taken:
            self._last_empty_take = time.monotonic()
        for member, payload in result.taken:
            self._accept(member, payload)
        if result.taken:
            self._nudge_engine()

    def _accept(self, member: str, payload: bytes) -> None:
        try:
            request = request_from_json(payload, self.spider, self.policy)
        except RequestDecodeError as exc:
            logger.error("Invalid payload %s moved aside: %s", member, exc,
                         extra={"spider": self.spider})
            self._count("scheduler/invalid")
            self._outbox.fail(member, "invalid", {
                "member": member, "payload": payload.decode("utf-8", "replace"),
                "reason": str(exc), "node": self.frontier.node, "at": time.time()})
            return
        request.meta[LEASE_META] = member
        self._owners[member] = self.frontier.node
        self._buffer.append((member, request))

    def _nudge_engine(self) -> None:
        # The engine polls next_request() only every few seconds when it got
        # None; tell it new requests are here.
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def _collect_done(self) -> None:
        """Acknowledge (or retry / dead-letter) requests that left the engine."""
        # The engine keeps every request it took from us in its slot until the
        # request is fully processed (download, callback output, item pipelines).
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is None:
            return  # no engine slot: nothing can be known done; leases are kept
        inprogress = slot.inprogress
        for member, request in list(self._held.items()):
            if request in inprogress:
                continue
            del self._held[member]
            self._scraping.discard(member)
            if member in self._replaced:
                self._replaced.discard(member)
                continue
            failure = self._failed.pop(member, None)
            if failure is None:
                self._outbox.acks.append(member)
                self._count("scheduler/acked")
            else:
                self._handle_failure(member, request, *failure)

    def _handle_failure(self, member: str, request: Request, kind: str, reason: str) -> None:
        attempts = request.meta.get(CALLBACK_ATTEMPTS_META, 0) + 1
        if kind == "callback" and attempts <= self.callback_retry_times:
            retry = request.replace(dont_filter=True)
            retry.meta.pop(LEASE_META, None)
            retry.meta[CALLBACK_ATTEMPTS_META] = attempts
            delay = backoff_delay(attempts, self.backoff_base, self.backoff_max)
            try:
                payload = request_to_json(retry, self.spider, self.policy)
            except RequestEncodeError as exc:  # a callback put something odd in meta
                reason = f"{reason}; cannot be retried: {exc}"
            else:
                self._outbox.add(payload, None, retry.priority, int(delay * 1000))
                self._outbox.acks.append(member)
                self._count("scheduler/callback_retries")
                return
        request.meta.pop(LEASE_META, None)
        retries = request.meta.get("retry_times", 0)
        try:
            payload = request_to_json(request, self.spider, self.policy)
        except RequestEncodeError as exc:  # kept without a payload: visible, not replayable
            payload, reason = None, f"{reason}; request not storable: {exc}"
        record = {"member": member, "payload": payload,
                  "priority": request.priority, "url": request.url, "kind": kind,
                  "reason": reason, "attempts": (attempts if kind == "callback" else retries + 1),
                  "node": self.frontier.node, "at": time.time()}
        self._outbox.fail(member, "dead", record)
        self._count("scheduler/dead")
        self._count(f"scheduler/dead/{kind}")
        logger.error("Dead-lettered %s after %s attempt(s): %s", request, record["attempts"],
                     reason, extra={"spider": self.spider})

    async def _close(self, reason: str) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("Frontier loop failed", extra={"spider": self.spider})
        self._collect_done()
        unstarted = [m for m, _ in self._buffer] + list(self._held)
        batch, self._outbox = self._outbox, Batch()
        batch.adopt = self._adoptions()
        batch.nacks += unstarted
        self._owners.clear()
        await self._final_sync(batch)
        try:
            await self.frontier.add_stats(self._stat_deltas)
        except Exception:
            pass
        for waiter in self._flush_waiters:
            if not waiter.done():
                waiter.cancel()
        await self._record_bloom_stats()
        await self.frontier.client.aclose()

    async def _final_sync(self, batch: Batch) -> None:
        for attempt in range(3):
            try:
                result = await self.frontier.sync(batch, leaving=True)
                self._apply(result, asked=0)
                logger.info("Left the frontier: returned %d unstarted requests", len(batch.nacks),
                            extra={"spider": self.spider})
                return
            except Exception as exc:
                logger.error("Cannot reach Redis at close (%s); attempt %d/3", exc, attempt + 1,
                             extra={"spider": self.spider})
                await asyncio.sleep(1.0)
        logger.error("Gave up: %d new requests not sent; %d leased requests come back when "
                     "this node's lease expires", len(batch.adds), len(batch.nacks),
                     extra={"spider": self.spider})

    async def _record_bloom_stats(self) -> None:
        try:
            est = await self.frontier.bloom_estimates()
        except Exception:
            return
        if est["layers"]:
            self.stats.set_value("bloom/layers", est["layers"])
            self.stats.set_value("bloom/items", est["count"])
            self.stats.set_value("bloom/fill_ratio", round(est["fill_ratio"], 6))
            self.stats.set_value("bloom/est_fp_rate", est["est_fp_rate"])

    def _node_id(self) -> str:
        return self.node_base if not self._incarnation else f"{self.node_base}~{self._incarnation}"
