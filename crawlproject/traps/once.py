"""Say a thing once per site: the memory of which sites were told about."""

from __future__ import annotations

from collections import OrderedDict

from scrapy.utils.httpobj import urlparse_cached

#: Sites remembered per middleware: a broad crawl meets millions; beyond
#: this many the oldest may be said again (a line more, not memory without end).
REMEMBERED_SITES = 10_000


def site_of(request_or_response) -> str:
    """The host name of a request's or response's URL ("" without one)."""
    return urlparse_cached(request_or_response).hostname or ""


class OncePerSite:
    """Which ``(reason, site)`` pairs were said already, the latest
    :data:`REMEMBERED_SITES` of them."""

    def __init__(self, size: int = REMEMBERED_SITES):
        self.size = size
        self._said: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first(self, reason: str, site: str) -> bool:
        """True the first time *reason* is said for *site* (then remembered)."""
        key = (reason, site)
        if key in self._said:
            self._said.move_to_end(key)
            return False
        self._said[key] = None
        if len(self._said) > self.size:
            self._said.popitem(last=False)
        return True
