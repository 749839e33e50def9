"""Deployment to many scrapyd nodes (crawlproject/scrapyd.py, ``crawlctl deploy /
schedule / jobs``), against two real scrapyd processes with basic auth on 127.0.0.1.

Each scrapyd is set up the documented way, by ``deploy/scrapyd-node.sh --prefix DIR
--no-systemd`` (its own virtualenv with scrapyd and requirements.txt, its scrapyd.conf,
its env file, its launcher), and started by the launcher the script wrote: the crawl
jobs run from the uploaded egg only, in a virtualenv without this checkout. (The wheel
in a clean virtualenv, and deploying from it: tests/test_install.py.) The virtualenvs
install from the package index (a local one or pip's cache on this machine); each
build is bounded. The script builds one virtualenv per test run (:func:`node_venv`);
each node's script then runs again over it, as a re-run on a node does (it finds the
requirements installed and adds the launcher), which saves a 40 s build per node."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import requests
from filelock import FileLock

from devtools.demo.site import DemoSite, expected_items
from crawlproject.keys import start_urls_key
from crawlproject.scrapyd import build_egg
from tests import prebuilt as prebuilt_venvs
from tests.prebuilt import VENV_TIMEOUT, clean_env
from tests.crawl_helpers import ROOT, assert_matches_catalog, stored_products

pytestmark = pytest.mark.slow
USER, PASSWORD = "ops", "Scr4pyd-Deploy-Pass"
PRODUCTS = 6  # no JavaScript page (product 7): no browser needed


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Scrapyd:
    """A real scrapyd on 127.0.0.1 with basic auth, set up by deploy/scrapyd-node.sh
    in its own directory (virtualenv, conf, env file) and started by its launcher.

    The env file is written before the script runs (which keeps it), or, with
    ``generated=True``, the script writes it with credentials of its own and
    :meth:`start` fills in *env* as an operator does."""

    def __init__(self, prefix: Path, env: dict, generated: bool = False,
                 venv: Path | None = None):
        self.dir = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.dir.mkdir()
        if venv is not None:
            (self.dir / "venv").symlink_to(venv, target_is_directory=True)
        self.env, self.generated = env, generated
        self.user, self.password = USER, PASSWORD
        env_file = self.dir / "scrapyd.env"
        if not generated:
            env_file.write_text("".join(f"{k}={v}\n" for k, v in {
                "SCRAPYD_USERNAME": USER, "SCRAPYD_PASSWORD": PASSWORD, **env}.items()))
            env_file.chmod(0o600)
        self.setup_log = self.dir / "setup.out"
        with open(self.setup_log, "w") as out:
            self.setup = subprocess.Popen(
                ["bash", str(ROOT / "deploy" / "scrapyd-node.sh"), "--prefix", str(self.dir),
                 "--no-systemd", "--bind", "127.0.0.1", "--port", str(self.port)],
                env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
        self.proc = None
        self.log = None

    def start(self) -> None:
        """Wait for the node script, then start scrapyd as it says."""
        try:
            code = self.setup.wait(VENV_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.setup.kill()
            raise AssertionError(f"scrapyd-node.sh took over {VENV_TIMEOUT}s") from None
        assert code == 0, self.setup_log.read_text()[-3000:]
        launcher = self.dir / "run-scrapyd"
        output = self.setup_log.read_text()
        assert f"Start with: {launcher}" in output
        env_file = self.dir / "scrapyd.env"
        if self.generated:
            self.fill_in(env_file, output)
        assert env_file.read_text().count(self.password) == 1  # kept as filled in
        assert not list((self.dir / "venv" / "lib").glob("python*/site-packages/crawlproject"))
        self.log = open(self.dir / "scrapyd.out", "w")
        self.proc = subprocess.Popen([str(launcher)], cwd="/", env=clean_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def fill_in(self, env_file: Path, output: str) -> None:
        """The env file the script generated: its own credentials (mode 600, the
        password never printed); the operator adds the Redis and MongoDB addresses."""
        assert env_file.stat().st_mode & 0o777 == 0o600
        values = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
        self.user, self.password = values["SCRAPYD_USERNAME"], values["SCRAPYD_PASSWORD"]
        assert len(self.password) >= 24 and self.password not in output
        assert f"Generated scrapyd's credentials (user crawl, a random password) in {env_file} " \
               "(mode 600)" in output, output
        env_file.write_text("".join(f"{k}={v}\n" for k, v in {**values, **self.env}.items()))

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "scrapyd.out").read_text()
            try:
                if requests.get(self.url + "daemonstatus.json", auth=(self.user, self.password),
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
        if self.setup.poll() is None:
            self.setup.kill()
            self.setup.wait()
        if self.proc is None:
            return
        self.proc.terminate()  # a job still running closes first (the launcher)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def node_venv(tmp_path_factory) -> Path:
    """scrapyd's virtualenv as ``scrapyd-node.sh --prefix`` builds it, once per run
    (the xdist workers share the run's base directory)."""
    base = tmp_path_factory.getbasetemp()
    return ensure_node_venv(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def ensure_node_venv(run_dir: Path) -> Path:
    """Built by whichever caller comes first (conftest.py starts it at collection,
    so the build overlaps other tests), unless deploy/test.sh built it already."""
    prebuilt = prebuilt_venvs.wait_for(prebuilt_venvs.NODE_VAR)
    if prebuilt is not None and (prebuilt / "node" / "venv" / "bin" / "scrapyd").exists():
        return prebuilt / "node" / "venv"
    root = run_dir / "scrapyd-node"
    with FileLock(f"{root}.lock"):
        done = root / "built"
        if not done.exists():
            subprocess.run(["rm", "-rf", str(root)], check=True)
            root.mkdir()
            with open(root / "setup.out", "w") as out:
                code = subprocess.run(
                    ["bash", str(ROOT / "deploy" / "scrapyd-node.sh"), "--prefix", str(root),
                     "--no-systemd", "--bind", "127.0.0.1", "--port", str(free_port())],
                    env=clean_env(), stdout=out, stderr=subprocess.STDOUT,
                    timeout=VENV_TIMEOUT).returncode
            assert code == 0, (root / "setup.out").read_text()[-3000:]
            done.touch()
    return root / "venv"


def crawlctl(*args, password: str | None = PASSWORD, cwd=ROOT, home: Path | None = None,
             user: str = USER) -> subprocess.CompletedProcess:
    """crawlctl with SCRAPYD_USERNAME/PASSWORD (*password*) or, with
    ``password=None``, the credentials of ``~/.netrc`` in *home*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPYD_")}
    env["PYTHONPATH"] = str(ROOT)
    env["HOME"] = str(home or Path(cwd))  # never the machine's own ~/.netrc
    if password is not None:
        env.update(SCRAPYD_USERNAME=user, SCRAPYD_PASSWORD=password)
    return subprocess.run([sys.executable, "-m", "crawlproject.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def sources() -> list[str]:
    """The package's modules, as a fresh checkout has them."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "crawlproject").rglob("*.py")
                  if "vendor" not in p.parts)


def test_the_egg_holds_the_runtime_package_only(tmp_path):
    # An old build directory (a checkout built before modules moved) is not packed.
    stale = ROOT / "build" / "lib" / "crawlproject" / "moved_away_long_ago.py"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("")
    try:
        egg = build_egg(ROOT)
    finally:
        stale.unlink()
    names = zipfile.ZipFile(egg).namelist()
    assert "crawlproject/scheduler.py" in names and "crawlproject/settings.py" in names
    assert sorted(n for n in names if n.endswith(".py")) == sources()
    assert not [n for n in names if n.startswith(("tests/", "bench/", "devtools/"))], names
    entry_points = zipfile.ZipFile(egg).read("EGG-INFO/entry_points.txt").decode()
    assert "settings = crawlproject.settings" in entry_points


def test_deploy_fails_loudly_then_crawls_on_every_node(redis, redis_url, mongo_uri, database,
                                                        tmp_path, node_venv):
    env = {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": database.name}
    # Both node scripts run at once, over the run's scrapyd virtualenv (node_venv).
    nodes = [Scrapyd(tmp_path / name, env, venv=node_venv) for name in ("a", "b")]
    targets = tmp_path / "targets"
    down = free_port()
    # node-c is node-a under another host name: ~/.netrc gives it a wrong password.
    targets.write_text(f"# crawler nodes\nnode-a {nodes[0].url}\nnode-b {nodes[1].url}\n"
                       f"node-c http://localhost:{nodes[0].port}/\n"
                       f"node-down http://127.0.0.1:{down}/\n")
    home = tmp_path / "operator"
    home.mkdir()
    (home / ".netrc").write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n"
                                 f"machine localhost login {USER} password wrong-for-c\n")
    (home / ".netrc").chmod(0o600)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready()
        # Wrong password everywhere, and a node that is down: every target named, exit 1.
        refused = crawlctl("deploy", "--targets-file", str(targets), password="wrong")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        for name in ("node-a", "node-b", "node-c", "node-down"):
            assert f"FAILED {name} (" in refused.stderr, refused.stderr
        assert "HTTP 401" in refused.stderr and "4 of 4 target(s) failed" in refused.stderr
        assert "wrong" not in refused.stdout + refused.stderr
        # Credentials per host from ~/.netrc: the third target's are wrong; it alone
        # is named, the others get the egg, and the command fails.
        third = crawlctl("deploy", "node-a", "node-b", "node-c", "--targets-file",
                         str(targets), password=None, home=home)
        assert third.returncode == 1, third.stdout + third.stderr
        assert "1 of 3 target(s) failed: node-c" in third.stderr, third.stderr
        assert f"FAILED node-c (http://localhost:{nodes[0].port}/" in third.stderr
        assert "HTTP 401" in third.stderr and third.stdout.count("ok node-") == 2
        assert "wrong-for-c" not in third.stdout + third.stderr
        # One node down: the others get the egg, the command still fails.
        partly = crawlctl("deploy", "node-a", "node-b", "node-down", "--targets-file",
                          str(targets))
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


def frontier_leases(client) -> tuple[int, int]:
    """Leases held in the frontier, every partition: (``T:inflight`` entries,
    ``T:held:<node>`` members)."""
    inflight = sum(client.hlen(key) for key in client.scan_iter(match="*}:inflight"))
    held = sum(client.scard(key) for key in client.scan_iter(match="*}:held:*"))
    return inflight, held


def processes_naming(text: str) -> list[int]:
    """PIDs of the processes whose command line holds *text*."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # ended meanwhile
            pass
    return found


def test_stopping_scrapyd_closes_its_running_job(redis, redis_url, mongo_uri, database,
                                                 tmp_path, node_venv):
    """Issue 39: SIGTERM to scrapyd (what systemd, compose and Kubernetes send) with
    a crawl running: the job closes as a node does (finish reason "shutdown", what
    it fetched stored, its leases handed back) and scrapyd waits for it."""
    env = {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": database.name}
    node = Scrapyd(tmp_path / "a", env, generated=True, venv=node_venv)
    targets = tmp_path / "targets"
    targets.write_text(f"node-a {node.url}\n")
    products = 3000  # far more than the job gets through before the stop
    job_pids: list[int] = []
    try:
        node.start()
        node.wait_ready()
        deployed = crawlctl("deploy", "--targets-file", str(targets),
                            user=node.user, password=node.password)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        with DemoSite(products=products, per_page=10, latency_ms=50, faults=False) as site:
            started = crawlctl("schedule", "products", "--targets-file", str(targets),
                               "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=0", "-s", "ROBOTSTXT_OBEY=False",
                               "-s", "RENDERING_ENABLED=False", user=node.user,
                            password=node.password)
            assert started.returncode == 0, started.stdout + started.stderr
            redis.lpush(start_urls_key("products"), site.url)
            deadline = time.monotonic() + 180
            while True:  # until the job stores items and holds leases
                running = requests.get(node.url + "listjobs.json", auth=(node.user, node.password),
                                       timeout=10).json()["running"]
                job_pids[:] = [job["pid"] for job in running]
                if (running and database["products"].estimated_document_count() >= 30
                        and frontier_leases(redis)[0]):
                    break
                assert time.monotonic() < deadline, node.job_log()[-3000:]
                time.sleep(0.1)
            (job,) = running
            stopped = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            code = node.proc.wait(120)
            waited = time.monotonic() - stopped
            orphans = processes_naming(job["id"])
        log, out = node.job_log(), (node.dir / "scrapyd.out").read_text()
    finally:
        node.stop()
        for pid in job_pids:  # scrapyd's own launcher leaves the job crawling
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert code == -signal.SIGTERM, out[-3000:]  # twistd's clean stop by that signal
    assert not orphans, (orphans, out[-3000:])
    assert f"Stopping: SIGTERM to 1 running job(s) (products {job['id']} pid {job['pid']})" in out
    assert "Every job closed in" in out and "SIGKILL" not in out, out[-3000:]
    assert "Process finished:" in out
    assert "'finish_reason': 'shutdown'" in log, log[-3000:]
    scraped = int(re.search(r"'item_scraped_count': (\d+)", log).group(1))
    upserted = int(re.search(r"'mongo/upserted': (\d+)", log).group(1))
    stored = database["products"].count_documents({})
    assert 30 <= stored == scraped == upserted < products, (stored, scraped, upserted)
    assert frontier_leases(redis) == (0, 0)
    assert waited < 60 and "Traceback" not in log
    assert node.password not in log + out


def test_each_node_is_deployed_with_its_own_generated_password(tmp_path, node_venv):
    """Issue 48: scrapyd-node.sh generates a password per node, and crawlctl sent one
    SCRAPYD_PASSWORD to all: the second node answered 401 (and ~/.netrc, keyed by
    host, cannot tell two nodes on one host apart). Two nodes set up exactly as the
    README says (the script with --prefix DIR --no-systemd writes each its own
    password, DIR/run-scrapyd starts it); the operator names a credentials file per
    target in the targets file: deploy and jobs reach both."""
    nodes = [Scrapyd(tmp_path / name, {}, generated=True, venv=node_venv) for name in "ab"]
    operator = tmp_path / "operator"
    (operator / "secrets").mkdir(parents=True)   # HOME too: no ~/.netrc there
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_ready()
        a, b = nodes
        assert a.user == b.user == "crawl" and a.password != b.password
        assert "name it on this node's line of the targets file" in a.setup_log.read_text()
        # node-a's file is a copy of the node's whole env file; node-b's the two lines
        (operator / "secrets" / "node-a.env").write_text((a.dir / "scrapyd.env").read_text())
        (operator / "secrets" / "node-b.env").write_text(
            f"SCRAPYD_USERNAME=crawl\nSCRAPYD_PASSWORD={b.password}\n")
        for secret in (operator / "secrets").iterdir():
            secret.chmod(0o600)
        targets = operator / "nodes.txt"
        targets.write_text(f"node-a {a.url} secrets/node-a.env\n"
                           f"node-b {b.url} secrets/node-b.env\n")
        deployed = crawlctl("deploy", "--targets-file", str(targets), password=None,
                            home=operator)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert deployed.stdout.count("ok node-") == 2
        listed = crawlctl("jobs", "--targets-file", str(targets), "--json", password=None,
                          home=operator)
        assert listed.returncode == 0, listed.stderr
        assert [json.loads(line)["target"] for line in listed.stdout.splitlines()] == [
            "node-a", "node-b"]
        # The old way, one SCRAPYD_PASSWORD for all (node-a's): node-b refuses, and is named.
        plain = operator / "plain.txt"
        plain.write_text(f"node-a {a.url}\nnode-b {b.url}\n")
        shared = crawlctl("jobs", "--targets-file", str(plain), user="crawl",
                          password=a.password, home=operator)
        assert shared.returncode == 1, shared.stdout + shared.stderr
        assert "1 of 2 target(s) failed: node-b" in shared.stderr, shared.stderr
        assert f"FAILED node-b ({b.url}): HTTP 401" in shared.stderr
        assert "password from SCRAPYD_PASSWORD" in shared.stderr
        # A credentials file of the wrong node: node-b refuses, naming the file it sent.
        targets.write_text(f"node-a {a.url} secrets/node-a.env\n"
                           f"node-b {b.url} secrets/node-a.env\n")
        wrong = crawlctl("jobs", "--targets-file", str(targets), password=None, home=operator)
        assert wrong.returncode == 1 and "failed: node-b" in wrong.stderr, wrong.stderr
        assert (f"password from {operator / 'secrets' / 'node-a.env'} (credentials file of "
                "node-b)") in wrong.stderr, wrong.stderr
        # A credentials file others can read is refused, naming the target and the file.
        (operator / "secrets" / "node-a.env").chmod(0o640)
        loose = crawlctl("jobs", "node-a", "--targets-file", str(targets), password=None,
                         home=operator)
        assert loose.returncode == 1, loose.stdout + loose.stderr
        assert f"FAILED node-a ({a.url}): its credentials file" in loose.stderr
        assert "readable by others (mode 640): chmod 600" in loose.stderr, loose.stderr
        said = "".join(r.stdout + r.stderr for r in (deployed, listed, shared, wrong, loose))
        assert a.password not in said and b.password not in said
    finally:
        for node in nodes:
            node.stop()


def test_credentials_files_per_target_are_read_and_checked(tmp_path, monkeypatch):
    """The targets file's third field and scrapy.cfg's credentials_file: relative
    to the file naming them, the node's env-file lines, winning over the
    environment; a file that is missing, lacks a line or others can read is
    refused naming the target (no password in any message)."""
    from crawlproject.scrapyd import ScrapydError, targets_from_cfg, targets_from_file

    monkeypatch.setenv("SCRAPYD_USERNAME", "env-user")
    monkeypatch.setenv("SCRAPYD_PASSWORD", "env-secret")
    (tmp_path / "secrets").mkdir()
    good = tmp_path / "secrets" / "a.env"
    good.write_text("# a copy of the node's scrapyd.env\nSCRAPYD_USERNAME=crawl\n"
                    "SCRAPYD_PASSWORD='file-secret'\nREDIS_URL=redis://x/0\n")
    half = tmp_path / "secrets" / "b.env"
    half.write_text("SCRAPYD_USERNAME=crawl\n")
    for f in (good, half):
        f.chmod(0o600)
    (tmp_path / "nodes.txt").write_text(
        "a http://127.0.0.2:6800/ secrets/a.env\nb http://127.0.0.3:6800/ secrets/b.env\n"
        "c http://127.0.0.4:6800/ secrets/none.env\nd http://127.0.0.5:6800/\n")
    (tmp_path / "scrapy.cfg").write_text("[deploy:e]\nurl = http://127.0.0.6:6800/\n"
                                         "credentials_file = secrets/a.env\n")
    targets = targets_from_file(tmp_path / "nodes.txt")
    e = targets_from_cfg(tmp_path / "scrapy.cfg")["e"]
    for target in (targets["a"], e):
        assert (target.auth().username, target.auth().password) == ("crawl", "file-secret")
        assert target.credentials_sent() == (f"user 'crawl' and password from {good} "
                                             f"(credentials file of {target.name})")
    assert targets["d"].auth().password == "env-secret"   # no file: the environment
    errors = {}
    for name in "bc":
        with pytest.raises(ScrapydError) as caught:
            targets[name].auth()
        errors[name] = str(caught.value)
    good.chmod(0o644)
    with pytest.raises(ScrapydError) as caught:
        targets["a"].auth()
    errors["a"] = str(caught.value)
    assert errors["b"].startswith("b (http://127.0.0.3:6800/): its credentials file")
    assert "has no SCRAPYD_PASSWORD line" in errors["b"]
    assert errors["c"].startswith("c (http://127.0.0.4:6800/): cannot read its credentials "
                                  f"file {tmp_path / 'secrets' / 'none.env'}")
    assert "readable by others (mode 644): chmod 600" in errors["a"]
    assert not [m for m in errors.values() if "file-secret" in m or "env-secret" in m]
