"""Requests a node keeps to itself: those it cannot store in the frontier.

Most requests a spider makes go to the shared frontier as JSON. A few cannot:
a callback that is not a method of the spider (a ``lambda``, a
``functools.partial``, another object's method), an object JSON cannot hold
in ``meta`` or ``cb_kwargs``; and without ``FRONTIER_SECRET``, anything the
seed policy would refuse on the way back (a private callback such as
``CrawlSpider._callback``, a ``POST`` body). Scrapy's own persistent scheduler
keeps such a request in memory; so does this one. Such a request is

* **never dropped**: the node that made it crawls it;
* **deduplicated for the cluster**: its fingerprint goes through the
  partition's Bloom filter (the one the frontier dedupes with), so two nodes
  that make the same request do not both fetch it;
* **polite on this node**: it gets a download slot of its own per site with
  the site's delay and concurrency (``DOWNLOAD_DELAY``,
  ``CONCURRENT_REQUESTS_PER_DOMAIN``, ``FRONTIER_HOST_LIMITS``), the limits the
  frontier applies to the site for the whole cluster;
* counted (``scheduler/kept_local``, ``scheduler/kept_local/<reason>``) and
  logged once per reason.

When its retries run out or its callback raises, it is dead-lettered like a
leased request (``{spider}:dead``, with its URL and reason; without a payload
to replay, since it cannot be stored). What it loses: it is not leased, so it
is lost if the node dies, its retries do not wait out a backoff, and the
frontier's cluster-wide politeness does not count it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Awaitable, Callable

from scrapy import Request

from crawlproject.frontier.sitelimits import UNLIMITED

logger = logging.getLogger(__name__)

#: download slots of kept requests (never a politeness key: see strip_slot)
SLOT_PREFIX = "crawlproject-local:"
#: meta key marking a kept request (process-local: never stored)
KEPT_META = "_crawlproject_kept"
BATCH = 500


def strip_slot(request: Request) -> None:
    """Forget what :class:`LocalRequests` gave *request*, its download slot
    and its mark (it is enqueued again: a redirect, a retry)."""
    request.meta.pop(KEPT_META, None)
    slot = request.meta.get("download_slot")
    if isinstance(slot, str) and slot.startswith(SLOT_PREFIX):
        del request.meta["download_slot"]


def is_kept(request: Request) -> bool:
    """Whether *request* is one this node keeps (not leased from the frontier)."""
    return KEPT_META in request.meta


def local_slot(crawler, politeness, key: str) -> str | None:
    """The download slot of kept requests of politeness key *key*, with the
    site's limits (None when the frontier's politeness is off: Scrapy's
    own slots then apply as configured)."""
    if not politeness.enabled:
        return None
    slot = SLOT_PREFIX + key
    try:
        downloader = crawler.engine.downloader
    except (RuntimeError, AttributeError):   # no engine yet: Scrapy's slot defaults
        downloader = None
    if downloader is not None and slot not in downloader.per_slot_settings:
        limits = politeness.overrides.get(key, politeness.default)
        concurrency = limits.concurrency if 0 < limits.concurrency < UNLIMITED else 1_000_000
        downloader.per_slot_settings[slot] = {"delay": limits.delay,
                                              "concurrency": concurrency}
    return slot


class LocalRequests:
    """The requests this node keeps (see the module docstring).

    *mark_seen(partition, fingerprints)* adds fingerprints to the partition's
    Bloom filter and says which were new; *partition_of(key)*;
    *slot_for(key)* registers the download slot for a politeness key and
    returns its name.
    """

    def __init__(self, *, mark_seen: Callable[[int, list], Awaitable[list[bool]]],
                 partition_of: Callable[[str], int], slot_for: Callable[[str], str],
                 count: Callable[[str, int], None], nudge: Callable[[], None],
                 log_extra: dict, retry_after: float = 1.0):
        self.mark_seen, self.partition_of, self.slot_for = mark_seen, partition_of, slot_for
        self.count, self.nudge, self.log_extra = count, nudge, log_extra
        self.retry_after = retry_after
        self._ready: list[tuple[int, int, Request]] = []   # heap: (-priority, seq, request)
        self._unchecked: dict[int, list[tuple[str, Request]]] = {}
        self._checking = 0   # in a filter call not answered yet
        self._seq = itertools.count()
        self._said: set[str] = set()
        self._task: asyncio.Future | None = None
        self._wake = asyncio.Event()
        self.closed = False

    def keep(self, request: Request, fingerprint, key: str, reason: str, code: str) -> None:
        """Keep *request* (politeness key *key*) here; *reason* says why it
        cannot be stored, *code* is its stats key."""
        self.count("scheduler/kept_local", 1)
        self.count(f"scheduler/kept_local/{code}", 1)
        if code not in self._said:
            self._said.add(code)
            logger.warning("Kept on this node, not in the shared frontier (crawled here, not "
                           "shared with other nodes, lost if this node dies): %s: %s. Counted "
                           "in scheduler/kept_local/%s; said once.", request, reason, code,
                           extra=self.log_extra)
        request.meta[KEPT_META] = True
        slot = self.slot_for(key)
        if slot is not None:
            request.meta["download_slot"] = slot
        if fingerprint is None:
            self._push(request)
            return
        self._unchecked.setdefault(self.partition_of(key), []).append((fingerprint, request))
        self._start()

    def _push(self, request: Request) -> None:
        heapq.heappush(self._ready, (-request.priority, next(self._seq), request))
        self.nudge()

    def next(self, outranks: int | None = None) -> Request | None:
        """The next kept request, unless the frontier's next entry (priority
        *outranks*) comes first."""
        if any(self._unchecked.values()) and (self._task is None or self._task.done()):
            self._start()
        if not self._ready or (outranks is not None and -self._ready[0][0] < outranks):
            return None
        return heapq.heappop(self._ready)[2]

    def pending(self) -> bool:
        """Kept requests not handed to the engine yet (or not checked yet)."""
        return bool(self._ready or self._checking) or any(self._unchecked.values())

    def __len__(self) -> int:
        return (len(self._ready) + self._checking
                + sum(len(v) for v in self._unchecked.values()))

    def _start(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:   # not in the reactor's loop yet: the next call starts it
                return
            # Kept: the event loop holds tasks only weakly.
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while not self.closed and any(self._unchecked.values()):
            self._wake.clear()
            for partition in list(self._unchecked):
                if not await self._check(partition):
                    try:   # Redis away: kept, tried again (sooner if more come)
                        await asyncio.wait_for(self._wake.wait(), self.retry_after)
                    except asyncio.TimeoutError:
                        pass
                    break

    async def _check(self, partition: int) -> bool:
        waiting = self._unchecked.get(partition) or []
        batch, self._unchecked[partition] = waiting[:BATCH], waiting[BATCH:]
        self._checking += len(batch)
        try:
            new = await self.mark_seen(partition, [fp for fp, _ in batch])
        except Exception as exc:  # noqa: BLE001 - Redis down or refusing: keep them
            self._unchecked[partition][:0] = batch
            logger.debug("Cannot check kept requests against the filter: %s", exc,
                         extra=self.log_extra)
            return False
        finally:
            self._checking -= len(batch)
        duplicates = 0
        for (_, request), fresh in zip(batch, new):
            if fresh:
                self._push(request)
            else:
                duplicates += 1
        if duplicates:
            self.count("dupefilter/filtered", duplicates)
        return True

    async def close(self) -> int:
        """Stop checking; returns how many kept requests were never crawled."""
        self.closed = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        left = len(self)
        if left:
            logger.warning("%d request(s) kept on this node were not crawled before it closed "
                           "(scheduler/kept_local_lost)", left, extra=self.log_extra)
            self.count("scheduler/kept_local_lost", left)
        return left
