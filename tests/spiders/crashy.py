"""A products spider whose callback crashes on one page (for dead-letter tests)."""

from crawlproject.spiders.products import ProductsSpider


class CrashySpider(ProductsSpider):
    name = "crashy"
    crash_path = "/product/3"

    def parse_product(self, response):
        if response.url.endswith(self.crash_path):
            raise ValueError(f"simulated parser bug on {response.url}")
        yield from super().parse_product(response)
