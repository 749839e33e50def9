"""Requests a node keeps to itself (crawlproject/scheduling/local.py), against a
real Redis: never dropped, deduplicated through the cluster's Bloom filter,
kept while Redis is away, handed out by priority."""

import asyncio

import redis.asyncio as aioredis
from scrapy import Request

from crawlproject.frontier.queue import AsyncFrontier
from crawlproject.scheduling.local import SLOT_PREFIX, LocalRequests, strip_slot


def local(frontier, counts, fail=None):
    async def mark_seen(partition, fingerprints):
        if fail and fail[0]:
            raise ConnectionError("Redis away")
        return await frontier.mark_seen(fingerprints)

    return LocalRequests(mark_seen=mark_seen, partition_of=lambda key: 0,
                         slot_for=lambda key: SLOT_PREFIX + key,
                         count=lambda name, n: counts.__setitem__(name, counts.get(name, 0) + n),
                         nudge=lambda: None, log_extra={}, retry_after=0.05)


async def drain(kept, until, timeout=10.0):
    out = []
    deadline = asyncio.get_running_loop().time() + timeout
    while len(out) < until and asyncio.get_running_loop().time() < deadline:
        request = kept.next()
        if request is None:
            await asyncio.sleep(0.01)
        else:
            out.append(request)
    return out


def test_two_nodes_keeping_the_same_request_crawl_it_once(redis_url):
    async def main():
        client = aioredis.Redis.from_url(redis_url)
        frontier = AsyncFrontier(client, "kept-twice", "n")
        counts_a, counts_b = {}, {}
        a, b = local(frontier, counts_a), local(frontier, counts_b)
        for kept in (a, b):
            for n in range(5):
                kept.keep(Request(f"http://127.0.0.1/p{n}", priority=n), f"fp{n}".encode(),
                          "127.0.0.1", "a lambda callback", "not_storable")
        try:
            # Whichever node's filter call comes first crawls them; the other none.
            got = []
            deadline = asyncio.get_running_loop().time() + 10
            while (a.pending() or b.pending()) and asyncio.get_running_loop().time() < deadline:
                got += await drain(a, 5, timeout=0.05) + await drain(b, 5, timeout=0.05)
            assert sorted(r.url for r in got) == [f"http://127.0.0.1/p{n}" for n in range(5)]
            assert counts_a["scheduler/kept_local/not_storable"] == 5
            assert counts_a.get("dupefilter/filtered", 0) + counts_b.get(
                "dupefilter/filtered", 0) == 5
            assert {counts_a.get("dupefilter/filtered"), counts_b.get("dupefilter/filtered")} \
                == {None, 5}
            assert got[0].meta["download_slot"] == SLOT_PREFIX + "127.0.0.1"
            await a.close(), await b.close()
        finally:
            await client.flushall()
            await client.aclose()
    asyncio.run(main())


def test_kept_requests_wait_out_a_redis_outage_then_go_by_priority(redis_url):
    async def main():
        client = aioredis.Redis.from_url(redis_url)
        frontier = AsyncFrontier(client, "kept", "n")
        counts, fail = {}, [True]
        kept = local(frontier, counts, fail)
        for n in range(3):
            kept.keep(Request(f"http://127.0.0.1/p{n}", priority=n), f"fp{n}".encode(),
                      "127.0.0.1", "why", "not_storable")
        kept.keep(Request("http://127.0.0.1/again", dont_filter=True), None, "127.0.0.1",
                  "why", "not_storable")      # no fingerprint: no filter to ask
        try:
            await asyncio.sleep(0.2)
            assert kept.pending() and len(kept) == 4
            assert [r.url for r in await drain(kept, 1)] == ["http://127.0.0.1/again"]
            assert kept.next() is None           # the others still wait for the filter
            fail[0] = False
            got = await drain(kept, 3)
            assert [r.priority for r in got] == [2, 1, 0]
            assert await kept.close() == 0
        finally:
            await client.flushall()
            await client.aclose()
    asyncio.run(main())


def test_a_kept_request_enqueued_again_loses_its_node_slot():
    request = Request("http://127.0.0.1/", meta={"download_slot": SLOT_PREFIX + "h", "depth": 1})
    strip_slot(request)
    assert request.meta == {"depth": 1}
    mine = Request("http://127.0.0.1/", meta={"download_slot": "mine"})
    strip_slot(mine)
    assert mine.meta == {"download_slot": "mine"}
