"""What sites say, sent to every node through the frontier: a slow-down
answer (429/503, ``FRONTIER_BACKOFF_HTTP_CODES``; with ``Retry-After`` the
site is blocked, without it backed off: :mod:`crawlproject.middlewares.slowdown`),
a robots.txt ``Crawl-delay``, and when a leased request was sent and left the
downloader (the site's slot is free for another node).
"""

from __future__ import annotations

import time

from scrapy import Request

from crawlproject.frontier.retrypolicy import LEASE_META, SLOW_DOWN_META


class SiteFeedback:
    """Signal handlers (and :meth:`slow_down`) that turn what a site answered
    into feedback for its politeness key in the frontier *client*'s next call
    (a :class:`~crawlproject.frontier.client.FrontierClient`). *agent* is
    the user agent whose robots.txt ``Crawl-delay`` applies."""

    def __init__(self, client, politeness, stats, agent: str):
        self.client, self.politeness, self.stats, self.agent = client, politeness, stats, agent

    @staticmethod
    def robots_agent(settings) -> str:
        """The user agent of ``ROBOTSTXT_USER_AGENT`` / ``USER_AGENT``."""
        return settings.get("ROBOTSTXT_USER_AGENT") or settings.get("USER_AGENT") or "*"

    def slow_down(self, request: Request, retry_after: float | None) -> None:
        """*request*'s site answered a slow-down status: block its politeness key
        for *retry_after* seconds for every node, or back it off."""
        key = self.politeness.key(request)
        if retry_after is not None:
            self.client.feedback(key, "block", retry_after)
        else:
            self.client.feedback(key, "backoff")
        request.meta[SLOW_DOWN_META] = True
        self.stats.inc_value("politeness/blocked" if retry_after is not None
                             else "politeness/backoffs")

    def on_robots(self, robotparser, request, **kwargs):
        try:
            delay = robotparser.crawl_delay(self.agent)
        except Exception:  # a parser that cannot tell: no crawl delay
            delay = None
        if delay:
            self.client.feedback(self.politeness.key(request), "crawldelay", float(delay))
            self.stats.inc_value("politeness/crawl_delays")

    def on_downloaded(self, response, request, spider=None, **kwargs):
        # Sent before request_left_downloader (and before the middlewares see
        # the status): a site that says "wait this long" (Retry-After) gets no
        # request handed its slot, even before slow_down() tells every node. A
        # slow-down answer without it slows the site only when its recent
        # error rate says so (the frontier decides; the reply says whether
        # the reserve may still be used): a transient 503 stops nothing here.
        if (response.status in self.politeness.backoff_codes and LEASE_META in request.meta
                and response.headers.get(b"Retry-After")):
            self.client.hold_back(self.politeness.key(request))

    def on_reached_downloader(self, request, spider=None, **kwargs):
        # How long after its lease a request of a site with an interval was
        # sent: one the buffer held too long went back to the frontier
        # (politeness/late_returned); one held up after the buffer (the
        # engine's loop busy, a downloader middleware) is reported: the site's
        # next start, for every node, counts from this send, not the lease.
        entry = self.client.held.get(request.meta.get(LEASE_META))
        if entry is None or not entry.polite:
            return
        now = time.monotonic()
        lag = now - entry.leased_at
        if lag > entry.lag_allowed:
            self.stats.inc_value("politeness/sent_late")
            self.client.sent_late(entry, now)
        self.stats.max_value("politeness/send_lag_max_ms", int(lag * 1000))

    def on_left_downloader(self, request, spider=None, **kwargs):
        # The download is over (response or error): the site's slot is free for
        # another node even though the request is not done (callback, items).
        member = request.meta.get(LEASE_META)
        if member is not None:
            self.client.fetched(member)
