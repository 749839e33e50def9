"""``products``: the example spider (listing pages → product pages).

Seeds come from ``products:start_urls``. Listing pages are followed through
their ``next`` links; product pages yield one :class:`ProductItem` each and
link to related products (many duplicates, removed by the dupefilter). A link
marked ``data-render="js"`` is fetched through scrapy-playwright (Chromium),
because its data only appears after JavaScript runs.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.http import Response

from crawlproject.items import ProductLoader, require_items_extra
from crawlproject.spiders.seeded import RedisSpider

JS_READY_SELECTOR = "#app .title"


class ProductsSpider(RedisSpider):
    name = "products"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        require_items_extra()  # its items parse prices and dates: fail at start, not per page
        return super().from_crawler(crawler, *args, **kwargs)

    def parse(self, response: Response):
        """A listing page: product links and the next listing page."""
        for link in response.css("a.product"):
            yield self._product_request(response, link)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)

    def parse_product(self, response: Response):
        """A product page: one item, and requests for related products."""
        loader = ProductLoader(response=response)
        loader.add_value("url", response.url)
        loader.add_css("title", ".title")
        loader.add_css("price", ".price::text")
        loader.add_css("currency", ".price::text")
        loader.add_css("published", ".published::text")
        loader.add_css("description", ".description")
        related = response.css("a.related")
        loader.add_value("related", [response.urljoin(a.attrib["href"]) for a in related])
        loader.add_value("rendered", bool(response.meta.get("playwright")))
        yield loader.load_item()
        for link in related:
            yield self._product_request(response, link)

    def _product_request(self, response: Response, link) -> Request:
        url = response.urljoin(link.attrib["href"])
        if link.attrib.get("data-render") == "js":
            return Request(url, callback=self.parse_product, meta=js_meta())
        return Request(url, callback=self.parse_product)


def js_meta() -> dict:
    """meta for a request rendered by Chromium, waiting for the data to appear.

    The rendering middleware turns it into scrapy-playwright's meta: no
    Playwright import here, so a node without the render extra never fails in
    this callback (rendering is off there, with the add-on's warning)."""
    return {"render": True, "render_wait_for": JS_READY_SELECTOR}
