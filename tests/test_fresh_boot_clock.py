"""On a machine booted a moment ago (CI's), ``time.monotonic()`` reads a few
seconds: "never" must not be ``0.0`` there (STYLE.md, "Clocks"), or the first
report, rush, registration or warning waits until the machine has been up for
its interval.

The in-process tests shift ``time.monotonic()`` itself (every reader in the
process sees the same clock, asyncio's loop too) to read about one second; the
last test runs these and two end-to-end tests under a real fresh-boot clock, in
a Linux time namespace (root only)."""

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from scrapy import Request
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from crawlproject.control import ControlWatcher
from crawlproject.dashboard.feed import FRONTIER_SERIES, RATE_SERIES, SpiderFeed
from crawlproject.frontier.client import FrontierClient
from crawlproject.frontier.sitelimits import PolitenessConfig
from crawlproject.frontier.queue import SyncResult
from crawlproject.proxies.middleware import ProxyPoolMiddleware
from tests.crawl_helpers import ROOT


@pytest.fixture
def fresh_boot(monkeypatch):
    """``time.monotonic()`` as on a machine booted a second ago."""
    real = time.monotonic
    start = real()
    monkeypatch.setattr(time, "monotonic", lambda: real() - start + 1.0)


class _Reports:
    """The Redis calls of a ControlWatcher: the state it reads, the reports it sends."""

    def __init__(self):
        self.state, self.sent = b"run", []

    async def hget(self, key, field):
        return self.state

    async def hmget(self, key, fields):
        return [None] * len(fields)

    async def hset(self, key, field, value):
        self.sent.append(field)


def test_a_node_reports_at_once_and_again_at_a_change_of_state(fresh_boot):
    redis = _Reports()
    watcher = ControlWatcher(redis, "shop", lambda old, new: None, report=lambda: {},
                             node="n1", report_interval=600)

    async def main():
        await watcher._send_report()
        await watcher._send_report()              # within the interval: not again
        assert redis.sent == ["n1"]
        redis.state = b"pause"
        await watcher.poll()
        await watcher._send_report()              # the new state at once
        assert redis.sent == ["n1", "n1"]

    asyncio.run(main())


class _Partition:
    """A frontier partition answering every call at once with what it asked to take."""

    def __init__(self):
        self.node, self.partition, self.keys = "n1", 0, None
        self.batches, self._seq = [], 0

    async def sync(self, batch):
        self.batches.append(batch)
        taken = []
        for _ in range(batch.take):
            self._seq += 1
            taken.append((f"0:{self._seq}@h", b"p%d" % self._seq))
        return SyncResult(taken=taken, added=len(batch.adds), duplicates=0, queued=100,
                          delayed=0 if batch.maintenance else -1, inflight=0, reclaimed=0,
                          now_ms=1_000_000)


class _Outage:
    def ok(self, extra=None, source=""):
        pass

    def failed(self, *args, **kwargs):
        raise AssertionError(args)


def test_a_client_registers_at_its_first_call_and_may_rush_at_once(fresh_boot):
    """Every pause is a minute: the first call still renews the node's lease
    (and does not claim it registered), and a request that outranks the
    buffer still goes at once (the first rush)."""
    partition = _Partition()
    fc = FrontierClient([partition], PolitenessConfig(), accept=lambda p, m, payload: payload,
                        before_tick=lambda: None, count=lambda name, value: None,
                        outage=_Outage(), log_extra={}, prefetch=8, batch_size=100,
                        flush_interval=60, min_sync_interval=60, idle_poll=60, heartbeat=60,
                        lease_ttl=120)

    async def main():
        await fc.loop.tick()
        first = partition.batches[0]
        assert first.maintenance and not first.registered and len(fc.buffer) == 8
        assert fc.next().item == b"p1"
        fc.add('{"url": "http://h/top"}', None, 5, 0, "h")
        await fc.loop.tick()
        assert len(partition.batches) == 2, "the outranking request waited for the pause"
        assert partition.batches[1].take >= 1 and len(partition.batches[1].adds) == 1

    asyncio.run(main())


def test_no_usable_proxy_is_said_at_once(fresh_boot, caplog):
    crawler = get_crawler(settings_dict={"PROXY_POOL_ENABLED": True, "PROXY_POOL": []})
    mw = build_from_crawler(ProxyPoolMiddleware, crawler)
    crawler.spider = SimpleNamespace(name="s")
    mw.store = SimpleNamespace(keys=SimpleNamespace(pool="{s}:proxy:pool"))
    with caplog.at_level(logging.WARNING):
        assert isinstance(mw.process_request(Request("http://shop/1")), Request)
        assert "No usable proxy for shop" in caplog.text        # the first wait
        mw._check_usable(0)                                     # the state starts
        mw._report_empty(time.monotonic())
        assert "No usable proxy for 0s" in caplog.text          # its first reminder


def test_a_dashboard_feed_nobody_asked_for_is_not_sampled(fresh_boot):
    snapshot = {"at": 0, "frontier": dict.fromkeys(FRONTIER_SERIES, 0),
                "rates": dict.fromkeys(RATE_SERIES, 0.0)}
    feed = SpiderFeed("shop", lambda: snapshot, interval=1.0, window=600.0)
    assert not feed.wanted()
    asyncio.run(feed.current())
    assert feed.wanted() and feed.version == 1


#: end-to-end tests that failed on a fresh-boot clock (a first report, a first rush)
FRESH_BOOT_TESTS = [
    "tests/test_control.py::test_a_change_of_state_is_reported_at_once_not_at_the_next_interval",
    "tests/test_client.py::test_a_request_that_outranks_the_buffer_cuts_the_coalescing_pause_short",
]


def test_under_a_fresh_boot_clock_in_a_time_namespace(tmp_path):
    """Linux time namespace: ``time.monotonic()`` reads about 5 s in the child,
    as on a VM booted a moment ago (docs: /work/shared/ENVIRONMENT.md)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1): a time namespace (unshare --time)")
    with open("/proc/uptime") as f:
        offset = max(0, int(float(f.read().split()[0])) - 5)
    unshare = ["unshare", "--time", f"--monotonic=-{offset}"]
    probe = subprocess.run([*unshare, sys.executable, "-c", "import time; print(time.monotonic())"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --time is unavailable here: {probe.stderr.strip()[-300:]}")
    assert float(probe.stdout) < 60, probe.stdout
    this = os.path.relpath(__file__, ROOT)
    # A session of its own (not an xdist worker of this one), in this test's tmp dir.
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("PYTEST_XDIST") or k in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"))}
    done = subprocess.run(
        [*unshare, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", f"--basetemp={tmp_path / 'inner'}", this, "-k", "not time_namespace",
         *FRESH_BOOT_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
