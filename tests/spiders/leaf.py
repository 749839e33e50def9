"""A spider that stores one item per seed page and follows nothing."""

from crawlproject.spiders.seeded import RedisSpider


class LeafSpider(RedisSpider):
    name = "leaf"

    def parse(self, response):
        yield {"url": response.url, "status": response.status}
