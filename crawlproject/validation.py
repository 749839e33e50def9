"""Declarative item schemas: required fields, types, ranges, lengths, patterns.

A field declares its rules next to its cleaning processors, in the item
definition, through the ``schema`` key of its metadata::

    class ProductItem(Item):
        price = Field(input_processor=MapCompose(clean_text, parse_price_amount),
                      schema=Schema(required=True, type=Decimal, min=Decimal(0)))

    @dataclass
    class ReviewItem:
        rating: int | None = field(default=None, metadata={
            "schema": Schema(required=True, type=int, min=1, max=5)})

:func:`validate` checks an item (a Scrapy ``Item``, a dataclass, an attrs
class, a dict with no schema... anything :mod:`itemadapter` understands) and
returns the list of :class:`Violation`, empty when the item is valid. Checks
that span several fields go in an ``item_checks`` class attribute: callables
taking an :class:`~itemadapter.ItemAdapter` and returning violations.

The :class:`~crawlproject.pipelines.validation.ValidationPipeline` drops
invalid items and counts each violation in the stats as
``validation/dropped/<ItemClass>/<field>_<reason>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Collection, Iterable, NamedTuple

from itemadapter import ItemAdapter

__all__ = ["Schema", "Violation", "validate", "item_type_name"]

SCHEMA_META_KEY = "schema"

#: Reasons used in violations (and so in stats keys).
MISSING = "missing"
TYPE = "type"
MIN = "min"
MAX = "max"
MIN_LENGTH = "min_length"
MAX_LENGTH = "max_length"
CHOICES = "choices"
PATTERN = "pattern"
NAIVE = "naive_datetime"
ITEM_TYPE = "item_type"


class Violation(NamedTuple):
    """One broken rule: the field, a short machine-readable reason, a message."""

    field: str
    reason: str
    message: str

    @property
    def key(self) -> str:
        """``<field>_<reason>``, as used in stats keys."""
        return f"{self.field}_{self.reason}"


@dataclass(frozen=True)
class Schema:
    """The rules of one field. Every rule is optional.

    * ``required``: the value must be present and not ``None``, ``""`` or an
      empty list/dict. A missing optional field skips the other rules.
    * ``type``: a type or tuple of types (``bool`` is not accepted as an
      ``int`` unless listed).
    * ``min`` / ``max``: inclusive bounds (any comparable values).
    * ``min_length`` / ``max_length``: bounds on ``len(value)``.
    * ``choices``: the allowed values.
    * ``pattern``: a regular expression the (string) value must fully match.
    * ``item_type``: for lists, the type of every element.
    * ``tz_aware``: for datetimes, a timezone is required.
    * ``check``: a callable ``value -> str | None`` returning a reason (a short
      word used in stats keys) when the value is invalid.
    """

    required: bool = False
    type: type | tuple[type, ...] | None = None
    min: Any = None
    max: Any = None
    min_length: int | None = None
    max_length: int | None = None
    choices: Collection[Any] | None = None
    pattern: str | None = None
    item_type: type | tuple[type, ...] | None = None
    tz_aware: bool = False
    check: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        if self.pattern is not None:
            object.__setattr__(self, "_regex", re.compile(self.pattern))

    def violations(self, name: str, value: Any) -> list[Violation]:
        """The rules of this schema that *value* (of field *name*) breaks."""
        if _is_empty(value):
            if self.required:
                return [Violation(name, MISSING, f"{name} is required")]
            return []
        if self.type is not None and not _is_instance(value, self.type):
            return [Violation(name, TYPE, f"{name} must be {_type_names(self.type)}, "
                                          f"got {type(value).__name__}")]
        found: list[Violation] = []

        def add(reason: str, message: str) -> None:
            found.append(Violation(name, reason, f"{name} {message}"))

        try:
            if self.min is not None and value < self.min:
                add(MIN, f"must be >= {self.min!r}, got {value!r}")
            if self.max is not None and value > self.max:
                add(MAX, f"must be <= {self.max!r}, got {value!r}")
        except TypeError:
            return [Violation(name, TYPE, f"{name} cannot be compared with its bounds: {value!r}")]
        if self.min_length is not None or self.max_length is not None:
            size = len(value) if hasattr(value, "__len__") else None
            if size is None:
                add(TYPE, "has no length")
            elif self.min_length is not None and size < self.min_length:
                add(MIN_LENGTH, f"must have a length of at least {self.min_length}, got {size}")
            elif self.max_length is not None and size > self.max_length:
                add(MAX_LENGTH, f"must have a length of at most {self.max_length}, got {size}")
        if self.choices is not None and value not in self.choices:
            add(CHOICES, f"must be one of {sorted(map(str, self.choices))}, got {value!r}")
        if self.pattern is not None and not (isinstance(value, str)
                                             and self._regex.fullmatch(value)):
            add(PATTERN, f"does not match {self.pattern!r}: {value!r}")
        if self.item_type is not None and isinstance(value, (list, tuple, set, frozenset)):
            bad = [v for v in value if not _is_instance(v, self.item_type)]
            if bad:
                add(ITEM_TYPE, f"elements must be {_type_names(self.item_type)}: {bad[0]!r}")
        if self.tz_aware and isinstance(value, datetime) and value.utcoffset() is None:
            add(NAIVE, "must be timezone-aware")
        if self.check is not None:
            reason = self.check(value)
            if reason:
                add(str(reason), f"failed check {reason!r}: {value!r}")
        return found


def item_type_name(item: Any) -> str:
    """The name used for *item*'s type in stats keys (its class name)."""
    return type(item).__name__


def validate(item: Any) -> list[Violation]:
    """Every rule *item* breaks, from its fields' schemas and its ``item_checks``."""
    adapter = ItemAdapter(item)
    found: list[Violation] = []
    for name in adapter.field_names():
        schema = adapter.get_field_meta(name).get(SCHEMA_META_KEY)
        if schema is not None:
            found.extend(schema.violations(name, adapter.get(name)))
    for check in getattr(type(item), "item_checks", ()) or ():
        found.extend(_as_violations(check(adapter)))
    return found


def _as_violations(result: Iterable | None) -> list[Violation]:
    if not result:
        return []
    if isinstance(result, Violation):
        return [result]
    return [v if isinstance(v, Violation) else Violation(*v) for v in result]


def _is_empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, (str, list, tuple, dict, set, frozenset)):
        return len(value) == 0
    return False


def _is_instance(value: Any, types: type | tuple[type, ...]) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _type_names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
