"""The page features of :data:`devtools.synthweb.table.FEATURES`: one
:class:`Feature` each, owning a path prefix: it answers its paths, names the
links the home page carries to it, and classifies its paths into a
:class:`~devtools.synthweb.pages.Kind`, next to the handler that serves them.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from functools import lru_cache

from aiohttp import web

from devtools.synthweb import table as T
from devtools.synthweb.pages import MUST_FETCH, Kind, html, page, redirect
from devtools.synthweb.robots import _gzip_padded



class Feature:
    """A behaviour owning the paths under ``prefix``."""

    name = ""
    prefix = ""

    def entry(self, site) -> list[str]:
        """Links the home page carries to this feature."""
        return [self.prefix]

    async def answer(self, site, request, path: str) -> web.StreamResponse | None:
        raise NotImplementedError

    def classify(self, site, path: str) -> Kind | None:
        """The kind of *path* (canonical) if it is this feature's."""
        raise NotImplementedError

    def must(self, site) -> dict[str, Kind]:
        """This feature's pages a correct crawler fetches (canonical path -> kind)."""
        return {}

    def expected_requests(self, site) -> int:
        """Requests a correct crawler sends for this feature (the ideal's count)."""
        return len(self.must(site))

    def wait_s(self, site) -> float:
        """Seconds the site asks a crawler to wait (added to its ideal)."""
        return 0.0


class Calendar(Feature):
    """``/cal/Y/M``: a month linking the previous and the next month, for
    ever; the first CALENDAR_MONTHS of 2026 have an event page each."""

    name, prefix = "calendar", "/cal/"

    def entry(self, site):
        return ["/cal/2026/1"]

    def _month(self, path):
        m = re.fullmatch(r"/cal/(-?\d+)/(\d+)", path)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def _real(self, y, m):
        return y == 2026 and 1 <= m <= T.CALENDAR_MONTHS

    async def answer(self, site, request, path):
        if path.startswith("/event/"):
            return page(f"Event {path[7:]}", ["/"])
        ym = self._month(path)
        if not ym or not 1 <= ym[1] <= 12:
            return None
        y, m = ym
        prev_ym = (y, m - 1) if m > 1 else (y - 1, 12)
        next_ym = (y, m + 1) if m < 12 else (y + 1, 1)
        hrefs = [f"/cal/{prev_ym[0]}/{prev_ym[1]}", f"/cal/{next_ym[0]}/{next_ym[1]}"]
        if self._real(y, m):
            hrefs.append(f"/event/{y}-{m}")
        return page(f"Calendar {y}-{m}", hrefs)

    def classify(self, site, path):
        if path.startswith("/event/"):
            return Kind.REQUIRED
        ym = self._month(path)
        if ym is None:
            return None
        return Kind.REQUIRED if self._real(*ym) else Kind.TRAP

    def must(self, site):
        out = {}
        for m in range(1, T.CALENDAR_MONTHS + 1):
            out[f"/cal/2026/{m}"] = out[f"/event/2026-{m}"] = Kind.REQUIRED
        return out


class Repeat(Feature):
    """``/loop/x/``: a relative link ``x/`` on a page whose path ends in ``/``:
    ``/loop/x/x/``, ``/loop/x/x/x/``, ... A segment repeated three times is a
    trap (Nutch's default ``-.*(/[^/]+)/[^/]+\\1/[^/]+\\1/``, Heritrix's
    PathologicalPath rule); twice is still a page."""

    name, prefix = "repeat", "/loop/"

    def entry(self, site):
        return ["/loop/x/"]

    async def answer(self, site, request, path):
        if re.fullmatch(r"/loop/(x/)+", path):
            return page(f"Loop {path.count('x')}", ["x/", "/"])
        return None

    def classify(self, site, path):
        if not path.startswith(self.prefix):
            return None
        k = path.count("/x")
        return Kind.REQUIRED if k == 1 else Kind.OPTIONAL if k == 2 else Kind.FORBIDDEN

    def must(self, site):
        return {"/loop/x/": Kind.REQUIRED}

    def expected_requests(self, site):
        return 2


class SessionIds(Feature):
    """``/s/1;jsessionid=…``, ``/s/2?PHPSESSID=…``, ``/s/3?sid=…``: every page
    links all three with fresh ids; a crawler that keeps the ids never ends."""

    name, prefix = "sessionid", "/s/"

    def entry(self, site):
        return self._hrefs()

    def _hrefs(self):
        sid = secrets.token_hex(8)
        return [f"/s/1;jsessionid={sid}", f"/s/2?PHPSESSID={sid}", f"/s/3?sid={sid}"]

    async def answer(self, site, request, path):
        if re.fullmatch(r"/s/[123]", path):
            return page(f"Session page {path[3:]}", self._hrefs() + ["/"])
        return None

    def classify(self, site, path):
        if not path.startswith(self.prefix):
            return None
        return Kind.REQUIRED if re.fullmatch(r"/s/[123]", path) else Kind.OPTIONAL

    def must(self, site):
        return {f"/s/{i}": Kind.REQUIRED for i in (1, 2, 3)}


class LongUrl(Feature):
    """``/long/aaa…``: each page links one twice as long (path 64, 128, …
    2048 bytes, then 4096: past 2083, Scrapy's ``URLLENGTH_LIMIT`` and the
    common limit of browsers and crawlers)."""

    name, prefix = "longurl", "/long/"
    FIRST, LIMIT = 64, 2048

    def entry(self, site):
        return [self._path(self.FIRST)]

    def _path(self, length):
        return "/long/" + "a" * (length - len("/long/"))

    async def answer(self, site, request, path):
        if re.fullmatch(r"/long/a+", path):
            return page(f"Long {len(path)}", [self._path(2 * len(path)), "/"])
        return None

    def classify(self, site, path):
        if not path.startswith(self.prefix):
            return None
        if len(path) <= self.FIRST:
            return Kind.REQUIRED
        return Kind.OPTIONAL if len(path) <= self.LIMIT else Kind.FORBIDDEN

    def must(self, site):
        return {self._path(self.FIRST): Kind.REQUIRED}

    def expected_requests(self, site):
        return 6   # 64 .. 2048


@lru_cache(maxsize=None)
def bomb_body(encoding: str) -> bytes:
    """BOMB_BYTES of HTML-ish spaces, compressed (gzip ~140 KiB, brotli ~100 B)."""
    if encoding == "br":
        import brotli

        return brotli.compress(b" " * T.BOMB_BYTES, quality=5)
    return _gzip_padded(b"<html><body>", T.BOMB_BYTES)


class Bomb(Feature):
    """``/bomb-gzip`` / ``/bomb-br``: 64 MiB of spaces in ~140 KiB (gzip) or
    ~100 bytes (brotli), ``Content-Encoding`` set, ``text/html`` (no file
    extension: a link extractor must not skip them for it)."""

    def __init__(self, name, encoding):
        self.name, self.encoding = name, encoding
        self.prefix = "/" + name

    async def answer(self, site, request, path):
        if path != self.prefix:
            return None
        return web.Response(body=bomb_body(self.encoding), content_type="text/html",
                            headers={"Content-Encoding": self.encoding})

    def classify(self, site, path):
        return Kind.HOSTILE if path == self.prefix else None

    def expected_requests(self, site):
        return 1


class Drip(Feature):
    """``/drip``: 200 and headers at once, then one byte every
    DRIP_INTERVAL_S for DRIP_MAX_S (or until the client goes)."""

    name, prefix = "drip", "/drip"

    async def answer(self, site, request, path):
        if path != self.prefix:
            return None
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        end = loop.time() + T.DRIP_MAX_S
        try:
            await response.write(b"<html><body>")
            while loop.time() < end and not site.web.closing:
                await asyncio.sleep(T.DRIP_INTERVAL_S)
                await response.write(b" ")
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    def classify(self, site, path):
        return Kind.HOSTILE if path == self.prefix else None

    def expected_requests(self, site):
        return 1


class Headers(Feature):
    """``/headers``: a small page with HEADER_COUNT response headers."""

    name, prefix = "headers", "/headers"

    async def answer(self, site, request, path):
        if path != self.prefix:
            return None
        response = page("Headers", ["/"])
        for i in range(T.HEADER_COUNT):
            response.headers.add(f"X-Pad-{i}", "x")
        return response

    def classify(self, site, path):
        return Kind.OPTIONAL if path == self.prefix else None

    def expected_requests(self, site):
        return 1


class Flood(Feature):
    """``/flood``: one page with FLOOD_LINKS links to ``/f/N`` (trap pages)."""

    name, prefix = "flood", "/flood"

    async def answer(self, site, request, path):
        if path == self.prefix:
            return web.Response(body=_flood_page(), content_type="text/html")
        if re.fullmatch(r"/f/\d+", path):
            return page(f"Flood {path[3:]}", ["/"])
        return None

    def classify(self, site, path):
        if path == self.prefix:
            return Kind.REQUIRED
        return Kind.TRAP if path.startswith("/f/") else None

    def must(self, site):
        return {self.prefix: Kind.REQUIRED}


@lru_cache(maxsize=1)
def _flood_page() -> bytes:
    return html("Flood", "".join(f'<a href="/f/{i}">{i}</a>' for i in range(T.FLOOD_LINKS)))


class Cookies(Feature):
    """A cookie wall over every page (not robots.txt): a request without the
    ``synth`` cookie gets 302 to the same URL with ``Set-Cookie``."""

    name, prefix = "cookies", "\0"   # owns no path of its own: see answer()

    def entry(self, site):
        return []

    async def answer(self, site, request, path):
        if request.cookies.get("synth") == "1":
            return None
        return redirect(request.path_qs, 302, {"Set-Cookie": "synth=1; Path=/"})

    def classify(self, site, path):
        return None

    def expected_requests(self, site):
        return 1   # the first wall; the cookie is kept afterwards (per node: up to 3)


class Gone(Feature):
    """``/gone/404`` and ``/gone/410``."""

    name, prefix = "gone", "/gone/"

    def entry(self, site):
        return ["/gone/404", "/gone/410"]

    async def answer(self, site, request, path):
        if path in ("/gone/404", "/gone/410"):
            return page("Gone", status=int(path[-3:]))
        return None

    def classify(self, site, path):
        return Kind.GONE if path in ("/gone/404", "/gone/410") else None

    def must(self, site):
        return {"/gone/404": Kind.GONE, "/gone/410": Kind.GONE}


class RetryAfter(Feature):
    """The site's first RETRY_AFTER_COUNT page requests (robots.txt aside)
    answer 429 with ``Retry-After: RETRY_AFTER_S``."""

    name, prefix = "retry-after", "\0"

    def entry(self, site):
        return []

    async def answer(self, site, request, path):
        if site.count("retry-after") <= T.RETRY_AFTER_COUNT:
            return page("Too many requests", status=429,
                        headers={"Retry-After": str(T.RETRY_AFTER_S)})
        return None

    def classify(self, site, path):
        return None

    def expected_requests(self, site):
        return T.RETRY_AFTER_COUNT

    def wait_s(self, site):
        return T.RETRY_AFTER_COUNT * T.RETRY_AFTER_S


class Meta(Feature):
    """Meta robots and ``X-Robots-Tag``:

    ``/meta/nofollow`` (meta) and ``/meta/x-nofollow`` (header) are stored, their
    links ``/meta/nf/1`` / ``/meta/xnf/1`` never requested; ``/meta/noindex``
    and ``/meta/x-noindex`` are not stored, their links ``/meta/ni/1`` /
    ``/meta/xni/1`` are followed."""

    name, prefix = "meta", "/meta/"
    PAGES = {
        "/meta/nofollow": ('<meta name="robots" content="nofollow">', {}, "/meta/nf/1"),
        "/meta/noindex": ('<meta name="robots" content="noindex">', {}, "/meta/ni/1"),
        "/meta/x-nofollow": ("", {"X-Robots-Tag": "nofollow"}, "/meta/xnf/1"),
        "/meta/x-noindex": ("", {"X-Robots-Tag": "noindex"}, "/meta/xni/1"),
    }
    KINDS = {"/meta/nofollow": Kind.REQUIRED, "/meta/noindex": Kind.NOINDEX,
             "/meta/x-nofollow": Kind.REQUIRED, "/meta/x-noindex": Kind.NOINDEX,
             "/meta/nf/1": Kind.FORBIDDEN, "/meta/xnf/1": Kind.FORBIDDEN,
             "/meta/ni/1": Kind.REQUIRED, "/meta/xni/1": Kind.REQUIRED}

    def entry(self, site):
        return list(self.PAGES)

    async def answer(self, site, request, path):
        if path in self.PAGES:
            head, headers, target = self.PAGES[path]
            return page(path, [target], head=head, headers=headers)
        if path in self.KINDS:
            return page(path, ["/"])
        return None

    def classify(self, site, path):
        return self.KINDS.get(path, Kind.OPTIONAL if path.startswith(self.prefix) else None)

    def must(self, site):
        return {p: k for p, k in self.KINDS.items() if k in MUST_FETCH}


class Sitemap(Feature):
    """robots.txt ``Sitemap:`` -> ``/sitemap-index.xml`` (an index) ->
    ``/sitemap-1.xml`` naming ``/p/1`` and ``/orphan/1``, ``/orphan/2``
    (linked from nowhere: required only of a spider that reads sitemaps)."""

    name, prefix = "sitemap", "/sitemap"
    ORPHANS = ("/orphan/1", "/orphan/2")

    def entry(self, site):
        return []

    async def answer(self, site, request, path):
        origin = site.origin()
        if path == "/sitemap-index.xml":
            body = ('<?xml version="1.0" encoding="UTF-8"?><sitemapindex '
                    'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                    f"<sitemap><loc>{origin}/sitemap-1.xml</loc></sitemap></sitemapindex>")
        elif path == "/sitemap-1.xml":
            urls = "".join(f"<url><loc>{origin}{p}</loc><lastmod>2026-01-0{i + 1}</lastmod></url>"
                           for i, p in enumerate(("/p/1",) + self.ORPHANS))
            body = ('<?xml version="1.0" encoding="UTF-8"?><urlset '
                    f'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>')
        elif path in self.ORPHANS:
            return page(f"Orphan {path}", ["/"])
        else:
            return None
        return web.Response(body=body.encode(), content_type="application/xml")

    def classify(self, site, path):
        if path in self.ORPHANS:
            return Kind.REQUIRED if site.web.sitemaps else Kind.OPTIONAL
        return Kind.OPTIONAL if path.startswith(self.prefix) else None

    def must(self, site):
        return {p: Kind.REQUIRED for p in self.ORPHANS} if site.web.sitemaps else {}


class Chain(Feature):
    """``/_r/<site>/<site>/…/end``: each hop 302s to the next named site, the
    last hop's ``/_r/end`` is a page (required, on the site the chain ends on:
    this one). The home page links ``/_r/<chain_via...>/<self>/end``."""

    name, prefix = "chain", "/_r/"

    def entry(self, site):
        return ["/_r/" + "/".join(site.spec.chain_via + (site.spec.name,)) + "/end"]

    def classify(self, site, path):
        if not path.startswith(self.prefix):
            return None
        return Kind.REQUIRED if path == "/_r/end" else Kind.OPTIONAL

    def must(self, site):
        return {"/_r/end": Kind.REQUIRED}

    def expected_requests(self, site):
        return 2   # the first hop (from this site) and the end page


class Loop(Feature):
    """``/_loop/<a>/<b>``: site a 302s to site b's ``/_loop/<b>/<a>`` and back,
    for ever (every hop is a trap page)."""

    name, prefix = "loop", "/_loop/"

    def entry(self, site):
        return [f"/_loop/{site.spec.name}/{site.spec.chain_via[0]}"]

    def classify(self, site, path):
        return Kind.TRAP if path.startswith(self.prefix) else None


class HostVariants(Feature):
    """The home page links its own pages through other spellings of its
    origin: ``/p/1`` with a trailing dot on the host (host names only: an
    address with a dot does not resolve), ``/p/2`` with the host in capitals,
    ``/p/3`` with ``user:secret@`` (credentials a crawler must neither send
    nor store), ``/p/4`` with a fragment. One page, one fetch."""

    name, prefix = "host-variants", "\0"
    USERINFO = "user:secret"

    def entry(self, site):
        scheme, host, port = site.scheme, site.host, site.ports.get(site.scheme, 0)
        out = []
        if site.web.hostnames:
            out.append(f"{scheme}://{host}.:{port}/p/1")
        out += [f"{scheme}://{host.upper()}:{port}/p/2",
                f"{scheme}://{self.USERINFO}@{host}:{port}/p/3",
                f"{scheme}://{host}:{port}/p/4#part"]
        return out

    async def answer(self, site, request, path):
        return None   # the base pages answer

    def classify(self, site, path):
        return None

    def expected_requests(self, site):
        return 0      # pages already counted: /p/1..4


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Calendar(), Repeat(), SessionIds(), LongUrl(), Bomb("bomb-gzip", "gzip"),
    Bomb("bomb-br", "br"), Drip(), Headers(), Flood(), Cookies(), Gone(), RetryAfter(),
    Meta(), Sitemap(), Chain(), Loop(), HostVariants())}
assert set(FEATURES) == set(T.FEATURES)
