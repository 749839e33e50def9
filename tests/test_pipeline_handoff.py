"""The Redis handoff of a spool that must outlive its node (real Redis and
MongoDB-wire servers): a node that closes while MongoDB is down hands its
spooled items to a Redis list, any node replays them once MongoDB answers;
with Redis down as well, the local spool stays and the ERROR says so."""

from __future__ import annotations

import asyncio
import uuid

import pymongo
import pytest
import redis.asyncio as aioredis

from crawlproject.keys import FrontierKeys
from crawlproject.pipelines.documents import WriteOp
from crawlproject.pipelines.handoff import RedisHandoff
from crawlproject.pipelines.spool import target_dir
from crawlproject.pipelines.writer import MongoWriter
from devtools.services import MongoServer, free_port
from tests.test_pipeline_mongo import docs, make_pipeline, product, spool_files, store


@pytest.fixture
def own_mongo(tmp_path):
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    yield server
    server.stop()


def handoff_key(uri: str, database: str, spool_dir, spider: str = "shop") -> str:
    return FrontierKeys(spider).mongo_spool(target_dir(spool_dir, uri, database).name)


def test_key_is_in_the_spiders_hash_slot_and_names_the_target():
    key = FrontierKeys("shop").mongo_spool("crawl-0123456789")
    assert key == "{shop}:mongo_spool:crawl-0123456789"


def test_a_closing_node_hands_its_spool_to_redis_and_another_node_replays_it(
        own_mongo, redis, redis_url, tmp_path, caplog):
    uri = own_mongo.uri
    first, stats = make_pipeline(uri, "handoff", tmp_path / "a", MONGO_SPOOL_AFTER=0.5,
                                 MONGO_SPOOL_HANDOFF=True, REDIS_URL=redis_url,
                                 MONGO_BULK_SIZE=15)
    key = handoff_key(uri, "handoff", tmp_path / "a")

    async def during_outage():
        await first.open_spider()
        own_mongo.stop()
        try:
            await asyncio.gather(*(first.process_item(product(i)) for i in range(40)))
            caplog.clear()
        finally:
            await first.close_spider()

    with caplog.at_level("INFO"):
        asyncio.run(during_outage())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "40 items" in errors[0] and key in errors[0]
    assert str(target_dir(tmp_path / "a", uri, "handoff")) in errors[0]
    assert stats.get_value("mongo/spool_handed_off") == 40
    assert stats.get_value("mongo/spool_left_items") == 40
    assert not stats.get_value("mongo/spool_left")
    assert spool_files(tmp_path / "a") == []          # nothing stays on this machine
    assert redis.llen(key) >= 1

    own_mongo.start()
    # Another machine: another spool directory, the same Redis and MongoDB.
    second, stats2 = make_pipeline(uri, "handoff", tmp_path / "b", MONGO_SPOOL_HANDOFF=True,
                                   REDIS_URL=redis_url)
    asyncio.run(store(second, [product(i) for i in range(35, 45)]))
    assert stats2.get_value("mongo/handoff_replayed") == 40
    assert not redis.exists(key)
    client = pymongo.MongoClient(uri)
    try:
        assert len(docs(client["handoff"]["shop"])) == 45
    finally:
        client.close()


def test_with_redis_down_too_the_local_spool_stays_and_the_error_says_so(own_mongo, tmp_path,
                                                                        caplog):
    dead_redis = f"redis://:topsecret@127.0.0.1:{free_port()}/0"
    pipeline, stats = make_pipeline(own_mongo.uri, "both", tmp_path / "spool",
                                    MONGO_SPOOL_AFTER=0.5, MONGO_SPOOL_HANDOFF=True,
                                    REDIS_URL=dead_redis)

    async def run():
        await pipeline.open_spider()
        own_mongo.stop()
        try:
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(25)))
            caplog.clear()
        finally:
            await pipeline.close_spider()

    with caplog.at_level("INFO"):
        asyncio.run(run())
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, errors
    assert "25 items" in errors[0] and str(pipeline.spool.directory) in errors[0]
    assert "Redis" in errors[0] and "topsecret" not in errors[0]
    assert stats.get_value("mongo/spool_left_items") == 25
    assert not stats.get_value("mongo/spool_handed_off")
    assert sum(len(p.read_text().splitlines()) for p in spool_files(tmp_path / "spool")) == 25


def ops(n: int, database: str) -> list[WriteOp]:
    return [WriteOp.build(database, "shop", "url", {"url": f"http://x/{i}", "n": i})
            for i in range(n)]


def test_two_nodes_draining_at_once_store_everything_and_remove_only_what_was_written(
        mongo_uri, redis_url, redis):
    database = f"drain_{uuid.uuid4().hex[:8]}"
    key = FrontierKeys("shop").mongo_spool("test")

    async def run():
        clients = [aioredis.Redis.from_url(redis_url) for _ in range(3)]
        writers = [MongoWriter(mongo_uri) for _ in range(2)]
        try:
            await RedisHandoff(clients[0], key, database, chunk_records=7).push(ops(100, database))
            assert await RedisHandoff(clients[0], key, database).count_items() == 100
            results = await asyncio.gather(*(
                RedisHandoff(client, key, database).drain(writer, bulk_size=5, budget=5)
                for client, writer in zip(clients[1:], writers)))
            return results
        finally:
            for writer in writers:
                await writer.close()
            for client in clients:
                await client.aclose()

    results = asyncio.run(run())
    assert all(r is not None for r in results)
    assert sum(results) >= 100                 # some chunks may be written by both
    assert not redis.exists(key)
    client = pymongo.MongoClient(mongo_uri)
    try:
        assert len(docs(client[database]["shop"])) == 100
    finally:
        client.drop_database(database)
        client.close()


def test_a_drain_stops_when_mongodb_is_down_and_keeps_every_chunk(redis_url, redis):
    key = FrontierKeys("shop").mongo_spool("down")
    dead_mongo = f"mongodb://127.0.0.1:{free_port()}/"

    async def run():
        client = aioredis.Redis.from_url(redis_url)
        writer = MongoWriter(dead_mongo, client_options={"serverSelectionTimeoutMS": 300})
        try:
            await RedisHandoff(client, key, "x", chunk_records=10).push(ops(30, "x"))
            return await RedisHandoff(client, key, "x").drain(writer, bulk_size=10, budget=0.5)
        finally:
            await writer.close()
            await client.aclose()

    assert asyncio.run(run()) is None
    assert redis.llen(key) == 3


def test_lines_written_into_the_handoff_list_by_others_are_refused(mongo_uri, redis_url, redis,
                                                                  caplog):
    """The list is in Redis: a line naming another database, a system collection,
    or garbage is refused (counted, logged), never written; good lines are."""
    from crawlproject.pipelines.documents import to_spool_line

    database = f"drain_{uuid.uuid4().hex[:8]}"
    key = FrontierKeys("shop").mongo_spool("hostile")
    good = ops(3, database)
    hostile = [to_spool_line(op) for op in ops(2, "admin")]
    system = to_spool_line(WriteOp.build(database, "system.users", "url", {"url": "u"}))
    chunk = "\n".join([to_spool_line(good[0]), *hostile, system, "{not json", "[1, 2]",
                        '{"db": [], "coll": 5}', "{" * 5000, to_spool_line(good[1]),
                        to_spool_line(good[2])])
    redis.rpush(key, chunk)

    async def run():
        client = aioredis.Redis.from_url(redis_url)
        writer = MongoWriter(mongo_uri)
        try:
            return await RedisHandoff(client, key, database).drain(writer, bulk_size=10, budget=5)
        finally:
            await writer.close()
            await client.aclose()

    with caplog.at_level("ERROR"):
        assert asyncio.run(run()) == 3
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 7
    client = pymongo.MongoClient(mongo_uri)
    try:
        assert len(docs(client[database]["shop"])) == 3
        assert "system.users" not in client[database].list_collection_names()
        assert client["admin"]["shop"].count_documents({}) == 0
    finally:
        client.drop_database(database)
        client.close()
    assert not redis.exists(key)
