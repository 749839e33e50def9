"""Spiders of the sitemap tests (tests/test_sitemaps.py): they follow no link,
so every page they fetch came from a seed or a sitemap. The ``lastmod`` a
sitemap gave a page is kept in the stats (``test/lastmod/<path>``)."""

from urllib.parse import urlsplit

from scrapy.exceptions import CloseSpider

from crawlproject.spiders.seeded import RedisSpider


class SitemapOnSpider(RedisSpider):
    name = "sitemap_on"
    sitemap_seeds = True
    custom_settings = {"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
                       "SITEMAPS_MAX_SIZE": 1 << 20}

    def parse(self, response):
        lastmod = response.meta.get("sitemap_lastmod")
        if lastmod:
            self.crawler.stats.set_value(f"test/lastmod{urlsplit(response.url).path}", lastmod)
        return ()


class SitemapOffSpider(SitemapOnSpider):
    name = "sitemap_off"
    sitemap_seeds = None    # the setting decides: off by default


class SitemapFloodSpider(SitemapOnSpider):
    """A slow crawl (5 pages a second) of a long sitemap, fed 60 at a time;
    it stops after 17 pages (the test has seen what it needed after 15)."""

    name = "sitemap_flood"
    custom_settings = {"DOWNLOAD_DELAY": 0.2, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
                       "SITEMAPS_MAX_QUEUED": 60}
    pages = 0

    def parse(self, response):
        self.pages += 1
        if self.pages >= 17:
            raise CloseSpider("enough")
        return ()
