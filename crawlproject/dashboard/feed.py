"""What the dashboard shows of one spider, read the way ``crawlctl status --json``
reads it (:func:`crawlproject.ops.status.status_data`, plus :func:`crawlproject.ops.proxies.proxy_report`),
and a rolling window of samples for the charts.

One :class:`SpiderFeed` per spider is shared by every browser: Redis is read at
most once per interval, whoever asks, in a worker thread (the reads are the sync
client's, as the command line's; the event loop never waits on Redis).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable

from crawlproject.ops.common import frontier_partitions
from crawlproject.ops.proxies import proxy_report
from crawlproject.ops.status import status_data
from crawlproject.connection import REDIS_FAILURES

logger = logging.getLogger(__name__)

#: frontier sizes in each sample, in the order of the chart's series
FRONTIER_SERIES = ("queued", "inflight", "delayed", "dead", "invalid")
RATE_SERIES = ("pages_per_s", "items_per_s")


#: characters kept of each string (value or key) read from Redis; a longer one
#: ends in TRUNCATED_MARK: the page, the JSON and each event stay small
FIELD_MAX = 300
TRUNCATED_MARK = "… [truncated: %d characters]"


def read_snapshot(client, spider: str, seeds, stored=None) -> dict:
    """``crawlctl status --json`` of *spider*, with its proxy pool under
    ``proxies`` and, with *stored* (:class:`~crawlproject.dashboard.stored.StoredItems`),
    its items in MongoDB under ``stored``; every string cut to :data:`FIELD_MAX` characters."""
    data = status_data(spider, frontier_partitions(client, spider), seeds)
    data["proxies"] = proxy_report(client, spider)
    if stored is not None:
        data["stored"] = stored.read()
    return bounded(data)


def bounded(value, limit: int = FIELD_MAX):
    """*value* (JSON-like) with every string, and every key, of more than
    *limit* characters cut and marked as truncated."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + TRUNCATED_MARK % len(value)
    if isinstance(value, dict):
        return {bounded(k, limit): bounded(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded(v, limit) for v in value]
    return value


def sample_of(data: dict) -> list:
    """``[unix seconds, queued, inflight, delayed, dead, invalid, pages/s, items/s]``."""
    return ([round(data["at"] / 1000, 3)] + [data["frontier"][k] for k in FRONTIER_SERIES]
            + [data["rates"][k] for k in RATE_SERIES])


class SpiderFeed:
    """The latest snapshot of one spider, its error if the last read failed, and
    the samples of the last *window* seconds."""

    def __init__(self, spider: str, read: Callable[[], dict], interval: float, window: float,
                 redact: Callable[[str], str] = str):
        self.spider, self.interval = spider, interval
        self._read, self._redact = read, redact
        self.samples: deque[list] = deque(maxlen=max(2, int(window / interval) + 1))
        self.latest: dict | None = None
        self.error: str | None = None
        self.version = 0
        # monotonic time a page or a stream last asked; None: never (not 0.0:
        # on a machine up for less than the window, 0.0 read as "just now")
        self.demanded: float | None = None
        self.keep = window    # seconds the background sampler goes on after that
        self._lock = asyncio.Lock()
        self._updated = asyncio.Event()
        self._taken: float | None = None   # monotonic time of the last read; None: none yet

    def wanted(self) -> bool:
        """Whether someone looked within the window (the sampler keeps it fresh)."""
        return self.demanded is not None and time.monotonic() - self.demanded < self.keep

    async def current(self) -> SpiderFeed:
        """Read now unless a read is less than an interval old."""
        self.demanded = time.monotonic()
        await self.refresh_if_stale()
        return self

    async def refresh_if_stale(self) -> None:
        if self._taken is None or time.monotonic() - self._taken >= self.interval * 0.9:
            await self.refresh()

    async def refresh(self) -> None:
        """One read (concurrent callers share it)."""
        version = self.version
        async with self._lock:
            if self.version != version:    # another caller read while we waited
                return
            try:
                data = await asyncio.to_thread(self._read)
            except REDIS_FAILURES as exc:
                self._failed(f"Redis: {type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - bad data in Redis; the page says so
                self._failed(f"{type(exc).__name__}: {exc}", traceback=True)
            else:
                self.latest, self.error = data, None
                self.samples.append(sample_of(data))
            self._taken = time.monotonic()
            self.version += 1
            self._updated.set()
            self._updated = asyncio.Event()

    def _failed(self, message: str, traceback: bool = False) -> None:
        message = self._redact(message)
        if message != self.error:   # once per distinct error, not once per interval
            logger.warning("Reading the state of %s failed: %s", self.spider, message,
                           exc_info=traceback)
        self.error = message

    async def wait_newer(self, version: int, timeout: float) -> None:
        """Return once a read newer than *version* is done (or after *timeout*)."""
        if self.version > version:
            return
        try:
            await asyncio.wait_for(self._updated.wait(), timeout)
        except asyncio.TimeoutError:
            pass


async def run_sampler(feeds: dict[str, SpiderFeed], interval: float) -> None:
    """Refresh every feed someone looked at recently, once per *interval*."""
    while True:
        for feed in feeds.values():
            if feed.wanted():
                await feed.refresh_if_stale()
        await asyncio.sleep(interval)
