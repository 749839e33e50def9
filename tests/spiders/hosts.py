"""A spider for the multi-host demo site (:mod:`devtools.demo.hosts`).

Seeded with the home page of each host, it follows listing, "next" and page
links on the same host and stores one item per page (``/p/N``), so a crawl
covers every page of every host. Off-host links are never followed.
"""

import time
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.defer import deferred_to_future

from crawlproject.spiders.seeded import RedisSpider

LINKS = "a.page::attr(href), a.next::attr(href), a.link::attr(href)"


class SendLag:
    """``HOSTS_SEND_LAG_MS``: every request waits that long, without holding up
    the node's loop, between the scheduler and the downloader: a node whose
    sends lag behind its leases (a slow downloader middleware, a busy engine)."""

    def __init__(self, lag: float):
        self.lag = lag

    @classmethod
    def from_crawler(cls, crawler):
        lag = crawler.settings.getfloat("HOSTS_SEND_LAG_MS", 0) / 1000
        if lag <= 0:
            raise NotConfigured
        return cls(lag)

    async def process_request(self, request, spider=None):
        from twisted.internet import reactor, task

        await deferred_to_future(task.deferLater(reactor, self.lag))


class HostsSpider(RedisSpider):
    name = "hosts"
    custom_settings = {"DOWNLOADER_MIDDLEWARES": {"tests.spiders.hosts.SendLag": 1}}

    def parse(self, response):
        """One item for a page; requests for every same-host listing or page link.

        ``HOSTS_PARSE_CPU_MS``: each callback first keeps the CPU busy that
        long (a heavy page's parsing, or a loaded machine: the node's loop
        is held up meanwhile)."""
        busy = self.settings.getfloat("HOSTS_PARSE_CPU_MS", 0) / 1000
        if busy:
            end = time.perf_counter() + busy
            while time.perf_counter() < end:
                pass
        parts = urlsplit(response.url)
        if parts.path.startswith("/p/"):
            yield {"url": response.url, "host": parts.hostname}
        for href in response.css(LINKS).getall():
            url = response.urljoin(href)
            if urlsplit(url).hostname == parts.hostname:
                yield Request(url, callback=self.parse)
