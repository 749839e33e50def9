"""MongoPipeline: idempotent writes of items to MongoDB.

Each item is upserted by its key field (``MONGO_UNIQUE_KEY``, default
``url``), so a page crawled twice, or by two nodes at once, is one document.
The unique index is created when the spider opens. ``first_seen`` is set on
insert only, ``updated_at`` on every write.

It talks to MongoDB through pymongo's asyncio client, so the reactor never
waits on a network round trip.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128
from itemadapter import ItemAdapter
from pymongo import ASCENDING, AsyncMongoClient
from pymongo.errors import DuplicateKeyError, PyMongoError
from scrapy.exceptions import NotConfigured

from crawlproject.connection import mongo_client_options, redact_url

logger = logging.getLogger(__name__)


class MongoPipeline:
    """Upsert items into ``MONGO_DATABASE.<collection>`` keyed on a unique field."""

    def __init__(self, uri: str, database: str, collection: str, key: str,
                 client_options: dict[str, Any], crawler=None):
        self.uri = uri
        self.database_name = database
        self.collection_name = collection
        self.key = key
        self.client_options = client_options
        self.crawler = crawler
        self.client: AsyncMongoClient | None = None
        self.collection = None

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not s.getbool("MONGO_PIPELINE_ENABLED", True):
            raise NotConfigured("MONGO_PIPELINE_ENABLED is off")
        return cls(
            uri=s.get("MONGO_URI"),
            database=s.get("MONGO_DATABASE"),
            collection=s.get("MONGO_COLLECTION") or "%(spider)s",
            key=s.get("MONGO_UNIQUE_KEY", "url"),
            client_options=mongo_client_options(s),
            crawler=crawler,
        )

    async def open_spider(self) -> None:
        spider = self.crawler.spider
        name = self.collection_name % {"spider": spider.name}
        self.client = AsyncMongoClient(self.uri, **self.client_options)
        self.collection = self.client[self.database_name][name]
        try:
            await self.collection.create_index([(self.key, ASCENDING)], unique=True)
        except PyMongoError as exc:
            raise RuntimeError(
                f"MongoDB at {redact_url(self.uri)} is not usable: {exc.__class__.__name__}: "
                f"{_redact_message(str(exc), self.uri)}"
            ) from None
        logger.info("Storing items in %s, database %r, collection %r, unique on %r",
                    redact_url(self.uri), self.database_name, name, self.key,
                    extra={"spider": spider})

    async def close_spider(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def process_item(self, item: Any) -> Any:
        doc = to_mongo(ItemAdapter(item).asdict())
        key = doc.get(self.key)
        if key is None:
            self.crawler.stats.inc_value("mongo/items_without_key")
            logger.warning("Item has no %r field; not stored: %r", self.key, item)
            return item
        now = datetime.now(timezone.utc)
        update = {"$set": {**doc, "updated_at": now}, "$setOnInsert": {"first_seen": now}}
        try:
            result = await self.collection.update_one({self.key: key}, update, upsert=True)
        except DuplicateKeyError:
            # Two nodes inserted the same key at once: the loser updates instead.
            result = await self.collection.update_one({self.key: key}, update, upsert=True)
        stats = self.crawler.stats
        stats.inc_value("mongo/inserted" if result.upserted_id is not None else "mongo/updated")
        return item


def to_mongo(value: Any) -> Any:
    """Convert values BSON cannot hold as-is (Decimal → Decimal128, sets → lists)."""
    if isinstance(value, Decimal):
        return Decimal128(value)
    if isinstance(value, dict):
        return {k: to_mongo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_mongo(v) for v in value]
    return value


def _redact_message(message: str, uri: str) -> str:
    redacted = redact_url(uri)
    return message.replace(uri, redacted) if uri else message
