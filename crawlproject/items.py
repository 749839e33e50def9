"""Item types, each with its cleaning rules beside its fields.

Cleaning uses the well-kept libraries: w3lib (entities, URLs), price-parser
(amount and currency), dateparser (dates to timezone-aware UTC). A user adding
an item type declares its fields and processors here, in one place.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from decimal import Decimal

import dateparser
from itemloaders.processors import Identity, MapCompose, TakeFirst
from price_parser import Price
from scrapy import Field, Item
from scrapy.loader import ItemLoader
from w3lib.html import remove_tags, replace_entities
from w3lib.url import canonicalize_url

_WS = re.compile(r"\s+")
_CURRENCY_SYMBOLS = {"$": "USD", "US$": "USD", "€": "EUR", "£": "GBP", "¥": "JPY",
                     "円": "JPY", "₹": "INR", "CHF": "CHF"}
_DATEPARSER_SETTINGS = {"TIMEZONE": "UTC", "TO_TIMEZONE": "UTC",
                        "RETURN_AS_TIMEZONE_AWARE": True, "PREFER_DAY_OF_MONTH": "first",
                        "DATE_ORDER": "DMY"}


def clean_text(value: str) -> str | None:
    """Decode entities, turn non-breaking spaces into spaces, collapse whitespace."""
    text = replace_entities(remove_tags(value)).replace("\xa0", " ")
    return _WS.sub(" ", text).strip() or None


def parse_price_amount(value: str) -> Decimal | None:
    """``"1 299,00 €"`` → ``Decimal("1299.00")``."""
    return Price.fromstring(value.replace("\xa0", " ")).amount


def parse_currency(value: str) -> str | None:
    """``"1 299,00 €"`` → ``"EUR"`` (ISO 4217 code when it can be told)."""
    symbol = Price.fromstring(value.replace("\xa0", " ")).currency
    if not symbol:
        return None
    symbol = symbol.strip()
    return _CURRENCY_SYMBOLS.get(symbol, symbol.upper() if len(symbol) == 3 else symbol)


def parse_date(value: str) -> datetime | None:
    """Any common date format → timezone-aware UTC datetime."""
    parsed = dateparser.parse(value.strip(), settings=_DATEPARSER_SETTINGS)
    if parsed is None:
        return None
    return parsed.astimezone(timezone.utc)


def canonical_url(value: str) -> str:
    return canonicalize_url(value.strip())


def unique(values: list) -> list:
    """De-duplicate, keeping first-seen order."""
    return list(dict.fromkeys(values))


class ProductItem(Item):
    """One product page of a shop."""

    url = Field(input_processor=MapCompose(canonical_url))
    title = Field(input_processor=MapCompose(clean_text))
    price = Field(input_processor=MapCompose(clean_text, parse_price_amount))
    currency = Field(input_processor=MapCompose(clean_text, parse_currency))
    published = Field(input_processor=MapCompose(clean_text, parse_date))
    description = Field(input_processor=MapCompose(clean_text))
    related = Field(input_processor=MapCompose(canonical_url), output_processor=unique)
    rendered = Field(output_processor=TakeFirst())


class ProductLoader(ItemLoader):
    """Loader for :class:`ProductItem` (first value wins for scalar fields)."""

    default_item_class = ProductItem
    default_output_processor = TakeFirst()
    default_input_processor = Identity()
