"""MongoPipeline: buffered, idempotent MongoDB storage that survives outages.

Guarantee: ``process_item`` returns only once the item is durable, either
acknowledged by MongoDB or fsync'ed into the local spool. The scheduler
acknowledges a request only after its items came out of the pipelines, so a
node killed at any moment loses nothing: items still in memory belong to
requests that were never acknowledged and are crawled again.

How:

* Items are buffered and written in bulk: a batch is written when it holds
  ``MONGO_BULK_SIZE`` items, when its oldest item waited
  ``MONGO_FLUSH_INTERVAL`` seconds, at close, and (``MONGO_FLUSH_WHEN_IDLE``)
  at once when no write is in flight; at most ``MONGO_CONCURRENT_WRITES``
  writes are in flight. Each ``process_item`` awaits a future that the flush
  resolves; many requests are in flight at once, so batches form on their own
  while MongoDB is busy (group commit).
* Documents are keyed on a unique field per item type (``mongo_key`` class
  attribute, else ``MONGO_UNIQUE_KEY``, default ``url``). With
  ``MONGO_KEY_AS_ID`` (default) the key is also the ``_id``, so MongoDB's own
  unique ``_id`` index keeps one document per key; otherwise a unique index
  on the key field is created at open. The writes themselves (insert first or
  upsert, retries, idempotence) are :class:`~.writer.MongoWriter`'s.
* Transient errors are retried with backoff for ``MONGO_SPOOL_AFTER``
  seconds, then the batch goes to the spool (:mod:`crawlproject.pipelines.spool`)
  and later batches go straight there, until a background probe sees MongoDB
  answer and replays the spool. Spool segments left by a node that died are
  replayed by the next node started on the machine. Replays are upserts:
  nothing is written twice.
* A node does not idle-close while MongoDB is unreachable and items are
  spooled, for at most ``MONGO_CLOSE_WAIT`` seconds; then it closes with the
  finish reason ``mongo_unavailable``, hands its spool to Redis
  (:mod:`.handoff`, ``MONGO_SPOOL_HANDOFF``) so that any node replays it, and
  logs one ERROR with what is left and where.
* The MongoDB password never reaches logs, stats or exception messages.

Stats (all ``mongo/...``): ``items``, ``batches``, ``upserted``, ``modified``,
``unchanged``, ``retries``, ``duplicate_key_retries``, ``spooled``,
``replayed``, ``handoff_replayed``, ``outages``, ``failed`` (+ ``failed/<code>``),
``dropped/no_key``, ``dropped/unencodable``, ``spool_errors``,
``spool_corrupt_lines``; at close, when MongoDB is still down:
``spool_left_items`` (items not stored), ``spool_handed_off`` (of which
handed to Redis), ``spool_left`` (spool files left on this machine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import bson
from pymongo.errors import PyMongoError
from scrapy import signals
from scrapy.exceptions import CloseSpider, DontCloseSpider, DropItem, NotConfigured

from crawlproject.connection import (
    mongo_client_options,
    mongo_database_from_settings,
    mongo_uri_from_settings,
    redis_from_settings,
    redis_url_from_settings,
    setting,
)
from crawlproject.identity import node_id
from crawlproject.keys import FrontierKeys
from crawlproject.pipelines.documents import WriteOp, gone_op, item_fields, to_mongo
from crawlproject.pipelines.errors import MongoPipelineError, Scrubber, is_auth_error
from crawlproject.pipelines.handoff import RedisHandoff
from crawlproject.pipelines.replay import replay_segment
from crawlproject.pipelines.spool import Spool, count_records, spool_path, target_dir
from crawlproject.pipelines.writer import MongoWriter
from crawlproject.validation import item_type_name

__all__ = ["MongoPipeline", "MongoPipelineError", "to_mongo", "spool_path",
           "CLOSE_REASON"]

logger = logging.getLogger(__name__)

#: Finish reason of a node that stopped waiting for MongoDB (see ``MONGO_CLOSE_WAIT``).
CLOSE_REASON = "mongo_unavailable"
REPLAY_COMMAND = "python -m crawlproject.cli spool-replay"


@dataclass(slots=True)
class _Pending:
    op: WriteOp
    future: asyncio.Future
    at: float


class MongoPipeline:
    """Store items in MongoDB (see the module docstring for the guarantees).

    Settings (read once, in :meth:`from_crawler`; see ``docs/pipelines.md``):
    ``MONGO_PIPELINE_ENABLED``, ``MONGO_URI``, ``MONGO_DATABASE``,
    ``MONGO_COLLECTION``, ``MONGO_UNIQUE_KEY``, ``MONGO_KEY_AS_ID``,
    ``MONGO_CLIENT_OPTIONS``, ``MONGO_BULK_SIZE``, ``MONGO_FLUSH_INTERVAL``,
    ``MONGO_FLUSH_WHEN_IDLE``, ``MONGO_CONCURRENT_WRITES``, ``MONGO_WRITE_MODE``,
    ``MONGO_SPOOL_AFTER``, ``MONGO_SPOOL_DIR``, ``MONGO_PROBE_INTERVAL``,
    ``MONGO_RETRY_BACKOFF_BASE``, ``MONGO_RETRY_BACKOFF_MAX``,
    ``MONGO_CLOSE_WAIT``, ``MONGO_SPOOL_HANDOFF``, ``MONGO_SPOOL_HANDOFF_MAX_MB``.
    ``MONGO_URI``, ``MONGO_DATABASE`` and ``MONGO_SPOOL_DIR`` fall back to the
    environment variables of the same name.

    *redis* (an asyncio Redis client, or ``None``) receives the spool of a
    node that closes while MongoDB is down.
    """

    def __init__(self, crawler, *, uri: str, database: str, collection: str = "%(spider)s",
                 key: str = "url", client_options: dict[str, Any] | None = None,
                 key_as_id: bool = True, bulk_size: int = 500, flush_interval: float = 0.2,
                 write_mode: str = "auto", max_flushes: int = 2, flush_when_idle: bool = True,
                 spool_after: float = 5.0, spool_dir: str = "mongo-spool",
                 probe_interval: float = 1.0, backoff_base: float = 0.1,
                 backoff_max: float = 2.0, close_wait: float = 300.0, redis=None,
                 redis_url: str = "", handoff_max_bytes: int = 256 << 20):
        if bulk_size < 1:
            raise ValueError(f"MONGO_BULK_SIZE must be >= 1, got {bulk_size}")
        self.crawler = crawler
        self.stats = crawler.stats
        self.writer = MongoWriter(uri, client_options=client_options, stats=crawler.stats,
                                  write_mode=write_mode, backoff_base=backoff_base,
                                  backoff_max=backoff_max)
        self.uri = uri
        self.database = database
        self.collection_pattern = collection
        self.default_key = key
        self.key_as_id = key_as_id
        self.bulk_size = bulk_size
        self.flush_interval = flush_interval
        self.spool_after = spool_after
        self.spool_dir = spool_dir
        self.probe_interval = probe_interval
        self.backoff_max = backoff_max
        self.close_wait = close_wait
        self.redis = redis
        self.redis_scrub = Scrubber(redis_url)
        self.handoff_max_bytes = handoff_max_bytes
        self.handoff: RedisHandoff | None = None
        self.scrub = self.writer.scrub
        self.spool: Spool | None = None
        self.clock = time.monotonic  # of the close wait (tests replace it)
        self._targets: dict[type, tuple[str, str]] = {}
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task | None = None
        self._inflight: set[asyncio.Future] = set()
        self._writing = 0
        self.max_flushes = max_flushes
        self.flush_when_idle = flush_when_idle
        self._slots = asyncio.Semaphore(max_flushes)
        self._probe: asyncio.Task | None = None
        self._drain: asyncio.Task | None = None
        self._replay_lock = asyncio.Lock()
        self._outage = False
        self._outage_since = 0.0
        self._held_since: float | None = None
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler):
        """Build the pipeline from the crawler's settings (``NotConfigured`` when off)."""
        s = crawler.settings
        if not s.getbool("MONGO_PIPELINE_ENABLED", True):
            raise NotConfigured("MONGO_PIPELINE_ENABLED is off")
        redis = None
        if s.getbool("MONGO_SPOOL_HANDOFF", True):
            try:
                # Short timeouts: the handoff runs while the node is closing.
                redis = redis_from_settings(s, asyncio=True, socket_connect_timeout=5,
                                            socket_timeout=10)
            except ValueError as exc:
                logger.warning("MONGO_SPOOL_HANDOFF is on but REDIS_URL is not usable (%s): "
                               "a spool left at close stays on this machine", exc)
        pipeline = cls(
            crawler,
            uri=mongo_uri_from_settings(s),
            database=mongo_database_from_settings(s),
            collection=s.get("MONGO_COLLECTION") or "%(spider)s",
            key=s.get("MONGO_UNIQUE_KEY") or "url",
            key_as_id=s.getbool("MONGO_KEY_AS_ID", True),
            client_options=mongo_client_options(s),
            bulk_size=s.getint("MONGO_BULK_SIZE", 500),
            flush_interval=s.getfloat("MONGO_FLUSH_INTERVAL", 0.2),
            write_mode=(s.get("MONGO_WRITE_MODE") or "auto").lower(),
            max_flushes=max(1, s.getint("MONGO_CONCURRENT_WRITES", 2)),
            flush_when_idle=s.getbool("MONGO_FLUSH_WHEN_IDLE", True),
            spool_after=s.getfloat("MONGO_SPOOL_AFTER", 5.0),
            spool_dir=str(spool_path(setting(s, "MONGO_SPOOL_DIR", "mongo-spool"))),
            probe_interval=s.getfloat("MONGO_PROBE_INTERVAL", 1.0),
            backoff_base=s.getfloat("MONGO_RETRY_BACKOFF_BASE", 0.1),
            backoff_max=s.getfloat("MONGO_RETRY_BACKOFF_MAX", 2.0),
            close_wait=max(0.0, s.getfloat("MONGO_CLOSE_WAIT", 300.0)),
            redis=redis,
            redis_url=redis_url_from_settings(s) if redis is not None else "",
            handoff_max_bytes=int(s.getfloat("MONGO_SPOOL_HANDOFF_MAX_MB", 256) * 2**20),
        )
        crawler.signals.connect(pipeline._on_spider_idle, signal=signals.spider_idle)
        return pipeline

    @property
    def _extra(self) -> dict:
        return {"spider": self.crawler.spider}

    # -- lifecycle -----------------------------------------------------------
    async def open_spider(self) -> None:
        """Connect, check the key's unique index, open the spool, replay leftovers.

        Raises :class:`MongoPipelineError` (with the password scrubbed) when
        MongoDB refuses the credentials or cannot be reached.
        """
        self.writer.log_extra = self._extra
        per_item = "%(item)" in self.collection_pattern
        collection = "<one per item type>" if per_item else self._collection_name(None)
        try:
            if per_item:  # no collection known yet: check we may read the database
                await self.writer.client[self.database].list_collection_names(
                    filter={"name": collection})
            else:
                await self.writer.ensure_index(self.database, collection, self.default_key,
                                               self.key_as_id)
        except PyMongoError as exc:
            await self._close_clients()
            message = self._open_error_message(exc)
            logger.error("%s", message, extra=self._extra)
            raise MongoPipelineError(message) from None
        directory = target_dir(self.spool_dir, self.uri, self.database)
        self.spool = Spool(directory, owner=node_id(self.crawler)).open()
        if self.redis is not None:
            key = FrontierKeys(self.crawler.spider.name).mongo_spool(directory.name)
            self.handoff = RedisHandoff(self.redis, key, self.database)
        self._flusher = asyncio.ensure_future(self._flush_loop())
        logger.info("Storing items in %s, database %r, collection %r, unique on %r%s "
                    "(bulk %d, flush %.2fs, spool after %.1fs in %s, close wait %.0fs)",
                    self.scrub.redacted, self.database, collection, self.default_key,
                    " (as _id)" if self.key_as_id else "",
                    self.bulk_size, self.flush_interval, self.spool_after,
                    self.spool.directory, self.close_wait, extra=self._extra)
        if self.spool.replayable():
            logger.info("Replaying spooled items left by an earlier run", extra=self._extra)
            try:
                replayed = await self._replay()
            except Exception:
                logger.exception("Replaying the spool failed", extra=self._extra)
                replayed = False
            if not replayed:  # the probe keeps trying, new items go to the spool meanwhile
                self._enter_outage("the replay of the spool failed")
        if not self._outage:
            self._start_drain()

    async def close_spider(self) -> None:
        """Write everything still buffered, try a last replay; if MongoDB is
        still down, hand the spool to Redis and report what is left."""
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            await self._flusher
        if self._probe is not None:
            self._probe.cancel()
            try:
                await self._probe
            except (asyncio.CancelledError, Exception):
                pass
        if self._drain is not None:
            await self._drain  # stops by itself if MongoDB stops answering
        if self.spool is not None:
            if self._outage or self.spool.replayable():
                if await self.writer.ping():
                    await self._replay()
            await self._report_leftovers()
            self.spool.close()
        await self._close_clients()

    async def _close_clients(self) -> None:
        await self.writer.close()
        if self.redis is not None:
            redis, self.redis = self.redis, None
            await redis.aclose()

    def _on_spider_idle(self) -> None:
        """Hold the idle close while items are spooled and MongoDB is down.

        Items in a local spool are lost with the machine (ephemeral
        containers), so wait up to ``MONGO_CLOSE_WAIT`` seconds for the probe
        to replay them; then close with a finish reason of its own.
        """
        if not self._outage or self.spool is None:
            self._held_since = None
            return
        now = self.clock()
        if self._held_since is None:
            self._held_since = now
            if self.close_wait > 0:
                logger.warning("Not closing yet: MongoDB is unreachable and items are spooled "
                               "in %s; waiting up to %.0fs for it to answer (MONGO_CLOSE_WAIT)",
                               self.spool.directory, self.close_wait, extra=self._extra)
        if now - self._held_since < self.close_wait:
            raise DontCloseSpider
        logger.warning("MongoDB still unreachable after %.0fs of MONGO_CLOSE_WAIT: closing "
                       "(finish reason %r)", now - self._held_since, CLOSE_REASON,
                       extra=self._extra)
        raise CloseSpider(CLOSE_REASON)

    def _open_error_message(self, exc: PyMongoError) -> str:
        where = f"MongoDB at {self.scrub.redacted} (database {self.database!r})"
        if is_auth_error(exc):
            user, source = _user_and_auth_source(self.uri, self.database)
            if user:
                return (f"{where} refused the credentials of user {user!r} "
                        f"(authSource {source!r}): check the user name, password and "
                        f"authSource in MONGO_URI [{self.scrub.exception(exc)}]")
            return (f"{where} requires authentication: put a user and password in MONGO_URI "
                    f"[{self.scrub.exception(exc)}]")
        return f"{where} is not usable: {self.scrub.exception(exc)}"

    # -- items ---------------------------------------------------------------
    async def process_item(self, item: Any) -> Any:
        """Buffer *item* and return once it is in MongoDB or in the spool."""
        cls = type(item)
        target = self._targets.get(cls)
        if target is None:
            target = self._targets[cls] = (self._collection_name(cls), self._key_field(cls))
        collection, key_field = target
        try:
            kind = getattr(cls, "mongo_write", "item")
            if kind == "gone":
                op = gone_op(self.database, item, self.key_as_id)
            else:
                op = WriteOp.build(self.database, collection, key_field, item_fields(item),
                                   key_as_id=self.key_as_id, kind=kind)
        except KeyError:
            self.stats.inc_value("mongo/dropped/no_key")
            raise DropItem(f"{item_type_name(item)} has no usable {key_field!r} (missing, None "
                           f"or not a scalar): not stored") from None
        except (bson.errors.BSONError, OverflowError, TypeError, ValueError) as exc:
            self.stats.inc_value("mongo/dropped/unencodable")
            raise DropItem(f"{item_type_name(item)} cannot be stored in BSON: {exc}") from None
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(op, future, time.monotonic()))
        self.stats.inc_value("mongo/items")
        if len(self._pending) == 1 or len(self._pending) >= self.bulk_size:
            self._wake.set()
        # If this coroutine is cancelled, the future is too; the item is still
        # written with its batch (harmless: writes are idempotent).
        await future
        return item

    def _collection_name(self, cls: type | None) -> str:
        pattern = getattr(cls, "mongo_collection", None) or self.collection_pattern
        item = cls.__name__.lower() if cls else ""
        return pattern % {"spider": self.crawler.spider.name, "item": item}

    def _key_field(self, cls: type) -> str:
        return getattr(cls, "mongo_key", None) or self.default_key

    # -- flushing ------------------------------------------------------------
    async def _flush_loop(self) -> None:
        """Start a flush when the buffer is full, when its oldest item is
        ``flush_interval`` old, at close, and (``flush_when_idle``) as soon as
        no write is in flight. At most ``max_flushes`` writes are in flight; a
        batch is taken only when a write slot is free, so it grows meanwhile
        (group commit: the busier MongoDB is, the bigger the batches)."""
        while True:
            if not self._pending:
                if self._closing:
                    if not self._inflight:
                        return
                    await asyncio.wait(set(self._inflight))
                    continue  # a flush may have put items back
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._closing and len(self._pending) < self.bulk_size:
                if self.flush_when_idle and not self._writing:
                    await asyncio.sleep(0)  # let the items of this burst land first
                else:
                    wait = self.flush_interval - (time.monotonic() - self._pending[0].at)
                    if wait > 0:
                        self._wake.clear()
                        try:
                            await asyncio.wait_for(self._wake.wait(), wait)
                        except asyncio.TimeoutError:
                            pass
                        continue
            await self._slots.acquire()
            if not self._pending:
                self._slots.release()
                continue
            count = min(self.bulk_size, len(self._pending))
            batch = [self._pending.popleft() for _ in range(count)]
            self._writing += 1
            task = asyncio.ensure_future(self._flush_guarded(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _flush_guarded(self, batch: list[_Pending]) -> None:
        try:
            await self._flush(batch)
        except Exception as exc:  # a bug: never leave process_item waiting forever
            logger.exception("MongoPipeline flush failed", extra=self._extra)
            for entry in batch:
                _settle(entry.future, RuntimeError(f"MongoPipeline flush failed: {exc!r}"))
        finally:
            self._writing -= 1
            self._slots.release()
            self._wake.set()

    async def _flush(self, batch: list[_Pending]) -> None:
        self.stats.inc_value("mongo/batches")
        leftover = batch
        if not self._outage:
            outcome = await self.writer.write([e.op for e in batch], budget=self.spool_after)
            unavailable = {id(op) for op in outcome.unavailable}
            leftover = []
            for entry in batch:
                key = id(entry.op)
                if key in unavailable:
                    leftover.append(entry)
                elif key in outcome.failed:
                    _settle(entry.future, DropItem(outcome.failed[key]))
                else:
                    _settle(entry.future)
            if not leftover:
                return
            self._enter_outage(outcome.error)
        try:
            async with self.spool.lock:
                spooled = self._outage
                if spooled:
                    await self.spool.append_locked([e.op for e in leftover])
        except OSError as exc:
            self.stats.inc_value("mongo/spool_errors")
            logger.error("Cannot write the spool in %s (%s); keeping %d items in memory and "
                         "retrying", self.spool.directory, exc, len(leftover),
                         extra=self._extra)
            self._pending.extendleft(reversed(leftover))
            await asyncio.sleep(self.backoff_max)
            return
        if not spooled:  # MongoDB came back while we waited: write them normally
            self._pending.extendleft(reversed(leftover))
            return
        self.stats.inc_value("mongo/spooled", len(leftover))
        for entry in leftover:
            _settle(entry.future)

    # -- outages, spool and replay ---------------------------------------------
    def _enter_outage(self, reason: str) -> None:
        if self._outage:
            return
        self._outage = True
        self._outage_since = time.monotonic()
        self.stats.inc_value("mongo/outages")
        logger.error("MongoDB unavailable for more than %.1fs (%s): spooling items to %s until it "
                     "answers again", self.spool_after, reason or "unknown error",
                     self.spool.directory, extra=self._extra)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_loop())

    def _leave_outage(self) -> None:
        self._outage = False
        logger.info("MongoDB answers again after %.1fs; the spool is replayed and empty",
                    time.monotonic() - self._outage_since, extra=self._extra)
        self._start_drain()  # nodes that closed meanwhile may have handed items over

    async def _probe_loop(self) -> None:
        while self._outage and not self._closing:
            await asyncio.sleep(self.probe_interval)
            if self._closing:
                return
            try:
                if await self.writer.ping() and await self._replay():
                    return
            except Exception:  # e.g. the spool directory became unreadable: keep trying
                logger.exception("Replaying the spool failed; retrying", extra=self._extra)

    async def _replay(self) -> bool:
        """Write every replayable spool segment; True when the spool is empty
        (then the outage, if any, is over)."""
        async with self._replay_lock:
            while True:
                if self._outage or self.spool.active_records:
                    await self.spool.seal()
                paths = self.spool.replayable()
                if not paths:
                    async with self.spool.lock:
                        if self.spool.active_records == 0:
                            if self._outage:
                                self._leave_outage()
                            return True
                    continue
                for path in paths:
                    if await replay_segment(self.writer, self.spool, path,
                                            bulk_size=self.bulk_size,
                                            budget=self.spool_after) is None:
                        return False

    # -- handoff through Redis -------------------------------------------------
    def _start_drain(self) -> None:
        if self.handoff is not None and not self._closing and (
                self._drain is None or self._drain.done()):
            self._drain = asyncio.ensure_future(self._drain_handoff())

    async def _drain_handoff(self) -> None:
        """Store the items other nodes handed over to Redis (in the background)."""
        try:
            await self.handoff.drain(self.writer, bulk_size=self.bulk_size,
                                     budget=self.spool_after, log_extra=self._extra)
        except Exception as exc:  # Redis down: they wait for the next node or the next outage end
            logger.warning("Cannot replay the spooled items handed over in Redis list %s (%s); "
                           "set MONGO_SPOOL_HANDOFF = False if this project has no Redis",
                           self.handoff.key, self.redis_scrub.exception(exc)[:300],
                           extra=self._extra)

    async def _report_leftovers(self) -> None:
        """MongoDB is still down at close: hand what this node spooled (and
        adopted) to Redis, and log one ERROR with what is left and where."""
        await self.spool.seal()
        paths = self.spool.replayable()
        if not paths:
            return
        if self.handoff is None:
            handed, reason = 0, "MONGO_SPOOL_HANDOFF is off"
        else:
            handed, reason = await self._hand_off(paths)
        kept_paths = [path for path in paths if path.exists()]
        kept = await asyncio.to_thread(count_records, kept_paths)
        if handed + kept == 0:
            return
        self.stats.set_value("mongo/spool_left_items", handed + kept)
        if handed:
            self.stats.set_value("mongo/spool_handed_off", handed)
        if kept_paths:
            self.stats.set_value("mongo/spool_left", len(kept_paths))
        directory = self.spool.directory
        if not kept:
            logger.error("MongoDB still unreachable at close: %d items not stored were moved "
                         "from the spool in %s to Redis list %s; any node of this spider "
                         "stores them when MongoDB answers (or run: %s --spider %s)",
                         handed, directory, self.handoff.key, REPLAY_COMMAND,
                         self.crawler.spider.name, extra=self._extra)
            return
        moved = (f", {handed} moved to Redis list {self.handoff.key}" if handed else "")
        logger.error("MongoDB still unreachable at close: %d items not stored%s, %d left in "
                     "%d spool file(s) in %s (not handed to Redis: %s); replay them with: "
                     "%s --spool-dir %s (or start a node with this MONGO_SPOOL_DIR)",
                     handed + kept, moved, kept, len(kept_paths), directory, reason,
                     REPLAY_COMMAND, self.spool_dir, extra=self._extra)

    async def _hand_off(self, paths) -> tuple[int, str]:
        """Push whole segments to Redis, deleting each once pushed.

        Returns the items moved and, if some stay, why. A crash between a push
        and the delete leaves the items in both places: replayed twice, harmlessly.
        """
        room = self.handoff_max_bytes
        handed = 0
        for path in paths:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size > room:
                return handed, f"over MONGO_SPOOL_HANDOFF_MAX_MB ({self.handoff_max_bytes >> 20})"
            segment = await self.spool.read(path)
            try:
                await self.handoff.push(segment.ops)
            except Exception as exc:
                return handed, f"Redis: {self.redis_scrub.exception(exc)[:300]}"
            await self.spool.remove(segment)
            room -= size
            handed += len(segment.ops)
        return handed, ""


def _settle(future: asyncio.Future, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
        future.exception()  # mark retrieved: the awaiting process_item may be gone


def _user_and_auth_source(uri: str, database: str) -> tuple[str, str]:
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "", ""
    userinfo = parts.netloc.rpartition("@")[0]
    user = unquote(userinfo.split(":", 1)[0]) if userinfo else ""
    query = {k.lower(): v for k, v in parse_qs(parts.query).items()}
    source = (query.get("authsource") or [""])[-1] or parts.path.lstrip("/") or "admin"
    return user, source
