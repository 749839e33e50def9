"""Redirects of a robots.txt fetch (RFC 9309 §2.3.1.2), for the cluster.

A robots.txt that answers 3xx is not redirected by the redirect middleware
(``dont_redirect``): the target becomes a request of the target's own site
(:func:`next_hop`), put in the frontier like the first fetch, so it is leased
under that site's politeness, and it says which site it fetches robots.txt
for and the URLs so far in ``meta["robotstxt_hop"]``, a value only a node of
the crawl can sign, for that very URL (:func:`hop_value`, :func:`read_hop`):
neither a seed nor a stored payload that is not a node's can make a request a
robots.txt fetch of another site. The rules reached are the original site's.
A loop, one hop more than the bound (RFC: at least five) or a target that is
not http(s) ends the chain: the RFC's "unavailable", allow all.
"""

from __future__ import annotations

import json
from urllib.parse import urljoin

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from w3lib.url import safe_url_string

from crawlproject.signing import Signer

#: meta of a redirect hop of a robots.txt fetch (signed, purpose HOP_PURPOSE)
HOP_META = "robotstxt_hop"
HOP_PURPOSE = "robots-hop"
#: longest redirect target followed (characters)
MAX_TARGET = 8192
REDIRECTS = (301, 302, 303, 307, 308)


class GiveUp(str):
    """Why a chain of redirects is not followed further; ``.stat`` names it
    (``loop``, ``too_many``, ``bad_target``)."""

    stat: str

    def __new__(cls, stat: str, reason: str) -> GiveUp:
        out = super().__new__(cls, reason)
        out.stat = stat
        return out


def hop_value(signer: Signer, origin: str, chain: list[str]) -> str:
    """The meta value of the hop to ``chain[-1]`` of *origin*'s robots.txt."""
    return signer.sign(json.dumps({"origin": origin, "chain": chain}), HOP_PURPOSE)


def read_hop(signer: Signer | None, request: Request) -> tuple[str, list[str]] | bool:
    """``(origin, chain)`` of the hop *request* is, if a node of the crawl
    signed it for this very URL; False when it carries a value no node signed,
    True when it carries none usable (not a hop)."""
    raw = request.meta.get(HOP_META)
    if not isinstance(raw, str) or signer is None or len(raw) > 16 * MAX_TARGET:
        return True
    data, proven = signer.open(raw, HOP_PURPOSE)
    if not proven:
        return False
    try:
        hop = json.loads(data)
        origin, chain = hop["origin"], hop["chain"]
    except (ValueError, TypeError, KeyError):
        return True
    if (not isinstance(origin, str) or not isinstance(chain, list) or not chain
            or chain[-1] != request.url):
        return True
    return origin, chain


def next_hop(response, chain: list[str], max_redirects: int, **request_kwargs
             ) -> Request | GiveUp | None:
    """The request a redirect *response* leads to (built with
    *request_kwargs*), a :class:`GiveUp`, or None when *response* is not a
    redirect. *chain*: the URLs fetched so far, *response*'s last."""
    location = response.headers.get(b"Location")
    if response.status not in REDIRECTS or not location:
        return None
    try:   # as Scrapy's RedirectMiddleware reads Location
        request = Request(urljoin(response.url, safe_url_string(location)), **request_kwargs)
    except (ValueError, TypeError) as exc:
        return GiveUp("bad_target", f"a redirect to an unusable URL ({exc})")
    if urlparse_cached(request).scheme not in ("http", "https") or len(request.url) > MAX_TARGET:
        return GiveUp("bad_target", f"a redirect to {request.url[:100]!r} (not followed)")
    if request.url in chain:
        return GiveUp("loop", f"a redirect loop back to {request.url[:200]}")
    if len(chain) > max_redirects:
        return GiveUp("too_many", f"more than {max_redirects} redirects")
    return request
