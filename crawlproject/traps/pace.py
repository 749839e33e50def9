"""Dropping many outputs in a row without holding up the event loop.

A callback's output reaches the engine through a chain of async generators
that never wait: the event loop turns only when an output gets through (the
engine takes it). A middleware that drops 90,000 requests in a row (the rest
of a page of 100,000 links) held the loop for 11 s in a measured crawl: no
download, no heartbeat, no other site's page meanwhile. The middlewares here
let it turn every :data:`DROPS_PER_TURN` outputs they drop.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from scrapy.spidermiddlewares.base import BaseSpiderMiddleware
from scrapy.utils.asyncio import sleep

#: Outputs dropped in a row between two turns of the event loop (as the engine
#: takes a callback's output: a few dozen at a time).
DROPS_PER_TURN = 64


class Pace:
    """Counts the outputs dropped; every :data:`DROPS_PER_TURN`, a loop turn."""

    def __init__(self) -> None:
        self.dropped_count = 0

    async def dropped(self) -> None:
        """One more output dropped."""
        self.dropped_count += 1
        if self.dropped_count % DROPS_PER_TURN == 0:
            await sleep(0)


class PacedFilter(BaseSpiderMiddleware):
    """A :class:`BaseSpiderMiddleware` whose asynchronous output lets the
    event loop turn while it drops (``get_processed_request`` returns None)."""

    async def process_spider_output_async(self, response, result: AsyncIterator[Any]):
        pace = Pace()
        async for output in result:
            if (output := self._get_processed(output, response)) is not None:
                yield output
            else:
                await pace.dropped()
