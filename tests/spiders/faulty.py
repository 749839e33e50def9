"""A products spider behind a downloader middleware that raises on some pages
(for the "no ack without a download" tests)."""

from scrapy.exceptions import IgnoreRequest

from crawlproject.spiders.products import ProductsSpider


class FaultyMiddleware:
    """Raises a plain bug on ``/product/3`` (a middleware fed bad data, e.g. a
    proxy health of ``inf``) and ``IgnoreRequest`` on ``/product/4`` (a page a
    middleware decided to skip, as robots.txt does)."""

    def process_request(self, request, spider=None):
        if request.url.endswith("/product/3"):
            raise OverflowError("simulated middleware bug: cannot convert float infinity")
        if request.url.endswith("/product/4"):
            raise IgnoreRequest("skipped on purpose")
        return None


class FaultySpider(ProductsSpider):
    name = "faulty"
    custom_settings = {"DOWNLOADER_MIDDLEWARES": {
        "tests.spiders.faulty.FaultyMiddleware": 620}}
