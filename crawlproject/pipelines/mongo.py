"""MongoPipeline: buffered, idempotent MongoDB storage that survives outages.

Guarantee: ``process_item`` returns only once the item is durable, either
acknowledged by MongoDB or fsync'ed into the local spool. The scheduler
acknowledges a request only after its items came out of the pipelines, so a
node killed at any moment loses nothing.

This module is the Scrapy adapter (settings, open/close, ``process_item``,
the ``spider_idle`` signal) over plain parts: :mod:`.config` (the settings),
:mod:`.batcher` (group commit), :mod:`.writer` (the writes, idempotent),
:mod:`.outage` (retries, the spool, replay, the close wait) and
:mod:`.handoff` (a spool left at close, handed to Redis). The parts and the
stats in full: ``docs/pipelines.md``, "The pipeline and its parts
(crawlproject/pipelines/mongo.py)".
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import bson
from pymongo.errors import PyMongoError
from scrapy import signals
from scrapy.exceptions import DropItem, NotConfigured

from crawlproject.connection import redis_from_settings
from crawlproject.defaults import setting
from crawlproject.node import node_id
from crawlproject.keys import FrontierKeys
from crawlproject.pipelines.batcher import Batcher
from crawlproject.pipelines.config import MongoConfig
from crawlproject.pipelines.documents import WriteOp, gone_op, item_fields, to_mongo
from crawlproject.pipelines.errors import MongoPipelineError, Scrubber, is_auth_error
from crawlproject.pipelines.handoff import RedisHandoff
from crawlproject.pipelines.outage import CLOSE_REASON, OutageHandler
from crawlproject.pipelines.spool import Spool, spool_path, target_dir
from crawlproject.pipelines.writer import MongoWriter
from crawlproject.validation import item_type_name

__all__ = ["MongoPipeline", "MongoPipelineError", "to_mongo", "spool_path",
           "CLOSE_REASON"]

logger = logging.getLogger(__name__)


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

    *config* is every one of those settings, read once
    (:class:`~crawlproject.pipelines.config.MongoConfig`); *redis* (an asyncio
    Redis client, or ``None``) receives the spool of a node that closes while
    MongoDB is down.
    """

    def __init__(self, crawler, config: MongoConfig, *, redis=None):
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.redis = redis
        # First: it refuses a bad MONGO_BULK_SIZE before any client exists.
        self.batcher = Batcher(self._store, bulk_size=config.bulk_size,
                               flush_interval=config.flush_interval,
                               max_flushes=config.max_flushes,
                               flush_when_idle=config.flush_when_idle)
        self.writer = MongoWriter(config.uri, client_options=config.client_options,
                                  stats=crawler.stats, write_mode=config.write_mode,
                                  backoff_base=config.backoff_base,
                                  backoff_max=config.backoff_max)
        self.scrub = self.writer.scrub
        self.outage = OutageHandler(self.writer, crawler.stats, config,
                                    requeue=self.batcher.requeue,
                                    redis_scrub=Scrubber(config.redis_url))
        self.spool: Spool | None = None
        self.clock = time.monotonic  # of the close wait (tests replace it)
        self._targets: dict[type, tuple[str, str]] = {}

    @classmethod
    def from_crawler(cls, crawler):
        """Build the pipeline from the crawler's settings (``NotConfigured`` when off)."""
        s = crawler.settings
        if not setting(s, "MONGO_PIPELINE_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        config = MongoConfig.from_settings(s)
        redis = None
        if config.handoff:
            try:
                # Short timeouts: the handoff runs while the node is closing.
                redis = redis_from_settings(s, asyncio=True, socket_connect_timeout=5,
                                            socket_timeout=10)
            except ValueError as exc:
                logger.warning("MONGO_SPOOL_HANDOFF is on but REDIS_URL is not usable (%s): "
                               "a spool left at close stays on this machine", exc)
        pipeline = cls(crawler, config, redis=redis)
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
        extra = self._extra
        self.writer.log_extra = self.batcher.log_extra = extra
        per_item = "%(item)" in self.config.collection
        collection = "<one per item type>" if per_item else self._collection_name(None)
        try:
            if per_item:  # no collection known yet: check we may read the database
                await self.writer.client[self.config.database].list_collection_names(
                    filter={"name": collection})
            else:
                await self.writer.ensure_index(self.config.database, collection, self.config.key,
                                               self.config.key_as_id)
        except PyMongoError as exc:
            await self._close_clients()
            message = self._open_error_message(exc)
            logger.error("%s", message, extra=extra)
            raise MongoPipelineError(message) from None
        directory = target_dir(self.config.spool_dir, self.config.uri, self.config.database)
        self.spool = Spool(directory, owner=node_id(self.crawler)).open()
        handoff = None
        if self.redis is not None:
            key = FrontierKeys(self.crawler.spider.name).mongo_spool(directory.name)
            handoff = RedisHandoff(self.redis, key, self.config.database)
        self.outage.attach(self.spool, handoff, spider_name=self.crawler.spider.name,
                           log_extra=extra)
        self.batcher.start()
        logger.info("Storing items in %s, database %r, collection %r, unique on %r%s "
                    "(bulk %d, flush %.2fs, spool after %.1fs in %s, close wait %.0fs)",
                    self.scrub.redacted, self.config.database, collection, self.config.key,
                    " (as _id)" if self.config.key_as_id else "",
                    self.batcher.bulk_size, self.batcher.flush_interval,
                    self.config.spool_after, self.spool.directory, self.config.close_wait,
                    extra=extra)
        await self.outage.recover()

    async def close_spider(self) -> None:
        """Write everything still buffered, try a last replay; if MongoDB is
        still down, hand the spool to Redis and report what is left."""
        self.outage.begin_close()
        await self.batcher.close()
        await self.outage.close()
        if self.spool is not None:
            self.spool.close()
        await self._close_clients()

    async def _close_clients(self) -> None:
        await self.writer.close()
        if self.redis is not None:
            redis, self.redis = self.redis, None
            await redis.aclose()

    def _on_spider_idle(self) -> None:
        """Hold the idle close while items are spooled and MongoDB is down
        (up to ``MONGO_CLOSE_WAIT``; then finish reason ``mongo_unavailable``)."""
        self.outage.idle_close(self.clock())

    def _open_error_message(self, exc: PyMongoError) -> str:
        where = f"MongoDB at {self.scrub.redacted} (database {self.config.database!r})"
        if is_auth_error(exc):
            user, source = _user_and_auth_source(self.config.uri, self.config.database)
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
                op = gone_op(self.config.database, item, self.config.key_as_id)
            else:
                op = WriteOp.build(self.config.database, collection, key_field, item_fields(item),
                                   key_as_id=self.config.key_as_id, kind=kind)
        except KeyError:
            self.stats.inc_value("mongo/dropped/no_key")
            raise DropItem(f"{item_type_name(item)} has no usable {key_field!r} (missing, None "
                           f"or not a scalar): not stored") from None
        except (bson.errors.BSONError, OverflowError, TypeError, ValueError) as exc:
            self.stats.inc_value("mongo/dropped/unencodable")
            raise DropItem(f"{item_type_name(item)} cannot be stored in BSON: {exc}") from None
        future = self.batcher.add(op)
        self.stats.inc_value("mongo/items")
        # If this coroutine is cancelled, the future is too; the item is still
        # written with its batch (harmless: writes are idempotent).
        await future
        return item

    async def _store(self, batch) -> None:
        await self.outage.store(batch)

    def _collection_name(self, cls: type | None) -> str:
        pattern = getattr(cls, "mongo_collection", None) or self.config.collection
        item = cls.__name__.lower() if cls else ""
        return pattern % {"spider": self.crawler.spider.name, "item": item}

    def _key_field(self, cls: type) -> str:
        return getattr(cls, "mongo_key", None) or self.config.key


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
