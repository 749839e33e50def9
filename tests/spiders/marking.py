"""A products spider that records, in ``ITEM_MARK_FILE``, the URL of every item
its callbacks produced (after Scrapy took it for the item pipelines), so a test
knows which items a node had in hand when it is killed."""

import os

from crawlproject.items import ProductItem
from crawlproject.spiders.products import ProductsSpider


class MarkingSpider(ProductsSpider):
    name = "marking"

    def parse_product(self, response):
        path = self.settings.get("ITEM_MARK_FILE")
        for output in super().parse_product(response):
            yield output
            if path and isinstance(output, ProductItem):
                # Reached once the engine handed the item to the pipelines.
                with open(path, "a") as marks:
                    marks.write(output["url"] + "\n")
                    marks.flush()
                    os.fsync(marks.fileno())
