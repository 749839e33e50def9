"""Seeds: what users push to ``<spider>:start_urls`` and how it becomes requests.

Two forms are accepted, as with scrapy-redis:

* a plain URL: ``redis-cli lpush products:start_urls http://127.0.0.1:8000/``
* scrapy-redis' JSON form: ``{"url": ..., "meta": {...}, "method": "POST",
  "body": "...", "headers": {...}, "priority": 5, "callback": "parse_x",
  "dont_filter": true}``; any other key is form data, as in scrapy-redis.

A seed is untrusted input (see :mod:`crawlproject.policy`): whatever it holds,
:func:`request_from_seed` either returns a request the spider published
(callback, meta) or raises :class:`InvalidSeed` with a reason; it never raises
anything else. The caller moves a rejected seed to
``<spider>:start_urls:invalid`` so nothing is lost, and goes on with the batch.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request
from scrapy.http import FormRequest
from w3lib.url import safe_url_string

from crawlproject.defaults import setting
from crawlproject.frontier.library import script
from crawlproject.frontier.queue import MAX_PRIORITY
from crawlproject.frontier.scripts import CLAIM_SEEDS, COUNTER_PATTERN, RENEW_CLAIMS
from crawlproject.keys import SeedKeys, start_urls_key
from crawlproject.keys import as_text as _s
from crawlproject.policy import InputPolicy, Refused, short_repr
from crawlproject.urls import UrlCanonicalizer, canonicalizer_for, redact_userinfo

MAX_SEED_BYTES = 64 * 1024
MAX_URL_LENGTH = 8192
_KNOWN_KEYS = {"url", "meta", "method", "body", "headers", "priority", "callback",
               "errback", "dont_filter", "cb_kwargs"}
_METHODS = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"}


def seed_key(spider: str, settings=None, redis_key: str | None = None) -> str:
    """The seed key of *spider*: the spider's own ``redis_key`` pattern, else
    ``REDIS_START_URLS_KEY`` (read here only, by the spider and the operator
    tools alike)."""
    return start_urls_key(spider, redis_key or setting(settings, "REDIS_START_URLS_KEY"))


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
        except (UnicodeDecodeError, LookupError) as exc:
            raise InvalidSeed("bad_encoding", f"seed is not {encoding}: {exc}") from exc
    elif len(raw) > MAX_SEED_BYTES:
        raise InvalidSeed("too_large", f"seed is {len(raw)} characters (max {MAX_SEED_BYTES})")
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
    except (ValueError, RecursionError) as exc:
        raise InvalidSeed("bad_json", f"seed is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidSeed("bad_json", "seed JSON must be an object")
    if "url" not in data:
        raise InvalidSeed("no_url", "seed JSON has no 'url' key")
    seed = Seed(url=_check_url(data["url"]))
    seed.method = _check_method(data.get("method", "GET"))
    seed.meta = _check_dict(data, "meta")
    seed.headers = _check_headers(_check_dict(data, "headers"))
    seed.cb_kwargs = _check_dict(data, "cb_kwargs")
    seed.priority = _check_priority(data.get("priority", 0))
    seed.callback = _check_name(data.get("callback"), "callback")
    seed.errback = _check_name(data.get("errback"), "errback")
    dont_filter = data.get("dont_filter", True)
    if not isinstance(dont_filter, bool):
        raise InvalidSeed("bad_field", f"'dont_filter' must be true or false, got {dont_filter!r}")
    seed.dont_filter = dont_filter
    body = data.get("body")
    if body is not None and not isinstance(body, str):
        raise InvalidSeed("bad_field", "'body' must be a string")
    seed.body = body
    seed.formdata = _check_formdata({k: v for k, v in data.items() if k not in _KNOWN_KEYS})
    if seed.formdata and seed.body is not None:
        raise InvalidSeed("bad_field", "a seed has either a 'body' or form fields, not both")
    return seed


_SPACE = re.compile(r"\s")


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url.strip():
        raise InvalidSeed("bad_url", f"url must be a non-empty string, got {short_repr(url)}")
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise InvalidSeed("bad_url", f"url is longer than {MAX_URL_LENGTH} characters")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest or _SPACE.search(url):
        raise InvalidSeed("bad_url", f"not an absolute http(s) URL: {url[:200]!r}")
    try:
        safe = safe_url_string(url)
        Request(safe)  # the same parse the engine does (host, IPv6 brackets, port)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad URL
        raise InvalidSeed("bad_url", f"unparseable URL {url[:200]!r}: {exc}") from None
    return safe


def _check_method(method: Any) -> str:
    if not isinstance(method, str) or method.upper() not in _METHODS:
        raise InvalidSeed("bad_field", f"unsupported method {short_repr(method)}")
    return method.upper()


def _check_dict(data: dict, key: str) -> dict:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidSeed("bad_field", f"{key!r} must be an object")
    return value


def _check_headers(headers: dict) -> dict:
    for name, value in headers.items():
        values = value if isinstance(value, list) else [value]
        if not name or not all(isinstance(v, str) for v in values):
            raise InvalidSeed("bad_field", f"header {short_repr(name)} must have a string value "
                                           "(or a list of strings)")
    return headers


def _check_formdata(formdata: dict) -> dict:
    for name, value in formdata.items():
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise InvalidSeed("bad_field", f"form field {short_repr(name)} must be a string (or a "
                                           "list of strings)")
    return formdata


def _check_priority(value: Any) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
            or value in (float("inf"), float("-inf")) or value != int(value)):
        raise InvalidSeed("bad_field", f"'priority' must be an integer, got {short_repr(value)}")
    if abs(value) > MAX_PRIORITY:
        raise InvalidSeed("bad_field", f"'priority' must be between -{MAX_PRIORITY} and "
                                       f"{MAX_PRIORITY}, got {int(value)}")
    return int(value)


def _check_name(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise InvalidSeed("bad_field", f"{key!r} must be a method name, got {short_repr(value)}")
    return value


def build_request(seed: Seed, spider, policy: InputPolicy) -> Request:
    """The request for a parsed *seed*: callback, errback and meta must pass
    *policy*. With *spider* None (the command line checking a seed before it
    pushes it) the names are checked but not bound."""
    try:
        callback, errback = (policy.check_callback(name, what) if name else None
                             for name, what in ((seed.callback, "callback"),
                                                (seed.errback, "errback")))
        meta = policy.check_seed_meta(seed.meta)
        has_body = bool(seed.body) or bool(seed.formdata) and seed.method not in ("GET", "HEAD")
        policy.check_request(seed.method, seed.headers, has_body)
    except Refused as exc:
        raise InvalidSeed(exc.code, str(exc)) from None
    if spider is not None:
        callback = getattr(spider, callback) if callback else None
        errback = getattr(spider, errback) if errback else None
    else:
        callback = errback = None
    common = dict(
        method=seed.method, headers=seed.headers or None, meta=meta,
        priority=seed.priority, dont_filter=seed.dont_filter,
        callback=callback, errback=errback, cb_kwargs=seed.cb_kwargs,
    )
    if seed.formdata:
        return FormRequest(seed.url, formdata=seed.formdata, **common)
    return Request(seed.url, body=seed.body, **common)


def request_from_seed(raw: bytes | str, spider, policy: InputPolicy,
                      encoding: str = "utf-8", check=None) -> Request:
    """Parse *raw* and build its request with ``spider.make_request_from_seed``.

    Raises :class:`InvalidSeed` and nothing else: a seed that makes any part
    of the parsing or of the request building fail (including a spider's own
    ``make_request_from_seed`` override, and *check*, e.g. the frontier's
    encoder) is rejected with a reason.
    """
    try:
        if getattr(type(spider), "make_request_from_data", None) is not None:
            # scrapy-redis' hook, kept by a spider that moved here: the spider's
            # own code turns the raw seed into a request.
            request = _from_data(spider, raw)
        else:
            seed = parse_seed(raw, encoding)
            make = getattr(spider, "make_request_from_seed", None)
            request = make(seed) if make is not None else build_request(seed, spider, policy)
        # Canonical before anything reads it (no credentials, no session id).
        request = _canonicalizer(spider).request(request)
        if check is not None:
            check(request)
        return request
    except InvalidSeed:
        raise
    except Refused as exc:
        raise InvalidSeed(exc.code, str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - untrusted input must not stop a node
        raise InvalidSeed("error", f"cannot build a request: {type(exc).__name__}: "
                                   f"{str(exc)[:300]}") from None


def _canonicalizer(spider) -> UrlCanonicalizer:
    crawler = getattr(spider, "crawler", None)
    if crawler is not None:
        return canonicalizer_for(crawler)
    return UrlCanonicalizer.from_settings(getattr(spider, "settings", None))


def _from_data(spider, raw: bytes | str) -> Request:
    """The request a spider's ``make_request_from_data`` (scrapy-redis' hook)
    makes of *raw*: it must be one request (scrapy-redis returns ``[]`` for a
    seed without a URL)."""
    if len(raw) > MAX_SEED_BYTES:
        raise InvalidSeed("too_large", f"seed is {len(raw)} bytes (max {MAX_SEED_BYTES})")
    made = spider.make_request_from_data(raw if isinstance(raw, bytes) else raw.encode())
    if isinstance(made, Request):
        return made
    raise InvalidSeed("no_request", f"make_request_from_data returned {short_repr(made)}, "
                                    "not a request")


def check_seed(raw: bytes | str, policy: InputPolicy, encoding: str = "utf-8") -> Seed:
    """What a node would do with *raw*, without a spider instance: parse it,
    check it against *policy*, build and encode its request. Returns the
    parsed seed or raises :class:`InvalidSeed` (the command line's check)."""
    from crawlproject.serialization import request_to_json

    try:
        seed = parse_seed(raw, encoding)
        request_to_json(build_request(seed, None, policy), None, policy)
        return seed
    except InvalidSeed:
        raise
    except Exception as exc:  # noqa: BLE001 - same contract as request_from_seed
        raise InvalidSeed("error", f"cannot build a request: {type(exc).__name__}: "
                                   f"{str(exc)[:300]}") from None


def invalid_record(raw: bytes | str, error: InvalidSeed, node: str = "") -> str:
    """The JSON kept in ``<spider>:start_urls:invalid`` for a rejected seed."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    return json.dumps(   # without URL credentials: this list is read by operators
        {"seed": redact_userinfo(raw[:MAX_SEED_BYTES]), "reason": error.code,
         "error": redact_userinfo(str(error)),
         "node": node, "at": time.time()},
        separators=(",", ":"),
    )


class SeedQueue:
    """The ``<spider>:start_urls`` key in Redis (list, set or sorted set).

    Knows Redis (an asyncio redis-py client), not Scrapy. Lists are consumed
    oldest first (users ``LPUSH``, we ``RPOP``), sorted sets highest score
    first. A batch is taken atomically and kept as *claims* until
    :meth:`release` says the requests made from it are in the frontier; while
    it waits, the node :meth:`renew`\\ s them. Claims of a node that died are
    put back by the next :meth:`claim` once ``claim_ttl`` seconds passed, so no
    seed is lost between pop and enqueue. The invalid list keeps at most
    ``invalid_max`` records (the newest).
    """

    def __init__(self, client, key: str, kind: str = "list", claim_ttl: float = 15.0,
                 invalid_max: int = 10_000, clock=None):
        if kind not in ("list", "set", "zset"):
            raise ValueError(f"unknown seed key type {kind!r}")
        self.client = client
        self.keys = SeedKeys(key)
        self.key = key
        self.kind = kind
        self.invalid_key = self.keys.invalid
        self.claim_ttl_ms = int(claim_ttl * 1000)
        self.invalid_max = max(1, int(invalid_max))
        self.clock = clock
        self._claim = script(client, CLAIM_SEEDS)
        self._renew = script(client, RENEW_CLAIMS)

    def _now(self) -> str:
        return str(self.clock()) if self.clock else ""

    async def claim(self, count: int) -> tuple[int, list[tuple[str, bytes]]]:
        """Take up to *count* seeds as claims: (restored, [(claim id, raw seed)])."""
        out = await self._claim(keys=self.keys.claim_keys(),
                                args=[self.kind, count, self.claim_ttl_ms, self._now()])
        pairs = [(_s(out[i]), self._raw(out[i + 1])) for i in range(1, len(out), 2)]
        return int(out[0]), pairs

    async def diagnose(self) -> list[str]:
        """What is wrong with the seed and claim keys, in words (empty: nothing
        found). Asked after a claim failed with a Redis error reply: a key of
        the wrong type stops every claim, and retrying will not mend it."""
        keys = self.keys
        expected = {keys.seeds: self.kind, keys.claims: "hash", keys.claims_due: "zset",
                    keys.claims_seq: "string"}  # the counter's value: below
        async with self.client.pipeline(transaction=False) as pipe:
            for key in expected:
                pipe.type(key)
            types = [_s(t) for t in await pipe.execute()]
        problems = []
        for (key, want), got in zip(expected.items(), types):
            if got not in (want, "none"):
                problems.append(f"{key} is a {got}, not a {want}"
                                + (SEED_KIND_HINT if key == keys.seeds else ""))
        if types[3] == "string":
            value = _s(await self.client.get(keys.claims_seq) or b"")
            if not re.fullmatch(COUNTER_PATTERN, value):  # CLAIM_SEEDS' own rule
                problems.append(f"{keys.claims_seq} holds {value[:40]!r}, not a counter")
        return problems

    def _raw(self, value) -> bytes:
        value = value if isinstance(value, bytes) else str(value).encode()
        if self.kind == "zset":
            value = value.split(b"\n", 1)[1]
        return value

    async def renew(self, ids: list[str]) -> None:
        """Push the deadline of claims this node still holds ``claim_ttl`` ahead."""
        if ids:
            await self._renew(keys=[self.keys.claims_due],
                              args=[self.claim_ttl_ms, self._now(), *ids])

    async def release(self, ids: list[str]) -> None:
        """Forget claims whose requests are safely stored."""
        if ids:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hdel(self.keys.claims, *ids)
                pipe.zrem(self.keys.claims_due, *ids)
                await pipe.execute()

    async def reject(self, raw: bytes | str, error: InvalidSeed, node: str = "") -> int:
        """Keep a rejected seed, with its reason, in the invalid list; returns how
        many old records were trimmed to keep the list at ``invalid_max``."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.lpush(self.invalid_key, invalid_record(raw, error, node))
            pipe.ltrim(self.invalid_key, 0, self.invalid_max - 1)
            length, _ = await pipe.execute()
        return max(0, int(length) - self.invalid_max)

    async def size(self) -> int:
        if self.kind == "list":
            return await self.client.llen(self.key)
        if self.kind == "set":
            return await self.client.scard(self.key)
        return await self.client.zcard(self.key)


SEED_KIND_HINT = (" (the spider's key type is set by REDIS_START_URLS_AS_SET and"
                  " REDIS_START_URLS_AS_ZSET; push with LPUSH, SADD or ZADD to match)")
