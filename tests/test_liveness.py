"""The liveness heartbeat (crawlproject/extensions/liveness.py): written by a
real crawl's reactor, stale once that reactor is blocked while /metrics (a
thread) still answers, and the probe command the Dockerfile and Kubernetes run
tells the two states apart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from crawlproject.extensions.liveness import Liveness, check, main, write_beat

ROOT = Path(__file__).resolve().parents[1]


def probe(path: Path, max_age: float) -> subprocess.CompletedProcess:
    """The probe exactly as the deploy files run it (a fresh interpreter)."""
    return subprocess.run([sys.executable, "-m", "crawlproject.extensions.liveness",
                           "--file", str(path), "--max-age", str(max_age)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def wait_for(condition, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} in {timeout:g} s"
        time.sleep(0.05)


def beat(path: Path):
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def test_a_blocked_reactor_fails_the_probe_while_metrics_still_answer(tmp_path):
    path = tmp_path / "alive"
    node = subprocess.Popen([sys.executable, "-m", "tests.liveness_node", str(path)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = node.stdout.readline()
        assert line.startswith("metrics "), (line, node.stderr.read() if node.poll() else "")
        metrics = f"http://127.0.0.1:{int(line.split()[1])}/metrics"
        first = wait_for(lambda: beat(path), "first beat")
        wait_for(lambda: (beat(path) or 0) > first, "second beat")   # the reactor beats
        alive = probe(path, max_age=2.0)
        assert alive.returncode == 0, alive.stderr
        node.send_signal(signal.SIGUSR1)                              # the reactor blocks
        assert node.stdout.readline() == "hanging\n"
        wait_for(lambda: not check(str(path), 2.0)[0], "stale beat")
        with urllib.request.urlopen(metrics, timeout=10) as response:  # what readiness sees
            assert response.status == 200 and b"crawlproject_node_up" in response.read()
        dead = probe(path, max_age=2.0)
        assert dead.returncode == 1 and "reactor stuck" in dead.stderr, dead
    finally:
        node.kill()
        node.communicate(timeout=30)


def test_missing_garbled_and_pre_reboot_beats_fail(tmp_path, capsys):
    path = tmp_path / "alive"
    assert not check(str(path), 30)[0]
    path.write_text("half")
    assert not check(str(path), 30)[0]
    write_beat(str(path), time.monotonic() + 3600)   # a clock ahead of ours: before a reboot
    ok, message = check(str(path), 30)
    assert not ok and "before this boot" in message
    write_beat(str(path), time.monotonic())
    assert main(["--file", str(path), "--max-age", "30"]) == 0
    assert main(["--file", str(tmp_path / "other")]) == 1
    assert "no heartbeat" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["alive"]   # no temporary left behind


def test_off_unless_enabled_and_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(NotConfigured):
        Liveness.from_crawler(get_crawler(settings_dict={}))
    with pytest.raises(ValueError, match="LIVENESS_INTERVAL"):
        Liveness.from_crawler(get_crawler(settings_dict={
            "LIVENESS_ENABLED": True, "LIVENESS_INTERVAL": 0}))
    with pytest.raises(OSError):   # a file it cannot write stops the start, not the probe
        Liveness.from_crawler(get_crawler(settings_dict={
            "LIVENESS_ENABLED": True, "LIVENESS_FILE": str(tmp_path / "no" / "alive")}))


def test_a_beat_that_cannot_be_written_is_logged_once_and_counted(tmp_path, caplog):
    crawler = get_crawler(settings_dict={"LIVENESS_ENABLED": True,
                                         "LIVENESS_FILE": str(tmp_path / "d" / "alive")})
    (tmp_path / "d").mkdir()
    crawler.stats.open_spider()
    ext = Liveness.from_crawler(crawler)
    try:
        (tmp_path / "d" / "alive").unlink()
        (tmp_path / "d").rmdir()                     # the directory is gone: writes fail
        ext.beat()
        ext.beat()
        assert crawler.stats.get_value("liveness/write_errors") == 2
        assert [r.levelname for r in caplog.records
                if "cannot write the liveness heartbeat" in r.getMessage()] == ["ERROR"]
        (tmp_path / "d").mkdir()
        ext.beat()                                   # written again: a later failure logs again
        assert ext.failed is False and check(str(tmp_path / "d" / "alive"), 30)[0]
    finally:
        ext.stop()


def test_a_beat_read_back_at_once_is_fresh_not_from_before_the_boot(tmp_path):
    # the beat is written in ms: rounded up, one read within the same ms looked newer
    # than the clock, i.e. "from before this boot" (about half the reads did)
    path = str(tmp_path / "alive")
    for _ in range(200):
        write_beat(path, time.monotonic())
        ok, message = check(path, 30)
        assert ok, message
