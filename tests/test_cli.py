"""The operator command line against a real Redis."""

import json
import subprocess
import sys

from crawlproject.frontier.queue import Batch, Frontier


def cli(redis_url, *args):
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", "--redis-url", redis_url, *args],
                          capture_output=True, text=True, timeout=60)


def test_seed_validates_and_pushes(redis, redis_url):
    out = cli(redis_url, "seed", "shop", "http://127.0.0.1/a", '{"url": "http://127.0.0.1/b"}')
    assert out.returncode == 0, out.stderr
    assert redis.lrange("shop:start_urls", 0, -1) == [b'{"url": "http://127.0.0.1/b"}',
                                                      b"http://127.0.0.1/a"]
    bad = cli(redis_url, "seed", "shop", "not a url")
    assert bad.returncode == 2 and "bad" not in bad.stdout and "not an absolute" in bad.stderr
    assert redis.llen("shop:start_urls") == 2


def test_status_dead_replay_and_reset(redis, redis_url):
    f = Frontier(redis, "shop", "n1")
    batch = Batch()
    batch.add('{"url": "http://127.0.0.1/x"}', b"x" * 20, 0)
    batch.take = 1
    member = f.sync(batch).taken[0][0]
    dead = Batch()
    dead.fail(member, "dead", {"payload": '{"url": "http://127.0.0.1/x"}', "priority": 0,
                               "url": "http://127.0.0.1/x", "reason": "HTTP 503", "attempts": 3})
    f.sync(dead)
    status = cli(redis_url, "status", "shop")
    assert status.returncode == 0 and "dead" in status.stdout and "bloom" in status.stdout
    listed = cli(redis_url, "dead", "shop")
    record = json.loads(listed.stdout.splitlines()[0])
    assert record["reason"] == "HTTP 503" and "payload" not in record
    assert "replayed 1" in cli(redis_url, "replay", "shop").stdout
    assert f.counts()["queued"] == 1
    assert cli(redis_url, "reset", "shop").returncode == 2        # needs --yes
    assert f.counts()["queued"] == 1
    assert cli(redis_url, "reset", "shop", "--yes").returncode == 0
    assert not list(redis.scan_iter("{shop}:*"))


def test_password_is_not_printed(redis_url):
    url = redis_url.replace("redis://", "redis://:topsecret@")
    out = cli(url, "status", "shop")
    assert out.returncode == 0 and "redis://***@" in out.stdout.replace("\n", "")
    assert "topsecret" not in out.stdout + out.stderr


def test_unreachable_redis_gives_a_clear_error():
    from crawlproject.services import free_port

    out = cli(f"redis://:topsecret@127.0.0.1:{free_port()}/0", "status", "shop")
    assert out.returncode == 1 and out.stderr.startswith("error: Redis at redis://***@127.0.0.1")
    assert "topsecret" not in out.stdout + out.stderr and "Traceback" not in out.stderr
