"""The proxy pool's shared state in Redis: health, bans, retirements.

Every node keeps what happened to its requests in a local :class:`HealthBatch`
and sends it, once a second, in one ``REFRESH`` script call that also reads the
whole state back (pool entries, health, bans, retirements, Redis time): one
round trip per node per second, never one per request.

Keys (:class:`crawlproject.keys.ProxyKeys`, all under the ``{<spider>}`` hash
tag, so the script stays on one Redis Cluster slot): ``proxies`` (set or hash,
written by operators), ``proxy:health``, ``proxy:bans``, ``proxy:retired``.
Nothing here holds a credential: proxies are named by ``host:port``.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from importlib.resources import files

from crawlproject.frontier.library import script
from crawlproject.keys import ProxyKeys
from crawlproject.keys import as_text as _s

#: The pool's one script (its KEYS/ARGV/return contract in its header), read as
#: package data (works inside a zipped scrapyd egg).
REFRESH = files(__package__).joinpath("lua", "refresh.lua").read_text(encoding="utf-8")

_ERROR_NAME = re.compile(r"[A-Za-z0-9_.]*")


@dataclass
class _Counts:
    ok: int = 0
    fail: int = 0
    ban: int = 0
    latency_sum: float = 0.0
    latency_n: int = 0
    consec: int = 0          # connection failures since the last success (in this batch)
    succeeded: bool = False  # a success in this batch: consec is absolute, not a delta
    error: str = ""


@dataclass
class HealthBatch:
    """What this node saw since the last flush (sent by the next REFRESH)."""

    counts: dict[str, _Counts] = field(default_factory=dict)
    bans: list[tuple[str, str, int, int]] = field(default_factory=list)
    clears: set[tuple[str, str]] = field(default_factory=set)

    def _c(self, proxy_id: str) -> _Counts:
        return self.counts.setdefault(proxy_id, _Counts())

    def success(self, proxy_id: str, latency_s: float | None) -> None:
        c = self._c(proxy_id)
        c.ok += 1
        c.consec, c.succeeded = 0, True
        if latency_s is not None:
            c.latency_sum += latency_s * 1000
            c.latency_n += 1

    def failure(self, proxy_id: str, error: str) -> None:
        c = self._c(proxy_id)
        c.fail += 1
        c.consec += 1
        c.error = _ERROR_NAME.match(error).group()[:80]  # an exception class name, nothing else

    def ban(self, proxy_id: str, domain: str, delay_s: float, strikes: int) -> None:
        self._c(proxy_id).ban += 1
        self.bans.append((proxy_id, domain, int(delay_s * 1000), strikes))

    def clear(self, proxy_id: str, domain: str) -> None:
        """A revived proxy worked for *domain*: forget its strikes there."""
        self.clears.add((proxy_id, domain))

    def seen(self, proxy_id: str) -> None:
        self._c(proxy_id)

    def merge(self, older: "HealthBatch") -> None:
        """Put back a batch whose flush failed (before this one's events)."""
        for pid, o in older.counts.items():
            c = self._c(pid)
            c.ok, c.fail, c.ban = c.ok + o.ok, c.fail + o.fail, c.ban + o.ban
            c.latency_sum, c.latency_n = c.latency_sum + o.latency_sum, c.latency_n + o.latency_n
            if not c.succeeded:
                c.consec, c.succeeded = c.consec + o.consec, o.succeeded
            c.error = c.error or o.error
        self.bans[:0] = older.bans
        self.clears |= older.clears

    def payload(self) -> str:
        """ARGV[2] of REFRESH."""
        h = {pid: [c.ok, c.fail, c.ban, round(c.latency_sum, 1), c.latency_n, c.consec,
                   1 if c.succeeded else 0, c.error or "-"] for pid, c in self.counts.items()}
        return json.dumps({"h": h or {}, "b": [list(b) for b in self.bans] or {},
                           "c": [list(c) for c in sorted(self.clears)] or {}},
                          separators=(",", ":"))


class ProxyStateError(Exception):
    """A proxy key in Redis holds another type than the one the pool uses."""


#: Health metrics and their parsers; anything else in the health hash is ignored.
_COUNTERS = frozenset({"ok", "fail", "ban", "consec", "seen"})
_MAX_COUNTER = 2 ** 53
_MAX_LATENCY_MS = 1e7
#: Most ban changes one REFRESH returns (a new node catches up over a few calls).
BAN_CHANGES_PER_CALL = 2000


@dataclass
class Snapshot:
    """The shared state as REFRESH read it (times in Redis ms).

    ``bans`` holds the bans changed since the caller's ``ban_version`` (all of
    them, up to a bound, when ``full``); ``None`` as a value means deleted.
    ``health`` is None when it was not asked for.
    ``bad`` lists values that did not parse (``(key, field, reason)``): they
    are left out, never used."""

    now_ms: int
    pool_type: str
    entries: list[bytes]
    health: dict[str, dict[str, float]] | None
    bans: dict[tuple[str, str], tuple[int, int] | None]
    retired: dict[str, dict]
    ban_version: int = 0
    full: bool = True
    bad: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def from_reply(cls, reply, keys: ProxyKeys, with_health: bool = True) -> "Snapshot":
        if reply and _s(reply[0]) == "wrongtype":
            _, key, kind, expected = (_s(v) for v in reply)
            raise ProxyStateError(f"Redis key {key} is a {kind}, expected a {expected}: the "
                                  f"proxy pool cannot work until it is deleted or repaired")
        now, kind, pool, health, bans, retired, version, full = reply
        bad: list[tuple[str, str, str]] = []
        return cls(int(_s(now)), _s(kind), list(pool),
                   parse_health(health, keys.health, bad) if with_health else None,
                   parse_bans(bans, keys.bans, bad), _retired(retired, keys.retired, bad),
                   int(_s(version)), bool(int(full)), bad)


def parse_health(flat, key: str = "", bad: list | None = None) -> dict[str, dict[str, float]]:
    """The health hash as ``{id: {metric: value}}``, strictly: counters are
    integers in 0..2**53, ``lat`` a finite number of ms in 0..1e7; anything
    else is left out and noted in *bad*."""
    out: dict[str, dict[str, float]] = {}
    for name, value in zip(flat[::2], flat[1::2]):
        pid, _, metric = _s(name).rpartition("|")
        number = _metric(metric, _s(value))
        if number is None:
            if bad is not None:
                bad.append((key, _s(name), f"{metric or 'field'} is not a valid value"))
            continue
        out.setdefault(pid, {})[metric] = number
    return out


def _metric(metric: str, text: str) -> float | None:
    if metric in _COUNTERS:
        return int(text) if text.isascii() and text.isdigit() and int(text) < _MAX_COUNTER \
            else None
    if metric == "lat":
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) and 0 <= number <= _MAX_LATENCY_MS else None
    return None


def parse_bans(flat, key: str = "", bad: list | None = None) -> dict:
    """``<id>|<domain>`` → ``(until_ms, strikes)``; an empty value (deleted) → None."""
    out: dict[tuple[str, str], tuple[int, int] | None] = {}
    for name, value in zip(flat[::2], flat[1::2]):
        pid, _, domain = _s(name).partition("|")
        text = _s(value)
        until, _, strikes = text.partition("|")
        if not text:
            out[(pid, domain)] = None
        elif until.isascii() and until.isdigit() and strikes.isascii() and strikes.isdigit() \
                and int(until) < _MAX_COUNTER:
            out[(pid, domain)] = (int(until), min(int(strikes), 1000))
        elif bad is not None:
            bad.append((key, _s(name), "not 'until_ms|strikes'"))
    return out


def _retired(flat, key: str = "", bad: list | None = None) -> dict[str, dict]:
    out = {}
    for name, value in zip(flat[::2], flat[1::2]):
        try:
            record = json.loads(value)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {"reason": "unreadable record"}
            if bad is not None:
                bad.append((key, _s(name), "not a JSON object"))
        out[_s(name)] = record
    return out


class ProxyStore:
    """Calls on a spider's proxy keys (sync or asyncio redis-py client)."""

    def __init__(self, client, spider: str, *, retire_after: int = 10,
                 latency_alpha: float = 0.3, forget_after: float = 3600.0,
                 node: str = "", ban_changes: int = BAN_CHANGES_PER_CALL):
        self.client = client
        self.keys = ProxyKeys(spider)
        self.retire_after, self.alpha = retire_after, latency_alpha
        self.forget_ms = int(forget_after * 1000)
        self.node, self.ban_changes = node, ban_changes
        self._refresh = script(client, REFRESH)

    def _args(self, batch: HealthBatch | None, now_ms: int | None, since: int,
              empty_since_ms: int | None, with_health: bool = True) -> list:
        return ["" if now_ms is None else str(now_ms), (batch or HealthBatch()).payload(),
                self.retire_after, self.alpha, self.forget_ms, since, self.ban_changes,
                self.node, "" if empty_since_ms is None else str(empty_since_ms),
                "1" if with_health else "0"]

    async def refresh(self, batch: HealthBatch | None = None, now_ms: int | None = None,
                      since: int = 0, empty_since_ms: int | None = None,
                      with_health: bool = True) -> Snapshot:
        """Flush *batch*, read the state back with the bans changed after
        version *since* (and the health hash if *with_health*), and report
        whether this node has a usable proxy (asyncio client). Raises
        :class:`ProxyStateError` for a key of a wrong type."""
        reply = await self._refresh(keys=self.keys.refresh_keys(), args=self._args(
            batch, now_ms, since, empty_since_ms, with_health))
        return Snapshot.from_reply(reply, self.keys, with_health)

    def read(self, batch: HealthBatch | None = None, now_ms: int | None = None,
             since: int = 0) -> Snapshot:
        """The same, with a synchronous client (tests, tools)."""
        reply = self._refresh(keys=self.keys.refresh_keys(),
                              args=self._args(batch, now_ms, since, None))
        return Snapshot.from_reply(reply, self.keys)

    def revive(self, proxy_id: str) -> bool:
        """Bring a retired proxy back (sync client); True if it was retired."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.keys.retired, proxy_id)
        pipe.hset(self.keys.health, f"{proxy_id}|consec", 0)
        return bool(pipe.execute()[0])


def report_state(client, spider: str, recent_bans: int) -> dict:
    """What an operator sees (sync client; no write): the pool entries, health,
    retirements, the *recent_bans* most recently changed bans with the number
    of ban records, nodes without a usable proxy (``{node: (since_ms,
    reported_ms)}``) and Redis time. Raises :class:`ProxyStateError` for a key
    of a wrong type (named with the type it should have)."""
    keys = ProxyKeys(spider)
    expected = {keys.health: "hash", keys.bans: "hash", keys.retired: "hash",
                keys.ban_log: "zset", keys.ban_expiry: "zset", keys.state: "hash"}
    pipe = client.pipeline(transaction=False)
    for key in (keys.pool, *expected):
        pipe.type(key)
    kinds = [_s(t) for t in pipe.execute()]
    for (key, want), kind in zip(expected.items(), kinds[1:]):
        if kind not in ("none", want):
            raise ProxyStateError(f"Redis key {key} is a {kind}, expected a {want}")
    pool_type = kinds[0]
    # TIME outside the pipeline: a cluster client refuses keyless commands in one.
    seconds, micros = client.time()
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.health)
    pipe.hgetall(keys.retired)
    pipe.hlen(keys.bans)
    pipe.zrevrange(keys.ban_log, 0, max(0, recent_bans) - 1)
    pipe.hgetall(keys.state)
    if pool_type in ("set", "hash"):
        (pipe.smembers if pool_type == "set" else pipe.hvals)(keys.pool)
    health, retired, ban_count, recent, state, *pool = pipe.execute()
    pool = pool[0] if pool else []
    ban_values = client.hmget(keys.bans, recent) if recent else []
    flat = [v for pair in zip(recent, ban_values) if pair[1] is not None for v in pair]
    bad: list[tuple[str, str, str]] = []
    return {"now_ms": int(seconds) * 1000 + int(micros) // 1000, "pool_type": pool_type,
            "entries": list(pool),
            "health": parse_health(_flat(health), keys.health, bad),
            "retired": _retired(_flat(retired), keys.retired, bad),
            "bans": {k: v for k, v in parse_bans(flat, keys.bans, bad).items() if v},
            "ban_records": int(ban_count), "empty": _empty_nodes(state), "bad": bad}


def no_proxy_summary(client, spider: str, now_ms: int) -> dict:
    """For ``crawlctl status``: since when (ms, earliest) nodes that reported
    in the last 30 s have had no usable proxy, and how many; or ``error``."""
    key = ProxyKeys(spider).state
    kind = _s(client.type(key))
    if kind not in ("none", "hash"):
        return {"since": None, "nodes": 0, "error": f"Redis key {key} is a {kind}, "
                                                    "expected a hash"}
    fresh = [since for since, at in _empty_nodes(client.hgetall(key)).values()
             if now_ms - at < 30_000]
    return {"since": min(fresh) if fresh else None, "nodes": len(fresh)}


def _empty_nodes(state: dict) -> dict[str, tuple[int, int]]:
    out = {}
    for name, value in state.items():
        name, (since, _, at) = _s(name), _s(value).partition("|")
        if name.startswith("empty:") and since.isdigit() and at.isdigit():
            out[name[len("empty:"):]] = (int(since), int(at))
    return out


def _flat(mapping: dict) -> list:
    return [v for pair in mapping.items() for v in pair]


def monotonic_deadline(until_ms: int, now_ms: int, now: float | None = None) -> float:
    """A Redis-time deadline as a ``time.monotonic()`` value of this process."""
    return (time.monotonic() if now is None else now) + (until_ms - now_ms) / 1000


