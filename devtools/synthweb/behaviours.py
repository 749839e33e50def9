"""One handler per behaviour, each with its ground truth next to it.

Every site has the *base* pages: ``/`` (links ``/p/1..pages``, ``/private/1``
and each feature's entry points), ``/p/N`` (links the next page and home) and
``/private/1`` (disallowed by the site's rules, when they reach the crawler).
robots.txt is answered by :func:`answer_robots` per the site's variant; each
feature of :data:`FEATURES` is a :class:`Feature` owning a path prefix: it
answers its paths, names the links the home page carries, and classifies its
paths into a :class:`Kind` (what a correct crawler does with them).

Handlers take the site (:class:`devtools.synthweb.server.RunningSite`: its
spec, origins and counters) and the aiohttp request, and return an aiohttp
response (or ``None``: not theirs).
"""

from __future__ import annotations

import asyncio
import enum
import gzip
import re
import secrets
import zlib
from functools import lru_cache
from urllib.parse import parse_qsl, urlencode

from aiohttp import web

from devtools.synthweb import table as T

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


# -- robots.txt ----------------------------------------------------------------------


def rules(site) -> str:
    """The site's robots.txt rules (wherever they are served from)."""
    spec = site.spec
    lines = ["User-agent: *", "Disallow: /private/"]
    if spec.crawl_delay:
        lines.append(f"Crawl-delay: {spec.crawl_delay:g}")
    if "sitemap" in spec.features:
        lines.append(f"Sitemap: {site.origin()}/sitemap-index.xml")
    return "\n".join(lines) + "\n"


def _text(body: str | bytes, **headers) -> web.Response:
    body = body.encode() if isinstance(body, str) else body
    return web.Response(body=body, content_type="text/plain", headers=headers or None)


@lru_cache(maxsize=None)
def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, 6)


@lru_cache(maxsize=4)
def _gzip_padded(head: bytes, size: int) -> bytes:
    """*head* then comment lines up to *size* bytes, gzip-compressed (streamed:
    the padding is never whole in memory)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    chunk = (b"#" * 1023 + b"\n") * 1024
    left = size - len(head)
    while left > 0:
        out.append(z.compress(chunk[:left]))
        left -= len(chunk)
    out.append(z.flush())
    return b"".join(out)


def huge_robots(site) -> bytes:
    """The rules, comments past 500 KiB, then a rule beyond what a crawler must parse."""
    head = rules(site).encode()
    pad = (b"# padding, padding, padding, padding, padding, padding, padding.\n"
           * (T.ROBOTS_HUGE_BYTES // 64 + 1))[: T.ROBOTS_HUGE_BYTES - len(head)]
    return head + pad + b"Disallow: /late/\n"


async def answer_robots(site, request, path: str) -> web.StreamResponse | None:
    """robots.txt and the paths its variants redirect through; ``None`` for others."""
    spec, variant = site.spec, site.spec.robots
    if path.startswith("/robots-for/") and path.endswith(".txt"):
        other = site.web.sites.get(path[len("/robots-for/"):-4])
        return _text(rules(other)) if other else page("Not found", status=404)
    if path == "/robots-2024.txt" and variant == "redirect-same":
        return _text(rules(site))
    if path.startswith("/r/") and variant in ("chain", "chain6", "loop"):
        return _robots_hop(site, path[3:])
    if path != "/robots.txt":
        return None
    n = site.count("robots")
    if variant == "direct":
        return _text(rules(site))
    if variant == "redirect-same":
        return redirect("/robots-2024.txt")
    if variant == "redirect-other":
        first = site.web.first
        return redirect(f"{first.origin()}/robots-for/{spec.name}.txt")
    if variant == "redirect-scheme":
        if request.scheme == "http":
            return redirect(f"{site.origin('https')}/robots.txt")
        return _text(rules(site))
    if variant in ("chain", "chain6"):
        return redirect("/r/1", 302)
    if variant == "loop":
        return redirect("/r/a", 302)
    if variant in ("404", "none"):
        return page("Not found", status=404)
    if variant == "403":
        return page("Forbidden", status=403)
    if variant == "5xx-then-ok":
        if n <= T.ROBOTS_5XX_COUNT:
            return page("Unavailable", status=503)
        return _text(rules(site))
    if variant == "slow":
        await asyncio.sleep(T.ROBOTS_SLOW_S)
        return _text(rules(site))
    if variant == "huge":
        return _text(huge_robots(site))
    if variant == "gzip":
        return _text(_gzip(rules(site).encode()), **{"Content-Encoding": "gzip"})
    if variant == "gzip-bomb":
        return _text(_gzip_padded(rules(site).encode(), T.BOMB_BYTES),
                     **{"Content-Encoding": "gzip"})
    raise AssertionError(variant)


def _robots_hop(site, rest: str) -> web.Response:
    variant = site.spec.robots
    if variant == "loop":
        return redirect("/r/b" if rest == "a" else "/r/a", 302)
    hops = 3 if variant == "chain" else 6
    k = int(rest) if rest.isdigit() else hops
    if k < hops:
        return redirect(f"/r/{k + 1}", 302)
    return _text(rules(site))


def robots_apply(spec) -> bool | None:
    """Whether the site's own rules reach a correct crawler (see ROBOTS)."""
    if spec.redirect_all_to:
        return None   # the site serves nothing of its own
    return T.ROBOTS[spec.robots]


# -- features -----------------------------------------------------------------------


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


async def answer_hops(site, request, path: str) -> web.StreamResponse | None:
    """Chain and loop hops, served by every site (a chain passes through sites
    that have no feature of their own)."""
    if path.startswith("/_r/"):
        names = path[4:].split("/")
        if names == ["end"]:
            return page("End of the chain", ["/"])
        target = site.web.sites.get(names[0])
        if target is None or len(names) < 2:
            return page("Not found", status=404)
        rest = "/".join(names[1:])
        return redirect(f"{target.origin()}/_r/{rest}", 302)
    if path.startswith("/_loop/"):
        parts = path[7:].split("/")
        if len(parts) == 2 and parts[1] in site.web.sites:
            return redirect(f"{site.web.sites[parts[1]].origin()}/_loop/{parts[1]}/{parts[0]}",
                            302)
        return page("Not found", status=404)
    return None


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Calendar(), Repeat(), SessionIds(), LongUrl(), Bomb("bomb-gzip", "gzip"),
    Bomb("bomb-br", "br"), Drip(), Headers(), Flood(), Cookies(), Gone(), RetryAfter(),
    Meta(), Sitemap(), Chain(), Loop())}
assert set(FEATURES) == set(T.FEATURES)


def prepare(site) -> None:
    """Make *site*'s costly bodies now (bombs, flood, huge robots.txt), before
    serving: made on first request, they would stall the loop for ~0.3 s and
    skew the arrival times the log records."""
    spec = site.spec
    for name in spec.features:
        if isinstance(FEATURES[name], Bomb):
            bomb_body(FEATURES[name].encoding)
    if "flood" in spec.features:
        _flood_page()
    if spec.robots == "gzip-bomb":
        _gzip_padded(rules(site).encode(), T.BOMB_BYTES)


# -- the base pages -------------------------------------------------------------------


def home_links(site) -> list[str]:
    spec = site.spec
    hrefs = [f"/p/{i}" for i in range(1, spec.pages + 1)] + ["/private/1"]
    if spec.robots == "huge":
        hrefs.append("/late/1")
    for name in spec.features:
        hrefs += FEATURES[name].entry(site)
    return hrefs


async def answer_base(site, request, path: str) -> web.StreamResponse | None:
    spec = site.spec
    if path == "/":
        return page(f"{spec.name} home", home_links(site))
    m = re.fullmatch(r"/p/(\d+)", path)
    if m and 1 <= int(m.group(1)) <= spec.pages:
        i = int(m.group(1))
        return page(f"{spec.name} page {i}", [f"/p/{i % spec.pages + 1}", "/"])
    if path in ("/private/1", "/late/1"):
        return page(f"{spec.name} {path}", ["/"])
    return None


def classify_base(site, path: str) -> Kind | None:
    spec = site.spec
    if spec.redirect_all_to or (path.startswith(("/robots", "/r/")) and path.endswith(".txt")):
        return Kind.OPTIONAL
    if path.startswith("/r/") and spec.robots in ("chain", "chain6", "loop"):
        return Kind.OPTIONAL
    if path.startswith("/_loop/"):
        return Kind.TRAP
    if path.startswith("/_r/"):
        return Kind.REQUIRED if path == "/_r/end" and "chain" in spec.features else Kind.OPTIONAL
    if path == "/" or (re.fullmatch(r"/p/(\d+)", path)
                       and 1 <= int(path[3:]) <= spec.pages):
        return Kind.REQUIRED
    if path == "/private/1":
        applies = robots_apply(spec)
        return Kind.FORBIDDEN if applies else Kind.REQUIRED if applies is False else Kind.OPTIONAL
    if path == "/late/1" and spec.robots == "huge":
        return Kind.OPTIONAL   # past 500 KiB: a crawler may or may not read that rule
    return None
