"""FrontierClient: its batching rules (calls built, not sent) and, on real Redis, how
promptly its loop takes what the engine needs next."""

import asyncio
import contextlib

from crawlproject.frontier.client import MAX_CALL_ADDS, FrontierClient
from crawlproject.frontier.politeness import PolitenessConfig


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
    """Build one round of calls as _tick does; mark them sent (or failed)."""
    calls = {p: client._next_batch(p) for p in partitions}
    client._attach_acks(calls)
    for p, batch in calls.items():
        if p in fail:
            client._requeue(p, batch)
        else:
            for _ in range(len(batch.adds)):
                client._unsent[p].popleft()
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

    def ok(self, extra=None):
        pass


@contextlib.asynccontextmanager
async def real_client(redis_url, spider, concurrency, entries, **pauses):
    """A started FrontierClient on real Redis, with *entries* requests queued
    for key "h" (limit *concurrency*); every pause of its loop is a minute
    unless *pauses* says otherwise. Yields (client, frontier, redis)."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.politeness import Limits
    from crawlproject.frontier.queue import AsyncFrontier, Batch

    redis = aioredis.Redis.from_url(redis_url)
    politeness = PolitenessConfig(default=Limits(0, concurrency), margin=0.0)
    frontier = AsyncFrontier(redis, spider, "n1", lease_ttl=120, politeness=politeness)
    seed = Batch()
    for i in range(entries):
        seed.add('{"url": "http://h/%d"}' % i, None, 0, 0, "h")
    await frontier.sync(seed)
    settings = {"flush_interval": 60, "min_sync_interval": 60, "idle_poll": 60,
                "heartbeat": 60, **pauses}
    fc = FrontierClient([frontier], politeness, accept=lambda p, m, payload: payload,
                        before_tick=lambda: None, count=lambda name, value: None,
                        outage=_Outage(), log_extra={}, prefetch=8, batch_size=100,
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
    from crawlproject.services import free_port

    failures, counts = [], {}

    class Outage:
        def failed(self, what, exc, extra=None):
            failures.append(type(exc).__name__)

        def ok(self, extra=None):
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
            fc._closing = True
            fc._task.cancel()
            await asyncio.gather(fc._task, return_exceptions=True)
            await redis.aclose()

    asyncio.run(scenario())
    assert "scheduler/loop_errors" not in counts
    assert failures[:2] == ["RedisClusterException"] * 2
