"""Cleaning (item processors) and schemas, on the demo site's messy values."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from itemloaders.processors import MapCompose, TakeFirst
from scrapy.http import HtmlResponse, Request
from scrapy.loader import ItemLoader

from devtools.demo.site import catalog, product, render_product
from crawlproject.items import (
    ProductItem,
    ProductLoader,
    canonical_url,
    clean_text,
    parse_currency,
    parse_date,
    parse_price_amount,
    unique,
)
from crawlproject.spiders.products import ProductsSpider
from crawlproject.validation import Schema, Violation, validate

CATALOG = catalog(240)


# ----------------------------------------------------------------------------- cleaning


@pytest.mark.parametrize("p", CATALOG[:24], ids=lambda p: f"product-{p.id}")
def test_each_messy_format_is_cleaned(p):
    """Every title template, price format and date format of the demo site."""
    assert clean_text(p.raw_title) == p.title
    price_text = clean_text(p.raw_price)
    assert parse_price_amount(price_text) == p.price
    assert parse_currency(price_text) == p.currency
    published = parse_date(clean_text(p.raw_date))
    assert published == p.published
    assert published.tzinfo is not None and published.utcoffset() == timedelta(0)


def test_the_whole_catalog_is_cleaned():
    wrong = [p.id for p in CATALOG
             if (clean_text(p.raw_title), parse_price_amount(clean_text(p.raw_price)),
                 parse_currency(clean_text(p.raw_price)), parse_date(clean_text(p.raw_date)))
             != (p.title, p.price, p.currency, p.published)]
    assert wrong == []


@pytest.mark.parametrize("raw,expected", [
    ("  Caf&eacute;&nbsp;Lamp \n &amp; Co.  ", "Café Lamp & Co."),
    ("<h1 class='t'>\tA\u00a0 <b>bold</b>&#39;s</h1>", "A bold's"),
    ("&quot;Pro&quot;", '"Pro"'),
    (" \n\t ", None),
])
def test_clean_text(raw, expected):
    assert clean_text(raw) == expected


@pytest.mark.parametrize("raw,amount,currency", [
    ("1\u00a0299,00\u00a0€", Decimal("1299.00"), "EUR"),
    ("$1,234.56", Decimal("1234.56"), "USD"),
    ("£12.00", Decimal("12.00"), "GBP"),
    ("¥12,345", Decimal("12345"), "JPY"),
    ("EUR 12", Decimal("12"), "EUR"),
    ("12,3 €", Decimal("12.3"), "EUR"),
    ("USD 99.90", Decimal("99.90"), "USD"),
    ("call us", None, None),
])
def test_prices(raw, amount, currency):
    assert parse_price_amount(raw) == amount
    assert parse_currency(raw) == currency


@pytest.mark.parametrize("raw,expected", [
    ("2021-03-04", datetime(2021, 3, 4, tzinfo=timezone.utc)),
    ("2021-03-04T10:05:00+05:30", datetime(2021, 3, 4, 4, 35, tzinfo=timezone.utc)),
    ("2021-03-04T10:05:00Z", datetime(2021, 3, 4, 10, 5, tzinfo=timezone.utc)),
    ("4 March 2021", datetime(2021, 3, 4, tzinfo=timezone.utc)),
    ("Mar 4, 2021", datetime(2021, 3, 4, tzinfo=timezone.utc)),
    ("04.03.2021", datetime(2021, 3, 4, tzinfo=timezone.utc)),
    ("March 4, 2021 10:05 UTC", datetime(2021, 3, 4, 10, 5, tzinfo=timezone.utc)),
    ("not a date at all", None),
])
def test_dates_are_aware_utc(raw, expected):
    parsed = parse_date(raw)
    assert parsed == expected
    if parsed is not None:
        assert parsed.tzinfo is not None and parsed.utcoffset() == timedelta(0)


def test_urls_are_canonical_and_lists_deduplicated():
    assert canonical_url(" http://Example.com/a?b=2&a=1#frag ") == "http://example.com/a?a=1&b=2"
    assert unique(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def spider_item(pid: int, products: int = 240) -> ProductItem:
    url = f"http://127.0.0.1:8080/product/{pid}"
    response = HtmlResponse(url, body=render_product(product(pid, products)).encode("utf-8"),
                            encoding="utf-8", request=Request(url))
    (item,) = [out for out in ProductsSpider().parse_product(response)
               if isinstance(out, ProductItem)]
    return item


@pytest.mark.parametrize("pid", [1, 2, 3, 4, 5, 6, 8, 12, 20, 36])
def test_the_spider_loads_clean_items_from_real_pages(pid):
    p = product(pid, 240)
    item = spider_item(pid)
    assert item["title"] == p.title
    assert item["price"] == p.price and item["currency"] == p.currency
    assert item["published"] == p.published
    assert item["url"] == f"http://127.0.0.1:8080/product/{pid}"
    assert item["related"] == [f"http://127.0.0.1:8080/product/{j}"
                               for j in dict.fromkeys(p.related)]  # duplicates removed
    assert item["rendered"] is False
    assert validate(item) == []


def test_loader_takes_the_first_value_and_canonicalises():
    loader = ProductLoader()
    loader.add_value("url", "HTTP://Shop.Example/p?b=1&a=2")
    loader.add_value("title", ["  First&nbsp;title ", "second"])
    loader.add_value("price", "1 299,00 €")
    loader.add_value("related", ["http://s/x#top", "http://s/x", "http://s/y"])
    item = loader.load_item()
    assert item["url"] == "http://shop.example/p?a=2&b=1"
    assert item["title"] == "First title"
    assert item["price"] == Decimal("1299.00")
    assert item["related"] == ["http://s/x", "http://s/y"]


# ----------------------------------------------------------------------------- schemas


def valid_product(**changes) -> ProductItem:
    values = dict(url="https://shop.example/p/1", title="A lamp", price=Decimal("12.50"),
                  currency="EUR", published=datetime(2024, 1, 1, tzinfo=timezone.utc),
                  related=["https://shop.example/p/2"], rendered=False)
    values.update(changes)
    return ProductItem(**{k: v for k, v in values.items() if v is not ...})


def reasons(item) -> set[str]:
    return {v.key for v in validate(item)}


def test_valid_product_has_no_violations():
    assert validate(valid_product()) == []
    assert validate(valid_product(published=..., related=..., rendered=...)) == []


@pytest.mark.parametrize("changes,expected", [
    ({"price": ...}, {"price_missing"}),
    ({"price": None}, {"price_missing"}),
    ({"price": Decimal("-1")}, {"price_min"}),
    ({"price": "12.50"}, {"price_type"}),
    ({"title": ""}, {"title_missing"}),
    ({"title": "x" * 1001}, {"title_max_length"}),
    ({"currency": "euro"}, {"currency_pattern"}),
    ({"url": "ftp://x"}, {"url_pattern"}),
    ({"url": ...}, {"url_missing"}),
    ({"published": datetime(2024, 1, 1)}, {"published_naive_datetime"}),
    ({"published": "2024-01-01"}, {"published_type"}),
    ({"related": ["ok", 3]}, {"related_item_type"}),
    ({"rendered": 1}, {"rendered_type"}),
    ({"price": ..., "currency": ...}, {"price_missing", "currency_missing"}),
])
def test_product_schema_violations(changes, expected):
    assert reasons(valid_product(**changes)) == expected


def test_schema_rules():
    rule = Schema(required=True, type=int, min=1, max=5)
    assert rule.violations("n", 3) == []
    assert [v.reason for v in rule.violations("n", 0)] == ["min"]
    assert [v.reason for v in rule.violations("n", 9)] == ["max"]
    assert [v.reason for v in rule.violations("n", True)] == ["type"]  # bool is not an int here
    assert [v.reason for v in rule.violations("n", None)] == ["missing"]
    assert Schema(type=int).violations("n", None) == []  # optional and absent
    assert [v.reason for v in Schema(choices={"a", "b"}).violations("c", "z")] == ["choices"]
    assert [v.reason for v in Schema(min_length=2).violations("s", "a")] == ["min_length"]
    assert [v.reason for v in Schema(check=lambda v: "odd" if v % 2 else None)
            .violations("n", 3)] == ["odd"]


@dataclass
class ReviewItem:
    """A dataclass item declaring processors and schema in field metadata."""

    review_id: str | None = field(default=None, metadata={
        "output_processor": TakeFirst(), "schema": Schema(required=True, type=str)})
    text: str | None = field(default=None, metadata={
        "input_processor": MapCompose(clean_text), "output_processor": TakeFirst(),
        "schema": Schema(required=True, type=str)})
    rating: int | None = field(default=None, metadata={
        "input_processor": MapCompose(int), "output_processor": TakeFirst(),
        "schema": Schema(required=True, type=int, min=1, max=5)})
    stars_shown: int | None = field(default=None, metadata={"output_processor": TakeFirst()})

    item_checks = (lambda a: [Violation("stars_shown", "mismatch", "stars differ from rating")]
                   if a.get("stars_shown") not in (None, a.get("rating")) else [],)


def test_dataclass_items_clean_and_validate_the_same_way():
    loader = ItemLoader(item=ReviewItem())
    loader.add_value("review_id", "r1")
    loader.add_value("text", "  Great&nbsp;lamp!  ")
    loader.add_value("rating", "4")
    item = loader.load_item()
    assert item.text == "Great lamp!" and item.rating == 4
    assert validate(item) == []
    assert {v.key for v in validate(ReviewItem(review_id="r2", rating=9))} == {
        "text_missing", "rating_max"}
    assert {v.key for v in validate(ReviewItem(review_id="r", text="t", rating=2,
                                               stars_shown=3))} == {"stars_shown_mismatch"}
