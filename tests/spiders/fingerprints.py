"""Spider for tests/test_impersonate_crawl.py: sessions crawled across nodes."""

from crawlproject.spiders.seeded import RedisSpider


class FingerprintsSpider(RedisSpider):
    """Seeds ``{"url": ".../start/S", "meta": {"session": "S"}}``: the start page
    links the session's pages (``a.page``), followed in the same session; every
    page is an item with the node that downloaded it."""

    name = "fingerprints"
    seed_meta_allow = ["session", "render"]

    def parse(self, response):
        session = response.meta.get("session")
        yield {"url": response.url, "session": session, "node": self.settings.get("NODE_ID")}
        for href in response.css("a.page::attr(href)").getall():
            yield response.follow(href, meta={"session": session} if session else {})
