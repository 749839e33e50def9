"""Operator control across the cluster (crawlproject/control.py, ``crawlctl pause |
resume | drain | stop``), with real nodes, Redis, MongoDB and the demo site."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from crawlproject.control import ControlWatcher, control_key, node_reports
from devtools.demo.site import DemoSite, expected_items
from crawlproject.keys import FrontierKeys, start_urls_key
from tests.crawl_helpers import (ROOT, Node, assert_matches_catalog, assert_written_once,
                                 node_env, stored_products, wait_for_node_loops)

SETTINGS = {"MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 2}


def crawlctl(redis_url: str, *args) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url,
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out


def hits(site) -> int:
    return sum(site.stats().values())


def wait_until(predicate, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(step)


def test_unknown_states_from_redis_count_as_run(redis, redis_url):
    import asyncio

    from redis import asyncio as aioredis

    changes = []

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        watcher = ControlWatcher(client, "shop", lambda old, new: changes.append((old, new)))
        try:
            redis.hset(control_key("shop"), "state", "pause")
            assert await watcher.poll() == "pause"
            redis.hset(control_key("shop"), "state", "__import__('os').system('x')")
            assert await watcher.poll() == "run"
            redis.delete(control_key("shop"))
            assert await watcher.poll() == "run"
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert changes == [("run", "pause"), ("pause", "run")]


def test_stop_returns_when_a_redis_command_swallows_the_cancellation(redis_url):
    """A node hung at close, about once in 20 (seen in a benchmark): the watcher's
    task was cancelled while a Redis command ran, the client turned the
    CancelledError into a connection error, the loop went on sleeping and
    ``stop()`` waited for ever. The interleaving cannot be forced against a real
    Redis, so this client stands in for one (a subclass of the real one): its
    HGET turns a cancellation into ``ConnectionError`` exactly as it happened."""
    import asyncio

    from redis import asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    class SwallowingRedis(aioredis.Redis):
        async def hget(self, *args):
            try:
                await asyncio.sleep(0.2)  # a command in flight
            except asyncio.CancelledError:
                raise RedisConnectionError("Connection closed by server.") from None
            return await super().hget(*args)

    async def scenario():
        client = SwallowingRedis.from_url(redis_url)
        watcher = ControlWatcher(client, "shop", lambda old, new: None, interval=0.5)
        watcher.start()
        await asyncio.sleep(0.05)   # the first HGET is in flight
        stopping = asyncio.ensure_future(watcher.stop())
        try:
            done, _ = await asyncio.wait({stopping}, timeout=20)   # it takes < 1 s
        finally:
            stopping.cancel()
            watcher._task.cancel()
            await client.aclose()
        return bool(done), watcher._task.done()

    assert asyncio.run(scenario()) == (True, True)


def test_a_change_of_state_is_reported_at_once_not_at_the_next_interval(redis, redis_url):
    """`crawlctl status` shows a node's new state within a poll, though its
    reports are minutes apart: a change sends the report at once."""
    import asyncio

    from redis import asyncio as aioredis

    from crawlproject.control import node_reports_key

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        watcher = ControlWatcher(client, "shop", lambda old, new: None, interval=0.05,
                                 report=lambda: {"state": watcher.state}, node="n1",
                                 report_interval=600)
        watcher.start()
        try:
            async def reported_state():
                raw = await client.hget(node_reports_key("shop"), "n1")
                return json.loads(raw)["state"] if raw else None

            async def until(state, timeout):
                deadline = time.monotonic() + timeout
                while await reported_state() != state:
                    assert time.monotonic() < deadline, f"no report of {state!r} in {timeout}s"
                    await asyncio.sleep(0.05)

            await until("run", 30)          # the first report
            redis.hset(control_key("shop"), "state", "pause")
            await until("pause", 30)        # at once, not in 600 s
        finally:
            await watcher.stop()
            await client.aclose()

    asyncio.run(scenario())


class CountingRedis:
    """Builds a real ``redis.asyncio.Redis`` (a subclass) that counts its HGETs,
    so a test can wait for the watcher to have tried, rather than sleep."""

    @staticmethod
    def from_url(url):
        from redis import asyncio as aioredis

        class Counting(aioredis.Redis):
            hgets = 0

            async def hget(self, *args):
                type(self).hgets += 1
                return await super().hget(*args)

        return Counting.from_url(url, socket_connect_timeout=0.5, socket_timeout=1.0)


def test_a_node_started_while_redis_is_down_takes_its_first_state_from_redis(tmp_path):
    """The crawl is paused; a node starts while Redis is down. It must wait for
    Redis and start paused, not assume "run" from the failed read (it did: it
    took requests once Redis was back, before its first poll said "pause")."""
    import asyncio

    from devtools.services import RedisServer, free_port

    port = free_port()
    with RedisServer(port=port, data_dir=tmp_path, appendonly=True) as server:
        server.client().hset(control_key("shop"), "state", "pause")   # kept in the AOF
    ready = []

    async def scenario():
        client = CountingRedis.from_url(f"redis://127.0.0.1:{port}/0")
        watcher = ControlWatcher(client, "shop", lambda old, new: None, interval=0.05,
                                 on_ready=ready.append)
        watcher.start()
        try:
            async with asyncio.timeout(30):
                while client.hgets < 3:           # three reads failed: Redis is down
                    await asyncio.sleep(0.01)
            assert ready == [], "a state was assumed while Redis was down"
            with RedisServer(port=port, data_dir=tmp_path, appendonly=True):
                async with asyncio.timeout(30):
                    while not ready:
                        await asyncio.sleep(0.01)
        finally:
            await watcher.stop()
            await client.aclose()

    asyncio.run(scenario())
    assert ready == ["pause"]


def test_a_failing_ready_handler_is_called_again_not_skipped(redis, redis_url):
    """on_ready unpauses the node's frontier: if it raised once (a bug, or an
    error out of the Redis client) and was not called again, the node stayed
    paused for the whole crawl: it took nothing and closed idle (seen in CI on
    a Redis Cluster)."""
    import asyncio

    calls = []

    def on_ready(state):
        calls.append(state)
        if len(calls) == 1:
            raise AttributeError("'NoneType' object has no attribute 'writelines'")

    async def scenario():
        client = CountingRedis.from_url(redis_url)
        watcher = ControlWatcher(client, "shop", lambda old, new: None, interval=0.05,
                                 on_ready=on_ready)
        watcher.start()
        try:
            async with asyncio.timeout(30):
                while len(calls) < 2:
                    await asyncio.sleep(0.01)
                reads = client.hgets
                while client.hgets < reads + 3:   # polling goes on, on_ready is not repeated
                    await asyncio.sleep(0.01)
        finally:
            await watcher.stop()
            await client.aclose()

    asyncio.run(scenario())
    assert calls == ["run", "run"]


@pytest.mark.slow
def test_pause_stops_fetching_on_every_node_and_resume_finishes_the_crawl(
        redis, redis_url, mongo_uri, database, tmp_path):
    # 2 nodes x 2 downloads at 300 ms: ~13 pages/s, so the crawl outlasts the
    # pause's way there (a crawlctl process on a loaded machine) many times over.
    products = 120
    env = node_env(redis_url, mongo_uri, database.name)
    with DemoSite(products=products, latency_ms=300, faults=False) as site:
        nodes = [Node(f"c{i}", tmp_path, env, settings=SETTINGS) for i in (1, 2)]
        try:
            for node in nodes:
                node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("products"), site.url)
            wait_until(lambda: database["products"].count_documents({}) >= 10, 120, "10 items")
            out = crawlctl(redis_url, "pause", "products")
            assert "run -> pause" in out.stdout
            for node in nodes:
                node.wait_for_log("Operator control: pause", timeout=30)
            at_pause = hits(site)
            # What each node had under way when it paused (counted as it paused).
            underway = sum(int(re.search(r"Operator control: pause .*downloads under way "
                                         r"finish: (\d+)", node.text()).group(1))
                           for node in nodes)
            assert underway <= 2 * SETTINGS["CONCURRENT_REQUESTS"]
            # Downloads already started finish; the event: both nodes report the pause
            # with nothing left in their downloaders (a node reports at once when the
            # state changes, then every 5 s). Not "the site went quiet for a second": on
            # a loaded machine a download started before the pause (a rendered page
            # whose browser is still starting) reached the site after such a quiet.
            inflight = FrontierKeys("products").inflight

            def paused_and_idle():
                return sorted((r.get("state"), r.get("downloading"))
                              for r in node_reports(redis, "products")) == [("pause", 0)] * 2

            wait_until(paused_and_idle, 60, "both nodes paused with no download left", step=0.2)
            before = dict(site.stats())
            # ... and nothing else: not the requests prefetched into the nodes' buffers.
            assert sum(before.values()) - at_pause <= underway, (at_pause, underway, before)
            stored_paused = database["products"].count_documents({})
            wait_for_node_loops(redis, "products", 2)  # nothing may happen meanwhile
            fetched = {path: n - before.get(path, 0) for path, n in site.stats().items()
                       if n != before.get(path, 0)}
            assert not fetched, f"a paused cluster fetched pages: {fetched}"
            assert stored_paused < products, "the crawl ended before the pause"
            assert redis.hlen(inflight) > 0, "prefetched leases are kept while paused"
            status = crawlctl(redis_url, "status", "products")
            assert "pause" in status.stdout and "items/s" in status.stdout
            # The stable JSON form: the state, and every node's report (every 5 s).
            def data():
                return json.loads(crawlctl(redis_url, "status", "products", "--json").stdout)

            wait_until(lambda: sorted(r.get("state") for r in data()["nodes"])
                       == ["pause", "pause"], 20, "both nodes to report the pause", step=0.5)
            state = data()
            assert state["control"]["state"] == "pause"
            assert {r["node"].split("-")[0] for r in state["nodes"]} == {"c1", "c2"}
            assert sum(r["items"] for r in state["nodes"]) >= stored_paused
            assert all(r["registered"] and r["age_s"] < 15 for r in state["nodes"])
            assert [r["downloading"] for r in state["nodes"]] == [0, 0]
            assert "downloading" in status.stdout
            assert state["frontier"]["inflight"] > 0 and state["bloom"]["items"] > 0
            assert [h["host"] for h in state["politeness"]["top"]] == ["127.0.0.1"]
            crawlctl(redis_url, "resume", "products")
            for node in nodes:
                assert node.wait(240) == 0, node.tail()
        finally:
            for node in nodes:
                node.stop()
        served = site.stats()
    assert_matches_catalog(stored_products(database["products"]), expected_items(site.url, products))
    assert_written_once(nodes, products)
    assert all(served.get(f"/product/{pid}", 0) == 1 for pid in range(1, products + 1)), served
    assert all(n.stat("control/pause") == 1 and n.stat("control/run") == 1 for n in nodes)
    assert redis.hlen("{products}:node_reports") == 0     # closed nodes are no longer listed


@pytest.mark.slow
def test_drain_finishes_the_frontier_and_leaves_seeds_and_stop_hands_leases_back(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    never_idle_close = {**SETTINGS, "MAX_IDLE_TIME_BEFORE_CLOSE": 0}
    # The second site is the one crawled when `stop` comes: slow enough (300 ms
    # a page, one at a time) to be mid-crawl then on a loaded machine.
    with DemoSite(products=20, latency_ms=50, faults=False) as first, \
            DemoSite(products=20, latency_ms=300, faults=False) as second:
        node = Node("drainer", tmp_path, env, settings=never_idle_close)
        try:
            node.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("products"), first.url)
            wait_until(lambda: database["products"].count_documents({}) >= 3, 120, "3 items")
            crawlctl(redis_url, "drain", "products")
            node.wait_for_log("Operator control: drain", timeout=30)
            redis.lpush(start_urls_key("products"), second.url)   # not taken while draining
            assert node.wait(180) == 0, node.tail()    # closes although it never idle-closes
        finally:
            node.stop()
        assert "Drained" in node.text()
        assert redis.llen(start_urls_key("products")) == 1      # the new seed waits
        assert sum(second.stats().values()) == 0
        assert database["products"].count_documents({}) == 20
        # stop: a node closes mid-crawl, its leases go back, resume lets another finish.
        crawlctl(redis_url, "resume", "products")
        database["products"].drop()
        slow = {**never_idle_close, "CONCURRENT_REQUESTS": 1}
        node = Node("stopped", tmp_path, env, settings=slow)
        try:
            node.wait_for_log("Reading seeds from")
            wait_until(lambda: database["products"].count_documents({}) >= 3, 120, "3 items")
            crawlctl(redis_url, "stop", "products")
            assert node.wait(60) == 0, node.tail()
        finally:
            node.stop()
        assert "operator_stop" in node.text()
        stored_at_stop = database["products"].count_documents({})
        assert stored_at_stop < 20
        assert redis.hlen(FrontierKeys("products").inflight) == 0   # handed back at close
        # A node started while the state is stop, with CONTROL_ON_START = exit,
        # closes at once and says so by its exit code (it crawled nothing).
        late = Node("late", tmp_path, env, settings={**slow, "CONTROL_ON_START": "exit"})
        assert late.wait(60) == 1 and "control_stop_at_start" in late.text(), late.tail()
        crawlctl(redis_url, "resume", "products")
        finisher = Node("finisher", tmp_path, env, settings=SETTINGS)
        assert finisher.wait(180) == 0, finisher.tail()
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(second.url, 20))


def _control_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "crawlproject.control" and r.levelname == "ERROR"]


def test_a_control_key_of_the_wrong_type_pauses_the_node_with_one_error_per_change(
        redis, redis_url, caplog):
    """``{spider}:control`` as a string or a list: a node took nothing and logged
    nothing (WRONGTYPE swallowed as an outage). Now the node counts it as
    ``pause`` (takes nothing new, loses nothing) and logs one ERROR naming the
    key, its type and the way out, once per change, not per poll."""
    import asyncio
    import logging

    from redis import asyncio as aioredis

    caplog.set_level(logging.INFO, logger="crawlproject.control")
    ready, changes = [], []

    async def polls(watcher, n):
        for _ in range(n):
            state = await watcher.poll()
        return state

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        redis.set(control_key("shop"), "pause")           # a string, not a hash
        watcher = ControlWatcher(client, "shop", lambda old, new: changes.append((old, new)),
                                 interval=0.05, on_ready=ready.append)
        watcher.start()
        try:
            async with asyncio.timeout(30):
                while not ready:                            # a new node: its first state
                    await asyncio.sleep(0.01)
            await watcher.stop()
            assert await polls(watcher, 5) == "pause"
            redis.delete(control_key("shop"))
            redis.rpush(control_key("shop"), "run")         # a list now: a change, logged
            assert await polls(watcher, 5) == "pause"
            redis.delete(control_key("shop"))               # repaired: run, said once
            assert await polls(watcher, 3) == "run"
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert ready == ["pause"]
    assert changes == [("pause", "run")]
    errors = _control_errors(caplog)
    assert len(errors) == 2, errors
    assert "{shop}:control" in errors[0] and "string" in errors[0] and "hash" in errors[0]
    assert "list" in errors[1] and "--force" in errors[1]


def test_crawlctl_reports_a_broken_control_key_and_replaces_it_with_force(redis, redis_url):
    """`crawlctl status` and `pause` failed with a WRONGTYPE traceback; status now
    shows the key as broken (nodes pause), pause/resume say how to fix it and
    ``--force`` replaces the key."""
    redis.rpush(control_key("shop"), "x")
    redis.rpush(FrontierKeys("shop").dead, "{}")             # some crawl state
    cli = [sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url]
    status = subprocess.run([*cli, "status", "shop", "--json"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    control = json.loads(status.stdout)["control"]
    assert control["state"] == "pause" and "{shop}:control is a list" in control["error"]
    table = subprocess.run([*cli, "status", "shop"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert table.returncode == 0 and "is a list" in table.stdout + table.stderr, table.stderr
    refused = subprocess.run([*cli, "pause", "shop"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert "{shop}:control is a list, not a hash" in refused.stderr
    assert "crawlctl pause shop --force" in refused.stderr and "Traceback" not in refused.stderr
    assert redis.type(control_key("shop")) == b"list"
    fixed = crawlctl(redis_url, "resume", "shop", "--force")
    assert "replaced" in fixed.stdout and redis.hget(control_key("shop"), "state") == b"run"
    assert "run -> pause" in crawlctl(redis_url, "pause", "shop", "--force").stdout  # sound key


# --- state that outlives the crawl (issue 39) ---------------------------------------------
START_WARNING = re.compile(r"WARNING: The crawl of 'products' is in state '(\w+)', set by "
                           r"([^\n]+?) at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC) \([^)\n]* ago\): "
                           r"([^\n]*) To crawl again: crawlctl resume products")


def _status(redis_url: str) -> dict:
    return json.loads(crawlctl(redis_url, "status", "products", "--json").stdout)


@pytest.mark.slow
def test_a_node_started_into_a_stopped_crawl_says_who_and_when_then_waits_until_resume(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Yesterday's `crawlctl stop` is still in Redis: a node started today exited
    in under a second with code 0 and crawled nothing (under compose or a
    Deployment: a restart loop). Now it logs one WARNING with the state, who set
    it, when, and the command that resumes; it waits (never idle-closing) and
    crawls once resumed. Seeding meanwhile warns; status shows who/when."""
    env = node_env(redis_url, mongo_uri, database.name)
    products = 20
    with DemoSite(products=products, latency_ms=20, faults=False) as site:
        out = crawlctl(redis_url, "stop", "products")
        assert "nodes started later wait" in out.stdout, out.stdout
        seeded = crawlctl(redis_url, "seed", "products", site.url)
        assert "pushed 1 seed" in seeded.stdout
        assert re.search(r"warning: the crawl of 'products' is in state 'stop' \(set by \S+@\S+ "
                         r"at .* UTC .*\): nodes take no seed until crawlctl resume products",
                         seeded.stderr), seeded.stderr
        node = Node("held", tmp_path, env, settings=SETTINGS)   # idle close after 3 s
        try:
            node.wait_for_log(START_WARNING.pattern, timeout=60)
            warning = START_WARNING.search(node.text())
            assert warning.group(1) == "stop" and "@" in warning.group(2), warning.group(0)
            assert "waits (CONTROL_ON_START = 'wait')" in warning.group(4), warning.group(0)
            wait_until(lambda: [r.get("waiting") for r in node_reports(redis, "products")] == [1],
                       30, "the node's report: waiting")
            time.sleep(2 * SETTINGS["MAX_IDLE_TIME_BEFORE_CLOSE"])  # no idle close may come
            assert node.proc.poll() is None, node.tail()
            assert hits(site) == 0
            status = _status(redis_url)
            control = status["control"]
            assert control["state"] == "stop" and control["by"] == warning.group(2)
            assert control["since"] <= time.time() * 1000 and control["then_clear"] is False
            assert control["resume"] == "crawlctl resume products"
            assert [(r["state"], r["waiting"]) for r in status["nodes"]] == [("stop", 1)]
            table = crawlctl(redis_url, "status", "products").stdout
            assert "stop (since" in table, table
            assert re.search(r"to crawl again[^│]*│ +crawlctl resume products │", table), table
            assert "waiting: found at start" in table, table
            crawlctl(redis_url, "resume", "products")
            assert node.wait(180) == 0, node.tail()
        finally:
            node.stop()
        assert len(START_WARNING.findall(node.text())) == 1
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(site.url, products))


def test_a_node_started_into_a_drain_exits_1_with_control_on_start_exit(
        redis, redis_url, mongo_uri, database, tmp_path):
    """With nothing left to drain, a node started into yesterday's drain closed at
    once as "finished", exit 0. With CONTROL_ON_START = exit (here from the
    environment, as a container sets it) it exits 1, saying why."""
    crawlctl(redis_url, "drain", "products")
    redis.hset(control_key("products"), "by", "eve\x1b[31m@ops\nFAKE LINE")   # untrusted
    env = {**node_env(redis_url, mongo_uri, database.name), "CONTROL_ON_START": "exit"}
    started = time.monotonic()
    node = Node("exiter", tmp_path, env, settings=SETTINGS)
    assert node.wait(60) == 1, node.tail()
    assert time.monotonic() - started < 60
    text = node.text()
    assert "'finish_reason': 'control_drain_at_start'" in text, node.tail()
    warning = START_WARNING.search(text)
    assert warning.group(1) == "drain", text
    assert "closes now, exit code 1 (CONTROL_ON_START = 'exit')" in warning.group(4)
    assert warning.group(2) == "eve\\x1b[31m@ops\\nFAKE LINE"   # escaped: one line, no ESC
    assert "\nFAKE LINE" not in text and "\x1b" not in text


def test_seed_warns_while_draining_and_status_shows_who_when_and_then_clear(
        redis, redis_url):
    """`crawlctl seed` said nothing while the crawl was draining (the seeds then
    waited unread). It warns on stderr and still pushes; `status` shows the
    drain with who/when, whether it ends by itself, and how to resume; an
    old hand-written value (a state alone) reads as unknown writer/time."""
    out = crawlctl(redis_url, "drain", "products", "--then-clear")
    assert "back to run by itself" in out.stdout
    seeded = crawlctl(redis_url, "seed", "products", "http://127.0.0.1:9/")
    assert "state 'drain'" in seeded.stderr and "until the drain ends by itself" in seeded.stderr
    assert "crawlctl resume products" in seeded.stderr and "pushed 1 seed" in seeded.stdout
    assert redis.llen(start_urls_key("products")) == 1
    control = _status(redis_url)["control"]
    assert control["state"] == "drain" and control["then_clear"] is True
    assert re.fullmatch(r"\S+@\S+", control["by"]) and control["since"] > 0
    assert control["resume"] == "crawlctl resume products"
    table = crawlctl(redis_url, "status", "products").stdout
    assert re.search(r"when the drain is complete +│ +back to run by itself", table), table
    crawlctl(redis_url, "resume", "products")
    resumed = _status(redis_url)["control"]
    assert (resumed["state"], resumed["by"], resumed["then_clear"], resumed["resume"]) == (
        "run", control["by"], False, None) and resumed["since"] >= control["since"]
    assert "warning" not in crawlctl(redis_url, "seed", "products", "http://127.0.0.1:9/").stderr
    redis.delete(control_key("products"))
    redis.hset(control_key("products"), mapping={"state": "stop", "since": "junk"})
    control = _status(redis_url)["control"]
    assert (control["state"], control["since"], control["by"]) == ("stop", None, "")
    assert "set by an unknown writer at an unknown time" in crawlctl(
        redis_url, "seed", "products", "http://127.0.0.1:9/").stderr


@pytest.mark.slow
def test_a_drain_with_then_clear_goes_back_to_run_once_complete(
        redis, redis_url, mongo_uri, database, tmp_path):
    """`crawlctl drain --then-clear`: once the frontier is done and the draining
    nodes have closed, the state is run again, so tomorrow's nodes crawl. A node
    started during the drain helps finish it and waits (it does not close, nor
    block the clearing), then crawls the seed pushed during the drain."""
    env = node_env(redis_url, mongo_uri, database.name)
    # The first site is slow (1 s a page, one at a time: ~20 s of drain) so that
    # the helper, started after the drain, finds it under way.
    with DemoSite(products=20, latency_ms=1000, faults=False) as first, \
            DemoSite(products=10, latency_ms=20, faults=False) as second:
        drainer = Node("drainer", tmp_path, env, settings={
            **SETTINGS, "MAX_IDLE_TIME_BEFORE_CLOSE": 0, "CONCURRENT_REQUESTS": 1})
        helper = None
        try:
            drainer.wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("products"), first.url)
            wait_until(lambda: database["products"].count_documents({}) >= 3, 120, "3 items")
            crawlctl(redis_url, "drain", "products", "--then-clear")
            drainer.wait_for_log("Operator control: drain", timeout=30)
            crawlctl(redis_url, "seed", "products", second.url)    # waits for the run
            helper = Node("helper", tmp_path, env, settings=SETTINGS)
            helper.wait_for_log(START_WARNING.pattern, timeout=60)
            assert "back to run by itself once the drain is complete" in helper.text()
            assert drainer.proc.poll() is None, "the drain ended before the helper started"
            assert drainer.wait(180) == 0, drainer.tail()   # drained: closes, exit 0
            wait_until(lambda: redis.hget(control_key("products"), "state") == b"run", 60,
                       "the drain to end by itself")
            by = redis.hget(control_key("products"), "by").decode()
            assert re.fullmatch(r"node (drainer|helper)-\S+ \(drain complete\)", by), by
            assert redis.hget(control_key("products"), "then_clear") is None
            assert helper.wait(180) == 0, helper.tail()     # crawled the second site, idle
        finally:
            drainer.stop()
            if helper is not None:
                helper.stop()
        assert "Drained" in drainer.text() and "Drained" not in helper.text()
        assert helper.stat("item_scraped_count") >= 10   # the second site, and its share of the first
        assert database["products"].count_documents({}) == 30
        assert sum(second.stats().values()) > 0 and redis.llen(start_urls_key("products")) == 0


def test_a_node_started_into_a_finished_then_clear_drain_ends_it_and_crawls(
        redis, redis_url, mongo_uri, database, tmp_path):
    """The last draining node died before it could end its --then-clear drain:
    the next node, held by it, finds it complete and ends it itself."""
    crawlctl(redis_url, "drain", "products", "--then-clear")
    env = node_env(redis_url, mongo_uri, database.name)
    node = Node("next", tmp_path, env, settings=SETTINGS)
    assert node.wait(120) == 0, node.tail()     # idle-closes once it runs again
    assert redis.hget(control_key("products"), "state") == b"run"
    assert re.fullmatch(rb"node next-\S+ \(drain complete\)",
                        redis.hget(control_key("products"), "by"))
    text = node.text()
    assert START_WARNING.search(text).group(1) == "drain"
    assert "Operator control: run after drain" in text and "Drained" not in text


def test_a_drain_is_complete_only_when_nothing_is_left_and_ends_only_that_drain(
        redis, redis_url):
    """drain_complete: nothing queued, delayed or leased, and no live node but
    this one and those that report they wait; clear_finished_drain: only the
    drain it read, set with --then-clear."""
    import asyncio

    from redis import asyncio as aioredis

    from crawlproject.control import (clear_finished_drain, drain_complete,
                                      node_reports_key, read_state, set_state)

    keys = FrontierKeys("products")
    now_ms = int(time.time() * 1000)

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        try:
            checks = [await drain_complete(client, "products", 1, "me")]
            redis.zadd(keys.nodes, {"me": now_ms + 60_000, "dead": now_ms - 1,
                                    "busy": now_ms + 60_000})
            checks.append(await drain_complete(client, "products", 1, "me"))   # busy is live
            redis.hset(node_reports_key("products"), "busy",
                       json.dumps({"waiting": 1, "at": now_ms}))
            checks.append(await drain_complete(client, "products", 1, "me"))   # it waits
            redis.hset(keys.inflight, "m1", "busy")
            checks.append(await drain_complete(client, "products", 1, "me"))   # a lease
            redis.delete(keys.inflight)
            redis.hset(keys.kstate, "||qlen", "2")
            checks.append(await drain_complete(client, "products", 1, "me"))   # queued
            redis.hset(keys.kstate, "||qlen", "0")
            redis.zadd(keys.delayed, {"m2": now_ms})
            checks.append(await drain_complete(client, "products", 1, "me"))   # a retry
            set_state(redis, "products", "drain", by="a@b")
            since = read_state(redis, "products")["since"]
            ends = [await clear_finished_drain(client, "products", since, "node x")]  # no flag
            set_state(redis, "products", "drain", by="a@b", then_clear=True)
            since = read_state(redis, "products")["since"]
            ends.append(await clear_finished_drain(client, "products", since - 1, "node x"))
            ends.append(await clear_finished_drain(client, "products", since, "node x"))
            ends.append(await clear_finished_drain(client, "products", since, "node x"))
            return checks, ends
        finally:
            await client.aclose()

    checks, ends = asyncio.run(scenario())
    assert checks == [True, False, True, False, False, False]
    assert ends == [False, False, True, False]
    state = read_state(redis, "products")
    assert (state["state"], state["by"], state["then_clear"]) == ("run", "node x", False)


def test_a_readme_project_node_started_into_a_stop_exits_1_with_exit(
        redis, redis_url, mongo_uri, database, tmp_path):
    """`scrapy crawl` in a new project with the README block (COMMANDS_MODULE
    included) says so by its exit code when CONTROL_ON_START = exit finds the
    crawl stopped: Scrapy's own command exits 0 whatever the finish reason."""
    from tests.test_startup_log import readme_project

    project = readme_project(tmp_path)
    crawlctl(redis_url, "stop", "shop")
    log = tmp_path / "shop.log"
    out = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "shop", "-s", f"LOG_FILE={log}",
         "-s", f"REDIS_URL={redis_url}", "-s", f"MONGO_URI={mongo_uri}",
         "-s", f"MONGO_DATABASE={database.name}", "-s", "CONTROL_ON_START=exit"],
        cwd=project, env={**node_env(redis_url, mongo_uri, database.name)},
        capture_output=True, text=True, timeout=120)
    text = log.read_text()
    assert out.returncode == 1, text[-3000:] + out.stderr[-2000:]
    assert "The crawl of 'shop' is in state 'stop', set by " in text
    assert "To crawl again: crawlctl resume shop" in text
    assert "finish reason 'control_stop_at_start': exit code 1" in text


def test_the_dashboard_shows_who_when_and_how_to_resume(redis, redis_url):
    from crawlproject.dashboard import render

    crawlctl(redis_url, "drain", "products", "--then-clear")
    redis.hset("{products}:node_reports", "n1", json.dumps(
        {"state": "drain", "waiting": 1, "at": int(time.time() * 1000)}))
    data = _status(redis_url)
    control = render.control_fragment(data)
    assert re.search(r"since <time[^>]*>[^<]* UTC</time> by \S+@\S+; back to run by itself "
                     r"once complete</p>", control), control
    assert "<code>crawlctl resume products</code>" in control
    assert "drain (waiting: found at start)" in render.nodes_fragment(data)


@pytest.mark.parametrize("since, ghost", [
    ("x", False), ("-5", False), ("1_000", False), (" 12", False), ("+12", False), ("0", False),
    ("99999999999999999999999", False), ("", False), (None, False), (None, True)])
def test_a_drain_whose_since_is_garbage_is_ended_like_any_other(redis, redis_url, since, ghost):
    """A `--then-clear` drain whose `since` holds garbage never ended: the node
    read it as an unknown time ('') and CLEAR_DRAIN compared that with the
    garbage. A `since` that is no time is an unknown time on both sides: the
    drain is ended by a node that finds it complete, as the nodes do it (the
    functions they call); a newer drain with a real time is still left alone. A
    node registered with a deadline no lease can have (ghost) is not live: it
    kept every drain for ever."""
    import asyncio

    from redis import asyncio as aioredis

    from crawlproject.control import (clear_finished_drain, drain_complete, read_control,
                                      read_state, set_state)

    set_state(redis, "products", "drain", by="a@b", then_clear=True)
    if since is None:
        redis.hdel(control_key("products"), "since")
    else:
        redis.hset(control_key("products"), "since", since)
    if ghost:
        redis.zadd(FrontierKeys("products").nodes, {"ghost": time.time() * 1000 + 10**12})

    async def scenario():
        client = aioredis.Redis.from_url(redis_url)
        try:
            info = await read_control(client, "products")     # as NodeControl.clear_finished_drain
            assert info["state"] == "drain" and info["then_clear"] and info["since"] is None
            assert await drain_complete(client, "products", 1, "me")
            return await clear_finished_drain(client, "products", info.get("since"),
                                              "node me (drain complete)")
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) is True
    state = read_state(redis, "products")
    assert (state["state"], state["by"]) == ("run", "node me (drain complete)")
    # A drain given again since (a real time) is not ended by a caller that read junk.
    set_state(redis, "products", "drain", by="a@b", then_clear=True)

    async def stale():
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await clear_finished_drain(client, "products", None, "node me")
        finally:
            await client.aclose()
    assert asyncio.run(stale()) is False
    assert read_state(redis, "products")["state"] == "drain"
