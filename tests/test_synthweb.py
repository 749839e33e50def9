"""The synthetic web's own tests (issue 46): each behaviour answers as its
table row says, the ground truth is what the table says, the request log
records what came, and the scorer counts what it claims to. No crawl: the
crawler's behaviour on these sites is tested by the tests of each part.

One :class:`SyntheticWeb` (every row of the catalogue) serves the module,
in a thread of the test process; requests are plain ``http.client`` calls
(no redirect following, no decompression: the raw answers), https verified
against the web's own certificate.
"""

from __future__ import annotations

import gzip
import http.client
import re
import socket
import ssl
import time
import tomllib
import zlib
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlsplit

import brotli
import pytest

from devtools.synthweb import table as T
from devtools.synthweb.behaviours import Kind, canonical, home_links
from devtools.synthweb.check import politeness, score
from devtools.synthweb.server import Hit, SyntheticWeb
from devtools.synthweb.truth import (classify, expected_requests, ideal_seconds, limits,
                                     must_fetch, site_ideal_seconds)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def synth():
    with SyntheticWeb(T.web()) as running:
        yield running


def get(url: str, synth: SyntheticWeb, headers: dict | None = None, read: bool = True):
    """(status, headers as a dict of lists, body) of one raw request."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        context = ssl.create_default_context(cafile=str(synth.cert_file))
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=30,
                                           context=context)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""),
                     headers={"User-Agent": "synthweb-test", **(headers or {})})
        response = conn.getresponse()
        found: dict[str, list[str]] = {}
        for key, value in response.getheaders():
            found.setdefault(key.lower(), []).append(value)
        return response.status, found, response.read() if read else b""
    finally:
        conn.close()


def hrefs(body: bytes) -> list[str]:
    return re.findall(r'href="([^"]+)"', body.decode())


def follow(url: str, synth, max_hops: int = 10) -> list[tuple[str, int]]:
    """Every (url, status) of a redirect chain from *url*, at most *max_hops* hops."""
    seen = []
    for _ in range(max_hops + 1):
        status, headers, _ = get(url, synth)
        seen.append((url, status))
        if status not in (301, 302):
            break
        location = headers["location"][0]
        url = location if "://" in location else f"{url.split('/', 3)[0]}//{urlsplit(url).netloc}{location}"
    return seen


# -- robots.txt ---------------------------------------------------------------------


def test_robots_direct_gzip_and_huge(synth):
    status, headers, body = get(synth.site("control").url("/robots.txt"), synth)
    assert status == 200 and b"Disallow: /private/" in body
    status, headers, body = get(synth.site("robots-gzip").url("/robots.txt"), synth)
    assert headers["content-encoding"] == ["gzip"]
    assert b"Disallow: /private/" in gzip.decompress(body)
    _, _, body = get(synth.site("robots-huge").url("/robots.txt"), synth)
    assert len(body) > 500 * 1024 and body.startswith(b"User-agent: *\nDisallow: /private/")
    assert body.index(b"Disallow: /late/") > 500 * 1024
    # the bomb: the rules, then 64 MiB once decompressed, from ~64 KiB on the wire
    _, headers, body = get(synth.site("robots-gzip-bomb").url("/robots.txt"), synth)
    assert headers["content-encoding"] == ["gzip"] and len(body) < 256 * 1024
    inflater = zlib.decompressobj(31)
    first = inflater.decompress(body, 4096)
    size = len(first)
    while inflater.unconsumed_tail:
        size += len(inflater.decompress(inflater.unconsumed_tail, 2**20))
    assert first.startswith(b"User-agent: *\nDisallow: /private/") and size == T.BOMB_BYTES


def test_robots_redirects(synth):
    same = synth.site("robots-redirect-same")
    assert follow(same.url("/robots.txt"), synth) == [
        (same.url("/robots.txt"), 301), (same.url("/robots-2024.txt"), 200)]
    other = synth.site("robots-redirect-other")
    chain = follow(other.url("/robots.txt"), synth)
    assert chain[1] == (synth.first.url("/robots-for/robots-redirect-other.txt"), 200)
    scheme = synth.site("scheme")
    assert [u for u, _ in follow(scheme.url("/robots.txt", "http"), synth)] == [
        scheme.url("/robots.txt", "http"), scheme.url("/robots.txt", "https")]
    assert len(follow(synth.site("robots-chain").url("/robots.txt"), synth)) == 4   # 3 hops
    chain6 = follow(synth.site("robots-chain6").url("/robots.txt"), synth)
    assert len(chain6) == 7 and chain6[-1][1] == 200                                # 6 hops
    loop = follow(synth.site("robots-loop").url("/robots.txt"), synth, max_hops=5)
    assert [urlsplit(u).path for u, _ in loop[:4]] == ["/robots.txt", "/r/a", "/r/b", "/r/a"]
    assert all(status == 302 for _, status in loop)


def test_robots_errors_recovery_and_slow(synth, monkeypatch):
    monkeypatch.setattr(T, "ROBOTS_SLOW_S", 0.3)   # read at each answer: a shorter test
    synth.reset()
    assert get(synth.site("robots-404").url("/robots.txt"), synth)[0] == 404
    assert get(synth.site("robots-403").url("/robots.txt"), synth)[0] == 403
    five = synth.site("robots-5xx").url("/robots.txt")
    assert [get(five, synth)[0] for _ in range(T.ROBOTS_5XX_COUNT + 2)] == [
        503] * T.ROBOTS_5XX_COUNT + [200, 200]
    started = time.monotonic()
    status, _, body = get(synth.site("robots-slow").url("/robots.txt"), synth)
    assert status == 200 and b"Disallow" in body
    assert time.monotonic() - started >= T.ROBOTS_SLOW_S
    synth.reset()   # the counters start again
    assert get(five, synth)[0] == 503


# -- sites and pages ----------------------------------------------------------------


def test_home_pages_aliases_and_schemes(synth):
    status, _, body = get(synth.site("control").url("/"), synth)
    assert status == 200
    assert hrefs(body) == [f"/p/{i}" for i in range(1, 9)] + ["/private/1"]
    apex, www = synth.site("apex"), synth.site("www")
    assert follow(apex.url("/p/2?x=1"), synth) == [(apex.url("/p/2?x=1"), 301),
                                                   (www.url("/p/2?x=1"), 200)]
    scheme = synth.site("scheme")
    assert scheme.seed().startswith("http://")
    assert follow(scheme.seed(), synth) == [(scheme.seed(), 301), (scheme.url("/"), 200)]
    assert scheme.url("/").startswith("https://")
    assert set(synth.seeds()) == {s.seed() for s in synth.sites.values() if s.spec.seed}
    assert www.url("/") not in synth.seeds() and apex.url("/") in synth.seeds()


def test_redirect_chain_and_loop_between_sites(synth):
    site = synth.site("redirect-chain")
    entry = [h for h in hrefs(get(site.url("/"), synth)[2]) if h.startswith("/_r/")][0]
    chain = follow(site.url(entry), synth)
    assert [synth.site_of(urlsplit(u).netloc).name for u, _ in chain] == [
        "redirect-chain", "hop-a", "hop-b", "redirect-chain"]
    assert chain[-1] == (site.url("/_r/end"), 200)
    loop_site = synth.site("redirect-loop")
    entry = [h for h in hrefs(get(loop_site.url("/"), synth)[2]) if h.startswith("/_loop/")][0]
    loop = follow(loop_site.url(entry), synth, max_hops=4)
    assert [synth.site_of(urlsplit(u).netloc).name for u, _ in loop] == [
        "redirect-loop", "hop-a", "redirect-loop", "hop-a", "redirect-loop"]
    assert all(status == 302 for _, status in loop)


def test_traps(synth):
    cal = synth.site("calendar")
    assert hrefs(get(cal.url("/cal/2026/1"), synth)[2]) == [
        "/cal/2025/12", "/cal/2026/2", "/event/2026-1"]
    assert hrefs(get(cal.url("/cal/3000/12"), synth)[2]) == ["/cal/3000/11", "/cal/3001/1"]
    repeat = synth.site("repeat")
    assert hrefs(get(repeat.url("/loop/x/x/x/x/"), synth)[2])[0] == "x/"
    long = synth.site("longurl")
    path = hrefs(get(long.url("/"), synth)[2])[-1]
    assert len(path) == 64
    for _ in range(7):   # 64 -> 8192, served every time (the crawler must stop)
        status, _, body = get(long.url(path), synth)
        assert status == 200
        path = hrefs(body)[0]
    assert len(path) == 64 * 2**7
    session = synth.site("sessionid")
    first, second = (hrefs(get(session.url("/s/1"), synth)[2]) for _ in range(2))
    assert first[:3] != second[:3] and [canonical(h) for h in first[:3]] == ["/s/1", "/s/2", "/s/3"]
    assert get(session.url(first[0]), synth)[0] == 200   # ;jsessionid= in the path
    flood = get(synth.site("flood").url("/flood"), synth)[2]
    assert flood.count(b'<a href="/f/') == T.FLOOD_LINKS


def test_bombs_and_headers(synth):
    site = synth.site("bombs")
    _, headers, body = get(site.url("/bomb-gzip"), synth)
    assert headers["content-encoding"] == ["gzip"] and len(body) < 256 * 1024
    inflater, size = zlib.decompressobj(31), 0
    size += len(inflater.decompress(body, 2**20))
    while inflater.unconsumed_tail:
        size += len(inflater.decompress(inflater.unconsumed_tail, 2**20))
    assert size == T.BOMB_BYTES
    _, headers, body = get(site.url("/bomb-br"), synth)
    assert headers["content-encoding"] == ["br"] and len(body) < 1024
    assert len(brotli.decompress(body)) == T.BOMB_BYTES
    # 10,000 headers: read raw (http.client refuses more than 100)
    head = raw_head(synth.site("headers").url("/headers"))
    assert head.startswith(b"HTTP/1.1 200") and head.count(b"\r\nX-Pad-") == T.HEADER_COUNT


def raw_head(url: str) -> bytes:
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                     "Connection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
    return data.split(b"\r\n\r\n", 1)[0]


def test_drip_sends_bytes_slowly(synth):
    parts = urlsplit(synth.site("drip").url("/drip"))
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"GET /drip HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        data = b""
        while b"<html><body>" not in data:
            data += sock.recv(4096)
        assert data.startswith(b"HTTP/1.1 200") and b"Content-Length" not in data
        started = time.monotonic()
        sock.recv(4096)   # the next byte comes one interval later
        assert time.monotonic() - started >= T.DRIP_INTERVAL_S * 0.8
    hit = synth.wait_for(lambda hits: any(h.target == "/drip" and h.done for h in hits), 10)
    assert [h for h in hit if h.target == "/drip"][-1].status == 200


def test_gone_retry_after_cookies(synth):
    synth.reset()
    gone = synth.site("gone")
    assert get(gone.url("/gone/404"), synth)[0] == 404
    assert get(gone.url("/gone/410"), synth)[0] == 410
    ra = synth.site("retry-after")
    answers = [get(ra.url("/p/1"), synth) for _ in range(T.RETRY_AFTER_COUNT + 1)]
    assert [a[0] for a in answers] == [429] * T.RETRY_AFTER_COUNT + [200]
    assert answers[0][1]["retry-after"] == [str(T.RETRY_AFTER_S)]
    assert get(ra.url("/robots.txt"), synth)[0] == 200   # robots.txt is not throttled
    cookies = synth.site("cookies")
    status, headers, _ = get(cookies.url("/p/1"), synth)
    assert status == 302 and headers["location"] == ["/p/1"]
    assert headers["set-cookie"][0].startswith("synth=1")
    assert get(cookies.url("/p/1"), synth, {"Cookie": "synth=1"})[0] == 200
    assert get(cookies.url("/robots.txt"), synth)[0] == 200


def test_meta_robots_and_sitemaps(synth):
    meta = synth.site("meta")
    _, _, body = get(meta.url("/meta/nofollow"), synth)
    assert b'<meta name="robots" content="nofollow">' in body and hrefs(body) == ["/meta/nf/1"]
    _, _, body = get(meta.url("/meta/noindex"), synth)
    assert b'content="noindex"' in body
    assert get(meta.url("/meta/x-noindex"), synth)[1]["x-robots-tag"] == ["noindex"]
    assert get(meta.url("/meta/x-nofollow"), synth)[1]["x-robots-tag"] == ["nofollow"]
    site = synth.site("sitemap")
    robots = get(site.url("/robots.txt"), synth)[2].decode()
    index_url = re.search(r"Sitemap: (\S+)", robots).group(1)
    index = get(index_url, synth)[2].decode()
    sitemap_url = re.search(r"<loc>(\S+?)</loc>", index).group(1)
    urls = re.findall(r"<loc>(\S+?)</loc>", get(sitemap_url, synth)[2].decode())
    assert urls == [site.url(p) for p in ("/p/1", "/orphan/1", "/orphan/2")]
    assert all(get(u, synth)[0] == 200 for u in urls)
    assert "/orphan/1" not in get(site.url("/"), synth)[2].decode()


def test_https_certificate_names_every_address(synth):
    """A client that verifies (hostname = the IP) accepts every site's https origin."""
    for name in ("control", "scheme", "meta"):
        assert get(synth.site(name).url("/", "https"), synth)[0] == 200


# -- the request log ---------------------------------------------------------------------


def test_request_log(synth):
    synth.reset()
    site = synth.site("control")
    get(site.url("/p/1?q=1"), synth, {"Referer": "http://x.test/"})
    get(site.url("/nowhere"), synth)
    hits = synth.hits("control")
    assert [(h.method, h.target, h.status, h.scheme) for h in hits] == [
        ("GET", "/p/1?q=1", 200, "http"), ("GET", "/nowhere", 404, "http")]
    first = hits[0]
    assert first.headers["user-agent"] == "synthweb-test"
    assert first.headers["referer"] == "http://x.test/"
    assert first.peer.startswith("127.0.0.1:") and first.t <= first.done <= hits[1].t
    assert synth.hits("meta") == [] and len(synth.hits()) == 2
    synth.reset()
    assert synth.hits() == []


# -- the ground truth -----------------------------------------------------------------


def test_ground_truth_follows_the_table(synth):
    kind = lambda site, target: classify(synth.site(site), target)  # noqa: E731
    for name, applies in [("control", True), ("robots-redirect-same", True),
                          ("robots-redirect-other", True), ("scheme", True),
                          ("robots-chain", True), ("robots-5xx", True), ("robots-slow", True),
                          ("robots-gzip", True), ("robots-huge", True),
                          ("robots-chain6", False), ("robots-loop", False),
                          ("robots-404", False), ("robots-403", False)]:
        assert kind(name, "/private/1") is (Kind.FORBIDDEN if applies else Kind.REQUIRED), name
    assert kind("robots-gzip-bomb", "/private/1") is Kind.OPTIONAL
    assert kind("robots-huge", "/late/1") is Kind.OPTIONAL
    assert kind("meta", "/meta/nf/1") is kind("meta", "/meta/xnf/1") is Kind.FORBIDDEN
    assert kind("meta", "/meta/noindex") is kind("meta", "/meta/x-noindex") is Kind.NOINDEX
    assert kind("meta", "/meta/ni/1") is kind("meta", "/meta/nofollow") is Kind.REQUIRED
    assert kind("calendar", "/cal/2026/3") is Kind.REQUIRED
    assert kind("calendar", "/cal/2026/4") is kind("calendar", "/cal/1999/1") is Kind.TRAP
    assert [kind("repeat", "/loop/" + "x/" * k) for k in (1, 2, 3)] == [
        Kind.REQUIRED, Kind.OPTIONAL, Kind.FORBIDDEN]
    assert kind("longurl", "/long/" + "a" * 4000) is Kind.FORBIDDEN
    assert kind("sessionid", "/s/2?PHPSESSID=abc") is Kind.REQUIRED
    assert canonical("/s/1;jsessionid=AB?sid=1&x=2") == "/s/1?x=2"
    assert kind("bombs", "/bomb-br") is kind("drip", "/drip") is Kind.HOSTILE
    assert kind("gone", "/gone/410") is Kind.GONE
    assert kind("redirect-chain", "/_r/end") is Kind.REQUIRED
    assert kind("hop-a", "/_r/hop-b/redirect-chain/end") is Kind.OPTIONAL
    assert kind("hop-a", "/_loop/hop-a/redirect-loop") is Kind.TRAP
    assert kind("apex", "/p/1") is Kind.OPTIONAL           # only redirects
    must = must_fetch(synth)
    assert ("www", "/p/4") in must and not any(s == "apex" for s, _ in must)
    assert ("sitemap", "/orphan/1") not in must
    assert ("robots-redirect-same", "/private/1") not in must
    assert ("robots-404", "/private/1") in must
    assert limits(synth.site("crawl-delay").spec, 1.0, 2).interval_s == 2.0
    assert limits(synth.site("control").spec, 3.0, 2).interval_s == 3.0
    # the ideal: the slowest site's requests, one interval apart
    control = synth.site("control")
    assert expected_requests(control) >= 1 + 1 + 8 + 1  # robots, home, pages, robots-for of others
    ideal, slowest = ideal_seconds(synth, 1.0, 2)
    assert ideal >= (expected_requests(control) - 1) and slowest in synth.sites
    # a drip lasts the crawler's download deadline: no crawl ends before it
    assert "drip" in synth.sites
    assert ideal_seconds(synth, 1.0, 2, 0.0, 600.0) == (
        site_ideal_seconds(synth.site("drip"), 1.0, 2, 0.0, 600.0), "drip")
    assert ideal_seconds(synth, 1.0, 2, 0.0, 600.0)[0] >= 600.0


def test_sitemap_pages_required_when_the_spider_reads_sitemaps():
    web = SyntheticWeb(T.web(names=("control", "sitemap")), sitemaps=True)   # not started
    assert ("sitemap", "/orphan/1") in must_fetch(web)


def test_table_rows_are_checked():
    with pytest.raises(ValueError):
        T.SiteSpec("x", robots="nope")
    with pytest.raises(ValueError):
        T.SiteSpec("x", features=("nope",))
    names = [s.name for s in T.web(3)]
    assert names == ["control", "robots-redirect-same", "robots-redirect-other"]
    assert {"www", "control"} <= {s.name for s in T.web(names=("apex",))}
    assert len(T.web(len(T.catalogue()) + 3)) == len(T.catalogue()) + 3


# -- the scorer ---------------------------------------------------------------------------


def test_score_counts_what_it_claims(synth):
    """A crawl done by hand: every must-fetch page once -> all floors met; then a
    disallowed page, a second fetch and a wrong item are each counted."""
    small = SyntheticWeb(T.web(names=("control", "meta", "gone")))
    with small:
        must = must_fetch(small)
        for site_name, path in sorted(must):
            get(small.site(site_name).url(path), small)
        hits = small.hits()
        stored = [small.site(s).url(p) for (s, p), k in must.items() if k is Kind.REQUIRED]
        good = score(small, hits, stored, delay=0.0)
        assert (good["fetched_ratio"], good["forbidden"], good["duplicates"],
                good["stored_ratio"], good["wrongly_stored"]) == (1.0, 0, 0, 1.0, 0)
        get(small.site("control").url("/private/1"), small)
        get(small.site("meta").url("/meta/nf/1"), small)
        get(small.site("control").url("/p/2"), small, {"Authorization": "Basic dXNlcjpzZWNyZXQ="})
        get(small.site("control").url("/"), small)
        with_userinfo = small.site("gone").url("/").replace("://", "://user:secret@")
        bad = score(small, small.hits(), stored + [small.site("meta").url("/meta/noindex"),
                                                   with_userinfo], delay=0.0)
        assert (bad["forbidden"], bad["duplicates"], bad["seed_refetches"],
                bad["wrongly_stored"]) == (2, 2, 1, 1)
        assert (bad["credentials_sent"], bad["credentials_stored"]) == (1, 1)
        partial = score(small, hits[1:], stored[1:], delay=0.0)
        assert partial["fetched_ratio"] < 1.0 and partial["stored_ratio"] < 1.0


def test_politeness_figures():
    web = SyntheticWeb(T.web(names=("control",)))
    site = web.site("control")

    def hit(t, done, status=200, retry_after=None):
        return Hit(t, "control", "http", "GET", "/", "", {}, status, done,
                   {"Retry-After": retry_after} if retry_after else {})

    polite = politeness(site, [hit(0, 0.1), hit(1.0, 1.1), hit(2.5, 2.6)], 1.0, 2)
    assert polite["peak_over_limit"] == pytest.approx(1.0) and polite["in_flight"] == 1
    early = politeness(site, [hit(0, 0.1), hit(0.5, 0.6)], 1.0, 2)
    assert early["peak_over_limit"] == pytest.approx(2.0)
    crowded = politeness(site, [hit(0, 5), hit(1, 5), hit(2, 5)], 1.0, 2)
    assert crowded["in_flight"] == 3 and crowded["peak_over_limit"] == pytest.approx(1.5)
    blocked = politeness(site, [hit(0, 0.1, 429, "3"), hit(1.1, 1.2)], 1.0, 2)
    assert blocked["retry_after_ratio"] == pytest.approx(1 / 3)


def test_a_crawl_delay_binds_from_when_its_robots_txt_was_served():
    """robots.txt and the hops of its redirects go before anyone can know the
    Crawl-delay: they keep the base interval; every request after it is due
    the site's Crawl-delay (2 s here)."""
    site = SyntheticWeb(T.web(names=("crawl-delay",))).site("crawl-delay")

    def hit(t, target, status=200):
        return Hit(t, "crawl-delay", "http", "GET", target, "", {}, status, t + 0.01, {})

    moved = [hit(0, "/robots.txt", 301), hit(1.0, "/robots-2024.txt")]
    assert politeness(site, moved + [hit(3.0, "/")], 1.0, 2)["peak_over_limit"] == \
        pytest.approx(1.0)
    assert politeness(site, moved + [hit(2.0, "/")], 1.0, 2)["peak_over_limit"] == \
        pytest.approx(2.0)


def test_synthweb_is_not_shipped():
    """devtools/ (the synthetic web with it) is outside the package the wheel and the egg build."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"]["packages"]["find"]
    for module in ("devtools", "devtools.synthweb"):
        assert not any(fnmatch(module, pattern) for pattern in find["include"]), module


def test_host_names_and_their_spellings():
    """With host names, URLs name ``<site>.synth.test``; the hosts file a namespace
    mounts resolves the name and its trailing-dot spelling; every spelling of a
    site's origin (capitals, trailing dot, userinfo) is that site."""
    named = SyntheticWeb(T.web(names=("control", "host-variants")), hostnames=True)
    site = named.site("host-variants")
    site.ports.update(http=8080, https=8443)
    assert site.url("/p/1") == "http://host-variants.synth.test:8080/p/1"
    assert f"{site.address} host-variants.synth.test host-variants.synth.test." in (
        named.hosts_file().splitlines())
    entry = [h for h in home_links(site) if "://" in h]
    assert entry == ["http://host-variants.synth.test.:8080/p/1",
                     "http://HOST-VARIANTS.SYNTH.TEST:8080/p/2",
                     "http://user:secret@host-variants.synth.test:8080/p/3",
                     "http://host-variants.synth.test:8080/p/4#part"]
    assert {named.site_of(urlsplit(u).netloc) for u in entry} == {site}
    assert named.site_of(f"{site.address}:8080") is site
    assert named.site_of("control.synth.test:8080") is None      # not its port
    by_address = SyntheticWeb(T.web(names=("host-variants",)))
    plain = by_address.site("host-variants")
    assert not any(".:" in h for h in home_links(plain))          # no dotted address


def test_certificate_names_the_host_names():
    from cryptography import x509

    with SyntheticWeb(T.web(names=("control",)), hostnames=True) as named:
        cert = x509.load_pem_x509_certificate(named.cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["control.synth.test"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.40"]
