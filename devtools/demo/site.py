"""Deterministic local demo shop used by the demo crawl, end-to-end tests and benchmarks.

Everything served is a pure function of the product count (and ``per_page``), so a
crawl's output can be compared with :func:`expected_items`.

Pages (``text/html; charset=utf-8`` unless noted):

``/`` and ``/list/N``
    Listing page N (1-based; ``/`` is page 1 and the canonical URL of page 1).
    ``per_page`` links ``<a class="product" href="/product/ID">`` plus pagination
    ``<a class="next" rel="next" href="/list/N+1">`` / ``<a class="prev" rel="prev">``.
    Page 1 also links ``/product/999999``, a dead link that answers 404.
    Links to the JavaScript product carry ``data-render="js"``.
``/product/ID``
    ``<h1 class="title">`` (messy whitespace and HTML entities), ``<span class="price">``
    (varied formats and currencies), ``<time class="published">`` (date as text, no
    ``datetime`` attribute), ``<div class="description">`` and 3-5
    ``<a class="related" href="/product/J">`` links (duplicates within and across pages).
``/product/7``
    JavaScript page: no title/price/date in the markup; a script decodes them and
    inserts them into ``<div id="app">`` after ``setTimeout(..., 50)``.
``/product/ID`` with ``ID % 17 == 0``
    Answers 503 the first time each path is requested, 200 afterwards (disable with
    ``--no-faults``).
``/product/ID`` revised
    After ``/__change?ids=...`` a product's description ends with ``(revision N)``
    (:func:`revised`): its page, ETag and Last-Modified change. After
    ``/__gone?ids=...`` it answers ``410 Gone``.
``/robots.txt``
    ``text/plain``, allows everything.

Validators (unless ``--no-validators``): every 200 page carries a strong ``ETag``
(sha1 of the body) and a ``Last-Modified`` date that moves with each revision, and
a conditional request that matches (``If-None-Match``, else ``If-Modified-Since``)
gets ``304 Not Modified`` without a body. Product pages whose ID is a multiple of
``NO_VALIDATORS_EVERY`` (5; ``--no-validators-every N``, 0 = every page has them)
send no validators, like many real sites: only the body tells whether they changed.
``/__stats``
    JSON ``{path: hits}`` of every request received (including 404s and 503s,
    excluding ``/__stats`` and ``/__reset``).
``/__served``
    JSON ``{"paths": {path: {status: count}}, "body_bytes": N}``: what was answered,
    with how many body bytes in all (304s have none).
``/__change?ids=1,2,3``
    POST: the next revision of those products (their pages change).
``/__gone?ids=1,2,3``
    POST: those products answer 410 from now on.
``/__reset``
    GET or POST: clears the counters and the 503-once state (revisions and gone
    products stay: they are the site's content).

Anything else answers 404. Latency (``--latency-ms``) is added to every page except the
two control endpoints, using ``reactor.callLater`` (never blocking); with
``--latency-jitter F`` each page's latency is drawn uniformly from
``latency × (1 ± F)`` (a fixed seed: the same run draws the same latencies).

Command line::

    python -m devtools.demo.site --host 127.0.0.1 --port 0 --products 60 \\
        --per-page 10 --latency-ms 0 [--no-faults]

prints one line ``DEMO_SITE_URL=http://127.0.0.1:PORT/`` and serves until SIGTERM/SIGINT
(exit 0). ``--exit-on-stdin-eof`` (used by :class:`DemoSite`) also stops it when its stdin
closes, so a crashed parent leaves no orphan server.

Python API: :func:`product`, :func:`catalog`, :func:`expected_items`, :func:`clean_text`,
:func:`build_site` (in-process twisted ``Site``) and :class:`DemoSite` (subprocess).

This module never imports ``twisted.internet.reactor`` at import time, so it is safe to
import from Scrapy code that installs its own reactor.

Size (over 600 lines): the whole demo shop (pages, faults, robots.txt,
sitemaps, JavaScript pages, recrawl changes) in one module, so that
:func:`expected_items` stays beside what it describes; development only.
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import hashlib
import html
import json
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Callable

# twisted.web does not install a reactor; twisted.internet.reactor is imported lazily.
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

DEAD_PRODUCT_ID = 999_999
JS_PRODUCT_ID = 7
FLAKY_EVERY = 17
JS_DELAY_MS = 50
MAX_PRODUCTS = DEAD_PRODUCT_ID - 1
URL_PREFIX = "DEMO_SITE_URL="
CONTROL_PATHS = ("/__stats", "/__reset", "/__served", "/__change", "/__gone")
NO_VALIDATORS_EVERY = 5
# Last-Modified of revision 0 of every page; each revision adds an hour.
_BASE_MODIFIED = datetime(2026, 1, 1, tzinfo=timezone.utc)

_MASK64 = (1 << 64) - 1
_NBSP = "\u00a0"
_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
_ADJECTIVES = ("Deluxe", "Compact", "Rustic", "Smart", "Vintage", "Ergonomic", "Portable", "Classic")
_NOUNS = ("Widget", "Gadget", "Lamp", "Kettle", "Backpack", "Chair", "Speaker", "Clock")
_OFFSETS_MIN = (120, -300, 330, 0, -210, 540)


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Product:
    """One demo product: the raw strings shown on its page and their clean values."""

    id: int
    path: str
    raw_title: str  # HTML source (contains entities)
    title: str  # clean text, see clean_text()
    raw_price: str  # text as served (may contain U+00A0)
    price: Decimal
    currency: str  # ISO 4217: USD, EUR, GBP, JPY
    raw_date: str  # text content of <time class="published">
    published: datetime  # timezone-aware, UTC
    related: list[int] = field(default_factory=list)
    js: bool = False  # rendered client side (links carry data-render="js")
    flaky: bool = False  # answers 503 once
    description: str = ""


def clean_text(raw: str) -> str:
    """Return the clean form of a raw HTML text: unescape, NBSP -> space, collapse, strip."""
    return " ".join(html.unescape(raw).replace(_NBSP, " ").split())


def _mix(*parts: int) -> int:
    """Small deterministic 64-bit hash of integers (independent of PYTHONHASHSEED)."""
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = ((x ^ (part & _MASK64)) * 0xBF58476D1CE4E5B9) & _MASK64
        x ^= x >> 31
        x = (x * 0x94D049BB133111EB) & _MASK64
        x ^= x >> 29
    return x


def _raw_title(pid: int) -> str:
    h = _mix(pid, 1)
    adj, noun = _ADJECTIVES[h % 8], _NOUNS[(h >> 8) % 8]
    templates = (
        "  {a}&nbsp;{n} \n &amp; Co.  No. {i} ",
        "\n\t{a} {n}\t&quot;Pro&quot;   #{i}\n",
        "{a}   Caf&eacute;\t{n}  No.&nbsp;{i}  ",
        " \t {a} {n} &#39;{i}&#39;  &amp;  more \n\n",
    )
    return templates[(pid - 1) % len(templates)].format(a=adj, n=noun, i=pid)


def _group(n: int, sep: str) -> str:
    return f"{n:,}".replace(",", sep)


def _price_usd_symbol(h: int) -> tuple[str, Decimal, str]:
    amount = Decimal(100 + h % 300_000).scaleb(-2)
    return f"${amount:,.2f}", amount, "USD"


def _price_eur_continental(h: int) -> tuple[str, Decimal, str]:
    cents = 100_000 + h % 900_000
    sep = _NBSP if (h >> 40) % 2 else " "
    raw = f"{_group(cents // 100, sep)},{cents % 100:02d}{sep}€"
    return raw, Decimal(cents).scaleb(-2), "EUR"


def _price_gbp(h: int) -> tuple[str, Decimal, str]:
    amount = Decimal(100 + h % 20_000).scaleb(-2)
    return f"£{amount:,.2f}", amount, "GBP"


def _price_eur_code(h: int) -> tuple[str, Decimal, str]:
    whole = 1 + h % 500
    return f"EUR {whole}", Decimal(whole), "EUR"


def _price_eur_short(h: int) -> tuple[str, Decimal, str]:
    tenths = 10 + h % 5_000
    return f"{tenths // 10},{tenths % 10} €", Decimal(tenths).scaleb(-1), "EUR"


def _price_usd_code(h: int) -> tuple[str, Decimal, str]:
    amount = Decimal(100 + h % 50_000).scaleb(-2)
    return f"USD {amount:.2f}", amount, "USD"


def _price_jpy(h: int) -> tuple[str, Decimal, str]:
    yen = 100 + h % 200_000
    return f"¥{yen:,}", Decimal(yen), "JPY"


_PRICE_FORMATS: tuple[Callable[[int], tuple[str, Decimal, str]], ...] = (
    _price_usd_symbol, _price_eur_continental, _price_gbp, _price_eur_code,
    _price_eur_short, _price_usd_code, _price_jpy,
)


def _price(pid: int) -> tuple[str, Decimal, str]:
    return _PRICE_FORMATS[(pid - 1) % len(_PRICE_FORMATS)](_mix(pid, 2))


def _date_iso(d: datetime, pid: int) -> tuple[str, datetime]:
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}", _midnight(d)


def _date_day_month(d: datetime, pid: int) -> tuple[str, datetime]:
    return f"{d.day} {_MONTHS[d.month - 1]} {d.year}", _midnight(d)


def _date_short_month(d: datetime, pid: int) -> tuple[str, datetime]:
    return f"{_MONTHS[d.month - 1][:3]} {d.day}, {d.year}", _midnight(d)


def _date_iso_offset(d: datetime, pid: int) -> tuple[str, datetime]:
    offset = timedelta(minutes=_OFFSETS_MIN[(pid // 6) % len(_OFFSETS_MIN)])
    local = d.replace(tzinfo=timezone(offset))
    return local.isoformat(timespec="seconds"), local.astimezone(timezone.utc)


def _date_dotted(d: datetime, pid: int) -> tuple[str, datetime]:
    return f"{d.day:02d}.{d.month:02d}.{d.year:04d}", _midnight(d)


def _date_month_time_utc(d: datetime, pid: int) -> tuple[str, datetime]:
    raw = f"{_MONTHS[d.month - 1]} {d.day}, {d.year} {d.hour:02d}:{d.minute:02d} UTC"
    return raw, d.replace(tzinfo=timezone.utc)


_DATE_FORMATS: tuple[Callable[[datetime, int], tuple[str, datetime]], ...] = (
    _date_iso, _date_day_month, _date_short_month,
    _date_iso_offset, _date_dotted, _date_month_time_utc,
)


def _midnight(d: datetime) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)


def _date(pid: int) -> tuple[str, datetime]:
    h = _mix(pid, 3)
    naive = datetime(2020, 1, 1) + timedelta(days=h % 1827, minutes=5 * ((h >> 20) % 288))
    return _DATE_FORMATS[(pid - 1) % len(_DATE_FORMATS)](naive, pid)


def _related(pid: int, products: int) -> list[int]:
    """3-5 other product IDs; popular targets repeat across pages, every 4th page repeats one."""
    if products < 2:
        return []
    count = 3 + _mix(pid, 4) % 3
    popular = (JS_PRODUCT_ID, 1, 2)[pid % 3]
    picks = [j for j in (popular, pid % products + 1) if j <= products and j != pid]
    salt = 0
    while len(picks) < count:
        j = 1 + _mix(pid, 5, salt) % products
        salt += 1
        if j != pid:
            picks.append(j)
    picks = picks[:count]
    if pid % 4 == 0:
        picks[-1] = picks[0]
    return picks


def product(pid: int, products: int) -> Product:
    """Return product ``pid`` of a catalog of ``products`` items (pure, O(1))."""
    if not 1 <= pid <= products:
        raise ValueError(f"product id {pid} outside 1..{products}")
    raw_title = _raw_title(pid)
    raw_price, price, currency = _price(pid)
    raw_date, published = _date(pid)
    return Product(
        id=pid, path=f"/product/{pid}", raw_title=raw_title, title=clean_text(raw_title),
        raw_price=raw_price, price=price, currency=currency,
        raw_date=raw_date, published=published, related=_related(pid, products),
        js=pid == JS_PRODUCT_ID, flaky=pid % FLAKY_EVERY == 0,
        description=f"Demo product number {pid}. Sturdy, useful and entirely fictional.",
    )


def revised(p: Product, revision: int) -> Product:
    """Product *p* at revision *revision* (0: as :func:`product` made it)."""
    if revision <= 0:
        return p
    return replace(p, description=f"{p.description} (revision {revision})")


def catalog(products: int) -> list[Product]:
    """Return every product of a catalog of ``products`` items, ordered by ID."""
    return [product(pid, products) for pid in range(1, products + 1)]


def expected_items(base_url: str, products: int) -> dict[str, dict]:
    """Map absolute product URL -> clean ``title``/``price``/``currency``/``published``.

    Covers every real product (not the dead 404 link).
    """
    base = base_url.rstrip("/")
    return {
        base + p.path: {"title": p.title, "price": p.price, "currency": p.currency,
                        "published": p.published}
        for p in catalog(products)
    }


def page_count(products: int, per_page: int) -> int:
    """Number of listing pages (at least 1)."""
    return max(1, math.ceil(products / per_page))


# --------------------------------------------------------------------------- HTML


def _layout(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _list_path(page: int) -> str:
    return "/" if page == 1 else f"/list/{page}"


def _product_link(pid: int, css_class: str) -> str:
    js = ' data-render="js"' if pid == JS_PRODUCT_ID else ""
    return f'<a class="{css_class}" href="/product/{pid}"{js}>Product {pid}</a>'


def _pagination(page: int, pages: int) -> str:
    links = []
    if page > 1:
        links.append(f'<a class="prev" rel="prev" href="{_list_path(page - 1)}">Previous</a>')
    if page < pages:
        links.append(f'<a class="next" rel="next" href="{_list_path(page + 1)}">Next</a>')
    return f'<nav class="pagination">{" ".join(links)} <span>Page {page} of {pages}</span></nav>'


def render_listing(page: int, products: int, per_page: int) -> str | None:
    """HTML of listing page ``page`` or ``None`` if it does not exist."""
    pages = page_count(products, per_page)
    if not 1 <= page <= pages:
        return None
    first = (page - 1) * per_page + 1
    ids = range(first, min(first + per_page, products + 1))
    items = [f"<li>{_product_link(pid, 'product')}</li>" for pid in ids]
    if page == 1:
        items.append(f"<li>{_product_link(DEAD_PRODUCT_ID, 'product')}</li>")
    body = f'<h1>Demo shop</h1>\n<ul class="products">\n{chr(10).join(items)}\n</ul>\n'
    return _layout(f"Demo shop - page {page}", body + _pagination(page, pages))


def _related_html(p: Product) -> str:
    items = "".join(f"<li>{_product_link(j, 'related')}</li>" for j in p.related)
    return f'<ul class="related-products">{items}</ul>'


def _static_details(p: Product) -> str:
    return (
        f'<h1 class="title">{p.raw_title}</h1>\n'
        f'<span class="price">{p.raw_price}</span>\n'
        f'<time class="published">{p.raw_date}</time>\n'
        f'<div class="description">{p.description}</div>'
    )


_JS_TEMPLATE = """<div id="app"></div>
<script>
setTimeout(function () {
  var d = JSON.parse(atob("%s"));
  var app = document.getElementById("app");
  function add(tag, cls, html) {
    var el = document.createElement(tag);
    el.className = cls;
    el.innerHTML = html;
    app.appendChild(el);
  }
  add("h1", "title", d.t);
  add("span", "price", d.p);
  add("time", "published", d.d);
  add("div", "description", d.s);
}, %d);
</script>"""


def _js_details(p: Product) -> str:
    """Details hidden in base64 JSON (ASCII-only) so none of them appear in the markup."""
    payload = {"t": p.raw_title, "p": html.escape(p.raw_price), "d": html.escape(p.raw_date),
               "s": html.escape(p.description)}
    encoded = base64.b64encode(json.dumps(payload).encode("ascii")).decode("ascii")
    return _JS_TEMPLATE % (encoded, JS_DELAY_MS)


def render_product(p: Product, page_kb: int = 0) -> str:
    """HTML of a product page (static markup, or the JavaScript variant);
    *page_kb* adds about that many KiB of specification rows (real product
    pages weigh tens of KiB), which no field of the item comes from."""
    details = _js_details(p) if p.js else _static_details(p)
    body = f'<article class="product-page">\n{details}\n</article>\n{_related_html(p)}'
    body += f'\n<p><a class="home" href="/">Back to the shop</a></p>'
    if page_kb > 0:
        row = (f'<tr><th>Property {{n}} of product {p.id}</th><td>value {{n}}, '
               f'deterministic filler text for a realistic page weight</td></tr>\n')
        rows = "".join(row.format(n=n) for n in range(page_kb * 1024 // 110 + 1))
        body += f'\n<table class="specs">\n{rows}</table>'
    return _layout(f"Demo shop - product {p.id}", body)


ROBOTS_TXT = "User-agent: *\nAllow: /\n"
_LIST_RE = re.compile(r"^/list/([1-9][0-9]{0,8})$")
_PRODUCT_RE = re.compile(r"^/product/([1-9][0-9]{0,8})$")


@dataclass(frozen=True)
class SiteConfig:
    """Parameters of one demo site instance."""

    products: int = 60
    per_page: int = 10
    latency_ms: int = 0
    faults: bool = True
    validators: bool = True
    #: product pages whose ID is a multiple of this send no validators (0: none)
    no_validators_every: int = NO_VALIDATORS_EVERY
    #: about this many KiB of extra markup on each product page
    page_kb: int = 0
    #: each latency drawn from latency_ms x (1 ± this), uniformly (0: always latency_ms)
    latency_jitter: float = 0.0


@dataclass(frozen=True)
class Page:
    """A response: HTTP status, content type, body, and the validators it may carry."""

    status: int
    content_type: str
    body: bytes
    revision: int = 0
    validators: bool = True

    @property
    def etag(self) -> str:
        return '"%s"' % hashlib.sha1(self.body).hexdigest()[:20]

    @property
    def last_modified(self) -> datetime:
        return _BASE_MODIFIED + timedelta(hours=self.revision)


def _html(status: int, text: str) -> Page:
    return Page(status, "text/html; charset=utf-8", text.encode("utf-8"))


NOT_FOUND = _html(404, _layout("Not found", "<h1>404 Not found</h1>"))
UNAVAILABLE = _html(503, _layout("Unavailable", "<h1>503 Service unavailable</h1>"))
GONE = _html(410, _layout("Gone", "<h1>410 Gone</h1>"))


def product_id(path: str) -> int | None:
    """The ID in a canonical ``/product/ID`` path, else ``None``."""
    match = _PRODUCT_RE.match(path)
    return int(match.group(1)) if match else None


def render_path(path: str, config: SiteConfig, revisions: dict[int, int] | None = None,
                gone: set[int] | frozenset = frozenset()) -> Page:
    """Pure routing: the 200/404/410 response for ``path`` at the given product
    *revisions* (the 503 fault is stateful, elsewhere)."""
    if path == "/robots.txt":
        return Page(200, "text/plain; charset=utf-8", ROBOTS_TXT.encode("ascii"))
    match = _LIST_RE.match(path)
    page = 1 if path == "/" else int(match.group(1)) if match else None
    listing = render_listing(page, config.products, config.per_page) if page else None
    if listing is not None:
        return replace(_html(200, listing), validators=config.validators)
    pid = product_id(path)
    if pid is not None and pid <= config.products:
        if pid in gone:
            return GONE
        revision = (revisions or {}).get(pid, 0)
        page = _html(200, render_product(revised(product(pid, config.products), revision),
                                         config.page_kb))
        return replace(page, revision=revision,
                       validators=config.validators and not (
                           config.no_validators_every and pid % config.no_validators_every == 0))
    return NOT_FOUND


# --------------------------------------------------------------------------- server


class SiteState:
    """Mutable per-process state: hit counters and paths that already failed once."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.failed_once: set[str] = set()
        self.served: dict[str, Counter[int]] = {}
        self.body_bytes = 0
        self.revisions: Counter[int] = Counter()
        self.gone: set[int] = set()

    def reset(self) -> None:
        """Forget all counters and 503 state (revisions and gone products stay)."""
        self.hits.clear()
        self.failed_once.clear()
        self.served.clear()
        self.body_bytes = 0

    def answered(self, path: str, status: int, body: bytes) -> None:
        self.served.setdefault(path, Counter())[status] += 1
        self.body_bytes += len(body)

    def should_fail(self, path: str, config: SiteConfig) -> bool:
        """True (once per path) for flaky product paths when faults are enabled."""
        pid = product_id(path)
        if not config.faults or pid is None or pid > config.products:
            return False
        if pid % FLAKY_EVERY or path in self.failed_once:
            return False
        self.failed_once.add(path)
        return True


class DemoResource(Resource):
    """twisted.web leaf resource serving every path of the demo shop."""

    isLeaf = True

    def __init__(self, config: SiteConfig, reactor) -> None:
        super().__init__()
        self.config, self.reactor = config, reactor
        self.state = SiteState()
        self._latency = random.Random(0)

    def render(self, request):
        """Count the hit, pick the page, answer now or after the configured latency."""
        path = request.path.decode("utf-8", "replace")
        if path in CONTROL_PATHS:
            return self._send(request, self._control(path, request))
        self.state.hits[path] += 1
        fail = self.state.should_fail(path, self.config)
        page = UNAVAILABLE if fail else render_path(path, self.config, self.state.revisions,
                                                    self.state.gone)
        if self.config.latency_ms <= 0:
            return self._answer(request, path, page)
        self._delay(request, path, page)
        return NOT_DONE_YET

    def _control(self, path: str, request) -> Page:
        if path == "/__reset":
            self.state.reset()
            data = {"reset": True}
        elif path == "/__served":
            data = {"paths": {p: {str(k): v for k, v in sorted(c.items())}
                              for p, c in sorted(self.state.served.items())},
                    "body_bytes": self.state.body_bytes}
        elif path in ("/__change", "/__gone"):
            raw = request.args.get(b"ids", [b""])[0].decode("ascii", "replace")
            ids = [int(x) for x in raw.split(",") if x.strip().isdigit()]
            for pid in ids:
                if path == "/__change":
                    self.state.revisions[pid] += 1
                else:
                    self.state.gone.add(pid)
            data = {"ids": ids}
        else:
            data = dict(sorted(self.state.hits.items()))
        return Page(200, "application/json", json.dumps(data).encode("utf-8"))

    def _answer(self, request, path: str, page: Page) -> bytes:
        """Send *page*, or 304 when the request's validators match it."""
        if page.status == 200 and page.validators:
            request.setHeader(b"etag", page.etag.encode("ascii"))
            request.setHeader(b"last-modified", http_date(page.last_modified))
            if _not_modified(request, page):
                request.setResponseCode(304)
                self.state.answered(path, 304, b"")
                return b""
        self.state.answered(path, page.status, page.body)
        return self._send(request, page)

    @staticmethod
    def _send(request, page: Page) -> bytes:
        request.setResponseCode(page.status)
        request.setHeader(b"content-type", page.content_type.encode("ascii"))
        request.setHeader(b"content-length", str(len(page.body)).encode("ascii"))
        return page.body

    def _delay(self, request, path: str, page: Page) -> None:
        jitter = self.config.latency_jitter
        latency = self.config.latency_ms * (
            self._latency.uniform(1 - jitter, 1 + jitter) if jitter else 1)
        call = self.reactor.callLater(latency / 1000, self._finish, request,
                                      path, page)
        request.notifyFinish().addErrback(lambda _: call.active() and call.cancel())

    def _finish(self, request, path: str, page: Page) -> None:
        body = self._answer(request, path, page)
        if body:
            request.write(body)
        request.finish()


def http_date(when: datetime) -> bytes:
    """*when* as an HTTP date (RFC 9110 IMF-fixdate)."""
    return email.utils.format_datetime(when.astimezone(timezone.utc), usegmt=True).encode("ascii")


def _not_modified(request, page: Page) -> bool:
    """RFC 9110 §13.2.2: If-None-Match decides when present, else If-Modified-Since."""
    none_match = request.getHeader(b"if-none-match")
    if none_match is not None:
        tags = [t.strip() for t in none_match.decode("latin-1").split(",")]
        return "*" in tags or any(t.removeprefix("W/") == page.etag for t in tags)
    since = request.getHeader(b"if-modified-since")
    if since is None:
        return False
    try:
        when = email.utils.parsedate_to_datetime(since.decode("latin-1"))
    except (TypeError, ValueError):
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return page.last_modified <= when


class QuietSite(Site):
    """``Site`` without the per-request access log (it costs time under benchmarks)."""

    noisy = False

    def log(self, request) -> None:
        pass


def build_site(config: SiteConfig, reactor=None) -> Site:
    """Return a ``twisted.web.server.Site`` serving the demo shop (for in-process use)."""
    if reactor is None:
        from twisted.internet import reactor
    return QuietSite(DemoResource(config, reactor))


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _products(value: str) -> int:
    number = _positive(value)
    if number > MAX_PRODUCTS:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_PRODUCTS}, got {number}")
    return number


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {value!r}")
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="Deterministic local demo shop.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_non_negative, default=0, help="0 = any free port")
    parser.add_argument("--products", type=_products, default=60)
    parser.add_argument("--per-page", type=_positive, default=10)
    parser.add_argument("--latency-ms", type=_non_negative, default=0)
    parser.add_argument("--latency-jitter", type=_fraction, default=0.0,
                        help="draw each latency from latency-ms x (1 ± F), 0 <= F <= 1")
    parser.add_argument("--no-faults", dest="faults", action="store_false",
                        help="disable the 503-once responses")
    parser.add_argument("--no-validators", dest="validators", action="store_false",
                        help="send no ETag / Last-Modified, never 304")
    parser.add_argument("--no-validators-every", type=_non_negative, default=NO_VALIDATORS_EVERY,
                        help="product pages whose ID is a multiple of N send no validators "
                             "(0: every page sends them)")
    parser.add_argument("--page-kb", type=_non_negative, default=0,
                        help="about this many KiB of extra markup on each product page")
    parser.add_argument("--exit-on-stdin-eof", action="store_true",
                        help="stop when stdin closes (used by DemoSite so no orphan survives)")
    return parser.parse_args(argv)


def _base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def main(argv: list[str] | None = None) -> int:
    """Serve the demo site until SIGTERM/SIGINT; print the URL line first."""
    args = parse_args(argv)
    from twisted.internet import reactor

    config = SiteConfig(args.products, args.per_page, args.latency_ms, args.faults,
                        args.validators, args.no_validators_every, args.page_kb,
                        args.latency_jitter)
    port = reactor.listenTCP(args.port, build_site(config, reactor), backlog=1024,
                             interface=args.host)
    print(URL_PREFIX + _base_url(args.host, port.getHost().port), flush=True)
    _install_stop_triggers(reactor, args.exit_on_stdin_eof)
    reactor.run(installSignalHandlers=False)
    return 0


def _install_stop_triggers(reactor, watch_stdin: bool) -> None:
    """Stop on SIGTERM/SIGINT (even if SIGINT was ignored by a shell) and optionally stdin EOF."""

    def stop() -> None:
        if reactor.running:
            reactor.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: reactor.callFromThread(stop))
    if watch_stdin:
        def wait_for_eof() -> None:
            # os.read, not sys.stdin: a daemon thread blocked in a buffered reader
            # aborts the interpreter at shutdown.
            while os.read(sys.stdin.fileno(), 4096):
                pass
            reactor.callFromThread(stop)

        threading.Thread(target=wait_for_eof, daemon=True).start()


# --------------------------------------------------------------------------- subprocess


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoSite:
    """The demo site running in a subprocess (``sys.executable -m devtools.demo.site``).

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``url`` ends with ``/``.
    """

    def __init__(self, products: int = 60, per_page: int = 10, latency_ms: int = 0,
                 faults: bool = True, host: str = "127.0.0.1",
                 start_timeout: float = 20.0, validators: bool = True,
                 no_validators_every: int = NO_VALIDATORS_EVERY, page_kb: int = 0,
                 latency_jitter: float = 0.0) -> None:
        self.products, self.per_page, self.latency_ms = products, per_page, latency_ms
        self.faults, self.host, self.start_timeout = faults, host, start_timeout
        self.validators, self.no_validators_every = validators, no_validators_every
        self.page_kb, self.latency_jitter = page_kb, latency_jitter
        self.url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def command(self) -> list[str]:
        """The argv used to launch the subprocess."""
        cmd = [sys.executable, "-m", "devtools.demo.site", "--host", self.host,
               "--port", "0", "--products", str(self.products),
               "--per-page", str(self.per_page), "--latency-ms", str(self.latency_ms),
               "--exit-on-stdin-eof"]
        if not self.validators:
            cmd.append("--no-validators")
        if self.no_validators_every != NO_VALIDATORS_EVERY:
            cmd += ["--no-validators-every", str(self.no_validators_every)]
        if self.page_kb:
            cmd += ["--page-kb", str(self.page_kb)]
        if self.latency_jitter:
            cmd += ["--latency-jitter", str(self.latency_jitter)]
        return cmd if self.faults else cmd + ["--no-faults"]

    def start(self) -> DemoSite:
        """Launch the server and wait for its URL line; raise ``RuntimeError`` on failure."""
        if self._proc is not None:
            raise RuntimeError("DemoSite already started")
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, env=self._env(), text=True, encoding="utf-8")
        threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True).start()
        try:
            self.url = self._await_url()
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _env() -> dict[str, str]:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return env

    def _pump(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def _await_url(self) -> str:
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(self._failure(f"no URL after {self.start_timeout}s")) from None
            if line is None:
                code = self._proc.wait(timeout=5)
                raise RuntimeError(self._failure(f"process exited with code {code}"))
            if line.startswith(URL_PREFIX):
                return line[len(URL_PREFIX):].strip()

    def _failure(self, reason: str) -> str:
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace").strip()
        return f"demo site failed to start ({reason}): {' '.join(self.command())}\n{err}"

    def stop(self) -> int | None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s); return its exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        proc.stdin.close()
        proc.stdout.close()
        self._stderr.close()
        return code

    @property
    def running(self) -> bool:
        """True while the subprocess is alive."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _request(self, path: str, method: str = "GET") -> bytes:
        if self.url is None:
            raise RuntimeError("DemoSite not started")
        req = urllib.request.Request(self.url + path, method=method,
                                     data=b"" if method == "POST" else None)
        with _NO_PROXY.open(req, timeout=10) as response:
            return response.read()

    def stats(self) -> dict[str, int]:
        """``{path: hits}`` from ``/__stats``."""
        return json.loads(self._request("__stats"))

    def reset(self) -> None:
        """Clear the hit counters and the 503-once state (POST ``/__reset``)."""
        self._request("__reset", method="POST")

    def served(self) -> dict:
        """``{"paths": {path: {status: count}}, "body_bytes": N}`` from ``/__served``."""
        return json.loads(self._request("__served"))

    def change(self, ids) -> None:
        """Move products *ids* to their next revision (their pages change)."""
        self._request("__change?ids=" + ",".join(map(str, ids)), method="POST")

    def remove(self, ids) -> None:
        """Make products *ids* answer 410 Gone."""
        self._request("__gone?ids=" + ",".join(map(str, ids)), method="POST")


if __name__ == "__main__":
    sys.exit(main())
