"""Run real ``scrapy crawl`` nodes as subprocesses, as users do on each machine."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Node:
    """One ``scrapy crawl <spider>`` process with its own log file."""

    def __init__(self, name: str, log_dir: Path, env: dict, spider: str = "products",
                 settings: dict | None = None, spider_args: dict | None = None):
        self.name = name
        self.log = log_dir / f"{name}.log"
        cmd = [sys.executable, "-m", "scrapy", "crawl", spider, "-s", f"LOG_FILE={self.log}",
               "-s", f"NODE_ID={name}"]
        for key, value in (settings or {}).items():
            cmd += ["-s", f"{key}={value}"]
        for key, value in (spider_args or {}).items():
            cmd += ["-a", f"{key}={value}"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_log(self, pattern: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.text()):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited early:\n{self.tail()}")
            time.sleep(0.1)
        raise AssertionError(f"{self.name}: {pattern!r} not logged in {timeout}s:\n{self.tail()}")

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
            raise AssertionError(f"{self.name} did not finish in {timeout}s:\n{self.tail()}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stat(self, name: str) -> int:
        match = re.search(rf"'{re.escape(name)}': (\d+)", self.text())
        return int(match.group(1)) if match else 0

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def errors(self) -> list[str]:
        return [line for line in self.text().splitlines() if "] ERROR:" in line or "Traceback" in line]


def crawl_until_done(nodes, push, timeout: float = 240) -> list[int]:
    """Wait until every node reads seeds, call ``push()`` (the seeds), wait for
    every node to exit; returns their exit codes. Nodes still running after
    that (or after a failure) are killed."""
    try:
        for node in nodes:
            node.wait_for_log("Reading seeds from")
        push()
        return [node.wait(timeout) for node in nodes]
    finally:
        for node in nodes:
            node.stop()


def readme_settings_block() -> str:
    """The settings block of README.md's "Use it in your own Scrapy project",
    as a user pastes it."""
    section = (ROOT / "README.md").read_text().split("## Use it in your own Scrapy project", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def readme_settings(extra: dict | None = None):
    """The settings a crawler of a user project gets from the README block (then
    *extra*, at project priority too): its ``ADDONS`` applied, as Scrapy does
    before a crawl."""
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings
    from scrapy.spiders import Spider

    values: dict = {}
    exec(readme_settings_block(), values)  # noqa: S102 - the block a user pastes, as written
    settings = Settings()
    settings.setdict({k: v for k, v in values.items() if k.isupper()}, "project")
    settings.setdict(extra or {}, "project")
    crawler = Crawler(Spider, settings)
    crawler.addons.load_settings(crawler.settings)
    return crawler.settings


def user_project(path: Path, name: str, spiders: str, extra_settings: str = "") -> Path:
    """A Scrapy project of a user's at *path*: ``scrapy.cfg``, a settings
    module with what ``scrapy startproject`` writes that matters here (bot
    name, spider modules, ``ROBOTSTXT_OBEY = True``), the README's settings
    block pasted as written, loopback allowed (the test sites listen on
    127.0.0.x: ``DOWNLOAD_ALLOWED_NETWORKS``), then *extra_settings*;
    *spiders* is its spider module. (Written, not generated with ``scrapy
    startproject``: a second of CPU less a project.)"""
    package = path / name
    (package / "spiders").mkdir(parents=True)
    (path / "scrapy.cfg").write_text(f"[settings]\ndefault = {name}.settings\n")
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "spiders" / "kinds.py").write_text(spiders)
    (package / "settings.py").write_text(
        f'BOT_NAME = "{name}"\nSPIDER_MODULES = ["{name}.spiders"]\n'
        f'NEWSPIDER_MODULE = "{name}.spiders"\nROBOTSTXT_OBEY = True\n\n'
        + readme_settings_block() + '\nDOWNLOAD_ALLOWED_NETWORKS = ["loopback"]\n'
        + extra_settings)
    return path


#: the nodes' FRONTIER_SECRET: what one node stores, the others can prove it wrote
TEST_SECRET = "crawl-test-secret-0123456789"


def node_env(redis_url: str, mongo_uri: str, database: str) -> dict:
    return {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": database,
            "FRONTIER_SECRET": TEST_SECRET, "PYTHONPATH": str(ROOT)}


def stored_products(collection) -> dict[str, dict]:
    """The stored documents by URL.

    The URL is the document's key, so MongoDB itself keeps one document per
    URL: this cannot show an item stored twice. Duplicates are checked where
    they can appear: pages fetched (:func:`assert_fetched_once`) and writes
    made (:func:`assert_written_once`)."""
    return {d["url"]: d for d in collection.find({}, {"_id": 0})}


def expected_hits(pid: int) -> int:
    """How often the demo site serves product *pid* in a correct crawl: once,
    twice for the pages that answer 503 the first time."""
    from devtools.demo.site import FLAKY_EVERY

    return 2 if pid % FLAKY_EVERY == 0 else 1


def assert_fetched_once(served: dict, products: int, faults: bool = True) -> None:
    """Every product page fetched exactly as often as a correct crawl does:
    a broken dupefilter, a lost ack or a lease handed out twice shows here."""
    wrong = {pid: served.get(f"/product/{pid}", 0) for pid in range(1, products + 1)
             if served.get(f"/product/{pid}", 0) != (expected_hits(pid) if faults else 1)}
    assert not wrong, f"product pages fetched a wrong number of times: {wrong}"


def assert_written_once(nodes, products: int) -> None:
    """Across *nodes*: each product scraped once, inserted once, never rewritten."""
    total = {key: sum(n.stat(key) for n in nodes)
             for key in ("item_scraped_count", "mongo/upserted", "mongo/modified")}
    assert total == {"item_scraped_count": products, "mongo/upserted": products,
                     "mongo/modified": 0}, total


def assert_matches_catalog(stored: dict, expected: dict) -> None:
    """Every expected product stored once, with the right clean fields."""
    assert set(stored) == set(expected), (
        f"missing {sorted(set(expected) - set(stored))[:5]}, extra {sorted(set(stored) - set(expected))[:5]}")
    for url, want in expected.items():
        doc = stored[url]
        assert doc["title"] == want["title"], url
        assert Decimal(str(doc["price"].to_decimal())) == want["price"], url
        assert doc["currency"] == want["currency"], url
        assert doc["published"] == want["published"], url
        assert doc["first_seen"] <= doc["updated_at"]


def leases_held(client, name: str) -> int:
    """Frontier entries leased to the node started as *name* (``NODE_ID``), in every
    partition (``T:held:<name>-<pid>-<hex>``); works on a Redis Cluster too."""
    return sum(client.scard(key) for key in client.scan_iter(match=f"*:held:{name}-*"))


def kill_while_holding(node: Node, client, timeout: float = 90) -> int:
    """SIGKILL *node* at a moment it holds leases (so that the kill puts work
    back for others to reclaim); returns how many it held just before."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = leases_held(client, node.name)
        if held:
            node.kill()
            return held
        if node.proc.poll() is not None:
            raise AssertionError(f"{node.name} exited before it held a lease:\n{node.tail()}")
        time.sleep(0.02)
    raise AssertionError(f"{node.name} held no lease within {timeout}s:\n{node.tail()}")


@contextlib.contextmanager
def partial_cluster(tmp_path):
    """A 3-master Redis Cluster of the test's own (one of its masters gets stopped
    or killed) that serves the slots it still can while a master is down. With the
    default ``cluster-require-full-coverage yes`` no partition could go on once
    the master is marked failed: Redis's choice to make, not the frontier's."""
    from devtools.services import RedisCluster

    cluster = RedisCluster(masters=3, data_dir=tmp_path / "cluster").start()
    try:
        for node in cluster.nodes:
            with node.client() as client:
                client.config_set("cluster-require-full-coverage", "no")
        yield cluster
    finally:
        for node in cluster.nodes:
            if node.pid:
                os.kill(node.pid, signal.SIGCONT)
        cluster.stop()
        cluster.cleanup()


def wait_for_node_loops(redis, spider: str, nodes: int, seconds: float = 2.0,
                        timeout: float = 30) -> None:
    """Wait until each of *nodes* nodes has renewed its leases (a frontier call:
    every heartbeat, paused or not) at least *seconds* of its lease later than
    now. Where a test proves that nothing happens (a paused cluster fetches
    nothing), this is the event that bounds the wait: every node's loop went
    round for that long and could have acted; a sleep proves only that time
    passed (a node stopped or starved passes it too)."""
    from crawlproject.keys import FrontierKeys

    key = FrontierKeys(spider).nodes
    first = dict(redis.zrange(key, 0, -1, withscores=True))
    assert len(first) == nodes, first
    deadline = time.monotonic() + timeout
    while True:
        now = dict(redis.zrange(key, 0, -1, withscores=True))
        if all(now.get(node, 0) >= at + seconds * 1000 for node, at in first.items()):
            return
        assert time.monotonic() < deadline, (first, now)
        time.sleep(0.1)
