"""A spider whose own requests (``-a requests=<JSON list>``) aim at the address
guard: literal and named hosts, redirects, rendered pages with context options."""

import json

from scrapy import Request

from crawlproject.spiders.seeded import RedisSpider


class EgressSpider(RedisSpider):
    name = "egress"

    def __init__(self, *args, requests: str = "[]", **kwargs):
        super().__init__(*args, **kwargs)
        self.planned = json.loads(requests)

    async def start(self):
        for spec in self.planned:
            yield Request(spec["url"], meta=spec.get("meta", {}),
                          priority=spec.get("priority", 0), dont_filter=True)
        async for seed in super().start():   # and the idle close of every RedisSpider
            yield seed

    def parse(self, response):
        yield {"url": response.url, "status": response.status}
