"""A heartbeat file the reactor writes, for liveness probes, opt-in.

``LIVENESS_ENABLED = True`` writes the node's ``time.monotonic()`` into
``LIVENESS_FILE`` every ``LIVENESS_INTERVAL`` seconds from a ``LoopingCall`` of
the reactor, from the moment the extension is built until the engine stops. A
node whose reactor is stuck (a blocking call in a callback, a busy loop, a
deadlock) stops writing it, while ``/metrics`` (a thread of its own) still
answers: a probe of the file tells the two apart. ::

    python -m crawlproject.extensions.liveness [--file F] [--max-age SECONDS]

exits 0 while the last beat is at most ``--max-age`` seconds old (default: six
default intervals, 30 s), 1 otherwise (missing, unreadable, stale, or written before the
machine's clock started, i.e. before a reboot), with one line saying why. The
Dockerfile's HEALTHCHECK and the Kubernetes livenessProbe run it.

A beat that cannot be written (a full disk) is logged once (ERROR) and counted
in ``liveness/write_errors``; the probe then fails and the node is restarted. In
a project of your own: ``EXTENSIONS = {"crawlproject.extensions.liveness.Liveness":
540}`` and ``LIVENESS_ENABLED = True``.

The beat says the reactor turns, nothing about Redis or MongoDB: a node that
waits for an unreachable Redis stays alive (a restart would not bring Redis back,
and every node would restart at once). Monotonic time, not the file's mtime: a
step of the wall clock neither kills nor revives a node.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time

from crawlproject.defaults import DEFAULTS, setting

# Scrapy and Twisted are imported where they are used: the probe runs this
# module as a script every few seconds, and importing Scrapy takes ~0.5 s of CPU.

logger = logging.getLogger(__name__)

#: a beat older than this many intervals is stale (the probe's default)
STALE_INTERVALS = 6


def write_beat(path: str, now: float) -> None:
    """Replace *path* with *now* in one step (no reader sees half a number)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".liveness-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            # rounded down: a beat read back at once must not look newer than the clock
            f.write(f"{math.floor(now * 1000) / 1000:.3f}\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def beat_age(path: str) -> float:
    """Seconds since the beat in *path* (``OSError``/``ValueError`` if unreadable)."""
    with open(path) as f:
        written = float(f.read().strip())
    return time.monotonic() - written


def check(path: str, max_age: float) -> tuple[bool, str]:
    """Whether the beat in *path* is fresh, and a line saying so."""
    try:
        age = beat_age(path)
    except (OSError, ValueError) as exc:
        return False, f"no heartbeat in {path}: {exc}"
    if age < 0:  # from a monotonic clock ahead of this one: before a reboot
        return False, f"heartbeat in {path} is from before this boot"
    if age > max_age:
        return False, f"heartbeat in {path} is {age:.1f} s old (> {max_age:g} s): reactor stuck"
    return True, f"heartbeat {age:.1f} s old"


class Liveness:
    """The extension (see the module docstring)."""

    def __init__(self, path: str, interval: float, stats=None):
        from twisted.internet import task

        self.path = path
        self.interval = interval
        self.stats = stats
        self.loop = task.LoopingCall(self.beat)
        self.failed = False

    @classmethod
    def from_crawler(cls, crawler):
        from scrapy import signals
        from scrapy.exceptions import NotConfigured

        settings = crawler.settings
        if not setting(settings, "LIVENESS_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        interval = setting(settings, "LIVENESS_INTERVAL")
        if interval <= 0:
            raise ValueError(f"LIVENESS_INTERVAL must be > 0, not {interval!r}")
        ext = cls(setting(settings, "LIVENESS_FILE"), interval, crawler.stats)
        # At once, not at engine_started: opening the spider (Redis, the frontier
        # library) may take long, and the reactor turns meanwhile.
        ext.start()
        crawler.signals.connect(ext.stop, signal=signals.engine_stopped)
        return ext

    def start(self) -> None:
        # The first beat at once, unguarded: a file that cannot be written stops the start.
        write_beat(self.path, time.monotonic())
        self.loop.start(self.interval, now=False)
        logger.info("liveness heartbeat in %s every %g s", self.path, self.interval)

    def beat(self) -> None:
        try:
            write_beat(self.path, time.monotonic())
        except OSError as exc:
            if not self.failed:  # once: the disk stays full for many beats
                logger.error("cannot write the liveness heartbeat %s: %s", self.path, exc)
            self.failed = True   # the probe fails in time: the node restarts
            if self.stats is not None:
                self.stats.inc_value("liveness/write_errors")
        else:
            self.failed = False

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()


def main(argv=None) -> int:
    """The probe: exit 0 while the heartbeat is fresh."""
    interval = DEFAULTS["LIVENESS_INTERVAL"]
    parser = argparse.ArgumentParser(prog="python -m crawlproject.extensions.liveness",
                                     description="Exit 0 while the node's reactor beats.")
    parser.add_argument("--file", default=DEFAULTS["LIVENESS_FILE"],
                        help="the LIVENESS_FILE of the node (default: %(default)s)")
    parser.add_argument("--max-age", type=float, default=STALE_INTERVALS * interval,
                        help="seconds a beat stays fresh (default: %(default)s)")
    args = parser.parse_args(argv)
    ok, message = check(args.file, args.max_age)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
