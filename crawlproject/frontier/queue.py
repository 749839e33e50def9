"""The shared frontier: leased, at-least-once delivery of requests in Redis.

Plain classes that know Redis, not Scrapy: the scheduler adapter, the
command-line tool, the tests and the benchmarks all use them.

Life of an entry (member ``"<priority>:<seq>"``, payload in ``payloads``):

* **add** — deduplicated against the Bloom filter and queued in the same
  atomic call (or put in ``delayed`` until its due time);
* **take** — popped by priority, recorded in ``inflight`` as owned by the
  node; the node's lease deadline (``nodes`` zset, Redis server time) is
  renewed by every call it makes, at least every ``lease_ttl / 3``;
* **ack** — done (downloaded, callback output consumed, new requests added,
  items stored): forgotten; **fail** — forgotten, with a record kept in the
  ``dead`` or ``invalid`` list; **nack** — not started: back in its place.
  Only the node holding the lease can do these (or a node whose lease expired,
  for an entry nobody took since): any other call is *stale*, counted and
  ignored, so a node that lost its lease cannot undo another node's work;
* **reclaim** — any node's call puts back the entries of nodes whose lease
  deadline has passed (a node killed with SIGKILL loses nothing); a *sweep*
  also puts back entries whose owner is not a registered node at all.

Every operation a node has pending travels in one ``SYNC`` script call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from crawlproject.frontier.bloom import BloomConfig, filter_estimates, fingerprint_hex
from crawlproject.frontier.scripts import REPLAY_DEAD, SYNC
from crawlproject.keys import FrontierKeys

MAX_PRIORITY = 4095  # |priority| < 2^12 keeps the queue score exact in a double
#: Records kept in the dead-letter and invalid lists (newest first) by default.
DEAD_MAX = 100_000
INVALID_MAX = 10_000
#: meta keys that count attempts; a replayed dead letter starts afresh.
ATTEMPT_META_KEYS = ("retry_times", "crawlproject_callback_attempts")


def clamp_priority(priority: int) -> int:
    """*priority* within ±:data:`MAX_PRIORITY` (the queue score's exact range)."""
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, int(priority)))


@dataclass
class Batch:
    """Everything one node sends in one call."""

    adopt: list[tuple[str, str]] = field(default_factory=list)
    adds: list[tuple[str, int, str, int]] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    fails: list[tuple[str, str, str]] = field(default_factory=list)
    nacks: list[str] = field(default_factory=list)
    take: int = 0
    #: renew the lease, reclaim expired ones, report delayed/inflight sizes
    maintenance: bool = True
    #: move due delayed entries to the queue (always done with maintenance)
    promote: bool = True
    #: also reclaim entries held by ids that are not registered nodes
    sweep: bool = False

    def add(self, payload: str, fingerprint: bytes | str | None = None,
            priority: int = 0, delay_ms: int = 0) -> None:
        """Queue *payload* (after *delay_ms*, counted in Redis server time);
        with a fingerprint it is deduplicated first."""
        fp = fingerprint_hex(fingerprint) if fingerprint is not None else ""
        self.adds.append((fp, clamp_priority(priority), payload, max(0, int(delay_ms))))

    def fail(self, member: str, kind: str, record: dict) -> None:
        if kind not in ("dead", "invalid"):
            raise ValueError(f"unknown failure list {kind!r}")
        self.fails.append((member, kind, json.dumps(record, separators=(",", ":"))))

    def __bool__(self) -> bool:
        return bool(self.adopt or self.adds or self.acks or self.fails or self.nacks
                    or self.take)

    def merge(self, other: "Batch") -> None:
        """Append *other*'s operations after this batch's."""
        self.adopt += other.adopt
        self.adds += other.adds
        self.acks += other.acks
        self.fails += other.fails
        self.nacks += other.nacks


@dataclass
class SyncResult:
    """What one call returned: taken entries and the frontier's sizes.

    ``delayed`` and ``inflight`` are -1 unless the call did maintenance;
    ``now_ms`` is -1 when the call did not need the time; ``stale`` counts
    acks/fails/nacks of entries this node no longer held; ``missing`` queue
    members that had no payload (set aside in the invalid list); ``trimmed``
    old records dropped from the dead/invalid lists to keep them capped.
    """

    taken: list[tuple[str, bytes]]
    added: int
    duplicates: int
    queued: int
    delayed: int
    inflight: int
    reclaimed: int
    now_ms: int
    stale: int = 0
    missing: int = 0
    trimmed: int = 0


class Frontier:
    """A spider's shared frontier, used with a synchronous redis-py client."""

    def __init__(self, client, spider: str, node: str, *, lease_ttl: float = 10.0,
                 bloom: BloomConfig | None = None, clock=None, dead_max: int = DEAD_MAX,
                 invalid_max: int = INVALID_MAX):
        self.client = client
        self.keys = FrontierKeys(spider)
        self.node = node
        self.lease_ttl_ms = int(lease_ttl * 1000)
        self.dead_max = max(1, int(dead_max))
        self.invalid_max = max(1, int(invalid_max))
        self.bloom = bloom or BloomConfig()
        # clock() -> ms; None means Redis server time (node clocks never matter).
        self.clock = clock
        self._sync = client.register_script(SYNC)
        self._replay = client.register_script(REPLAY_DEAD)

    # -- the one round trip ---------------------------------------------------
    def _sync_call(self, batch: Batch, leaving: bool):
        keys = self.keys.sync_keys()
        flags = (("m" if batch.maintenance else "") + ("d" if batch.promote else "")
                 + ("s" if batch.sweep else ""))
        args = [str(self.clock()) if self.clock else "", self.node,
                0 if leaving else self.lease_ttl_ms, batch.take, flags,
                *self.bloom.args(), self.dead_max, self.invalid_max, len(batch.adopt)]
        for member, former in batch.adopt:
            args += [member, former]
        args.append(len(batch.adds))
        for fp, prio, payload, delay in batch.adds:
            args += [fp, prio, payload, delay]
        args.append(len(batch.acks))
        args += batch.acks
        args.append(len(batch.fails))
        for member, kind, record in batch.fails:
            args += [member, kind, record]
        args.append(len(batch.nacks))
        args += batch.nacks
        return self._sync(keys=keys, args=args)

    @staticmethod
    def _parse(raw) -> SyncResult:
        flat = raw[0]
        taken = [(_s(flat[i]), _b(flat[i + 1])) for i in range(0, len(flat), 2)]
        return SyncResult(taken, *(int(x) for x in raw[1:11]))

    def sync(self, batch: Batch | None = None, *, leaving: bool = False) -> SyncResult:
        """Send *batch* (and renew this node's lease) in one atomic call."""
        return self._parse(self._sync_call(batch or Batch(), leaving))

    # -- conveniences over sync() -------------------------------------------
    def push(self, payload: str, fingerprint=None, priority: int = 0, delay_ms: int = 0) -> bool:
        """Add one entry; False when the fingerprint was seen before."""
        batch = Batch()
        batch.add(payload, fingerprint, priority, delay_ms)
        return self.sync(batch).added == 1

    def take(self, count: int) -> list[tuple[str, bytes]]:
        return self.sync(Batch(take=count)).taken

    def ack(self, *members: str) -> None:
        self.sync(Batch(acks=list(members)))

    def nack(self, *members: str) -> None:
        self.sync(Batch(nacks=list(members)))

    def heartbeat(self) -> SyncResult:
        return self.sync()

    def leave(self, unstarted: list[str] = ()) -> SyncResult:
        """Return unstarted entries and drop this node's heartbeat."""
        return self.sync(Batch(nacks=list(unstarted)), leaving=True)

    # -- operator views --------------------------------------------------------
    def replay_dead(self, count: int = 1000) -> int:
        """Move up to *count* dead letters (oldest first) back into the queue.

        Each gets a fresh start: its attempt counters (``retry_times``,
        callback attempts) are cleared, so it has all its retries again.
        Records that are not JSON with a string ``payload`` stay in the list.
        """
        records = self.client.lrange(self.keys.dead, -count, -1)[::-1]
        return int(self._replay(keys=self.keys.replay_keys(), args=_replay_args(records)))

    def dead_letters(self, count: int = 100) -> list[dict]:
        return [json.loads(r) for r in self.client.lrange(self.keys.dead, 0, count - 1)]

    def invalid_entries(self, count: int = 100) -> list[dict]:
        return [json.loads(r) for r in self.client.lrange(self.keys.invalid, 0, count - 1)]

    def counts(self) -> dict[str, int]:
        k, c = self.keys, self.client
        return {"queued": c.zcard(k.queue), "delayed": c.zcard(k.delayed),
                "inflight": c.hlen(k.inflight), "dead": c.llen(k.dead),
                "invalid": c.llen(k.invalid), "nodes": c.zcard(k.nodes)}

    def stats(self) -> dict[str, int]:
        """Cluster-wide counters that nodes add with :meth:`add_stats`."""
        return {_s(a): int(b) for a, b in self.client.hgetall(self.keys.stats).items()}

    def _stats_pipeline(self, deltas: dict[str, int]):
        pipe = self.client.pipeline(transaction=False)
        for name, value in deltas.items():
            if value:
                pipe.hincrby(self.keys.stats, name, value)
        return pipe

    def bloom_estimates(self) -> dict:
        return filter_estimates(self.client.hgetall(self.keys.bloom))


    def add_stats(self, deltas: dict[str, int]) -> None:
        self._stats_pipeline(deltas).execute()


class AsyncFrontier(Frontier):
    """The same frontier over an asyncio redis-py client (the Scrapy scheduler)."""

    async def sync(self, batch: Batch | None = None, *, leaving: bool = False) -> SyncResult:
        return self._parse(await self._sync_call(batch or Batch(), leaving))

    async def add_stats(self, deltas: dict[str, int]) -> None:
        if any(deltas.values()):
            await self._stats_pipeline(deltas).execute()

    async def bloom_estimates(self) -> dict:
        return filter_estimates(await self.client.hgetall(self.keys.bloom))


def _replay_args(records: list) -> list:
    args: list = []
    for raw in records:
        try:
            record = json.loads(raw)
            payload = record["payload"]
            priority = clamp_priority(record.get("priority") or 0)
        except (ValueError, TypeError, KeyError):
            continue
        if not isinstance(payload, str):
            continue
        args += [raw, fresh_payload(payload), priority]
    return args


def fresh_payload(payload: str) -> str:
    """*payload* without its attempt counters (unchanged if it is not JSON)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    meta = data.get("meta") if isinstance(data, dict) else None
    if not isinstance(meta, dict) or not any(k in meta for k in ATTEMPT_META_KEYS):
        return payload
    for key in ATTEMPT_META_KEYS:
        meta.pop(key, None)
    return json.dumps(data, separators=(",", ":"))


def now_ms() -> int:
    return int(time.time() * 1000)


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _b(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
