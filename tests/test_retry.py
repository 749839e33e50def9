"""BackoffRetryMiddleware (crawlproject/middlewares/retry.py): how long a retry
waits in the frontier.

The engine is a stand-in (a namespace whose scheduler has ``mark_failed``): the
middleware asks only whether the scheduler is the shared frontier; what the
frontier does with the delay is tested in test_scheduler.py and the crawls.
"""

from types import SimpleNamespace

from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.utils.test import get_crawler

from crawlproject.frontier.retrypolicy import RETRY_DELAY_META, SLOW_DOWN_META
from crawlproject.middlewares.slowdown import FrontierPolitenessMiddleware
from crawlproject.middlewares.retry import BackoffRetryMiddleware


def make(**settings):
    crawler = get_crawler(Spider, {"RETRY_BACKOFF_BASE": 30.0, "RETRY_BACKOFF_MAX": 60.0,
                                   **settings})
    failed = []
    slowed = []

    def slow_down(request, retry_after):
        request.meta[SLOW_DOWN_META] = True
        slowed.append((request.url, retry_after))

    crawler.engine = SimpleNamespace(scheduler=SimpleNamespace(
        mark_failed=lambda request, reason, kind: failed.append(reason),
        slow_down=slow_down))
    crawler.spider = Spider.from_crawler(crawler, "s")
    return (BackoffRetryMiddleware.from_crawler(crawler),
            FrontierPolitenessMiddleware.from_crawler(crawler), slowed)


def answer(retry, politeness, url, status, headers=None):
    """The response path as Scrapy runs it: politeness (560) before retry (550)."""
    request = Request(url)
    response = Response(url, status=status, headers=headers or {}, request=request)
    response = politeness.process_response(request, response)
    return retry.process_response(request, response)


def test_a_slow_down_answer_is_retried_without_the_per_request_wait():
    """The site's pace is the frontier's (its recent error rate, a Retry-After
    block); a 1 s wait per transient 503 held up the pages a listing links to."""
    retry, politeness, slowed = make()
    for status, headers in ((503, None), (429, None), (503, {"Retry-After": "5"})):
        again = answer(retry, politeness, f"http://h/{status}", status, headers)
        assert isinstance(again, Request) and again.meta[RETRY_DELAY_META] == 0
    assert len(slowed) == 3


def test_other_errors_wait_out_the_backoff():
    retry, politeness, slowed = make()
    again = answer(retry, politeness, "http://h/500", 500)
    assert isinstance(again, Request) and again.meta[RETRY_DELAY_META] >= 15   # 30 s ± jitter
    assert slowed == []
    # a 503 the politeness middleware does not count (not a backoff code here)
    retry, politeness, slowed = make(FRONTIER_BACKOFF_HTTP_CODES=[429])
    again = answer(retry, politeness, "http://h/503", 503)
    assert again.meta[RETRY_DELAY_META] >= 15 and slowed == []
