"""Connection settings: environment variables, defaults, redaction."""

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlproject.connection import is_cluster_url, redact_url


def _settings_in_subprocess(env_overrides):
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "MONGO_URI", "MONGO_DATABASE", "REDIS_CLUSTER")}
    env.update(env_overrides)
    # What the components read (crawlproject.defaults.setting) in this project.
    code = ("import json; from scrapy.utils.project import get_project_settings as g; s = g();"
            "from crawlproject.defaults import setting;"
            "print(json.dumps({k: setting(s, k) for k in ('REDIS_URL', 'MONGO_URI',"
            " 'MONGO_DATABASE', 'REDIS_CLUSTER')}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_settings_have_local_defaults():
    s = _settings_in_subprocess({})
    assert s["REDIS_URL"] == "redis://127.0.0.1:6379/0"
    assert s["MONGO_URI"] == "mongodb://127.0.0.1:27017/"
    assert s["MONGO_DATABASE"] == "crawlproject"
    assert s["REDIS_CLUSTER"] is False


def test_settings_read_environment():
    s = _settings_in_subprocess({
        "REDIS_URL": "rediss://:pw@10.0.0.5:6380/2",
        "MONGO_URI": "mongodb://u:p@db:27017/?authSource=admin",
        "MONGO_DATABASE": "shop", "REDIS_CLUSTER": "true",
    })
    assert s == {"REDIS_URL": "rediss://:pw@10.0.0.5:6380/2",
                 "MONGO_URI": "mongodb://u:p@db:27017/?authSource=admin",
                 "MONGO_DATABASE": "shop", "REDIS_CLUSTER": True}


def test_redact_url_hides_passwords():
    assert redact_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert redact_url("rediss://:s3cret@host:6380") == "rediss://***@host:6380"
    assert redact_url("mongodb://u:p%40ss@a:1,b:2/db?authSource=admin") == \
        "mongodb://u:***@a:1,b:2/db?authSource=admin"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
    assert "s3cret" not in redact_url("http://user:s3cret@proxy:8080")


def test_cluster_url_flag():
    assert is_cluster_url("redis://h:7000/0?cluster=true")
    assert not is_cluster_url("redis://h:7000/0")
    assert is_cluster_url("redis://h:7000/0", cluster_setting=True)


def test_passwords_in_query_strings_are_redacted():
    url = "redis://127.0.0.1:6379/0?password=hunter2&db=1"
    assert "hunter2" not in redact_url(url) and "db=1" in redact_url(url)
    assert "s3" not in redact_url("rediss://u:s3@h:1/0?ssl_keyfile_password=s3")


def test_components_honour_the_environment_in_a_users_own_project(monkeypatch):
    """A project whose settings.py does not mention REDIS_URL, MAX_IDLE... still
    gets what the README promises: the environment variable, then the default."""
    from scrapy.utils.test import get_crawler

    from crawlproject.connection import redis_cluster_from_settings, redis_url_from_settings
    from tests.spiders.leaf import LeafSpider

    monkeypatch.setenv("REDIS_URL", "redis://10.9.8.7:6390/3")
    monkeypatch.setenv("REDIS_CLUSTER", "true")
    monkeypatch.setenv("MAX_IDLE_TIME_BEFORE_CLOSE", "42")
    crawler = get_crawler(LeafSpider, {})          # no project settings at all
    assert redis_url_from_settings(crawler.settings) == "redis://10.9.8.7:6390/3"
    assert redis_cluster_from_settings(crawler.settings) is True
    monkeypatch.setenv("REDIS_CLUSTER", "false")
    spider = crawler._create_spider()
    assert spider.max_idle_time == 42
    # An explicit setting still wins over the environment.
    crawler = get_crawler(LeafSpider, {"REDIS_URL": "redis://127.0.0.1:1/0",
                                       "MAX_IDLE_TIME_BEFORE_CLOSE": 5})
    assert redis_url_from_settings(crawler.settings) == "redis://127.0.0.1:1/0"
    assert crawler._create_spider().max_idle_time == 5


def test_scrapy_redis_host_and_port_settings_are_honoured(monkeypatch):
    from scrapy.settings import Settings

    from crawlproject.connection import redis_url_from_settings

    monkeypatch.delenv("REDIS_URL", raising=False)
    assert redis_url_from_settings(Settings({"REDIS_HOST": "10.0.0.5", "REDIS_PORT": 6380})) == \
        "redis://10.0.0.5:6380/0"


def test_node_ids_are_unique_per_process_incarnation():
    from scrapy.settings import Settings

    from crawlproject.node import new_node_id, node_name

    settings = Settings({"NODE_ID": "worker 1.example"})
    first, second = new_node_id(settings), new_node_id(settings)
    assert first != second and first.startswith("worker_1_example-")
    assert node_name(settings) == "worker_1_example"


def test_a_fresh_cluster_client_routes_its_first_concurrent_commands_by_slot(redis_cluster):
    """A node's first Redis calls run at once (12 frontier partitions, the
    control watcher). redis-py 8.1 sent them before it knew the slots: MOVED,
    then every fifth MOVED closed the connections the others were using
    (AttributeError out of the call); the
    control watcher's first read failed and the node never unpaused (CI).
    Real 3-master cluster; each client's first 13 commands go at once."""
    import asyncio

    from crawlproject.connection import redis_from_url

    async def first_calls(k: int) -> list:
        client = redis_from_url(redis_cluster.url, cluster=True, asyncio=True)
        script = client.register_script("return redis.call('INCR', KEYS[1])")
        try:
            calls = [script(keys=[f"{{race{k}:{p}}}:n"]) for p in range(12)]
            return await asyncio.gather(client.hget(f"race{k}:control", "state"), *calls,
                                        return_exceptions=True)
        finally:
            await client.aclose()

    async def scenario():
        return [await first_calls(k) for k in range(20)]

    results = asyncio.run(scenario())
    errors = [repr(r) for rs in results for r in rs if isinstance(r, BaseException)]
    assert errors == []
    assert all(rs == [None] + [1] * 12 for rs in results)


def test_a_socket_closed_under_a_cluster_command_is_a_connection_error():
    """What redis-py 8.1 raises when another task disconnected the connection a
    command was using (seen once in CI as a cluster came back) is recognised as
    a closed connection, so the node counts an outage and retries instead of
    logging a bug. The error is produced by redis-py's own code, on a real
    connection object that has no socket."""
    import asyncio

    from redis.asyncio.connection import Connection

    from crawlproject.connection import _closed_under_the_command

    async def closed_socket_error():
        try:
            await Connection(host="127.0.0.1", port=1)._send_packed_command([b"PING\r\n"])
        except AttributeError as exc:
            return exc

    exc = asyncio.run(closed_socket_error())
    assert exc is not None and "writelines" in str(exc)
    assert _closed_under_the_command(exc)
    try:
        None.writelines  # the same error, from anywhere else: a bug, not a connection
    except AttributeError as other:
        assert not _closed_under_the_command(other)


# -- asyncio clients pack commands with hiredis ------------------------------------

_ARG = st.one_of(st.text(), st.binary(), st.integers(), st.floats(),
                 st.sampled_from(["", " ", "a b", "é", "\x00"]))


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["EVALSHA", "SET", "CONFIG GET", b"HSET", b"CLIENT SETNAME"]),
       st.lists(_ARG, max_size=30))
def test_hiredis_packing_sends_the_bytes_redis_pys_own_packer_sends(command, args):
    """The asyncio connection's packer is swapped for hiredis' (C): whatever a
    caller passes, the bytes on the wire are redis-py's, or its error is."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from crawlproject.connection import hiredis_packing

    fast, slow = hiredis_packing(Connection)(), Connection()
    try:
        expected = b"".join(slow.pack_command(command, *args))
    except DataError:
        with pytest.raises(DataError):
            fast.pack_command(command, *args)
        return
    assert b"".join(fast.pack_command(command, *args)) == expected


def test_a_client_with_another_encoding_keeps_redis_pys_packer():
    """hiredis writes str as UTF-8: a client set to another encoding is packed
    by redis-py, in that encoding."""
    from redis.asyncio.connection import Connection

    from crawlproject.connection import hiredis_packing

    for encoding in ("latin-1", "utf-16"):
        fast, slow = hiredis_packing(Connection)(encoding=encoding), Connection(encoding=encoding)
        assert (b"".join(fast.pack_command("SET", "k", "é"))
                == b"".join(slow.pack_command("SET", "k", "é")))
    assert "é".encode("latin-1") in b"".join(
        hiredis_packing(Connection)(encoding="latin-1").pack_command("SET", "k", "é"))


def test_an_asyncio_client_packs_with_hiredis_and_keeps_redis_pys_answers(redis_url):
    """End to end on a real Redis: the client `redis_from_url` builds packs with
    hiredis; values hiredis does not take (memoryview, bytearray) still go
    through, pipelines too, and what redis-py refuses is still refused."""
    import asyncio

    from redis.exceptions import DataError

    from crawlproject.connection import redis_from_url

    async def scenario():
        client = redis_from_url(redis_url, asyncio=True)
        try:
            assert client.connection_pool.connection_class._hiredis_packing
            script = client.register_script("return {ARGV[1], ARGV[2], ARGV[3], KEYS[1]}")
            got = await script(keys=["hp:k"], args=["é", 7, 2.5])
            await client.set("hp:mv", memoryview(b"abc"))
            await client.set("hp:ba", bytearray(b"xyz"))
            pipe = client.pipeline(transaction=False)
            pipe.get("hp:mv")
            pipe.get("hp:ba")
            piped = await pipe.execute()
            for bad in (None, True, {"a": 1}):
                with pytest.raises(DataError):
                    await client.set("hp:bad", bad)
            return got, piped
        finally:
            await client.aclose()

    got, piped = asyncio.run(scenario())
    assert got == ["é".encode(), b"7", b"2.5", b"hp:k"]
    assert piped == [b"abc", b"xyz"]
