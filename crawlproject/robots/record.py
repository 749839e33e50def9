"""A site's robots.txt as the cluster stores it (``{spider}:robots:<origin>``).

JSON ``{"status": int, "body": str, "fetched": s, "expires": s}`` (epoch
seconds). ``status`` 0 means the site could not be reached (``body`` then says
why). What the status
means follows RFC 9309 §2.3.1: 2xx — the rules in ``body``; 4xx — no rules
(allow all), except 429, which is a request to slow down; 429, 5xx, a redirect
left unfollowed and 0 — *unavailable*: the site is treated as disallowed for
now and its pages wait, until the record expires and it is fetched again.

Everything read from Redis is untrusted: :func:`decode_record` accepts only
this shape, with bounds, and raises ``ValueError`` for anything else.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

#: Bytes of a robots.txt kept and parsed (RFC 9309 §2.5: at least 500 KiB).
MAX_BODY = 512 * 1024

RULES, ALLOW_ALL, UNAVAILABLE = "rules", "allow_all", "unavailable"


@dataclass(frozen=True)
class RobotsRecord:
    """One site's robots.txt answer, shared by every node."""

    status: int
    body: str
    fetched: float
    expires: float

    @property
    def state(self) -> str:
        """:data:`RULES`, :data:`ALLOW_ALL` or :data:`UNAVAILABLE`."""
        if 200 <= self.status < 300:
            return RULES
        if 400 <= self.status < 500 and self.status != 429:
            return ALLOW_ALL
        return UNAVAILABLE


def encode_record(record: RobotsRecord) -> str:
    """The stored JSON of *record*."""
    return json.dumps({"status": record.status, "body": record.body[:MAX_BODY],
                       "fetched": record.fetched, "expires": record.expires},
                      separators=(",", ":"))


def decode_record(raw: bytes | str) -> RobotsRecord:
    """The record stored as *raw*; ``ValueError`` for anything else."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if len(raw) > 8 * MAX_BODY:
        raise ValueError("robots.txt record too long")
    data = json.loads(raw)
    if not isinstance(data, dict) or set(data) != {"status", "body", "fetched", "expires"}:
        raise ValueError("not a robots.txt record")
    status, body = data["status"], data["body"]
    if type(status) is not int or not (status == 0 or 100 <= status <= 599):
        raise ValueError(f"bad status {status!r}")
    if not isinstance(body, str) or len(body) > MAX_BODY:
        raise ValueError("bad body")
    times = []
    for name in ("fetched", "expires"):
        value = data[name]
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"bad {name} {value!r}")
        times.append(float(value))
    return RobotsRecord(status, body, *times)
