"""The cluster's robots.txt records in Redis, read as untrusted (no Scrapy here).

:class:`RobotsStore` reads a site's record (``{spider}:robots:<origin>``) with
``GETRANGE`` (a huge value is never read whole), keeps only one a node of
this crawl signed for this very site whose time has not passed
(:func:`crawlproject.robots.record.decode_record`), takes and renews the
site's fetch lock (``ROBOTS_FETCH_LOCK``: free or stale locks only), and
writes a record with the lock released and the ``{spider}:robots`` index
(for ``crawlctl politeness``) updated. A record refused is said once per site
and counted (``robotstxt/cluster/unproven_record``, ``invalid_record``); a key
of the wrong type is named in an ERROR at most once a minute
(``robotstxt/cluster/bad_key``) and bypassed.
"""

from __future__ import annotations

import json
import logging
import time

from redis.exceptions import ResponseError

from crawlproject.connection import redis_from_settings
from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import ROBOTS_FETCH_LOCK
from crawlproject.keys import RobotsKeys
from crawlproject.robots.record import (MAX_RECORD, RobotsRecord, UnprovenRecord,
                                        decode_record, encode_record)
from crawlproject.signing import Signer

logger = logging.getLogger("crawlproject.robots.middleware")   # one logger for robots.txt

#: seconds between two ERRORs about Redis keys of the wrong type
BAD_KEY_LOG_INTERVAL = 60.0


def _wrong_type(exc: ResponseError) -> bool:
    return str(exc).startswith("WRONGTYPE")


class RobotsStore:
    """One spider's robots.txt records, fetch locks and index in Redis."""

    def __init__(self, settings, spider, signer: Signer, stats, said_sites: int):
        self.settings, self.spider, self.signer, self.stats = settings, spider, signer, stats
        self.said_sites = said_sites
        self._warned: set[str] = set()
        self._bad_key_said: float | None = None   # monotonic time of the last ERROR
        self._bad_keys_unsaid = 0
        self._redis = None
        self.keys = RobotsKeys(spider.name)
        self._take_lock = None

    def client(self):
        if self._redis is None:
            self._redis = redis_from_settings(self.settings, asyncio=True)
            self._take_lock = script(self._redis, ROBOTS_FETCH_LOCK)
        return self._redis

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()

    async def read(self, origin: str, now: float, quiet: bool = False) -> RobotsRecord | None:
        """The proven record of *origin* whose time has not passed at *now*, or
        None (*quiet*: a second look, what it refuses was said by the first)."""
        key = self.keys.record(origin)
        try:
            # GETRANGE: a huge value is never read whole (refused for its length)
            raw = await self.client().getrange(key, 0, MAX_RECORD)
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            if not quiet:
                await self._bad_key(key, "a string", "ignored, the site's robots.txt is "
                                    "fetched again and stored over it")
            raw = b""
        if not raw:
            return None
        refused = (lambda *_: None) if quiet else self._refused
        try:
            record = decode_record(raw, self.signer, origin)
        except UnprovenRecord as exc:
            return refused(origin, "unproven_record", str(exc))
        except ValueError as exc:
            return refused(origin, "invalid_record", str(exc))
        if record.usable_until <= now:   # a node's record is gone by then: replayed
            return refused(origin, "unproven_record", "its time has passed: stored "
                           "again, or this node's clock is ahead")
        return record

    def _refused(self, origin: str, stat: str, why: str) -> None:
        self.stats.inc_value(f"robotstxt/cluster/{stat}")
        if origin not in self._warned:
            if len(self._warned) >= self.said_sites:
                self._warned.clear()
            self._warned.add(origin)
            logger.warning("Ignoring the stored robots.txt of %s (%s): fetching it again",
                           origin, why, extra={"spider": self.spider})

    async def take_lock(self, origin: str, node: str, ttl: float) -> int:
        """0: another node holds *origin*'s fetch lock; 1: taken; 2: taken
        over (it had no expiry, or a longer one than *ttl*: not a node's)."""
        self.client()
        return await self._take_lock(keys=[self.keys.fetch_lock(origin)],
                                     args=[node, int(ttl * 1000)])

    async def release_lock(self, origin: str) -> None:
        """Give *origin*'s fetch lock back (taken, then found needless)."""
        await self.client().delete(self.keys.fetch_lock(origin))

    async def renew_lock(self, origin: str, ttl: float) -> None:
        await self.client().pexpire(self.keys.fetch_lock(origin), int(ttl * 1000))

    async def share(self, record: RobotsRecord, ttl: float) -> None:
        """*record* for every node (SET replaces a key of any type), the
        site's fetch lock released, the index for ``crawlctl politeness``."""
        origin = record.origin
        host = (origin.split("://", 1)[1].rsplit(":", 1)[0] if not origin.endswith("]")
                else origin.split("://", 1)[1])
        pipe = self.client().pipeline(transaction=False)
        pipe.set(self.keys.record(origin), encode_record(record, self.signer),
                 px=int(ttl * 1000))
        pipe.delete(self.keys.fetch_lock(origin))
        pipe.hset(self.keys.index, host,
                  json.dumps({"origin": origin, "status": record.status,
                              "fetched": record.fetched, "expires": record.expires,
                              "failures": record.failures}))
        stored, released, indexed = await pipe.execute(raise_on_error=False)
        for result in (stored, released):
            if isinstance(result, Exception):
                raise result
        if isinstance(indexed, Exception):
            if not (isinstance(indexed, ResponseError) and _wrong_type(indexed)):
                raise indexed
            await self._bad_key(self.keys.index, "a hash", "skipped, crawlctl politeness "
                                "shows no robots.txt state until it is deleted")
        self.stats.inc_value(f"robotstxt/cluster/stored/{record.state}")

    async def _bad_key(self, key: str, expected: str, then: str) -> None:
        """Say that *key* holds another type than *expected*, at most once a
        minute (whoever wrote it may write many)."""
        self.stats.inc_value("robotstxt/cluster/bad_key")
        now = time.monotonic()
        if self._bad_key_said is not None and now - self._bad_key_said < BAD_KEY_LOG_INTERVAL:
            self._bad_keys_unsaid += 1
            return
        self._bad_key_said, unsaid, self._bad_keys_unsaid = now, self._bad_keys_unsaid, 0
        try:
            kind = await self.client().type(key)
            kind = kind.decode() if isinstance(kind, bytes) else kind
        except Exception:   # noqa: BLE001 - only for the message
            kind = "key of another type"
        logger.error("Redis key %s is a %s, not %s: %s (%d more key(s) of the wrong type "
                     "since the last such message)", key, kind, expected, then, unsaid,
                     extra={"spider": self.spider})
