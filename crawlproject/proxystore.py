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
import re
import time
from dataclasses import dataclass, field

from crawlproject.keys import ProxyKeys

# KEYS[1] pool (set or hash of entries; only read)
# KEYS[2] health (hash "<id>|ok|fail|ban|consec|lat|seen")
# KEYS[3] bans (hash "<id>|<domain>" -> "until_ms|strikes")
# KEYS[4] retired (hash id -> JSON {reason, at})
# ARGV[1] now in ms ('' = Redis TIME), ARGV[2] updates (JSON, see HealthBatch.payload),
# ARGV[3] consecutive connection failures that retire a proxy (0 = never),
# ARGV[4] latency EWMA weight of a new sample (0-1), ARGV[5] ms after which an
# expired ban is forgotten (its strikes with it)
# Returns {now_ms, pool type, {pool entries}, {health flat}, {bans flat}, {retired flat}}
REFRESH = r"""
local function server_now(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local now = server_now(ARGV[1])
local u = cjson.decode(ARGV[2])
local retire_after, alpha, forget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local H = KEYS[2]
for id, h in pairs(u.h) do
  redis.call('HSET', H, id .. '|seen', string.format('%.0f', now))
  if h[1] + h[2] + h[3] + h[5] + h[6] + h[7] > 0 then  -- not only "still in the pool"
  redis.call('HINCRBY', H, id .. '|ok', h[1])
  redis.call('HINCRBY', H, id .. '|fail', h[2])
  redis.call('HINCRBY', H, id .. '|ban', h[3])
  if h[5] > 0 then
    local sample = h[4] / h[5]
    local old = tonumber(redis.call('HGET', H, id .. '|lat'))
    local lat = old and (alpha * sample + (1 - alpha) * old) or sample
    redis.call('HSET', H, id .. '|lat', string.format('%.1f', lat))
  end
  local consec
  if h[7] == 1 then  -- a success in this batch: the run restarts from it
    consec = h[6]
    redis.call('HSET', H, id .. '|consec', consec)
  else
    consec = redis.call('HINCRBY', H, id .. '|consec', h[6])
  end
  if retire_after > 0 and consec >= retire_after and h[6] > 0
     and redis.call('HEXISTS', KEYS[4], id) == 0 then
    local reason = string.format('%d connection failures in a row (last: %s)', consec, h[8])
    redis.call('HSET', KEYS[4], id, cjson.encode({reason = reason, at = now}))
  end
  end
end
for _, b in ipairs(u.b) do
  local f = b[1] .. '|' .. b[2]
  local until_ms, strikes = now + b[3], b[4]
  local old = redis.call('HGET', KEYS[3], f)
  if old then
    local ou, os = string.match(old, '^(%d+)|(%d+)$')
    if ou then
      until_ms = math.max(until_ms, tonumber(ou)); strikes = math.max(strikes, tonumber(os))
    end
  end
  redis.call('HSET', KEYS[3], f, string.format('%.0f|%d', until_ms, strikes))
end
for _, c in ipairs(u.c) do
  local f = c[1] .. '|' .. c[2]
  local old = redis.call('HGET', KEYS[3], f)
  local ou = old and tonumber(string.match(old, '^(%d+)|')) or nil
  if ou and ou <= now then redis.call('HDEL', KEYS[3], f) end
end
local bans = redis.call('HGETALL', KEYS[3])
local kept = {}
for i = 1, #bans, 2 do
  local ou = tonumber(string.match(bans[i + 1], '^(%d+)|')) or 0
  if ou + forget < now then
    redis.call('HDEL', KEYS[3], bans[i])
  else
    kept[#kept + 1] = bans[i]; kept[#kept + 1] = bans[i + 1]
  end
end
local kind = redis.call('TYPE', KEYS[1])['ok']
local pool = {}
if kind == 'set' then pool = redis.call('SMEMBERS', KEYS[1])
elseif kind == 'hash' then pool = redis.call('HVALS', KEYS[1]) end
return {string.format('%.0f', now), kind, pool, redis.call('HGETALL', H), kept,
        redis.call('HGETALL', KEYS[4])}
"""

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


@dataclass
class Snapshot:
    """The shared state as REFRESH read it (times in Redis ms)."""

    now_ms: int
    pool_type: str
    entries: list[bytes]
    health: dict[str, dict[str, float]]
    bans: dict[tuple[str, str], tuple[int, int]]
    retired: dict[str, dict]

    @classmethod
    def from_reply(cls, reply) -> "Snapshot":
        now, kind, pool, health, bans, retired = reply
        return cls(int(_s(now)), _s(kind), list(pool), _health(health), _bans(bans),
                   _retired(retired))


def _health(flat) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, value in zip(flat[::2], flat[1::2]):
        pid, _, metric = _s(name).rpartition("|")
        try:
            out.setdefault(pid, {})[metric] = float(value)
        except ValueError:
            continue
    return out


def _bans(flat) -> dict[tuple[str, str], tuple[int, int]]:
    out = {}
    for name, value in zip(flat[::2], flat[1::2]):
        pid, _, domain = _s(name).partition("|")
        until, _, strikes = _s(value).partition("|")
        if until.isdigit() and strikes.isdigit():
            out[(pid, domain)] = (int(until), int(strikes))
    return out


def _retired(flat) -> dict[str, dict]:
    out = {}
    for name, value in zip(flat[::2], flat[1::2]):
        try:
            record = json.loads(value)
        except ValueError:
            record = None
        out[_s(name)] = record if isinstance(record, dict) else {"reason": "unreadable record"}
    return out


class ProxyStore:
    """Calls on a spider's proxy keys (sync or asyncio redis-py client)."""

    def __init__(self, client, spider: str, *, retire_after: int = 10,
                 latency_alpha: float = 0.3, forget_after: float = 3600.0):
        self.client = client
        self.keys = ProxyKeys(spider)
        self.retire_after, self.alpha = retire_after, latency_alpha
        self.forget_ms = int(forget_after * 1000)
        self._refresh = client.register_script(REFRESH)

    def _args(self, batch: HealthBatch | None, now_ms: int | None) -> list:
        return ["" if now_ms is None else str(now_ms), (batch or HealthBatch()).payload(),
                self.retire_after, self.alpha, self.forget_ms]

    async def refresh(self, batch: HealthBatch | None = None,
                      now_ms: int | None = None) -> Snapshot:
        """Flush *batch* and read the state back (asyncio client)."""
        reply = await self._refresh(keys=self.keys.refresh_keys(), args=self._args(batch, now_ms))
        return Snapshot.from_reply(reply)

    def read(self, batch: HealthBatch | None = None, now_ms: int | None = None) -> Snapshot:
        """The same, with a synchronous client (command line, tests)."""
        reply = self._refresh(keys=self.keys.refresh_keys(), args=self._args(batch, now_ms))
        return Snapshot.from_reply(reply)

    def revive(self, proxy_id: str) -> bool:
        """Bring a retired proxy back (sync client); True if it was retired."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.keys.retired, proxy_id)
        pipe.hset(self.keys.health, f"{proxy_id}|consec", 0)
        return bool(pipe.execute()[0])


def monotonic_deadline(until_ms: int, now_ms: int, now: float | None = None) -> float:
    """A Redis-time deadline as a ``time.monotonic()`` value of this process."""
    return (time.monotonic() if now is None else now) + (until_ms - now_ms) / 1000


def _s(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
