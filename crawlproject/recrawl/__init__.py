"""Incremental recrawl: pages revisited when they are due, with conditional
requests, and what each visit found stored as a page record in MongoDB
(docs/recrawl.md).

* :mod:`~crawlproject.recrawl.schedule`: revisit rules, page state, page
  records (pure; the model is in its docstring);
* :mod:`~crawlproject.recrawl.middleware`: ``RecrawlMiddleware`` (downloader,
  580) and ``RecrawlSpiderMiddleware`` (spider, 950): conditional requests;
  new / changed / unchanged / gone pages;
* :mod:`~crawlproject.recrawl.extension`: ``RecrawlFeeder``, which puts due
  pages back into the frontier.

The schedule's names (``crawlproject.recrawl.PageVisit``, ``RecrawlPolicy``,
...) are importable from here, as they were from the module of this path
before; item pipelines import them from :mod:`~crawlproject.recrawl.schedule`.
"""

from crawlproject.recrawl.schedule import (MAX_ITEMS_PER_PAGE, OUTCOMES, STATE_META, VISIT_META,
                                           GoneMark, PageCheck, PageState, PageVisit,
                                           RecrawlPolicy, RevisitRule, body_hash, checked_state,
                                           next_state, utc_now, visit_record)

__all__ = ["MAX_ITEMS_PER_PAGE", "OUTCOMES", "STATE_META", "VISIT_META", "GoneMark", "PageCheck",
           "PageState", "PageVisit", "RecrawlPolicy", "RevisitRule", "body_hash",
           "checked_state", "next_state", "utc_now", "visit_record"]
