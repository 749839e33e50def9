"""What a node does with the operator's state (``crawlctl pause|resume|drain|stop``,
read by :class:`crawlproject.control.ControlWatcher`): takes nothing while
paused or stopped, closes the spider on a stop, ends a ``--then-clear`` drain
once it is complete, and keeps an idle node up while the state found at start
holds it (``CONTROL_ON_START``: :mod:`crawlproject.scheduling.startstate`) or
for ``SCHEDULER_IDLE_BEFORE_CLOSE`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from scrapy.exceptions import DontCloseSpider

from crawlproject.connection import REDIS_FAILURES
from crawlproject.control import (ControlWatcher, clear_finished_drain, drain_complete,
                                  read_control)
from crawlproject.scheduling.startstate import StartState

# The scheduler's own lines: they keep its logger's name.
logger = logging.getLogger("crawlproject.scheduler")

# Seconds between a held node's checks that a --then-clear drain is complete
# (a few Redis reads a partition; only while it is held and has nothing to do).
DRAIN_CHECK_INTERVAL = 5.0


class NodeControl:
    """The operator's state applied to one node's frontier *client* (a
    :class:`~crawlproject.frontier.client.FrontierClient`): it owns the
    node's :class:`~crawlproject.control.ControlWatcher` (``watcher``), which
    polls *redis* every *interval* seconds and sends *report* (what
    ``crawlctl status`` shows of this node). *nudge* tells the engine that
    requests are here, *downloading* counts the requests in the downloader,
    *has_pending* says whether the cluster's frontier still has work."""

    def __init__(self, crawler, client, start_state: StartState, *, redis, interval: float,
                 report: Callable[[], dict], node: str, partitions: int,
                 idle_before_close: float, nudge: Callable[[], None],
                 downloading: Callable[[], int], has_pending: Callable[[], bool],
                 log_extra: dict):
        self.crawler, self.stats, self.client = crawler, crawler.stats, client
        self.start_state = start_state
        self.node, self.partitions = node, partitions
        self.spider = log_extra["spider"]
        self.log_extra = log_extra
        #: seconds a node whose crawl is done waits before closing (scrapy-redis'
        #: SCHEDULER_IDLE_BEFORE_CLOSE), and since when it has been done
        self.idle_before_close = idle_before_close
        self.done_since: float | None = None
        self.nudge, self.downloading, self.has_pending = nudge, downloading, has_pending
        self._drain_checked = float("-inf")   # monotonic time of the last drain-complete check
        self.stopping = False
        self._stop_task: asyncio.Future | None = None
        self._spider_opened = False
        self.watcher = ControlWatcher(redis, self.spider.name, self.changed, interval=interval,
                                      log_extra=log_extra, on_ready=self.ready, report=report,
                                      node=node, on_tick=self.tick)

    @property
    def holds(self) -> bool:
        """Held by the stop or drain found at start: the node neither closes
        because of it nor counts as idle (CONTROL_ON_START = wait)."""
        return self.start_state.held is not None

    def ready(self, state: str) -> None:
        """The operator's state is known (the watcher's first read): *state*."""
        if self.stopping:  # refused at the first sync (partition count): stays shut
            return
        self.client.paused = False
        if state == "run":
            self.client.wake()
            self.nudge()
            return
        action = self.start_state.arrived(self.watcher.info, self.log_extra)
        if action == "follow":   # a pause: as for any node
            self.changed("run", state)
            return
        self.stats.inc_value(f"control/{state}")
        self.stats.set_value("control/state_at_start", state)
        if action == "exit":
            self.stop(f"control_{state}_at_start")
            return
        self.client.paused = state == "stop"   # a drain: what the frontier holds is done
        if state == "drain":
            self.client.wake()
            self.nudge()

    def on_spider_idle(self) -> None:
        """The engine has nothing left (start requests handled, nothing here):
        with the cluster's frontier empty too (has_pending_requests), the node
        closes, after SCHEDULER_IDLE_BEFORE_CLOSE seconds of that if set."""
        if self.holds or self.stopping:
            # Stopping closes the spider with its own reason (stop): an idle close
            # racing it would say "finished" (a node started into a drain with
            # CONTROL_ON_START = exit, whose seed reader saw nothing to drain).
            raise DontCloseSpider
        if self.idle_before_close <= 0:
            return
        now = time.monotonic()
        if self.done_since is None or self.has_pending():
            self.done_since = now
        waited = now - self.done_since
        if waited < self.idle_before_close:
            # Asked again at the end of the wait (the engine's own heartbeat
            # would ask only every 5 s).
            asyncio.get_running_loop().call_later(self.idle_before_close - waited + 0.01,
                                                  self.nudge)
            raise DontCloseSpider

    async def tick(self) -> None:
        """Each control poll: a node held by a drain set with --then-clear
        looks (every few seconds, while it has nothing to do) whether the
        drain is complete, and if so ends it."""
        if (self.start_state.held != "drain" or self.watcher.state != "drain"
                or self.client.has_pending()
                or time.monotonic() - self._drain_checked < DRAIN_CHECK_INTERVAL):
            return
        self._drain_checked = time.monotonic()
        await self.clear_finished_drain()

    async def clear_finished_drain(self) -> None:
        """Set the state back to run if this drain (with --then-clear) is
        complete: called by a node closing in a drain, after it left the
        frontier, and by nodes held by it (see crawlproject.control)."""
        redis = self.client.partitions[0].client
        spider = self.spider.name
        info = await read_control(redis, spider)   # now: a drain given again since changes it
        if info["state"] != "drain" or not info["then_clear"]:
            return
        if await drain_complete(redis, spider, self.partitions, self.node) \
                and await clear_finished_drain(redis, spider, info.get("since"),
                                               f"node {self.node} (drain complete)"):
            logger.info("The drain of %r is complete: state back to run (it was set with "
                        "--then-clear)", spider, extra=self.log_extra)
            self.stats.set_value("control/drain_cleared", 1)

    async def left_frontier(self) -> None:
        """This node has left the frontier: the last draining node out ends a
        --then-clear drain."""
        if self.watcher.state == "drain":
            try:
                await self.clear_finished_drain()
            except REDIS_FAILURES as exc:   # the drain stays; a node held by it checks again
                logger.warning("Could not check whether the drain is complete: %s", exc,
                               extra=self.log_extra)

    def changed(self, old: str, new: str) -> None:
        """The operator's state went from *old* to *new*."""
        self.start_state.release(new, self.log_extra)
        # The downloads a pause lets finish: counted in the same turn of the
        # loop that sets `paused` below, so none can start in between.
        logger.info("Operator control: %s (was %s)%s", new, old, {
            "pause": ": taking no request and no seed; prefetched requests stay leased here; "
                     f"downloads under way finish: {self.downloading()}",
            "drain": ": taking no seed; closing once the frontier is empty",
            "stop": ": closing now; leases go back to the queue",
            "run": ""}[new], extra=self.log_extra)
        self.stats.inc_value(f"control/{new}")
        self.client.paused = new in ("pause", "stop") or self.stopping
        if new in ("run", "drain") and not self.stopping:
            self.client.wake()
            self.nudge()
        if new == "stop":
            self.stop("operator_stop")

    def stop(self, reason: str) -> None:
        """Take nothing more and close the spider with *reason*, once.

        Not awaited by the caller: called from the frontier loop (its first
        sync), and closing the spider closes this scheduler, which waits for
        that loop to end: awaited there, the node hung for ever."""
        self.client.paused = True
        if self.stopping:
            return
        self.stopping = True
        # Kept: the event loop holds tasks only weakly.
        self._stop_task = asyncio.ensure_future(self._stop_when_open(reason))

    async def _stop_when_open(self, reason: str) -> None:
        # A node started while the state is "stop" reads it before the engine
        # has finished opening the spider (spider_opened handlers such as
        # CoreStats' have not run): closing then fails; wait for the signal.
        for _ in range(600):
            if self._spider_opened:
                break
            await asyncio.sleep(0.05)
        await self.crawler.engine.close_spider_async(reason=reason)

    def on_spider_opened(self, spider) -> None:
        self._spider_opened = True
