"""A spider for tests/test_urls.py: follows every link on 127.0.0.x and stores
one item per page with the URL it was fetched as."""

from urllib.parse import urlsplit

from scrapy import Request

from crawlproject.spiders.seeded import RedisSpider


class UrlVariantsSpider(RedisSpider):
    name = "urlvariants"

    def parse(self, response):
        yield {"url": response.url, "status": response.status}
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if (urlsplit(url).hostname or "").startswith("127.0.0."):
                yield Request(url, callback=self.parse)
