"""The Redis side of sitemap seeds: knows Redis (asyncio redis-py), not Scrapy.

* ``{<seed key>}:sitemaps`` (list): seeds read from sitemaps, waiting for room
  in the frontier. A node that parsed a sitemap LPUSHes its page URLs here, in
  chunks; every node's feeder moves the oldest into the seed key
  (FEED_SITEMAP_SEEDS, atomic: nothing is lost or doubled between the two
  keys) while the frontier and the seed key together hold fewer than
  ``SITEMAPS_MAX_QUEUED``. From the seed key they take the seed path as any
  seed (claims, the seed policy, back-pressure of the node).
* ``{<spider>}:sitemaps`` (hash): host → how many sitemaps were requested for
  that site (``SITEMAPS_MAX_PER_SITE``), for every node: its robots.txt's
  once, then each sitemap an index names.
"""

from __future__ import annotations

from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import FEED_SITEMAP_SEEDS
from crawlproject.keys import SitemapKeys

#: most seeds one FEED_SITEMAP_SEEDS call moves (Lua's unpack() stays far below its limit)
MAX_FEED = 1000


class SitemapStore:
    """Sitemap seeds waiting in Redis, and the per-site sitemap counts."""

    def __init__(self, client, spider: str, seed_key: str, kind: str = "list"):
        if kind not in ("list", "set", "zset"):
            raise ValueError(f"unknown seed key type {kind!r}")
        self.client = client
        self.keys = SitemapKeys(spider, seed_key)
        self.seed_key = seed_key
        self.kind = kind
        self._feed = script(client, FEED_SITEMAP_SEEDS)

    async def count_listed(self, host: str, count: int) -> bool:
        """Count the *count* sitemaps *host*'s robots.txt lists, unless its
        site was counted before (another node parsed the same robots.txt, or
        it was fetched again after its expiry): those requests are repeats,
        free (the Bloom filter drops them). True when counted now."""
        return bool(await self.client.hsetnx(self.keys.sites, host, count))

    async def count_sitemap(self, host: str) -> int:
        """One more sitemap requested for *host*'s site; how many so far."""
        return int(await self.client.hincrby(self.keys.sites, host, 1))

    async def push(self, seeds: list[str]) -> int:
        """Add *seeds* (JSON seeds) behind those waiting; how many wait now."""
        if not seeds:
            return await self.waiting()
        return int(await self.client.lpush(self.keys.pending, *seeds))

    async def waiting(self) -> int:
        return int(await self.client.llen(self.keys.pending))

    async def feed(self, count: int, room: int) -> tuple[int, int]:
        """Move at most *count* waiting seeds into the seed key, leaving it at
        most *room* seeds long; returns ``(moved, still waiting)``."""
        count = max(0, min(int(count), MAX_FEED))
        moved, left = await self._feed(keys=[self.keys.pending, self.seed_key],
                                       args=[self.kind, count, max(0, int(room))])
        return int(moved), int(left)
