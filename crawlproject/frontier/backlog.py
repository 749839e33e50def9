"""The frontier's MongoDB tier: each politeness key's entries beyond its Redis window.

Redis keeps, per key, a bounded window of ready entries; the rest of a key's
queue waits here, in one collection per spider (``FRONTIER_BACKLOG_COLLECTION``,
``frontier_backlog.<spider>`` in ``MONGO_DATABASE``), one document per entry::

    {_id: "<partition>|<key>|<member>", key, p, pri, seq, member, payload}

ordered per key by the index ``(key, pri desc, seq asc)``: priority, then
arrival, as the Redis queue orders them. A refill is one range scan of that
index for one key with a limit (never a global "top N" query), so its cost does
not grow with the backlog.

Why a collection per spider rather than one with a ``spider`` field: a reset of
one crawl drops its collection (constant time, disk given back) instead of
deleting millions of documents; no document or index entry carries the spider
name; and one spider's refills, counts or sharding never touch another's. The
``_id`` starts with the partition and the key, so a batch's removal touches
neighbouring ``_id`` index entries; the partition is in it because an entry's
member (``"<prio>:<seq>[@key]"``) is unique within its partition only. To shard,
use ``{key: "hashed"}`` or ``{key: 1, pri: -1, seq: 1}``: a key's range then
lives on one shard.

Intended protocol (the SYNC/client integration decides the details; the
``_id`` is idempotent, so every step can be retried after a crash):

* **spill** (a key's window is over its size): the entries leaving Redis are
  first marked in Redis as spilling (still durable there, never leased), then
  :meth:`Backlog.spill` writes them (write concern ``majority``, journaled), and only once
  MongoDB acknowledged, one atomic Redis call removes them from the window. A
  crash or an outage in between leaves them in Redis, spilling: the next
  attempt writes them again (an upsert of the same ``_id`` stores nothing
  twice). An entry a failed spill may have written must not go back to the
  window until its spill succeeded or :meth:`Backlog.remove` of it did.
* **refill** (a key's window runs low): one node takes the key's refill lease
  in Redis, :meth:`Backlog.peek`\\ s the next ``FRONTIER_REFILL_BATCH``, inserts
  them into the window in one atomic Redis call that also records their ids
  under the lease, then :meth:`Backlog.remove`\\ s them from MongoDB and clears
  the record. A node that takes over an expired lease first finishes the
  recorded removal: an entry already fetched is never refilled a second time.

MongoDB that does not answer raises :class:`BacklogUnavailable`: the caller
keeps its entries in Redis and tries again later; nothing is removed from
Redis before MongoDB acknowledged.

This module knows MongoDB, not Scrapy (pymongo's asyncio API, the client from
:func:`crawlproject.connection.mongo_client`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson.errors import BSONError
from pymongo import ASCENDING, DESCENDING, UpdateOne
from pymongo.errors import (
    BulkWriteError,
    ConnectionFailure,
    ExecutionTimeout,
    OperationFailure,
    PyMongoError,
    WTimeoutError,
    WriteConcernError,
)
from pymongo.write_concern import WriteConcern

from crawlproject import defaults
from crawlproject.connection import mongo_client, redact_url
from crawlproject.defaults import setting

__all__ = ["Backlog", "BacklogConfig", "BacklogEntry", "BacklogCounts", "BacklogError",
           "BacklogUnavailable", "INDEX_NAME", "entry_id"]

logger = logging.getLogger(__name__)

#: The per-key range index: a key's entries by priority (highest first), then arrival.
INDEX = [("key", ASCENDING), ("pri", DESCENDING), ("seq", ASCENDING)]
INDEX_NAME = "key_pri_seq"
#: ids per ``delete_many`` (a 16 MiB command holds far more; this bounds one call's work)
REMOVE_CHUNK = 1000
BAD_VALUE = 2
#: Server codes after which the same call can succeed: no primary, shutting
#: down, timeouts, write conflicts (MongoDB's retryable-write list).
RETRYABLE_CODES = frozenset({6, 7, 50, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602,
                             13435, 13436})


class BacklogError(RuntimeError):
    """MongoDB refused a backlog call (the message holds no password)."""


class BacklogUnavailable(BacklogError):
    """MongoDB did not answer in time (down, no primary, timeout): try again later."""


@dataclass(frozen=True)
class BacklogConfig:
    """The backlog's settings, read once (see crawlproject/defaults.py)."""

    enabled: bool = defaults.FRONTIER_BACKLOG_ENABLED
    uri: str = defaults.MONGO_URI
    database: str = defaults.MONGO_DATABASE
    collection: str = defaults.FRONTIER_BACKLOG_COLLECTION
    write_concern: str | int = defaults.FRONTIER_BACKLOG_WRITE_CONCERN
    timeout: float = defaults.FRONTIER_BACKLOG_TIMEOUT
    client_options: dict = field(default_factory=dict)

    def __post_init__(self):
        if "%(spider)s" not in self.collection:
            raise ValueError(f"FRONTIER_BACKLOG_COLLECTION {self.collection!r} must hold "
                             "%(spider)s: spiders sharing a collection would mix their entries")
        if self.timeout <= 0:
            raise ValueError(f"FRONTIER_BACKLOG_TIMEOUT must be > 0, got {self.timeout!r}")
        w = self.write_concern
        if isinstance(w, str) and w.isdigit():
            object.__setattr__(self, "write_concern", int(w))
        WriteConcern(w=self.write_concern)  # refuses a bad value now, not at the first spill

    @classmethod
    def from_settings(cls, settings) -> "BacklogConfig":
        return cls(
            enabled=setting(settings, "FRONTIER_BACKLOG_ENABLED"),
            uri=setting(settings, "MONGO_URI"),
            database=setting(settings, "MONGO_DATABASE"),
            collection=setting(settings, "FRONTIER_BACKLOG_COLLECTION"),
            write_concern=setting(settings, "FRONTIER_BACKLOG_WRITE_CONCERN"),
            timeout=setting(settings, "FRONTIER_BACKLOG_TIMEOUT"),
            client_options=setting(settings, "MONGO_CLIENT_OPTIONS"),
        )

    def collection_name(self, spider: str) -> str:
        return self.collection % {"spider": spider}


@dataclass(frozen=True)
class BacklogEntry:
    """One entry of the backlog, as :meth:`Backlog.peek` returns it."""

    id: str
    key: str
    partition: int
    priority: int
    seq: int
    member: str
    payload: Any


@dataclass
class BacklogCounts:
    """What :meth:`Backlog.counts` found: entries in all, per partition, and
    the keys with the most entries (largest first)."""

    total: int = 0
    partitions: dict[int, int] = field(default_factory=dict)
    keys: list[tuple[str, int]] = field(default_factory=list)


def entry_id(partition: int, key: str, member: str) -> str:
    """The ``_id`` of *member* of *key* in *partition*: the same on every retry."""
    return f"{partition}|{key}|{member}"


def is_unavailable(exc: BaseException) -> bool:
    """True when MongoDB did not answer (the same call may succeed later)."""
    if isinstance(exc, (ConnectionFailure, ExecutionTimeout, WTimeoutError,
                        WriteConcernError)):
        return True
    if isinstance(exc, PyMongoError) and getattr(exc, "timeout", False):
        return True
    if isinstance(exc, OperationFailure) and exc.code in RETRYABLE_CODES:
        return True
    if isinstance(exc, PyMongoError) and any(
            exc.has_error_label(label) for label in ("RetryableWriteError", "RetryableError")):
        return True
    return False


class Backlog:
    """One spider's backlog collection (see the module docstring).

    *client* is a pymongo ``AsyncMongoClient`` (closed by :meth:`close` when
    *owns_client*); every call runs under ``pymongo.timeout(timeout)`` (server
    selection, retries and the write concern's wait included) and raises
    :class:`BacklogUnavailable` when MongoDB does not answer within it,
    :class:`BacklogError` when it refuses. *stats* (anything with
    ``inc_value``) counts ``frontier/backlog/spilled``, ``.../removed`` and
    ``.../unavailable``.
    """

    def __init__(self, client, database: str, collection: str, *,
                 write_concern: str | int = defaults.FRONTIER_BACKLOG_WRITE_CONCERN,
                 timeout: float = defaults.FRONTIER_BACKLOG_TIMEOUT, stats=None,
                 owns_client: bool = False, where: str = ""):
        self.client = client
        # j=True: an acknowledged spill is then removed from Redis, so it must
        # survive a crash of mongod. "majority" implies the journal only while
        # writeConcernMajorityJournalDefault is on (a replica set's default)
        # and w=1 never does; j=True asks for it whatever the setting and the
        # server's defaults are.
        self.collection = client[database].get_collection(
            collection, write_concern=WriteConcern(w=write_concern, j=True))
        self.timeout = timeout
        self.stats = stats
        self.owns_client = owns_client
        self.where = where or f"database {database!r}, collection {collection!r}"
        self._down = False

    @classmethod
    def from_config(cls, config: BacklogConfig, spider: str, *, stats=None) -> "Backlog":
        """The backlog of *spider* with its own client (closed by :meth:`close`)."""
        client = mongo_client(config.uri, **config.client_options)
        collection = config.collection_name(spider)
        where = (f"MongoDB at {redact_url(config.uri)} (database {config.database!r}, "
                 f"collection {collection!r})")
        return cls(client, config.database, collection, write_concern=config.write_concern,
                   timeout=config.timeout, stats=stats, owns_client=True, where=where)

    async def open(self) -> None:
        """Create the per-key range index (once; a no-op when it exists)."""
        async with self._call("create the index of"):
            await self.collection.create_index(INDEX, name=INDEX_NAME)

    async def close(self) -> None:
        if self.owns_client:
            await self.client.close()

    async def spill(self, key: str, entries: Iterable[tuple[str, int, int, Any]], *,
                    partition: int = 0) -> int:
        """Store *entries* of *key* (``(member, priority, seq, payload)``, leaving
        partition *partition*'s window); return how many were new.

        Idempotent: an entry already stored (a retry after a crash or a timeout)
        is left as it is. Returns once MongoDB acknowledged every entry with the
        collection's write concern; raises otherwise (some may be stored: retry).
        """
        ops = [UpdateOne({"_id": entry_id(partition, key, member)},
                         {"$setOnInsert": {"key": key, "p": partition, "pri": int(priority),
                                           "seq": int(seq), "member": member,
                                           "payload": payload}},
                         upsert=True)
               for member, priority, seq, payload in entries]
        if not ops:
            return 0
        async with self._call(f"spill {len(ops)} entries of {key!r} to"):
            # Two upserts of one _id at once (a retry racing its first try):
            # MongoDB (4.2+) retries the loser's E11000 itself, an equality
            # match on the unique _id, so both succeed and one inserts.
            result = await self.collection.bulk_write(ops, ordered=False)
        self._count("frontier/backlog/spilled", result.upserted_count)
        return result.upserted_count

    async def peek(self, key: str, n: int) -> list[BacklogEntry]:
        """The next *n* entries of *key*, highest priority first, then oldest
        (one range scan of the index); they stay stored until :meth:`remove`."""
        if n <= 0:
            return []
        async with self._call(f"read the entries of {key!r} from"):
            try:
                docs = await self._range(key, n)
            except OperationFailure as exc:
                if exc.code != BAD_VALUE or "hint" not in str(exc):
                    raise
                # The index went missing (dropped by hand, a restore without
                # indexes): a scan of the whole collection per refill is what
                # the hint refuses, so build it again, once, and go on.
                logger.warning("The frontier backlog's %s has no index %r: creating it",
                               self.where, INDEX_NAME)
                await self.collection.create_index(INDEX, name=INDEX_NAME)
                docs = await self._range(key, n)
        return [BacklogEntry(d["_id"], d["key"], d["p"], d["pri"], d["seq"], d["member"],
                             d["payload"]) for d in docs]

    async def _range(self, key: str, n: int) -> list[dict]:
        # the hint: never a collection scan, whatever the planner thinks
        cursor = self.collection.find({"key": key}, sort=INDEX[1:], limit=n, hint=INDEX_NAME)
        return await cursor.to_list()

    async def remove(self, ids: Iterable[str]) -> int:
        """Delete the entries *ids* (once they are safely in Redis); return how
        many were there (an id already gone is no error: a retry)."""
        ids, removed = list(ids), 0
        for start in range(0, len(ids), REMOVE_CHUNK):
            chunk = list(ids[start:start + REMOVE_CHUNK])
            async with self._call(f"remove {len(chunk)} entries from"):
                result = await self.collection.delete_many({"_id": {"$in": chunk}})
            removed += result.deleted_count
        self._count("frontier/backlog/removed", removed)
        return removed

    async def counts(self, top: int = 10) -> BacklogCounts:
        """Entries in all, per partition, and the *top* keys with the most.

        For status pages, not the hot path: both aggregations read the whole
        collection (``top=0`` skips the per-key one).
        """
        found = BacklogCounts()
        async with self._call("count the entries of"):
            cursor = await self.collection.aggregate(
                [{"$group": {"_id": "$p", "n": {"$sum": 1}}}])
            for doc in await cursor.to_list():
                found.partitions[doc["_id"]] = doc["n"]
            if top > 0:
                cursor = await self.collection.aggregate(
                    [{"$group": {"_id": "$key", "n": {"$sum": 1}}},
                     {"$sort": {"n": -1, "_id": 1}}, {"$limit": top}], allowDiskUse=True)
                found.keys = [(doc["_id"], doc["n"]) for doc in await cursor.to_list()]
        found.total = sum(found.partitions.values())
        return found

    # -- errors ---------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _call(self, what: str):
        """Run one call under the timeout; pymongo's errors become ours."""
        try:
            with pymongo.timeout(self.timeout):
                yield
        except PyMongoError as exc:
            raise self._error(what, exc) from exc
        except BSONError as exc:  # an entry MongoDB cannot store: the caller's to fix
            raise BacklogError(f"cannot {what} the frontier backlog: {self.where}: "
                               f"{type(exc).__name__}: {_first_line(exc)}") from exc
        if self._down:
            self._down = False
            logger.info("The frontier backlog's %s answers again", self.where)

    def _error(self, what: str, exc: PyMongoError) -> BacklogError:
        if isinstance(exc, BulkWriteError):
            errors = exc.details.get("writeErrors") or []
            unavailable = bool(exc.details.get("writeConcernErrors")) or all(
                e.get("code") in RETRYABLE_CODES for e in errors)
        else:
            unavailable = is_unavailable(exc)
        message = f"cannot {what} the frontier backlog: {self.where}"
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        if not unavailable:
            return BacklogError(f"{message} refused it ({reason})")
        self._count("frontier/backlog/unavailable")
        if not self._down:  # once per outage: every call fails while it lasts
            self._down = True
            logger.warning("%s does not answer (%s)", message, reason)
        return BacklogUnavailable(f"{message} does not answer within {self.timeout:g}s "
                                  f"({reason})")

    def _count(self, name: str, n: int = 1) -> None:
        if self.stats is not None and n:
            self.stats.inc_value(name, n)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:300] if lines else ""
