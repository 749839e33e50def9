"""A Scrapy crawl that idles for ever with the liveness and metrics extensions,
for tests/test_liveness.py: ``python -m tests.liveness_node FILE``. It prints
``metrics PORT`` once the spider is open; SIGUSR1 blocks its reactor (a
``time.sleep`` in the main thread: what a blocking call in a callback does)."""

from __future__ import annotations

import signal
import sys
import time

from scrapy import Spider, signals
from scrapy.crawler import CrawlerProcess
from scrapy.exceptions import DontCloseSpider


class Idle(Spider):
    name = "idle"

    async def start(self):
        return
        yield

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.idle, signal=signals.spider_idle)
        crawler.signals.connect(spider.opened, signal=signals.spider_opened)
        return spider

    def idle(self):
        raise DontCloseSpider

    def opened(self, spider):
        from twisted.internet import reactor

        reactor.callLater(0, self.report)   # after every spider_opened handler: the server is up

    def report(self):
        metrics = next(e for e in self.crawler.extensions.middlewares
                       if type(e).__name__ == "PrometheusMetrics")
        print(f"metrics {metrics.port}", flush=True)


def hang(signum, frame):
    print("hanging", flush=True)
    time.sleep(3600)


def main(path: str) -> None:
    signal.signal(signal.SIGUSR1, hang)
    process = CrawlerProcess({
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "EXTENSIONS": {"crawlproject.extensions.metrics.PrometheusMetrics": 500,
                       "crawlproject.extensions.liveness.Liveness": 540},
        "TELNETCONSOLE_ENABLED": False, "REMOTE_CONTROL_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "METRICS_ENABLED": True, "METRICS_PORT": 0,
        "LIVENESS_ENABLED": True, "LIVENESS_FILE": path, "LIVENESS_INTERVAL": 0.2,
    }, install_root_handler=True)
    process.crawl(Idle)
    process.start()


if __name__ == "__main__":
    main(sys.argv[1])
