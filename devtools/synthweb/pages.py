"""What every handler shares: the kinds of pages (what a correct crawler does
with them), session-id canonicalisation, and small HTML / redirect answers."""

from __future__ import annotations

import enum
import re
from urllib.parse import parse_qsl, urlencode

from aiohttp import web

# -- what a correct crawler does with a URL -----------------------------------------


class Kind(enum.Enum):
    REQUIRED = "required"    # fetched (200) and stored as an item
    NOINDEX = "noindex"      # fetched (200), not stored (meta robots / X-Robots-Tag)
    GONE = "gone"            # fetched once (404/410), not stored
    FORBIDDEN = "forbidden"  # never requested (disallowed, nofollow'd, a trap past its limit)
    TRAP = "trap"            # an infinite space: at most TRAP_ALLOWANCE on a site
    HOSTILE = "hostile"      # may be requested, never stored (bombs, drips)
    OPTIONAL = "optional"    # anything goes (redirect hops, robots.txt, sitemaps, ...)


#: must be requested (and answered) for the crawl to be complete
MUST_FETCH = (Kind.REQUIRED, Kind.NOINDEX, Kind.GONE)
#: must not be stored as items
NEVER_STORED = (Kind.NOINDEX, Kind.GONE, Kind.FORBIDDEN, Kind.HOSTILE)

#: session-id parameters (canonicalised away by a correct crawler before dedupe)
SESSION_PARAMS = ("jsessionid", "phpsessid", "sid", "sessionid", "aspsessionid")
_PATH_SESSION = re.compile(r";jsessionid=[^/?#]*", re.I)


def canonical(target: str) -> str:
    """*target* (path and query) without session ids: one page, one key."""
    target = _PATH_SESSION.sub("", target)
    if "?" not in target:
        return target
    path, query = target.split("?", 1)
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
            if k.lower() not in SESSION_PARAMS]
    return path + ("?" + urlencode(kept) if kept else "")


def html(title: str, body: str = "", head: str = "") -> bytes:
    return (f"<!doctype html><html><head><title>{title}</title>{head}</head>"
            f"<body><h1>{title}</h1>{body}</body></html>").encode()


def links(hrefs) -> str:
    return "".join(f'<a href="{h}">{h}</a> ' for h in hrefs)


def page(title: str, hrefs=(), head: str = "", headers: dict | None = None,
         status: int = 200) -> web.Response:
    return web.Response(body=html(title, links(hrefs), head), status=status,
                        content_type="text/html", charset="utf-8", headers=headers)


def redirect(location: str, status: int = 301, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, headers={"Location": location, **(headers or {})})
