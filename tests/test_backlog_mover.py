"""The MongoDB tier's spill and refill (crawlproject/frontier/mover.py, lua/move/)
against a real redis-server and the MongoDB-wire server: entries come back in
order with their payloads, counts stay right, and at every step boundary each
member is in exactly one place (its queue, the moving set, a live MongoDB
document, or queued again and recorded as refilled); a mover that dies at any
boundary is finished by the next, a stale one cannot commit, and MongoDB
stopped mid-refill loses nothing.

Entries are added through the real SYNC (Frontier.sync) and taken back with it.
Redis here runs without an AOF (6.2: no WAITAOF), so the movers' settle delay
is 0. A lease's expiry is made by the second mover's clock (an hour later),
except in the stale-mover test, where a short lease really expires."""

from __future__ import annotations

import asyncio
import json

import pymongo
import pytest
import redis.asyncio as aioredis

from crawlproject.frontier.backlog import Backlog, BacklogConfig, BacklogUnavailable
from crawlproject.frontier.mover import Mover, StaleMove
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.keys import FrontierKeys
from devtools.services import MongoServer

KEY = "a.example"
OTHER = "b.example"
HOUR_MS = 3600 * 1000


def fill(redis, n: int, key: str = KEY, start: int = 0) -> list[tuple[str, bytes]]:
    """*n* entries of *key* through SYNC, priorities mixed; returns
    ``(member, payload)`` in queue order (priority desc, then arrival)."""
    frontier = Frontier(redis, "shop", "filler")
    batch = Batch()
    for i in range(start, start + n):
        batch.add(json.dumps({"url": f"http://{key}/{i}"}), f"{key}/{i}".encode(),
                  priority=(i * 7) % 3 - 1, key=key)
    assert frontier.sync(batch).added == n
    members = [m.decode() for m in redis.zrange(f"{{shop}}:q:{key}", 0, -1)]
    payloads = redis.hmget("{shop}:payloads", members)
    return list(zip(members, payloads))


def redis_ms(redis) -> int:
    sec, usec = redis.time()
    return sec * 1000 + usec // 1000


def state(redis, mongo_db, key: str = KEY) -> dict:
    keys = FrontierKeys("shop")
    live = {d["m"] for d in mongo_db["frontier_backlog"].find(
        {"s": "shop", "k": key, "pl": {"$exists": True}})}
    return {
        "queue": [m.decode() for m in redis.zrange(keys.queue(key), 0, -1)],
        "moving": {m.decode() for m in redis.zrange(keys.moving(key), 0, -1)},
        "refilled": {m.decode() for m in redis.smembers(keys.refilled(key))},
        "mongo": live,
        "payloads": {m.decode() for m in redis.hkeys(keys.payloads)},
    }


def check_invariant(redis, mongo_db, members: list[str], key: str = KEY) -> dict:
    """Each of *members* is in exactly one of: its queue; the moving set (a
    MongoDB copy may exist: spill 2->3); a live MongoDB document; the queue and
    the refilled record (a live copy may remain: refill 2->3). Payloads exist
    exactly for the members in Redis; the counts match."""
    s = state(redis, mongo_db, key)
    queue = set(s["queue"])
    assert len(queue) == len(s["queue"])
    for m in members:
        places = (m in queue, m in s["moving"], m in s["mongo"], m in s["refilled"])
        assert places in {(True, False, False, False),       # queued
                          (False, True, False, False),       # leaving
                          (False, True, True, False),        # leaving, written
                          (False, False, True, False),       # in MongoDB
                          (True, False, True, True),         # refilled, copy live
                          (True, False, False, True)}, (m, places)
        assert (m in s["payloads"]) == (m in queue or m in s["moving"]), m
    # nothing else hides in the key's sets
    assert queue | s["moving"] | s["refilled"] <= set(members)
    keys = FrontierKeys("shop")
    in_mongo_only = s["mongo"] - s["moving"] - s["refilled"]
    assert int(redis.zscore(keys.backlog, key) or 0) == len(in_mongo_only)
    kstate = redis.hgetall(keys.kstate)
    assert int(kstate.get(b"||backlog", 0)) == int(sum(
        score for _, score in redis.zrange(keys.backlog, 0, -1, withscores=True)))
    # '||qlen': every entry with a payload (none is in flight or delayed here)
    assert int(kstate[b"||qlen"]) == redis.hlen(keys.payloads)
    return s


def take_all(redis, n: int) -> list[tuple[str, bytes]]:
    """Everything takeable, through SYNC (no politeness: one call)."""
    return Frontier(redis, "shop", "taker").take(n)


class Movers:
    """Backlogs and movers on the test's servers, made and closed in one event loop."""

    def __init__(self, redis_url: str, mongo_uri: str, database: str, timeout: float = 10):
        self.redis_url, self.config = redis_url, BacklogConfig(uri=mongo_uri, database=database,
                                                               timeout=timeout)
        self.open: list = []

    async def backlog(self) -> Backlog:
        backlog = Backlog.from_config(self.config, "shop")
        await backlog.open()
        self.open.append(backlog)
        return backlog

    async def mover(self, node: str, **options) -> Mover:
        client = aioredis.Redis.from_url(self.redis_url)
        mover = Mover(client, await self.backlog(), FrontierKeys("shop"), node, settle=0,
                      **options)
        self.open.append(mover)
        self.open.append(client)
        return mover

    async def close(self) -> None:
        for thing in reversed(self.open):
            await thing.close() if not hasattr(thing, "aclose") else await thing.aclose()


def run(redis_url, mongo_uri, database, body, **options):
    async def main():
        movers = Movers(redis_url, mongo_uri, database, **options)
        try:
            return await body(movers)
        finally:
            await movers.close()

    return asyncio.run(main())


def test_spill_then_refill_brings_every_member_back_in_order(redis, redis_url, mongo_uri,
                                                             mongo_db):
    entries = fill(redis, 40)
    others = fill(redis, 3, key=OTHER, start=100)
    members = [m for m, _ in entries]
    seen = {}

    async def body(movers):
        mover = await movers.mover("n1", batch=16)
        spilled = await mover.spill(KEY, window=10)
        seen["after spill"] = check_invariant(redis, mongo_db, members)
        seen["counts"] = redis.hmget("{shop}:kstate", "||qlen", "||backlog")
        seen["again"] = await mover.spill(KEY, window=10)       # within the window: idle
        first = await mover.refill(KEY, want=30)                 # one batch of 16
        seen["after one refill"] = check_invariant(redis, mongo_db, members)
        second = await mover.refill(KEY, want=30)
        seen["after refill"] = check_invariant(redis, mongo_db, members)
        seen["empty"] = await mover.refill(KEY, want=30)
        # the same members spilled again (their tombstones revived) and back again
        seen["respill"] = await mover.spill(KEY, window=10)
        seen["respilled"] = check_invariant(redis, mongo_db, members)
        seen["back"] = [await mover.refill(KEY, want=30) for _ in range(2)]
        return spilled, first, second

    spilled, first, second = run(redis_url, mongo_uri, mongo_db.name, body)
    assert (spilled.spilled, spilled.leftovers, spilled.busy) == (30, 0, False)
    after = seen["after spill"]
    assert after["queue"] == members[:10]            # the best-ranked ten stay
    assert after["mongo"] == set(members[10:])
    assert seen["counts"] == [b"13", b"30"]
    assert seen["again"].spilled == 0
    # the head of the backlog comes back first, in queue order
    assert (first.refilled, first.tombstoned) == (16, 16)
    assert seen["after one refill"]["queue"] == members[:26]
    assert (second.refilled, second.tombstoned, second.skipped) == (14, 14, 0)
    assert seen["after refill"]["queue"] == members
    assert seen["after refill"]["mongo"] == set() and seen["after refill"]["refilled"] == set()
    assert seen["empty"].refilled == 0
    assert seen["respill"].spilled == 30 and seen["respilled"]["mongo"] == set(members[10:])
    assert [r.refilled for r in seen["back"]] == [16, 14]
    assert redis.hget("{shop}:kstate", "||qlen") == b"43"
    assert redis.hget("{shop}:kstate", "||backlog") == b"0"
    assert redis.zcard("{shop}:backlog") == 0 and not redis.hexists("{shop}:mover", KEY)
    assert redis.zscore("{shop}:ready", KEY) is not None
    # SYNC takes them, payloads as they were added, in queue order
    taken = take_all(redis, 100)
    assert [(m, p) for m, p in taken if m.endswith("@" + KEY)] == entries
    assert sorted(m for m, _ in taken if m.endswith("@" + OTHER)) == sorted(
        m for m, _ in others)
    # tombstones, not deletes: a late spill of these members would write nothing
    assert mongo_db["frontier_backlog"].count_documents({"s": "shop", "at": {"$exists": True}}) \
        == 30


SPILL_STEPS = ["claim", "write"]
REFILL_STEPS = ["read", "commit", "tombstone"]


@pytest.mark.parametrize("move,boundary", [("spill", s) for s in SPILL_STEPS]
                         + [("refill", s) for s in REFILL_STEPS])
def test_a_mover_dead_at_a_step_boundary_is_finished_by_the_next(
        move, boundary, redis, redis_url, mongo_uri, mongo_db):
    entries = fill(redis, 24)
    members = [m for m, _ in entries]
    out = {}

    async def body(movers):
        if move == "refill":
            first = await movers.mover("n0")
            assert (await first.spill(KEY, window=4)).spilled == 20
        dead = await movers.mover("dead")
        if move == "spill":
            claim = await dead.claim(KEY, "spill", 4)
            assert claim.moved == 20
            if boundary == "write":
                await dead.write_spill(claim)
        else:
            claim = await dead.claim(KEY, "refill")
            read = await dead.read_refill(claim, 12)
            if boundary in ("commit", "tombstone"):
                assert await dead.commit_refill(claim, read) == (12, 0)
            if boundary == "tombstone":
                await dead.tombstone(claim, [e.member for e in read])
        # the node dies here; while its lease lasts no one else moves the key
        out["dead"] = check_invariant(redis, mongo_db, members)
        other = await movers.mover("other")
        out["busy"] = await (other.spill(KEY, window=4) if move == "spill"
                             else other.refill(KEY, want=12))
        assert check_invariant(redis, mongo_db, members) == out["dead"]
        # its lease runs out (the next mover's clock: an hour on)
        later = await movers.mover("next", clock=lambda: redis_ms(redis) + HOUR_MS)
        if move == "spill":
            out["next"] = await later.spill(KEY, window=4)
        else:
            out["next"] = await later.refill(KEY, want=12)
        out["finished"] = check_invariant(redis, mongo_db, members)
        out["all back"] = await later.refill(KEY, want=100)
        out["end"] = check_invariant(redis, mongo_db, members)

    run(redis_url, mongo_uri, mongo_db.name, body)
    assert out["busy"].busy
    nxt = out["next"]
    if move == "spill":
        # the leftovers first (20 in the moving set), then nothing more to move
        assert (nxt.leftovers, nxt.spilled) == (20, 0)
        assert out["finished"]["queue"] == members[:4]
    else:
        # a dead commit's refilled members are tombstoned first, never queued twice
        done_before = 12 if boundary in ("commit", "tombstone") else 0
        assert nxt.leftovers == done_before
        assert nxt.refilled == min(12, 20 - done_before) and nxt.skipped == 0
        assert out["finished"]["queue"] == members[:4 + done_before + nxt.refilled]
    assert out["end"]["queue"] == members
    assert out["end"]["moving"] == out["end"]["refilled"] == out["end"]["mongo"] == set()
    taken = take_all(redis, 100)
    assert taken == entries       # each once, with its payload, in order


def test_a_stale_mover_cannot_commit(redis, redis_url, mongo_uri, mongo_db):
    entries = fill(redis, 20)
    members = [m for m, _ in entries]
    out = {}

    async def body(movers):
        # a spill node paused past its lease: the next mover took the key over
        slow = await movers.mover("slow", lease_ttl=0.2)
        claim = await slow.claim(KEY, "spill", 5)
        written = await slow.write_spill(claim)
        while redis_ms(redis) <= claim.deadline:   # the lease runs out (Redis time)
            await asyncio.sleep(0.02)
        with pytest.raises(StaleMove, match="expired"):
            await slow.commit_spill(claim, written, release=True)
        fast = await movers.mover("fast")
        took = await fast.claim(KEY, "spill", 5)
        assert [m for m, _, _ in took.moving] == written and took.moved == 0
        with pytest.raises(StaleMove, match="taken over"):
            await slow.commit_spill(claim, written, release=True)
        out["refused"] = check_invariant(redis, mongo_db, members)
        await fast.commit_spill(took, await fast.write_spill(took), release=True)
        # a refill node paused after its read: its commit would queue them twice
        claim = await slow.claim(KEY, "refill")
        read = await slow.read_refill(claim, 10)
        while redis_ms(redis) <= claim.deadline:
            await asyncio.sleep(0.02)
        out["fast refill"] = await fast.refill(KEY, want=10)
        with pytest.raises(StaleMove):
            await slow.commit_refill(claim, read)
        out["end"] = check_invariant(redis, mongo_db, members)
        return movers

    run(redis_url, mongo_uri, mongo_db.name, body)
    assert out["refused"]["moving"] == set(members[5:])
    assert out["fast refill"].refilled == 10
    assert out["end"]["queue"] == members[:15]
    stats = redis.hgetall("{shop}:stats")
    assert b"qlen_recounted" not in stats


@pytest.fixture
def own_mongo(tmp_path):
    """A MongoDB-wire server this test may kill and start again."""
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    yield server
    server.kill()


def test_mongodb_stopped_mid_refill_loses_nothing_and_a_retry_finishes(
        redis, redis_url, own_mongo):
    entries = fill(redis, 20)
    members = [m for m, _ in entries]
    out = {}

    async def body(movers):
        def set_timeout(seconds):
            for backlog in movers.open:
                if isinstance(backlog, Backlog):
                    backlog.timeout = seconds

        mover = await movers.mover("n1")
        assert (await mover.spill(KEY, window=5)).spilled == 15
        claim = await mover.claim(KEY, "refill")
        read = await mover.read_refill(claim, 10)
        await mover.commit_refill(claim, read)
        own_mongo.kill()
        set_timeout(0.5)
        with pytest.raises(BacklogUnavailable):
            await mover.tombstone(claim, [e.member for e in read])
        with pytest.raises(BacklogUnavailable):
            await mover.refill(KEY, want=10)     # the retry while it is down
        # nothing lost meanwhile: the ten are queued and still recorded as refilled
        out["down"] = ([m.decode() for m in redis.zrange("{shop}:q:" + KEY, 0, -1)],
                       {m.decode() for m in redis.smembers("{shop}:refilled:" + KEY)})
        own_mongo.start()
        set_timeout(10)   # the outage is over: a loaded machine may be slow
        out["retry"] = await mover.refill(KEY, want=10)
        out["rest"] = await mover.refill(KEY, want=10)
        # a spill while MongoDB is down: its members wait in the moving set
        own_mongo.kill()
        set_timeout(0.5)
        with pytest.raises(BacklogUnavailable):
            await mover.spill(KEY, window=5)
        out["spill down"] = ([m.decode() for m in redis.zrange("{shop}:q:" + KEY, 0, -1)],
                             [m.decode() for m in redis.zrange("{shop}:moving:" + KEY, 0, -1)],
                             redis.hlen("{shop}:payloads"))
        own_mongo.start()
        set_timeout(10)
        out["spill retry"] = await mover.spill(KEY, window=5)
        out["back"] = await mover.refill(KEY, want=100)

    run(redis_url, own_mongo.uri, "outage", body)
    client = pymongo.MongoClient(own_mongo.uri)
    try:
        db = client["outage"]
        assert out["down"] == (members[:15], set(members[5:15]))
        assert out["retry"].leftovers == 10 and out["retry"].refilled == 5
        assert out["spill down"] == (members[:5], members[5:], 20)
        assert (out["spill retry"].leftovers, out["spill retry"].spilled) == (15, 0)
        assert out["back"].refilled == 15
        check_invariant(redis, db, members)
        assert state(redis, db)["queue"] == members
        assert take_all(redis, 100) == entries
    finally:
        client.close()


def test_a_refilled_key_is_ready_again_and_one_in_flight_is_not_queued_twice(
        redis, redis_url, mongo_uri, mongo_db):
    entries = fill(redis, 6)
    members = [m for m, _ in entries]
    out = {}

    async def body(movers):
        mover = await movers.mover("n1")
        assert (await mover.spill(KEY, window=1)).spilled == 5
        # the one left is taken: in flight; the take that finds the queue empty
        # takes the key out of the ready set
        out["taken"] = take_all(redis, 10)
        out["taken again"] = take_all(redis, 10)
        out["ready before"] = redis.zscore("{shop}:ready", KEY)
        # a copy of the entry in flight reaches MongoDB (a spill node paused
        # past its lease and past the tombstone's hour)
        first = entries[0]
        await (await movers.backlog()).spill(0, KEY, [(first[0], -2**40, first[1])], epoch=1)
        out["refill"] = await mover.refill(KEY, want=10)

    run(redis_url, mongo_uri, mongo_db.name, body)
    assert out["taken"] == entries[:1] and out["taken again"] == []
    assert out["ready before"] is None
    assert (out["refill"].refilled, out["refill"].skipped, out["refill"].tombstoned) == (5, 1, 6)
    assert redis.zscore("{shop}:ready", KEY) is not None      # ready again
    assert [m.decode() for m in redis.zrange("{shop}:q:" + KEY, 0, -1)] == members[1:]
    assert take_all(redis, 10) == entries[1:]                  # the one in flight not again


def test_settings_are_read_once_and_bad_ones_refused(redis_url):
    from scrapy.settings import Settings

    client = aioredis.Redis.from_url(redis_url)
    settings = Settings({"FRONTIER_BACKLOG_LEASE_TTL": "5", "FRONTIER_BACKLOG_SETTLE": "0.5",
                         "FRONTIER_REFILL_BATCH": "64"})
    mover = Mover.from_settings(settings, client, None, FrontierKeys("shop"), "n1")
    assert (mover.lease_ms, mover.settle, mover.batch) == (5000, 0.5, 64)
    with pytest.raises(ValueError, match="LEASE_TTL"):
        Mover(client, None, FrontierKeys("shop"), "n1", lease_ttl=0)


def test_a_move_waits_the_settle_only_where_redis_keeps_an_aof(redis_url, tmp_path):
    """Without WAITAOF (6.2, 7.0) a move waits FRONTIER_BACKLOG_SETTLE for its
    commit to reach the AOF; a Redis without an AOF is not waited on (nothing
    to wait for: the settle only stalled every move, bench.spill)."""
    from devtools.services import RedisServer

    async def on_disk(url: str, settle: float) -> tuple[float, bool | None]:
        client = aioredis.Redis.from_url(url)
        mover = Mover(client, None, FrontierKeys("shop"), "n1", settle=settle)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await asyncio.wait_for(mover._on_disk(), 10)
            return loop.time() - began, mover._waitaof
        finally:
            await mover.close()
            await client.aclose()

    seconds, _ = asyncio.run(on_disk(redis_url, 30))   # the suite's Redis: no AOF
    assert seconds < 10
    server = RedisServer(data_dir=tmp_path, appendonly=True)
    server.start()
    try:
        seconds, waitaof = asyncio.run(on_disk(server.url, 0.3))
    finally:
        server.stop()
    if not waitaof:       # (Redis >= 7.2 proves it with WAITAOF instead)
        assert seconds >= 0.3


def test_documents_that_are_no_entries_are_tombstoned_and_the_rest_refilled(
        redis, redis_url, mongo_uri, mongo_db):
    """MongoDB is written by others too: documents of the key's range with a
    field missing or of the wrong type are tombstoned and counted, never
    raised on (which would stop the key's refills for ever); the key's real
    entries behind them come back, every one."""
    entries = fill(redis, 12)
    members = [m for m, _ in entries]
    seen, stats = {}, {}

    class Stats:
        def inc_value(self, name, n=1):
            stats[name] = stats.get(name, 0) + n

    async def body(movers):
        mover = await movers.mover("n1", batch=16)
        mover.backlog.stats = Stats()
        assert (await mover.spill(KEY, window=2)).spilled == 10
        # ahead of the real ones in the range (lowest scores), three of junk
        mongo_db["frontier_backlog"].insert_many([
            {"_id": "junk1", "s": "shop", "p": 0, "k": KEY, "sc": -2**62, "m": 7, "pl": b"x"},
            {"_id": "junk2", "s": "shop", "p": 0, "k": KEY, "sc": -2**62 + 1, "m": "a"},
            {"_id": "junk3", "s": "shop", "p": 0, "k": KEY, "sc": -2**62 + 2, "m": "a",
             "pl": {"y": 1}}])
        seen["first"] = await mover.refill(KEY, want=2)   # a read of junk alone first
        seen["rest"] = await mover.refill(KEY, want=16)

    run(redis_url, mongo_uri, mongo_db.name, body)
    # (the first read of 2 met junk only, tombstoned it and read on)
    assert seen["first"].refilled >= 1 and seen["first"].refilled + seen["rest"].refilled == 10
    assert stats.get("frontier/backlog/junk") == 3
    assert mongo_db["frontier_backlog"].count_documents({"_id": {"$in": ["junk1", "junk2",
                                                                         "junk3"]},
                                                         "sc": {"$exists": True}}) == 0
    assert [m.decode() for m in redis.zrange(f"{{shop}}:q:{KEY}", 0, -1)] == members
    assert redis.zcard("{shop}:backlog") == 0 and redis.hget("{shop}:kstate", "||backlog") == b"0"


def test_a_count_of_documents_deleted_outside_the_crawl_is_cleared(redis, redis_url, mongo_uri,
                                                                    mongo_db):
    """Someone deleted the key's documents: Redis still counts them, so the
    key would be refilled, and no node idle, for ever. A read that finds none
    clears the count (fenced, counted, said)."""
    fill(redis, 12)
    seen, stats = {}, {}

    class Stats:
        def inc_value(self, name, n=1):
            stats[name] = stats.get(name, 0) + n

    async def body(movers):
        mover = await movers.mover("n1", batch=16)
        mover.stats = Stats()
        assert (await mover.spill(KEY, window=2)).spilled == 10
        seen["counted"] = redis.zscore("{shop}:backlog", KEY)
        mongo_db["frontier_backlog"].delete_many({"s": "shop", "k": KEY})
        seen["refill"] = await mover.refill(KEY, want=16)

    run(redis_url, mongo_uri, mongo_db.name, body)
    assert seen["counted"] == 10 and seen["refill"].refilled == 0
    assert redis.zcard("{shop}:backlog") == 0 and redis.hget("{shop}:kstate", "||backlog") == b"0"
    assert stats == {"frontier/backlog/lost": 10}
    assert not redis.hexists("{shop}:mover", KEY)
