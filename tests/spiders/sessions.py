"""Spider for tests/test_sessioncookies.py: login flows as explicit sessions."""

from crawlproject.spiders.seeded import RedisSpider


class SessionsSpider(RedisSpider):
    """Seeds ``{"url": ".../login/S", "meta": {"session": "S"}}``: the login page
    sets the session's cookie and links the session's pages, followed in the
    same session."""

    name = "sessions"
    seed_meta_allow = ["session"]

    def parse(self, response):
        session = response.meta["session"]
        yield {"url": response.url, "session": session}
        for href in response.css("a.page::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page, meta={"session": session})

    def parse_page(self, response):
        yield {"url": response.url, "session": response.meta.get("session")}
