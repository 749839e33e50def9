"""The local dedupe: what this node sent most recently (``SCHEDULER_LOCAL_DEDUPE_SIZE``
fingerprints, and the URLs they came from), dropped before it is encoded and
sent to Redis, whose shared filter has it already (or will have it with the
pending call).
"""

from __future__ import annotations

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.request import fingerprint as scrapy_fingerprint


class RecentlySent:
    """Two generations of at most *size* hashes each of the fingerprints this
    node sent, and of their URLs where *fingerprinter* (the crawler's) makes a
    request's fingerprint a function of its URL alone."""

    def __init__(self, size: int, fingerprinter):
        self.size = size
        self._recent: set[int] = set()
        self._recent_old: set[int] = set()
        # The same two generations, of the URLs those fingerprints came from:
        # with Scrapy's own fingerprinter a GET without a body (or verbatim_url)
        # has the fingerprint of its URL string, so a link this node already
        # sent (menus, related items: most links a page yields) is dropped on
        # a set lookup instead of a canonicalisation and a SHA-1 (~9 us, bench.costs).
        self._recent_urls: set[int] = set()
        self._recent_urls_old: set[int] = set()
        self._urls_decide = (type(fingerprinter) is RequestFingerprinter
                             and getattr(fingerprinter, "_fingerprint", None)
                             is scrapy_fingerprint)

    def sent(self, url_key: int | None) -> bool:
        """Whether the URL of *url_key* (:meth:`url_key`) was sent recently."""
        return url_key is not None and (url_key in self._recent_urls
                                        or url_key in self._recent_urls_old)

    def seen(self, fp: bytes) -> bool:
        """Whether the fingerprint *fp* was sent recently."""
        key = hash(fp)
        return key in self._recent or key in self._recent_old

    def url_key(self, request: Request) -> int | None:
        """The key of *request*'s URL in the local dedupe, or None where its
        fingerprint is not a function of its URL string alone."""
        if (not self._urls_decide or request.dont_filter or request.method != "GET"
                or request.body or request.meta.get("verbatim_url")):
            return None
        # Like the fingerprints', a 64-bit hash, salted per process (unless
        # PYTHONHASHSEED is pinned): a page cannot craft a URL that collides
        # with another to keep it from being sent.
        return hash(request.url)

    def remember(self, fp: bytes, url_key: int | None = None) -> None:
        """Remember the fingerprint *fp* (and the URL of *url_key*) as sent."""
        # Two generations of at most `size` hashes each: bounded
        # memory, and the most recent fingerprints are always remembered. The
        # URLs turn over with their fingerprints: a URL is never remembered
        # after its fingerprint is forgotten.
        if len(self._recent) >= self.size:
            self._recent_old, self._recent = self._recent, set()
            self._recent_urls_old, self._recent_urls = self._recent_urls, set()
        self._recent.add(hash(fp))
        if url_key is not None:
            self._recent_urls.add(url_key)
