"""The MongoDB tier wired into the crawl (issue 49): SYNC flags keys for the
node's mover, the mover spills and refills, a crawl whose backlog spills
stores every page once; with the tier off or below its threshold SYNC costs
what it did before. Real redis-server, MongoDB-wire server and demo site."""

from __future__ import annotations

import pytest

from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.frontier.window import WindowRule
from devtools.demo.site import DemoSite, expected_items
from tests.crawl_helpers import (Node, assert_fetched_once, assert_matches_catalog,
                                 assert_written_once, node_env, stored_products)

PRODUCTS = 60


def _calls(redis) -> dict[str, int]:
    """Commands Redis ran (scripts' own commands included), by name."""
    stats = redis.info("commandstats")
    return {name[len("cmdstat_"):] if name.startswith("cmdstat_") else name: v["calls"]
            for name, v in stats.items()}


def _workload(redis, spider: str, rule: WindowRule) -> dict[str, int]:
    """A node's calls (adds over three sites, takes, acks, a maintenance call)
    against a fresh partition, and the commands they cost."""
    frontier = Frontier(redis, spider, "n1", lease_ttl=30)
    frontier.window = rule
    frontier.sync()          # the scripts loaded, the node registered
    redis.config_resetstat()
    for round_ in range(3):
        batch = Batch()
        for i in range(30):
            batch.add(f"p{round_}-{i}", f"{round_:04x}{i:028x}", 0, 0,
                      key=f"site{i % 3}.example")
        batch.take = 4
        taken = frontier.sync(batch).taken
        acks = Batch()
        acks.acks = [member for member, _ in taken]
        acks.take = 2
        acks.maintenance = round_ == 2
        frontier.sync(acks)
    calls = _calls(redis)
    for name in ("config|resetstat", "config", "info"):
        calls.pop(name, None)
    return calls


def test_sync_below_spill_above_costs_what_it_costs_with_the_tier_off(redis):
    off = _workload(redis, "off", WindowRule(enabled=False))
    below = _workload(redis, "below", WindowRule(enabled=True, spill_above=1_000_000))
    assert below == off
    assert not redis.exists("{below}:moves") and not redis.exists("{off}:moves")
    # over it, the keys over 1.25 W are flagged (and the check costs commands)
    above = _workload(redis, "above", WindowRule(enabled=True, spill_above=5, seconds=1,
                                                 minimum=2, maximum=2))
    assert above != off and above.get("zcard", 0) > off.get("zcard", 0)
    assert {k.decode() for k in redis.zrange("{above}:moves", 0, -1)} == {
        "site0.example", "site1.example", "site2.example"}


#: windows of two entries, spilling as soon as more than one entry is queued:
#: every list page's links spill and come back (FRONTIER_BACKLOG_SETTLE: Redis
#: 6.2 here has no WAITAOF; a short settle keeps the test quick)
SPILLING = {"FRONTIER_BACKLOG_SPILL_ABOVE": 1, "FRONTIER_BACKLOG_WINDOW_MIN": 2,
            "FRONTIER_BACKLOG_WINDOW_MAX": 2, "FRONTIER_BACKLOG_SETTLE": 0.05}


@pytest.mark.parametrize("tier", ["spilling", "off", "below"])
def test_a_crawl_stores_every_page_once(redis, redis_url, mongo_uri, database, tmp_path,
                                        tier):
    """With tiny windows the site's backlog goes to MongoDB and back, every
    page fetched once and stored once; with the tier off (the same tiny
    windows), or on but the crawl below its threshold (the defaults' spill
    above, the same tiny windows), nothing touches the backlog collection."""
    extra = {**SPILLING, "FRONTIER_BACKLOG_ENABLED": tier != "off"}
    if tier == "below":
        del extra["FRONTIER_BACKLOG_SPILL_ABOVE"]
    with DemoSite(products=PRODUCTS, latency_ms=50) as site:
        env = node_env(redis_url, mongo_uri, database.name)
        settings = {"MAX_IDLE_TIME_BEFORE_CLOSE": 1, "CONCURRENT_REQUESTS": 4,
                    "SCHEDULER_PREFETCH": 4, **extra}
        node = Node("node-1", tmp_path, env, settings=settings)
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush("products:start_urls", site.url)
            code = node.wait(120)
        finally:
            node.stop()
        served = site.stats()
    assert code == 0, node.tail()
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(site.url, PRODUCTS))
    assert_fetched_once(served, PRODUCTS)
    assert all(served.get(f"/list/{n}", 0) == 1 for n in range(2, PRODUCTS // 10 + 1))
    assert_written_once([node], PRODUCTS)
    assert not node.errors(), node.errors()
    backlog = database["frontier_backlog"]
    if tier in ("off", "below"):
        assert "frontier_backlog" not in database.list_collection_names()
        assert node.stat("backlog/spilled") == 0
        assert ("Frontier backlog off (FRONTIER_BACKLOG_ENABLED)" in node.text()) == (
            tier == "off")
        return
    assert (f"Frontier backlog on: above 1 entries queued in a partition's Redis, a site's "
            f"entries beyond its window (300s at its pace, 2-2 entries) wait in MongoDB "
            f"(database {database.name!r}, collection 'frontier_backlog')") in node.text()
    spilled, refilled = node.stat("backlog/spilled"), node.stat("backlog/refilled")
    # (each list page adds 11 entries, at most 4 taken at once: the rest spill)
    assert spilled >= 5 and refilled == spilled, node.tail()
    # every spilled entry came back: its document a tombstone, none live
    assert backlog.count_documents({"s": "products"}) == spilled
    assert backlog.count_documents({"s": "products", "pl": {"$exists": True}}) == 0
    assert redis.hget("{products}:kstate", "||backlog") in (b"0", None)
    assert redis.zcard("{products}:moves") == 0 and redis.zcard("{products}:backlog") == 0
    assert redis.hkeys("{products}:mover") in ([], [b"||epoch"])


def _settings(**values):
    from scrapy.settings import Settings

    return Settings({"FRONTIER_BACKLOG_SETTLE": 0, **values})


async def _node(redis_url, mongo_uri, database, *, timeout=10.0, stats=None, node="n1",
                **settings):
    """A FrontierClient (not started: the test drives its calls) over one
    partition of spider "shop" with windows of 2 spilling above 1 entry,
    and its MoverTask (not started either)."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.backlog import Backlog, BacklogConfig
    from crawlproject.frontier.client import FrontierClient
    from crawlproject.frontier.movertask import MoverTask
    from crawlproject.frontier.queue import AsyncFrontier
    from crawlproject.frontier.sitelimits import Limits, PolitenessConfig

    redis = aioredis.Redis.from_url(redis_url)
    politeness = PolitenessConfig(default=Limits(0), margin=0.0)
    frontier = AsyncFrontier(redis, "shop", node, lease_ttl=30, politeness=politeness)
    frontier.window = WindowRule(enabled=True, spill_above=1, minimum=2, maximum=2)
    config = BacklogConfig(uri=mongo_uri, database=database, timeout=timeout)
    client = FrontierClient([frontier], politeness, accept=lambda p, m, payload: payload,
                            before_tick=lambda: None, count=lambda name, value: None,
                            outage=None, log_extra={}, prefetch=8, batch_size=100,
                            flush_interval=0.05, min_sync_interval=0.02, idle_poll=0.2,
                            heartbeat=2, lease_ttl=30)
    mover = MoverTask([frontier], frontier.window,
                      lambda: Backlog.from_config(config, "shop", stats=stats), node=node,
                      settings=_settings(**settings), poll=0.2, stats=stats,
                      on_moved=client.moved)
    return redis, frontier, client, mover


def _take(n: int) -> Batch:
    batch = Batch()
    batch.take = n
    return batch


def _adds(n: int, key: str = "a.example") -> Batch:
    batch = Batch()
    for i in range(n):
        batch.add(f"page {i}", f"{i:032x}", 0, 0, key=key)
    return batch


def test_a_node_whose_work_is_only_in_mongodb_is_not_idle(redis, redis_url, mongo_uri,
                                                            mongo_db):
    """Entries spilled to MongoDB keep a node from closing (Redis empty, the
    backlog not), and come back through the refill SYNC flags; a node closes
    once Redis, MongoDB and the mover's flags and leases are all empty."""
    import asyncio

    async def main():
        r, frontier, client, mover = await _node(redis_url, mongo_uri, mongo_db.name)
        try:
            result = await frontier.sync(_adds(10))
            client.replies.apply(0, result, asked=0)
            assert result.moves == 1 and mover.active == [True]
            assert await mover.round()                       # spilled down to the window
            assert await r.zcard("{shop}:q:a.example") == 2
            only_in_mongo = 0
            while True:
                result = await frontier.sync(_take(8))
                client.replies.apply(0, result, asked=8)
                client.buffer.clear()       # the engine's part: done, acked below
                acks = Batch()
                acks.acks = [member for member, _ in result.taken]
                acks.maintenance = True     # (the reply counts what is in flight)
                after = await frontier.sync(acks)
                client.replies.apply(0, after, asked=0)
                if not result.taken and not after.backlog and not after.moves:
                    break
                if after.queued == 0 and after.backlog:
                    # the rest is in MongoDB only: the node must not close
                    only_in_mongo += 1
                    assert after.moves == 1      # SYNC flagged the key for a refill
                    assert after.inflight == 0 and client.has_pending()
                    saved, client.mover = client.mover, None
                    assert client.has_pending()          # the backlog alone says so
                    client.mover = saved
                await mover.round()
            await mover.round()
            assert only_in_mongo > 0
            assert not client.has_pending()
        finally:
            await mover.close()
            await r.aclose()

    asyncio.run(main())
    live = mongo_db["frontier_backlog"].count_documents({"pl": {"$exists": True}})
    assert live == 0 and mongo_db["frontier_backlog"].count_documents({}) == 8


class _Stats:
    def __init__(self):
        self.values: dict[str, int] = {}

    def inc_value(self, name, n=1):
        self.values[name] = self.values.get(name, 0) + n


def test_mongodb_down_the_mover_retries_with_backoff_says_it_once_and_loses_nothing(
        redis, redis_url, mongo_db, caplog):
    """MongoDB not answering: the mover retries (0.4 s, then 0.8 s, ...), one
    ERROR line for the outage, ``backlog/mongo_errors`` each time; the key
    stays flagged and its entries stay in Redis."""
    import asyncio
    import logging
    import time

    from devtools.services import free_port

    stats = _Stats()
    errors_at: list[float] = []

    async def main():
        r, frontier, client, mover = await _node(
            redis_url, f"mongodb://127.0.0.1:{free_port()}/?serverSelectionTimeoutMS=200",
            mongo_db.name, timeout=0.3, stats=stats)
        counted = stats.inc_value

        def inc_value(name, n=1):
            if name == "backlog/mongo_errors":
                errors_at.append(time.monotonic())
            counted(name, n)

        stats.inc_value = inc_value
        try:
            client.replies.apply(0, await frontier.sync(_adds(10)), asked=0)
            mover.start()
            async with asyncio.timeout(20):
                while len(errors_at) < 3:
                    await asyncio.sleep(0.05)
        finally:
            await mover.close()
            await r.aclose()

    with caplog.at_level(logging.INFO, logger="crawlproject.frontier.movertask"):
        asyncio.run(main())
    lines = [rec for rec in caplog.records if rec.name == "crawlproject.frontier.movertask"
             and rec.levelno >= logging.ERROR]
    assert len(lines) == 1 and "cannot move entries" in lines[0].getMessage()
    assert stats.values["backlog/mongo_errors"] >= 3
    # backoff: the second pause (0.8 s) 0.4 s longer than the first (each
    # attempt takes about the same: the server selection's timeout)
    assert (errors_at[2] - errors_at[1]) - (errors_at[1] - errors_at[0]) >= 0.25
    assert redis.zcard("{shop}:q:a.example") + redis.zcard("{shop}:moving:a.example") == 10
    assert redis.hlen("{shop}:payloads") == 10
    assert redis.zrange("{shop}:moves", 0, -1) == [b"a.example"]


def test_a_dead_movers_leftovers_are_finished_by_another_nodes_mover(redis, redis_url,
                                                                     mongo_uri, mongo_db):
    """A node killed after a spill's step 1 leaves its members out of the
    queue, in the moving set, under its lease: once the lease expires, any
    node's mover (nothing flagged) finishes the spill; no member lost, the
    node is not idle until then."""
    import asyncio

    import redis.asyncio as aioredis

    from crawlproject.frontier.backlog import Backlog, BacklogConfig
    from crawlproject.frontier.mover import Mover
    from crawlproject.keys import FrontierKeys

    async def main():
        r, frontier, client, mover = await _node(redis_url, mongo_uri, mongo_db.name)
        dead_client = aioredis.Redis.from_url(redis_url)
        backlog = Backlog.from_config(BacklogConfig(uri=mongo_uri, database=mongo_db.name),
                                      "shop")
        try:
            mover.look_every = 0.2
            # this node's mover looked first: nothing to do, nothing to look at again
            assert not await mover.round() and not any(mover.active)
            await frontier.sync(_adds(10))
            dead = Mover(dead_client, backlog, FrontierKeys("shop"), "dead", lease_ttl=0.3,
                         settle=0)
            claim = await dead.claim("a.example", "spill", 2)      # step 1, then killed
            assert claim.moved == 8
            await r.delete("{shop}:moves")                          # nothing flagged
            # No reply points to the partition (nothing flagged, no backlog yet):
            # the mover looks again on its own, every look_every seconds (the
            # lease's TTL at most; 0.2 here), and finds the lease: busy while it
            # lives, the node not idle; then the leftovers finished.
            seen_busy = False
            for _ in range(200):                                    # until the lease expired
                if await mover.round():
                    break
                seen_busy = seen_busy or mover.pending()
                await asyncio.sleep(0.05)
            assert seen_busy
            assert await r.zcard("{shop}:moving:a.example") == 0
            assert int(await r.zscore("{shop}:backlog", "a.example")) == 8
            assert await r.hkeys("{shop}:mover") == [b"||epoch"]
        finally:
            await mover.close()
            await backlog.close()
            await dead_client.aclose()
            await r.aclose()

    asyncio.run(main())
    assert mongo_db["frontier_backlog"].count_documents({"pl": {"$exists": True}}) == 8


@pytest.mark.slow
def test_a_node_killed_mid_move_loses_nothing(redis, redis_url, mongo_uri, database, tmp_path):
    """Two spilling nodes; the one that holds a key's move lease (a spill or
    a refill under way, FRONTIER_BACKLOG_SETTLE widening its steps) is
    SIGKILLed: the other finishes the move and the crawl, every product
    stored once, pages fetched again only as a lease reclaim allows."""
    import signal
    import time

    from devtools.demo.site import FLAKY_EVERY

    products = 120
    settings = {**SPILLING, "FRONTIER_BACKLOG_SETTLE": 0.3, "FRONTIER_BACKLOG_LEASE_TTL": 2,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 4,
                "SCHEDULER_PREFETCH": 4}
    with DemoSite(products=products, latency_ms=50) as site:
        env = node_env(redis_url, mongo_uri, database.name)
        nodes = {name: Node(name, tmp_path, env, settings=settings) for name in ("a", "b")}
        victim = survivor = None
        try:
            for node in nodes.values():
                node.wait_for_log("Reading seeds from")
            redis.lpush("products:start_urls", site.url)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and victim is None:
                for v in redis.hvals("{products}:mover"):
                    name = v.decode().split("-", 1)[0]
                    if name in nodes and nodes[name].proc.poll() is None:
                        nodes[name].proc.send_signal(signal.SIGSTOP)
                        # still its lease once stopped: killed mid-move
                        if any(w.startswith(f"{name}-".encode())
                               for w in redis.hvals("{products}:mover")):
                            victim = nodes[name]
                            break
                        nodes[name].proc.send_signal(signal.SIGCONT)
                time.sleep(0.005)
            assert victim, "no node held a move lease: the test proves nothing"
            victim.kill()
            survivor = nodes["b" if victim is nodes["a"] else "a"]
            assert survivor.wait(120) == 0, survivor.tail()
        finally:
            for node in nodes.values():
                node.stop()
        served = site.stats()
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(site.url, products))
    assert all(served.get(f"/product/{pid}", 0) >= 1 for pid in range(1, products + 1))
    extra = sum(served.get(f"/product/{pid}", 0) - (2 if pid % FLAKY_EVERY == 0 else 1)
                for pid in range(1, products + 1))
    # fetched again: only what the victim held leased (a reclaim), never a moved entry
    assert extra <= survivor.stat("scheduler/reclaimed"), extra
    assert survivor.stat("backlog/leftovers") + survivor.stat("backlog/refilled") > 0
    assert database["frontier_backlog"].count_documents({"pl": {"$exists": True}}) == 0
    assert redis.hget("{products}:kstate", "||backlog") in (b"0", None)
    assert redis.hkeys("{products}:mover") == [b"||epoch"]
    assert not list(redis.scan_iter("{products}:moving:*"))
    assert not list(redis.scan_iter("{products}:refilled:*"))


def test_a_lost_flag_is_found_by_the_sweep(redis, redis_url, mongo_uri, mongo_db):
    """A key with entries in MongoDB, its window empty and its flag lost: the
    mover's sweep of T:backlog refills it (once per SWEEP_EVERY)."""
    import asyncio

    async def main():
        r, frontier, client, mover = await _node(redis_url, mongo_uri, mongo_db.name)
        try:
            await frontier.sync(_adds(10))
            assert await mover.round()                          # 8 spilled
            taken = (await frontier.sync(_take(8))).taken
            acks = Batch()
            acks.acks = [member for member, _ in taken]
            await frontier.sync(acks)
            await r.delete("{shop}:moves")                      # the refill's flag lost
            assert await r.zcard("{shop}:q:a.example") == 0
            mover.active[0] = True
            assert await mover.round()                          # the sweep refilled it
            assert await r.zcard("{shop}:q:a.example") == 2
            await frontier.sync(_take(8))                       # empty again, flag lost
            await r.delete("{shop}:moves")
            mover.active[0] = True
            assert not await mover.round()                      # no sweep within 30 s
            mover.swept[0] -= 30
            assert await mover.round()                          # ... then one
        finally:
            await mover.close()
            await r.aclose()

    asyncio.run(main())


def test_redis_back_from_its_aof_without_the_spills_commit_loses_nothing(tmp_path, mongo_uri,
                                                                          mongo_db):
    """Redis killed after a spill and started again from an AOF that has the
    claim (step 1) but not the commit (step 3), as an fsync lost: the members
    are back in the moving set, their copies live in MongoDB; the next mover
    finishes the spill, and every member is then taken exactly once."""
    import asyncio

    from devtools.services import RedisServer

    server = RedisServer(data_dir=tmp_path / "redis", appendonly=True).start()
    aof = tmp_path / "redis" / "appendonly.aof"
    moving = "{shop}:moving:a.example"

    async def spill_and_lose_the_commit():
        r, frontier, client, mover = await _node(
            server.url, mongo_uri, mongo_db.name, FRONTIER_BACKLOG_SETTLE=0.5,
            FRONTIER_BACKLOG_LEASE_TTL=1.5)
        try:
            await frontier.sync(_adds(10))
            spill = asyncio.ensure_future(mover.round())
            async with asyncio.timeout(10):
                while not await r.zcard(moving):          # step 1 done (and in the AOF)
                    await asyncio.sleep(0.005)
            claimed = aof.read_bytes()
            assert await spill                             # steps 2 and 3 done
            assert not await r.zcard(moving) and await r.zscore("{shop}:backlog", "a.example")
            return claimed
        finally:
            await mover.close()
            await r.aclose()

    async def finish_and_drain():
        r, frontier, client, mover = await _node(server.url, mongo_uri, mongo_db.name,
                                                 node="n2")
        try:
            assert await r.zcard(moving) == 8              # the commit was lost
            for _ in range(200):                           # once the dead lease expired
                if not await r.zcard(moving):
                    break
                mover.active[0] = True
                await mover.round()
                await asyncio.sleep(0.02)
            assert not await r.zcard(moving), "the dead mover's spill was not finished"
            assert int(await r.zscore("{shop}:backlog", "a.example")) == 8
            taken = []
            for _ in range(50):
                got = (await frontier.sync(_take(8))).taken
                taken += [member for member, _ in got]
                acks = Batch()
                acks.acks = [member for member, _ in got]
                after = await frontier.sync(acks)
                if not got and not after.backlog:
                    break
                mover.active[0] = True
                await mover.round()
            return taken
        finally:
            await mover.close()
            await r.aclose()

    try:
        claimed = asyncio.run(spill_and_lose_the_commit())
        server.kill()
        aof.write_bytes(claimed)                            # the commit's fsync lost
        server.start()
        taken = asyncio.run(finish_and_drain())
    finally:
        server.kill()
    assert len(taken) == len(set(taken)) == 10, sorted(taken)
    assert mongo_db["frontier_backlog"].count_documents({"pl": {"$exists": True}}) == 0


def test_a_rounds_keys_move_side_by_side(tmp_path, mongo_uri, mongo_db):
    """Each move waits for its commit to reach the AOF (here the settle: 6.2
    and 7.0 have no WAITAOF); a round's keys wait side by side, not one after
    another (four keys one after another: at least 4 settles)."""
    import asyncio
    import time

    from devtools.services import RedisServer

    server = RedisServer(data_dir=tmp_path / "redis", appendonly=True).start()
    keys = [f"site{i}.example" for i in range(4)]

    async def main():
        r, frontier, client, mover = await _node(server.url, mongo_uri, mongo_db.name,
                                                 FRONTIER_BACKLOG_SETTLE=1.0)
        try:
            for k, key in enumerate(keys):
                batch = Batch()
                for i in range(10):
                    batch.add(f"page {k} {i}", f"{k:08x}{i:024x}", 0, 0, key=key)
                await frontier.sync(batch)
            began = time.monotonic()
            assert await mover.round()
            seconds = time.monotonic() - began
            queued = [await r.zcard(f"{{shop}}:q:{key}") for key in keys]
            return seconds, queued, mover.movers[0]._waitaof
        finally:
            await mover.close()
            await r.aclose()

    try:
        seconds, queued, waitaof = asyncio.run(main())
    finally:
        server.stop()
    assert queued == [2, 2, 2, 2]          # every key spilled down to its window
    if not waitaof:
        assert 1.0 <= seconds < 3.0, seconds
