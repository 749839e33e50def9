"""A node's sync loop: the background task that sends each partition its
``SYNC`` calls and applies the replies (:class:`SyncLoop`)."""

from __future__ import annotations

import asyncio
import logging
import time

from crawlproject import acl
from crawlproject.backoff import backoff_delay
from crawlproject.connection import REDIS_FAILURES
from crawlproject.frontier.queue import Batch, refused, stopped_in_script

# The node's sync loop logs under one name, whichever of its parts speaks.
logger = logging.getLogger("crawlproject.frontier.client")

#: Most new requests in one call: one script call blocks Redis for every node.
MAX_CALL_ADDS = 1000
#: A request that outranks the buffer cuts the coalescing pause short at most
#: once per this many pauses (``min_sync_interval``).
OUTRANKING_RUSH_EVERY = 5
#: With several partitions, how long a round of calls waits for a slow one
#: before it goes on without it (a healthy call takes milliseconds).
ROUND_GRACE = 0.5


class SyncLoop:
    """The calls of one client: when to send, what each batch asks, in flight,
    failed and retried."""

    def __init__(self, client: "FrontierClient"):
        self.client = client
        self.acl_refused: str | None = None  # what an ACL refuses (probed once)
        #: partition -> (its call in flight, the batch, outranking count sent)
        self.calls: dict[int, tuple[asyncio.Future, Batch, int]] = {}
        #: the batches of the one-partition call awaited in _send (not in calls)
        self.sending: list[Batch] = []
        # -inf: no call, no rush yet; never 0.0 (time.monotonic() counts from
        # boot: on a machine up for less than the interval, 0.0 would look
        # recent and hold back the first one).
        self.last_sync = float("-inf")
        self.last_rush = float("-inf")
        self.last_sweep = time.monotonic()

    async def run(self) -> None:
        """The background task: a tick, then a pause or a wait, until close."""
        client = self.client
        errors = 0
        while not client.closing:
            try:
                pause = await self.tick()
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
                client.count("scheduler/loop_errors", 1)
                logger.exception("Frontier loop error; retrying", extra=client.log_extra)
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
                 for p in self.client.partitions if hasattr(p.client, "connection_pool")}
        for pool in pools.values():
            try:
                await pool.disconnect(inuse_connections=False)
            except Exception:  # closing a dead socket may fail too: nothing to keep
                pass

    async def _pause(self, seconds: float) -> None:
        """A coalescing pause, cut short by a request that outranks the buffer:
        a free slot is kept for it (see ``FrontierClient._holds_slot``)."""
        try:
            async with asyncio.timeout(seconds):
                await self.client.outranked.wait()
        except TimeoutError:
            pass

    async def _wait(self) -> None:
        client = self.client
        busy = (client.held or any(s.outbox for s in client.parts)
                or len(client.buffer) <= client.prefetch // 2)
        timeout = client.flush_interval if busy else client.idle_poll
        now = time.monotonic()
        backing_off = [s.retry_at for s in client.parts if s.retry_at > now]
        if backing_off:  # a partition's backoff ends: its work goes then
            timeout = min(timeout, min(backing_off) - now)
        # asyncio.timeout, not wait_for: wait_for runs the wait in a task of its
        # own, one more turn of a busy event loop before a wake is acted on.
        try:
            async with asyncio.timeout(timeout):
                await client.wakeup.wait()
        except TimeoutError:
            pass
        client.wakeup.clear()

    async def tick(self) -> float:
        """Send what is pending if it is time to; return how long to pause."""
        client, parts = self.client, self.client.parts
        client.before_tick()
        now = time.monotonic()
        if self.calls:
            await self._collect(now)
        ready = self._open(now)
        want = (client.prefetch - len(client.buffer)
                if len(client.buffer) <= client.prefetch // 2 else 0)
        takes = self._plan_takes(want, now, ready)
        # Bounded: a crawl whose every new request outranks the last (Scrapy's
        # DEPTH_PRIORITY > 0) must not lease the frontier to this node's buffer.
        room = 2 * client.prefetch - len(client.buffer)
        for p in ready:
            if parts[p].outranking and room > 0 and not client.paused:
                takes[p] = max(takes.get(p, 0), min(parts[p].outranking, room))
        # Maintenance every heartbeat; an idle node (nothing held) also wants its
        # sizes and the reclaims fresh, at its idle pace (``_idle_gap``; not at
        # every turn of the loop: that was a call per flush interval per partition).
        idle_node = not (client.held or client.buffer)
        due = {p for p in ready if now - parts[p].maintained
               >= (self._idle_gap(p) if idle_node else client.heartbeat)}
        # A site's word (a block, a backoff) goes at once: every call another
        # node makes before it lands may start that site's requests. So does a
        # request that outranks the buffer (a free slot waits for it), at most
        # once per OUTRANKING_RUSH_EVERY coalescing pauses: a depth-first crawl,
        # where every new request outranks the buffer, still coalesces.
        client.outranked.clear()
        rush = (now - self.last_rush >= OUTRANKING_RUSH_EVERY * client.min_sync_interval
                and room > 0 and not client.paused and any(parts[p].outranking for p in ready))
        urgent = ((not client.buffer and takes) or client.flush_waiters or due or rush
                  or any(parts[p].outbox.feedback for p in ready))
        if not (any(parts[p].outbox for p in ready) or client.acks.pending or takes or urgent):
            self._resolve_if_flushed()
            return 0.0
        gap = client.min_sync_interval - (now - self.last_sync)
        if gap > 0 and not urgent and client.pending_adds() < client.batch_size:
            return gap  # coalesce: more work per round trip
        if rush:
            self.last_rush = now
        waiters, client.flush_waiters = client.flush_waiters, []
        sent_outranking = {p: parts[p].outranking for p in ready}
        for p in ready:
            parts[p].outranking = 0
        calls: dict[int, Batch] = {}
        polite = None
        if client.free_slots is not None and takes:
            # Entries of keys with an interval are taken only if they can start
            # now: counted from the lease, a wait in our buffer would shorten
            # the interval another node sees.
            polite = max(0, client.free_slots() - len(client.buffer))
            polite = -(-polite // len(takes))
        for p in ready:
            asks = client.handoff.asks(p)  # may send a reserve back: before the batch
            batch = self.next_batch(p)
            batch.reserve = asks
            batch.take = takes.get(p, 0)
            if batch.take and polite is not None:
                batch.take_polite = min(batch.take, polite)
            batch.maintenance = p in due
            if not (batch or batch.maintenance or any(a[1] == p for a in client.acks.pending)):
                continue
            batch.adopt = client.identity.adoptions(p)
            batch.sweep = batch.maintenance and self._sweep_due(now)
            batch.registered = now - parts[p].maintained < client.lease_ttl / 2
            batch.check = parts[p].check
            remote = parts[p].remote
            batch.promote = (batch.maintenance or remote.delayed != 0
                             or any(a[4] for a in batch.adds))
            calls[p] = batch
        client.acks.attach(calls)
        self._attach_fetched(calls, now)
        if len(client.partitions) > 1:
            # Acks held back by an ordering rule go once the calls they wait
            # for are stored: a call with nothing in it is not worth sending.
            calls = {p: b for p, b in calls.items() if b or b.maintenance}
            client.flush_waiters[:0] = waiters
            if calls and (any(parts[p].outbox for p in ready) or client.acks.pending):
                client.wakeup.set()  # more to send (a chunk, acks this round unblocks)
            await self._round(calls, sent_outranking, now)
            return 0.0
        if any(s.outbox for s in parts) or client.acks.pending:
            waiters, client.flush_waiters = [], waiters  # resolved by a later call
            client.wakeup.set()
        results = await self._send(calls)
        failure = None
        for (p, batch), result in zip(calls.items(), results):
            failure = self._finish(p, batch, result, sent_outranking[p], now) or failure
        if failure is not None:
            client.flush_waiters[:0] = waiters
            raise failure
        client.outage.ok(client.log_extra, source="frontier")
        self.last_sync = now
        if any(b.sweep for b in calls.values()):
            self.last_sweep = now
        _resolve(waiters)
        await self._first_sync_done()
        return 0.0

    async def _first_sync_done(self) -> None:
        client = self.client
        if client.on_first_sync is not None:
            # Dropped only once it went through: a hook that failed (Redis gone
            # again) runs after the next call, it is not skipped for good.
            await client.on_first_sync()
            client.on_first_sync = None

    def _finish(self, p: int, batch: Batch, result, outranking: int,
                now: float) -> BaseException | None:
        """Apply partition *p*'s reply (or keep the batch of a failed call)."""
        client, state = self.client, self.client.parts[p]
        if isinstance(result, BaseException):
            self.failed_call(p, batch, result)
            self.requeue(p, batch)
            state.outranking += outranking
            client.identity.change(p)
            return result
        client.acks.stored(p, len(batch.adds))
        state.check = False
        if outranking:
            client.in_transit = max(0, client.in_transit - outranking)
            if not client.in_transit:
                client.nudge()  # a slot kept for them is free for what came back
        client.identity.settled(p, batch)
        state.remote.last_poll = now
        client.replies.apply(p, result, asked=batch.take, batch=batch)
        if batch.maintenance:
            state.maintained = now
        state.errors, state.retry_at = 0, float("-inf")
        return None

    async def _send(self, calls: dict[int, Batch]) -> list:
        """The calls' results (or exceptions), in *calls*' order (one partition)."""
        # Awaited here rather than in a task: one turn of the event loop less
        # between the reply and the engine getting its requests (on a busy
        # loop a turn can be tens of milliseconds).
        results = []
        # While a call is awaited its batch is in neither the outbox nor
        # calls: has_pending() and the seeds' back-pressure must still see its
        # adds (a spider whose start() is done closed when it saw none).
        for p, batch in calls.items():
            self.sending.append(batch)
            try:
                results.append(await self.client.partitions[p].sync(batch))
            except Exception as exc:  # noqa: BLE001 - handled by the caller
                results.append(exc)
            finally:
                self.sending.remove(batch)
        return results

    # -- several partitions: a call in flight per partition ---------------------
    def _open(self, now: float) -> list[int]:
        """Partitions that may be called now: none in flight, not backing off."""
        return [p for p, state in enumerate(self.client.parts)
                if p not in self.calls and state.retry_at <= now]

    async def _round(self, calls: dict[int, Batch], outranking: dict[int, int],
                     now: float) -> None:
        """Send *calls* and wait for their replies, up to ``ROUND_GRACE``: a
        call that takes longer (its master stalls) stays in flight, and its
        partition is called again once it has ended; the others go on."""
        for p, batch in calls.items():
            self.calls[p] = (asyncio.ensure_future(self.client.partitions[p].sync(batch)),
                             batch, outranking.get(p, 0))
        if calls:
            self.last_sync = now
            if any(b.sweep for b in calls.values()):
                self.last_sweep = now
            _, late = await asyncio.wait([self.calls[p][0] for p in calls],
                                         timeout=ROUND_GRACE)
            # Only a late reply wakes the loop: replies within the round are
            # applied now, and the loop then waits at its usual pace.
            wake = lambda _: self.client.wakeup.set()  # noqa: E731
            for call in late:
                call.add_done_callback(wake)
        await self._collect(time.monotonic())

    async def _collect(self, now: float, final: bool = False) -> None:
        """Apply the replies of the calls that ended; a failed partition backs
        off alone (its work is kept for its next call)."""
        client, parts = self.client, self.client.parts
        done = [p for p, (call, _, _) in self.calls.items() if call.done()]
        failed = False
        for p in done:
            call, batch, outranking = self.calls.pop(p)
            result = (asyncio.CancelledError() if call.cancelled()
                      else call.exception() or call.result())
            error = self._finish(p, batch, result, outranking, now)
            if error is None:
                continue
            failed = True
            parts[p].errors += 1
            parts[p].retry_at = now + backoff_delay(parts[p].errors, 0.4, 5.0)
            if isinstance(error, REDIS_FAILURES):
                self._redis_failed(f"frontier call (partition {p})", error,
                                   await self._acl_probe(error))
            else:  # a bug: say so; the partition is retried like an outage
                client.count("scheduler/loop_errors", 1)
                logger.error("Frontier call to partition %d failed; retrying", p,
                             exc_info=error, extra=client.log_extra)
        if failed:
            await self._drop_idle_connections()
        elif done and not any(s.errors for s in parts):
            client.outage.ok(client.log_extra, source="frontier")
        self._resolve_if_flushed()
        if done and not final and not any(parts[p].errors for p in done):
            await self._first_sync_done()

    def _resolve_if_flushed(self) -> None:
        client = self.client
        if client.flush_waiters and not (any(s.outbox for s in client.parts)
                                         or client.acks.pending or self.calls):
            waiters, client.flush_waiters = client.flush_waiters, []
            _resolve(waiters)

    async def drain(self) -> None:
        """Wait for the calls in flight (at close) and apply their replies."""
        if self.calls:
            await asyncio.wait([call for call, _, _ in self.calls.values()])
            await self._collect(time.monotonic(), final=True)

    def _plan_takes(self, want: int, now: float, candidates: list[int]) -> dict[int, int]:
        """How many entries to ask each partition (of *candidates*) for."""
        parts = self.client.parts
        if want <= 0 or self.client.paused:
            return {}
        # A partition this call brings new requests to may have work ready: the
        # script stores them before it takes (a request yielded by a callback
        # must not wait a call more, or an idle look, to come back).
        chosen = [p for p in candidates
                  if parts[p].remote.ready_now(now) or parts[p].outbox.adds]
        if not chosen:
            # Nothing ready that we know of: look at idle pace, in turn (new work
            # from other nodes, or a key whose time came).
            idle = [p for p in candidates
                    if now - parts[p].remote.last_poll >= self._idle_gap(p)]
            if not idle:
                return {}
            chosen = [min(idle, key=lambda p: parts[p].remote.last_poll)]
        share = -(-want // len(chosen))
        return {p: share for p in chosen}

    def _idle_gap(self, p: int) -> float:
        """Seconds between idle looks at partition *p*: ``idle_poll``, doubled
        after each look in a row that found nothing, up to ``idle_poll_max``
        (a node with nothing to do costs Redis a call a second, not five; a
        time the frontier named is not waited for: see ``Remote.ready_now``)."""
        client = self.client
        return min(client.idle_poll * (1 << min(client.parts[p].remote.misses, 16)),
                   max(client.idle_poll, client.idle_poll_max))

    def next_batch(self, p: int) -> Batch:
        """Partition *p*'s outbox, or its first ``MAX_CALL_ADDS`` new requests
        (acknowledgements wait for the last chunk)."""
        state = self.client.parts[p]
        outbox = state.outbox
        if len(outbox.adds) <= MAX_CALL_ADDS:
            state.outbox = Batch()
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
        client = self.client
        client.count("scheduler/redis_errors", 1)
        if refused(exc):
            client.count("scheduler/refused_calls", 1)
        named = {"denied": denied} if denied else {}  # only an ACL refusal has one
        client.outage.failed(what, exc, client.log_extra, source="frontier",
                             refused=refused(exc), **named)

    async def _acl_probe(self, exc: BaseException) -> str | None:
        """What an ACL refused, when Redis 6.2 did not say (a command inside
        a script): asked once, outside a script (:mod:`crawlproject.acl`)."""
        if acl.refusal(exc) != acl.SCRIPT_COMMAND_REFUSED:
            return None
        if self.acl_refused is None:
            self.acl_refused = (await acl.probe_script_refusal(self.client.partitions[0].client)
                                or "")
        return self.acl_refused or None

    def failed_call(self, p: int, batch: Batch, exc: BaseException) -> None:
        """A call to partition *p* failed: if its script stopped part way (a key
        of the wrong type), its adds go again even past the filter, which may
        have them now, and the next calls check every key before writing."""
        if not stopped_in_script(exc):
            return
        batch.force_adds()
        self.client.parts[p].check = True
        self.client.count("scheduler/calls_stopped_in_script", 1)

    def requeue(self, p: int, batch: Batch) -> None:
        """Keep the unsent work of a failed call (taken entries, if any, are
        unknown to us: they come back when the old id expires)."""
        state = self.client.parts[p]
        batch.take = 0
        batch.adopt = []  # recomputed for the next call
        batch.merge(state.outbox)
        state.outbox = batch

    def _sweep_due(self, now: float) -> bool:
        # Entries held by an id that is not a registered node (an old frontier,
        # a hand-edited key) would never come back and would keep every node
        # from idle-closing. While this node holds nothing and others seem to,
        # check for such entries once per lease TTL.
        client = self.client
        return (not client.held and any(s.remote.inflight > 0 for s in client.parts)
                and now - self.last_sweep >= client.lease_ttl)

    def _attach_fetched(self, batches: dict[int, Batch], now: float) -> None:
        """Report downloads that ended a while ago and are still not settled."""
        client = self.client
        # One threshold for all: the deque is in time order (a capped partition
        # makes the others report promptly too; a few operations more at most).
        older = now if any(s.capped for s in client.parts) else now - 2 * client.min_sync_interval
        later = []  # no call to their partition this round (one in flight, backing off)
        ended = client.download_ends
        while ended and ended[0][2] <= older:
            p, member, at = ended.popleft()
            if member in client.held and p in batches:
                batches[p].fetched.append(member)
            elif member in client.held:
                later.append((p, member, at))
        ended.extendleft(reversed(later))


def _resolve(waiters: list[asyncio.Future]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
