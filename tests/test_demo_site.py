"""Tests for the deterministic demo site (real server in a subprocess, no mocks)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from decimal import Decimal

import pytest
from scrapy import Selector

from devtools.demo.site import (
    DEAD_PRODUCT_ID, DemoSite, catalog, clean_text, expected_items, product,
)

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, method: str = "GET") -> tuple[int, str]:
    """Return (status, body text) without raising on 4xx/5xx."""
    try:
        with _OPENER.open(urllib.request.Request(url, method=method), timeout=10) as resp:
            return resp.status, resp.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8")


def page(site: DemoSite, path: str) -> Selector:
    status, text = fetch(site.url + path.lstrip("/"))
    assert status == 200, path
    return Selector(text=text)


# ----------------------------------------------------------------- reference parsers

_SYMBOLS = {"$": "USD", "USD": "USD", "€": "EUR", "EUR": "EUR", "£": "GBP", "¥": "JPY"}


def parse_price(raw: str) -> tuple[Decimal, str]:
    """Independent parser used to check that raw prices match their clean values."""
    currency = next(code for mark, code in _SYMBOLS.items() if mark in raw)
    number = re.sub(r"[^0-9.,]", "", raw)
    if "," in number and "." in number:
        number = number.replace(",", "")
    elif "," in number:
        tail = number.rsplit(",", 1)[1]
        number = number.replace(",", "") if len(tail) == 3 else number.replace(",", ".")
    return Decimal(number), currency


_DATE_FORMATS = ("%Y-%m-%d", "%d %B %Y", "%b %d, %Y", "%Y-%m-%dT%H:%M:%S%z", "%d.%m.%Y",
                 "%B %d, %Y %H:%M UTC")


def parse_date(raw: str) -> datetime:
    for fmt in _DATE_FORMATS:
        try:
            parsed = datetime.strptime(raw, fmt)
        except ValueError:
            continue
        return parsed.replace(tzinfo=parsed.tzinfo or timezone.utc).astimezone(timezone.utc)
    raise ValueError(raw)


# ----------------------------------------------------------------- pure data


def test_catalog_is_pure_and_deterministic():
    items = catalog(60)
    assert [p.id for p in items] == list(range(1, 61))
    assert items == catalog(60)
    assert product(42, 60) == items[41]
    with pytest.raises(ValueError):
        product(61, 60)


def test_catalog_clean_values_match_raw_values():
    items = catalog(210)
    for p in items:
        assert p.title == clean_text(p.raw_title)
        assert parse_price(p.raw_price) == (p.price, p.currency), p.raw_price
        assert parse_date(p.raw_date) == p.published, p.raw_date
        assert p.published.tzinfo is timezone.utc
    assert {p.currency for p in items} == {"USD", "EUR", "GBP", "JPY"}
    assert any("\u00a0" in p.raw_price for p in items)
    assert any("+02:00" in p.raw_date for p in items)
    raw_titles = "".join(p.raw_title for p in items)
    for entity in ("&amp;", "&nbsp;", "&quot;", "&#39;", "&eacute;", "\n", "\t", "  "):
        assert entity in raw_titles
    assert len({p.title for p in items}) == len(items)


def test_clean_text_example():
    assert clean_text("  Deluxe&nbsp;Widget \n &amp; Co.  No. 7 ") == "Deluxe Widget & Co. No. 7"


def test_catalog_faults_js_and_related():
    items = catalog(60)
    assert [p.id for p in items if p.flaky] == [17, 34, 51]
    assert [p.id for p in items if p.js] == [7]
    for p in items:
        assert 3 <= len(p.related) <= 5
        assert all(1 <= j <= 60 and j != p.id for j in p.related)
    assert any(len(set(p.related)) < len(p.related) for p in items)
    all_related = [j for p in items for j in p.related]
    assert len(set(all_related)) < len(all_related) / 2
    assert 7 in all_related


def test_expected_items():
    expected = expected_items("http://127.0.0.1:1234/", 60)
    assert len(expected) == 60
    assert f"http://127.0.0.1:1234/product/{DEAD_PRODUCT_ID}" not in expected
    p = product(5, 60)
    assert expected["http://127.0.0.1:1234/product/5"] == {
        "title": p.title, "price": p.price, "currency": p.currency, "published": p.published}


def test_module_import_does_not_install_a_reactor():
    code = "import sys, devtools.demo.site; print('twisted.internet.reactor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------- HTTP


def test_listing_pagination_reaches_all_products(site):
    path, seen, pages = "/", [], 0
    while path:
        sel = page(site, path)
        links = sel.css("a.product::attr(href)").getall()
        assert (f"/product/{DEAD_PRODUCT_ID}" in links) == (pages == 0)
        seen += links
        pages += 1
        path = sel.css('a.next[rel="next"]::attr(href)').get()
    assert pages == 6
    assert sorted(seen) == sorted([f"/product/{i}" for i in range(1, 61)]
                                  + [f"/product/{DEAD_PRODUCT_ID}"])
    assert page(site, "/list/2").css("a.prev::attr(href)").get() == "/"
    assert page(site, "/list/1").css("a.product::attr(href)").getall() == seen[:11]


def test_product_page_carries_raw_values(site):
    p = product(12, 60)
    status, text = fetch(site.url + "product/12")
    assert status == 200
    assert f'<h1 class="title">{p.raw_title}</h1>' in text
    assert f'<span class="price">{p.raw_price}</span>' in text
    assert f'<time class="published">{p.raw_date}</time>' in text
    sel = Selector(text=text)
    assert clean_text(sel.css("h1.title::text").get()) == p.title
    assert sel.css("time.published::attr(datetime)").get() is None
    assert sel.css("div.description::text").get() == p.description
    assert sel.css("a.related::attr(href)").getall() == [f"/product/{j}" for j in p.related]


def test_flaky_product_answers_503_once(site):
    url = site.url + "product/17"
    assert [fetch(url)[0] for _ in range(3)] == [503, 200, 200]
    assert fetch(site.url + "product/16")[0] == 200
    assert site.stats()["/product/17"] == 3
    site.reset()
    assert fetch(url)[0] == 503


def test_dead_link_and_unknown_paths_404(site):
    for path in (f"product/{DEAD_PRODUCT_ID}", "product/61", "product/0", "product/07",
                 "list/7", "list/0", "nope", "product/1/"):
        assert fetch(site.url + path)[0] == 404, path
    assert site.stats()[f"/product/{DEAD_PRODUCT_ID}"] == 1


def test_js_page_has_no_data_in_markup(site):
    p = product(7, 60)
    status, text = fetch(site.url + "product/7")
    assert status == 200
    sel = Selector(text=text)
    assert not sel.css("h1.title, span.price, time.published")
    for value in (p.raw_title, p.title, p.raw_price, p.raw_date, "class=\"title\""):
        assert value not in text
    script = sel.css("script::text").get()
    assert "setTimeout" in script and "50)" in script and 'getElementById("app")' in script
    assert sel.css("div#app")
    listing = page(site, "/")
    assert listing.css('a[href="/product/7"]::attr(data-render)').get() == "js"
    assert listing.css('a[href="/product/6"]::attr(data-render)').get() is None
    referrer = next(q for q in catalog(60) if 7 in q.related and not q.flaky and not q.js)
    related = page(site, referrer.path).css('a.related[href="/product/7"]')
    assert related and set(related.css("::attr(data-render)").getall()) == {"js"}


def test_robots_txt_allows_all(site):
    status, text = fetch(site.url + "robots.txt")
    assert status == 200 and "User-agent: *" in text and "Disallow: /" not in text


def test_stats_count_per_path_and_reset(site):
    for path in ("", "", "list/2", "product/3", "nope"):
        fetch(site.url + path)
    fetch(site.url + "__stats")
    assert site.stats() == {"/": 2, "/list/2": 1, "/product/3": 1, "/nope": 1}
    assert fetch(site.url + "__reset")[0] == 200  # GET works too
    assert site.stats() == {}


def test_latency_delays_responses():
    with DemoSite(products=20, latency_ms=200) as slow:
        started = time.monotonic()
        assert fetch(slow.url + "product/1")[0] == 200
        assert time.monotonic() - started >= 0.2


def test_latency_jitter_draws_each_latency_within_its_bounds():
    """--latency-jitter: each page's latency uniformly in latency x (1 ± F), on
    Twisted's test clock (no waiting); a bad fraction is refused."""
    from twisted.internet.task import Clock
    from twisted.web.test.requesthelper import DummyRequest

    from devtools.demo.site import DemoResource, SiteConfig, parse_args

    def delays(jitter):
        clock = Clock()
        resource = DemoResource(SiteConfig(products=20, latency_ms=100, faults=False,
                                           latency_jitter=jitter), clock)
        for i in range(200):
            request = DummyRequest([b"product", str(1 + i % 20).encode()])
            request.path = f"/product/{1 + i % 20}".encode()
            resource.render(request)
        return [call.getTime() for call in clock.getDelayedCalls()]

    fixed, jittered = delays(0.0), delays(0.3)
    assert set(fixed) == {0.1}
    assert min(jittered) >= 0.07 and max(jittered) <= 0.13
    assert max(jittered) - min(jittered) > 0.04         # spread over the range, not one value
    assert delays(0.3) == jittered                      # the same draws every run
    assert parse_args(["--latency-jitter", "0.25"]).latency_jitter == 0.25
    for bad in ("1.5", "-0.1", "x"):
        with pytest.raises(SystemExit):
            parse_args(["--latency-jitter", bad])


def test_large_catalog_without_faults():
    with DemoSite(products=50_000, faults=False) as big:
        started = time.monotonic()
        sel = page(big, "/list/5000")
        assert sel.css("a.product::attr(href)").getall() == [
            f"/product/{i}" for i in range(49_991, 50_001)]
        assert not sel.css("a.next")
        assert page(big, "/product/49997").css("h1.title")  # flaky id, faults disabled
        product_page = page(big, "/product/50000")
        assert clean_text(product_page.css("h1.title::text").get()) == product(50_000, 50_000).title
        assert time.monotonic() - started < 30  # no O(catalogue) work per page, even under load
        assert fetch(big.url + "list/5001")[0] == 404
        code = big.stop()
    assert code == 0


def test_start_failure_is_reported():
    with pytest.raises(RuntimeError, match="exited with code 2"):
        DemoSite(per_page=0).start()


def test_server_exits_when_parent_closes_stdin():
    demo = DemoSite(products=10).start()
    proc = demo._proc  # white-box: simulate the parent dying without calling stop()
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    demo.stop()


def _get(url: str, **headers) -> tuple[int, dict, bytes]:
    try:
        with _OPENER.open(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_validators_304_revisions_and_gone_products():
    from devtools.demo.site import NO_VALIDATORS_EVERY

    with DemoSite(products=20, per_page=5) as site:
        url = site.url + "product/3"
        status, headers, body = _get(url)
        etag, modified = headers["ETag"], headers["Last-Modified"]
        assert status == 200 and body and etag.startswith('"')
        assert _get(url, **{"If-None-Match": etag})[0] == 304
        assert _get(url, **{"If-None-Match": '"other"'})[0] == 200
        assert _get(url, **{"If-Modified-Since": modified})[0] == 304
        # If-None-Match decides when both are sent (RFC 9110).
        assert _get(url, **{"If-None-Match": '"other"', "If-Modified-Since": modified})[0] == 200
        site.change([3])
        status, headers, body = _get(url, **{"If-None-Match": etag})
        assert status == 200 and b"(revision 1)" in body and headers["ETag"] != etag
        assert _get(url, **{"If-Modified-Since": modified})[0] == 200   # Last-Modified moved
        no_validators = site.url + f"product/{NO_VALIDATORS_EVERY}"
        status, headers, _ = _get(no_validators, **{"If-None-Match": "*"})
        assert status == 200 and "ETag" not in headers and "Last-Modified" not in headers
        site.remove([4])
        assert _get(site.url + "product/4")[0] == 410
        served = site.served()
        assert served["paths"]["/product/3"] == {"200": 5, "304": 2}
        assert served["paths"]["/product/4"] == {"410": 1}
        assert served["body_bytes"] > 0
        site.reset()   # counters go; revisions and gone products stay
        assert site.served() == {"paths": {}, "body_bytes": 0}
        assert b"(revision 1)" in _get(url)[2] and _get(site.url + "product/4")[0] == 410
    with DemoSite(products=10, per_page=5, validators=False) as plain:
        status, headers, _ = _get(plain.url + "product/3", **{"If-None-Match": "*"})
        assert status == 200 and "ETag" not in headers
