"""The Scrapy side of the frontier: what turns Scrapy's settings and requests
into the frontier's plain data (politeness keys and limits), and the parts of
:class:`crawlproject.scheduler.RedisScheduler` (see docs/architecture.md)."""
