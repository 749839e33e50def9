"""The frontier's MongoDB tier: each politeness key's entries beyond its Redis window.

Redis keeps, per key, a bounded window of ready entries; the rest of a key's
queue waits here, in one collection (``FRONTIER_BACKLOG_COLLECTION``, default
``frontier_backlog``, in ``MONGO_DATABASE``) shared by the spiders, one
document per entry (docs/frontier.md, "A frontier larger than RAM")::

    {_id: "<spider>|<partition>|<member>", s: spider, p: partition, k: key,
     sc: score, m: member, pl: payload, e: epoch}
    tombstoned: pl and sc unset, te: epoch, at: date

* ``_id`` is derived from the member (``"<priority>:<seq>@<key>"``, unique in
  its partition): a retried insert is a duplicate-key error, never a second
  document, so every step of a move can be retried.
* ``sc`` is the Redis queue score (``-priority * 2^40 + seq``,
  crawlproject/frontier/scripts.py): the key's order here *is* its order in
  Redis, in one number.
* The index ``{s, p, k, sc}`` is partial on ``sc`` being a number
  (:data:`LIVE_SC`, which only live entries have): a refill is one range scan
  of one key's live entries, ``{s, p, k, sc: LIVE_SC}`` sorted on ``sc`` with
  a limit (never a global "top N"): equalities on the prefix, a range on the
  last field, so mongod reads *n* keys of the index whatever the collection's
  size, and so does the tests' MongoDB-wire server's range scan (which reads
  the key's live entries: it pushes no limit down). No hint: that server
  walks a hinted index whole (docs/frontier.md); :data:`INDEX_CHECK_INTERVAL`
  guards the index instead.
* A refilled entry is *tombstoned*, not deleted: ``pl`` and ``sc`` unset (out
  of the range index) and ``at`` set;
  a TTL index on ``at`` deletes it an hour later (:data:`TOMBSTONE_TTL`). A
  spill that arrives late (its node paused past its lease) then hits the
  tombstone's ``_id`` and writes nothing, instead of bringing back an entry
  that was refilled and crawled since. ``at`` is a BSON date (a TTL index
  reads dates only) and is absent from live entries (it would expire them).
* Epochs (the mover's lease, crawlproject/frontier/mover.py) tell a late
  write from a move that comes after: ``e`` is the epoch of the spill that
  wrote an entry, ``te`` that of the refill that tombstoned it. A spill
  revives a tombstone of an earlier epoch (the same member spilled again
  after its refill) and leaves one of a later epoch alone (it is the late
  one); a tombstone leaves an entry written by a later epoch live (the
  tombstone is the late one). Epochs grow with every claim of a partition.
* One collection for every spider, each document naming its spider: a reset
  of one crawl is ``delete_many({s: spider})`` (:meth:`Backlog.reset`); shard
  it on ``{s: 1, k: "hashed"}`` so that a key's range scan goes to one shard.

Writes are ``w: FRONTIER_BACKLOG_WRITE_CONCERN`` (``majority``) and
journaled: Redis forgets an entry only once MongoDB has it on disk. The
protocol that moves entries between the tiers (Redis side, leases, crash
recovery) is :mod:`crawlproject.frontier.mover`.

MongoDB that does not answer raises :class:`BacklogUnavailable`: the caller
keeps its entries in Redis and tries again later.

This module knows MongoDB, not Scrapy (pymongo's asyncio API, the client from
:func:`crawlproject.connection.mongo_client`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson.errors import BSONError
from bson.int64 import Int64
from pymongo import ASCENDING, UpdateOne
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
           "BacklogUnavailable", "INDEX", "INDEX_NAME", "LIVE", "LIVE_SC", "TOMBSTONE_TTL",
           "entry_id"]

logger = logging.getLogger(__name__)

#: The per-key range index: a spider's partition's key's live entries in queue order.
INDEX = [("s", ASCENDING), ("p", ASCENDING), ("k", ASCENDING), ("sc", ASCENDING)]
INDEX_NAME = "s_p_k_sc_live"
#: Every score (an int64): the range of a key's live entries, and the index's
#: partial filter. The query repeats it verbatim, so that any server sees the
#: query imply the filter (a comparison on ``sc``, where ``$exists`` would be a
#: second operator field: the tests' MongoDB-wire server would scan the collection).
LIVE_SC = {"$gte": Int64(-2**63)}
#: Live entries (a payload, and a score: set and unset together).
LIVE = {"pl": {"$exists": True}}
GONE = {"pl": {"$exists": False}}
#: Seconds between two checks that the range index exists (a refill's read is
#: not hinted: without its index, mongod would scan the collection instead).
INDEX_CHECK_INTERVAL = 60.0
TTL_INDEX_NAME = "at_ttl"
#: Seconds a tombstone is kept (far longer than a mover's lease: a late spill
#: of a refilled entry must meet it, docs/frontier.md).
TOMBSTONE_TTL = 3600
#: ids per ``update_many`` (a 16 MiB command holds far more; this bounds one call's work)
TOMBSTONE_CHUNK = 1000
DUPLICATE_KEY = 11000
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
        if not self.collection or "$" in self.collection or "\0" in self.collection:
            raise ValueError(f"FRONTIER_BACKLOG_COLLECTION {self.collection!r} is not a "
                             "collection name")
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


@dataclass(frozen=True)
class BacklogEntry:
    """One live entry of the backlog, as :meth:`Backlog.peek` returns it."""

    id: str
    key: str
    partition: int
    score: int
    member: str
    payload: Any


@dataclass
class BacklogCounts:
    """What :meth:`Backlog.counts` found: live entries in all, per partition,
    and the keys with the most (largest first)."""

    total: int = 0
    partitions: dict[int, int] = field(default_factory=dict)
    keys: list[tuple[str, int]] = field(default_factory=list)


def entry_id(spider: str, partition: int, member: str) -> str:
    """The ``_id`` of *member* of *spider*'s *partition*: the same on every retry
    (a member names its key: ``"<priority>:<seq>@<key>"``)."""
    return f"{spider}|{partition}|{member}"


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
    """One spider's entries in the backlog collection (see the module docstring).

    *client* is a pymongo ``AsyncMongoClient`` (closed by :meth:`close` when
    *owns_client*); every call runs under ``pymongo.timeout(timeout)`` (server
    selection, retries and the write concern's wait included) and raises
    :class:`BacklogUnavailable` when MongoDB does not answer within it,
    :class:`BacklogError` when it refuses. *stats* (anything with
    ``inc_value``) counts ``frontier/backlog/spilled``, ``.../tombstoned`` and
    ``.../unavailable``.
    """

    def __init__(self, client, database: str, collection: str, spider: str, *,
                 write_concern: str | int = defaults.FRONTIER_BACKLOG_WRITE_CONCERN,
                 timeout: float = defaults.FRONTIER_BACKLOG_TIMEOUT, stats=None,
                 owns_client: bool = False, where: str = ""):
        self.client = client
        self.spider = spider
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
        self._index_checked = float("-inf")   # monotonic time of the last check

    @classmethod
    def from_config(cls, config: BacklogConfig, spider: str, *, stats=None) -> "Backlog":
        """The backlog of *spider* with its own client (closed by :meth:`close`)."""
        client = mongo_client(config.uri, **config.client_options)
        where = (f"MongoDB at {redact_url(config.uri)} (database {config.database!r}, "
                 f"collection {config.collection!r})")
        return cls(client, config.database, config.collection, spider,
                   write_concern=config.write_concern, timeout=config.timeout, stats=stats,
                   owns_client=True, where=where)

    async def open(self) -> None:
        """Create the range index and the tombstones' TTL index (a no-op when they exist)."""
        async with self._call("create the indexes of"):
            await self._create_indexes()

    async def _create_indexes(self) -> None:
        await self.collection.create_index(INDEX, name=INDEX_NAME,
                                           partialFilterExpression={"sc": LIVE_SC})
        await self.collection.create_index([("at", ASCENDING)], name=TTL_INDEX_NAME,
                                           expireAfterSeconds=TOMBSTONE_TTL)
        self._index_checked = time.monotonic()

    async def close(self) -> None:
        if self.owns_client:
            await self.client.close()

    def _id(self, partition: int, member: str) -> str:
        return entry_id(self.spider, partition, member)

    async def spill(self, partition: int, key: str, entries: Iterable[tuple[str, int, Any]],
                    *, epoch: int) -> int:
        """Store *entries* of *key* (``(member, score, payload)``, leaving
        partition *partition*'s window) for a move of epoch *epoch*; return
        how many were written (new, or a tombstone of an earlier refill revived).

        One unordered bulk of upserts, each refused (a duplicate key, counted
        as written and left as it is) where the entry is live already (a retry
        after a crash or a timeout) or tombstoned by a refill of a later epoch
        (this write is late: its node paused past its lease). Returns once
        MongoDB acknowledged every entry with the collection's write concern;
        raises otherwise (some may be stored: retry).
        """
        ops = [UpdateOne({"_id": self._id(partition, member), **GONE, "te": {"$lt": epoch}},
                         {"$set": {"s": self.spider, "p": partition, "k": key, "sc": int(score),
                                   "m": member, "pl": payload, "e": epoch},
                          "$unset": {"at": "", "te": ""}},
                         upsert=True)
               for member, score, payload in entries]
        if not ops:
            return 0
        async with self._call(f"spill {len(ops)} entries of {key!r} to"):
            try:
                result = await self.collection.bulk_write(ops, ordered=False)
                new = result.upserted_count + result.modified_count
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors") or []
                if exc.details.get("writeConcernErrors") or any(
                        e.get("code") != DUPLICATE_KEY for e in errors):
                    raise
                new = exc.details.get("nUpserted", 0) + exc.details.get("nModified", 0)
        self._count("frontier/backlog/spilled", new)
        return new

    async def peek(self, partition: int, key: str, n: int) -> list[BacklogEntry]:
        """The next *n* live entries of *key* in queue order (highest priority
        first, then oldest; one range scan of the index); they stay live until
        :meth:`tombstone`."""
        if n <= 0:
            return []
        async with self._call(f"read the entries of {key!r} from"):
            if time.monotonic() - self._index_checked >= INDEX_CHECK_INTERVAL:
                await self._check_index()
            while True:
                docs = await self._range(partition, key, n)
                entries = [_entry(d, partition, key) for d in docs]
                junk = [d["_id"] for d, e in zip(docs, entries) if e is None]
                if junk:
                    await self._bury(junk, key)
                # (an empty read means none left: the caller clears the key's count,
                # so a read of junk alone reads again, past the junk it buried)
                if not junk or any(e is not None for e in entries):
                    return [e for e in entries if e is not None]

    async def _bury(self, ids: list, key: str) -> None:
        """Tombstone documents that are not entries (a field missing or of the
        wrong type: written outside the crawl), counted and said."""
        at = datetime.datetime.now(datetime.timezone.utc)
        await self.collection.update_many({"_id": {"$in": ids}},
                                          {"$unset": {"pl": "", "sc": ""}, "$set": {"at": at}})
        self._count("frontier/backlog/junk", len(ids))
        logger.warning("The frontier backlog's %s held %d documents of %r that are no "
                       "entries (a field missing or of the wrong type): tombstoned",
                       self.where, len(ids), key)

    async def _check_index(self) -> None:
        # The index gone (dropped by hand, a restore without indexes): every
        # refill would scan the whole collection, so build it again, once.
        if INDEX_NAME not in await self.collection.index_information():
            logger.warning("The frontier backlog's %s has no index %r: creating it",
                           self.where, INDEX_NAME)
            await self._create_indexes()
        self._index_checked = time.monotonic()

    async def _range(self, partition: int, key: str, n: int) -> list[dict]:
        # Equalities on the index's prefix, a range on its last field, sorted
        # on it: mongod's plan is one bounded IXSCAN reading n keys, no SORT
        # stage. Not hinted: the tests' MongoDB-wire server walks a hinted
        # index whole (secantus/storage.py, Storage._candidates_from_hint) but
        # serves this shape by a range scan of the key's live entries
        # (Storage._try_compound_range_id_keys).
        cursor = self.collection.find({"s": self.spider, "p": partition, "k": key,
                                       "sc": LIVE_SC},
                                      sort=[("sc", ASCENDING)], limit=n)
        return await cursor.to_list()

    async def tombstone(self, partition: int, members: Iterable[str], *, epoch: int) -> int:
        """Tombstone the entries *members* of *partition* for the refill of
        epoch *epoch* (once they are safely back in Redis): payload and score
        unset (out of the range index),
        ``te`` (the epoch) and ``at`` set (the TTL index deletes them later);
        return how many were live. An entry written by a later move (spilled
        again since: a refill node that paused past its lease comes late) is
        left live; one already tombstoned or gone is no error (a retry)."""
        ids, done = [self._id(partition, m) for m in members], 0
        at = datetime.datetime.now(datetime.timezone.utc)
        for start in range(0, len(ids), TOMBSTONE_CHUNK):
            chunk = ids[start:start + TOMBSTONE_CHUNK]
            async with self._call(f"tombstone {len(chunk)} entries of"):
                result = await self.collection.update_many(
                    {"_id": {"$in": chunk}, **LIVE, "e": {"$lt": epoch}},
                    {"$unset": {"pl": "", "sc": ""}, "$set": {"at": at, "te": epoch}})
            done += result.modified_count
        self._count("frontier/backlog/tombstoned", done)
        return done

    async def purge_tombstones(self, older_than: float = TOMBSTONE_TTL) -> int:
        """Delete this spider's tombstones older than *older_than* seconds: the
        TTL index's work, for a MongoDB-wire server that runs no TTL monitor."""
        cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(
            seconds=older_than)
        async with self._call("purge tombstones of"):
            result = await self.collection.delete_many(
                {"s": self.spider, **GONE, "at": {"$lt": cutoff}})
        return result.deleted_count

    async def reset(self) -> int:
        """Delete every document of this spider (``crawlctl reset``); return how many."""
        async with self._call("delete the entries of"):
            result = await self.collection.delete_many({"s": self.spider})
        return result.deleted_count

    async def counts(self, top: int = 10) -> BacklogCounts:
        """Live entries in all, per partition, and the *top* keys with the most.

        For tests and audits, not status pages (``T:backlog`` in Redis holds
        the same counts): both aggregations read all of the spider's entries
        (``top=0`` skips the per-key one).
        """
        found, live = BacklogCounts(), {"$match": {"s": self.spider, **LIVE}}
        async with self._call("count the entries of"):
            cursor = await self.collection.aggregate(
                [live, {"$group": {"_id": "$p", "n": {"$sum": 1}}}])
            for doc in await cursor.to_list():
                found.partitions[doc["_id"]] = doc["n"]
            if top > 0:
                cursor = await self.collection.aggregate(
                    [live, {"$group": {"_id": "$k", "n": {"$sum": 1}}},
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
            errors = [e for e in exc.details.get("writeErrors") or []
                      if e.get("code") != DUPLICATE_KEY]
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


def _entry(doc: dict, partition: int, key: str) -> "BacklogEntry | None":
    """*doc* as an entry of *key*, or None when it is not one."""
    member, payload, score = doc.get("m"), doc.get("pl"), doc.get("sc")
    if not (isinstance(member, str) and isinstance(payload, (bytes, str))
            and isinstance(score, int) and not isinstance(score, bool)):
        return None
    return BacklogEntry(doc["_id"], key, partition, score, member, payload)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:300] if lines else ""
