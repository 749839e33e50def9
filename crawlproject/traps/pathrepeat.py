"""Links whose path repeats itself: ``/a/b/a/b/a/b/``, ``/x/x/x/``.

A relative link on a page that answers for any path below it (``<a
href="b/">`` on ``/a/``, or a 404 page served as 200 with the site's menu of
relative links) makes a path that nests for ever. Like Heritrix's
``PathologicalPathDecideRule`` (``maxRepetitions = 2``), a link whose path holds
the same segment, or the same run of segments, more than ``PATH_REPEAT_LIMIT``
times in a row is dropped from the callback's output, counted in
``traps/path_repeat`` and logged (once per site at INFO, each at DEBUG).

Runs of up to :data:`LONGEST_RUN` segments are looked for: the check stays
linear in the URL (a regular expression with a bounded run and a
back-reference), and a longer loop ends at ``URLLENGTH_LIMIT`` anyway.
"""

from __future__ import annotations

import logging
import re

from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached

from crawlproject.defaults import setting
from crawlproject.traps.once import OncePerSite, site_of
from crawlproject.traps.pace import PacedFilter

logger = logging.getLogger(__name__)

#: The longest run of segments whose repeats are looked for (an unbounded
#: run cost 25 ms for an adversarial 2,000-character path; 10: 0.5 ms).
LONGEST_RUN = 10


def repeat_pattern(limit: int, longest: int = LONGEST_RUN) -> re.Pattern:
    """A pattern that finds, in a path ending with ``/``, a run of 1 to
    *longest* segments followed by *limit* more copies of itself."""
    return re.compile(r"/((?:[^/]*/){1,%d}?)\1{%d,}" % (longest, limit))


def repeats(path: str, pattern: re.Pattern) -> bool:
    """Whether *path* holds a run of segments repeated as *pattern* looks for."""
    return pattern.search(path if path.endswith("/") else path + "/") is not None


class PathRepeatMiddleware(PacedFilter):
    """Spider middleware: links whose path repeats a segment run are dropped."""

    def __init__(self, crawler, limit: int):
        super().__init__(crawler)
        self.limit = limit
        self.pattern = repeat_pattern(limit)
        self.said = OncePerSite()

    @classmethod
    def from_crawler(cls, crawler):
        limit = setting(crawler.settings, "PATH_REPEAT_LIMIT")
        if limit <= 0:
            raise NotConfigured
        return cls(crawler, limit)

    def get_processed_request(self, request, response):
        if response is None or not repeats(urlparse_cached(request).path, self.pattern):
            return request   # a start request or seed: asked for, not found on a page
        self.crawler.stats.inc_value("traps/path_repeat")
        site = site_of(response)
        if self.said.first("path_repeat", site):
            logger.info("Dropping links of %s whose path repeats a segment run more than %d "
                        "times in a row (PATH_REPEAT_LIMIT, a crawler trap), e.g. %s from %s "
                        "(said once per site; counted in traps/path_repeat)", site, self.limit,
                        request.url[:200], response.url[:200],
                        extra={"spider": self.crawler.spider})
        else:
            logger.debug("Dropped a link whose path repeats itself: %s", request.url[:200],
                         extra={"spider": self.crawler.spider})
        return None
