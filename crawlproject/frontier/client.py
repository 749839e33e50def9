"""FrontierClient: a node's side of the shared frontier, without Scrapy.

It keeps what the node has to tell the frontier (new requests, acknowledgements,
failures, returned requests, what sites said) per partition, and the entries
the node leased: a prefetch buffer and the ones being worked on. A background
asyncio task sends it all, one ``SYNC`` call per partition that has something
to say or ready work: calls coalesced and bounded, heartbeats, priority
rushes, polite takes, the slot hand-off, a new identity after a lost reply,
each partition isolated from the others' failures. The Scrapy adapter
(:class:`crawlproject.scheduler.RedisScheduler`) turns payloads into requests
(``accept``), tells which requests are done (``before_tick``), and counts stats
(``count``). Each of these in full: ``docs/frontier.md``, "A node's sync loop
(crawlproject/frontier/client.py)".

Size (over 600 lines): one class, the node's sync loop; every step of a
tick reads and writes the same per-partition state (outbox, acknowledgements,
leases, reserves, the view of each partition's queue), so it stays one
object, its steps small methods.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from crawlproject.backoff import backoff_delay
from crawlproject import acl, defaults
from crawlproject.connection import REDIS_FAILURES
from crawlproject.frontier.sitelimits import PolitenessConfig
from crawlproject.frontier.queue import (AsyncFrontier, Batch, SyncResult, clamp_priority,
                                         member_key, refused, stopped_in_script)
from crawlproject.frontier.budgets import BudgetWatch

logger = logging.getLogger(__name__)

INF = float("inf")
#: Most new requests in one call: one script call blocks Redis for every node.
MAX_CALL_ADDS = 1000
#: Longest a free download slot is kept for a request that outranks the
#: buffer while the call that stores and takes it is under way (on a busy
#: event loop a round trip takes tens of milliseconds).
OUTRANKING_HOLD = 0.25
#: A request that outranks the buffer cuts the coalescing pause short at most
#: once per this many pauses (``min_sync_interval``).
OUTRANKING_RUSH_EVERY = 5
#: With several partitions, how long a round of calls waits for a slow one
#: before it goes on without it (a healthy call takes milliseconds).
ROUND_GRACE = 0.5
#: Seconds between two log lines about the same junk the frontier read back
#: (a forged state, a budget key of the wrong type, refused reports): the
#: stats count every one, the log says it once a minute, like an outage.
JUNK_LOG_INTERVAL = 60.0


class Rejected(Exception):
    """Raised by ``accept``: the payload is not a request this node may run."""



@dataclass
class Entry:
    """A leased entry: its member, partition, and what ``accept`` made of it."""

    member: str
    partition: int
    item: Any
    priority: int = 0
    #: its politeness key (from the member)
    key: str = ""
    #: its download ended (its slot is free or handed off)
    ended: bool = False
    #: its key has an interval: counted as started when leased, it must not wait
    polite: bool = False
    #: when the lease reached this node (``time.monotonic()``)
    leased_at: float = 0.0
    #: how long after ``leased_at`` a polite entry may still start (the safety
    #: margin the frontier added to its key's interval, ``PolitenessConfig.pad``):
    #: later, the site could see it closer than the interval to the key's next
    #: request, leased by any node on time
    lag_allowed: float = float("inf")


def member_priority(member: str) -> int:
    """The priority an entry's member carries (``"<prio>:<seq>[@key]"``; 0 if none)."""
    head = member.partition(":")[0]
    try:
        return int(head)
    except ValueError:  # written by something else than this project's script
        return 0


@dataclass
class _Remote:
    """What the last calls said about one partition."""

    queued: int = 0
    delayed: int = -1
    inflight: int = 0
    #: earliest ready time (Redis ms), -1 when nothing is queued, None unknown
    next_ready_ms: int | None = None
    #: Redis time of the last call that reported it, and our clock then
    server_ms: int = -1
    at: float | None = None   # None: no call reported it yet
    #: -inf: never looked at (the first idle look goes at once, however
    #: recently the machine booted: time.monotonic() counts from boot)
    last_poll: float = float("-inf")
    #: looks in a row that found nothing to take (the idle pace slows down)
    misses: int = 0

    def ready_now(self, now: float) -> bool:
        if self.next_ready_ms is None or self.next_ready_ms == -2:
            return True
        if self.next_ready_ms < 0 or self.server_ms < 0 or self.at is None:
            return False
        return self.next_ready_ms <= self.server_ms + (now - self.at) * 1000


class FrontierClient:
    """See the module docstring and docs/frontier.md. All methods run on the event loop's thread."""

    def __init__(self, partitions: list[AsyncFrontier], politeness: PolitenessConfig, *,
                 accept: Callable[[int, str, bytes], Any], before_tick: Callable[[], None],
                 count: Callable[[str, int], None], outage, log_extra: dict,
                 prefetch: int, batch_size: int, flush_interval: float,
                 min_sync_interval: float, idle_poll: float, heartbeat: float,
                 lease_ttl: float, nudge: Callable[[], None] = lambda: None,
                 free_slots: Callable[[], int] | None = None,
                 idle_poll_max: float = defaults.SCHEDULER_IDLE_POLL_MAX):
        self.partitions = partitions
        self.politeness = politeness
        self.accept, self.before_tick, self.count = accept, before_tick, count
        self.outage, self.log_extra, self.nudge = outage, log_extra, nudge
        self._acl_refused: str | None = None  # what an ACL refuses (probed once)
        self.prefetch, self.batch_size = prefetch, batch_size
        self.flush_interval, self.min_sync_interval = flush_interval, min_sync_interval
        self.idle_poll, self.heartbeat, self.lease_ttl = idle_poll, heartbeat, lease_ttl
        self.idle_poll_max = idle_poll_max
        #: how many more requests the node could start right now (None: no limit)
        self.free_slots = free_slots
        self.node_base = partitions[0].node
        self._incarnation = 0
        self.buffer: deque[Entry] = deque()
        self.held: dict[str, Entry] = {}
        #: member -> the node id it is leased under (changes after a failed call)
        self.owners: dict[str, str] = {}
        self.outbox = [Batch() for _ in partitions]
        self.remote = [_Remote() for _ in partitions]
        # Partitions whose takes were held back by a key's concurrency: there a
        # download's end is reported at once (its slot is what the next take
        # waits for), elsewhere it waits for the ack, which frees it too.
        self.capped = [False for _ in partitions]
        # New requests per partition, since the last call, that outrank the
        # buffer's last entry: the next call takes as many back (see add()).
        self._outranking = [0 for _ in partitions]
        # Those not back yet (unsent or in a call without a reply), the highest
        # priority among them, and until when the last free slot is kept for them.
        self._in_transit = 0
        self._transit_priority = 0
        # -inf: no hold, no rush, no call, no renewal, no backoff yet; never 0.0
        # (time.monotonic() counts from boot: on a machine up for less than
        # the interval, 0.0 would look recent and hold back the first one).
        self._hold_until = float("-inf")
        self._last_rush = float("-inf")
        self._lapse: asyncio.TimerHandle | None = None
        # Acknowledgement order across partitions: every add gets a sequence
        # number; an ack waits until the adds it depends on are stored (or go
        # in the same atomic call), so a request is never acknowledged before
        # the requests it produced are safe. An add made with the member that
        # produced it (its parent) is a dependency of that member's ack only;
        # one made without is one of every ack after it.
        self._seq = 0
        self._unsent: list[deque[int]] = [deque() for _ in partitions]
        self._unsent_orphans: list[deque[int]] = [deque() for _ in partitions]
        #: parent member -> {partition: sequence number of its last add there}
        self._children: dict[str, dict[int, int]] = {}
        self._acks: list[tuple[str, int, bool, int, dict[int, int] | None]] = []
        self._fetched: deque[tuple[int, str, float]] = deque()
        self._last_sync = float("-inf")
        # Per partition: when its lease was last renewed, and how its calls fail.
        self._maintained = [float("-inf") for _ in partitions]
        self._errors = [0 for _ in partitions]
        self._retry_at = [float("-inf") for _ in partitions]
        # A partition whose last call stopped inside the script is sent its next
        # calls in check mode (every key checked before any write) until one
        # goes through.
        self._check = [False for _ in partitions]
        #: partition -> (its call in flight, the batch, outranking count sent)
        self._calls: dict[int, tuple[asyncio.Future, Batch, int]] = {}
        #: the batches of the one-partition call awaited in _send (not in _calls)
        self._sending: list[Batch] = []
        self._last_sweep = time.monotonic()
        self._closing = False
        self._flush_waiters: list[asyncio.Future] = []
        self._wake = asyncio.Event()
        # Set by a request that outranks the buffer (and at close): it ends a
        # coalescing pause.
        self._outranked = asyncio.Event()
        self._task: asyncio.Future | None = None
        self.on_first_sync: Callable[[], Any] | None = None
        #: called with each leased entry sent back unstarted (a reserve given
        #: back, a polite entry too late to start): its lease is over here
        self.on_returned: Callable[[Entry], Any] | None = None
        #: operator pause (crawlproject.control): hand out and take nothing
        self.paused = False
        # The slot hand-off: entries leased in reserve per key (holding no slot),
        # the keys worth a reserve (found at their concurrency), and the share
        # of a key's concurrency this node may hand off (only while the
        # frontier last said its reserve may be used).
        self.reserve: dict[str, deque[Entry]] = {}
        self._reserve_keys: dict[str, int] = {}
        self._reserve_share: dict[str, int] = {}
        #: what was said about junk read back: kind -> (when last said, times since)
        self._said: dict[str, tuple[float, int]] = {}
        #: says once per key when its budget is spent (crawlproject.frontier.budgets)
        self.budgets = BudgetWatch(count, log_extra)

    # -- what the adapter tells us ----------------------------------------------
    @property
    def node(self) -> str:
        return self.partitions[0].node

    def partition_of(self, key: str) -> int:
        return self.politeness.partition(key) if len(self.partitions) > 1 else 0

    def add(self, payload: str, fingerprint, priority: int, delay_ms: int, key: str,
            parent: str | None = None, unfiltered: bool = False) -> None:
        """A new request for politeness key *key*; *parent*: the member held here
        whose callback (or redirect, retry) produced it, if known; *unfiltered*:
        see :meth:`Batch.add`."""
        p = self.partition_of(key)
        batch = self.outbox[p]
        batch.add(payload, fingerprint, priority, delay_ms, key, unfiltered)
        self._seq += 1
        self._unsent[p].append(self._seq)
        if parent is None:
            self._unsent_orphans[p].append(self._seq)
        else:
            self._children.setdefault(parent, {})[p] = self._seq
        if self.buffer and not delay_ms and clamp_priority(priority) > self.buffer[-1].priority:
            # Scrapy would hand it out before some of what we prefetched: take
            # it back with the call that stores it (coalesced as usual), rather
            # than once the buffer has drained to half.
            self._outranking[p] += 1
            priority = clamp_priority(priority)
            self._transit_priority = (priority if not self._in_transit
                                      else max(priority, self._transit_priority))
            self._in_transit += 1
            self._hold_until = time.monotonic() + OUTRANKING_HOLD
            self._wake.set()
            self._outranked.set()
        elif len(batch.adds) >= self.batch_size or not self.buffer:
            # A full batch, or nothing prefetched: the engine may be waiting for
            # exactly these requests (e.g. the next listing page).
            self._wake.set()

    def wake(self) -> None:
        """Run the loop now (e.g. the operator resumed the crawl)."""
        self._wake.set()

    def next(self) -> Entry | None:
        """The next prefetched entry, now held by the node, or None."""
        if self.paused:
            return None  # the buffer stays leased to this node until resumed
        if not self.buffer:
            self._wake.set()
            return None
        if self._holds_slot():
            # The engine is nudged when the call's reply is in, or when the
            # hold lapses (no reply: Redis down), whichever comes first.
            if self._lapse is None:
                self._lapse = asyncio.get_running_loop().call_later(
                    max(0.0, self._hold_until - time.monotonic()), self._hold_lapsed)
            return None
        entry = self.buffer.popleft()
        while entry.polite and time.monotonic() - entry.leased_at > entry.lag_allowed:
            self._give_back_late(entry)
            if not self.buffer:
                self._wake.set()
                return None
            entry = self.buffer.popleft()
        self.held[entry.member] = entry
        if len(self.buffer) <= self.prefetch // 2:
            self._wake.set()
        return entry

    def _give_back_late(self, entry: Entry) -> None:
        """*entry* of a key with an interval waited here past its start: back
        to its queue, not started (its key's interval counts from its lease,
        so the site sees nothing closer than the interval)."""
        self._give_back(entry)
        self.count("politeness/late_returned", 1)
        self._wake.set()

    def _give_back(self, entry: Entry) -> None:
        """*entry* goes back to its queue, not started."""
        self.outbox[entry.partition].nacks.append(entry.member)
        if self.on_returned is not None:
            self.on_returned(entry)

    def _hold_lapsed(self) -> None:
        self._lapse = None
        self.nudge()

    def _holds_slot(self) -> bool:
        """Whether the last free download slot waits for a request that
        outranks the buffer's first entry and is on its way back to us."""
        head = self.buffer[0]
        if (not self._in_transit or self.free_slots is None or head.polite
                or head.priority >= self._transit_priority):
            # (a polite entry's interval counts from its lease: it may not wait)
            return False
        if time.monotonic() >= self._hold_until:
            return False
        return self.free_slots() <= 1

    def ack(self, member: str, relieve: bool = True) -> None:
        """*member* is done (also: replaced by a redirect or retry). Sent once
        the requests it depends on are stored: those added with it as their
        parent, and every one added before now without a parent (see
        ``_attach_acks``)."""
        entry = self.held.pop(member, None)
        p = entry.partition if entry else self._partition_of_member(member)
        self._acks.append((member, p, relieve, self._seq, self._children.pop(member, None)))

    def fetched(self, member: str) -> None:
        """*member*'s download ended: its politeness key's slot is free again
        (the entry stays leased until it is acknowledged). Where a key's
        concurrency held takes back, reported at once, with a take; elsewhere
        with the call after next: most requests are acknowledged by then, and
        the ack frees the slot itself (one operation less per page)."""
        entry = self.held.get(member)
        if entry is not None and not entry.ended:
            entry.ended = True
            if self._hand_off(entry):
                return
            self._fetched.append((entry.partition, member, time.monotonic()))
            if self.capped[entry.partition]:
                self.remote[entry.partition].next_ready_ms = None  # a slot is free
                self._wake.set()

    def _hand_off(self, ended: Entry) -> bool:
        """Start a reserved entry of *ended*'s key on the slot it just freed."""
        stock = self.reserve.get(ended.key)
        share = self._reserve_share.get(ended.key)
        if not stock or share is None or self.paused:
            return False
        if 1 + self._running().get(ended.key, 0) > share:
            return False  # more than our share of the key: the slot goes back to all nodes
        entry = stock.popleft()
        if not stock:
            del self.reserve[ended.key]
        self.outbox[ended.partition].handoffs.append((ended.member, entry.member))
        self.buffer.appendleft(entry)
        self.count("scheduler/handoffs", 1)
        self.nudge()
        return True

    def hold_back(self, key: str) -> None:
        """*key*'s site answered a slow-down status: hand off none of its slots
        (its reserve goes back) until the frontier says the key may go on."""
        self._return_reserve(key)

    def _return_reserve(self, key: str) -> None:
        """Send *key*'s reserve back to its queue (its slots are for all nodes)."""
        self._reserve_share.pop(key, None)
        for entry in self.reserve.pop(key, ()):
            self._give_back(entry)

    def _reserve_asks(self, p: int) -> list[tuple[str, int]]:
        """What partition *p*'s next call asks for the reserve: per key worth
        one, as many more entries as the node runs downloads of it (up to its
        share), or 0 to hear whether the reserve held may still be used."""
        if not self._reserve_keys or self.paused:
            return []
        running = self._running()
        asks = []
        for key, kp in list(self._reserve_keys.items()):
            if kp != p:
                continue
            n = running.get(key, 0)
            if not n:
                # nothing of it runs here: no slot of ours to hand a reserve
                del self._reserve_keys[key]
                self._return_reserve(key)
                continue
            want = min(n, self._reserve_share.get(key, n)) - len(self.reserve.get(key, ()))
            asks.append((key, max(0, want)))
        return asks

    def _running(self) -> dict[str, int]:
        """Per key worth a reserve: this node's entries that hold a slot of it
        (downloading, or leased and waiting in the buffer)."""
        running: dict[str, int] = {}
        keys = self._reserve_keys
        for e in (*self.held.values(), *self.buffer):
            if not e.ended and e.key in keys:
                running[e.key] = running.get(e.key, 0) + 1
        return running

    def fail(self, member: str, kind: str, record: dict) -> None:
        """*member* is done for good: keep *record* in the dead/invalid list."""
        entry = self.held.pop(member, None)
        self._children.pop(member, None)
        self.outbox[entry.partition if entry else 0].fail(member, kind, record)

    def feedback(self, key: str, kind: str, seconds: float = 0.0) -> None:
        """What a site said about politeness key *key* (see :class:`Batch`)."""
        batch = self.outbox[self.partition_of(key)]
        if kind != "crawldelay" or seconds > 0:
            self._return_reserve(key)  # no hand-off past what the site said
        {"block": lambda: batch.block(key, seconds), "backoff": lambda: batch.backoff(key),
         "crawldelay": lambda: batch.crawl_delay(key, seconds)}[kind]()
        self._wake.set()

    def sent_late(self, entry: Entry, sent_at: float) -> None:
        """Polite *entry* went out at *sent_at* (``time.monotonic()``), later than
        its lease allowed (held up after the buffer: the engine, a downloader
        middleware): its key's next start, for every node, counts from then.
        Sent with the next call, made at once."""
        self.outbox[entry.partition].sent_late(entry.member, sent_at)
        self._wake.set()

    # -- what the adapter asks -----------------------------------------------
    def _attach_acks(self, batches: dict[int, Batch]) -> None:
        """Move the acks that may go now into the batches about to be sent.

        An ack for partition p may go when every add it depends on is either
        stored, or in p's batch (the script stores adds before it applies
        acks, atomically): the adds made with it as their parent, and every
        add made without a parent before it. Such adds still unsent or in
        another partition's call (which may fail while p's succeeds) make it
        wait for a later call; the adds of other parents do not.
        """
        if not self._acks:
            return
        sending = {p: len(b.adds) for p, b in batches.items()}
        first, after, first_orphan, after_orphan = [], [], [], []
        for p, pending in enumerate(self._unsent):
            n = sending.get(p, 0)
            first.append(pending[0] if pending else INF)
            # the first unsent add of each partition once this round is stored
            after.append(pending[n] if len(pending) > n else INF)
            orphans = self._unsent_orphans[p]
            first_orphan.append(orphans[0] if orphans else INF)
            after_orphan.append(next((s for s in orphans if s >= after[p]), INF)
                                if n else first_orphan[p])
        # An ack for p waits for the orphan adds of every other partition.
        lowest = sorted((s, q) for q, s in enumerate(first_orphan))[:2]
        keep = []
        for ack in self._acks:
            member, p, relieve, epoch, children = ack
            batch = batches.get(p)
            others = next((s for s, q in lowest if q != p), INF)
            ready = batch is not None and epoch < min(after_orphan[p], others)
            if ready and children:
                ready = all(seq < (after[q] if q == p else first[q])
                            for q, seq in children.items())
            if not ready:
                keep.append(ack)
                continue
            batch.acks.append(member)
            if not relieve:
                batch.unrelieved.add(member)
        self._acks = keep

    def _stored(self, p: int, count: int) -> None:
        """The first *count* unsent adds of partition *p* are stored."""
        pending, orphans, last = self._unsent[p], self._unsent_orphans[p], 0
        for _ in range(count):
            last = pending.popleft()
        while orphans and orphans[0] <= last:
            orphans.popleft()

    def _attach_fetched(self, batches: dict[int, Batch], now: float) -> None:
        """Report downloads that ended a while ago and are still not settled."""
        # One threshold for all: the deque is in time order (a capped partition
        # makes the others report promptly too; a few operations more at most).
        older = now if any(self.capped) else now - 2 * self.min_sync_interval
        later = []  # no call to their partition this round (one in flight, backing off)
        while self._fetched and self._fetched[0][2] <= older:
            p, member, at = self._fetched.popleft()
            if member in self.held and p in batches:
                batches[p].fetched.append(member)
            elif member in self.held:
                later.append((p, member, at))
        self._fetched.extendleft(reversed(later))

    def local_backlog(self) -> int:
        """Requests this node holds that Redis has not handed to the engine yet."""
        return len(self.buffer) + self.reserved_count() + self.pending_adds()

    def reserved_count(self) -> int:
        """Entries leased in reserve (see the slot hand-off)."""
        return sum(len(stock) for stock in self.reserve.values())

    def pending_adds(self) -> int:
        """New requests not stored yet (waiting, or in a call not answered yet)."""
        return (sum(len(b.adds) for b in self.outbox)
                + sum(len(b.adds) for _, b, _ in self._calls.values())
                + sum(len(b.adds) for b in self._sending))

    def remote_queued(self) -> int:
        return sum(r.queued for r in self.remote)

    def has_pending(self) -> bool:
        """Work exists here or anywhere in the cluster that may reach this node."""
        if self.buffer or self.reserve or self.pending_adds():
            return True
        if (any(b.take for _, b, _ in self._calls.values())
                or any(b.take for b in self._sending)):
            return True  # its reply may bring entries
        held = {}
        for entry in self.held.values():
            held[entry.partition] = held.get(entry.partition, 0) + 1
        for p, r in enumerate(self.remote):
            if r.queued + max(0, r.delayed) + max(0, r.inflight - held.get(p, 0)) > 0:
                return True
        return False

    def sizes(self) -> dict[str, int]:
        return {"queued": self.remote_queued(),
                "delayed": sum(max(0, r.delayed) for r in self.remote),
                "inflight": sum(r.inflight for r in self.remote),
                "prefetched": len(self.buffer), "reserved": self.reserved_count()}

    def flushed(self) -> asyncio.Future:
        """A future that resolves once everything added so far is in Redis."""
        future = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(future)
        self._wake.set()
        return future

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def close(self) -> list[Entry]:
        """Stop the loop and leave every partition, returning unstarted entries.

        Returns the entries still held (the adapter's last word on them was
        collected by ``before_tick``)."""
        self._closing = True
        self._wake.set()
        self._outranked.set()  # ends a coalescing pause too
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("Frontier loop failed", extra=self.log_extra)
        try:
            await self._drain()  # entries a reply leased are returned below
        except Exception:
            logger.exception("Frontier loop failed", extra=self.log_extra)
        self.before_tick()
        leftovers = (list(self.buffer) + list(self.held.values())
                     + [e for stock in self.reserve.values() for e in stock])
        batches = dict(enumerate(self.outbox))
        self.outbox = [Batch() for _ in self.partitions]
        # The last word keeps the order of the loop: an ack goes only once the
        # requests added before it are stored (see _attach_acks). With several
        # partitions that may take a second call, once the first ones stored the
        # adds; an ack whose adds could not be stored is not sent at all.
        self._attach_acks(batches)
        for p, batch in batches.items():
            batch.adopt = self._adoptions(p)
        for entry in leftovers:
            batches[entry.partition].nacks.append(entry.member)
        self.buffer.clear()
        self.held.clear()
        self.reserve.clear()
        self._reserve_keys.clear()
        self._reserve_share.clear()
        self.owners.clear()
        waiting = {a[1] for a in self._acks}
        stored = await asyncio.gather(*(self._final_sync(p, batch, leave=p not in waiting)
                                        for p, batch in batches.items()))
        for p, ok in zip(batches, stored):
            if ok:
                self._stored(p, len(batches[p].adds))
        if self._acks:
            await self._final_acks(waiting)
        for waiter in self._flush_waiters:
            if not waiter.done():
                waiter.cancel()
        return leftovers

    async def _final_acks(self, waiting: set[int]) -> None:
        """At close, the acks that waited for other partitions' adds: sent where
        those were stored. The others are not sent (the count is logged and in
        ``scheduler/acks_withheld``): their requests come back when this node's
        lease there expires and are crawled again, so the requests they produced
        are made again instead of being lost."""
        second = {p: Batch() for p in sorted(waiting)}
        self._attach_acks(second)
        withheld = {a[1] for a in self._acks}
        if self._acks:
            self.count("scheduler/acks_withheld", len(self._acks))
            logger.error("%d finished requests not acknowledged at close: requests they "
                         "produced could not be stored; they come back to the queue when this "
                         "node's lease expires and are crawled again", len(self._acks),
                         extra=self.log_extra)
        self._acks = []
        await asyncio.gather(*(self._final_sync(p, batch, leave=p not in withheld)
                               for p, batch in second.items()))

    async def _final_sync(self, p: int, batch: Batch, leave: bool = True) -> bool:
        """Partition *p*'s last call (leaving it unless *leave* is False: then its
        lease runs out); whether it went through."""
        for attempt in range(3):
            batch.check = self._check[p]
            try:
                result = await self.partitions[p].sync(batch, leaving=leave)
                self._apply(p, result, asked=0)
                if leave:
                    logger.info("Left the frontier%s: returned %d unstarted requests",
                                f" partition {p}" if len(self.partitions) > 1 else "",
                                len(batch.nacks), extra=self.log_extra)
                return True
            except Exception as exc:
                self._failed_call(p, batch, exc)
                logger.error("%s at close (%s); attempt %d/3",
                             "Redis refuses the call" if refused(exc) else "Cannot reach Redis",
                             exc, attempt + 1, extra=self.log_extra)
                await asyncio.sleep(1.0)
        logger.error("Gave up: %d new requests not sent; %d leased requests come back when "
                     "this node's lease expires", len(batch.adds), len(batch.nacks),
                     extra=self.log_extra)
        return False

    # -- the loop ---------------------------------------------------------------
    async def _run(self) -> None:
        errors = 0
        while not self._closing:
            try:
                pause = await self._tick()
                errors = 0
            except REDIS_FAILURES as exc:
                # Redis unreachable: keep everything, retry
                errors += 1
                self._redis_failed("frontier call", exc, await self._acl_probe(exc))
                await self._drop_idle_connections()
                await asyncio.sleep(backoff_delay(errors, 0.4, 5.0))
                continue
            except Exception:  # a bug: say so, keep the loop (and the leases) alive
                errors += 1
                self.count("scheduler/loop_errors", 1)
                logger.exception("Frontier loop error; retrying", extra=self.log_extra)
                await asyncio.sleep(backoff_delay(errors, 0.4, 5.0))
                continue
            if pause:
                await self._pause(pause)
            else:
                await self._wait()

    async def _drop_idle_connections(self) -> None:
        """After a failed call, close the pool's idle connections: one left
        idle across a Redis restart would fail its next command after the
        outage ("Connection closed by server") and look like a new outage."""
        pools = {id(p.client.connection_pool): p.client.connection_pool
                 for p in self.partitions if hasattr(p.client, "connection_pool")}
        for pool in pools.values():
            try:
                await pool.disconnect(inuse_connections=False)
            except Exception:  # closing a dead socket may fail too: nothing to keep
                pass

    async def _pause(self, seconds: float) -> None:
        """A coalescing pause, cut short by a request that outranks the buffer:
        a free slot is kept for it (see ``_holds_slot``)."""
        try:
            async with asyncio.timeout(seconds):
                await self._outranked.wait()
        except TimeoutError:
            pass

    async def _wait(self) -> None:
        busy = (self.held or any(self.outbox) or len(self.buffer) <= self.prefetch // 2)
        timeout = self.flush_interval if busy else self.idle_poll
        now = time.monotonic()
        backing_off = [t for t in self._retry_at if t > now]
        if backing_off:  # a partition's backoff ends: its work goes then
            timeout = min(timeout, min(backing_off) - now)
        # asyncio.timeout, not wait_for: wait_for runs the wait in a task of its
        # own, one more turn of a busy event loop before a wake is acted on.
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    async def _tick(self) -> float:
        """Send what is pending if it is time to; return how long to pause."""
        self.before_tick()
        now = time.monotonic()
        if self._calls:
            await self._collect(now)
        ready = self._open(now)
        want = self.prefetch - len(self.buffer) if len(self.buffer) <= self.prefetch // 2 else 0
        takes = self._plan_takes(want, now, ready)
        outranking = self._outranking
        # Bounded: a crawl whose every new request outranks the last (Scrapy's
        # DEPTH_PRIORITY > 0) must not lease the frontier to this node's buffer.
        room = 2 * self.prefetch - len(self.buffer)
        for p in ready:
            if outranking[p] and room > 0 and not self.paused:
                takes[p] = max(takes.get(p, 0), min(outranking[p], room))
        # Maintenance every heartbeat; an idle node (nothing held) also wants its
        # sizes and the reclaims fresh, at its idle pace (``_idle_gap``; not at
        # every turn of the loop: that was a call per flush interval per partition).
        idle_node = not (self.held or self.buffer)
        due = {p for p in ready if now - self._maintained[p]
               >= (self._idle_gap(p) if idle_node else self.heartbeat)}
        # A site's word (a block, a backoff) goes at once: every call another
        # node makes before it lands may start that site's requests. So does a
        # request that outranks the buffer (a free slot waits for it), at most
        # once per OUTRANKING_RUSH_EVERY coalescing pauses: a depth-first crawl,
        # where every new request outranks the buffer, still coalesces.
        self._outranked.clear()
        rush = (now - self._last_rush >= OUTRANKING_RUSH_EVERY * self.min_sync_interval
                and room > 0 and not self.paused and any(outranking[p] for p in ready))
        urgent = ((not self.buffer and takes) or self._flush_waiters or due or rush
                  or any(self.outbox[p].feedback for p in ready))
        if not (any(self.outbox[p] for p in ready) or self._acks or takes or urgent):
            self._resolve_if_flushed()
            return 0.0
        gap = self.min_sync_interval - (now - self._last_sync)
        if gap > 0 and not urgent and self.pending_adds() < self.batch_size:
            return gap  # coalesce: more work per round trip
        if rush:
            self._last_rush = now
        waiters, self._flush_waiters = self._flush_waiters, []
        sent_outranking = {p: outranking[p] for p in ready}
        for p in ready:
            outranking[p] = 0
        calls: dict[int, Batch] = {}
        polite = None
        if self.free_slots is not None and takes:
            # Entries of keys with an interval are taken only if they can start
            # now: counted from the lease, a wait in our buffer would shorten
            # the interval another node sees.
            polite = max(0, self.free_slots() - len(self.buffer))
            polite = -(-polite // len(takes))
        for p in ready:
            asks = self._reserve_asks(p)  # may send a reserve back: before the batch
            batch = self._next_batch(p)
            batch.reserve = asks
            batch.take = takes.get(p, 0)
            if batch.take and polite is not None:
                batch.take_polite = min(batch.take, polite)
            batch.maintenance = p in due
            if not (batch or batch.maintenance or any(a[1] == p for a in self._acks)):
                continue
            batch.adopt = self._adoptions(p)
            batch.sweep = batch.maintenance and self._sweep_due(now)
            batch.registered = now - self._maintained[p] < self.lease_ttl / 2
            batch.check = self._check[p]
            remote = self.remote[p]
            batch.promote = (batch.maintenance or remote.delayed != 0
                             or any(a[4] for a in batch.adds))
            calls[p] = batch
        self._attach_acks(calls)
        self._attach_fetched(calls, now)
        if len(self.partitions) > 1:
            # Acks held back by an ordering rule go once the calls they wait
            # for are stored: a call with nothing in it is not worth sending.
            calls = {p: b for p, b in calls.items() if b or b.maintenance}
            self._flush_waiters[:0] = waiters
            if calls and (any(self.outbox[p] for p in ready) or self._acks):
                self._wake.set()  # more to send (a chunk, acks this round unblocks)
            await self._round(calls, sent_outranking, now)
            return 0.0
        if any(self.outbox) or self._acks:
            waiters, self._flush_waiters = [], waiters  # resolved by a later call
            self._wake.set()
        results = await self._send(calls)
        failure = None
        for (p, batch), result in zip(calls.items(), results):
            failure = self._finish(p, batch, result, sent_outranking[p], now) or failure
        if failure is not None:
            self._flush_waiters[:0] = waiters
            raise failure
        self.outage.ok(self.log_extra, source="frontier")
        self._last_sync = now
        if any(b.sweep for b in calls.values()):
            self._last_sweep = now
        _resolve(waiters)
        await self._first_sync_done()
        return 0.0

    async def _first_sync_done(self) -> None:
        if self.on_first_sync is not None:
            # Dropped only once it went through: a hook that failed (Redis gone
            # again) runs after the next call, it is not skipped for good.
            await self.on_first_sync()
            self.on_first_sync = None

    def _finish(self, p: int, batch: Batch, result, outranking: int,
                now: float) -> BaseException | None:
        """Apply partition *p*'s reply (or keep the batch of a failed call)."""
        if isinstance(result, BaseException):
            self._failed_call(p, batch, result)
            self._requeue(p, batch)
            self._outranking[p] += outranking
            self._change_identity(p)
            return result
        self._stored(p, len(batch.adds))
        self._check[p] = False
        if outranking:
            self._in_transit = max(0, self._in_transit - outranking)
            if not self._in_transit:
                self.nudge()  # a slot kept for them is free for what came back
        self._settled(p, batch, now)
        self._apply(p, result, asked=batch.take, batch=batch)
        if batch.maintenance:
            self._maintained[p] = now
        self._errors[p], self._retry_at[p] = 0, float("-inf")
        return None

    async def _send(self, calls: dict[int, Batch]) -> list:
        """The calls' results (or exceptions), in *calls*' order (one partition)."""
        # Awaited here rather than in a task: one turn of the event loop less
        # between the reply and the engine getting its requests (on a busy
        # loop a turn can be tens of milliseconds).
        results = []
        # While a call is awaited its batch is in neither the outbox nor
        # _calls: has_pending() and the seeds' back-pressure must still see its
        # adds (a spider whose start() is done closed when it saw none).
        for p, batch in calls.items():
            self._sending.append(batch)
            try:
                results.append(await self.partitions[p].sync(batch))
            except Exception as exc:  # noqa: BLE001 - handled by the caller
                results.append(exc)
            finally:
                self._sending.remove(batch)
        return results

    # -- several partitions: a call in flight per partition ---------------------
    def _open(self, now: float) -> list[int]:
        """Partitions that may be called now: none in flight, not backing off."""
        return [p for p in range(len(self.partitions))
                if p not in self._calls and self._retry_at[p] <= now]

    async def _round(self, calls: dict[int, Batch], outranking: dict[int, int],
                     now: float) -> None:
        """Send *calls* and wait for their replies, up to ``ROUND_GRACE``: a
        call that takes longer (its master stalls) stays in flight, and its
        partition is called again once it has ended; the others go on."""
        for p, batch in calls.items():
            self._calls[p] = (asyncio.ensure_future(self.partitions[p].sync(batch)), batch,
                              outranking.get(p, 0))
        if calls:
            self._last_sync = now
            if any(b.sweep for b in calls.values()):
                self._last_sweep = now
            _, late = await asyncio.wait([self._calls[p][0] for p in calls],
                                         timeout=ROUND_GRACE)
            # Only a late reply wakes the loop: replies within the round are
            # applied now, and the loop then waits at its usual pace.
            wake = lambda _: self._wake.set()  # noqa: E731
            for call in late:
                call.add_done_callback(wake)
        await self._collect(time.monotonic())

    async def _collect(self, now: float, final: bool = False) -> None:
        """Apply the replies of the calls that ended; a failed partition backs
        off alone (its work is kept for its next call)."""
        done = [p for p, (call, _, _) in self._calls.items() if call.done()]
        failed = False
        for p in done:
            call, batch, outranking = self._calls.pop(p)
            result = (asyncio.CancelledError() if call.cancelled()
                      else call.exception() or call.result())
            error = self._finish(p, batch, result, outranking, now)
            if error is None:
                continue
            failed = True
            self._errors[p] += 1
            self._retry_at[p] = now + backoff_delay(self._errors[p], 0.4, 5.0)
            if isinstance(error, REDIS_FAILURES):
                self._redis_failed(f"frontier call (partition {p})", error,
                                   await self._acl_probe(error))
            else:  # a bug: say so; the partition is retried like an outage
                self.count("scheduler/loop_errors", 1)
                logger.error("Frontier call to partition %d failed; retrying", p,
                             exc_info=error, extra=self.log_extra)
        if failed:
            await self._drop_idle_connections()
        elif done and not any(self._errors):
            self.outage.ok(self.log_extra, source="frontier")
        self._resolve_if_flushed()
        if done and not final and not any(self._errors[p] for p in done):
            await self._first_sync_done()

    def _resolve_if_flushed(self) -> None:
        if self._flush_waiters and not (any(self.outbox) or self._acks or self._calls):
            waiters, self._flush_waiters = self._flush_waiters, []
            _resolve(waiters)

    async def _drain(self) -> None:
        """Wait for the calls in flight (at close) and apply their replies."""
        if self._calls:
            await asyncio.wait([call for call, _, _ in self._calls.values()])
            await self._collect(time.monotonic(), final=True)

    def _plan_takes(self, want: int, now: float, candidates: list[int]) -> dict[int, int]:
        """How many entries to ask each partition (of *candidates*) for."""
        if want <= 0 or self.paused:
            return {}
        # A partition this call brings new requests to may have work ready: the
        # script stores them before it takes (a request yielded by a callback
        # must not wait a call more, or an idle look, to come back).
        chosen = [p for p in candidates
                  if self.remote[p].ready_now(now) or self.outbox[p].adds]
        if not chosen:
            # Nothing ready that we know of: look at idle pace, in turn (new work
            # from other nodes, or a key whose time came).
            idle = [p for p in candidates if now - self.remote[p].last_poll >= self._idle_gap(p)]
            if not idle:
                return {}
            chosen = [min(idle, key=lambda p: self.remote[p].last_poll)]
        share = -(-want // len(chosen))
        return {p: share for p in chosen}

    def _idle_gap(self, p: int) -> float:
        """Seconds between idle looks at partition *p*: ``idle_poll``, doubled
        after each look in a row that found nothing, up to ``idle_poll_max``
        (a node with nothing to do costs Redis a call a second, not five; a
        time the frontier named is not waited for: see ``_Remote.ready_now``)."""
        return min(self.idle_poll * (1 << min(self.remote[p].misses, 16)),
                   max(self.idle_poll, self.idle_poll_max))

    def _next_batch(self, p: int) -> Batch:
        """Partition *p*'s outbox, or its first ``MAX_CALL_ADDS`` new requests
        (acknowledgements wait for the last chunk)."""
        outbox = self.outbox[p]
        if len(outbox.adds) <= MAX_CALL_ADDS:
            self.outbox[p] = Batch()
            return outbox
        # Hand-offs go at once: the ack of a request whose slot was handed off
        # must not reach the frontier before the hand-off.
        batch = Batch(adds=outbox.adds[:MAX_CALL_ADDS], feedback=outbox.feedback,
                      handoffs=outbox.handoffs)
        outbox.adds = outbox.adds[MAX_CALL_ADDS:]
        outbox.feedback, outbox.handoffs = [], []
        return batch

    def _redis_failed(self, what: str, exc: BaseException, denied: str | None = None) -> None:
        """A call failed on Redis' side: unreachable, or refused (an error reply:
        Redis is up, a key holds junk, the user lacks a permission: *denied*
        names what); either way the work is kept and retried."""
        self.count("scheduler/redis_errors", 1)
        if refused(exc):
            self.count("scheduler/refused_calls", 1)
        named = {"denied": denied} if denied else {}  # only an ACL refusal has one
        self.outage.failed(what, exc, self.log_extra, source="frontier", refused=refused(exc),
                           **named)

    async def _acl_probe(self, exc: BaseException) -> str | None:
        """What an ACL refused, when Redis 6.2 did not say (a command inside
        a script): asked once, outside a script (:mod:`crawlproject.acl`)."""
        if acl.refusal(exc) != acl.SCRIPT_COMMAND_REFUSED:
            return None
        if self._acl_refused is None:
            self._acl_refused = await acl.probe_script_refusal(self.partitions[0].client) or ""
        return self._acl_refused or None

    def _failed_call(self, p: int, batch: Batch, exc: BaseException) -> None:
        """A call to partition *p* failed: if its script stopped part way (a key
        of the wrong type), its adds go again even past the filter, which may
        have them now, and the next calls check every key before writing."""
        if not stopped_in_script(exc):
            return
        batch.force_adds()
        self._check[p] = True
        self.count("scheduler/calls_stopped_in_script", 1)

    def _requeue(self, p: int, batch: Batch) -> None:
        """Keep the unsent work of a failed call (taken entries, if any, are
        unknown to us: they come back when the old id expires)."""
        batch.take = 0
        batch.adopt = []  # recomputed for the next call
        batch.merge(self.outbox[p])
        self.outbox[p] = batch

    def _change_identity(self, p: int) -> None:
        # The next call to partition p adopts what this node knows it holds
        # there (buffer, engine); whatever else the old id got from a lost
        # reply is reclaimed when the old id expires. Each partition has its
        # own lease (its own nodes zset): the others keep theirs.
        self._incarnation += 1
        self.partitions[p].node = f"{self.node_base}~{self._incarnation}"
        self._maintained[p] = float("-inf")  # register the new id at once

    def _settled(self, p: int, batch: Batch, now: float) -> None:
        for member, _ in batch.adopt:
            if member in self.owners:
                self.owners[member] = self.partitions[p].node
        # Forgotten only once the call that settles them went through: until
        # then a changed id must still adopt them for the settling call to count.
        for member in (*batch.acks, *(f[0] for f in batch.fails), *batch.nacks):
            self.owners.pop(member, None)
        self.remote[p].last_poll = now

    def _adoptions(self, p: int) -> list[tuple[str, str]]:
        """Leases of partition *p* this node holds under a former id of its own."""
        current = self.partitions[p].node
        return [(m, owner) for m, owner in self.owners.items()
                if owner != current and self._partition_of_member(m) == p]

    def _partition_of_member(self, member: str) -> int:
        return self.partition_of(member_key(member))

    def _sweep_due(self, now: float) -> bool:
        # Entries held by an id that is not a registered node (an old frontier,
        # a hand-edited key) would never come back and would keep every node
        # from idle-closing. While this node holds nothing and others seem to,
        # check for such entries once per lease TTL.
        return (not self.held and any(r.inflight > 0 for r in self.remote)
                and now - self._last_sweep >= self.lease_ttl)

    def _apply(self, p: int, result: SyncResult, asked: int, batch: Batch | None = None) -> None:
        remote = self.remote[p]
        remote.queued = result.queued
        if result.delayed >= 0:
            remote.delayed, remote.inflight = result.delayed, result.inflight
        elif batch is not None and any(add[4] for add in batch.adds):
            # Delayed adds (a retry's backoff, a page waiting for robots.txt):
            # work this node knows of until a maintenance reply counts it.
            remote.delayed = max(0, remote.delayed) + sum(1 for add in batch.adds if add[4])
        if asked or result.delayed >= 0:
            remote.next_ready_ms = result.next_ready_ms
        elif result.added or (batch is not None and (batch.acks or batch.nacks)):
            # New work, or keys with a free slot again: ready times unknown.
            remote.next_ready_ms = None
        if result.now_ms >= 0:
            remote.server_ms, remote.at = result.now_ms, time.monotonic()
        if result.capped:
            self.capped[p] = True
        elif asked and (result.next_ready_ms == -2 or result.queued == 0):
            self.capped[p] = False  # got all it asked for, or nothing waits
        self.count("scheduler/added", result.added)
        if result.budget_refused:
            self.count("scheduler/budget_refused", result.budget_refused)
            self.budgets.refused(self.partitions[p], batch)
        self.count("dupefilter/filtered", result.duplicates)
        self.count("scheduler/stale", result.stale)
        self.count("scheduler/trimmed", result.trimmed)
        if result.stale:
            logger.warning("%d acknowledgement(s) for requests this node no longer held (its "
                           "lease had expired and another node took them): ignored",
                           result.stale, extra=self.log_extra)
        if result.missing:
            self.count("scheduler/invalid", result.missing)
            logger.error("%d queue entries had no payload: moved to %s", result.missing,
                         self.partitions[p].keys.invalid, extra=self.log_extra)
        if result.reclaimed:
            self.count("scheduler/reclaimed", result.reclaimed)
            logger.warning("Reclaimed %d requests leased by nodes that stopped answering",
                           result.reclaimed, extra=self.log_extra)
        # When the lease reached this node: the lease itself is at most one
        # round trip earlier (counted from the call's sending, a slow Redis or
        # a cluster's round trips would make every polite entry late).
        leased_at = time.monotonic()
        for member, payload in result.taken:
            self._take(p, member, payload, result.polite_keys, leased_at)
        if result.taken or result.added or (batch is not None and batch.adds):
            remote.misses = 0
        elif asked or (batch is not None and batch.maintenance
                       and not (self.held or self.buffer)):
            if result.queued == 0 or result.next_ready_ms >= 0:
                remote.misses += 1   # nothing queued, or a ready time named: look less often
            else:
                # Entries wait for slots other nodes hold: this node is wanting
                # (it gets its share only while it keeps asking, SHARE_WINDOW).
                remote.misses = 0
        if result.taken:
            self.nudge()
        self._apply_reserve(p, result)
        self._apply_junk(p, result)

    def _apply_junk(self, p: int, result: SyncResult) -> None:
        """Say what the frontier found written by someone else (counted in
        stats each time, logged at most once a minute per kind)."""
        keys = self.partitions[p].keys
        if result.state_junk:
            self.count("scheduler/state_junk", result.state_junk)
            self._say("state_junk", logging.WARNING,
                      "%d field(s) of the frontier's state in %s held junk (written by "
                      "someone else: per-key states, overrides, counts, node deadlines, ready "
                      "times); read field by field, what was valid kept, the rest mended",
                      result.state_junk, keys.tag)
        if result.budget_skipped:
            self.count("scheduler/budget_skipped", 1)
            self._say("budget_skipped", logging.ERROR,
                      "%s is not a hash: budgets of its partition are not counted (new pages "
                      "admitted) until it is deleted (redis-cli DEL %s: counting starts again)",
                      keys.budget, keys.budget)
        if result.sent_refused:
            self.count("politeness/sent_refused", result.sent_refused)
            self._say("sent_refused", logging.WARNING,
                      "%d late-send report(s) refused by %s: the requests were no longer "
                      "leased to this node (its lease expired, or the report was not this "
                      "node's)", result.sent_refused, keys.tag)
        if result.bounds_ms is not None and "bounds" not in self._said:
            block, backoff = result.bounds_ms
            pol = self.politeness
            if block < pol.retry_after_max * 1000 or backoff < pol.backoff_max * 1000:
                self._said["bounds"] = (time.monotonic(), 0)
                logger.warning("This crawl records a longest block of %gs and a longest backoff "
                               "or crawl delay of %gs (its first node's FRONTIER_RETRY_AFTER_MAX "
                               "and FRONTIER_BACKOFF_MAX, field '||bounds' of %s); this node's "
                               "settings (%gs, %gs) are held to them (docs/frontier.md)",
                               block / 1000, backoff / 1000, keys.kstate, pol.retry_after_max,
                               pol.backoff_max, extra=self.log_extra)

    def _say(self, kind: str, level: int, message: str, *args) -> None:
        now = time.monotonic()
        last, since = self._said.get(kind, (None, 0))
        if last is not None and now - last < JUNK_LOG_INTERVAL:
            self._said[kind] = (last, since + 1)
            return
        if since:
            message += " (%d more time(s) in the last minute)"
            args = (*args, since)
        self._said[kind] = (now, 0)
        logger.log(level, message, *args, extra=self.log_extra)

    def _apply_reserve(self, p: int, result: SyncResult) -> None:
        for key in result.capped_keys:
            self._reserve_keys.setdefault(key, p)
        for key, (usable, share) in result.reserve_status.items():
            if usable:
                self._reserve_share[key] = share
            else:  # an interval, a block (maybe another node's 429), over its limit:
                # not asked about again until a take finds it at its concurrency
                self._return_reserve(key)
                self._reserve_keys.pop(key, None)
        for member, payload in result.reserved:
            entry = self._accepted(p, member, payload)
            if entry is not None:
                self.reserve.setdefault(entry.key, deque()).append(entry)
        if result.reserved:
            self.count("scheduler/reserved", len(result.reserved))

    def _accepted(self, p: int, member: str, payload: bytes) -> Entry | None:
        """A leased entry as the adapter makes it, now owned here (None: rejected,
        kept in the invalid list)."""
        try:
            item = self.accept(p, member, payload)
        except Rejected as exc:
            self.count("scheduler/invalid", 1)
            self.outbox[p].fail(member, "invalid", {
                "member": member, "payload": payload.decode("utf-8", "replace"),
                "reason": str(exc), "node": self.node, "at": time.time()})
            return None
        self.owners[member] = self.partitions[p].node
        return Entry(member, p, item, member_priority(member), member_key(member))

    def _take(self, p: int, member: str, payload: bytes, polite: dict | None = None,
              leased_at: float = 0.0) -> None:
        entry = self._accepted(p, member, payload)
        if entry is None:
            return
        interval = (polite or {}).get(entry.key)
        if interval is not None:
            entry.polite, entry.leased_at = True, leased_at
            pad = self.politeness.pad(interval)
            if pad > 0:  # (no margin: the operator chose limits held at lease only)
                entry.lag_allowed = pad
        buffer = self.buffer
        if not buffer or buffer[-1].priority >= entry.priority:
            buffer.append(entry)  # the common case: FIFO among equal priorities
            return
        at = len(buffer)
        while at and buffer[at - 1].priority < entry.priority:
            at -= 1
        buffer.insert(at, entry)


def _resolve(waiters: list[asyncio.Future]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
