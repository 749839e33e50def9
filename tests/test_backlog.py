"""The frontier's MongoDB tier (crawlproject/frontier/backlog.py) against the
real MongoDB-wire server of the tests: per-key order by priority then
arrival, idempotent spills (a duplicate key counts as written), tombstones,
counts, spiders apart in one collection, and an outage that raises
BacklogUnavailable and loses nothing."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from scrapy.settings import Settings

from crawlproject.connection import mongo_client
from crawlproject.frontier import backlog as backlog_module
from crawlproject.frontier.backlog import (
    INDEX_NAME,
    LIVE_SC,
    TOMBSTONE_TTL,
    Backlog,
    BacklogConfig,
    BacklogError,
    BacklogUnavailable,
    entry_id,
)
from crawlproject.pipelines.writer import Counters
from devtools.services import MongoServer


def run(uri: str, database: str, body, **options):
    """Run ``body(backlog)`` on a fresh Backlog of spider ``shop`` in *database*."""
    config = BacklogConfig(uri=uri, database=database, **options)

    async def main():
        backlog = Backlog.from_config(config, "shop", stats=Counters())
        try:
            await backlog.open()
            return await body(backlog)
        finally:
            await backlog.close()

    return asyncio.run(main())


SHIFT = 2 ** 40
COLLECTION = "frontier_backlog"


def entries(pairs, key="a.example"):
    """(member, score, payload) for each (priority, seq) in *pairs*, as Redis scores them."""
    return [(f"{pri}:{seq}@{key}", -pri * SHIFT + seq, f"request {seq}".encode())
            for pri, seq in pairs]


def pri_seq(entry):
    pri, seq = entry.member.split("@")[0].split(":")
    return int(pri), int(seq)


def test_peek_returns_a_keys_entries_by_priority_then_arrival(mongo_uri, mongo_db):
    # arrival (seq) deliberately not in order of writing, priorities mixed, negative too
    a = entries([(0, 5), (10, 7), (0, 1), (-3, 2), (10, 3), (0, 4), (5, 9)])
    b = entries([(99, 6), (0, 8)], key="b.example")
    c = entries([(50, 10)])   # the same key in another partition

    async def body(backlog):
        assert await backlog.spill(0, "a.example", a[:4], epoch=1) == 4
        assert await backlog.spill(0, "b.example", b, epoch=1) == 2
        assert await backlog.spill(0, "a.example", a[4:], epoch=1) == 3
        assert await backlog.spill(1, "a.example", c, epoch=1) == 1
        first = await backlog.peek(0, "a.example", 3)
        return (first, await backlog.peek(0, "a.example", 100),
                await backlog.peek(0, "b.example", 100))

    first, every, other = run(mongo_uri, mongo_db.name, body)
    order = [(10, 3), (10, 7), (5, 9), (0, 1), (0, 4), (0, 5), (-3, 2)]
    assert [pri_seq(e) for e in every] == order
    assert [pri_seq(e) for e in first] == order[:3]   # the limit
    # keys and partitions don't mix: b's priority-99 entry never shows in a's range
    assert [(e.key, pri_seq(e)) for e in other] == [("b.example", (99, 6)),
                                                      ("b.example", (0, 8))]
    top = every[0]
    assert (top.id, top.member, top.partition, top.score, top.payload) == (
        entry_id("shop", 0, "10:3@a.example"), "10:3@a.example", 0, -10 * SHIFT + 3,
        b"request 3")
    assert mongo_db[COLLECTION].count_documents({"s": "shop"}) == 10


def test_peek_is_one_range_scan_of_the_partial_key_index(mongo_uri, mongo_db):
    async def body(backlog):
        await backlog.spill(0, "a.example", entries([(1, 1), (2, 2), (3, 3)]), epoch=1)
        await backlog.tombstone(0, ["3:3@a.example"], epoch=2)

    run(mongo_uri, mongo_db.name, body)
    collection = mongo_db[COLLECTION]
    indexes = collection.index_information()
    index = indexes[INDEX_NAME]
    assert index["key"] == [("s", 1), ("p", 1), ("k", 1), ("sc", 1)]
    assert dict(index["partialFilterExpression"]) == {"sc": LIVE_SC}
    assert indexes["at_ttl"]["expireAfterSeconds"] == TOMBSTONE_TTL
    # peek's own query, unhinted: the planner serves it from the range index
    # (the shape a hint or an $exists clause would turn into a walk or a scan)
    query = {"s": "shop", "p": 0, "k": "a.example", "sc": LIVE_SC}
    plan = str(collection.find(query).sort("sc", 1).limit(2).explain()["queryPlanner"]
               ["winningPlan"])
    assert "IXSCAN" in plan and INDEX_NAME in plan
    # a tombstone has no score: out of the range (and of the partial index)
    tomb = collection.find_one({"_id": entry_id("shop", 0, "3:3@a.example")})
    assert "sc" not in tomb and "pl" not in tomb
    assert [d["m"] for d in collection.find(query).sort("sc", 1)] == ["2:2@a.example",
                                                                     "1:1@a.example"]


def test_an_index_gone_missing_is_built_again_not_scanned_around(mongo_uri, mongo_db, caplog,
                                                                monkeypatch):
    monkeypatch.setattr(backlog_module, "INDEX_CHECK_INTERVAL", 0.0)   # checked at every read

    async def body(backlog):
        await backlog.spill(0, "a.example", entries([(1, 1), (2, 2)]), epoch=1)
        mongo_db[COLLECTION].drop_index(INDEX_NAME)   # an operator's mistake
        return [pri_seq(e)[1] for e in await backlog.peek(0, "a.example", 5)]

    assert run(mongo_uri, mongo_db.name, body) == [2, 1]
    assert INDEX_NAME in mongo_db[COLLECTION].index_information()
    assert "creating it" in caplog.text


def test_a_spill_retried_after_a_crash_stores_each_entry_once(mongo_uri, mongo_db):
    batch = entries([(0, seq) for seq in range(1, 21)])

    async def body(backlog):
        first = await backlog.spill(3, "a.example", batch[:12], epoch=1)  # the crash: half
        retry = await backlog.spill(3, "a.example", batch, epoch=1)       # the retry: all
        again = await backlog.spill(3, "a.example", batch, epoch=1)
        return first, retry, again, backlog.stats

    first, retry, again, stats = run(mongo_uri, mongo_db.name, body)
    assert (first, retry, again) == (12, 8, 0)
    collection = mongo_db[COLLECTION]
    assert collection.count_documents({}) == 20
    assert collection.count_documents({"s": "shop", "p": 3, "k": "a.example"}) == 20
    assert stats["frontier/backlog/spilled"] == 20


def test_a_retry_racing_its_first_try_stores_each_entry_once(mongo_uri, mongo_db):
    # a spill timed out on the node while MongoDB still runs it: the retry overlaps it
    batch = entries([(0, seq) for seq in range(1, 101)])

    async def body(backlog):
        return await asyncio.gather(*(backlog.spill(0, "a.example", batch, epoch=1) for _ in range(4)))

    new = run(mongo_uri, mongo_db.name, body)
    assert sum(new) == 100
    assert mongo_db[COLLECTION].count_documents({}) == 100


def test_tombstones_leave_the_range_and_refuse_a_late_spill(mongo_uri, mongo_db):
    a = entries([(0, seq) for seq in range(1, 11)])

    async def body(backlog):
        await backlog.spill(0, "a.example", a, epoch=1)
        await backlog.spill(0, "b.example", entries([(0, 11)], key="b.example"), epoch=1)
        batch = await backlog.peek(0, "a.example", 4)
        done = await backlog.tombstone(0, [e.member for e in batch], epoch=2)
        retried = await backlog.tombstone(0, [e.member for e in batch], epoch=2)
        # a spill node paused past its lease (epoch 1, before the refill's 2)
        # writes the refilled entries again: refused
        late = await backlog.spill(0, "a.example", a[:4], epoch=1)
        purged_young = await backlog.purge_tombstones()
        rest = await backlog.peek(0, "a.example", 100)
        # the same members spilled again by a later move (epoch 3): revived, and
        # a refill node that paused past its lease (epoch 2) leaves them live
        again = await backlog.spill(0, "a.example", a[:2], epoch=3)
        stale = await backlog.tombstone(0, [e.member for e in batch], epoch=2)
        revived = await backlog.peek(0, "a.example", 2)
        purged = await backlog.purge_tombstones(older_than=0)
        return (done, retried, late, purged_young, rest, again, stale, revived, purged,
                backlog.stats)

    done, retried, late, purged_young, rest, again, stale, revived, purged, stats = run(
        mongo_uri, mongo_db.name, body)
    assert (done, retried, late) == (4, 0, 0)
    assert [pri_seq(e)[1] for e in rest] == [5, 6, 7, 8, 9, 10]
    assert (again, stale) == (2, 0)
    assert [pri_seq(e)[1] for e in revived] == [1, 2]
    assert "at" not in mongo_db[COLLECTION].find_one({"m": "0:1@a.example"})   # no TTL on it
    assert (purged_young, purged) == (0, 2)
    assert mongo_db[COLLECTION].count_documents({"k": "b.example"}) == 1
    assert stats["frontier/backlog/tombstoned"] == 4


def test_counts_give_the_total_the_partitions_and_the_largest_keys(mongo_uri, mongo_db):
    async def body(backlog):
        empty = await backlog.counts()
        for n, (key, part) in zip((5, 2, 7, 1), [("a", 0), ("b", 1), ("c", 1), ("d", 2)]):
            await backlog.spill(part, key, entries([(0, s) for s in range(n)], key=key), epoch=1)
        await backlog.tombstone(0, [f"0:0@a"], epoch=2)   # tombstones are not counted
        return empty, await backlog.counts(top=2), await backlog.counts(top=0)

    empty, counts, no_keys = run(mongo_uri, mongo_db.name, body)
    assert (empty.total, empty.partitions, empty.keys) == (0, {}, [])
    assert counts.total == 14
    assert counts.partitions == {0: 4, 1: 9, 2: 1}
    assert counts.keys == [("c", 7), ("a", 4)]
    assert (no_keys.total, no_keys.keys) == (14, [])


def test_spiders_share_the_collection_apart_and_reset_their_own(mongo_uri, mongo_db):
    config = BacklogConfig(uri=mongo_uri, database=mongo_db.name)

    async def main():
        shop, blog = (Backlog.from_config(config, name) for name in ("shop", "blog"))
        try:
            await shop.open()
            await blog.open()
            await shop.spill(0, "a.example", entries([(0, 1)]), epoch=1)
            await blog.spill(0, "a.example", entries([(0, 1), (0, 2)]), epoch=1)
            seen = (len(await shop.peek(0, "a.example", 10)),
                    len(await blog.peek(0, "a.example", 10)))
            return seen, await blog.reset(), len(await shop.peek(0, "a.example", 10))
        finally:
            await shop.close()
            await blog.close()

    assert asyncio.run(main()) == ((1, 2), 2, 1)
    assert mongo_db.list_collection_names() == [COLLECTION]


def test_settings_are_read_once_and_bad_ones_refused(monkeypatch):
    monkeypatch.delenv("MONGO_URI", raising=False)
    monkeypatch.delenv("MONGO_DATABASE", raising=False)
    config = BacklogConfig.from_settings(Settings({
        "MONGO_URI": "mongodb://127.0.0.1:7219/", "MONGO_DATABASE": "crawl",
        "FRONTIER_BACKLOG_WRITE_CONCERN": "2", "FRONTIER_BACKLOG_TIMEOUT": "1.5"}))
    assert (config.enabled, config.uri, config.database, config.write_concern,
            config.timeout) == (True, "mongodb://127.0.0.1:7219/", "crawl", 2, 1.5)
    assert config.collection == "frontier_backlog"
    assert BacklogConfig.from_settings(Settings({"FRONTIER_BACKLOG_ENABLED": "false"})) \
        .enabled is False
    with pytest.raises(ValueError, match="collection name"):
        BacklogConfig(collection="")
    with pytest.raises(ValueError, match="TIMEOUT"):
        BacklogConfig(timeout=0)


def test_a_refusal_is_a_backlog_error_not_an_outage(mongo_uri, mongo_db):
    # A payload MongoDB cannot store (a set is no BSON type): refused, not "unavailable".
    async def body(backlog):
        with pytest.raises(BacklogError) as refused:
            await backlog.spill(0, "a.example", [("0:1@a.example", 1, {1, 2})], epoch=1)
        return refused.value

    error = run(mongo_uri, mongo_db.name, body)
    assert not isinstance(error, BacklogUnavailable)


@pytest.fixture
def own_mongo(tmp_path):
    """A server this test may kill and start again (SIGKILL: a crash, and instant)."""
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    yield server
    server.kill()


def test_mongodb_down_raises_backlog_unavailable_and_loses_nothing(own_mongo, caplog):
    uri, stored = own_mongo.uri, entries([(1, 1), (0, 2), (1, 3)])
    outcome = {}

    async def body(backlog):
        await backlog.spill(0, "a.example", stored, epoch=1)
        own_mongo.kill()   # acknowledged entries must survive a crash of MongoDB
        calls = {"spill": backlog.spill(0, "a.example", entries([(9, 4)]), epoch=1),
                 "peek": backlog.peek(0, "a.example", 10),
                 "tombstone": backlog.tombstone(0, ["1:1@a.example"], epoch=2),
                 "counts": backlog.counts()}
        started = time.monotonic()
        failed = await asyncio.gather(*calls.values(), return_exceptions=True)
        outcome["elapsed"] = time.monotonic() - started
        outcome["failed"] = dict(zip(calls, failed))
        own_mongo.start()
        backlog.timeout = 10   # the outage is over: a loaded machine may be slow
        outcome["retried"] = await backlog.spill(0, "a.example", entries([(9, 4)]), epoch=1)
        outcome["after"] = [pri_seq(e) for e in await backlog.peek(0, "a.example", 10)]
        return backlog.stats

    with caplog.at_level(logging.INFO, logger="crawlproject.frontier.backlog"):
        stats = run(uri, "outage", body, timeout=0.5)
    # bounded by FRONTIER_BACKLOG_TIMEOUT, not pymongo's 10-30 s
    assert outcome["elapsed"] < 5, outcome["elapsed"]
    for name, error in outcome["failed"].items():
        assert isinstance(error, BacklogUnavailable), (name, error)
        assert "does not answer" in str(error), str(error)
        assert "'frontier_backlog'" in str(error), str(error)
    assert outcome["retried"] == 1
    # nothing lost by the failed calls (the tombstone did not happen), the retried spill stored once
    assert outcome["after"] == [(9, 4), (1, 1), (1, 3), (0, 2)]
    assert stats["frontier/backlog/unavailable"] == 4
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1                        # once per outage, not per call
    assert any("answers again" in r.getMessage() for r in caplog.records)
    client = mongo_client(uri, asyncio=False)
    try:
        assert client["outage"][COLLECTION].count_documents({}) == 4
    finally:
        client.close()
