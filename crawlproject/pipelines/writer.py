"""MongoWriter: idempotent bulk writes of :class:`WriteOp`\\ s, retried through
transient errors.

The part of MongoDB storage that needs no Scrapy crawler, shared by
:class:`~crawlproject.pipelines.mongo.MongoPipeline` (buffered items),
spool replays and ``python -m crawlproject.cli spool-replay``:

* in ``auto`` mode a batch of mostly new keys is sent as one
  ``insert_many(ordered=False)`` and the keys that already existed (E11000)
  are upserted; otherwise every op is an ``UpdateOne(..., upsert=True)`` in
  one ``bulk_write(ordered=False)`` (see :mod:`.documents` for why they are
  idempotent). A duplicate-key race between writers is retried as an update.
  Ops of kind ``gone`` and ``touch`` are updates that never insert
  (``mongo/marked_gone``, ``mongo/touched``).
* transient errors (see :func:`.errors.is_transient`) are retried with
  jittered exponential backoff (:func:`crawlproject.backoff.backoff_delay`)
  until the caller's budget runs out; a batch refused as a whole for another
  reason is retried op by op so only the culprits fail.

Stats (``mongo/...``) go to any object with ``inc_value`` (Scrapy's stats
collector, or :class:`Counters`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pymongo
from pymongo import ASCENDING, UpdateOne
from pymongo.errors import BulkWriteError, PyMongoError

from crawlproject.backoff import backoff_delay
from crawlproject.connection import mongo_client
from crawlproject.pipelines.documents import (
    WriteOp,
    gone_update,
    insert_document,
    touch_update,
    upsert_update,
)
from crawlproject.pipelines.errors import Scrubber, classify_write_error, is_transient

__all__ = ["MongoWriter", "WriteOutcome", "Counters"]

logger = logging.getLogger(__name__)

WRITE_MODES = ("auto", "upsert")
MIN_ATTEMPT_TIMEOUT = 1.0
PROBE_TIMEOUT = 2.0
DUPLICATE_RETRIES = 5
HEARTBEAT_MS = 1000


class Counters(dict):
    """A minimal stats collector for code that runs without Scrapy."""

    def inc_value(self, key: str, count: int = 1, start: int = 0) -> None:
        self[key] = self.get(key, start) + count

    def get_value(self, key: str, default: Any = None) -> Any:
        return self.get(key, default)

    def set_value(self, key: str, value: Any) -> None:
        self[key] = value


@dataclass
class WriteOutcome:
    """What a write left: failed ops (``id(op)`` → reason) and ops still unwritten."""

    failed: dict[int, str] = field(default_factory=dict)
    unavailable: list[WriteOp] = field(default_factory=list)
    error: str = ""


class MongoWriter:
    """Writes :class:`WriteOp`\\ s to the MongoDB at *uri* (see the module docstring).

    *client_options* are pymongo client options (the pipeline passes
    ``MONGO_CLIENT_OPTIONS``); *log_extra* is passed to every log call
    (``{"spider": spider}`` in a crawl). The client is created on first use
    by :func:`crawlproject.connection.mongo_client`.
    """

    def __init__(self, uri: str, *, client_options: dict[str, Any] | None = None, stats=None,
                 write_mode: str = "auto", backoff_base: float = 0.1, backoff_max: float = 2.0,
                 log_extra: dict | None = None):
        if write_mode not in WRITE_MODES:
            raise ValueError(f"MONGO_WRITE_MODE must be one of {WRITE_MODES}, got {write_mode!r}")
        self.uri = uri
        self.client_options = dict(client_options or {})
        if ("heartbeatfrequencyms" not in uri.lower()
                and "heartbeatFrequencyMS" not in self.client_options):
            # After "not primary" / "shutting down" errors pymongo waits for
            # the next server check: check every second, not every 10 s, so a
            # step-down is over well within MONGO_SPOOL_AFTER.
            self.client_options["heartbeatFrequencyMS"] = HEARTBEAT_MS
        self.stats = stats if stats is not None else Counters()
        self.write_mode = write_mode
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.log_extra = log_extra or {}
        self.scrub = Scrubber(uri)
        self.last_error = ""
        self._client = None
        self._indexed: set[tuple[str, str, str, bool]] = set()
        self._existing_ratio: dict[str, float] = {}

    @property
    def client(self):
        """The ``AsyncMongoClient`` (created on first use)."""
        if self._client is None:
            self._client = mongo_client(self.uri, asyncio=True, **self.client_options)
        return self._client

    async def close(self) -> None:
        """Close the client, if one was created."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def check(self, timeout: float = PROBE_TIMEOUT) -> None:
        """Ping the server; raises ``PyMongoError`` when it does not answer in *timeout* s."""
        with pymongo.timeout(timeout):
            await self.client.admin.command("ping")

    async def ping(self, timeout: float = PROBE_TIMEOUT) -> bool:
        """True when the server answers a ping within *timeout* seconds."""
        try:
            await self.check(timeout)
            return True
        except PyMongoError:
            return False

    # -- writing -------------------------------------------------------------
    async def write(self, ops: list[WriteOp], budget: float,
                    mode: str | None = None) -> WriteOutcome:
        """Write *ops*, retrying transient errors for *budget* seconds.

        Returns the ops that failed for good and those still unwritten when
        the budget ran out; every other op is stored.
        """
        outcome = WriteOutcome()
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
                outcome.error = self.last_error = self.scrub.exception(exc)[:400]
            if not retry:
                break
            attempt += 1
            mode = "upsert"  # an interrupted insert may have partly happened
            if time.monotonic() >= deadline:
                outcome.unavailable = retry
                break
            self.stats.inc_value("mongo/retries")
            delay = min(backoff_delay(attempt, self.backoff_base, self.backoff_max),
                        max(0.0, deadline - time.monotonic()))
            log = logger.warning if attempt == 1 else logger.debug
            log("MongoDB write of %d items failed (%s); retry %d in %.2fs", len(retry),
                outcome.error or "transient write errors", attempt, delay, extra=self.log_extra)
            await asyncio.sleep(delay)
            pending = retry
        return outcome

    async def write_spooled(self, ops: list[WriteOp], *, bulk_size: int,
                            budget: float) -> int | None:
        """Upsert spooled *ops* in chunks of *bulk_size* (``mongo/replayed``).

        Returns how many were stored (refused ones are dropped, as in a crawl),
        or ``None`` when MongoDB stopped answering (then nothing may be
        considered done; writing again later is harmless)."""
        stored = 0
        for start in range(0, len(ops), bulk_size):
            chunk = ops[start:start + bulk_size]
            outcome = await self.write(chunk, budget=budget, mode="upsert")
            if outcome.unavailable:
                return None
            self.stats.inc_value("mongo/replayed", len(chunk) - len(outcome.failed))
            stored += len(chunk) - len(outcome.failed)
        return stored

    async def _write_isolated(self, ops: list[WriteOp], exc: Exception,
                              outcome: WriteOutcome) -> list[WriteOp]:
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

    def _fail(self, op: WriteOp, reason: str, outcome: WriteOutcome, code: Any = None) -> None:
        outcome.failed[id(op)] = f"MongoDB refused {op.key_field}={op.key!r}: {reason}"
        self.stats.inc_value("mongo/failed")
        if code is not None:
            self.stats.inc_value(f"mongo/failed/{code}")
        logger.error("MongoDB refused %s=%r in %s: %s", op.key_field, op.key, op.collection,
                     reason, extra=self.log_extra)

    async def _write_once(self, ops: list[WriteOp], mode: str,
                          outcome: WriteOutcome) -> list[WriteOp]:
        """One attempt; returns the ops to retry (transient per-op errors)."""
        groups: dict[tuple[str, str, str, bool, str], list[WriteOp]] = {}
        for op in ops:
            groups.setdefault((op.database, op.collection, op.key_field, op.key_as_id, op.kind),
                              []).append(op)
        retry: list[WriteOp] = []
        for (database, collection, key_field, key_as_id, kind), group in groups.items():
            coll = self.client[database][collection]
            if kind in ("gone", "touch"):
                await self._update_only(coll, group, kind, outcome, retry)
                continue
            await self.ensure_index(database, collection, key_field, key_as_id)
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

    async def _insert(self, coll, ops: list[WriteOp], outcome: WriteOutcome,
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

    async def _upsert(self, coll, ops: list[WriteOp], outcome: WriteOutcome,
                      retry: list[WriteOp]) -> int:
        """bulk_write conditional upserts; E11000 races are retried as updates.

        Returns how many keys already existed (matched)."""
        matched = 0
        for race in range(DUPLICATE_RETRIES + 1):
            requests = [UpdateOne(op.filter, upsert_update(op), upsert=True) for op in ops]
            duplicates: list[WriteOp] = []
            details = await self._bulk(coll, requests, ops, outcome, retry,
                                       duplicates if race < DUPLICATE_RETRIES else None)
            if details is None:
                return matched
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

    async def _update_only(self, coll, ops: list[WriteOp], kind: str, outcome: WriteOutcome,
                           retry: list[WriteOp]) -> None:
        """Gone marks or touches of stored documents (a missing key stays missing)."""
        if kind == "gone":
            requests = [UpdateOne(op.filter, gone_update(op), upsert=False) for op in ops]
        else:
            requests = [UpdateOne(*touch_update(op), upsert=False) for op in ops]
        details = await self._bulk(coll, requests, ops, outcome, retry)
        if details is not None:
            self.stats.inc_value("mongo/marked_gone" if kind == "gone" else "mongo/touched",
                                 details.get("nModified", 0))

    async def _bulk(self, coll, requests: list, ops: list[WriteOp], outcome: WriteOutcome,
                    retry: list[WriteOp], duplicates: list[WriteOp] | None = None) -> dict | None:
        """One unordered ``bulk_write`` of *requests* (one per op of *ops*). Ops
        that failed go to *retry* (transient errors), *duplicates* (E11000,
        when a list is given) or fail for good. Returns the result's details,
        or None when a write-concern error sent the whole batch to *retry*."""
        try:
            result = await coll.bulk_write(requests, ordered=False)
            return result.bulk_api_result
        except BulkWriteError as exc:
            details = exc.details
        if details.get("writeConcernErrors"):
            # Applied but not replicated as asked: write them all again (idempotent).
            retry.extend(ops)
            return None
        for error in details.get("writeErrors", []):
            op = ops[error["index"]]
            kind = classify_write_error(error)
            if kind == "duplicate" and duplicates is not None:
                duplicates.append(op)
            elif kind == "transient":
                retry.append(op)
            else:
                self._fail(op, self.scrub(error.get("errmsg", "")), outcome,
                           code=error.get("code"))
        return details

    def _note_existing(self, collection: str, existing: int, total: int) -> None:
        if total <= 0:
            return
        ratio = min(1.0, existing / total)
        previous = self._existing_ratio.get(collection, 0.0)
        self._existing_ratio[collection] = 0.5 * previous + 0.5 * ratio

    async def ensure_index(self, database: str, collection: str, key_field: str,
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
