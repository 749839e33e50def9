"""pytest fixtures that run real local servers (see devtools.services).

Import them in a conftest with ``from tests.fixtures_services import *`` or
load the module as a plugin with ``-p tests.fixtures_services``.

Session-scoped servers start the first time a test asks for them:

* ``redis_server`` / ``redis_url``: a RedisServer on a free port.
* ``redis``: a ``redis.Redis`` client; the server is FLUSHALLed after each test.
* ``mongo_server`` / ``mongo_uri``: a MongoServer with storage in a tmp dir.
* ``mongo_db``: a pymongo Database with a unique name, dropped after the test.
* ``redis_cluster``: a 3-master RedisCluster.
"""

from __future__ import annotations

import uuid

import pymongo
import pytest
import redis as redis_lib

from devtools.services import MongoServer, RedisCluster, RedisServer

__all__ = [
    "redis_server",
    "redis_url",
    "redis",
    "mongo_server",
    "mongo_uri",
    "mongo_db",
    "redis_cluster",
]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A Redis server on a free port for the whole session."""
    server = RedisServer(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server):
    """``redis://127.0.0.1:PORT/0`` of the session's Redis."""
    return redis_server.url


@pytest.fixture
def redis(redis_url):
    """A ``redis.Redis`` client; every database is flushed after the test."""
    client = redis_lib.Redis.from_url(redis_url)
    yield client
    client.flushall()
    client.close()


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory):
    """A MongoDB-wire server (SecantusDB) on a free port for the whole session."""
    server = MongoServer(storage_path=tmp_path_factory.mktemp("mongo"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mongo_uri(mongo_server):
    """``mongodb://127.0.0.1:PORT/`` of the session's MongoDB-wire server."""
    return mongo_server.uri


@pytest.fixture
def mongo_db(mongo_uri):
    """A pymongo Database with a unique name, dropped after the test."""
    client = pymongo.MongoClient(mongo_uri)
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield client[name]
    client.drop_database(name)
    client.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A 3-master Redis Cluster for the whole session (started on first use)."""
    cluster = RedisCluster(masters=3, data_dir=tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()
