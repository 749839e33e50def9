"""How many leased requests the engine gets per turn of the event loop
(``SCHEDULER_START_BURST``), and the prefetch buffer's default size."""

from __future__ import annotations

import asyncio


class StartBurst:
    """At most *size* requests handed to the engine per turn of the event loop
    (``SCHEDULER_START_BURST``; 0: no limit).

    Why: Scrapy's engine fills every free download slot in one go, so the
    requests it starts together come back together (same site, similar
    latency), and their responses then wait in the event loop behind each
    other's callbacks, holding their slots: a convoy that repeats every round.
    With a few starts per turn, the engine comes back for the rest on the next
    turn (``on_limit``: its ``nextcall``), after the responses that are ready
    by then; starts spread out, and so do the answers. The next turn comes at
    once when nothing else is ready: no wait is added.

    It pays only while the loop has time to spare (a node whose loop is busy
    all the time loses pages/s with it: BENCHMARKS.md §8). Hence off by
    default.
    """

    def __init__(self, size: int, on_limit):
        self.size = int(size)
        self.on_limit = on_limit
        self.count = 0
        self._limited = False

    def allow(self) -> bool:
        """May one more request be handed out in this turn?"""
        if not self.size or self.count < self.size:
            return True
        if not self._limited:  # once a turn: the engine comes back next turn
            self._limited = True
            self.on_limit()
        return False

    def handed_out(self) -> None:
        """Count one request handed to the engine in this turn."""
        if not self.size:
            return
        if self.count == 0:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop turning (a tool, a test): no turns to count
                return
            loop.call_soon(self._new_turn)  # runs first thing in the next turn
        self.count += 1

    def _new_turn(self) -> None:
        self.count = 0
        self._limited = False


def default_prefetch(concurrency: int) -> int:
    """``SCHEDULER_PREFETCH`` when unset: ``max(16, CONCURRENT_REQUESTS // 4)``.

    The buffer is refilled by every frontier call (a call at once when it ran
    dry), so where downloads are slow it keeps all the slots busy whatever its
    size. Where the node's CPU is the limit (a site answering at once), a
    buffer as large as the concurrency fills every slot: that many responses
    at a time in Scrapy's scraper, each with CONCURRENT_ITEMS asyncio tasks for
    the collector to walk, for no more pages and fewer pages/s; a smaller
    buffer costs Redis commands per page. The figures: BENCHMARKS.md §8
    (``python -m bench.prefetch``).
    """
    return max(16, concurrency // 4)
