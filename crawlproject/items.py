"""Item types, each with its cleaning rules and its schema beside its fields.

Cleaning uses the well-kept libraries: w3lib (entities, URLs), price-parser
(amount and currency), dateparser (dates to timezone-aware UTC); the last two are
the ``items`` extra, imported when a price or a date is first parsed. Validation
rules are :class:`crawlproject.validation.Schema` objects in each field's
``schema`` metadata. Storage is keyed on the field named by the class
attribute ``mongo_key`` (default: the ``MONGO_UNIQUE_KEY`` setting, ``url``);
``mongo_collection`` optionally names the collection.

A user adding an item type declares its fields, processors, schema and key
here, in one place (see ``docs/pipelines.md``). Dataclasses work the same way,
with ``field(metadata={"input_processor": ..., "schema": ...})``.
"""

from __future__ import annotations

import importlib
import re
from datetime import datetime, timezone
from decimal import Decimal

from itemloaders.processors import Identity, MapCompose, TakeFirst
from scrapy import Field, Item
from scrapy.loader import ItemLoader
from w3lib.html import remove_tags, replace_entities
from w3lib.url import canonicalize_url

from crawlproject.validation import Schema

_WS = re.compile(r"\s+")
_CURRENCY_SYMBOLS = {"$": "USD", "US$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY",
                     "円": "JPY", "₹": "INR", "CHF": "CHF"}
_DATEPARSER_SETTINGS = {"TIMEZONE": "UTC", "TO_TIMEZONE": "UTC",
                        "RETURN_AS_TIMEZONE_AWARE": True, "PREFER_DAY_OF_MONTH": "first",
                        "DATE_ORDER": "DMY"}


ITEMS_EXTRA = "pip install '/path/to/checkout[items]' (this package's checkout or wheel)"


class ItemsExtraMissing(ImportError):
    """A price or date processor ran without the ``items`` extra installed."""


def _load(module: str, what: str):
    """*module* (price_parser, dateparser), imported on first use: a node whose
    items parse no price or date needs neither. Missing: an error naming the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module:
            raise
        raise ItemsExtraMissing(f"{what} needs {module} ({exc.name} is missing): "
                                f"{ITEMS_EXTRA}") from None


def require_items_extra() -> None:
    """Raise :class:`ItemsExtraMissing` now, at start, rather than on every page
    (for spiders whose items parse prices or dates)."""
    _load("price_parser", "crawling with price processors")
    _load("dateparser", "crawling with date processors")


def clean_text(value: str) -> str | None:
    """Decode entities, turn non-breaking spaces into spaces, collapse whitespace."""
    text = replace_entities(remove_tags(value)).replace("\xa0", " ")
    return _WS.sub(" ", text).strip() or None


def parse_price_amount(value: str) -> Decimal | None:
    """``"1 299,00 €"`` → ``Decimal("1299.00")``."""
    return _load("price_parser", "parse_price_amount").Price.fromstring(
        value.replace("\xa0", " ")).amount


def parse_currency(value: str) -> str | None:
    """``"1 299,00 €"`` → ``"EUR"`` (ISO 4217 code when it can be told)."""
    symbol = _load("price_parser", "parse_currency").Price.fromstring(
        value.replace("\xa0", " ")).currency
    if not symbol:
        return None
    symbol = symbol.strip()
    return _CURRENCY_SYMBOLS.get(symbol, symbol.upper() if len(symbol) == 3 else symbol)


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?"
                       r"(?:Z|[+-]\d{2}:?\d{2})?)?")


def parse_date(value: str) -> datetime | None:
    """Any common date format → timezone-aware UTC datetime.

    ISO 8601 text is parsed directly (fast); anything else by dateparser
    (day-first for ambiguous numeric dates). A date without a time zone is
    taken as UTC.
    """
    value = value.strip()
    if _ISO_DATE.fullmatch(value):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            parsed = None
        if parsed is not None:
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            return parsed.astimezone(timezone.utc)
    parsed = _load("dateparser", "parse_date").parse(value, settings=_DATEPARSER_SETTINGS)
    if parsed is None:
        return None
    return parsed.astimezone(timezone.utc)


def canonical_url(value: str) -> str:
    """Canonical form of a URL (sorted query, no fragment, normalised escapes)."""
    return canonicalize_url(value.strip())


def unique(values: list) -> list:
    """De-duplicate, keeping first-seen order."""
    return list(dict.fromkeys(values))


class ProductItem(Item):
    """One product page of a shop, stored once per canonical URL."""

    mongo_key = "url"

    url = Field(input_processor=MapCompose(canonical_url),
                schema=Schema(required=True, type=str, pattern=r"https?://\S+"))
    title = Field(input_processor=MapCompose(clean_text),
                  schema=Schema(required=True, type=str, max_length=1000))
    price = Field(input_processor=MapCompose(clean_text, parse_price_amount),
                  schema=Schema(required=True, type=Decimal, min=Decimal(0)))
    currency = Field(input_processor=MapCompose(clean_text, parse_currency),
                     schema=Schema(required=True, type=str, pattern=r"[A-Z]{3}"))
    published = Field(input_processor=MapCompose(clean_text, parse_date),
                      schema=Schema(type=datetime, tz_aware=True))
    description = Field(input_processor=MapCompose(clean_text),
                        schema=Schema(type=str))
    related = Field(input_processor=MapCompose(canonical_url), output_processor=unique,
                    schema=Schema(type=list, item_type=str))
    rendered = Field(output_processor=TakeFirst(), schema=Schema(type=bool))


class ProductLoader(ItemLoader):
    """Loader for :class:`ProductItem` (first value wins for scalar fields)."""

    default_item_class = ProductItem
    default_output_processor = TakeFirst()
    default_input_processor = Identity()
