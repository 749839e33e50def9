"""What the downloader middlewares agree on about a request's session.

A *session* is what a site would see as one visitor: one exit address (proxy),
one browser identity (User-Agent and matching headers), one cookie jar. The
middlewares never talk to each other directly; they meet in ``request.meta``:

* ``meta["session"]`` (str, set by a spider, optional): an explicit session,
  e.g. a login flow. Its proxy is kept (sticky), its cookies go to the cookie
  jar of the same name, its identity stays the same.
* ``meta[PROXY_ID]`` (str): the *masked* id of the proxy the proxy middleware
  chose (``host:port`` without credentials); safe to log and to store.
* ``meta[PROXY_CONTEXT]`` (dict, transient): what a browser context needs to use
  that proxy (``server``, ``username``, ``password``). Never serialised.
* ``meta[IDENTITY]`` (dict, transient): the identity chosen for the request
  (``id``, ``user_agent``, ``headers``). Never serialised.

Transient keys are dropped when a request is written to the frontier
(:data:`crawlproject.serialization.TRANSIENT_META_KEYS`), so credentials never
reach Redis and a request retried on another node gets a fresh choice there.
"""

from __future__ import annotations

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached

SESSION = "session"
PROXY_ID = "proxy_id"
PROXY_CONTEXT = "_crawlproject_proxy_context"
IDENTITY = "_crawlproject_identity"
TRANSIENT = frozenset({PROXY_CONTEXT, IDENTITY})


def explicit_session(request: Request) -> str | None:
    """The spider's own session name, if it set one."""
    value = request.meta.get(SESSION)
    return value if isinstance(value, str) and value else None


def session_key(request: Request) -> str:
    """The session a request belongs to, the same on every node.

    An explicit ``meta["session"]`` wins; otherwise the proxy (one exit address
    looks like one visitor) and the cookie jar; without either, the host (a
    site sees one consistent visitor from this crawl)."""
    explicit = explicit_session(request)
    if explicit is not None:
        return f"s:{explicit}"
    parts = []
    proxy_id = request.meta.get(PROXY_ID)
    if isinstance(proxy_id, str) and proxy_id:
        parts.append(f"p:{proxy_id}")
    jar = request.meta.get("cookiejar")
    if jar is not None:
        parts.append(f"j:{jar}")
    if not parts:
        parts.append(f"h:{urlparse_cached(request).hostname or ''}")
    return "|".join(parts)
