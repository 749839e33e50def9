"""Crawler traps and meta robots: spider middlewares on what a callback yields.

Each works on the output of every callback, whatever the spider kind (a plain
``Spider``, ``CrawlSpider`` rules, ``SitemapSpider``, a ``RedisSpider``), and
leaves start requests and seeds alone (pages someone asked for):

* :class:`~crawlproject.traps.urllength.UrlLengthMiddleware`: links longer
  than ``URLLENGTH_LIMIT`` (Scrapy's, said once per site instead of once per link);
* :class:`~crawlproject.traps.pathrepeat.PathRepeatMiddleware`: links whose
  path repeats a segment, or a run of segments, more than ``PATH_REPEAT_LIMIT``
  times in a row (``/a/b/a/b/a/b/``, relative links that nest for ever);
* :class:`~crawlproject.traps.pagerequests.PageRequestsMiddleware`: at most
  ``PAGE_REQUESTS_LIMIT`` requests added per response (a page of 100,000 links);
* :class:`~crawlproject.traps.metarobots.MetaRobotsMiddleware`: ``<meta
  name="robots">`` and ``X-Robots-Tag``: a nofollow page's requests are not
  followed, a noindex page's items are not stored.

Calendars and other endless spaces of one site end at the frontier's per-site
budget (``FRONTIER_SITE_BUDGET``). Requests dropped as traps are counted and
logged (once per site at INFO, each at DEBUG), not dead-lettered: no one asked
for them. docs/traps.md tells the whole story.
"""
