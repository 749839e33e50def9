"""A spider whose start() fails: the node must exit non-zero (start_error)."""

from crawlproject.spiders.seeded import RedisSpider


class BrokenStartSpider(RedisSpider):
    name = "broken_start"

    async def start(self):
        raise RuntimeError("simulated bug in start()")
        yield  # pragma: no cover - makes this an async generator

    def parse(self, response):
        pass
