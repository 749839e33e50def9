"""``FRONTIER_HOST_LIMITS`` published to the shared frontier: at a node's
first sync (once the crawl's partition count is checked), and again every
``HOST_LIMITS_REFRESH`` seconds where a key has no limits at all (``crawlctl
politeness --clear`` removes one: it comes back). Redis refusing them (a
limits key holding junk) is said once, counted and tried again; the crawl
goes on under the nodes' settings meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time

from crawlproject.frontier.queue import refused

# The scheduler's own lines: they keep its logger's name.
logger = logging.getLogger("crawlproject.scheduler")

# Seconds between a node's checks that its FRONTIER_HOST_LIMITS entries are
# still in Redis (``crawlctl politeness --clear`` removes one: it comes back).
HOST_LIMITS_REFRESH = 5.0
LIMITS_CHUNK = 500   # FRONTIER_HOST_LIMITS entries per SET_LIMITS call


def _stored_count(raw) -> int:
    """A count read from Redis, or -1 when it is not one."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return -1
    return value if value > 0 else -1


class LimitsPublisher:
    """Publishes a node's ``FRONTIER_HOST_LIMITS`` through its frontier
    *client* (a :class:`~crawlproject.frontier.client.FrontierClient`);
    *stop* closes the spider with a reason (a partition count that is not
    the crawl's)."""

    def __init__(self, client, politeness, stats, *, stop, log_extra: dict):
        self.client, self.politeness, self.stats = client, politeness, stats
        self._stop = stop
        self._log_extra = log_extra
        self.published: float | None = None   # monotonic time, once published
        self.task: asyncio.Future | None = None   # a refresh under way

    async def first_sync(self) -> None:
        """Redis answered: check the partition count, publish FRONTIER_HOST_LIMITS."""
        frontier = self.client.partitions[0]
        client = frontier.client
        stored = await client.hsetnx(frontier.keys.config, "partitions",
                                     self.politeness.partitions)
        if not stored:
            raw = await client.hget(frontier.keys.config, "partitions")
            existing = _stored_count(raw)
            if existing != self.politeness.partitions:
                # Read from Redis: a value that is not a count is refused like
                # a different count (shown as -1), never trusted nor raised.
                logger.error("This crawl's frontier has %s partition(s); FRONTIER_PARTITIONS is "
                             "%d here. Use the crawl's count (or reset the spider): closing.",
                             existing if existing >= 0 else f"an unreadable count ({raw!r:.40})",
                             self.politeness.partitions, extra=self._log_extra)
                self.stats.set_value("scheduler/partition_mismatch", existing)
                self._stop("frontier_partitions_mismatch")
                return
        try:
            await self.publish(only_missing=False)
        except Exception as exc:
            if not refused(exc):
                raise  # Redis away: this hook runs again after the next call
            # A limits key holding junk (anyone who can write to Redis): the
            # crawl goes on under the nodes' settings; said, counted, retried.
            self._refused(exc)

    def _refused(self, exc: BaseException) -> None:
        self.published = time.monotonic()   # the refresh tries again later
        self.stats.inc_value("politeness/limits_refused")
        if self.stats.get_value("politeness/limits_refused") > 1:
            return  # said once; the stat counts the tries
        logger.error("Cannot publish FRONTIER_HOST_LIMITS: Redis refused it (%s); those "
                     "hosts get DOWNLOAD_DELAY / CONCURRENT_REQUESTS_PER_DOMAIN until it "
                     "goes through (tried again every %.0f s)", exc, HOST_LIMITS_REFRESH,
                     extra=self._log_extra)

    async def publish(self, only_missing: bool) -> None:
        """Write this node's ``FRONTIER_HOST_LIMITS`` to Redis: at the first sync
        replacing another node's settings (not an operator's ``crawlctl``
        override); later only where a key has no override at all."""
        overrides: dict[int, dict] = {}
        for key, limits in self.politeness.overrides.items():
            overrides.setdefault(self.client.partition_of(key), {})[key] = limits
        for p, limits in overrides.items():
            keys = list(limits)
            for start in range(0, len(keys), LIMITS_CHUNK):  # no long script call
                chunk = {key: limits[key] for key in keys[start:start + LIMITS_CHUNK]}
                await self.client.partitions[p].set_limits(chunk, source="s",
                                                           only_missing=only_missing)
        self.published = time.monotonic()

    def maybe_refresh(self) -> None:
        """Start a refresh when one is due (called every loop turn)."""
        if (not self.politeness.overrides or self.published is None
                or time.monotonic() - self.published < HOST_LIMITS_REFRESH
                or (self.task is not None and not self.task.done())):
            return
        self.published = time.monotonic()   # one try per period, even if it fails
        self.task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.publish(only_missing=True)
        except Exception as exc:  # the next period tries again
            if refused(exc):
                self._refused(exc)
            else:  # Redis away: the frontier loop says so
                logger.debug("Cannot refresh FRONTIER_HOST_LIMITS in Redis: %s", exc,
                             extra=self._log_extra)

    async def close(self) -> None:
        """Cancel a refresh under way (the next node's is enough)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
