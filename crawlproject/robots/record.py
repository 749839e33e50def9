"""A site's robots.txt as the cluster stores it (``{spider}:robots:<origin>``).

A value signed by a node (:mod:`crawlproject.signing`, purpose ``"robots"``,
scope the spider) whose data is JSON ``{"origin": str, "status": int, "body":
str, "fetched": s, "expires": s, "keep": s, "failures": int, "reason": str}``
(times in epoch seconds, wall clock: it is shared by every node). ``origin`` is
the site the record is for (``scheme://host[:port]``, as in its key): a record
is worth nothing under another site's key. ``body`` is what robots.txt means
for this crawler (:func:`crawlproject.robots.rules.normalise`: the groups that
apply to its user agent and ``*``, normalised, a bounded number of rules), at
most :data:`MAX_BODY` bytes, zlib-compressed and base64-encoded: a record's
size follows the rules that apply, not the file's padding.

What ``status`` means follows RFC 9309 §2.3.1: 2xx — the rules in ``body``;
4xx but 429 — allow all; 3xx — redirects not followed to the end (a loop, more
than five): *unavailable* in the RFC's words, allow all; 429, 5xx and 0 (no
answer at all: ``reason`` says why) — *unreachable*: the site is disallowed for
now and its pages wait. ``fetched`` is when the rules were read, ``expires``
when robots.txt is fetched again, ``keep`` the last moment the record may be
used at all: a site that stops answering keeps its last rules until then
(``failures`` counts the fetches that failed since, ``reason`` says the last
one's cause), up to ``ROBOTSTXT_CACHE_MAX_AGE`` (RFC 9309 §2.4: 30 days).

Everything read from Redis is untrusted: :func:`decode_record` refuses a value
longer than :data:`MAX_RECORD` before anything else, then one no node of this
crawl signed for this origin (:class:`UnprovenRecord`), and accepts only this
shape, with bounds; it raises ``ValueError`` for anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from dataclasses import dataclass

from crawlproject.signing import Signer

#: Bytes of a robots.txt kept and parsed; the rest is cut off (RFC 9309 §2.5: at
#: least 500 KiB must be parsed; Google parses 500 KiB).
MAX_BODY = 500 * 1024
#: Characters of a stored origin.
MAX_ORIGIN = 1024
#: Longest stored value: :data:`MAX_BODY` bytes that do not compress (zlib adds
#: 5 bytes a 16 KiB block), base64, and the rest of the record with room to spare.
MAX_RECORD = 4 * (MAX_BODY + 1024) // 3 + 8 * MAX_ORIGIN
#: The signature's purpose (part of its MAC).
PURPOSE = "robots"

#: Characters of a stored reason.
MAX_REASON = 300

RULES, ALLOW_ALL, UNAVAILABLE = "rules", "allow_all", "unavailable"
_FIELDS = {"origin", "status", "body", "fetched", "expires", "keep", "failures", "reason"}


class UnprovenRecord(ValueError):
    """No node of this crawl is proven to have stored this record for this origin."""


@dataclass(frozen=True)
class RobotsRecord:
    """One site's robots.txt answer, shared by every node."""

    status: int
    body: bytes
    fetched: float
    expires: float
    origin: str = ""
    keep: float = 0.0
    failures: int = 0
    reason: str = ""

    @property
    def state(self) -> str:
        """:data:`RULES`, :data:`ALLOW_ALL` or :data:`UNAVAILABLE` (see the
        module docstring)."""
        return state_of(self.status)

    @property
    def usable_until(self) -> float:
        """The last moment the record may be used (its ``keep``, else its expiry)."""
        return max(self.keep, self.expires)


def state_of(status: int) -> str:
    """What a robots.txt answer of *status* means (RFC 9309 §2.3.1)."""
    if 200 <= status < 300:
        return RULES
    if 300 <= status < 400 or (400 <= status < 500 and status != 429):
        return ALLOW_ALL
    return UNAVAILABLE


def encode_record(record: RobotsRecord, signer: Signer) -> str:
    """The stored value of *record*: its JSON, signed (the body cut to
    :data:`MAX_BODY` bytes)."""
    packed = base64.b64encode(zlib.compress(record.body[:MAX_BODY])).decode("ascii")
    data = json.dumps({"origin": record.origin, "status": record.status, "body": packed,
                       "fetched": record.fetched, "expires": record.expires,
                       "keep": record.keep, "failures": record.failures,
                       "reason": record.reason[:MAX_REASON]}, separators=(",", ":"))
    return signer.sign(data, PURPOSE)


def decode_record(raw: bytes | str, signer: Signer, origin: str) -> RobotsRecord:
    """The record of *origin* stored as *raw*: :class:`UnprovenRecord` when no
    node of this crawl signed it for *origin*, ``ValueError`` for anything else
    that is not a record."""
    if len(raw) > MAX_RECORD:
        raise ValueError(f"robots.txt record too long ({len(raw)} bytes)")
    data, proven = signer.open(raw, PURPOSE)
    if not proven:
        raise UnprovenRecord("not signed by a node of this crawl")
    record = parse_record(data)
    if record.origin != origin:
        raise UnprovenRecord(f"signed for another site, {record.origin[:100]!r}")
    return record


def parse_record(data: str) -> RobotsRecord:
    """The record whose JSON is *data* (proof already checked); ``ValueError``
    for anything else."""
    data = json.loads(data)
    if not isinstance(data, dict) or set(data) != _FIELDS:
        raise ValueError("not a robots.txt record")
    origin, status = data["origin"], data["status"]
    if not isinstance(origin, str) or not 0 < len(origin) <= MAX_ORIGIN:
        raise ValueError("bad origin")
    if type(status) is not int or not (status == 0 or 100 <= status <= 599):
        raise ValueError(f"bad status {status!r}")
    times = []
    for name in ("fetched", "expires", "keep"):
        value = data[name]
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"bad {name} {value!r}")
        times.append(float(value))
    failures, reason = data["failures"], data["reason"]
    if type(failures) is not int or not 0 <= failures <= 1_000_000:
        raise ValueError(f"bad failures {failures!r}")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise ValueError("bad reason")
    return RobotsRecord(status, _unpack(data["body"]), times[0], times[1], origin, times[2],
                        failures, reason)


def _unpack(packed) -> bytes:
    if not isinstance(packed, str):
        raise ValueError("bad body")
    try:
        compressed = base64.b64decode(packed.encode("ascii"), validate=True)
        inflate = zlib.decompressobj()
        body = inflate.decompress(compressed, MAX_BODY + 1)  # never more than that in memory
    except (UnicodeEncodeError, binascii.Error, zlib.error) as exc:
        raise ValueError(f"bad body ({type(exc).__name__})") from None
    if len(body) > MAX_BODY or not inflate.eof or inflate.unused_data:
        raise ValueError("bad body (too long or not one zlib stream)")
    return body
