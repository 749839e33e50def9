"""Spiders of the sitemap tests (tests/test_sitemaps.py): they follow no link,
so every page they fetch came from a seed or a sitemap. The ``lastmod`` a
sitemap gave a page is kept in the stats (``test/lastmod/<path>``)."""

from urllib.parse import urlsplit

from crawlproject.spiders.seeded import RedisSpider


class SitemapOnSpider(RedisSpider):
    name = "sitemap_on"
    sitemap_seeds = True

    def parse(self, response):
        lastmod = response.meta.get("sitemap_lastmod")
        if lastmod:
            self.crawler.stats.set_value(f"test/lastmod{urlsplit(response.url).path}", lastmod)
        return ()


class SitemapOffSpider(SitemapOnSpider):
    name = "sitemap_off"
    sitemap_seeds = None    # the setting decides: off by default


class SitemapFloodSpider(SitemapOnSpider):
    name = "sitemap_flood"
