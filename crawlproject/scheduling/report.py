"""What a node says about its share of the crawl: the report ``crawlctl
status`` shows (sent by :class:`crawlproject.control.ControlWatcher`), the
``Frontier: ...`` line every ``SCHEDULER_LOG_INTERVAL`` seconds with the
scheduler's counts added to the cluster-wide counters, and the Bloom filter's
stats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

# The scheduler's own lines: they keep its logger's name.
logger = logging.getLogger("crawlproject.scheduler")


class NodeReport:
    """Counts scheduler stats (``count``) into *stats* and, every *interval*
    seconds, into the cluster-wide counters in Redis; makes the node's
    report. The frontier *client* (a
    :class:`~crawlproject.frontier.client.FrontierClient`) is passed to the
    methods that read it."""

    def __init__(self, stats, interval: float, log_extra: dict):
        self.stats, self.interval, self.log_extra = stats, interval, log_extra
        #: counts not yet added to the cluster-wide counters
        self.stat_deltas: dict[str, int] = {}
        self.last_report = time.monotonic()
        self.task: asyncio.Future | None = None   # a report under way
        self._samples: deque[tuple[float, int, int]] = deque()

    def count(self, name: str, value: int = 1) -> None:
        """A scheduler stat, also added to the cluster-wide counters."""
        if value:
            self.stats.inc_value(name, value)
            self.stat_deltas[name] = self.stat_deltas.get(name, 0) + value

    def status(self, client, *, downloading: int, lease_ttl: float, state: str,
               waiting: bool) -> dict:
        """What `crawlctl status` shows for this node (sent every few seconds)."""
        get = self.stats.get_value
        pages, items = get("response_received_count", 0), get("item_scraped_count", 0)
        now = time.monotonic()
        self._samples.append((now, pages, items))
        while self._samples and now - self._samples[0][0] > 60:
            self._samples.popleft()
        t0, p0, i0 = self._samples[0]
        span = now - t0
        stats = self.stats.get_stats()
        download = sum(v for k, v in stats.items()
                       if k.startswith("downloader/exception_type_count/"))
        callback = sum(v for k, v in stats.items()
                       if k.startswith("spider_exceptions/") and k.count("/") == 1)
        return {"pages": pages, "items": items, "errors": download + callback,
                "errors_download": download, "errors_callback": callback,
                "dead": get("scheduler/dead", 0),
                "pages_per_s": round((pages - p0) / span, 2) if span > 0 else 0.0,
                "items_per_s": round((items - i0) / span, 2) if span > 0 else 0.0,
                "leases": len(client.held) + len(client.buffer) + client.reserved_count(),
                # started and not yet answered: what a paused node still finishes
                "downloading": downloading,
                # with the lease deadline in {spider}:nodes: when it last renewed
                "lease_ttl_s": lease_ttl, "state": state,
                # held by the state found at start (CONTROL_ON_START = wait)
                "waiting": int(waiting)}

    def maybe_report(self, client) -> None:
        """Log the frontier's sizes and store the counts, once an interval."""
        now = time.monotonic()
        if now - self.last_report >= self.interval:
            if self.task is None or self.task.done():
                self.last_report = now
                # Kept: the event loop holds tasks only weakly.
                self.task = asyncio.ensure_future(self._report(client))

    async def _report(self, client) -> None:
        sizes = client.sizes()
        logger.info("Frontier: %d queued, %d delayed, %d in flight across nodes; %d prefetched "
                    "here", sizes["queued"], sizes["delayed"], sizes["inflight"],
                    sizes["prefetched"], extra=self.log_extra)
        deltas, self.stat_deltas = self.stat_deltas, {}
        try:
            await client.partitions[0].add_stats(deltas)
        except Exception:  # kept for the next report, with what was counted meanwhile
            for name, value in deltas.items():
                self.stat_deltas[name] = self.stat_deltas.get(name, 0) + value
        await self._record_bloom_stats(client)

    async def settle(self) -> None:
        """Wait for a report under way: its counts stored, or back in stat_deltas."""
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    async def close(self, client) -> None:
        """The last counts stored (as far as Redis takes them), the Bloom stats read."""
        try:
            await client.partitions[0].add_stats(self.stat_deltas)
        except Exception:
            pass
        await self._record_bloom_stats(client)

    async def _record_bloom_stats(self, client) -> None:
        try:
            estimates = [await f.bloom_estimates() for f in client.partitions]
        except Exception:
            return
        layers = max((e["layers"] for e in estimates), default=0)
        if layers:
            count = sum(e["count"] for e in estimates)
            bits = sum(e["bits"] for e in estimates)
            self.stats.set_value("bloom/layers", layers)
            self.stats.set_value("bloom/items", count)
            self.stats.set_value("bloom/fill_ratio", round(
                sum(e["fill_ratio"] * e["bits"] for e in estimates) / bits, 6) if bits else 0.0)
            self.stats.set_value("bloom/est_fp_rate", max(e["est_fp_rate"] for e in estimates))
