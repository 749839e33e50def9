"""Seeds: what users push to ``<spider>:start_urls`` and how it becomes requests.

Two forms are accepted, as with scrapy-redis:

* a plain URL: ``redis-cli lpush products:start_urls http://127.0.0.1:8000/``
* scrapy-redis' JSON form: ``{"url": ..., "meta": {...}, "method": "POST",
  "body": "...", "headers": {...}, "priority": 5, "callback": "parse_x",
  "dont_filter": true}``; any other key is form data, as in scrapy-redis.

A seed that is neither is rejected with a reason (:class:`InvalidSeed`); the
caller moves it to ``<spider>:start_urls:invalid`` so nothing is lost.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from w3lib.url import safe_url_string

MAX_SEED_BYTES = 64 * 1024
_KNOWN_KEYS = {"url", "meta", "method", "body", "headers", "priority", "callback",
               "errback", "dont_filter", "cb_kwargs"}
_METHODS = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"}


class InvalidSeed(ValueError):
    """A seed that cannot become a request; ``code`` is a short stats key."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Seed:
    """A validated seed, ready to become a :class:`scrapy.Request`."""

    url: str
    method: str = "GET"
    meta: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    body: str | None = None
    formdata: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    callback: str | None = None
    errback: str | None = None
    cb_kwargs: dict[str, Any] = field(default_factory=dict)
    dont_filter: bool = True


def parse_seed(raw: bytes | str, encoding: str = "utf-8") -> Seed:
    """Parse one raw seed from Redis, or raise :class:`InvalidSeed`."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_SEED_BYTES:
            raise InvalidSeed("too_large", f"seed is {len(raw)} bytes (max {MAX_SEED_BYTES})")
        try:
            raw = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise InvalidSeed("bad_encoding", f"seed is not {encoding}: {exc}") from exc
    text = raw.strip()
    if not text:
        raise InvalidSeed("empty", "seed is empty")
    if text.startswith("{"):
        return _parse_json_seed(text)
    if text.startswith("["):
        raise InvalidSeed("bad_json", "seed is a JSON array; push one JSON object per seed")
    return Seed(url=_check_url(text))


def _parse_json_seed(text: str) -> Seed:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidSeed("bad_json", f"seed is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidSeed("bad_json", "seed JSON must be an object")
    if "url" not in data:
        raise InvalidSeed("no_url", "seed JSON has no 'url' key")
    seed = Seed(url=_check_url(data["url"]))
    seed.method = _check_method(data.get("method", "GET"))
    seed.meta = _check_dict(data, "meta")
    seed.headers = _check_dict(data, "headers")
    seed.cb_kwargs = _check_dict(data, "cb_kwargs")
    seed.priority = _check_int(data.get("priority", 0), "priority")
    seed.callback = _check_name(data.get("callback"), "callback")
    seed.errback = _check_name(data.get("errback"), "errback")
    seed.dont_filter = bool(data.get("dont_filter", True))
    body = data.get("body")
    if body is not None and not isinstance(body, str):
        raise InvalidSeed("bad_field", "'body' must be a string")
    seed.body = body
    seed.formdata = {k: v for k, v in data.items() if k not in _KNOWN_KEYS}
    return seed


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url.strip():
        raise InvalidSeed("bad_url", f"url must be a non-empty string, got {url!r}")
    url = url.strip()
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or any(c.isspace() for c in url):
        raise InvalidSeed("bad_url", f"not an absolute http(s) URL: {url[:200]!r}")
    return safe_url_string(url)


def _check_method(method: Any) -> str:
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise InvalidSeed("bad_field", f"unsupported method {method!r}")
    return method.upper()


def _check_dict(data: dict, key: str) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidSeed("bad_field", f"{key!r} must be an object")
    return value


def _check_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise InvalidSeed("bad_field", f"{key!r} must be an integer, got {value!r}")
    return int(value)


def _check_name(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise InvalidSeed("bad_field", f"{key!r} must be a method name, got {value!r}")
    return value


def invalid_record(raw: bytes | str, error: InvalidSeed, node: str = "") -> str:
    """The JSON kept in ``<spider>:start_urls:invalid`` for a rejected seed."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    return json.dumps(
        {"seed": raw[:MAX_SEED_BYTES], "reason": error.code, "error": str(error),
         "node": node, "at": time.time()},
        separators=(",", ":"),
    )


class SeedQueue:
    """The ``<spider>:start_urls`` key in Redis (list, set or sorted set).

    Knows Redis (an asyncio redis-py client), not Scrapy. Lists are consumed
    oldest first (users ``LPUSH``, we ``RPOP``), sorted sets highest score
    first; every pop is one atomic command for a whole batch.
    """

    def __init__(self, client, key: str, kind: str = "list", invalid_key: str | None = None):
        if kind not in ("list", "set", "zset"):
            raise ValueError(f"unknown seed key type {kind!r}")
        self.client = client
        self.key = key
        self.kind = kind
        self.invalid_key = invalid_key or f"{key}:invalid"

    async def pop(self, count: int) -> list[bytes]:
        """Take up to *count* raw seeds."""
        if self.kind == "list":
            got = await self.client.rpop(self.key, count)
        elif self.kind == "set":
            got = await self.client.spop(self.key, count)
        else:
            got = [member for member, _score in await self.client.zpopmax(self.key, count)]
        return list(got or [])

    async def reject(self, raw: bytes | str, error: InvalidSeed, node: str = "") -> None:
        """Keep a rejected seed, with its reason, in the invalid list."""
        await self.client.lpush(self.invalid_key, invalid_record(raw, error, node))

    async def size(self) -> int:
        if self.kind == "list":
            return await self.client.llen(self.key)
        if self.kind == "set":
            return await self.client.scard(self.key)
        return await self.client.zcard(self.key)
