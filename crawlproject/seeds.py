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


CLAIM_SEEDS = r"""
-- CLAIM_SEEDS: take seeds, keeping each as a claim until the requests made from
-- it are safely in the frontier; expired claims (their node died) go back first.
-- KEYS[1] seed key (list | set | zset)   KEYS[2] claims (hash id -> seed)
-- KEYS[3] claim deadlines (zset id -> ms) KEYS[4] claim counter (string)
-- (KEYS[2..4] are tagged {<seed key>}, so all four share the seed key's slot.)
-- ARGV[1] 'list' | 'set' | 'zset'  ARGV[2] how many  ARGV[3] claim ttl ms
-- ARGV[4] now in ms, or '' for Redis server time
-- Returns {restored count, id1, seed1, id2, seed2, ...}
local now
if ARGV[4] ~= '' then now = tonumber(ARGV[4]) else
  local t = redis.call('TIME'); now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local kind, count = ARGV[1], tonumber(ARGV[2])
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now), 'LIMIT', 0, 500)
for _, id in ipairs(expired) do
  local seed = redis.call('HGET', KEYS[2], id)
  if seed then
    if kind == 'list' then redis.call('RPUSH', KEYS[1], seed)
    elseif kind == 'set' then redis.call('SADD', KEYS[1], seed)
    else
      local score, raw = string.match(seed, '^([^\n]*)\n(.*)$')
      redis.call('ZADD', KEYS[1], score, raw)
    end
  end
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local got = {}
if kind == 'list' then
  got = redis.call('RPOP', KEYS[1], count) or {}
elseif kind == 'set' then
  got = redis.call('SPOP', KEYS[1], count) or {}
else
  local flat = redis.call('ZPOPMAX', KEYS[1], count)
  for i = 1, #flat, 2 do got[#got + 1] = flat[i + 1] .. '\n' .. flat[i] end
end
local out = {#expired}
if type(got) ~= 'table' or #got == 0 then return out end
local last = redis.call('INCRBY', KEYS[4], #got)
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local fields, scores = {}, {}
for i, seed in ipairs(got) do
  local id = tostring(last - #got + i)
  fields[#fields + 1] = id; fields[#fields + 1] = seed
  scores[#scores + 1] = deadline; scores[#scores + 1] = id
  out[#out + 1] = id
  out[#out + 1] = seed
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[3], unpack(scores))
return out
"""


class SeedQueue:
    """The ``<spider>:start_urls`` key in Redis (list, set or sorted set).

    Knows Redis (an asyncio redis-py client), not Scrapy. Lists are consumed
    oldest first (users ``LPUSH``, we ``RPOP``), sorted sets highest score
    first. A batch is taken atomically and kept as *claims* until
    :meth:`release` says the requests made from it are in the frontier; claims
    of a node that died are put back by the next :meth:`claim` after
    ``claim_ttl`` seconds, so no seed is lost between pop and enqueue.
    """

    def __init__(self, client, key: str, kind: str = "list", invalid_key: str | None = None,
                 claim_ttl: float = 60.0, clock=None):
        if kind not in ("list", "set", "zset"):
            raise ValueError(f"unknown seed key type {kind!r}")
        self.client = client
        self.key = key
        self.kind = kind
        self.invalid_key = invalid_key or f"{key}:invalid"
        tag = f"{{{key}}}"
        self.claims_key, self.deadlines_key, self.counter_key = (
            f"{tag}:claims", f"{tag}:claims:due", f"{tag}:claims:seq")
        self.claim_ttl_ms = int(claim_ttl * 1000)
        self.clock = clock
        self._claim = client.register_script(CLAIM_SEEDS)

    async def claim(self, count: int) -> tuple[int, list[tuple[str, bytes]]]:
        """Take up to *count* seeds as claims: (restored, [(claim id, raw seed)])."""
        out = await self._claim(
            keys=[self.key, self.claims_key, self.deadlines_key, self.counter_key],
            args=[self.kind, count, self.claim_ttl_ms, str(self.clock()) if self.clock else ""])
        pairs = [(_s(out[i]), self._raw(out[i + 1])) for i in range(1, len(out), 2)]
        return int(out[0]), pairs

    def _raw(self, value) -> bytes:
        value = value if isinstance(value, bytes) else str(value).encode()
        if self.kind == "zset":
            value = value.split(b"\n", 1)[1]
        return value

    async def release(self, ids: list[str]) -> None:
        """Forget claims whose requests are safely stored."""
        if ids:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hdel(self.claims_key, *ids)
                pipe.zrem(self.deadlines_key, *ids)
                await pipe.execute()

    async def reject(self, raw: bytes | str, error: InvalidSeed, node: str = "") -> None:
        """Keep a rejected seed, with its reason, in the invalid list."""
        await self.client.lpush(self.invalid_key, invalid_record(raw, error, node))

    async def size(self) -> int:
        if self.kind == "list":
            return await self.client.llen(self.key)
        if self.kind == "set":
            return await self.client.scard(self.key)
        return await self.client.zcard(self.key)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
