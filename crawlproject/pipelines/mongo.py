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
  on the key field is created at open. Writes are idempotent (see
  :mod:`crawlproject.pipelines.documents`): ``first_seen`` on insert only,
  ``updated_at`` when the content changes, a ``content_hash`` so an unchanged
  item is not rewritten. In ``auto`` mode (``MONGO_WRITE_MODE``) a batch of
  mostly new keys is inserted with one ``insert_many(ordered=False)`` and the
  keys that already existed (E11000) are upserted; otherwise every item is an
  ``UpdateOne(..., upsert=True)`` in one ``bulk_write(ordered=False)``. A
  duplicate-key race between nodes is retried as an update.
* Transient errors (connection lost, no primary, timeouts, retryable codes)
  are retried with exponential backoff for ``MONGO_SPOOL_AFTER`` seconds,
  then the batch goes to the spool (:mod:`crawlproject.pipelines.spool`) and
  later batches go straight there, until a background probe sees MongoDB
  answer and replays the spool. Spool segments left by a node that died are
  replayed by the next node started on the machine. Replays are upserts:
  nothing is written twice.
* The MongoDB password never reaches logs, stats or exception messages.

Stats (all ``mongo/...``): ``items``, ``batches``, ``upserted``, ``modified``,
``unchanged``, ``retries``, ``duplicate_key_retries``, ``spooled``,
``replayed``, ``outages``, ``failed`` (+ ``failed/<code>``),
``dropped/no_key``, ``dropped/unencodable``, ``spool_errors``,
``spool_corrupt_lines``, ``spool_left`` (spool files left at close).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import bson
import pymongo
from pymongo import ASCENDING, AsyncMongoClient, UpdateOne
from pymongo.errors import BulkWriteError, PyMongoError
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.utils.conf import closest_scrapy_cfg, get_config
from scrapy.utils.project import inside_project

from crawlproject.connection import mongo_client_options
from crawlproject.pipelines.documents import (
    WriteOp,
    insert_document,
    item_fields,
    to_mongo,
    upsert_update,
)
from crawlproject.pipelines.errors import (
    Scrubber,
    classify_write_error,
    is_auth_error,
    is_transient,
)
from crawlproject.pipelines.spool import Spool, target_dir
from crawlproject.validation import item_type_name

__all__ = ["MongoPipeline", "MongoPipelineError", "to_mongo"]

logger = logging.getLogger(__name__)

WRITE_MODES = ("auto", "upsert")
MIN_ATTEMPT_TIMEOUT = 1.0
PROBE_TIMEOUT = 2.0
DUPLICATE_RETRIES = 5
HEARTBEAT_MS = 1000


class MongoPipelineError(RuntimeError):
    """MongoDB cannot be used at all (bad credentials, unreachable at open...)."""


@dataclass(slots=True)
class _Pending:
    op: WriteOp
    future: asyncio.Future
    at: float


@dataclass
class _Outcome:
    """What a write attempt left: failed ops (with a reason) and ops to retry later."""

    failed: dict[int, str] = field(default_factory=dict)
    unavailable: list[WriteOp] = field(default_factory=list)
    error: str = ""


class MongoPipeline:
    """Store items in MongoDB (see the module docstring for the guarantees).

    Settings (read once, in :meth:`from_crawler`; see ``docs/pipelines.md``):
    ``MONGO_PIPELINE_ENABLED``, ``MONGO_URI``, ``MONGO_DATABASE``,
    ``MONGO_COLLECTION``, ``MONGO_UNIQUE_KEY``, ``MONGO_KEY_AS_ID``,
    ``MONGO_CLIENT_OPTIONS``, ``MONGO_BULK_SIZE``, ``MONGO_FLUSH_INTERVAL``,
    ``MONGO_FLUSH_WHEN_IDLE``, ``MONGO_CONCURRENT_WRITES``, ``MONGO_WRITE_MODE``,
    ``MONGO_SPOOL_AFTER``, ``MONGO_SPOOL_DIR``, ``MONGO_PROBE_INTERVAL``,
    ``MONGO_RETRY_BACKOFF_BASE``, ``MONGO_RETRY_BACKOFF_MAX``.
    """

    def __init__(self, crawler, *, uri: str, database: str, collection: str = "%(spider)s",
                 key: str = "url", client_options: dict[str, Any] | None = None,
                 key_as_id: bool = True, bulk_size: int = 500, flush_interval: float = 0.2,
                 write_mode: str = "auto", max_flushes: int = 2, flush_when_idle: bool = True,
                 spool_after: float = 5.0, spool_dir: str = "mongo-spool",
                 probe_interval: float = 1.0, backoff_base: float = 0.1,
                 backoff_max: float = 2.0):
        if write_mode not in WRITE_MODES:
            raise ValueError(f"MONGO_WRITE_MODE must be one of {WRITE_MODES}, got {write_mode!r}")
        if bulk_size < 1:
            raise ValueError(f"MONGO_BULK_SIZE must be >= 1, got {bulk_size}")
        self.crawler = crawler
        self.stats = crawler.stats
        self.uri = uri
        self.database = database
        self.collection_pattern = collection
        self.default_key = key
        self.key_as_id = key_as_id
        self.client_options = dict(client_options or {})
        if ("heartbeatfrequencyms" not in uri.lower()
                and "heartbeatFrequencyMS" not in self.client_options):
            # After "not primary" / "shutting down" errors pymongo waits for
            # the next server check: check every second, not every 10 s, so a
            # step-down is over well within MONGO_SPOOL_AFTER.
            self.client_options["heartbeatFrequencyMS"] = HEARTBEAT_MS
        self.bulk_size = bulk_size
        self.flush_interval = flush_interval
        self.write_mode = write_mode
        self.spool_after = spool_after
        self.spool_dir = spool_dir
        self.probe_interval = probe_interval
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.scrub = Scrubber(uri)
        self.client: AsyncMongoClient | None = None
        self.spool: Spool | None = None
        self._targets: dict[type, tuple[str, str]] = {}
        self._indexed: set[tuple[str, str, str]] = set()
        self._existing_ratio: dict[str, float] = {}
        self._pending: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task | None = None
        self._inflight: set[asyncio.Future] = set()
        self._writing = 0
        self.max_flushes = max_flushes
        self.flush_when_idle = flush_when_idle
        self._slots = asyncio.Semaphore(max_flushes)
        self._probe: asyncio.Task | None = None
        self._replay_lock = asyncio.Lock()
        self._outage = False
        self._outage_since = 0.0
        self._closing = False

    @classmethod
    def from_crawler(cls, crawler):
        """Build the pipeline from the crawler's settings (``NotConfigured`` when off)."""
        s = crawler.settings
        if not s.getbool("MONGO_PIPELINE_ENABLED", True):
            raise NotConfigured("MONGO_PIPELINE_ENABLED is off")
        uri = s.get("MONGO_URI")
        if not uri:
            raise NotConfigured("MONGO_URI is not set")
        spool_dir = s.get("MONGO_SPOOL_DIR") or "mongo-spool"
        return cls(
            crawler,
            uri=uri,
            database=s.get("MONGO_DATABASE") or "crawlproject",
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
            spool_dir=str(spool_path(spool_dir)),
            probe_interval=s.getfloat("MONGO_PROBE_INTERVAL", 1.0),
            backoff_base=s.getfloat("MONGO_RETRY_BACKOFF_BASE", 0.1),
            backoff_max=s.getfloat("MONGO_RETRY_BACKOFF_MAX", 2.0),
        )

    # -- lifecycle -----------------------------------------------------------
    async def open_spider(self) -> None:
        """Connect, check the key's unique index, open the spool, replay leftovers.

        Raises :class:`MongoPipelineError` (with the password scrubbed) when
        MongoDB refuses the credentials or cannot be reached.
        """
        spider = self.crawler.spider
        self.client = AsyncMongoClient(self.uri, **self.client_options)
        per_item = "%(item)" in self.collection_pattern
        collection = "<one per item type>" if per_item else self._collection_name(None)
        try:
            if per_item:  # no collection known yet: check we may read the database
                await self.client[self.database].list_collection_names(
                    filter={"name": collection})
            else:
                await self._ensure_index(self.database, collection, self.default_key,
                                         self.key_as_id)
        except PyMongoError as exc:
            await self._close_client()
            message = self._open_error_message(exc)
            logger.error("%s", message, extra={"spider": spider})
            raise MongoPipelineError(message) from None
        self.spool = Spool(target_dir(self.spool_dir, self.uri, self.database)).open()
        self._flusher = asyncio.ensure_future(self._flush_loop())
        logger.info("Storing items in %s, database %r, collection %r, unique on %r%s "
                    "(bulk %d, flush %.2fs, spool after %.1fs in %s)",
                    self.scrub.redacted, self.database, collection, self.default_key,
                    " (as _id)" if self.key_as_id else "",
                    self.bulk_size, self.flush_interval, self.spool_after,
                    self.spool.directory, extra={"spider": spider})
        if self.spool.replayable():
            logger.info("Replaying spooled items left by an earlier run", extra={"spider": spider})
            try:
                replayed = await self._replay()
            except Exception:
                logger.exception("Replaying the spool failed", extra={"spider": spider})
                replayed = False
            if not replayed:  # the probe keeps trying, new items go to the spool meanwhile
                self._enter_outage("the replay of the spool failed")

    async def close_spider(self) -> None:
        """Write everything still buffered, try a last replay, release the spool."""
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
        if self.spool is not None:
            if self._outage or self.spool.replayable():
                if await self._ping():
                    await self._replay()
            self.spool.close()
            files = self.spool.pending_files()
            if files:
                self.stats.set_value("mongo/spool_left", len(files))
                logger.warning("MongoDB still unreachable at close: %d spool file(s) stay in %s; "
                               "the next node started with this MONGO_SPOOL_DIR replays them",
                               len(files), self.spool.directory,
                               extra={"spider": self.crawler.spider})
        await self._close_client()

    async def _close_client(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.close()

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
            op = WriteOp.build(self.database, collection, key_field, item_fields(item),
                               key_as_id=self.key_as_id)
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
            logger.exception("MongoPipeline flush failed", extra={"spider": self.crawler.spider})
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
            outcome = await self._write([e.op for e in batch], budget=self.spool_after)
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
                         extra={"spider": self.crawler.spider})
            self._pending.extendleft(reversed(leftover))
            await asyncio.sleep(self.backoff_max)
            return
        if not spooled:  # MongoDB came back while we waited: write them normally
            self._pending.extendleft(reversed(leftover))
            return
        self.stats.inc_value("mongo/spooled", len(leftover))
        for entry in leftover:
            _settle(entry.future)

    # -- writing -------------------------------------------------------------
    async def _write(self, ops: list[WriteOp], budget: float, mode: str | None = None) -> _Outcome:
        """Write *ops*, retrying transient errors for *budget* seconds.

        Returns the ops that failed for good and those still unwritten when
        the budget ran out; every other op is stored.
        """
        outcome = _Outcome()
        deadline = time.monotonic() + budget
        pending = ops
        mode = mode or self.write_mode
        attempt = 0
        while pending:
            remaining = deadline - time.monotonic()
            try:
                with pymongo.timeout(max(remaining, MIN_ATTEMPT_TIMEOUT)):
                    retry = await self._write_once(pending, mode, outcome)
            except Exception as exc:
                if not is_transient(exc):
                    retry = await self._write_isolated(pending, exc, outcome)
                else:  # some ops may be done: the upsert retry is idempotent
                    retry = [op for op in pending if id(op) not in outcome.failed]
                outcome.error = self.scrub.exception(exc)[:400]
            if not retry:
                break
            attempt += 1
            mode = "upsert"  # an interrupted insert may have partly happened
            if time.monotonic() >= deadline:
                outcome.unavailable = retry
                break
            self.stats.inc_value("mongo/retries")
            delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
            delay = min(delay * random.uniform(0.5, 1.0), max(0.0, deadline - time.monotonic()))
            log = logger.warning if attempt == 1 else logger.debug
            log("MongoDB write of %d items failed (%s); retry %d in %.2fs", len(retry),
                outcome.error or "transient write errors", attempt, delay,
                extra={"spider": self.crawler.spider})
            await asyncio.sleep(delay)
            pending = retry
        return outcome

    async def _write_isolated(self, ops: list[WriteOp], exc: Exception,
                              outcome: _Outcome) -> list[WriteOp]:
        """A batch failed with a non-transient error: write its ops one by one
        so only the culprits fail. Returns the ops to retry."""
        if len(ops) == 1:
            self._fail(ops[0], self.scrub.exception(exc), outcome, code=getattr(exc, "code", None))
            return []
        retry: list[WriteOp] = []
        for op in ops:
            try:
                retry += await self._write_once([op], "upsert", outcome)
            except Exception as single:
                if is_transient(single):
                    retry.append(op)
                else:
                    self._fail(op, self.scrub.exception(single), outcome,
                               code=getattr(single, "code", None))
        return retry

    def _fail(self, op: WriteOp, reason: str, outcome: _Outcome, code: Any = None) -> None:
        outcome.failed[id(op)] = f"MongoDB refused {op.key_field}={op.key!r}: {reason}"
        self.stats.inc_value("mongo/failed")
        if code is not None:
            self.stats.inc_value(f"mongo/failed/{code}")
        logger.error("MongoDB refused %s=%r in %s: %s", op.key_field, op.key, op.collection,
                     reason, extra={"spider": self.crawler.spider})

    async def _write_once(self, ops: list[WriteOp], mode: str, outcome: _Outcome) -> list[WriteOp]:
        """One attempt; returns the ops to retry (transient per-op errors)."""
        groups: dict[tuple[str, str, str, bool], list[WriteOp]] = {}
        for op in ops:
            groups.setdefault((op.database, op.collection, op.key_field, op.key_as_id),
                              []).append(op)
        retry: list[WriteOp] = []
        for (database, collection, key_field, key_as_id), group in groups.items():
            await self._ensure_index(database, collection, key_field, key_as_id)
            coll = self.client[database][collection]
            if mode == "auto" and self._existing_ratio.get(collection, 0.0) < 0.5:
                to_upsert = await self._insert(coll, group, outcome, retry)
                existing = len(to_upsert)
            else:
                to_upsert, existing = group, None
            if to_upsert:
                matched = await self._upsert(coll, to_upsert, outcome, retry)
                existing = matched if existing is None else existing
            self._note_existing(collection, existing or 0, len(group))
        return retry

    async def _insert(self, coll, ops: list[WriteOp], outcome: _Outcome,
                      retry: list[WriteOp]) -> list[WriteOp]:
        """insert_many the batch; returns the ops whose key already existed."""
        existing: list[WriteOp] = []
        try:
            await coll.insert_many([insert_document(op) for op in ops], ordered=False)
            inserted = len(ops)
        except BulkWriteError as exc:
            details = exc.details
            inserted = details.get("nInserted", 0)
            if details.get("writeConcernErrors"):
                # Applied but not replicated as asked: upsert them all again (idempotent).
                existing = list(ops)
            else:
                for error in details.get("writeErrors", []):
                    op = ops[error["index"]]
                    kind = classify_write_error(error)
                    if kind == "duplicate":
                        existing.append(op)
                    elif kind == "transient":
                        retry.append(op)
                    else:
                        self._fail(op, self.scrub(error.get("errmsg", "")), outcome,
                                   code=error.get("code"))
        self.stats.inc_value("mongo/upserted", inserted)
        return existing

    async def _upsert(self, coll, ops: list[WriteOp], outcome: _Outcome,
                      retry: list[WriteOp]) -> int:
        """bulk_write conditional upserts; E11000 races are retried as updates.

        Returns how many keys already existed (matched)."""
        matched = 0
        for race in range(DUPLICATE_RETRIES + 1):
            requests = [UpdateOne(op.filter, upsert_update(op), upsert=True) for op in ops]
            duplicates: list[WriteOp] = []
            try:
                result = await coll.bulk_write(requests, ordered=False)
                details = result.bulk_api_result
            except BulkWriteError as exc:
                details = exc.details
                if details.get("writeConcernErrors"):
                    retry.extend(ops)
                    return matched
                for error in details.get("writeErrors", []):
                    op = ops[error["index"]]
                    kind = classify_write_error(error)
                    if kind == "duplicate" and race < DUPLICATE_RETRIES:
                        duplicates.append(op)
                    elif kind == "transient":
                        retry.append(op)
                    else:
                        self._fail(op, self.scrub(error.get("errmsg", "")), outcome,
                                   code=error.get("code"))
            upserted = details.get("nUpserted", 0)
            modified = details.get("nModified", 0)
            matched += details.get("nMatched", 0)
            self.stats.inc_value("mongo/upserted", upserted)
            self.stats.inc_value("mongo/modified", modified)
            self.stats.inc_value("mongo/unchanged", details.get("nMatched", 0) - modified)
            if not duplicates:
                break
            self.stats.inc_value("mongo/duplicate_key_retries", len(duplicates))
            ops = duplicates
        return matched

    def _note_existing(self, collection: str, existing: int, total: int) -> None:
        if total <= 0:
            return
        ratio = min(1.0, existing / total)
        previous = self._existing_ratio.get(collection, 0.0)
        self._existing_ratio[collection] = 0.5 * previous + 0.5 * ratio

    async def _ensure_index(self, database: str, collection: str, key_field: str,
                            key_as_id: bool) -> None:
        """Create the unique index on the key (once per collection).

        With the key as ``_id``, MongoDB's ``_id`` index is the unique index;
        asking for it anyway creates the collection and checks the user may
        write there (createIndexes needs the readWrite role).
        """
        marker = (database, collection, key_field, key_as_id)
        if marker in self._indexed:
            return
        coll = self.client[database][collection]
        if key_as_id:
            await coll.create_index([("_id", ASCENDING)], name="_id_")
        else:
            await coll.create_index([(key_field, ASCENDING)], unique=True)
        self._indexed.add(marker)

    # -- outages, spool and replay ---------------------------------------------
    def _enter_outage(self, reason: str) -> None:
        if self._outage:
            return
        self._outage = True
        self._outage_since = time.monotonic()
        self.stats.inc_value("mongo/outages")
        logger.error("MongoDB unavailable for more than %.1fs (%s): spooling items to %s until it "
                     "answers again", self.spool_after, reason or "unknown error",
                     self.spool.directory, extra={"spider": self.crawler.spider})
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_loop())

    def _leave_outage(self) -> None:
        self._outage = False
        logger.info("MongoDB answers again after %.1fs; the spool is replayed and empty",
                    time.monotonic() - self._outage_since, extra={"spider": self.crawler.spider})

    async def _ping(self) -> bool:
        if self.client is None:
            return False
        try:
            with pymongo.timeout(PROBE_TIMEOUT):
                await self.client.admin.command("ping")
            return True
        except PyMongoError:
            return False

    async def _probe_loop(self) -> None:
        while self._outage and not self._closing:
            await asyncio.sleep(self.probe_interval)
            if self._closing:
                return
            try:
                if await self._ping() and await self._replay():
                    return
            except Exception:  # e.g. the spool directory became unreadable: keep trying
                logger.exception("Replaying the spool failed; retrying",
                                 extra={"spider": self.crawler.spider})

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
                    if not await self._replay_segment(path):
                        return False

    async def _replay_segment(self, path) -> bool:
        segment = await self.spool.read(path)
        if segment.corrupt_lines:
            self.stats.inc_value("mongo/spool_corrupt_lines", segment.corrupt_lines)
        for start in range(0, len(segment.ops), self.bulk_size):
            chunk = segment.ops[start:start + self.bulk_size]
            outcome = await self._write(chunk, budget=self.spool_after, mode="upsert")
            if outcome.unavailable:
                logger.warning("Replay of %s interrupted (%s); retrying later", path,
                               outcome.error, extra={"spider": self.crawler.spider})
                return False
            self.stats.inc_value("mongo/replayed", len(chunk) - len(outcome.failed))
        await self.spool.remove(segment)
        logger.info("Replayed %d spooled items from %s", len(segment.ops), path.name,
                    extra={"spider": self.crawler.spider})
        return True


def spool_path(setting: str) -> Path:
    """``MONGO_SPOOL_DIR`` as a path: relative paths are under the project's
    data directory (``.scrapy/``, or ``[datadir]`` in scrapy.cfg), as with
    ``scrapy.utils.project.data_path`` but without its mkdir, which races
    when two nodes start at once on a fresh machine. Created on open."""
    path = Path(setting)
    if path.is_absolute():
        return path
    if inside_project():
        config = get_config()
        project = os.environ.get("SCRAPY_PROJECT", "default")
        if config.has_option("datadir", project):
            return Path(config.get("datadir", project), path)
        scrapy_cfg = closest_scrapy_cfg()
        if scrapy_cfg:
            return (Path(scrapy_cfg).parent / ".scrapy").resolve() / path
    return Path(".scrapy", path)


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
