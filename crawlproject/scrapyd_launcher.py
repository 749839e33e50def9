"""scrapyd's launcher for crawler nodes: stopping scrapyd closes its jobs, and
scrapyd refuses to listen on any address, loopback included, without credentials.

scrapyd's own launcher leaves its jobs running when scrapyd stops: a SIGTERM to
scrapyd ends it in about a second, and each job crawls on with parent PID 1 (a
systemd unit with ``KillMode=mixed`` then SIGKILLs them, a container engine kills
them with the container: their items and leases are lost either way). This one,
named in scrapyd.conf (``launcher = ...``), sends each running job one SIGTERM
when scrapyd stops (Scrapy's graceful close: items stored, leases handed back to
the frontier, finish reason ``shutdown``) and makes scrapyd wait until they have
all exited, at most ``jobs_stop_timeout`` seconds (scrapyd.conf, default 320,
under the unit's 330 s ``TimeoutStopSec``); then it SIGKILLs those left and says
so in scrapyd's log. No job starts once scrapyd is stopping.

scrapyd itself starts unauthenticated when ``SCRAPYD_USERNAME`` or
``SCRAPYD_PASSWORD`` is empty (one INFO line): with this launcher, scrapyd refuses
to start (exit 1, the reason on stderr) without both, on every address. Loopback
is no exception: scrapyd installs and runs any egg posted to ``addversion.json``,
so any local process, or a request a crawl can be made to send to 127.0.0.1,
could run code as scrapyd's user. The check is here because the launcher is the
one component of scrapyd a node's scrapyd.conf replaces.

Jobs run in a session of their own (``setsid``): a Ctrl-C in the terminal that
runs scrapyd reaches scrapyd alone, so each job gets exactly one signal (a
second one would make Scrapy force an unclean shutdown).

This module imports scrapyd and Twisted only, never ``crawlproject``: a node made
by ``deploy/scrapyd-node.sh`` has no ``crawlproject`` in scrapyd's virtualenv
(jobs take it from the egg), so the script installs this file there as the
top-level module ``crawlproject_scrapyd_launcher``. The Docker image, which has
the package installed, names ``crawlproject.scrapyd_launcher.Launcher``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from scrapyd import launcher
from scrapyd.exceptions import ConfigError
from scrapyd.interfaces import IEnvironment
from twisted.internet import defer, error, reactor
from twisted.logger import Logger

log = Logger()

#: seconds scrapyd waits at stop for its jobs to close (``jobs_stop_timeout``)
STOP_TIMEOUT = 320.0


class Launcher(launcher.Launcher):
    """scrapyd's launcher, whose ``stopService`` closes the running jobs and
    returns a Deferred (Twisted waits for it before exiting)."""

    def __init__(self, config, app):
        refuse_without_credentials(config)
        super().__init__(config, app)
        self.stop_timeout = config.getfloat("jobs_stop_timeout", STOP_TIMEOUT)
        self.setsid = shutil.which("setsid")
        self.stopping = False

    def _get_message(self, slot):
        if not self.stopping:  # a slot freed while stopping takes no new job
            super()._get_message(slot)

    def _spawn_process(self, message, slot):
        # scrapyd's own, with the job started in its own session (see the docstring)
        environment = self.app.getComponent(IEnvironment)
        message.setdefault("settings", {})
        message["settings"].update(environment.get_settings(message))
        env = environment.get_environment(message, slot)
        args = [sys.executable, "-m", self.runner, "crawl", *launcher.get_crawl_args(message)]
        process = launcher.ScrapyProcessProtocol(message["_project"], message["_spider"],
                                                 message["_job"], env, args)
        process.deferred.addBoth(self._process_finished, slot)
        if self.setsid:
            reactor.spawnProcess(process, self.setsid, args=[self.setsid, *args], env=env)
        else:
            reactor.spawnProcess(process, sys.executable, args=args, env=env)
        self.processes[slot] = process

    def stopService(self):
        self.stopping = True
        super().stopService()
        processes = list(self.processes.values())
        if not processes:
            return None
        log.info("Stopping: SIGTERM to {count} running job(s) ({jobs}); waiting up to "
                 "{timeout:g} s for them to close", count=len(processes),
                 jobs=", ".join(f"{p.spider} {p.job} pid {p.pid}" for p in processes),
                 timeout=self.stop_timeout, log_system="Launcher")
        for process in processes:
            _signal(process, "TERM")
        started = time.monotonic()
        deadline = reactor.callLater(self.stop_timeout, self._kill, processes)
        ended = defer.DeferredList([p.deferred for p in processes])

        def closed(result):
            if deadline.active():
                deadline.cancel()
                log.info("Every job closed in {seconds:.1f} s",
                         seconds=time.monotonic() - started, log_system="Launcher")
            return result

        return ended.addCallback(closed)

    def _kill(self, processes):
        for process in processes:
            if process.end_time is None and not process.deferred.called:
                log.error("Job {spider} {job} (pid {pid}) still running {timeout:g} s after "
                          "SIGTERM (jobs_stop_timeout): SIGKILL; items it had not stored are "
                          "lost, its leases return to the frontier when they expire",
                          spider=process.spider, job=process.job, pid=process.pid,
                          timeout=self.stop_timeout, log_system="Launcher")
                _signal(process, "KILL")


def refuse_without_credentials(config, environ=os.environ) -> None:
    """Raise ``ConfigError`` if scrapyd would listen without both a username
    and a password (read as scrapyd reads them), whatever the address."""
    bind = environ.get("SCRAPYD_BIND_ADDRESS") or config.get("bind_address", "127.0.0.1")
    port = environ.get("SCRAPYD_HTTP_PORT") or config.get("http_port", "6800")
    username = environ.get("SCRAPYD_USERNAME") or config.get("username", "")
    password = environ.get("SCRAPYD_PASSWORD") or config.get("password", "")
    if username and password:
        return
    raise ConfigError(
        f"refusing to start: scrapyd would listen on {bind}:{port} without credentials, and "
        "anyone who reaches it (on loopback too: any local process) can post an egg that it "
        "runs. Set SCRAPYD_USERNAME and SCRAPYD_PASSWORD in scrapyd's environment (a node "
        "made by deploy/scrapyd-node.sh reads them from its env file, where it generates "
        "the password: /etc/crawlproject/scrapyd.env, or DIR/scrapyd.env with --prefix "
        "DIR), or username and password in scrapyd.conf")


def _signal(process, name: str) -> None:
    try:
        process.transport.signalProcess(name)
    except error.ProcessExitedAlready:
        pass
