"""One crawl node running several spiders of the project around it, as a
``CrawlerProcess`` does (Scrapy runs several spiders in one process the same
way); each crawler's stats are written as JSON at its close.

    python -m tests.run_spiders --stats-dir DIR [-s NAME=VALUE ...] SPIDER [SPIDER ...]

Used by the spider-kinds tests: two such processes are two nodes, and one
process start instead of one per spider keeps the suite's CPU for the crawls.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scrapy import signals
from scrapy.crawler import AsyncCrawlerProcess
from scrapy.utils.project import get_project_settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("spiders", nargs="+")
    parser.add_argument("--stats-dir", type=Path, required=True)
    parser.add_argument("-s", "--set", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    settings = get_project_settings()
    settings.setdict(dict(item.split("=", 1) for item in args.set), priority="cmdline")
    process = AsyncCrawlerProcess(settings)
    node = settings.get("NODE_ID") or "node"
    for name in args.spiders:
        crawler = process.create_crawler(name)

        def closed(spider, reason, crawler=crawler):
            stats = {k: v for k, v in crawler.stats.get_stats().items()
                     if isinstance(v, (int, float, str))}
            path = args.stats_dir / f"{spider.name}-{node}.json"
            path.write_text(json.dumps({**stats, "finish_reason": reason}))

        # weak=False: the dispatcher keeps receivers weakly, and each closure
        # here is referenced by nothing else.
        crawler.signals.connect(closed, signal=signals.spider_closed, weak=False)
        process.crawl(crawler)
    process.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
