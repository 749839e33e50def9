"""ValidationPipeline: drop items that break their type's schema, with reasons.

Each item is checked with :func:`crawlproject.validation.validate` against the
``schema`` of its fields (declared in :mod:`crawlproject.items`). An invalid
item is dropped (``DropItem``, which Scrapy logs with the reasons) and every
violation is counted::

    validation/dropped                         invalid items
    validation/dropped/<ItemClass>             invalid items of one type
    validation/dropped/<ItemClass>/<field>_<reason>   e.g. .../price_missing
    validation/valid                           items that passed

With ``VALIDATION_INVALID_COLLECTION`` set (e.g. ``"invalid_items"``), each
invalid item is also written, best effort, to that collection of
``MONGO_DATABASE`` for inspection, with its violations. A failure to write
it is logged and counted (``validation/invalid_store_errors``), never raised:
validation never stops the crawl. Run it before the MongoDB pipeline.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import bson
import pymongo
from itemadapter import ItemAdapter
from pymongo import AsyncMongoClient
from scrapy.exceptions import DropItem, NotConfigured

from crawlproject.connection import (
    mongo_client,
    mongo_client_options,
    mongo_database_from_settings,
    mongo_uri_from_settings,
)
from crawlproject.defaults import setting
from crawlproject.pipelines.documents import to_mongo
from crawlproject.pipelines.errors import Scrubber
from crawlproject.validation import Violation, item_type_name, validate

__all__ = ["ValidationPipeline"]

logger = logging.getLogger(__name__)

STORE_TIMEOUT = 2.0


class ValidationPipeline:
    """Drop invalid items, counting each reason (see the module docstring).

    Settings: ``VALIDATION_ENABLED`` (default True), ``VALIDATION_INVALID_COLLECTION``
    (default ``""``: do not store invalid items), and for storing them
    ``MONGO_URI``, ``MONGO_DATABASE``, ``MONGO_CLIENT_OPTIONS``.
    """

    def __init__(self, crawler, invalid_collection: str = "", uri: str = "",
                 database: str = "", client_options: dict[str, Any] | None = None):
        self.crawler = crawler
        self.stats = crawler.stats
        self.invalid_collection = invalid_collection
        self.uri = uri
        self.database = database
        self.client_options = dict(client_options or {})
        self.scrub = Scrubber(uri)
        self.client: AsyncMongoClient | None = None

    @classmethod
    def from_crawler(cls, crawler):
        """Build the pipeline from settings (``NotConfigured`` when disabled)."""
        s = crawler.settings
        if not setting(s, "VALIDATION_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        return cls(crawler,
                   invalid_collection=setting(s, "VALIDATION_INVALID_COLLECTION"),
                   uri=mongo_uri_from_settings(s),
                   database=mongo_database_from_settings(s),
                   client_options=mongo_client_options(s))

    async def open_spider(self) -> None:
        """Create the MongoDB client when invalid items are to be stored."""
        if self.invalid_collection and self.uri:
            self.client = mongo_client(self.uri, **self.client_options)

    async def close_spider(self) -> None:
        """Close the MongoDB client, if any."""
        if self.client is not None:
            client, self.client = self.client, None
            await client.close()

    async def process_item(self, item: Any) -> Any:
        """Return *item* when valid; otherwise count, maybe store, and drop it."""
        violations = validate(item)
        if not violations:
            self.stats.inc_value("validation/valid")
            return item
        name = item_type_name(item)
        self.stats.inc_value("validation/dropped")
        self.stats.inc_value(f"validation/dropped/{name}")
        for violation in violations:
            self.stats.inc_value(f"validation/dropped/{name}/{violation.key}")
        if self.client is not None:
            await self._store(item, name, violations)
        reasons = "; ".join(v.message for v in violations)
        raise DropItem(f"Invalid {name}: {reasons}")

    async def _store(self, item: Any, name: str, violations: list[Violation]) -> None:
        doc = {
            "item_type": name,
            "spider": self.crawler.spider.name if self.crawler.spider else None,
            "violations": [v._asdict() for v in violations],
            "item": _storable(ItemAdapter(item).asdict()),
            "at": datetime.now(timezone.utc),
        }
        try:
            with pymongo.timeout(STORE_TIMEOUT):
                await self.client[self.database][self.invalid_collection].insert_one(doc)
            self.stats.inc_value("validation/invalid_stored")
        except Exception as exc:  # best effort: never stop the crawl for this
            self.stats.inc_value("validation/invalid_store_errors")
            logger.warning("Cannot store an invalid %s in %r: %s", name, self.invalid_collection,
                           self.scrub.exception(exc), extra={"spider": self.crawler.spider})


def _storable(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields as BSON values; a value BSON cannot hold becomes its repr."""
    out = {}
    for key, value in fields.items():
        value = to_mongo(value)
        try:
            bson.encode({"v": value})
        except Exception:
            value = repr(value)
        out[str(key)] = value
    return out
