"""FrontierClient: its batching rules (calls built, not sent) and, on real Redis, how
promptly its loop takes what the engine needs next."""

import asyncio
import contextlib
import os
import signal
import time

import pytest

from crawlproject.frontier.client import MAX_CALL_ADDS, FrontierClient
from crawlproject.frontier.sitelimits import PolitenessConfig
from tests.crawl_helpers import partial_cluster


class FakeFrontier:
    def __init__(self, p):
        self.node, self.partition = "n1", p


def make_client(partitions=1, loop=None):
    politeness = PolitenessConfig(partitions=partitions)
    return FrontierClient([FakeFrontier(p) for p in range(partitions)], politeness,
                          accept=lambda p, m, payload: payload, before_tick=lambda: None,
                          count=lambda name, value: None, outage=None, log_extra={},
                          prefetch=8, batch_size=100, flush_interval=0.05,
                          min_sync_interval=0.02, idle_poll=0.2, heartbeat=2, lease_ttl=10)


def send_round(client, partitions, fail=()):
    """Build one round of calls as SyncLoop.tick does; mark them sent (or failed)."""
    calls = {p: client.loop.next_batch(p) for p in partitions}
    client.acks.attach(calls)
    for p, batch in calls.items():
        if p in fail:
            client.loop.requeue(p, batch)
        else:
            client.acks.stored(p, len(batch.adds))
    return calls


def run(coro_fn):
    async def main():
        return coro_fn()
    return asyncio.run(main())


def test_a_huge_outbox_goes_in_bounded_calls_with_the_acks_in_the_last():
    def body():
        client = make_client()
        for i in range(2500):
            client.add(f'{{"url": "http://h/{i}"}}', None, 0, 0, "h")
        client.ack("0:1@h")
        client.ack("0:2@h")
        rounds = [send_round(client, [0])[0] for _ in range(3)]
        return [len(b.adds) for b in rounds], [b.acks for b in rounds]

    sizes, acks = run(body)
    assert sizes == [MAX_CALL_ADDS, MAX_CALL_ADDS, 500]
    assert acks == [[], [], ["0:1@h", "0:2@h"]]     # parents acked with the last chunk


def test_an_ack_waits_for_the_adds_made_before_it_in_other_partitions():
    """A request's new requests may go to another partition: its ack must not
    be stored before them, even if the two calls run at once."""
    def body():
        client = make_client(partitions=2)
        keys = {client.partition_of(k): k for k in (f"h{i}" for i in range(50))}
        parent = f"0:1@{keys[0]}"                   # a request of partition 0 ...
        client.add("{}", None, 0, 0, keys[1])       # ... produced one for partition 1
        client.ack(parent)
        first = send_round(client, [0, 1])
        second = send_round(client, [0, 1])
        failing = make_client(partitions=2)
        failing.add("{}", None, 0, 0, keys[1])
        failing.ack(parent)
        send_round(failing, [0, 1], fail={1})        # partition 1's call failed
        retry = send_round(failing, [0, 1])
        after = send_round(failing, [0, 1])
        return first, second, retry, after, parent

    first, second, retry, after, parent = run(body)
    assert first[0].acks == [] and len(first[1].adds) == 1
    assert second[0].acks == [parent]
    assert retry[0].acks == [] and len(retry[1].adds) == 1   # still waiting for the re-send
    assert after[0].acks == [parent]


def test_an_ack_waits_for_its_own_requests_not_for_those_of_others():
    """With the member that produced each request known (the lineage spider
    middleware), an ack waits only for its own requests and for those added
    without a parent: partition 1 failing holds up the request whose link went
    there, not one whose links all went to partition 0."""
    def body():
        client = make_client(partitions=2)
        keys = {client.partition_of(k): k for k in (f"h{i}" for i in range(50))}
        a, b = f"0:1@{keys[0]}", f"0:2@{keys[0]}"
        client.add('{"a": 1}', None, 0, 0, keys[1], parent=a)   # a's link: partition 1
        client.add('{"b": 1}', None, 0, 0, keys[0], parent=b)   # b's link: partition 0
        client.ack(a)
        client.ack(b)
        failed = send_round(client, [0, 1], fail={1})            # partition 1 is down
        still = send_round(client, [0, 1], fail={1})
        back = send_round(client, [0, 1])                        # it answers again
        after = send_round(client, [0, 1])
        # A request added without a parent (a seed) is waited for by every ack after it.
        seeded = make_client(partitions=2)
        seeded.add('{"seed": 1}', None, 0, 0, keys[1])
        seeded.add('{"b": 1}', None, 0, 0, keys[0], parent=b)
        seeded.ack(b)
        waits = send_round(seeded, [0, 1], fail={1})
        return failed, still, back, after, waits, a, b

    failed, still, back, after, waits, a, b = run(body)
    assert failed[0].acks == [b]                 # with its link, in the same atomic call
    assert still[0].acks == [] and back[0].acks == []
    assert len(back[1].adds) == 1
    assert after[0].acks == [a]
    assert waits[0].acks == []


def test_an_ack_goes_with_the_adds_of_its_own_partition():
    def body():
        client = make_client(partitions=2)
        key = next(k for k in (f"h{i}" for i in range(50)) if client.partition_of(k) == 0)
        client.add("{}", None, 0, 0, key)
        client.ack(f"0:1@{key}")
        return send_round(client, [0, 1])

    calls = run(body)
    assert len(calls[0].adds) == 1 and len(calls[0].acks) == 1


class _Outage:
    def failed(self, *args, **kwargs):
        raise AssertionError(f"Redis call failed: {args}")

    def ok(self, extra=None, source=""):
        pass


@contextlib.asynccontextmanager
async def real_client(redis_url, spider, concurrency, entries, outage=None, count=None,
                      delay=0.0, margin=0.0, **pauses):
    """A started FrontierClient on real Redis, with *entries* requests queued
    for key "h" (limit *concurrency*); every pause of its loop is a minute
    unless *pauses* says otherwise. Yields (client, frontier, redis)."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.sitelimits import Limits
    from crawlproject.frontier.queue import AsyncFrontier, Batch

    redis = aioredis.Redis.from_url(redis_url)
    politeness = PolitenessConfig(default=Limits(delay, concurrency), margin=margin)
    frontier = AsyncFrontier(redis, spider, "n1", lease_ttl=120, politeness=politeness)
    seed = Batch()
    for i in range(entries):
        seed.add('{"url": "http://h/%d"}' % i, None, 0, 0, "h")
    await frontier.sync(seed)
    settings = {"flush_interval": 60, "min_sync_interval": 60, "idle_poll": 60,
                "heartbeat": 60, **pauses}
    fc = FrontierClient([frontier], politeness, accept=lambda p, m, payload: payload,
                        before_tick=lambda: None, count=count or (lambda name, value: None),
                        outage=outage or _Outage(), log_extra={}, prefetch=8, batch_size=100,
                        lease_ttl=120, **settings)
    fc.start()
    try:
        yield fc, frontier, redis
    finally:
        fc.paused = True
        await fc.close()
        await redis.aclose()


async def until(condition, timeout=10.0):
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_an_idle_node_looks_less_often_and_still_takes_new_work(redis_url):
    """An empty frontier is looked at after idle_poll, then ever less often up
    to idle_poll_max (three idle nodes were calling Redis fifteen times a
    second); work another node adds is still taken."""
    from crawlproject.frontier.queue import AsyncFrontier, Batch

    async def main():
        async with real_client(redis_url, "idle", 2, 0, idle_poll=0.05, idle_poll_max=0.4,
                               flush_interval=0.05,
                               min_sync_interval=0.01) as (fc, frontier, client):
            calls = []
            sync = frontier.sync

            async def counted(batch):
                calls.append(time.monotonic())
                return await sync(batch)

            frontier.sync = counted
            await until(lambda: len(calls) >= 8, timeout=30)
            gaps = [b - a for a, b in zip(calls, calls[1:])]
            assert min(gaps[-3:]) >= 0.35, gaps            # at idle_poll_max by now
            other = AsyncFrontier(client, "idle", "n2", lease_ttl=120,
                                  politeness=fc.politeness)
            work = Batch()
            work.add('{"url": "http://h/new"}', None, 0, 0, "h")
            await other.sync(work)
            await until(lambda: len(fc.buffer) == 1, timeout=10)

    asyncio.run(main())


def test_a_download_end_is_reported_at_once_where_a_key_is_at_its_concurrency(redis_url):
    """Real Redis: with a site at its concurrency, the slot a finished download
    frees is used for the next request at once, not when the request is acked
    (after its callback and items) nor at the next idle look. Every pause of the
    loop is set to a minute here: only the prompt report can take the third
    entry within the test's wait."""
    async def main():
        async with real_client(redis_url, "capped", 2, 5) as (fc, frontier, client):
            await until(lambda: len(fc.buffer) == 2)    # the key's concurrency: 2 leased
            first, second = fc.next(), fc.next()
            assert fc.capped == [True]
            fc.fetched(first.member)                     # its download ended, no ack yet
            await until(lambda: len(fc.buffer) == 1)
            states = await client.hget(frontier.keys.kstate, "h")
            assert int(states.split(b"|")[0]) == 2       # still 2 in flight: 1 freed, 1 new
            assert first.member in fc.held               # the first is still not acked

    asyncio.run(main())


async def leases_counted(client, frontier):
    """Leases of key "h" that hold a slot (no '|f' ended, no '|r' reserve flag)."""
    values = (await client.hgetall(frontier.keys.inflight)).values()
    return sum(1 for v in values if b"|" not in v)


def test_a_node_hands_a_finished_download_s_slot_to_its_reserve_at_once(redis_url):
    """Real Redis: at the key's concurrency the node holds an entry in reserve
    and starts it the moment one of its downloads ends, with no round trip (the
    buffer has it before the loop runs again); once reported, the key still
    counts 2 in flight, and 2 leases hold a slot: the limit held."""
    async def main():
        async with real_client(redis_url, "handoff", 2, 10) as (fc, frontier, client):
            await until(lambda: len(fc.buffer) == 2)
            first, second = fc.next(), fc.next()
            fc.fetched(first.member)                 # no reserve yet: reported, a take
            await until(lambda: fc.reserved_count() == 1 and len(fc.buffer) == 1)
            third = fc.next()
            fc.fetched(second.member)
            assert len(fc.buffer) == 1 and fc.reserved_count() == 0   # at once
            fourth = fc.next()
            assert fourth.member not in (first.member, second.member, third.member)
            await fc.flushed()
            state = await client.hget(frontier.keys.kstate, "h")
            assert int(state.split(b"|")[0]) == 2
            assert await leases_counted(client, frontier) == 2    # third and fourth

    asyncio.run(main())


def polite_client(redis_url, spider, concurrency, counts: dict):
    """:func:`real_client` for a site with an interval of 1 s (margin 5 %: its
    entries may start up to 50 ms after their lease reached the node), with
    quick calls; the client's stats are added up in *counts*."""
    def count(name, value):
        counts[name] = counts.get(name, 0) + value

    return real_client(redis_url, spider, concurrency, 3, count=count, delay=1.0, margin=0.05,
                       flush_interval=0.05, min_sync_interval=0.02, idle_poll=0.1)


def test_a_polite_entry_that_waited_in_the_buffer_past_its_start_goes_back_not_out(redis_url):
    """Limits held at send time: a site with an interval (1 s, margin 5 %: its
    entries may start up to 50 ms after their lease reached the node) whose leased entry waited
    in the node's buffer longer is not handed to the engine — the site could
    see it closer than 1 s to the next request, which any node may lease on
    time — but goes back to its queue, not started; the site's next start
    still counts from the lease, and an entry taken then starts."""
    counts = {}

    async def main():
        async with polite_client(redis_url, "late", 1, counts) as (fc, frontier, client):
            returned = []
            fc.on_returned = returned.append         # (the scheduler ends its hooks' lease)
            await until(lambda: len(fc.buffer) == 1)
            late = fc.buffer[0]
            leased = late.leased_at
            await asyncio.sleep(0.1)                 # the engine did not ask for 100 ms
            assert fc.next() is None                 # too late to start: given back
            assert counts.get("politeness/late_returned") == 1 and returned == [late]
            await until(lambda: len(fc.buffer) == 1, timeout=15)
            again = fc.buffer[0]
            assert again.leased_at - leased >= 1.0  # the interval from the first lease
            assert fc.next() is again                # on time: it starts
            assert await client.zcard(frontier.keys.queue("h")) == 2   # none lost

    asyncio.run(main())


def test_a_polite_request_sent_late_after_the_buffer_moves_the_site_s_next_start(redis_url):
    """Held after the buffer too: an entry handed to the engine on time but
    sent 300 ms after its lease (the node's loop busy, a downloader middleware)
    is reported, and the site's next start, for every node, counts from that
    send (interval 1 s): not from the lease, where the next request would
    reach the site 0.7 s after this one. Without the report the next lease
    comes 1.05 s after the first (the margin): this fails."""
    counts = {}

    async def main():
        async with polite_client(redis_url, "sent-late", 3, counts) as (fc, frontier, client):
            await until(lambda: len(fc.buffer) == 1)
            first = fc.next()
            assert first is not None and first.polite
            await asyncio.sleep(0.3)                 # held up after the buffer
            sent = time.monotonic()
            fc.sent_late(first, sent)
            await until(lambda: len(fc.buffer) == 1, timeout=15)
            assert fc.buffer[0].leased_at - sent >= 1.0, fc.buffer[0].leased_at - first.leased_at
            assert not counts.get("politeness/late_returned")

    asyncio.run(main())


def test_a_site_s_block_goes_to_redis_at_once_not_after_the_coalescing_pause(redis_url):
    """Until a Retry-After block is stored, every node may start the site's
    requests: it goes with the next turn of the loop, not after
    SCHEDULER_MIN_SYNC_INTERVAL (a minute here; the node just made a call)."""
    async def main():
        async with real_client(redis_url, "urgent-block", 2, 5) as (fc, frontier, client):
            await until(lambda: len(fc.buffer) == 2)
            fc.feedback("h", "block", 30)

            async def blocked_until():
                state = await client.hget(frontier.keys.kstate, "h")
                return int(state.split(b"|")[2])
            async with asyncio.timeout(10):
                while not await blocked_until():
                    await asyncio.sleep(0.01)

    asyncio.run(main())


@pytest.mark.parametrize("heard", ["retry-after", "slow-down status"])
def test_a_block_the_node_hears_of_sends_its_reserve_back(redis_url, heard):
    """A 429's Retry-After seen on this node (or, before the middlewares see it,
    the status itself): no hand-off past it; the reserve goes back to the key's
    queue with the next call."""
    async def main():
        async with real_client(redis_url, f"handback-{len(heard)}", 2, 10) as (fc, frontier, client):
            await until(lambda: len(fc.buffer) == 2)
            first, second = fc.next(), fc.next()
            fc.fetched(first.member)
            await until(lambda: fc.reserved_count() == 1 and len(fc.buffer) == 1)
            if heard == "retry-after":
                fc.feedback("h", "block", 30)
            else:
                fc.hold_back("h")
            assert fc.reserved_count() == 0
            before = list(fc.buffer)
            fc.fetched(second.member)
            assert list(fc.buffer) == before         # nothing started on its slot
            if heard == "retry-after":  # (the status alone blocks nothing in Redis)
                await fc.flushed()
                queued = await client.zcard(frontier.keys.queue("h"))
                assert queued == 10 - 3              # the reserved entry is back

    asyncio.run(main())


def test_a_new_request_that_outranks_the_buffer_is_handed_out_next(redis_url):
    """Real Redis: the buffer holds prefetched requests of priority 0 when the
    spider yields one of priority 5 (the next listing page): like Scrapy's own
    scheduler, the node hands it out before them, without waiting for its
    buffer to drain to half. Every pause of the loop but the coalescing one is
    a minute: only the take that goes with the new request can bring it back
    within the test's wait."""
    async def main():
        async with real_client(redis_url, "ranked", 100, 12,
                               min_sync_interval=0.05) as (fc, _, _):
            await until(lambda: len(fc.buffer) == 8)
            assert fc.next().item == b'{"url": "http://h/0"}'   # 7 left: over half
            fc.add('{"url": "http://h/top"}', None, 5, 0, "h")
            await until(lambda: len(fc.buffer) == 8)
            handed = [fc.next().item for _ in range(3)]
            assert handed == [b'{"url": "http://h/top"}', b'{"url": "http://h/1"}',
                              b'{"url": "http://h/2"}']

    asyncio.run(main())


def test_the_last_free_slot_waits_for_a_request_that_outranks_the_buffer(redis_url):
    """Real Redis: while the call that stores the next listing page (priority 5)
    and takes it back is under way, Scrapy's own scheduler would give the next
    free slot to that request, not to a prefetched one of priority 0: the node
    keeps its last free slot for it (other free slots are used as before), and
    once the reply is in the engine is nudged and gets it first."""
    async def main():
        free, nudges = {"slots": 1}, []
        async with real_client(redis_url, "kept-slot", 100, 12, min_sync_interval=0.05,
                               free_slots=lambda: free["slots"],
                               nudge=lambda: nudges.append(1)) as (fc, _, _):
            await until(lambda: len(fc.buffer) == 8)
            assert fc.next().item == b'{"url": "http://h/0"}'   # 7 left: over half
            fc.add('{"url": "http://h/top"}', None, 5, 0, "h")
            assert fc.next() is None                            # the last slot is kept
            free["slots"] = 2
            assert fc.next().item == b'{"url": "http://h/1"}'   # not the last one
            free["slots"] = 1
            nudged = len(nudges)
            await until(lambda: len(nudges) > nudged)           # the reply is in
            assert fc.next().item == b'{"url": "http://h/top"}'

    asyncio.run(main())


def test_a_request_that_outranks_the_buffer_cuts_the_coalescing_pause_short(redis_url):
    """Real Redis: the coalescing pause is a minute here, the node just made a
    call; the next listing page (priority 5) still comes back within the test's
    wait. A second one right after waits for the pause (at most one rush per
    OUTRANKING_RUSH_EVERY pauses): a depth-first crawl, where every new
    request outranks the buffer, keeps coalescing its calls."""
    async def main():
        async with real_client(redis_url, "rush", 100, 12,
                               min_sync_interval=60) as (fc, _, _):
            await until(lambda: len(fc.buffer) == 8)
            assert fc.next().item == b'{"url": "http://h/0"}'   # 7 left: over half
            fc.add('{"url": "http://h/top"}', None, 5, 0, "h")
            await until(lambda: fc.buffer[0].priority == 5)
            fc.add('{"url": "http://h/top2"}', None, 6, 0, "h")
            await until(lambda: not fc.outranked.is_set())     # the loop looked at it
            assert fc.pending_adds() == 1 and fc.buffer[0].priority == 5

    asyncio.run(main())


def test_a_slot_kept_for_an_outranking_request_is_kept_only_for_a_while(monkeypatch):
    """No reply comes (Redis down, a stalled loop): the slot goes back to the
    buffer after OUTRANKING_HOLD, and the engine is told (with one slot, it
    would otherwise wait for its next heartbeat); an entry of the same or
    higher priority than the one on its way is never held back, nor one of a
    key with an interval."""
    import crawlproject.frontier.client as client_module
    monkeypatch.setattr(client_module, "OUTRANKING_HOLD", 0.2)

    async def main():
        from crawlproject.frontier.client import Entry
        fc = make_client()
        nudges = []
        fc.free_slots, fc.nudge = (lambda: 1), (lambda: nudges.append(1))
        fc.buffer.extend(Entry(f"0:{i}@h", 0, f"p{i}", 0, "h") for i in range(4))
        fc.add('{"url": "http://h/top"}', None, 5, 0, "h")
        assert fc.next() is None
        await until(lambda: nudges, timeout=10)
        assert fc.next().item == "p0"
        fc.buffer.appendleft(Entry("5:9@h", 0, "same", 5, "h"))
        fc.add('{"url": "http://h/top2"}', None, 5, 0, "h")
        assert fc.next().item == "same"
        # An entry of a key with an interval counts as started when leased: never held.
        fc.buffer.appendleft(Entry("0:8@slow", 0, "polite", 0, "slow", polite=True))
        fc.add('{"url": "http://h/top3"}', None, 7, 0, "h")
        assert fc.next().item == "polite"
        assert fc.next() is None                    # the next one is held again

    asyncio.run(main())


def test_requests_that_keep_outranking_the_buffer_do_not_grow_it_without_bound(redis_url):
    """Real Redis: a depth-first crawl (every new request outranks the ones
    before it) must not lease the whole frontier to one node's buffer: it stays
    within twice the prefetch however many such requests come."""
    async def main():
        async with real_client(redis_url, "deep", 1000, 8,
                               min_sync_interval=0.01) as (fc, _, _):
            await until(lambda: len(fc.buffer) == 8)
            largest = 0
            for depth in range(1, 41):
                fc.add('{"url": "http://h/d%d"}' % depth, None, depth, 0, "h")
                await fc.flushed()
                largest = max(largest, len(fc.buffer))
            assert largest == 16                        # 2 x prefetch, not 48
            assert fc.remote_queued() == 32             # the deeper ones wait in Redis
            assert fc.next().item == b'{"url": "http://h/d8"}'    # the buffer's deepest

    asyncio.run(main())


def test_an_unreachable_redis_cluster_is_an_outage_not_a_bug():
    """redis-py raises RedisClusterException, not a RedisError, when no node of a
    cluster answers (nodes started before the cluster): the loop must report it
    as an outage and retry, not log a traceback as a bug of its own."""
    from crawlproject.connection import redis_from_url
    from crawlproject.frontier.queue import AsyncFrontier
    from devtools.services import free_port

    failures, counts = [], {}

    class Outage:
        def failed(self, what, exc, extra=None, source="", refused=False):
            failures.append(type(exc).__name__)

        def ok(self, extra=None, source=""):
            pass

    async def scenario():
        redis = redis_from_url(f"redis://127.0.0.1:{free_port()}/0", cluster=True,
                               asyncio=True, socket_connect_timeout=0.5)
        politeness = PolitenessConfig()
        fc = FrontierClient([AsyncFrontier(redis, "shop", "n1", lease_ttl=10,
                                           politeness=politeness)], politeness,
                            accept=lambda p, m, payload: payload, before_tick=lambda: None,
                            count=lambda name, value: counts.__setitem__(
                                name, counts.get(name, 0) + value),
                            outage=Outage(), log_extra={}, prefetch=8, batch_size=100,
                            flush_interval=0.05, min_sync_interval=0.02, idle_poll=0.2,
                            heartbeat=2, lease_ttl=10)
        fc.start()
        try:
            await until(lambda: len(failures) >= 2 or counts.get("scheduler/loop_errors"),
                        timeout=30)
        finally:
            fc.closing = True
            fc._task.cancel()
            await asyncio.gather(fc._task, return_exceptions=True)
            await redis.aclose()

    asyncio.run(scenario())
    assert "scheduler/loop_errors" not in counts
    assert failures[:2] == ["RedisClusterException"] * 2


class _CountingOutage:
    """Records the failures the loop reports (and their kind)."""

    def __init__(self):
        self.failures = []

    def failed(self, what, exc, extra=None, source="", refused=False):
        self.failures.append((what, type(exc).__name__))

    def ok(self, extra=None, source=""):
        pass


async def partitioned_client(cluster, spider, partitions=12, keys=120, per_key=3):
    """A started FrontierClient over *partitions* partitions of *cluster*, with
    *per_key* requests queued for each of *keys* hosts, and a consumer that
    acknowledges every entry it is handed. Returns (client, consumer task,
    handed payloads, partition -> master port, all payloads by partition)."""
    from crawlproject.connection import redis_from_url
    from crawlproject.frontier.sitelimits import Limits
    from crawlproject.frontier.queue import AsyncFrontier, Batch
    from crawlproject.keys import FrontierKeys

    redis = redis_from_url(cluster.url, cluster=True, asyncio=True, socket_timeout=120)
    politeness = PolitenessConfig(default=Limits(0), margin=0.0, partitions=partitions)
    frontiers = [AsyncFrontier(redis, spider, "n1", lease_ttl=120, politeness=politeness,
                               partition=p, partitions=partitions) for p in range(partitions)]
    seeds = [Batch() for _ in range(partitions)]
    expected = {p: [] for p in range(partitions)}
    for k in range(keys):
        key = f"h{k}"
        p = politeness.partition(key)
        for i in range(per_key):
            payload = '{"url": "http://%s/%d"}' % (key, i)
            seeds[p].add(payload, None, 0, 0, key)
            expected[p].append(payload)
    for frontier, seed in zip(frontiers, seeds):
        await frontier.sync(seed)
    with cluster.client() as probe:
        masters = {p: probe.get_node_from_key(FrontierKeys(spider, p, partitions).ready).port
                   for p in range(partitions)}
    counts = {}
    fc = FrontierClient(frontiers, politeness, accept=lambda p, m, payload: (p, payload),
                        before_tick=lambda: None,
                        count=lambda name, value: counts.__setitem__(
                            name, counts.get(name, 0) + value),
                        outage=_CountingOutage(), log_extra={}, prefetch=8, batch_size=100,
                        flush_interval=0.05, min_sync_interval=0.02, idle_poll=0.2,
                        heartbeat=2, lease_ttl=120)
    fc.counts = counts
    handed = []

    async def consume():
        while True:
            entry = fc.next()
            if entry is None:
                await asyncio.sleep(0.005)
                continue
            handed.append(entry.item)
            fc.fetched(entry.member)
            fc.ack(entry.member)

    fc.start()
    return fc, asyncio.ensure_future(consume()), handed, masters, expected


async def _abandon(fc):
    """Stop *fc*'s loop without its final calls (a partition never answers them)."""
    fc.closing = True
    fc._task.cancel()
    await asyncio.gather(fc._task, return_exceptions=True)
    for call, _, _ in list(fc.loop.calls.values()):
        call.cancel()


async def _stop_client(fc, consumer):
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    fc.paused = True
    await fc.close()
    await fc.partitions[0].client.aclose()


def test_a_stalled_master_holds_up_only_its_own_partitions(tmp_path):
    """Real 3-master cluster, 12 partitions: one master is stopped (SIGSTOP: a
    fork, a slow command) while the node crawls. The partitions of the other
    masters go on; the stalled one's call is answered when the master resumes,
    and every request is handed out exactly once. The client's socket timeout
    is two minutes: on a loop that waits for all partitions' calls together,
    nothing at all is handed out while the master is stopped."""
    async def main(cluster):
        fc, consumer, handed, masters, expected = await partitioned_client(cluster, "stall")
        try:
            stalled = cluster.nodes[0]
            mine = {p for p, port in masters.items() if port == stalled.port}
            healthy = sum(len(v) for p, v in expected.items() if p not in mine)
            assert mine and healthy >= 150
            await until(lambda: len(handed) >= 20, timeout=30)
            os.kill(stalled.pid, signal.SIGSTOP)
            try:
                before = len(handed)
                # Healthy partitions keep handing out while the master is stopped.
                await until(lambda: len(handed) - before >= 100, timeout=30)
            finally:
                os.kill(stalled.pid, signal.SIGCONT)
            total = sum(len(v) for v in expected.values())
            await until(lambda: len(handed) >= total, timeout=90)
            await fc.flushed()
            assert sorted(payload for _, payload in handed) == sorted(
                payload.encode() for v in expected.values() for payload in v)
            assert fc.counts.get("scheduler/loop_errors", 0) == 0
        finally:
            await _stop_client(fc, consumer)

    with partial_cluster(tmp_path) as cluster:
        asyncio.run(main(cluster))


def test_a_failing_master_is_retried_on_its_own_backoff(tmp_path):
    """Real 3-master cluster, 12 partitions: one master is killed mid-crawl.
    Every request of the other masters' partitions is handed out, each once,
    while the dead one's partitions are tried on their own backoff (0.4 s
    doubling to 5 s): a handful of failed calls, not one per call to the
    others (at most 8 entries per call: over 30 on a loop whose every call
    includes the dead partition)."""
    async def main(cluster):
        fc, consumer, handed, masters, expected = await partitioned_client(cluster, "dead",
                                                                           per_key=4)
        try:
            ports = list(masters.values())
            dead = min(cluster.nodes, key=lambda node: ports.count(node.port))
            mine = {p for p, port in masters.items() if port == dead.port}
            healthy = sorted(payload.encode() for p, v in expected.items() if p not in mine
                             for payload in v)
            assert mine and len(healthy) >= 240
            await until(lambda: len(handed) >= 8, timeout=30)
            os.kill(dead.pid, signal.SIGKILL)
            await until(lambda: sum(p not in mine for p, _ in handed) >= len(healthy),
                        timeout=120)
            got = sorted(payload for p, payload in handed if p not in mine)
            assert got == healthy                        # each exactly once
            failed = fc.outage.failures
            assert failed and all("partition" in what for what, _ in failed)
            assert {int(what.rsplit(" ", 1)[1].rstrip(")")) for what, _ in failed} <= mine
            assert len(failed) <= 12, failed
            assert fc.counts.get("scheduler/loop_errors", 0) == 0
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await _abandon(fc)              # the dead master never answers the final call
            await fc.partitions[0].client.aclose()

    with partial_cluster(tmp_path) as cluster:
        asyncio.run(main(cluster))


@contextlib.asynccontextmanager
async def half_down(redis_url, spider, seeds, lease_ttl):
    """A started FrontierClient over two partitions: the first on real Redis with
    *seeds* (payloads of key "d") queued, the second on a closed port. Yields
    (client, the first partition's frontier, its redis client, the stats)."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.sitelimits import Limits
    from crawlproject.frontier.queue import AsyncFrontier, Batch
    from devtools.services import free_port

    redis = aioredis.Redis.from_url(redis_url)
    down = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0",
                                   socket_connect_timeout=0.2)
    politeness = PolitenessConfig(default=Limits(0), margin=0.0, partitions=2)
    assert politeness.partition("d") == 0 and politeness.partition("a") == 1
    frontiers = [AsyncFrontier(client, spider, "n1", lease_ttl=lease_ttl, politeness=politeness,
                               partition=p, partitions=2)
                 for p, client in ((0, redis), (1, down))]
    seed = Batch()
    for payload in seeds:
        seed.add(payload, None, 0, 0, "d")
    await frontiers[0].sync(seed)
    counts = {}
    fc = FrontierClient(frontiers, politeness, accept=lambda p, m, payload: payload,
                        before_tick=lambda: None,
                        count=lambda name, value: counts.__setitem__(
                            name, counts.get(name, 0) + value),
                        outage=_CountingOutage(), log_extra={}, prefetch=8, batch_size=100,
                        flush_interval=0.05, min_sync_interval=0.02, idle_poll=0.2,
                        heartbeat=60, lease_ttl=lease_ttl)
    fc.start()
    try:
        yield fc, frontiers[0], redis, counts
    finally:
        if not fc.closing:
            await _abandon(fc)
        await redis.aclose()
        await down.aclose()


def test_a_node_closing_while_a_partition_is_down_acks_nothing_whose_links_were_lost(redis_url):
    """Two partitions, the second one's Redis unreachable: a node has crawled a
    request of the first partition and made two links from it, one for each
    partition, when it closes. Its ack must not be stored: the link for the
    unreachable partition cannot be, and an acked request is never crawled
    again, so that link would be lost for good. The ack is withheld (counted),
    the node keeps its lease there, and once the lease runs out another node
    gets the request back (and with it the lost link, when it crawls it)."""
    from crawlproject.frontier.queue import AsyncFrontier, Batch

    async def main():
        async with half_down(redis_url, "closing", ['{"url": "http://d/parent"}'],
                             lease_ttl=1) as (fc, frontier, redis, counts):
            try:
                await until(lambda: len(fc.buffer) == 1)
                parent = fc.next()
                fc.add('{"url": "http://d/sibling"}', None, 0, 0, "d")    # partition 0
                fc.add('{"url": "http://a/child"}', None, 0, 0, "a")      # partition 1: down
                fc.fetched(parent.member)
                fc.ack(parent.member)
            finally:
                await fc.close()
            keys = frontier.keys
            assert await redis.hexists(keys.payloads, parent.member)    # not acked
            assert counts.get("scheduler/acks_withheld") == 1
            assert await redis.zcard(keys.queue("d")) == 1              # the sibling is stored
            # The lease runs out (1 s); another node's call takes the parent back.
            other = AsyncFrontier(redis, "closing", "n2", lease_ttl=10,
                                  politeness=frontier.politeness, partition=0, partitions=2)
            taken = []
            async with asyncio.timeout(30):
                while parent.member not in taken:
                    taken += [m for m, _ in (await other.sync(Batch(take=10))).taken]
                    await asyncio.sleep(0.05)

    asyncio.run(main())


def test_while_a_partition_is_down_the_acks_that_do_not_need_it_are_stored(redis_url):
    """Two partitions, the second one's Redis unreachable mid-crawl: request b's
    link went there and waits, so b's ack waits; request a's links all went to
    the first partition, so a's ack is stored now (with lineage; before, every
    ack after b's link waited for the second partition to answer)."""
    async def main():
        seeds = ['{"url": "http://d/a"}', '{"url": "http://d/b"}']
        async with half_down(redis_url, "lineage", seeds,
                             lease_ttl=60) as (fc, frontier, _shared, _):
            # A client of the test's own: the frontier closes its pools' idle
            # connections after each failed call (the down partition's).
            import redis.asyncio as aioredis
            redis = aioredis.Redis.from_url(redis_url)
            keys = frontier.keys
            await until(lambda: len(fc.buffer) == 2)
            a, b = fc.next(), fc.next()
            fc.add('{"url": "http://a/from-b"}', None, 0, 0, "a", parent=b.member)  # down
            fc.add('{"url": "http://d/from-a"}', None, 0, 0, "d", parent=a.member)
            fc.ack(b.member)
            fc.ack(a.member)
            async with asyncio.timeout(10):
                while await redis.hexists(keys.payloads, a.member):
                    await asyncio.sleep(0.02)
            assert await redis.hexists(keys.payloads, b.member)     # b's link is not stored
            stored = await redis.hvals(keys.payloads)
            assert sum(b"from-a" in v for v in stored) == 1            # a's is
            await redis.aclose()

    asyncio.run(main())


def test_an_idle_node_calls_its_partitions_at_idle_pace(redis_url):
    """Real Redis, 4 partitions, nothing queued: each partition is called about
    once per idle poll (0.2 s here; docs/scaling.md counts on it), not at every
    turn of the loop (its flush interval, 0.05 s, while the buffer is empty:
    the old code made 150 calls in the 2 s), nor as soon as its last call
    answered (thousands). An upper bound: a slow machine only makes fewer."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.queue import AsyncFrontier

    async def main():
        redis = aioredis.Redis.from_url(redis_url)
        politeness = PolitenessConfig(partitions=4)
        frontiers = [AsyncFrontier(redis, "idle", "n1", lease_ttl=10, politeness=politeness,
                                   partition=p, partitions=4) for p in range(4)]
        calls = []
        for frontier in frontiers:
            original = frontier.sync

            async def sync(batch=None, *, leaving=False, _original=original, _p=frontier):
                calls.append(_p.keys.partition)
                return await _original(batch, leaving=leaving)
            frontier.sync = sync
        fc = FrontierClient(frontiers, politeness, accept=lambda p, m, payload: payload,
                            before_tick=lambda: None, count=lambda name, value: None,
                            outage=_CountingOutage(), log_extra={}, prefetch=8,
                            batch_size=100, flush_interval=0.05, min_sync_interval=0.02,
                            idle_poll=0.2, heartbeat=2, lease_ttl=10)
        fc.start()
        try:
            await until(lambda: len(set(calls)) == 4)    # every partition answered once
            start, before = time.monotonic(), len(calls)
            await asyncio.sleep(2.0)                     # the window observed
            elapsed, made = time.monotonic() - start, len(calls) - before
        finally:
            fc.paused = True
            await fc.close()
            await redis.aclose()
        assert made <= 4 * (elapsed / 0.2 + 2), made

    asyncio.run(main())


class _RecordingOutage:
    def __init__(self):
        self.calls = []                      # (exception, refused)

    def failed(self, what, exc, extra=None, source="", refused=False):
        self.calls.append((exc, refused))

    def ok(self, extra=None, source=""):
        pass


def test_a_call_stopped_by_a_junk_key_loses_no_request_once_the_key_is_mended(redis_url):
    """Real Redis: junk in a frontier key stops the node's call inside the
    script after the Bloom filter took the new request (a script is not rolled
    back). The node says Redis refuses its calls (not that it is down), checks
    every key before writing on its next calls (refused with BADKEY, naming the
    key), and once the key is mended its request is queued and handed out: not
    dropped as a duplicate of itself."""
    async def main():
        outage, counts = _RecordingOutage(), {}

        def count(name, value):
            counts[name] = counts.get(name, 0) + value
        async with real_client(redis_url, "junkkey", 4, 0, outage=outage, count=count,
                               flush_interval=0.05, min_sync_interval=0.05,
                               idle_poll=0.2) as (fc, frontier, _):
            # A client of the test's own: after a refused call the frontier
            # closes its pool's idle connections, which may be one a shared
            # client is just about to use (seen on a loaded machine).
            import redis.asyncio as aioredis
            client = aioredis.Redis.from_url(redis_url)
            await client.set(frontier.keys.payloads, "junk")
            fc.add('{"url": "http://h/new"}', b"\x01" * 20, 0, 0, "h")
            await until(lambda: any(str(e).startswith("BADKEY") for e, _ in outage.calls),
                        timeout=30)
            first, refusal = outage.calls[0][0], next(
                e for e, _ in outage.calls if str(e).startswith("BADKEY"))
            assert "WRONGTYPE" in str(first)
            assert str(refusal).startswith(f"BADKEY {frontier.keys.payloads} is a string")
            assert all(refused for _, refused in outage.calls)
            assert counts["scheduler/calls_stopped_in_script"] == 1
            assert counts["scheduler/refused_calls"] == len(outage.calls)
            await client.delete(frontier.keys.payloads)
            got = []

            def taken():
                entry = fc.next()
                if entry is not None:
                    got.append(entry)
                return bool(got)
            await until(taken, timeout=30)
            assert got[0].item == b'{"url": "http://h/new"}'
            assert [s.check for s in fc.parts] == [False]
            await client.aclose()

    asyncio.run(main())


def test_junk_read_back_is_counted_and_said_once_a_minute(redis_url, caplog):
    """Real Redis: a budget key of the wrong type stopped every call that added
    a new page (every site of the partition); junk in a key's state and a
    refused late-send report went unsaid. The node goes on, counts each
    (``scheduler/budget_skipped``, ``scheduler/state_junk``,
    ``politeness/sent_refused``) and logs each kind once a minute at most."""
    import logging

    from crawlproject.frontier.sitelimits import Limits

    async def main():
        counts = {}

        def count(name, value):
            counts[name] = counts.get(name, 0) + value
        async with real_client(redis_url, "junkread", 4, 0, count=count, flush_interval=0.05,
                               min_sync_interval=0.02, idle_poll=0.05, idle_poll_max=0.1,
                               heartbeat=0.2) as (fc, frontier, client):
            await frontier.set_limits({"h": Limits(0, 4, budget=1000)})   # budgets apply
            await client.set(frontier.keys.budget, "junk")
            got = []

            def taken(n):
                while (entry := fc.next()) is not None:
                    got.append(entry)
                return len(got) >= n
            for i in range(3):
                fc.add('{"url": "http://h/%d"}' % i, b"\x01" * 19 + bytes([i]), 0, 0, "h")
                await until(lambda: taken(i + 1), timeout=30)   # each stored and handed out
            assert counts["scheduler/budget_skipped"] == 3
            # A state with junk, read by the call that acks the key's entry.
            await client.hset(frontier.keys.kstate, "h", "0|0|0|0|0|x")
            fc.ack(got[0].member)
            await until(lambda: counts.get("scheduler/state_junk"), timeout=30)
            # A late send reported for an entry no longer leased to this node.
            await client.hset(frontier.keys.inflight, got[1].member, "someone-else")
            fc.sent_late(got[1], time.monotonic())
            await until(lambda: counts.get("politeness/sent_refused"), timeout=30)
            fc.sent_late(got[1], time.monotonic())
            await until(lambda: counts.get("politeness/sent_refused") == 2, timeout=30)

    with caplog.at_level(logging.WARNING, logger="crawlproject.frontier.client"):
        asyncio.run(main())
    said = [r for r in caplog.records if r.name == "crawlproject.frontier.client"]
    budget = [r for r in said if "budgets of its partition are not counted" in r.getMessage()]
    assert len(budget) == 1 and budget[0].levelname == "ERROR"
    assert "{junkread}:budget" in budget[0].getMessage()
    assert len([r for r in said if "held junk" in r.getMessage()]) == 1
    assert len([r for r in said if "late-send report(s) refused" in r.getMessage()]) == 1
