"""Sitemaps as a seed source (off by default): robots.txt's ``Sitemap:`` lines
and sitemap indexes, their page URLs fed into the seed path with back-pressure,
``lastmod`` carried to the recrawl schedule (docs/sitemaps.md).

* :mod:`~crawlproject.sitemaps.parse`: what a sitemap says, read defensively (pure);
* :mod:`~crawlproject.sitemaps.store`: the seeds waiting in Redis, per-site counts;
* :mod:`~crawlproject.sitemaps.middleware`: ``SitemapSeeds``, the downloader
  middleware that requests, reads and feeds.
"""

from crawlproject.sitemaps.middleware import LASTMOD_META, SITEMAP_META, SitemapSeeds

__all__ = ["LASTMOD_META", "SITEMAP_META", "SitemapSeeds"]
