"""Replaying a spool without crawling: :func:`replay_spool` and
``python -m crawlproject.cli spool-replay`` (real MongoDB-wire server)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pymongo
import pytest

from crawlproject.pipelines.errors import MongoPipelineError
from crawlproject.pipelines.replay import replay_spool
from crawlproject.pipelines.spool import Spool, target_dir
from devtools.services import MongoServer, free_port
from tests.test_pipeline_mongo import docs, make_pipeline, product, spool_files
from tests.test_pipeline_spool import op

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def own_mongo(tmp_path):
    server = MongoServer(storage_path=tmp_path / "mongo-data")
    server.start()
    yield server
    server.stop()


def spool_while_down(server: MongoServer, database: str, spool_dir: Path, count: int) -> None:
    """A node that closed while MongoDB was down: *count* items left in the spool."""
    pipeline, stats = make_pipeline(server.uri, database, spool_dir, MONGO_SPOOL_AFTER=0.5,
                                    MONGO_BULK_SIZE=10)

    async def run():
        await pipeline.open_spider()
        server.stop()
        try:
            await asyncio.gather(*(pipeline.process_item(product(i)) for i in range(count)))
        finally:
            await pipeline.close_spider()

    asyncio.run(run())
    assert stats.get_value("mongo/spool_left_items") == count


def stored(server: MongoServer, database: str) -> int:
    client = pymongo.MongoClient(server.uri)
    try:
        return len(docs(client[database]["shop"]))
    finally:
        client.close()


def test_replay_spool_writes_every_item_and_empties_the_spool(own_mongo, tmp_path):
    spool_dir = tmp_path / "spool"
    spool_while_down(own_mongo, "rep", spool_dir, 30)
    with pytest.raises(MongoPipelineError, match="not reachable"):
        asyncio.run(replay_spool(own_mongo.uri, "rep", spool_dir,
                                 client_options={"serverSelectionTimeoutMS": 300}))
    assert len(spool_files(spool_dir)) >= 1           # untouched while MongoDB is down
    own_mongo.start()
    assert asyncio.run(replay_spool(own_mongo.uri, "rep", spool_dir)) == (30, 0)
    assert spool_files(spool_dir) == []
    assert stored(own_mongo, "rep") == 30


def test_segments_of_a_live_node_are_left_to_it(mongo_uri, tmp_path):
    spool_dir = tmp_path / "spool"
    directory = target_dir(spool_dir, mongo_uri, "live")

    async def run():
        alive = Spool(directory, owner="alive").open()   # holds its lock like a running node
        try:
            await alive.append([op(i) for i in range(4)])
            await alive.seal()
            return await replay_spool(mongo_uri, "live", spool_dir)
        finally:
            alive.close()

    assert asyncio.run(run()) == (0, 4)
    assert len(spool_files(spool_dir)) == 1


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_spool_replay_command(own_mongo, tmp_path):
    spool_dir = tmp_path / "spool"
    spool_while_down(own_mongo, "cmd", spool_dir, 25)
    secret_uri = own_mongo.uri.replace("mongodb://", "mongodb://crawler:topsecret@")
    down = cli("spool-replay", "--mongo-uri", secret_uri, "--database", "cmd",
               "--spool-dir", str(spool_dir))
    assert down.returncode == 1, down
    assert down.stderr.startswith("error: MongoDB at mongodb://crawler:***@127.0.0.1")
    assert len(down.stderr.strip().splitlines()) == 1
    assert "topsecret" not in down.stdout + down.stderr and "Traceback" not in down.stderr
    own_mongo.start()
    # Defaults from the environment, as for the pipeline.
    out = cli("spool-replay", env={"MONGO_URI": own_mongo.uri, "MONGO_DATABASE": "cmd",
                                   "MONGO_SPOOL_DIR": str(spool_dir)})
    assert out.returncode == 0, out.stderr
    assert f"replayed 25 item(s) from {target_dir(spool_dir, own_mongo.uri, 'cmd')}" in out.stdout
    assert stored(own_mongo, "cmd") == 25
    again = cli("spool-replay", "--mongo-uri", own_mongo.uri, "--database", "cmd",
                "--spool-dir", str(spool_dir))
    assert again.returncode == 0 and "replayed 0 item(s)" in again.stdout


def test_spool_replay_command_with_an_unreachable_server_is_one_line(tmp_path):
    uri = f"mongodb://u:p%40ss@127.0.0.1:{free_port()}/"
    out = cli("spool-replay", "--mongo-uri", uri, "--database", "x",
              "--spool-dir", str(tmp_path / "spool"))
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert "p%40ss" not in out.stderr and "p@ss" not in out.stderr
