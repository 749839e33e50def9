"""crawlproject/scrapyd_launcher.py inside a real scrapyd (this virtualenv's), whose
jobs are tests/scrapyd_stub_runner.py: a job that closes on SIGTERM and one that
ignores it. A real crawl job stopped with its scrapyd is in tests/test_scrapyd.py
(test_stopping_scrapyd_closes_its_running_job)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from scrapyd.config import Config
from scrapyd.exceptions import ConfigError

from crawlproject.scrapyd_launcher import refuse_without_credentials

ROOT = Path(__file__).resolve().parents[1]
USER, PASSWORD = "ops", "Launcher-Test-Pass"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Daemon:
    """scrapyd in *directory* with the launcher under test and the stub runner."""

    def __init__(self, directory: Path, stop_timeout: float = 30, max_proc: int = 1,
                 bind: str = "127.0.0.1", credentials: bool = True, **popen):
        self.dir, self.port = directory, free_port()
        self.url = f"http://{bind}:{self.port}/"
        (directory / "scrapyd.conf").write_text(f"""[scrapyd]
bind_address = {bind}
http_port = {self.port}
poll_interval = 0.2
max_proc = {max_proc}
eggs_dir = {directory}/eggs
logs_dir = {directory}/logs
dbs_dir = {directory}/dbs
items_dir =
launcher = crawlproject.scrapyd_launcher.Launcher
runner = tests.scrapyd_stub_runner
jobs_stop_timeout = {stop_timeout}
[settings]
stub = tests.scrapyd_stub_runner
""")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPYD_")}
        env.update(PYTHONPATH=str(ROOT), HOME=str(directory))
        if credentials:
            env.update(SCRAPYD_USERNAME=USER, SCRAPYD_PASSWORD=PASSWORD)
        self.out = directory / "scrapyd.out"
        self.jobs: list[int] = []  # pids
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "scrapyd"], cwd=directory,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, **popen)

    def call(self, endpoint: str, **data) -> dict:
        method = requests.post if data else requests.get
        answer = method(self.url + endpoint, data=data or None, auth=(USER, PASSWORD),
                        timeout=10).json()
        assert answer["status"] == "ok", answer
        return answer

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.out.read_text()
            try:
                self.call("daemonstatus.json")
                return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise AssertionError(f"scrapyd not ready in {timeout}s:\n{self.out.read_text()}")

    def job_log(self, spider: str, job: str) -> Path:
        return self.dir / "logs" / "stub" / spider / f"{job}.log"

    def start_job(self, spider: str, timeout: float = 30) -> tuple[str, int]:
        """Schedule *spider*; wait until it runs; its job id and pid."""
        job = self.call("schedule.json", project="stub", spider=spider)["jobid"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.job_log(spider, job)
            if log.exists() and log.read_text().startswith("started pid "):
                self.jobs.append(int(log.read_text().split()[2]))
                return job, self.jobs[-1]
            time.sleep(0.05)
        raise AssertionError(f"job {spider} not started:\n{self.out.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.jobs:  # left behind when a test fails (scrapyd's own launcher)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def daemons(tmp_path):
    started = []

    def start(name="node", **kwargs) -> Daemon:
        (tmp_path / name).mkdir()
        started.append(Daemon(tmp_path / name, **kwargs))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stopping_scrapyd_closes_its_job_waits_for_it_and_starts_no_other(daemons):
    node = daemons(max_proc=1)
    node.wait_ready()
    job, pid = node.start_job("polite")
    queued = node.call("schedule.json", project="stub", spider="polite")["jobid"]
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(30) == -signal.SIGTERM  # twistd: a clean stop, by that signal
    waited = time.monotonic() - started
    out = node.out.read_text()
    # The job got one SIGTERM, closed (0.5 s), and scrapyd exited after it.
    assert node.job_log("polite", job).read_text().splitlines()[1:] == [
        f"signal {signal.SIGTERM}", "closed"]
    assert waited >= 0.5 and not alive(pid)
    assert f"Stopping: SIGTERM to 1 running job(s) (polite {job} pid {pid})" in out, out
    assert "Every job closed in" in out and "SIGKILL" not in out
    assert "Process finished:" in out
    assert not node.job_log("polite", queued).exists()  # the pending job never started


def test_a_job_still_running_after_the_bound_is_killed_and_logged(daemons):
    node = daemons(stop_timeout=1.5)
    node.wait_ready()
    job, pid = node.start_job("stubborn")
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(30) == -signal.SIGTERM  # twistd: a clean stop, by that signal
    waited = time.monotonic() - started
    out = node.out.read_text()
    assert 1.5 <= waited < 15, waited
    assert not alive(pid)
    assert node.job_log("stubborn", job).read_text().count("signal ") == 1
    assert (f"Job stubborn {job} (pid {pid}) still running 1.5 s after SIGTERM "
            "(jobs_stop_timeout): SIGKILL") in out, out


def test_ctrl_c_in_scrapyds_terminal_gives_each_job_one_signal(daemons):
    # The terminal signals its foreground process group: scrapyd, and not the
    # jobs (own session), which get the launcher's SIGTERM alone.
    # A shell starts background commands with SIGINT ignored, and Python and
    # Twisted keep an ignored SIGINT ignored: give scrapyd a terminal's default.
    node = daemons(start_new_session=True, preexec_fn=default_sigint)
    node.wait_ready()
    job, pid = node.start_job("polite")
    assert os.getsid(pid) == pid != os.getpgid(node.proc.pid)
    os.killpg(node.proc.pid, signal.SIGINT)
    assert node.proc.wait(30) == -signal.SIGINT
    assert node.job_log("polite", job).read_text().splitlines()[1:] == [
        f"signal {signal.SIGTERM}", "closed"]


def test_scrapyd_refuses_a_non_loopback_address_without_credentials(daemons):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: without the check,
    # scrapyd fails later, binding it.
    node = daemons(bind="192.0.2.1", credentials=False)
    assert node.proc.wait(30) == 1
    out = node.out.read_text()
    assert f"refusing to start: scrapyd would listen on 192.0.2.1:{node.port} without " \
           "credentials" in out, out
    assert "scrapyd.env" in out and "Traceback" not in out


def test_scrapyd_refuses_loopback_too_without_credentials(daemons):
    """scrapyd runs any egg posted to addversion.json: on 127.0.0.1 as well, no
    credentials, no scrapyd (any local process, or a request a crawl is made to
    send, could post one)."""
    node = daemons(bind="127.0.0.1", credentials=False)
    deadline, answered = time.monotonic() + 30, False
    while node.proc.poll() is None and time.monotonic() < deadline and not answered:
        try:  # an event either way: it exits, or it answers
            answered = requests.get(node.url, timeout=1) is not None
        except requests.ConnectionError:
            time.sleep(0.05)
    assert not answered, "scrapyd started on 127.0.0.1 without credentials"
    assert node.proc.wait(30) == 1, node.out.read_text()
    out = node.out.read_text()
    assert f"refusing to start: scrapyd would listen on 127.0.0.1:{node.port} without " \
           "credentials" in out, out
    assert "SCRAPYD_USERNAME and SCRAPYD_PASSWORD" in out and "scrapyd.env" in out
    assert "scrapyd.conf" in out and "Traceback" not in out


def test_an_unauthenticated_egg_upload_gets_401(daemons, tmp_path):
    node = daemons()
    node.wait_ready()
    egg = {"egg": ("evil.egg", b"PK\x05\x06" + b"\0" * 18, "application/octet-stream")}
    for auth in (None, (USER, "wrong")):
        answer = requests.post(node.url + "addversion.json", auth=auth, timeout=10,
                               data={"project": "evil", "version": "1"}, files=egg)
        assert answer.status_code == 401, answer.text
    assert "evil" not in node.call("listprojects.json")["projects"]


@pytest.mark.parametrize("bind, environ, refused", [
    ("0.0.0.0", {}, True),
    ("0.0.0.0", {"SCRAPYD_USERNAME": "u"}, True),
    ("0.0.0.0", {"SCRAPYD_USERNAME": "u", "SCRAPYD_PASSWORD": "p"}, False),
    ("10.1.2.3", {}, True),
    ("::", {}, True),
    ("crawler-7.internal", {}, True),
    ("127.0.0.1", {}, True),
    ("127.0.0.1", {"SCRAPYD_PASSWORD": "p"}, True),
    ("127.0.0.1", {"SCRAPYD_USERNAME": "u", "SCRAPYD_PASSWORD": "p"}, False),
    ("127.0.0.2", {}, True),
    ("::1", {}, True),
    ("localhost", {}, True),
    ("127.0.0.1", {"SCRAPYD_BIND_ADDRESS": "0.0.0.0"}, True),
])
def test_the_credentials_check(bind, environ, refused):
    config = Config(values={"bind_address": bind, "http_port": "6800"})
    if refused:
        with pytest.raises(ConfigError, match="without credentials"):
            refuse_without_credentials(config, environ)
    else:
        refuse_without_credentials(config, environ)
    # scrapyd.conf's own username/password count too
    credentials = Config(values={"bind_address": bind, "username": "u", "password": "p"})
    refuse_without_credentials(credentials, {k: v for k, v in environ.items() if "BIND" in k})
