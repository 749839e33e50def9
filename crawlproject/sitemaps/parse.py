"""What a sitemap says, read defensively (pure: no Redis, no Scrapy engine).

A sitemap is untrusted input from the site: its body is decompressed with a
size limit, parsed with Scrapy's own streaming parser
(:class:`scrapy.utils.sitemap.Sitemap`: lxml ``iterparse``, entities not
resolved, elements freed as they are read), and every URL it names is
checked before it goes anywhere.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator
from urllib.parse import urljoin, urlsplit

from scrapy.http import XmlResponse
from scrapy.utils._compression import _DecompressionMaxSizeExceeded
from scrapy.utils.gz import gunzip, gzip_magic_number
from scrapy.utils.sitemap import Sitemap

#: meta of a page request made from a sitemap: its ``lastmod`` (W3C datetime);
#: the recrawl schedule keeps it in the page record (``sitemap_lastmod``)
LASTMOD_META = "sitemap_lastmod"
#: sitemaps.org: a ``loc`` is shorter than 2,048 characters.
MAX_LOC = 2048
# W3C Datetime, as sitemaps.org asks for ``lastmod``: YYYY, YYYY-MM, YYYY-MM-DD,
# or a date and time with seconds (fractions) optional and a zone.
_W3C_DATE = re.compile(
    r"\d{4}(-\d{2}(-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2}))?)?)?")


class SitemapTooLarge(ValueError):
    """The decompressed body is larger than the limit."""


def sitemap_body(response, max_size: int) -> bytes | None:
    """The XML of a sitemap *response*, or None when it is not a sitemap.

    Like Scrapy's ``SitemapSpider._get_sitemap_body``: a gzip body (a
    ``.xml.gz`` file, served without ``Content-Encoding``) is decompressed
    here, at most *max_size* bytes (0: no limit), else
    :class:`SitemapTooLarge`; an XML response, or a body that starts like
    XML, is used as it is (its download was bounded by ``download_maxsize``).
    """
    if gzip_magic_number(response):
        try:
            return gunzip(response.body, max_size=max_size)
        except _DecompressionMaxSizeExceeded as exc:
            raise SitemapTooLarge(str(exc)) from None
        except (OSError, EOFError, ValueError):
            return None   # not gzip after all: a broken body
    if isinstance(response, XmlResponse) or response.body.lstrip()[:1] == b"<":
        return response.body
    return None


def read_sitemap(body: bytes) -> tuple[str, Iterator[dict[str, Any]]]:
    """``(type, entries)``: ``"urlset"`` or ``"sitemapindex"`` (anything else is
    not a sitemap) and an iterator of its entries (``{"loc": ..., "lastmod": ...}``),
    parsed as they are read."""
    try:
        sitemap = Sitemap(body)
    except Exception:  # noqa: BLE001 - lxml on junk: not a sitemap
        return "", iter(())
    return sitemap.type, _safe(iter(sitemap))


def _safe(entries: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    # lxml's recover mode still raises on some junk halfway: the entries read so far count.
    try:
        yield from entries
    except Exception:  # noqa: BLE001
        return


def site_host(url: str) -> str:
    """The host a same-site check compares: lower case, no trailing dot, no
    port, no userinfo ('' when *url* has none)."""
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return ""
    return host.rstrip(".").lower()


def check_loc(loc: Any, base: str) -> str | None:
    """*loc* as an absolute http(s) URL (relative to *base*), or None."""
    if not isinstance(loc, str) or not loc or len(loc) >= MAX_LOC:
        return None
    url = urljoin(base, loc.strip())
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        return None
    return url


def check_lastmod(value: Any) -> str | None:
    """*value* if it is a W3C datetime (sitemaps.org's ``lastmod``), else None."""
    if isinstance(value, str) and len(value) <= 40 and _W3C_DATE.fullmatch(value.strip()):
        return value.strip()
    return None


def lastmod_datetime(value: Any) -> datetime | None:
    """A W3C datetime *value* as an aware UTC datetime (a date alone: its
    midnight UTC), else None."""
    text = check_lastmod(value)
    if text is None:
        return None
    text = text.replace("Z", "+00:00")
    if len(text) == 4:
        text += "-01-01"
    elif len(text) == 7:
        text += "-01"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:   # 2026-13-45: the right shape, no date
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def robots_sitemaps(robotparser, robots_url: str) -> Iterable[str]:
    """The ``Sitemap:`` URLs of a parsed robots.txt, absolute, in their order:
    protego's ``sitemaps`` (Scrapy's default parser), the standard library's
    ``site_maps()``; none for a parser that does not say."""
    rp = getattr(robotparser, "rp", robotparser)
    found = getattr(rp, "sitemaps", None)
    if found is None and callable(getattr(rp, "site_maps", None)):
        found = rp.site_maps() or ()
    if found is None or callable(found):
        return ()
    return (urljoin(robots_url, u) for u in found if isinstance(u, str))
