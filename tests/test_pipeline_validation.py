"""ValidationPipeline: invalid items are dropped with counted reasons, optionally
kept in an ``invalid_items`` collection, and never stop the crawl."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from datetime import datetime, timezone
from decimal import Decimal

import pymongo
import pytest
from scrapy import Spider
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.utils.test import get_crawler

from devtools.demo.site import catalog
from crawlproject.items import ProductItem
from crawlproject.pipelines.validation import ValidationPipeline


class ShopSpider(Spider):
    name = "shop"


def make_pipeline(**settings):
    crawler = get_crawler(ShopSpider, settings)
    crawler.spider = crawler._create_spider()
    crawler.stats.open_spider()
    return ValidationPipeline.from_crawler(crawler), crawler.stats


def item(**changes) -> ProductItem:
    values = dict(url="https://shop.example/p/1", title="A lamp", price=Decimal("12.50"),
                  currency="EUR", published=datetime(2024, 1, 1, tzinfo=timezone.utc))
    values.update(changes)
    return ProductItem(**{k: v for k, v in values.items() if v is not None})


async def run(pipeline, items):
    await pipeline.open_spider()
    try:
        return await asyncio.gather(*(pipeline.process_item(i) for i in items),
                                    return_exceptions=True)
    finally:
        await pipeline.close_spider()


def test_invalid_items_are_dropped_and_counted_per_reason():
    pipeline, stats = make_pipeline()
    items = [item(), item(price=None), item(price=None, currency="euro"),
             item(published=datetime(2024, 1, 1)), item(price=Decimal("-3"))]
    results = asyncio.run(run(pipeline, items))
    assert results[0] is items[0]
    assert all(isinstance(r, DropItem) for r in results[1:])
    assert "price is required" in str(results[1])
    assert "Invalid ProductItem" in str(results[2]) and "currency" in str(results[2])
    assert stats.get_value("validation/valid") == 1
    assert stats.get_value("validation/dropped") == 4
    assert stats.get_value("validation/dropped/ProductItem") == 4
    assert stats.get_value("validation/dropped/ProductItem/price_missing") == 2
    assert stats.get_value("validation/dropped/ProductItem/currency_pattern") == 1
    assert stats.get_value("validation/dropped/ProductItem/published_naive_datetime") == 1
    assert stats.get_value("validation/dropped/ProductItem/price_min") == 1


def test_every_clean_demo_product_is_valid():
    pipeline, stats = make_pipeline()
    items = [item(url=f"http://127.0.0.1/product/{p.id}", title=p.title, price=p.price,
                  currency=p.currency, published=p.published) for p in catalog(120)]
    results = asyncio.run(run(pipeline, items))
    assert results == items
    assert stats.get_value("validation/valid") == 120 and not stats.get_value("validation/dropped")


def test_invalid_items_can_be_kept_for_inspection(mongo_uri):
    database = f"val_{uuid.uuid4().hex[:8]}"
    pipeline, stats = make_pipeline(MONGO_URI=mongo_uri, MONGO_DATABASE=database,
                                    VALIDATION_INVALID_COLLECTION="invalid_items")
    results = asyncio.run(run(pipeline, [item(price=None), item(), item(title="")]))
    assert [type(r) for r in results] == [DropItem, ProductItem, DropItem]
    client = pymongo.MongoClient(mongo_uri, tz_aware=True)
    try:
        stored = list(client[database]["invalid_items"].find({}, {"_id": 0}).sort("item.title"))
    finally:
        client.drop_database(database)
        client.close()
    assert len(stored) == 2 and stats.get_value("validation/invalid_stored") == 2
    first = stored[0]
    assert first["item_type"] == "ProductItem" and first["spider"] == "shop"
    assert first["violations"][0]["field"] in ("title", "price")
    assert first["item"]["url"] == "https://shop.example/p/1"


def test_storing_invalid_items_never_crashes_when_mongodb_is_down():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pipeline, stats = make_pipeline(
        MONGO_URI=f"mongodb://user:hunter2@127.0.0.1:{port}/",
        VALIDATION_INVALID_COLLECTION="invalid_items",
        MONGO_CLIENT_OPTIONS=json.dumps({"serverSelectionTimeoutMS": 200}))
    results = asyncio.run(run(pipeline, [item(price=None)]))
    assert isinstance(results[0], DropItem)
    assert stats.get_value("validation/invalid_store_errors") == 1


def test_disabled_validation_is_not_configured():
    with pytest.raises(NotConfigured):
        make_pipeline(VALIDATION_ENABLED=False)
