"""A small shop on several loopback hosts with what every kind of Scrapy spider
reads: listings, product pages, robots.txt naming a sitemap index, sitemaps, an
RSS and a CSV feed, a search form that answers only ``POST``, a JSON API that
answers only a ``POST`` of JSON, and a web directory laid out like the one
scrapy-redis' example ``dmoz`` spider crawls (query strings are ignored, but
recorded: ``/product/1?x`` is counted apart from ``/product/1``, and a POST
as ``path#body``).

One :class:`KindsSite` serves every host from threads of the test process (no
subprocess: a request costs the suite little), and records each request as
``(host, method, path)`` with a count: what a test compares with what a
correct crawl fetches (every page once).

Pages of each host (``PRODUCTS`` products, ``PER_PAGE`` a listing page):

``/`` = ``/list/1``, ``/list/N``   ``<a class="product" href="/product/I">``,
                                   ``<a class="next" href="/list/N+1">``
``/product/I``                     ``<h1 class="title">``, ``<span class="price">``,
                                   two ``<a class="related">`` links to other products
``/robots.txt``                    allows all, ``Sitemap: /sitemap.xml``
``/sitemap.xml``                   a sitemap index naming ``/sitemap-products.xml``
``/sitemap-products.xml``          every product URL
``/feed.xml`` / ``/feed.csv``      every product URL (RSS items; ``id,url`` rows)
``POST /search`` (form ``page=N``) listing page N; any other method: 405
``POST /api/products`` (JSON       ``{"products": [URL...], "next": N+1 or null}``;
``{"page": N}``)                   anything else: 405/400
``/dir/``, ``/dir/C``, ``/dir/C/S`` the directory: ``.top-cat`` / ``.sub-cat`` /
                                   ``.cat-item`` links, ``.title-and-desc`` entries
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PRODUCTS = 30
PER_PAGE = 10
TOP_CATS = 3
SUB_CATS = 2
ENTRIES = 2       # .title-and-desc entries on each directory page below the top


def pages() -> int:
    return -(-PRODUCTS // PER_PAGE)


def product_paths() -> list[str]:
    return [f"/product/{i}" for i in range(1, PRODUCTS + 1)]


def directory_pages(prefix: str = "/dir") -> list[str]:
    """Every directory page below the top (each has ENTRIES entries)."""
    out = []
    for c in range(1, TOP_CATS + 1):
        out.append(f"{prefix}/{c}")
        out.extend(f"{prefix}/{c}/{s}" for s in range(1, SUB_CATS + 1))
    return out


def _html(title: str, body: str) -> bytes:
    return (f"<!doctype html><html><head><title>{title}</title></head>"
            f"<body>{body}</body></html>").encode()


def listing(page: int) -> bytes:
    first = (page - 1) * PER_PAGE + 1
    links = "".join(f'<a class="product" href="/product/{i}">Product {i}</a>'
                    for i in range(first, min(first + PER_PAGE, PRODUCTS + 1)))
    nxt = f'<a class="next" href="/list/{page + 1}">next</a>' if page < pages() else ""
    return _html(f"Page {page}", links + nxt)


def product(i: int) -> bytes:
    related = "".join(f'<a class="related" href="/product/{j}">Product {j}</a>'
                      for j in (i % PRODUCTS + 1, (i + 6) % PRODUCTS + 1))
    return _html(f"Product {i}", f'<h1 class="title">Product {i}</h1>'
                                 f'<span class="price">{i}.99</span>{related}')


def directory(path: str, prefix: str = "/dir") -> bytes | None:
    """The directory page at *path* (below *prefix*: ``/dir``, or ``""`` on a
    host that is only a directory), or None."""
    rest = path[len(prefix):] if path.startswith(prefix) else None
    if rest is None:
        return None
    parts = [p for p in rest.split("/") if p]
    if not parts:
        cats = "".join(f'<li class="top-cat"><a href="{prefix}/{c}">Cat {c}</a></li>'
                       for c in range(1, TOP_CATS + 1))
        return _html("Directory", f"<ul>{cats}</ul>")
    if not all(p.isdigit() for p in parts) or len(parts) > 2:
        return None
    c = int(parts[0])
    if not 1 <= c <= TOP_CATS or (len(parts) == 2 and not 1 <= int(parts[1]) <= SUB_CATS):
        return None
    body = ""
    if len(parts) == 1:
        body += "".join(f'<div class="sub-cat"><a href="{prefix}/{c}/{s}">Sub {s}</a></div>'
                        for s in range(1, SUB_CATS + 1))
        # A link back to a page already known: the filter, not the site, stops it.
        body += (f'<div class="cat-item"><a href="{prefix}/{c % TOP_CATS + 1}">Next cat</a>'
                 "</div>")
    entries = "".join(
        f'<div class="title-and-desc"><a href="http://site-{n}.invalid/">'
        f'<div class="site-title">Site {path} {n}</div></a>'
        f'<div class="site-descr"> About {path} {n} </div></div>' for n in range(ENTRIES))
    return _html(f"Dir {path}", body + entries)


class _Handler(BaseHTTPRequestHandler):
    server_version = "KindsSite/1"

    def log_message(self, *args) -> None:   # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._answer("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def _answer(self, method: str) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        site: KindsSite = self.server.site
        # With its query, and a POST with its body: each is a page of its own.
        site.record(self.server.host, method,
                    self.path + (f"#{body.decode('latin-1')}" if method == "POST" else ""))
        if self.server.directory:
            page = directory(path, "") if method in ("GET", "HEAD") else None
            status, ctype, data = ((200, "text/html; charset=utf-8", page) if page
                                   else (404, "text/plain", b"not found"))
        else:
            status, ctype, data = site.render(self.server.base, method, path, body,
                                              self.headers.get("Content-Type", ""))
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)


class KindsSite:
    """The shop on each of *hosts* (``127.0.0.x``), port 0: ``urls[host]``;
    each of *directories* (``{host: port}``) serves only the directory, at ``/``."""

    def __init__(self, hosts: list[str], directories: dict[str, int] | None = None):
        self.hosts = hosts
        self.directories = directories or {}
        self.urls: dict[str, str] = {}
        self.hits: Counter = Counter()
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []

    def __enter__(self) -> "KindsSite":
        for host, port in [*((h, 0) for h in self.hosts), *self.directories.items()]:
            server = ThreadingHTTPServer((host, port), _Handler)
            server.daemon_threads = True
            server.site, server.host = self, host
            server.directory = host in self.directories
            server.base = f"http://{host}:{server.server_address[1]}"
            self.urls[host] = server.base + "/"
            self._servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True,
                             name=f"kinds-site-{host}").start()
        return self

    def __exit__(self, *exc) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def record(self, host: str, method: str, path: str) -> None:
        with self._lock:
            self.hits[(host, method, path)] += 1

    def fetched(self, host: str) -> Counter:
        """``(method, path) -> count`` of *host*'s requests."""
        with self._lock:
            return Counter({(m, p): n for (h, m, p), n in self.hits.items() if h == host})

    def render(self, base: str, method: str, path: str, body: bytes,
               ctype: str) -> tuple[int, str, bytes]:
        html = "text/html; charset=utf-8"
        if path in ("/search", "/api/products"):
            return self._post(path, method, body, ctype)
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed"
        if path == "/":
            return 200, html, listing(1)
        if path.startswith("/list/") and path[6:].isdigit() and 1 <= int(path[6:]) <= pages():
            return 200, html, listing(int(path[6:]))
        if path.startswith("/product/") and path[9:].isdigit() \
                and 1 <= int(path[9:]) <= PRODUCTS:
            return 200, html, product(int(path[9:]))
        if path == "/robots.txt":
            return 200, "text/plain", (f"User-agent: *\nAllow: /\n"
                                       f"Sitemap: {base}/sitemap.xml\n").encode()
        if path == "/sitemap.xml":
            return 200, "application/xml", (
                '<?xml version="1.0" encoding="UTF-8"?><sitemapindex xmlns='
                '"http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap><loc>'
                f"{base}/sitemap-products.xml</loc></sitemap></sitemapindex>").encode()
        if path == "/sitemap-products.xml":
            urls = "".join(f"<url><loc>{base}{p}</loc></url>" for p in product_paths())
            return 200, "application/xml", (
                '<?xml version="1.0" encoding="UTF-8"?><urlset xmlns='
                f'"http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>').encode()
        if path == "/feed.xml":
            items = "".join(f"<item><title>P{p}</title><link>{base}{p}</link></item>"
                            for p in product_paths())
            return 200, "application/rss+xml", (
                f'<?xml version="1.0"?><rss version="2.0"><channel><title>Shop</title>'
                f"{items}</channel></rss>").encode()
        if path == "/feed.csv":
            rows = "".join(f"{i},{base}/product/{i}\n" for i in range(1, PRODUCTS + 1))
            return 200, "text/csv", ("id,url\n" + rows).encode()
        if path == "/dir" or path.startswith("/dir/"):
            page = directory(path)
            if page is not None:
                return 200, html, page
        return 404, html, _html("Not found", "")

    def _post(self, path: str, method: str, body: bytes, ctype: str) -> tuple[int, str, bytes]:
        if method != "POST":
            return 405, "text/plain", b"POST only"
        if path == "/search":
            page = parse_qs(body.decode("latin-1")).get("page", [""])[0]
            if not page.isdigit() or not 1 <= int(page) <= pages():
                return 400, "text/plain", b"bad page"
            return 200, "text/html; charset=utf-8", listing(int(page))
        try:
            page = json.loads(body)["page"] if "json" in ctype else None
        except (ValueError, KeyError, TypeError):
            page = None
        if not isinstance(page, int) or not 1 <= page <= pages():
            return 400, "text/plain", b"bad request"
        first = (page - 1) * PER_PAGE + 1
        data = {"products": [f"/product/{i}" for i in
                             range(first, min(first + PER_PAGE, PRODUCTS + 1))],
                "next": page + 1 if page < pages() else None}
        return 200, "application/json", json.dumps(data).encode()
