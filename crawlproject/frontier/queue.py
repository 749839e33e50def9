"""The shared frontier: leased, at-least-once, polite delivery of requests in Redis.

Plain classes that know Redis, not Scrapy: the scheduler adapter, the
command-line tool, the tests and the benchmarks all use them. One
:class:`Frontier` is one *partition* (see :mod:`crawlproject.keys`); with
``FRONTIER_PARTITIONS = 1`` there is one.

Life of an entry (member ``"<priority>:<seq>@<politeness key>"``, payload in
``payloads``):

* **add** — deduplicated against the partition's Bloom filter and queued in
  its politeness key's queue in the same atomic call (or put in ``delayed``
  until its due time);
* **take** — popped from a key whose *ready time* has come (its interval since
  the last start passed, no block, fewer than its concurrency in flight),
  recorded in ``inflight`` and in the node's held set as owned by the node;
  the node's lease deadline (``nodes`` zset, Redis server time) is renewed by
  every take and at least every heartbeat;
* **ack** — done (downloaded, callback output consumed, new requests added,
  items stored): forgotten; **fail** — forgotten, with a record kept in the
  ``dead`` or ``invalid`` list; **nack** — not started: back in its place.
  Only the node holding the lease can do these (or a node whose lease expired,
  for an entry nobody took since): any other call is *stale*, counted and
  ignored, so a node that lost its lease cannot undo another node's work;
* **reclaim** — any node's call puts back the entries of nodes whose lease
  deadline has passed, reading only their held sets (a node killed with
  SIGKILL loses nothing); a *sweep* also puts back entries whose owner is not
  a registered node at all, and recounts each key's in-flight entries;
* **feedback** — a node reports what a site said (429/503 with or without
  ``Retry-After``, a robots.txt crawl delay): the key is blocked or slowed for
  every node; and a request of a key with an interval that it sent later than
  its lease allowed: the key's interval counts from that send.

Every operation a node has pending for a partition travels in one ``SYNC``
script call.

Size (over 600 lines): the Python side of the partition's scripts — the batch,
the scripts' argument layout and the parsing of their replies — kept with the
reads an operator makes of the same keys.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from dataclasses import dataclass, field

import redis

from crawlproject.defaults import SCHEDULER_DEAD_MAX, SCHEDULER_INVALID_MAX
from crawlproject.frontier.bloom import BloomConfig, filter_estimates, fingerprint_hex
from crawlproject.frontier.deadletters import (ATTEMPT_META_KEYS, DeadLetter,  # noqa: F401
                                               KeyFunction, fresh_payload, read_record,
                                               replay_args)
from crawlproject.frontier.window import WindowRule
from crawlproject.frontier.sitelimits import (UNLIMITED, Limits, Override, PolitenessConfig,
                                              parse_override, partition_of, safe_key)
from crawlproject.frontier.library import LibraryMissingError, script
from crawlproject.frontier.scripts import (BLOOM_ADD, COUNTER_PATTERN, REPLAY_DEAD, SET_LIMITS,
                                           SYNC)
from crawlproject.keys import FrontierKeys
from crawlproject.keys import as_text as _s

logger = logging.getLogger(__name__)

#: The fingerprint of a new page sent without deduplication (see :meth:`Batch.add`).
NEW_UNFILTERED = "+"
MAX_PRIORITY = 4095  # |priority| < 2^12 keeps the queue score exact in a double
#: Records kept in the dead-letter and invalid lists (newest first) by default.
DEAD_MAX = SCHEDULER_DEAD_MAX
INVALID_MAX = SCHEDULER_INVALID_MAX
REPLAY_BATCH = 100  # dead letters per REPLAY_DEAD call: bounds the time Redis is held


def clamp_priority(priority: int) -> int:
    """*priority* within ±:data:`MAX_PRIORITY` (the queue score's exact range)."""
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, int(priority)))


#: The longest block or crawl delay sent to the scripts (about 31 years): they
#: cap both far lower (FRONTIER_RETRY_AFTER_MAX, FRONTIER_BACKOFF_MAX).
_MAX_MS = 10**12


def _ms(seconds: float) -> int:
    """*seconds* a site asked for, in ms for the scripts: a number it sent may be
    negative, NaN or as large as ``1e308`` (``int(inf)`` would raise): NaN and
    negatives are 0, the rest at most :data:`_MAX_MS`."""
    if seconds != seconds:  # NaN
        return 0
    return int(min(max(seconds, 0.0) * 1000, _MAX_MS))


@dataclass
class Batch:
    """Everything one node sends in one call."""

    adopt: list[tuple[str, str]] = field(default_factory=list)
    adds: list[tuple[str, str, int, str, int]] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    #: acked members whose response asked to slow down (no backoff relief)
    unrelieved: set[str] = field(default_factory=set)
    fails: list[tuple[str, str, str]] = field(default_factory=list)
    nacks: list[str] = field(default_factory=list)
    feedback: list[tuple[str, str, float]] = field(default_factory=list)
    #: leased members whose download ended (frees their key's slot)
    fetched: list[str] = field(default_factory=list)
    #: (ended member, started member): a reserved entry took the ended one's slot
    handoffs: list[tuple[str, str]] = field(default_factory=list)
    #: (politeness key, how many more entries of it to hold in reserve; 0 asks
    #: only whether the reserve held may still be used)
    reserve: list[tuple[str, int]] = field(default_factory=list)
    take: int = 0
    #: most entries to take from keys with an interval (None: as many as ``take``)
    take_polite: int | None = None
    #: renew the lease, reclaim expired ones, report delayed/inflight sizes
    maintenance: bool = True
    #: move due delayed entries to the queue (always done with maintenance)
    promote: bool = True
    #: also reclaim entries held by ids that are not registered nodes
    sweep: bool = False
    #: this node renewed its lease well within the TTL: a take need not register it
    registered: bool = False
    #: check every key the call may write before writing anything (after a call
    #: that stopped inside the script): junk there is refused with ``BADKEY``
    check: bool = False

    def add(self, payload: str, fingerprint: bytes | str | None = None,
            priority: int = 0, delay_ms: int = 0, key: str = "",
            unfiltered: bool = False) -> None:
        """Queue *payload* in politeness key *key*'s queue (after *delay_ms*,
        counted in Redis server time); with a fingerprint it is deduplicated
        first. Without one (None) it is the same page again (a retry, a
        redirect kept): it counts against no budget; :data:`NEW_UNFILTERED`
        is a new page not deduplicated: it does. *unfiltered* with a
        fingerprint: a new page queued even if the filter has it (``dont_filter``,
        a seed), its fingerprint recorded there all the same, so a link to
        the page later is a duplicate (Scrapy records nothing for
        ``dont_filter``: a start URL linked back from its pages is fetched twice)."""
        fp = ("" if fingerprint is None else NEW_UNFILTERED if fingerprint == NEW_UNFILTERED
              else fingerprint_hex(fingerprint))
        if unfiltered and fp and fp != NEW_UNFILTERED:
            fp = "!" + fp   # SYNC: added to the filter, queued whatever it said
        self.adds.append((safe_key(key), fp, clamp_priority(priority), payload,
                          max(0, int(delay_ms))))

    def force_adds(self) -> None:
        """Queue this batch's new requests even if the filter has them.

        For the adds of a call that stopped inside the script (a key of the wrong
        type, see :func:`stopped_in_script`): Redis does not roll a script back,
        so it may have put their fingerprints in the filter without queueing
        them, and sent again as usual they would be dropped as duplicates. At
        worst a request is crawled twice; none is lost."""
        self.adds = [(key, "!" + fp if fp and fp[0] != "!" else fp, prio, payload, delay)
                     for key, fp, prio, payload, delay in self.adds]

    def block(self, key: str, seconds: float) -> None:
        """The site asked (``Retry-After``) not to be sent anything for *seconds*."""
        self.feedback.append((safe_key(key), "block", _ms(seconds)))

    def backoff(self, key: str) -> None:
        """The site answered a slow-down status without saying how long."""
        self.feedback.append((safe_key(key), "backoff", 0))

    def crawl_delay(self, key: str, seconds: float) -> None:
        """The site's robots.txt asks for *seconds* between requests."""
        self.feedback.append((safe_key(key), "crawldelay", _ms(seconds)))

    def sent_late(self, member: str, sent_at: float) -> None:
        """Leased entry *member* went out at *sent_at* (``time.monotonic()``),
        later than its lease allowed: its key's next start counts from then.
        Sent as the milliseconds since, reckoned when the call is made (the
        frontier keeps Redis's clock; a node's clock is never compared with
        it). The frontier takes it only from the node that holds *member*'s
        lease (``SyncResult.sent_refused`` counts the others)."""
        self.feedback.append((member, "sent", sent_at))

    def fail(self, member: str, kind: str, record: dict) -> None:
        if kind not in ("dead", "invalid"):
            raise ValueError(f"unknown failure list {kind!r}")
        self.fails.append((member, kind, json.dumps(record, separators=(",", ":"))))

    def __bool__(self) -> bool:
        return bool(self.adopt or self.adds or self.acks or self.fails or self.nacks
                    or self.feedback or self.fetched or self.handoffs or self.take)

    def merge(self, other: "Batch") -> None:
        """Append *other*'s operations after this batch's."""
        self.adopt += other.adopt
        self.adds += other.adds
        self.acks += other.acks
        self.unrelieved |= other.unrelieved
        self.fails += other.fails
        self.nacks += other.nacks
        self.feedback += other.feedback
        self.fetched += other.fetched
        self.handoffs += other.handoffs


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
    #: earliest ready time of a key of the partition (ms), -1 when none is queued
    next_ready_ms: int = -1
    #: keys the take filled up to their concurrency, or passed over because
    #: they had it in flight
    capped: int = 0
    #: entries leased into the node's reserve (they hold no slot yet)
    reserved: list[tuple[str, bytes]] = field(default_factory=list)
    #: key -> (its reserve may be used, the node's share of its concurrency)
    reserve_status: dict[str, tuple[bool, int]] = field(default_factory=dict)
    #: the keys behind ``capped`` (at most 64)
    capped_keys: list[str] = field(default_factory=list)
    #: the keys with an interval the take took from (their entries start at once)
    #: new pages refused over a budget
    budget_refused: int = 0
    #: keys with an interval this call took from → their interval (s)
    polite_keys: dict[str, float] = field(default_factory=dict)
    #: fields of the frontier's records read back as junk (per-key states,
    #: overrides, budget counts, bookkeeping; forged node deadlines and ready
    #: times): read field by field, counted, mended where the script owns them
    state_junk: int = 0
    #: the budget key is not a hash: this call's budget accounting was skipped
    budget_skipped: bool = False
    #: ``sent`` reports refused (the member was not leased to this node)
    sent_refused: int = 0
    #: the crawl's recorded maxima (ms) for a block and a backoff or crawl
    #: delay, when this call read them (a call with such feedback), else None
    bounds_ms: tuple[int, int] | None = None
    #: entries of this partition in the MongoDB tier (kstate '||backlog')
    backlog: int = 0
    #: keys waiting for a spill or a refill (0: this call did not look)
    moves: int = 0


class Frontier:
    """One partition of a spider's shared frontier, over a synchronous
    redis-py client (``partition`` of ``partitions``)."""

    def __init__(self, client, spider: str, node: str, *, lease_ttl: float = 10.0,
                 bloom: BloomConfig | None = None, clock=None, dead_max: int = DEAD_MAX,
                 invalid_max: int = INVALID_MAX, partition: int = 0, partitions: int = 1,
                 politeness: PolitenessConfig | None = None):
        self.client = client
        self.keys = FrontierKeys(spider, partition, partitions)
        self._sync_keys = tuple(self.keys.sync_keys())   # fixed: built once, not per call
        self.politeness = politeness or PolitenessConfig(enabled=False, default=Limits())
        self.node = node
        self.lease_ttl_ms = int(lease_ttl * 1000)
        self.dead_max = max(1, int(dead_max))
        self.invalid_max = max(1, int(invalid_max))
        self.bloom = bloom or BloomConfig()
        # clock() -> ms; None means Redis server time (node clocks never matter).
        self.clock = clock
        #: the MongoDB tier's window rule (SYNC flags keys for the mover); off
        #: unless the node sets one (crawlproject.frontier.window)
        self.window = WindowRule(enabled=False)
        self._sync = script(client, SYNC)
        self._replay = script(client, REPLAY_DEAD)
        self._set_limits = script(client, SET_LIMITS)
        self._bloom_add = script(client, BLOOM_ADD)

    # -- the one round trip ---------------------------------------------------
    def _sync_call(self, batch: Batch, leaving: bool):
        keys = self._sync_keys
        flags = (("m" if batch.maintenance else "") + ("d" if batch.promote else "")
                 + ("s" if batch.sweep else "") + ("r" if batch.registered else "")
                 + ("c" if batch.check else ""))
        pol = self.politeness
        args = [str(self.clock()) if self.clock else "", self.node,
                0 if leaving else self.lease_ttl_ms, batch.take, flags,
                *self.bloom.args(), self.dead_max, self.invalid_max,
                int(round(pol.default.delay * 1000)), pol.default.concurrency or UNLIMITED,
                pol.jitter, int(pol.backoff_max * 1000), int(pol.retry_after_max * 1000),
                random.randrange(1, 2**31),
                batch.take if batch.take_polite is None else batch.take_polite,
                pol.margin, len(batch.adopt)]
        for member, former in batch.adopt:
            args += [member, former]
        args.append(len(batch.adds))
        for entry in batch.adds:
            args += entry
        args.append(len(batch.acks))
        for member in batch.acks:
            args += [member, "0" if member in batch.unrelieved else "1"]
        args.append(len(batch.fails))
        for member, kind, record in batch.fails:
            args += [member, kind, record]
        args.append(len(batch.nacks))
        args += batch.nacks
        args.append(len(batch.feedback))
        now = time.monotonic()
        for key, kind, value in batch.feedback:
            if kind == "sent":  # a monotonic time: how long ago, as of this call
                value = _ms(max(0.0, now - value))
            args += [key, kind, value]
        args.append(len(batch.fetched))
        args += batch.fetched
        args.append(len(batch.handoffs))
        for ended, started in batch.handoffs:
            args += [ended, started]
        args.append(len(batch.reserve))
        for key, count in batch.reserve:
            args += [key, count]
        # After the sections, where a script that does not read them ignores them.
        args += [int(round(pol.margin_min * 1000)),
                 int(round(pol.backoff_tolerance * 1_000_000)),
                 max(1, int(round(1_000_000 / pol.backoff_window))),
                 int(round(pol.backoff_base * 1000)), pol.default.budget,
                 -(-pol.crawl_budget // max(1, pol.partitions)), *self.window_args]
        return self._sync(keys=keys, args=args)

    @property
    def window(self) -> WindowRule:
        return self._window

    @window.setter
    def window(self, rule: WindowRule) -> None:
        self._window, self.window_args = rule, tuple(rule.sync_args())

    @staticmethod
    def _parse(raw) -> SyncResult:
        flat = raw[0]
        taken = [(_s(flat[i]), _b(flat[i + 1])) for i in range(0, len(flat), 2)]
        result = SyncResult(taken, *(int(float(x)) for x in raw[1:13]))
        res, st = raw[13], raw[14]
        result.reserved = [(_s(res[i]), _b(res[i + 1])) for i in range(0, len(res), 2)]
        result.reserve_status = {_s(st[i]): (int(st[i + 1]) == 1, int(st[i + 2]))
                                 for i in range(0, len(st), 3)}
        result.capped_keys = [_s(k) for k in raw[15]]
        polite = raw[16] if len(raw) > 16 else []
        try:
            result.polite_keys = {_s(polite[i]): int(polite[i + 1]) / 1000
                                  for i in range(0, len(polite) - 1, 2)}
        except ValueError:  # a script of before the intervals: keys alone
            result.polite_keys = {_s(k): 0.0 for k in polite}
        result.budget_refused = int(raw[17]) if len(raw) > 17 else 0
        if len(raw) > 21:
            result.state_junk, result.sent_refused = int(raw[18]), int(raw[20])
            result.budget_skipped = int(raw[19]) == 1
            if len(raw[21]) == 2:
                result.bounds_ms = (int(raw[21][0]), int(raw[21][1]))
        if len(raw) > 23:
            result.backlog, result.moves = int(raw[22]), int(raw[23])
        return result

    def sync(self, batch: Batch | None = None, *, leaving: bool = False) -> SyncResult:
        """Send *batch* (and renew this node's lease) in one atomic call."""
        return self._parse(self._sync_call(Batch() if batch is None else batch, leaving))

    # -- conveniences over sync() -------------------------------------------
    def push(self, payload: str, fingerprint=None, priority: int = 0, delay_ms: int = 0,
             key: str = "") -> bool:
        """Add one entry to *key*'s queue; False when the fingerprint was seen before."""
        batch = Batch()
        batch.add(payload, fingerprint, priority, delay_ms, key)
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
    def replay_dead(self, count: int = 1000, batch: int = REPLAY_BATCH, *,
                    key_of: KeyFunction, skipped: list | None = None) -> int:
        """Move up to *count* dead letters (oldest first) back into the queue.

        Each is queued under the politeness key *key_of* computes from its
        payload's URL (the nodes' function), never the key the record names.
        An unsigned payload gets a fresh start: its attempt counters
        (``retry_times``, callback attempts) are cleared, so it has all its
        retries again; a signed one is queued byte for byte (its proof covers
        them). Records that cannot be replayed (not JSON, no usable URL, a key
        of another partition: :mod:`crawlproject.frontier.deadletters`) stay in
        the list and are appended to *skipped* as ``(letter, reason)``.
        Done in calls of at most *batch* records each, so no single script
        call holds Redis for long (a lease renewal waits behind it).
        """
        def partition(key: str) -> int:
            return partition_of(key, self.keys.partitions)

        replayed, kept, left = 0, 0, count
        while left > 0:
            n = min(batch, left)
            # unreadable records stay at the tail: read past them
            records = self.client.lrange(self.keys.dead, -(kept + n), -(kept + 1))[::-1]
            args = replay_args(records, key_of, partition, self.keys.partition, skipped)
            if args:
                replayed += int(self._replay(keys=self.keys.replay_keys(), args=args))
            kept += len(records) - len(args) // 4
            left -= len(records)
            if len(records) < n:
                break
        return replayed

    # -- politeness: per-key limits and state ----------------------------------
    def set_limits(self, limits: dict[str, Limits | Override | None], source: str = "c",
                   *, only_missing: bool = False) -> int:
        """Override (or, with None, clear) the limits of politeness keys of this
        partition; in force at once (keys waiting in the ready set are
        rescheduled). A field an :class:`Override` leaves None keeps the nodes'
        setting. ``source`` ``"s"`` (settings) never replaces ``"c"`` (command
        line); with *only_missing* it writes only keys that have no override at
        all (a node putting back its ``FRONTIER_HOST_LIMITS`` entry after
        ``crawlctl politeness --clear``). Returns how many keys changed."""
        return int(self._set_limits_call(limits, source, only_missing))

    def _set_limits_call(self, limits: dict, source: str, only_missing: bool):
        if source not in ("c", "s") or (only_missing and source != "s"):
            raise ValueError(f"unknown limits source {source!r}")
        args = ["f" if only_missing else source]
        for key, value in limits.items():
            args += [safe_key(key), value.encoded(source) if value is not None else ""]
        return self._set_limits(keys=[self.keys.limits, self.keys.ready, self.keys.kstate,
                                      self.keys.queue_prefix], args=args)

    def limits(self) -> dict[str, dict]:
        """Overrides stored in Redis: key → {delay, concurrency, source} (a
        field None: not overridden, the nodes' setting applies)."""
        out = {}
        for key, value in self.client.hgetall(self.keys.limits).items():
            try:
                out[_s(key)] = parse_override(_s(value))
            except ValueError:  # not written by this code: said, not fatal
                logger.warning("Ignoring a malformed limits record for %r: %r",
                               _s(key)[:200], _s(value)[:200])
        return out

    def key_states(self, keys: list[str] | None = None) -> dict[str, dict]:
        """Politeness state: key → in flight, last start, blocked until, backoff,
        crawl delay (ms, Redis time), recent share of slow-down answers, queued,
        ready at."""
        if keys is None:
            return dict(self.scan_key_states())
        return self._states_of(dict(zip(keys, self.client.hmget(self.keys.kstate, keys))))

    def _states_of(self, raw: dict) -> dict[str, dict]:
        parsed, junk = {}, {}
        for key, value in raw.items():
            if value is None or _s(key).startswith("|"):  # '|key': a mirrored override
                continue
            key = _s(key)
            parsed[key], junk[key] = parse_key_state(_s(value))
            if junk[key]:  # not written by the script: said, not fatal
                logger.warning("A politeness state for %r holds junk (%d field(s) read as 0, "
                               "the others kept, as the frontier reads it): %r", key[:200],
                               junk[key], _s(value)[:200])
        pipe = self.client.pipeline(transaction=False)
        for key in parsed:
            pipe.zcard(self.keys.queue(key))
            pipe.zscore(self.keys.ready, key)
        replies = pipe.execute() if parsed else []
        out = {}
        for i, (key, (n, last, block, backoff, delay, errors)) in enumerate(parsed.items()):
            out[key] = {"inflight": n, "last_start_ms": last, "blocked_until_ms": block,
                        "backoff_ms": backoff, "crawl_delay_ms": delay,
                        "error_rate": errors / 1_000_000,
                        "queued": replies[2 * i], "ready_at_ms": replies[2 * i + 1]}
            if junk[key]:
                out[key]["junk_fields"] = junk[key]
        return out

    def budget_counts(self, keys: list[str]) -> dict[str, dict]:
        """New pages admitted and refused over a budget: key → ``{"admitted",
        "refused"}`` for the *keys* that have counts, and ``"||crawl"`` for the
        partition (counted only while budgets apply)."""
        fields = [*keys, "||crawl"]
        out = {}
        for field, raw in zip(fields, self.client.hmget(self.keys.budget, fields)):
            try:
                admitted, refused = (int(x) for x in _s(raw).split("|"))
            except (TypeError, ValueError, AttributeError):   # absent, or not ours
                continue
            out[field] = {"admitted": admitted, "refused": refused}
        return out

    def dead_records(self, count: int = 100) -> list[DeadLetter]:
        """The newest *count* dead letters as read (:func:`read_record`: each
        shown, or with the reason it cannot be)."""
        return [read_record(r) for r in self.client.lrange(self.keys.dead, 0, count - 1)]

    def dead_letters(self, count: int = 100) -> list[dict]:
        """The newest *count* dead letters that are JSON objects, as stored."""
        return _objects(self.client.lrange(self.keys.dead, 0, count - 1))

    def invalid_records(self, count: int = 100) -> list[DeadLetter]:
        """The newest *count* invalid payload records as read (shown, or the
        reason they cannot be)."""
        return [read_record(r, show_payload=True)
                for r in self.client.lrange(self.keys.invalid, 0, count - 1)]

    def invalid_entries(self, count: int = 100) -> list[dict]:
        """The newest *count* invalid payload records that are JSON objects."""
        return _objects(self.client.lrange(self.keys.invalid, 0, count - 1))

    def queued(self) -> int:
        """Entries queued in this partition, as the last SYNC call left the count
        (kstate's ``||qlen``; a crawl begun by an older version and not synced
        since has it in the ``qlen`` key). Not a count: 0 until a call recounts."""
        raw = self.client.hget(self.keys.kstate, "||qlen")
        if raw is None:
            try:
                raw = self.client.get(self.keys.qlen)
            except redis.ResponseError:  # not a string: recounted by the next call
                raw = None
        try:
            return max(0, int(raw or 0))
        except ValueError:
            return 0

    def counts(self) -> dict[str, int]:
        k, c = self.keys, self.client
        return {"queued": self.queued(), "delayed": c.zcard(k.delayed),
                "inflight": c.hlen(k.inflight), "dead": c.llen(k.dead),
                "invalid": c.llen(k.invalid), "nodes": c.zcard(k.nodes),
                "hosts": self.host_count()}

    def host_count(self) -> int:
        """Politeness keys with a state, in O(1): the state hash's length less
        its bookkeeping fields (``||…``) and override mirrors (``|key``, one
        per entry of the limits hash). HKEYS of a million hosts blocked Redis,
        every node's calls included, for a quarter of a second per look (and
        the dashboard looks every few seconds)."""
        c, k = self.client, self.keys
        pipe = c.pipeline(transaction=False)
        pipe.hlen(k.kstate)
        pipe.hlen(k.limits)
        pipe.hmget(k.kstate, list(KSTATE_BOOKKEEPING))
        total, mirrors, bookkeeping = pipe.execute()
        return max(0, total - mirrors - sum(1 for v in bookkeeping if v is not None))

    def scan_key_states(self, batch: int = 1000):
        """Every key's :meth:`key_states` entry, read in HSCAN windows of about
        *batch* fields, two pipelined lookups a key: never one command over
        the whole hash (Redis answers the nodes' calls in between)."""
        cursor = 0
        while True:
            cursor, fields = self.client.hscan(self.keys.kstate, cursor, count=batch)
            if fields:  # (HSCAN may return a field twice: callers keep the last)
                yield from self._states_of(fields).items()
            if not int(cursor):
                return

    def stats(self) -> dict[str, int]:
        """Cluster-wide counters that nodes add with :meth:`add_stats`, plus
        this partition's own (trims)."""
        return self._counters(self.keys.cluster_stats, self.keys.stats)

    def own_stats(self) -> dict[str, int]:
        """This partition's own counters (the scripts': trims, recounts, junk)."""
        return self._counters(self.keys.stats)

    def _counters(self, *keys: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for key in dict.fromkeys(keys):
            try:
                fields = self.client.hgetall(key)
            except redis.ResponseError:  # not a hash (written by someone else)
                logger.warning("%s is not a hash: its counters are not shown", key)
                continue
            for a, b in fields.items():
                value = _s(b)
                if not re.fullmatch(COUNTER_PATTERN, value, re.ASCII):  # said, not fatal
                    logger.warning("Ignoring a counter of %s that is not a count: %r = %r",
                                   key, _s(a)[:100], _s(b)[:100])
                    continue
                out[_s(a)] = out.get(_s(a), 0) + int(value)
        return out

    def _stats_pipeline(self, deltas: dict[str, int]):
        pipe = self.client.pipeline(transaction=False)
        for name, value in deltas.items():
            if value:
                pipe.hincrby(self.keys.cluster_stats, name, value)
        return pipe

    def bloom_estimates(self) -> dict:
        return filter_estimates(self.client.hgetall(self.keys.bloom))


    def add_stats(self, deltas: dict[str, int]) -> None:
        """Add *deltas* to the cluster-wide counters. A counter holding junk
        (anyone can write to Redis) starts again from its delta, said once:
        HINCRBY refuses it, and the node would retry the same deltas for ever."""
        results = self._stats_pipeline(deltas).execute(raise_on_error=False)
        junk = self._junk_counters(deltas, results)
        if junk:
            self.client.hset(self.keys.cluster_stats, mapping=junk)

    def _junk_counters(self, deltas: dict[str, int], results: list) -> dict[str, int]:
        names = [name for name, value in deltas.items() if value]
        junk = {name: deltas[name] for name, result in zip(names, results)
                if isinstance(result, redis.ResponseError)}
        if junk:
            logger.warning("Counters of %s held junk, started again: %s",
                           self.keys.cluster_stats, ", ".join(sorted(junk))[:200])
        return junk


class AsyncFrontier(Frontier):
    """The same frontier over an asyncio redis-py client (the Scrapy scheduler)."""

    async def sync(self, batch: Batch | None = None, *, leaving: bool = False) -> SyncResult:
        return self._parse(await self._sync_call(Batch() if batch is None else batch, leaving))

    async def add_stats(self, deltas: dict[str, int]) -> None:
        if any(deltas.values()):
            results = await self._stats_pipeline(deltas).execute(raise_on_error=False)
            junk = self._junk_counters(deltas, results)
            if junk:
                await self.client.hset(self.keys.cluster_stats, mapping=junk)

    async def bloom_estimates(self) -> dict:
        return filter_estimates(await self.client.hgetall(self.keys.bloom))

    async def keep_dead(self, record: str) -> None:
        """Add *record* to this partition's dead letters (at most ``dead_max``
        kept, newest first): a request no frontier entry stands for (one a
        node kept, crawlproject.scheduling.local) whose retries ran out."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.lpush(self.keys.dead, record)
            pipe.ltrim(self.keys.dead, 0, self.dead_max - 1)
            await pipe.execute()

    async def mark_seen(self, fingerprints: list) -> list[bool]:
        """Check-and-add *fingerprints* to this partition's Bloom filter (the
        one SYNC dedupes with), queueing nothing: True for each that was new.
        For requests a node keeps to itself (crawlproject.scheduling.local)."""
        got = await self._bloom_add(keys=[self.keys.bloom],
                                    args=[*self.bloom.args(), "add",
                                          *map(fingerprint_hex, fingerprints)])
        return [bool(int(x)) for x in got]

    async def set_limits(self, limits: dict[str, Limits | Override | None], source: str = "c",
                         *, only_missing: bool = False) -> int:
        return int(await self._set_limits_call(limits, source, only_missing))


def parse_key_state(value: str) -> tuple[list[int], int]:
    """A per-key state ``"n|last|block|backoff|crawl delay[|error rate[|starts|
    history]]"`` read as the SYNC script reads it: field by field, a field that
    is not digits read as 0 (the others kept: junk in one field never lifts
    another's block). Returns the first six values and how many fields were
    junk (the pace's two: :func:`crawlproject.frontier.window.observed_pace`)."""
    fields = value.split("|")
    junk = 0 if len(fields) in (5, 6, 8) else 1
    out = []
    for i in range(6):
        text = fields[i] if i < len(fields) else ""
        number = _count(text)
        if number is None:
            junk += 0 if (i == 5 and text == "") else 1
            number = 0
        out.append(number)
    out[5] = min(out[5], 1_000_000)
    if len(fields) == 8:    # the pace: read on its own (window.observed_pace)
        junk += sum(_count(f) is None for f in fields[6:])
    return out, junk


def _count(raw) -> int | None:
    """*raw* (from Redis) as a count, or None: ASCII digits only, as the scripts
    write them (``int()`` would take ``" 5"``, ``"+5"``, ``"5_0"``, ``"٥"``)."""
    text = _s(raw) if raw is not None else ""
    if not (0 < len(text) <= 18 and text.isascii() and text.isdigit()):
        return None
    return int(text)


#: fields of ``T:kstate`` that are not a key's state nor an override mirror
KSTATE_BOOKKEEPING = ("||cursor", "||limits", "||qlen", "||budgets", "||bounds")


def _objects(raws: list) -> list[dict]:
    """The entries of *raws* that are JSON objects (the others are junk someone
    else wrote: left out, never an error)."""
    out = []
    for raw in raws:
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


#: Error replies of calls that did not run, or stopped before their first write
#: (a script is refused under OOM at its first write): nothing of the call is in Redis.
_NOT_STARTED = (redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError,
                LibraryMissingError,
                redis.exceptions.ReadOnlyError, redis.exceptions.AskError,
                redis.exceptions.MovedError, redis.exceptions.TryAgainError,
                redis.exceptions.ClusterDownError, redis.exceptions.ClusterCrossSlotError,
                redis.exceptions.MasterDownError)
_NOT_STARTED_REPLIES = ("BADKEY ", "BUSY ", "NOREPLICAS ")


def refused(exc: BaseException) -> bool:
    """Whether Redis answered a call with an error (a key of the wrong type, a
    script refused): it is up, but the call did not go through."""
    return isinstance(exc, redis.exceptions.ResponseError)


def stopped_in_script(exc: BaseException) -> bool:
    """Whether a failed call's script ran and stopped part way (a command on a
    key of the wrong type, a bug): what it wrote before the error stays in
    Redis, which does not roll a script back. A connection error is not one:
    the call ran whole or not at all."""
    return (isinstance(exc, redis.exceptions.ResponseError)
            and not isinstance(exc, _NOT_STARTED)
            and not str(exc).startswith(_NOT_STARTED_REPLIES))


def member_key(member: str) -> str:
    """The politeness key of an entry's member (``"<prio>:<seq>@<key>"``)."""
    return member.partition("@")[2]


def now_ms() -> int:
    return int(time.time() * 1000)




def _b(value) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
