"""Dead letters read back from Redis: shown, or replayed into the frontier.

A dead-letter record (``T:dead``, written by a node: ``{member, key, payload,
priority, url, kind, reason, attempts, node, at}``) is untrusted like anything
read from Redis: anyone who can write there can push a record that is not
JSON, JSON of another shape, values of the wrong type or of any size, or a
``key`` naming another host (``|127.0.0.1`` would write over that host's
limits). So:

* every record is read by :func:`read_record`, which never raises: a record
  comes out with the fields an operator may see (strings cut short, nested
  values summarised), or with the reason it cannot be read;
* a record is replayed only with a politeness key computed from its payload's
  URL by the nodes' own function (passed in as *key_of*: the command line's
  :mod:`crawlproject.ops.actions` builds it from the project's settings),
  never from its ``key`` or ``member``; a record whose payload has no usable
  URL, or whose key belongs to another partition, is reported, not replayed;
* a signed payload (``"~1<MAC>:<JSON>"``, :mod:`crawlproject.signing`) is
  read with :func:`crawlproject.signing.unwrap` (never trusted here: the node
  checks the proof when it takes the entry) and requeued byte for byte, or its
  proof would no longer hold; an unsigned one loses its attempt counters (a
  fresh start).

No Scrapy here: the key function comes from the caller.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from crawlproject.keys import as_text
from crawlproject.signing import is_signed, unwrap

#: meta keys that count attempts; a replayed dead letter starts afresh. Its
#: redirect chain too: Scrapy's redirect_ttl at 0 would refuse the replay's
#: first hop even with REDIRECT_MAX_TIMES raised, and a loop is judged on the
#: chain the site serves then (the dead letter's reason names the old one).
ATTEMPT_META_KEYS = ("retry_times", "crawlproject_callback_attempts", "proxy_ban_tries",
                     "redirect_times", "redirect_ttl", "redirect_urls", "redirect_reasons")
#: Characters of one value shown (longer ones are cut, with their length said).
SHOWN_MAX = 200
#: The largest record read (bytes): a bigger one is reported, not parsed.
RECORD_MAX = 4 * 1024 * 1024
#: The largest payload replayed (characters).
PAYLOAD_MAX = 1024 * 1024
MAX_PRIORITY = 4095

#: (url, the payload's JSON object) -> politeness key; raises ValueError when
#: the URL is not one a node could key.
KeyFunction = Callable[[str, dict], str]


@dataclass
class DeadLetter:
    """One record as read: *shown* (what an operator may see) or *problem*
    (why it cannot be shown or replayed); what a replay needs when usable."""

    raw: bytes
    shown: dict | None = None
    #: why it is not replayable (None: it is, given a key)
    problem: str | None = None
    payload: str | None = None
    data: dict | None = None
    url: str | None = None
    priority: int = 0


def read_record(raw: bytes | str, show_payload: bool = False) -> DeadLetter:
    """*raw* (a dead-list entry) read without ever raising; *show_payload*:
    its payload is part of what is shown (cut short), as for an invalid one."""
    raw = raw if isinstance(raw, bytes) else str(raw).encode("utf-8", "surrogatepass")
    letter = DeadLetter(raw)
    if len(raw) > RECORD_MAX:
        letter.problem = f"record of {len(raw)} bytes (over {RECORD_MAX})"
        return letter
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        letter.problem = "not JSON"
        return letter
    if not isinstance(record, dict):
        letter.problem = f"JSON {type(record).__name__}, not an object"
        return letter
    letter.shown = {str(k)[:SHOWN_MAX]: _shown(v) for k, v in record.items()
                    if show_payload or k != "payload"}
    letter.problem = _payload_problem(letter, record)
    if letter.url is not None and "url" not in letter.shown:
        letter.shown["url"] = _shown(letter.url)
    return letter


def _payload_problem(letter: DeadLetter, record: dict) -> str | None:
    payload = record.get("payload")
    if not isinstance(payload, str):
        return "no payload" if payload is None else f"payload is a {_kind(payload)}, not text"
    if len(payload) > PAYLOAD_MAX:
        return f"payload of {len(payload)} characters (over {PAYLOAD_MAX})"
    try:
        data = json.loads(unwrap(payload))
    except (ValueError, RecursionError):
        return "payload is not JSON"
    if not isinstance(data, dict):
        return "payload is not a JSON object"
    url = data.get("url")
    if not isinstance(url, str) or not _usable_url(url):
        return "payload has no usable URL"
    priority = _priority(record.get("priority"))
    if priority is None:
        return "priority is not a number"
    letter.payload, letter.data, letter.url, letter.priority = payload, data, url, priority
    return None


def _usable_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def _priority(value: Any) -> int | None:
    """A record's priority within ±4095 (absent: 0); None when it is no number."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, int(value)))


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")


def _shown(value: Any) -> Any:
    """*value* as an operator may see it: scalars as they are (text cut at
    :data:`SHOWN_MAX`), lists and objects summarised."""
    if isinstance(value, str):
        return value if len(value) <= SHOWN_MAX else \
            f"{value[:SHOWN_MAX]}… ({len(value)} characters)"
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if abs(value) < 10**18 else f"<a number of {len(str(abs(value)))} digits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return f"<{_kind(value)} of {len(value)}>"


def unreadable(letter: DeadLetter) -> dict:
    """What ``crawlctl dead`` prints for a record it cannot show."""
    return {"unreadable": letter.problem,
            "raw": _shown(letter.raw.decode("utf-8", "replace"))}


def fresh_payload(payload: str, data: dict | None = None) -> str:
    """*payload* without its attempt counters; a signed one (its proof covers
    them: nodes store dead letters without them) or one that is not a JSON
    object is returned unchanged."""
    if is_signed(payload):
        return payload
    if data is None:
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError):
            return payload
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or not any(k in meta for k in ATTEMPT_META_KEYS):
        return payload
    data = {**data, "meta": {k: v for k, v in meta.items() if k not in ATTEMPT_META_KEYS}}
    return json.dumps(data, separators=(",", ":"))


def replay_args(records: list, key_of: KeyFunction, partition_of: Callable[[str], int],
                partition: int, skipped: list | None = None) -> list:
    """REPLAY_DEAD's ARGV for the usable *records* of partition *partition*:
    (record as stored, payload, priority, key computed by *key_of* from the
    payload's URL); each other record is appended to *skipped* as
    ``(record as read, reason)``."""
    args: list = []
    for raw in records:
        letter = read_record(raw)
        problem = letter.problem
        if problem is None:
            try:
                key = key_of(letter.url, letter.data)
            except Exception:  # noqa: BLE001 - whatever the URL makes the key function raise
                key, problem = None, "payload has no usable URL"
            else:
                if not isinstance(key, str) or not key:
                    problem = "payload has no usable URL"
                elif partition_of(key) != partition:
                    problem = (f"its URL's politeness key {as_text(key)[:100]!r} belongs to "
                               f"partition {partition_of(key)}, not {partition}")
        if problem is not None:
            if skipped is not None:
                skipped.append((letter, problem))
            continue
        args += [letter.raw, fresh_payload(letter.payload, letter.data), letter.priority, key]
    return args
