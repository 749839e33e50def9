"""Which leased request produced a request: lets its ack wait only for its own.

A request is acknowledged only once the requests it produced are stored (a
node killed in between would lose them: an acked request is never crawled
again). Without knowing which request produced which, the frontier client
makes every ack wait for *every* request added before it; with several
partitions, one unreachable partition then holds up the acks of all of them.

:class:`LineageMiddleware` (spider, 990: next to the spider) marks each request
a callback yields with the frontier member of the response's request
(``meta[PARENT_META]``, never stored: the scheduler pops it); the scheduler
tells the client, whose ack of that member then waits only for its own
requests (and for requests added without a parent: seeds, those of
extensions). A request made elsewhere (a middleware further out, a task of
the spider's own) carries no mark and keeps the wait for everything.

Off with one partition (``FRONTIER_PARTITIONS = 1``: a call stores the adds
and the acks of its partition together, so nothing waits) or with
``FRONTIER_LINEAGE_ENABLED = False``.
"""

from __future__ import annotations

from typing import AsyncIterator

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import Response

from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import LEASE_META, PARENT_META


class LineageMiddleware:
    """Spider middleware: each yielded request names the leased request it came from."""

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if (not setting(s, "FRONTIER_LINEAGE_ENABLED")
                or setting(s, "FRONTIER_PARTITIONS") <= 1):
            raise NotConfigured
        return cls()

    async def process_spider_output(self, response: Response, result: AsyncIterator):
        request = response.request
        member = request.meta.get(LEASE_META) if request is not None else None
        async for output in result:
            if member is not None and isinstance(output, Request):
                output.meta[PARENT_META] = member
            yield output
