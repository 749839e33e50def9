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

:class:`FrontierClient` is what the adapter calls; its parts, beside it:
:mod:`.partition` (the state kept per partition), :mod:`.loop` (the calls),
:mod:`.replies` (a reply applied), :mod:`.acks` (acknowledgement order),
:mod:`.handoff` (reserve and hand-off), :mod:`.identity` (identity change).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable

from crawlproject import defaults
from crawlproject.frontier.acks import AckOrder
from crawlproject.frontier.budgets import BudgetWatch
from crawlproject.frontier.handoff import SlotHandoff
from crawlproject.frontier.identity import Identity
from crawlproject.frontier.loop import SyncLoop
from crawlproject.frontier.partition import Entry, PartitionState
from crawlproject.frontier.queue import AsyncFrontier, Batch, clamp_priority, refused
from crawlproject.frontier.replies import Replies
from crawlproject.frontier.sitelimits import PolitenessConfig
# Where the adapter and the tests import them from (they moved to the parts):
from crawlproject.frontier.loop import MAX_CALL_ADDS  # noqa: F401
from crawlproject.frontier.partition import Rejected, member_priority  # noqa: F401

logger = logging.getLogger(__name__)

#: Longest a free download slot is kept for a request that outranks the
#: buffer while the call that stores and takes it is under way (on a busy
#: event loop a round trip takes tens of milliseconds).
OUTRANKING_HOLD = 0.25


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
        self.prefetch, self.batch_size = prefetch, batch_size
        self.flush_interval, self.min_sync_interval = flush_interval, min_sync_interval
        self.idle_poll, self.heartbeat, self.lease_ttl = idle_poll, heartbeat, lease_ttl
        self.idle_poll_max = idle_poll_max
        #: how many more requests the node could start right now (None: no limit)
        self.free_slots = free_slots
        self.buffer: deque[Entry] = deque()
        self.held: dict[str, Entry] = {}
        self.parts = [PartitionState() for _ in partitions]
        self.acks = AckOrder(self.parts)
        self.identity = Identity(partitions, self.parts, self.partition_of)
        self.handoff = SlotHandoff(self)
        self.replies = Replies(self)
        #: says once per key when its budget is spent (crawlproject.frontier.budgets)
        self.budgets = BudgetWatch(count, log_extra)
        self.loop = SyncLoop(self)
        # New requests that outrank the buffer not back yet (unsent or in a call
        # without a reply), the highest priority among them, and until when the
        # last free slot is kept for them (-inf: no hold yet; never 0.0, see
        # PartitionState.maintained).
        self.in_transit = 0
        self._transit_priority = 0
        self._hold_until = float("-inf")
        self._lapse: asyncio.TimerHandle | None = None
        #: (partition, member, when) of downloads that ended, not reported yet
        self.download_ends: deque[tuple[int, str, float]] = deque()
        self.closing = False
        self.flush_waiters: list[asyncio.Future] = []
        self.wakeup = asyncio.Event()
        # Set by a request that outranks the buffer (and at close): it ends a
        # coalescing pause.
        self.outranked = asyncio.Event()
        self._task: asyncio.Future | None = None
        self.on_first_sync: Callable[[], Any] | None = None
        #: called with each leased entry sent back unstarted (a reserve given
        #: back, a polite entry too late to start): its lease is over here
        self.on_returned: Callable[[Entry], Any] | None = None
        #: operator pause (crawlproject.control): hand out and take nothing
        self.paused = False
        #: the MongoDB tier's mover (crawlproject.frontier.movertask), None: off
        self.mover = None

    # -- what the adapter tells us ----------------------------------------------
    @property
    def node(self) -> str:
        return self.partitions[0].node

    @property
    def outbox(self) -> list[Batch]:
        """Per partition, what is not sent yet."""
        return [state.outbox for state in self.parts]

    @property
    def capped(self) -> list[bool]:
        """Per partition, whether its takes were held back by a key's concurrency."""
        return [state.capped for state in self.parts]

    def partition_of(self, key: str) -> int:
        return self.politeness.partition(key) if len(self.partitions) > 1 else 0

    def add(self, payload: str, fingerprint, priority: int, delay_ms: int, key: str,
            parent: str | None = None, unfiltered: bool = False) -> None:
        """A new request for politeness key *key*; *parent*: the member held here
        whose callback (or redirect, retry) produced it, if known; *unfiltered*:
        see :meth:`Batch.add`."""
        p = self.partition_of(key)
        batch = self.parts[p].outbox
        batch.add(payload, fingerprint, priority, delay_ms, key, unfiltered)
        self.acks.added(p, parent)
        if self.buffer and not delay_ms and clamp_priority(priority) > self.buffer[-1].priority:
            # Scrapy would hand it out before some of what we prefetched: take
            # it back with the call that stores it (coalesced as usual), rather
            # than once the buffer has drained to half.
            self.parts[p].outranking += 1
            priority = clamp_priority(priority)
            self._transit_priority = (priority if not self.in_transit
                                      else max(priority, self._transit_priority))
            self.in_transit += 1
            self._hold_until = time.monotonic() + OUTRANKING_HOLD
            self.wakeup.set()
            self.outranked.set()
        elif len(batch.adds) >= self.batch_size or not self.buffer:
            # A full batch, or nothing prefetched: the engine may be waiting for
            # exactly these requests (e.g. the next listing page).
            self.wakeup.set()

    def wake(self) -> None:
        """Run the loop now (e.g. the operator resumed the crawl)."""
        self.wakeup.set()

    def next(self) -> Entry | None:
        """The next prefetched entry, now held by the node, or None."""
        if self.paused:
            return None  # the buffer stays leased to this node until resumed
        if not self.buffer:
            self.wakeup.set()
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
                self.wakeup.set()
                return None
            entry = self.buffer.popleft()
        self.held[entry.member] = entry
        if len(self.buffer) <= self.prefetch // 2:
            self.wakeup.set()
        return entry

    def _give_back_late(self, entry: Entry) -> None:
        """*entry* of a key with an interval waited here past its start: back
        to its queue, not started (its key's interval counts from its lease,
        so the site sees nothing closer than the interval)."""
        self.give_back(entry)
        self.count("politeness/late_returned", 1)
        self.wakeup.set()

    def give_back(self, entry: Entry) -> None:
        """*entry* goes back to its queue, not started."""
        self.parts[entry.partition].outbox.nacks.append(entry.member)
        if self.on_returned is not None:
            self.on_returned(entry)

    def _hold_lapsed(self) -> None:
        self._lapse = None
        self.nudge()

    def _holds_slot(self) -> bool:
        """Whether the last free download slot waits for a request that
        outranks the buffer's first entry and is on its way back to us."""
        head = self.buffer[0]
        if (not self.in_transit or self.free_slots is None or head.polite
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
        ``AckOrder.attach``)."""
        entry = self.held.pop(member, None)
        p = entry.partition if entry else self.identity.partition_of_member(member)
        self.acks.ack(member, p, relieve)

    def fetched(self, member: str) -> None:
        """*member*'s download ended: its politeness key's slot is free again
        (the entry stays leased until it is acknowledged). Where a key's
        concurrency held takes back, reported at once, with a take; elsewhere
        with the call after next: most requests are acknowledged by then, and
        the ack frees the slot itself (one operation less per page)."""
        entry = self.held.get(member)
        if entry is not None and not entry.ended:
            entry.ended = True
            if self.handoff.hand_off(entry):
                return
            self.download_ends.append((entry.partition, member, time.monotonic()))
            if self.parts[entry.partition].capped:
                self.parts[entry.partition].remote.next_ready_ms = None  # a slot is free
                self.wakeup.set()

    def hold_back(self, key: str) -> None:
        """*key*'s site answered a slow-down status: hand off none of its slots
        (its reserve goes back) until the frontier says the key may go on."""
        self.handoff.return_reserve(key)

    def fail(self, member: str, kind: str, record: dict) -> None:
        """*member* is done for good: keep *record* in the dead/invalid list."""
        entry = self.held.pop(member, None)
        self.acks.children.pop(member, None)
        self.parts[entry.partition if entry else 0].outbox.fail(member, kind, record)

    def feedback(self, key: str, kind: str, seconds: float = 0.0) -> None:
        """What a site said about politeness key *key* (see :class:`Batch`)."""
        batch = self.parts[self.partition_of(key)].outbox
        if kind != "crawldelay" or seconds > 0:
            self.handoff.return_reserve(key)  # no hand-off past what the site said
        {"block": lambda: batch.block(key, seconds), "backoff": lambda: batch.backoff(key),
         "crawldelay": lambda: batch.crawl_delay(key, seconds)}[kind]()
        self.wakeup.set()

    def sent_late(self, entry: Entry, sent_at: float) -> None:
        """Polite *entry* went out at *sent_at* (``time.monotonic()``), later than
        its lease allowed (held up after the buffer: the engine, a downloader
        middleware): its key's next start, for every node, counts from then.
        Sent with the next call, made at once."""
        self.parts[entry.partition].outbox.sent_late(entry.member, sent_at)
        self.wakeup.set()

    # -- what the adapter asks -----------------------------------------------
    def local_backlog(self) -> int:
        """Requests this node holds that Redis has not handed to the engine yet."""
        return len(self.buffer) + self.reserved_count() + self.pending_adds()

    def reserved_count(self) -> int:
        """Entries leased in reserve (see the slot hand-off)."""
        return self.handoff.reserved_count()

    def pending_adds(self) -> int:
        """New requests not stored yet (waiting, or in a call not answered yet)."""
        return (sum(len(s.outbox.adds) for s in self.parts)
                + sum(len(b.adds) for _, b, _ in self.loop.calls.values())
                + sum(len(b.adds) for b in self.loop.sending))

    def remote_queued(self) -> int:
        return sum(s.remote.queued for s in self.parts)

    def has_pending(self) -> bool:
        """Work exists here or anywhere in the cluster that may reach this node."""
        if self.buffer or self.handoff.reserve or self.pending_adds():
            return True
        if (any(b.take for _, b, _ in self.loop.calls.values())
                or any(b.take for b in self.loop.sending)):
            return True  # its reply may bring entries
        held = {}
        for entry in self.held.values():
            held[entry.partition] = held.get(entry.partition, 0) + 1
        for p, r in enumerate(s.remote for s in self.parts):
            if r.queued + max(0, r.delayed) + max(0, r.inflight - held.get(p, 0)) > 0:
                return True
            if r.backlog > 0:
                return True  # in MongoDB: a refill brings it back to Redis
        # moves flagged or under way (a refill's tombstones, a dead mover's leftovers)
        return self.mover is not None and self.mover.pending()

    def moved(self, p: int) -> None:
        """The mover queued entries in partition *p* again: look there now."""
        remote = self.parts[p].remote
        remote.next_ready_ms, remote.misses = None, 0
        self.wakeup.set()

    def sizes(self) -> dict[str, int]:
        return {"queued": self.remote_queued(),
                "delayed": sum(max(0, s.remote.delayed) for s in self.parts),
                "inflight": sum(s.remote.inflight for s in self.parts),
                "prefetched": len(self.buffer), "reserved": self.reserved_count()}

    def flushed(self) -> asyncio.Future:
        """A future that resolves once everything added so far is in Redis."""
        future = asyncio.get_running_loop().create_future()
        self.flush_waiters.append(future)
        self.wakeup.set()
        return future

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self.loop.run())
        if self.mover is not None:
            self.mover.start()

    async def close(self) -> list[Entry]:
        """Stop the loop and leave every partition, returning unstarted entries.

        Returns the entries still held (the adapter's last word on them was
        collected by ``before_tick``)."""
        self.closing = True
        self.wakeup.set()
        self.outranked.set()  # ends a coalescing pause too
        if self.mover is not None:
            await self.mover.close()   # the move under way ends first (each step is safe)
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("Frontier loop failed", extra=self.log_extra)
        try:
            await self.loop.drain()  # entries a reply leased are returned below
        except Exception:
            logger.exception("Frontier loop failed", extra=self.log_extra)
        self.before_tick()
        leftovers = (list(self.buffer) + list(self.held.values())
                     + [e for stock in self.handoff.reserve.values() for e in stock])
        batches = dict(enumerate(self.outbox))
        for state in self.parts:
            state.outbox = Batch()
        # The last word keeps the order of the loop: an ack goes only once the
        # requests added before it are stored (see AckOrder.attach). With several
        # partitions that may take a second call, once the first ones stored the
        # adds; an ack whose adds could not be stored is not sent at all.
        self.acks.attach(batches)
        for p, batch in batches.items():
            batch.adopt = self.identity.adoptions(p)
        for entry in leftovers:
            batches[entry.partition].nacks.append(entry.member)
        self.buffer.clear()
        self.held.clear()
        self.handoff.clear()
        self.identity.owners.clear()
        waiting = {a[1] for a in self.acks.pending}
        stored = await asyncio.gather(*(self._final_sync(p, batch, leave=p not in waiting)
                                        for p, batch in batches.items()))
        for p, ok in zip(batches, stored):
            if ok:
                self.acks.stored(p, len(batches[p].adds))
        if self.acks.pending:
            await self._final_acks(waiting)
        for waiter in self.flush_waiters:
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
        self.acks.attach(second)
        withheld = {a[1] for a in self.acks.pending}
        if self.acks.pending:
            self.count("scheduler/acks_withheld", len(self.acks.pending))
            logger.error("%d finished requests not acknowledged at close: requests they "
                         "produced could not be stored; they come back to the queue when this "
                         "node's lease expires and are crawled again", len(self.acks.pending),
                         extra=self.log_extra)
        self.acks.pending = []
        await asyncio.gather(*(self._final_sync(p, batch, leave=p not in withheld)
                               for p, batch in second.items()))

    async def _final_sync(self, p: int, batch: Batch, leave: bool = True) -> bool:
        """Partition *p*'s last call (leaving it unless *leave* is False: then its
        lease runs out); whether it went through."""
        for attempt in range(3):
            batch.check = self.parts[p].check
            try:
                result = await self.partitions[p].sync(batch, leaving=leave)
                self.replies.apply(p, result, asked=0)
                if leave:
                    logger.info("Left the frontier%s: returned %d unstarted requests",
                                f" partition {p}" if len(self.partitions) > 1 else "",
                                len(batch.nacks), extra=self.log_extra)
                return True
            except Exception as exc:
                self.loop.failed_call(p, batch, exc)
                logger.error("%s at close (%s); attempt %d/3",
                             "Redis refuses the call" if refused(exc) else "Cannot reach Redis",
                             exc, attempt + 1, extra=self.log_extra)
                await asyncio.sleep(1.0)
        logger.error("Gave up: %d new requests not sent; %d leased requests come back when "
                     "this node's lease expires", len(batch.adds), len(batch.nacks),
                     extra=self.log_extra)
        return False
