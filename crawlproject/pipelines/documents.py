"""From items to MongoDB writes: BSON values, content hashes, idempotent updates.

A :class:`WriteOp` is one item ready to store: its collection, its key (field
and value), its fields as BSON-ready values, the sha1 ``content_hash`` of those
fields and ``seen``, the time it went through the pipeline. With
``key_as_id`` (the default) the key is also the document's ``_id``, so
MongoDB's own unique ``_id`` index keeps one document per key and no second
index is needed; otherwise documents get ObjectIds and a unique index on the
key field.

Every write is idempotent and order-independent:

* :func:`insert_document` builds the document inserted when the key is new
  (``first_seen`` = ``updated_at`` = ``seen``);
* :func:`upsert_update` builds an aggregation-pipeline update (MongoDB 4.2+)
  for ``update_one(op.filter, ..., upsert=True)`` that rewrites the
  document only when its content hash differs *and* the stored version is not
  newer than ``seen``; ``first_seen`` is kept, ``updated_at`` becomes ``seen``.
  An unchanged item is no write at all (``nModified`` 0), a replayed or
  delayed older version never overwrites a newer one. A ``gone_at`` mark
  older than ``seen`` is removed (and ``updated_at`` becomes ``seen``): the
  item was seen again.
* :func:`gone_update` (ops of kind ``gone``, :meth:`WriteOp.gone`) marks a
  stored document gone (``gone_at`` = ``seen``) without touching its other
  fields, unless it was stored again after ``seen``; it never inserts.
* :func:`touch_update` (ops of kind ``touch``) sets the op's fields (and
  ``updated_at``) on a stored document last updated at or before ``seen``: a
  plain ``$set``, far cheaper than a rewrite; it never inserts (a page record
  checked again, :class:`crawlproject.recrawl.PageCheck`).

:func:`to_spool_line` / :func:`from_spool_line` turn a WriteOp into one line
of extended JSON (``bson.json_util``, canonical mode: Decimal128 and dates
round-trip exactly) and back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, Mapping

import bson
from bson import json_util
from bson.decimal128 import Decimal128
from bson.json_util import CANONICAL_JSON_OPTIONS
from itemadapter import ItemAdapter
from scrapy import Item

from crawlproject.connection import collection_name  # noqa: F401  (re-exported, in __all__)

__all__ = ["WriteOp", "item_fields", "to_mongo", "decimal128", "content_hash", "insert_document",
           "upsert_update", "gone_update", "touch_update", "to_spool_line", "from_spool_line", "utc_now_ms",
           "collection_name", "gone_op", "EPOCH", "KINDS"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SPOOL_JSON = CANONICAL_JSON_OPTIONS.with_options(tz_aware=True, tzinfo=timezone.utc)
#: What an op does: store an item, mark a stored one gone, or set some fields
#: of a stored document (``touch``).
KINDS = ("item", "gone", "touch")


@dataclass(slots=True)
class WriteOp:
    """One item to store: where, under which key, which fields, seen when."""

    database: str
    collection: str
    key_field: str
    key: Any
    fields: dict[str, Any]
    hash: str
    seen: datetime
    key_as_id: bool = True
    kind: str = "item"

    @classmethod
    def build(cls, database: str, collection: str, key_field: str,
              fields: Mapping[str, Any], seen: datetime | None = None,
              key_as_id: bool = True, kind: str = "item") -> "WriteOp":
        """A WriteOp for *fields* (already BSON-ready, see :func:`to_mongo`).

        With *key_as_id* the key is also the document's ``_id``. Raises
        ``KeyError`` when the key field is missing, ``None`` or not a scalar,
        and ``bson.errors.InvalidDocument`` / ``OverflowError`` when a value
        cannot be stored in BSON.
        """
        doc = {k: v for k, v in fields.items() if k != "_id"}
        key = doc.get(key_field)
        if key is None or isinstance(key, (list, dict)):
            raise KeyError(key_field)
        if kind not in ("item", "touch"):
            raise ValueError(f"WriteOp.build makes item and touch ops, not {kind!r}")
        return cls(database, collection, key_field, key, doc,
                   content_hash(doc), seen or utc_now_ms(), key_as_id, kind)

    @classmethod
    def gone(cls, database: str, collection: str, key_field: str, key: Any,
             seen: datetime | None = None, key_as_id: bool = True) -> "WriteOp":
        """An op that marks the stored document of *key* gone (see :func:`gone_update`)."""
        if key is None or isinstance(key, (list, dict)):
            raise KeyError(key_field)
        return cls(database, collection, key_field, key, {}, "", seen or utc_now_ms(),
                   key_as_id, "gone")

    @property
    def filter(self) -> dict[str, Any]:
        """The query that finds this op's document."""
        return {"_id": self.key} if self.key_as_id else {self.key_field: self.key}


def utc_now_ms() -> datetime:
    """Now in UTC, truncated to the millisecond (BSON dates' precision)."""
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


_PLAIN = frozenset({str, int, float, bool, type(None), datetime, bytes, Decimal128})


def item_fields(item: Any) -> dict[str, Any]:
    """The fields of an item (Scrapy Item, dataclass, attrs, dict...) as BSON values."""
    if isinstance(item, (dict, Item)):
        return {str(k): to_mongo(v) for k, v in item.items()}
    return {str(k): to_mongo(v) for k, v in ItemAdapter(item).items()}


def to_mongo(value: Any) -> Any:
    """Convert values BSON cannot hold as-is: Decimal → Decimal128, sets and
    tuples → lists, dates → midnight UTC datetimes, nested items and mappings
    recursively."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is Decimal:
        return decimal128(value)
    if kind is list or kind is tuple or kind is set or kind is frozenset:
        return [to_mongo(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_mongo(v) for k, v in value.items()}
    if isinstance(value, Decimal):
        return decimal128(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_mongo(v) for v in value]
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    if ItemAdapter.is_item(value):
        return item_fields(value)
    return value


_BID_SIGN = 1 << 63
_BID_LOW = (1 << 64) - 1


def decimal128(value: Decimal) -> Decimal128:
    """``Decimal128(value)``, computed directly for the common case (finite,
    at most 34 digits, exponent in range), where bson's generic conversion
    is slow; anything else goes through bson."""
    if value.is_finite():
        sign, digits, exponent = value.as_tuple()
        if len(digits) <= 34 and -6176 <= exponent <= 6111:
            significand = int("".join(map(str, digits)))
            high = (significand >> 64) | ((exponent + 6176) << 49)
            if sign:
                high |= _BID_SIGN
            return Decimal128((high, significand & _BID_LOW))
    return Decimal128(value)


def _sorted(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _sorted(value[k]) for k in sorted(value)}
    if kind is list and any(type(v) is dict or type(v) is list for v in value):
        return [_sorted(v) for v in value]
    return value


def content_hash(fields: Mapping[str, Any]) -> str:
    """sha1 of the canonical BSON of *fields* (keys sorted at every level).

    Also proves the fields can be stored: it raises when BSON cannot encode them.
    """
    return hashlib.sha1(bson.encode(_sorted(dict(fields)))).hexdigest()


def insert_document(op: WriteOp) -> dict[str, Any]:
    """The document to insert when *op*'s key is not stored yet."""
    doc = {"_id": op.key} if op.key_as_id else {}
    doc.update(op.fields)
    doc["content_hash"] = op.hash
    doc["first_seen"] = doc["updated_at"] = op.seen
    return doc


def upsert_update(op: WriteOp) -> list[dict[str, Any]]:
    """Aggregation-pipeline update for ``update_one(op.filter, ..., upsert=True)``.

    Rewrites the document only if its ``content_hash`` differs and its
    ``updated_at`` is not after ``op.seen``; values are wrapped in ``$literal``
    so strings starting with ``$`` stay strings.
    """
    new = {**op.fields, "content_hash": op.hash, "updated_at": op.seen}
    back = {"$lt": [{"$ifNull": ["$gone_at", {"$literal": op.seen}]}, {"$literal": op.seen}]}
    changed = {"$and": [
        {"$ne": ["$content_hash", op.hash]},
        {"$lte": [{"$ifNull": ["$updated_at", EPOCH]}, op.seen]},
    ]}
    return [{"$replaceWith": {"$cond": {
        "if": changed,
        "then": {"$mergeObjects": [
            "$$ROOT",
            {"$literal": new},
            {"first_seen": {"$ifNull": ["$first_seen", {"$literal": op.seen}]}},
        ]},
        "else": "$$ROOT",
    }}}, {"$set": {
        # Marked gone before this sighting: not gone any more ($$REMOVE drops
        # the field; a document without one stays without one), and updated
        # now, so that a delayed older mark cannot apply again.
        "gone_at": {"$cond": [back, "$$REMOVE", "$gone_at"]},
        "updated_at": {"$cond": [back, {"$literal": op.seen}, "$updated_at"]},
    }}]


def touch_update(op: WriteOp) -> tuple[dict[str, Any], dict[str, Any]]:
    """(filter, update) for ``update_one(..., upsert=False)`` of an op of kind
    ``touch``: the fields are set only on a document not updated after ``op.seen``."""
    query = {**op.filter, "$or": [{"updated_at": {"$lte": op.seen}},
                                  {"updated_at": {"$exists": False}}]}
    return query, {"$set": {**op.fields, "updated_at": op.seen}}


def gone_update(op: WriteOp) -> list[dict[str, Any]]:
    """Aggregation-pipeline update for ``update_one(op.filter, ..., upsert=False)``
    of an op of kind ``gone``: set ``gone_at`` unless the document is already
    marked or was stored after ``op.seen``."""
    applies = {"$and": [
        {"$lte": [{"$ifNull": ["$updated_at", EPOCH]}, op.seen]},
        {"$eq": [{"$ifNull": ["$gone_at", None]}, None]},
    ]}
    return [{"$replaceWith": {"$cond": {
        "if": applies,
        "then": {"$mergeObjects": ["$$ROOT", {"gone_at": {"$literal": op.seen}}]},
        "else": "$$ROOT",
    }}}]


def gone_op(database: str, mark: Mapping[str, Any], key_as_id: bool = True) -> WriteOp:
    """The op of a gone mark (``{collection, key_field, key}``, from a page
    record read back from MongoDB: checked like a spool line). Raises
    ``KeyError`` for a mark that names no storable key, ``ValueError`` for a
    collection or field the pipeline may not write."""
    collection, key_field = mark.get("collection"), mark.get("key_field")
    if not _valid_name(collection) or not isinstance(key_field, str) or not key_field \
            or key_field.startswith("$"):
        raise ValueError(f"gone mark names collection {collection!r} / field {key_field!r}")
    return WriteOp.gone(database, collection, key_field, mark.get("key"), key_as_id=key_as_id)


def to_spool_line(op: WriteOp) -> str:
    """One line of canonical extended JSON (without the newline)."""
    record = {"db": op.database, "coll": op.collection, "kf": op.key_field, "k": op.key,
              "f": op.fields, "h": op.hash, "s": op.seen, "id": op.key_as_id}
    if op.kind != "item":
        record["w"] = op.kind
    return json_util.dumps(record, json_options=_SPOOL_JSON, separators=(",", ":"))


def from_spool_line(line: str) -> WriteOp:
    """The WriteOp of a line written by :func:`to_spool_line`.

    Raises ``ValueError``, and nothing else, for anything else: lines come
    from local files and from Redis (the handoff list), where anyone who can
    write to Redis could put them.
    """
    try:
        r = json_util.loads(line, json_options=_SPOOL_JSON)
        op = WriteOp(r["db"], r["coll"], r["kf"], r["k"], r["f"], r["h"], r["s"],
                     bool(r.get("id", False)), r.get("w", "item"))
    except Exception as exc:  # noqa: BLE001 - whatever the line holds
        raise ValueError(f"malformed spool record: {type(exc).__name__}: {exc}") from None
    if not (isinstance(op.database, str) and _valid_name(op.collection)
            and isinstance(op.key_field, str) and op.key_field and not op.key_field.startswith("$")
            and isinstance(op.fields, dict) and isinstance(op.hash, str)
            and isinstance(op.seen, datetime) and op.kind in KINDS):
        raise ValueError("malformed spool record: wrong field types or collection name")
    return op


def _valid_name(collection: Any) -> bool:
    return (isinstance(collection, str) and 0 < len(collection) < 200
            and not collection.startswith("system.") and "$" not in collection
            and "\0" not in collection)
