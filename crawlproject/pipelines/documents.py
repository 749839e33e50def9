"""From items to MongoDB writes: BSON values, content hashes, idempotent updates.

A :class:`WriteOp` is one item ready to store: its collection, its key (field
and value), its fields as BSON-ready values, the sha1 ``content_hash`` of those
fields and ``seen``, the time it went through the pipeline.

Every write is idempotent and order-independent:

* :func:`insert_document` builds the document inserted when the key is new
  (``first_seen`` = ``updated_at`` = ``seen``);
* :func:`upsert_update` builds an aggregation-pipeline update (MongoDB 4.2+)
  for ``update_one({key: value}, ..., upsert=True)`` that rewrites the
  document only when its content hash differs *and* the stored version is not
  newer than ``seen``; ``first_seen`` is kept, ``updated_at`` becomes ``seen``.
  An unchanged item is no write at all (``nModified`` 0), a replayed or
  delayed older version never overwrites a newer one.

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

__all__ = ["WriteOp", "to_mongo", "content_hash", "insert_document", "upsert_update",
           "to_spool_line", "from_spool_line", "utc_now_ms", "EPOCH"]

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SPOOL_JSON = CANONICAL_JSON_OPTIONS.with_options(tz_aware=True, tzinfo=timezone.utc)


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

    @classmethod
    def build(cls, database: str, collection: str, key_field: str,
              fields: Mapping[str, Any], seen: datetime | None = None) -> "WriteOp":
        """A WriteOp for *fields* (already BSON-ready, see :func:`to_mongo`).

        Raises ``KeyError`` when the key field is missing or ``None``, and
        ``bson.errors.InvalidDocument`` / ``OverflowError`` when a value
        cannot be stored in BSON.
        """
        doc = {k: v for k, v in fields.items() if k != "_id"}
        if doc.get(key_field) is None:
            raise KeyError(key_field)
        return cls(database, collection, key_field, doc[key_field], doc,
                   content_hash(doc), seen or utc_now_ms())


def utc_now_ms() -> datetime:
    """Now in UTC, truncated to the millisecond (BSON dates' precision)."""
    now = datetime.now(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def to_mongo(value: Any) -> Any:
    """Convert values BSON cannot hold as-is: Decimal → Decimal128, sets and
    tuples → lists, dates → midnight UTC datetimes, nested mappings recursively."""
    if isinstance(value, Decimal):
        return Decimal128(value)
    if isinstance(value, Mapping):
        return {str(k): to_mongo(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_mongo(v) for v in value]
    if isinstance(value, date) and not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=timezone.utc)
    return value


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def content_hash(fields: Mapping[str, Any]) -> str:
    """sha1 of the canonical BSON of *fields* (keys sorted at every level).

    Also proves the fields can be stored: it raises when BSON cannot encode them.
    """
    return hashlib.sha1(bson.encode(_sorted(dict(fields)))).hexdigest()


def insert_document(op: WriteOp) -> dict[str, Any]:
    """The document to insert when *op*'s key is not stored yet."""
    return {**op.fields, "content_hash": op.hash, "first_seen": op.seen, "updated_at": op.seen}


def upsert_update(op: WriteOp) -> list[dict[str, Any]]:
    """Aggregation-pipeline update for ``update_one({key: value}, ..., upsert=True)``.

    Rewrites the document only if its ``content_hash`` differs and its
    ``updated_at`` is not after ``op.seen``; values are wrapped in ``$literal``
    so strings starting with ``$`` stay strings.
    """
    new = {**op.fields, "content_hash": op.hash, "updated_at": op.seen}
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
    }}}]


def to_spool_line(op: WriteOp) -> str:
    """One line of canonical extended JSON (without the newline)."""
    record = {"db": op.database, "coll": op.collection, "kf": op.key_field, "k": op.key,
              "f": op.fields, "h": op.hash, "s": op.seen}
    return json_util.dumps(record, json_options=_SPOOL_JSON, separators=(",", ":"))


def from_spool_line(line: str) -> WriteOp:
    """The WriteOp of a line written by :func:`to_spool_line` (``ValueError`` if malformed)."""
    try:
        r = json_util.loads(line, json_options=_SPOOL_JSON)
        return WriteOp(r["db"], r["coll"], r["kf"], r["k"], r["f"], r["h"], r["s"])
    except (KeyError, TypeError, bson.errors.BSONError) as exc:
        raise ValueError(f"malformed spool record: {exc}") from exc
