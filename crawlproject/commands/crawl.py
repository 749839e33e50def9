"""``scrapy crawl`` that exits non-zero when the crawl did not end normally.

Scrapy's own ``crawl`` exits 0 whatever the finish reason, so a node that
stopped because of a broken start (``start_error``), or that had to close
with items it could not store (``mongo_unavailable``), looks like success to
systemd, scrapyd and scripts. Here the exit code is 0 for ``finished``,
``shutdown`` (SIGTERM / Ctrl-C), ``operator_stop`` (``crawlctl stop``) and Scrapy's ``closespider_*`` limits, and 1
for any other reason, which is also logged: among them ``control_stop_at_start``
and ``control_drain_at_start``, a node that started into a stopped or drained
crawl with ``CONTROL_ON_START = "exit"`` (it crawled nothing).
"""

from __future__ import annotations

import logging

from scrapy.commands.crawl import Command as ScrapyCrawlCommand
from scrapy.exceptions import UsageError

logger = logging.getLogger(__name__)

NORMAL_REASONS = frozenset({"finished", "shutdown", "operator_stop"})  # stop: crawlctl stop


def normal_finish(reason: str | None) -> bool:
    """True for finish reasons that mean the crawl ended as asked."""
    return reason in NORMAL_REASONS or (reason or "").startswith("closespider_")


class Command(ScrapyCrawlCommand):
    def run(self, args, opts) -> None:
        if len(args) != 1:
            raise UsageError("run one spider: scrapy crawl <spider>")
        assert self.crawler_process
        crawler = self._create_crawler(args[0])
        self.crawler_process.crawl(crawler, **opts.spargs)
        self.crawler_process.start()
        if self.crawler_process.bootstrap_failed:
            self.exitcode = 1
            return
        stats = getattr(crawler, "stats", None)
        reason = stats.get_value("finish_reason") if stats is not None else None
        if not normal_finish(reason):
            logger.error("Crawl of %r ended with finish reason %r: exit code 1", args[0], reason)
            self.exitcode = 1
