"""robots.txt for the cluster (crawlproject.robots): one fetch per site under the
site's limits, shared through Redis as records a node signed for their site, read
strictly; the real middleware on a real Redis with a stand-in engine (what it puts
in the frontier, what it downloads itself); real `scrapy crawl hosts` nodes
against the multi-host site (devtools.demo.hosts)."""

import asyncio
import base64
import json
import logging
import os
import time
import zlib
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from scrapy import Request, Spider, signals
from scrapy.exceptions import IgnoreRequest
from scrapy.http import TextResponse
from scrapy.utils.test import get_crawler

from crawlproject.keys import RobotsKeys, start_urls_key
from crawlproject.robots import record as rec
from crawlproject.robots.middleware import ClusterRobotsTxtMiddleware
from crawlproject.signing import Signer
from devtools.demo.hosts import DEFAULT_HOSTS, MultiHostSite, max_in_window
from tests.crawl_helpers import TEST_SECRET, Node, node_env

RULES, ALLOW_ALL, UNAVAILABLE = "rules", "allow_all", "unavailable"
BASE = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": True,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 16, "LOG_LEVEL": "INFO"}
SECRET = TEST_SECRET   # the real nodes' too (node_env)
SIGNER = Signer([SECRET.encode()], "hosts")
SITE, OTHER_SITE = "http://127.0.0.2:8001", "http://127.0.0.3:8001"
KEYS = RobotsKeys("hosts")
DISALLOW_P = b"User-agent: *\nDisallow: /p/\n"
NORMAL_P = b"user-agent: *\ndisallow: /p/\n"   # as a record keeps it
LOG = "crawlproject.robots.middleware"


def stored(origin, status, body=b"", *, signer=SIGNER, expires_in=3600.0, named=None):
    """A record as a node stores it, the format spelled out (signed JSON, the
    body zlib + base64), for *origin* (or naming *named*)."""
    now = time.time()
    data = json.dumps({"origin": named or origin, "status": status,
                       "body": base64.b64encode(zlib.compress(body)).decode(),
                       "fetched": now, "expires": now + expires_in, "keep": now + expires_in,
                       "failures": 0, "reason": ""}, separators=(",", ":"))
    return signer.sign(data, "robots")


# -- the stored record ------------------------------------------------------------

def test_a_record_round_trips_and_says_what_the_status_means():
    for status, state in ((200, RULES), (404, ALLOW_ALL), (401, ALLOW_ALL), (429, UNAVAILABLE),
                          (503, UNAVAILABLE), (0, UNAVAILABLE), (301, ALLOW_ALL)):
        record = rec.RobotsRecord(status, DISALLOW_P, 1.5, 2.5, SITE)
        assert rec.decode_record(rec.encode_record(record, SIGNER), SIGNER, SITE) == record
        assert record.state == state
    assert rec.decode_record(stored(SITE, 200, DISALLOW_P), SIGNER, SITE).body == DISALLOW_P
    rotated = Signer([b"the-next-secret-0123456789", SECRET.encode()], "hosts")
    assert rec.decode_record(stored(SITE, 404), rotated, SITE).status == 404


@pytest.mark.parametrize("data", [
    "", "null", "[]", "{}", '{"status": 200}',
    '{"status": 200, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "", "status": 200, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": "200", "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": true, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 700, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": 5, "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "not base64!", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "eJw=", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "", "fetched": 1, "expires": 1e999, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "", "fetched": -1, "expires": 2, "keep": 2, "failures": 0, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": -1, "reason": ""}',
    '{"origin": "@", "status": 200, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": 5}',
    '{"origin": "@", "status": 200, "body": "", "fetched": 1, "expires": 2, "keep": 2, "failures": 0, "reason": "", "x": 1}',
])
def test_anything_else_stored_is_refused_even_signed(data):
    with pytest.raises(ValueError):
        rec.decode_record(SIGNER.sign(data.replace("@", SITE), "robots"), SIGNER, SITE)


@pytest.mark.parametrize("raw", [
    json.dumps({"origin": SITE, "status": 404, "body": "eJwDAAAAAAE=", "fetched": 1.0,
                "expires": 9e9, "keep": 9e9, "failures": 0, "reason": ""}),
    stored(SITE, 404, signer=Signer([b"another-secret-0123456789"], "hosts")),
    stored(SITE, 404, signer=Signer([SECRET.encode()], "products")),
    stored(SITE, 404, named=OTHER_SITE),
    SIGNER.sign(stored(SITE, 404).split(":", 1)[1], "request"),
    stored(SITE, 200, DISALLOW_P).replace('"status":200', '"status":404'),
], ids=["unsigned", "another-secret", "another-spider", "another-site", "another-purpose",
        "altered"])
def test_a_record_is_proven_for_its_own_site_only(raw):
    with pytest.raises(rec.UnprovenRecord):
        rec.decode_record(raw, SIGNER, SITE)


def test_a_record_is_bounded_when_stored_and_refused_unread_when_longer():
    """A decompression bomb's robots.txt (670 bytes of gzip, 0.7 MB of body) is
    cut to MAX_BODY and costs Redis about a kilobyte; a body that does not
    compress fits MAX_RECORD; a longer value is refused before its proof is
    checked, and a body that inflates beyond MAX_BODY is refused."""
    bomb = rec.RobotsRecord(200, b"\0" * (700 * 1024), 1.0, 2.0, SITE)
    value = rec.encode_record(bomb, SIGNER)
    assert len(value) < 2048
    assert rec.decode_record(value, SIGNER, SITE).body == b"\0" * rec.MAX_BODY
    noise = rec.RobotsRecord(200, os.urandom(rec.MAX_BODY), 1.0, 2.0, "http://" + "h" * 1000)
    assert len(rec.encode_record(noise, SIGNER)) <= rec.MAX_RECORD

    class Refuses:
        def open(self, *args):
            raise AssertionError("a value that long is not even checked")

    with pytest.raises(ValueError, match="too long"):
        rec.decode_record("~" * (rec.MAX_RECORD + 1), Refuses(), SITE)
    packed = base64.b64encode(zlib.compress(b"\0" * (rec.MAX_BODY + 1))).decode()
    data = json.dumps({"origin": SITE, "status": 200, "body": packed, "fetched": 1, "expires": 2,
                       "keep": 2, "failures": 0, "reason": ""})
    with pytest.raises(ValueError, match="too long"):
        rec.decode_record(SIGNER.sign(data, "robots"), SIGNER, SITE)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                     | st.text(max_size=20) | st.sampled_from([SITE, OTHER_SITE, "eJwDAAAAAAE="]),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.sampled_from(["origin", "status", "body", "fetched",
                                                        "expires", "keep", "failures", "reason",
                                                        "x"]), inner, max_size=9))


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), _JSON.map(lambda v: json.dumps(v).encode())),
       st.booleans())
def test_fuzz_a_stored_record_decodes_or_raises_value_error(raw, signed):
    """Arbitrary bytes and JSON, signed by this crawl or not: a record of this
    site, or ValueError; never proven without the signature."""
    if signed:
        raw = SIGNER.sign(raw.decode("utf-8", "replace"), "robots")
    try:
        record = rec.decode_record(raw, SIGNER, SITE)
    except ValueError:
        return
    assert signed and record.origin == SITE
    assert isinstance(record.status, int) and isinstance(record.body, bytes)
    assert len(record.body) <= rec.MAX_BODY
    assert record.state in (RULES, ALLOW_ALL, UNAVAILABLE)


@hsettings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=599), st.binary(max_size=2000),
       st.floats(min_value=0, max_value=4e9), st.text(min_size=1, max_size=60))
def test_fuzz_a_node_s_record_round_trips_for_its_site_only(status, body, fetched, origin):
    record = rec.RobotsRecord(status if status == 0 or status >= 100 else 200, body, fetched,
                              fetched + 1, origin, fetched + 2, status % 7, origin[:5])
    value = rec.encode_record(record, SIGNER)
    assert rec.decode_record(value, SIGNER, origin) == record
    with pytest.raises(rec.UnprovenRecord):
        rec.decode_record(value, SIGNER, origin + "x")


# -- the real middleware on a real Redis -------------------------------------------

class HostsSpider(Spider):
    name = "hosts"


class Engine:
    """What the middleware uses of Scrapy's engine, recorded: the frontier's
    scheduler, ``crawl`` (a request into the frontier) and ``download_async``
    (a download outside it, answered from *robots*: origin → (status, body))."""

    def __init__(self, robots=None):
        self.scheduler = SimpleNamespace(mark_failed=lambda *a, **kw: self.failed.append(a))
        self.robots = robots or {}
        self.crawled, self.downloaded, self.failed = [], [], []

    def crawl(self, request):
        self.crawled.append(request)

    async def download_async(self, request):
        self.downloaded.append(request.url)
        status, body = self.robots[request.url.rsplit("/", 1)[0]]
        return TextResponse(request.url, status=status, body=body, request=request)


def node(redis_url, secret=SECRET, robots=None, name="n1", settings=None):
    """A node's middleware, as Scrapy builds it, with a stand-in engine."""
    crawler = get_crawler(HostsSpider, {"ROBOTSTXT_OBEY": True, "REDIS_URL": redis_url,
                                        "NODE_ID": name, "FRONTIER_SECRET": secret,
                                        **(settings or {})})
    crawler.spider = HostsSpider.from_crawler(crawler)
    crawler.engine = Engine(robots)
    return ClusterRobotsTxtMiddleware.from_crawler(crawler)


async def look(mw, url):
    """What *mw* does with a page: ``allowed``, ``forbidden`` or ``waits`` (back
    to the frontier until its site's robots.txt is known)."""
    try:
        out = await mw.process_request(Request(url))
    except IgnoreRequest:
        return "forbidden"
    return "waits" if isinstance(out, Request) else "allowed"


async def answer(mw, status, body=b""):
    """Download the robots.txt request *mw* put in the frontier: the middleware
    keeps the answer (IgnoreRequest: the request goes no further)."""
    fetch = mw.crawler.engine.crawled.pop()
    assert fetch.url.endswith("/robots.txt") and fetch.meta["robotstxt_fetch"]
    with pytest.raises(IgnoreRequest):
        await mw.process_response(fetch, TextResponse(fetch.url, status=status, body=body,
                                                      request=fetch))


def stat(mw, name):
    return mw.crawler.stats.get_value(f"robotstxt/cluster/{name}", 0)


def warnings_about(caplog, text, level=logging.WARNING):
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]


@pytest.mark.parametrize("raw", [
    json.dumps({"status": 404, "body": "", "fetched": time.time(), "expires": 9e9}),
    stored(SITE, 404, signer=Signer([b"another-secret-0123456789"], "hosts")),
    stored(SITE, 404, named=OTHER_SITE),
    stored(SITE, 404, expires_in=-1),
], ids=["forged-404", "another-secret", "another-site", "replayed-after-its-expiry"])
def test_a_record_no_node_wrote_for_the_site_is_not_trusted(redis, redis_url, caplog, raw):
    """A "404: allow all" record that is forged, signed with another secret,
    signed for another site or replayed past its expiry: robots.txt is fetched
    anyway and its Disallow obeyed, the record replaced by a proven one (a
    second node uses it without a fetch); said once for the site, counted."""
    redis.set(KEYS.record(SITE), raw)

    async def scenario():
        first, second = node(redis_url), node(redis_url, name="n2")
        assert await look(first, f"{SITE}/p/1") == "waits"
        assert await look(first, f"{SITE}/p/2") == "waits"
        assert [r.url for r in first.crawler.engine.crawled] == [f"{SITE}/robots.txt"]
        await answer(first, 200, DISALLOW_P)
        assert await look(first, f"{SITE}/p/1") == "forbidden"
        assert await look(first, f"{SITE}/list/1") == "allowed"
        assert await look(second, f"{SITE}/p/3") == "forbidden"
        assert second.crawler.engine.crawled == [] and stat(second, "unproven_record") == 0
        assert stat(first, "unproven_record") == 2
        await first._closed(), await second._closed()

    asyncio.run(scenario())
    assert rec.decode_record(redis.get(KEYS.record(SITE)), SIGNER, SITE).body == NORMAL_P
    [said] = warnings_about(caplog, f"Ignoring the stored robots.txt of {SITE} (")
    assert ("another site" in said.getMessage()) == (OTHER_SITE in raw)


def test_a_valid_record_is_used_without_a_fetch(redis, redis_url):
    redis.set(KEYS.record(SITE), stored(SITE, 200, DISALLOW_P))
    redis.set(KEYS.record(OTHER_SITE), stored(OTHER_SITE, 404))

    async def scenario():
        mw = node(redis_url)
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        assert await look(mw, f"{SITE}/list/1") == "allowed"
        assert await look(mw, f"{OTHER_SITE}/p/1") == "allowed"
        assert mw.crawler.engine.crawled == [] and mw.crawler.engine.downloaded == []
        assert stat(mw, "loaded/rules") == 1 and stat(mw, "loaded/allow_all") == 1
        await mw._closed()

    asyncio.run(scenario())


def test_a_record_key_of_the_wrong_type_is_said_and_fetched_over(redis, redis_url, caplog):
    """Lists where two sites' records should be: neither site's pages are
    dead-lettered; each robots.txt is fetched and stored over the list; one
    ERROR names the first key (at most one a minute), both are counted."""
    redis.rpush(KEYS.record(SITE), "junk")
    redis.rpush(KEYS.record(OTHER_SITE), "junk")

    async def scenario():
        mw = node(redis_url)
        for site in (SITE, OTHER_SITE):
            assert await look(mw, f"{site}/p/1") == "waits"
            await answer(mw, 200, DISALLOW_P)
            assert await look(mw, f"{site}/list/1") == "allowed"
            assert await look(mw, f"{site}/p/1") == "forbidden"
        assert stat(mw, "bad_key") == 2 and mw.crawler.engine.failed == []
        await mw._closed()

    asyncio.run(scenario())
    [said] = warnings_about(caplog, "is a list, not a string", logging.ERROR)
    assert KEYS.record(SITE) in said.getMessage()
    for site in (SITE, OTHER_SITE):
        assert redis.type(KEYS.record(site)) == b"string"


def test_an_index_of_the_wrong_type_is_skipped(redis, redis_url, caplog):
    redis.rpush(KEYS.index, "junk")

    async def scenario():
        mw = node(redis_url)
        assert await look(mw, f"{SITE}/p/1") == "waits"
        await answer(mw, 404)
        assert await look(mw, f"{SITE}/p/1") == "allowed"
        assert stat(mw, "bad_key") == 1 and stat(mw, "stored/allow_all") == 1
        await mw._closed()

    asyncio.run(scenario())
    [said] = warnings_about(caplog, "is a list, not a hash", logging.ERROR)
    assert KEYS.index in said.getMessage()
    assert rec.decode_record(redis.get(KEYS.record(SITE)), SIGNER, SITE).status == 404
    assert redis.exists(KEYS.fetch_lock(SITE)) == 0


def test_a_fetch_lock_without_a_node_s_expiry_is_taken_over(redis, redis_url, caplog):
    """Fetch locks written with a plain SET (no expiry), with an expiry longer
    than ROBOTSTXT_FETCH_LOCK_TTL, or of another type: taken over, robots.txt
    asked for; a node's live lock is left to it."""
    stale = {"http://127.0.0.4:1": lambda key: redis.set(key, "someone"),
             "http://127.0.0.5:1": lambda key: redis.set(key, "someone", ex=10 * 3600),
             "http://127.0.0.6:1": lambda key: redis.rpush(key, "someone")}
    for site, write in stale.items():
        write(KEYS.fetch_lock(site))
    live = "http://127.0.0.7:1"
    redis.set(KEYS.fetch_lock(live), "n2", px=60_000)

    async def scenario():
        mw = node(redis_url)
        for site in [*stale, live]:
            assert await look(mw, f"{site}/p/1") == "waits"
        assert [r.url for r in mw.crawler.engine.crawled] == [f"{s}/robots.txt" for s in stale]
        assert stat(mw, "stale_lock") == 3
        await mw._closed()

    asyncio.run(scenario())
    for site in stale:
        assert redis.get(KEYS.fetch_lock(site)).startswith(b"n1-")
        assert 0 < redis.pttl(KEYS.fetch_lock(site)) <= 120_000
    assert redis.get(KEYS.fetch_lock(live)) == b"n2"
    assert len(warnings_about(caplog, "fetch lock of http://127.0.0.")) == 3


def test_without_a_secret_each_node_fetches_robots_txt_itself(redis, redis_url, caplog,
                                                              monkeypatch):
    """No FRONTIER_SECRET: nothing in Redis can be proven. A record there (here a
    plain "404: allow all", as anyone could write it) is neither read nor
    written: each node downloads the site's robots.txt itself, once for all its
    pages, outside the frontier, and obeys it; one WARNING at start says so."""
    monkeypatch.delenv("FRONTIER_SECRET", raising=False)
    record = json.dumps({"status": 404, "body": "", "fetched": 1.0, "expires": 9e9})
    redis.set(KEYS.record(SITE), record)
    robots = {SITE: (200, DISALLOW_P)}

    async def scenario():
        nodes = [node(redis_url, None, robots, name) for name in ("n1", "n2")]
        for mw in nodes:
            await mw.crawler.signals.send_catch_log_async(signals.spider_opened,
                                                          spider=mw.crawler.spider)
            results = await asyncio.gather(*(look(mw, f"{SITE}/p/{i}") for i in range(5)))
            assert results == ["forbidden"] * 5
            assert await look(mw, f"{SITE}/list/1") == "allowed"
            assert mw.crawler.engine.downloaded == [f"{SITE}/robots.txt"]
            assert mw.crawler.engine.crawled == []
            assert mw.crawler.stats.get_value("robotstxt/per_node") == 1
            await mw._closed()

    asyncio.run(scenario())
    assert redis.get(KEYS.record(SITE)) == record.encode()
    assert redis.keys("*") == [KEYS.record(SITE).encode()]
    assert len(warnings_about(caplog, "FRONTIER_SECRET is not set: robots.txt records in "
                                      "Redis cannot be proven")) == 2


# -- in real crawls ----------------------------------------------------------------

def run_nodes(tmp_path, env, redis, site, settings, count):
    nodes = [Node(f"r{i}", tmp_path, env, spider="hosts", settings=settings)
             for i in range(1, count + 1)]
    try:
        for node in nodes:
            node.wait_for_log("Reading seeds from")
        redis.lpush(start_urls_key("hosts"), *site.root_urls())
        codes = [node.wait(300) for node in nodes]
    finally:
        for node in nodes:
            node.stop()
    assert codes == [0] * count, [n.tail() for n in nodes]
    return nodes


@pytest.mark.slow
def test_three_nodes_fetch_one_robots_txt_per_site_within_its_limits(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Ten sites, DOWNLOAD_DELAY 0.2 and 2 per site in flight, three nodes: each
    site gets one robots.txt request (Scrapy's middleware: one per node), and it
    counts against the site's limits: no window of 2 s holds more than the 11
    starts the limit allows (13 with a robots.txt per node)."""
    env = node_env(redis_url, mongo_uri, database.name)
    settings = {**BASE, "DOWNLOAD_DELAY": 0.2, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    with MultiHostSite(DEFAULT_HOSTS, pages=30, latency_ms=5) as site:
        run_nodes(tmp_path, env, redis, site, settings, 3)
        hits = site.requests()
        origin = site.urls[DEFAULT_HOSTS[0]].rstrip("/")
    for host in DEFAULT_HOSTS:
        mine = [h for h in hits if h.host == host]
        robots = [h for h in mine if h.path == "/robots.txt"]
        assert len(robots) == 1, (host, len(robots))
        assert robots[0].t <= min(h.t for h in mine if h.path != "/robots.txt"), \
            "a page of the site was sent before its robots.txt"
        pages = Counter(h.path for h in mine if h.path != "/robots.txt")
        assert set(pages) == site.expected_paths(host) and set(pages.values()) == {1}
        assert max_in_window([h.t for h in mine], 2.0) <= 11, host
    from crawlproject.cli import main as crawlctl
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert crawlctl(["--redis-url", redis_url, "politeness", "hosts", "--json"]) == 0
    shown = json.loads(out.getvalue())["hosts"][DEFAULT_HOSTS[0]]["robots"]
    assert shown["status"] == 200 and shown["state"] == RULES and shown["expires_in_s"] > 80_000
    key = RobotsKeys("hosts").record(origin)
    assert rec.decode_record(redis.get(key), SIGNER, origin).state == RULES
    # Due again after ROBOTSTXT_CACHE_TTL, kept as long again (its rules serve
    # while the site cannot be reached)
    assert 86_000_000 < redis.pttl(key) <= 2 * 86_400_000


@pytest.mark.slow
def test_stored_rules_hold_for_every_node_and_junk_is_fetched_again(
        redis, redis_url, mongo_uri, database, tmp_path):
    """A site whose stored robots.txt (signed by a node of the crawl) disallows
    /p/: no node fetches its pages (nor its robots.txt again); a site whose
    stored record is junk: said, counted, fetched again, crawled."""
    env = node_env(redis_url, mongo_uri, database.name)
    ruled, junk = DEFAULT_HOSTS[:2]
    keys = RobotsKeys("hosts")
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
    with MultiHostSite([ruled, junk], pages=20, latency_ms=5) as site:
        redis.set(keys.record(site.urls[ruled].rstrip("/")),
                  stored(site.urls[ruled].rstrip("/"), 200, DISALLOW_P))
        redis.set(keys.record(site.urls[junk].rstrip("/")), b"\x80 not json")
        nodes = run_nodes(tmp_path, env, redis, site, settings, 2)
        hits = site.requests()
    ruled_paths = {h.path for h in hits if h.host == ruled}
    assert ruled_paths and not any(p.startswith("/p/") or p == "/robots.txt"
                                   for p in ruled_paths)
    junk_paths = Counter(h.path for h in hits if h.host == junk)
    assert junk_paths["/robots.txt"] == 1
    assert site.expected_paths(junk) <= set(junk_paths)
    logs = "".join(n.log.read_text() for n in nodes)
    assert f"Ignoring the stored robots.txt of http://{junk}:" in logs
    assert "'robotstxt/forbidden'" in logs


@pytest.mark.slow
def test_an_unavailable_robots_txt_holds_the_site_s_pages_until_it_answers(
        redis, redis_url, mongo_uri, database, tmp_path):
    """robots.txt answers 503 (retries included): the site is disallowed for now
    (RFC 9309), its pages wait in the frontier — none is sent, none is lost —
    and once it is fetched again after ROBOTSTXT_UNAVAILABLE_TTL the site is
    crawled, each page once (tests/test_robots_crawl.py: one node, with more
    kinds of failure)."""
    env = node_env(redis_url, mongo_uri, database.name)
    host = DEFAULT_HOSTS[0]
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
                "RETRY_TIMES": 1, "RETRY_BACKOFF_BASE": 0.1,
                "ROBOTSTXT_UNAVAILABLE_TTL": 2, "ROBOTSTXT_WAIT": 0.3}
    with MultiHostSite([host], pages=20, latency_ms=5) as site:
        site.throttle(host, status=503, retry_after=None, count=2)
        nodes = run_nodes(tmp_path, env, redis, site, settings, 2)
        hits = site.requests()
    robots = [h for h in hits if h.path == "/robots.txt"]
    assert [h.status for h in robots][:2] == [503, 503] and robots[-1].status == 200
    pages = [h for h in hits if h.path != "/robots.txt"]
    assert min(h.t for h in pages) > robots[-1].t, "a page was sent while robots.txt was unknown"
    fetched = Counter(h.path for h in pages)
    assert set(fetched) == site.expected_paths(host) and set(fetched.values()) == {1}
    logs = "".join(n.log.read_text() for n in nodes)
    assert f"robots.txt of http://{host}:" in logs and "is unavailable (status 503" in logs


@pytest.mark.slow
def test_without_a_secret_nodes_fetch_robots_txt_themselves_and_ignore_redis(
        redis, redis_url, mongo_uri, database, tmp_path):
    """Two real nodes without FRONTIER_SECRET: a plain "Disallow: /" record in
    Redis (anyone could have written it) is ignored and left alone; each node
    that crawls the site fetched its robots.txt itself, once; every page is
    crawled once."""
    env = {**node_env(redis_url, mongo_uri, database.name), "FRONTIER_SECRET": ""}
    host = DEFAULT_HOSTS[0]
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}
    record = json.dumps({"status": 200, "body": "User-agent: *\nDisallow: /\n",
                         "fetched": time.time(), "expires": time.time() + 3600})
    with MultiHostSite([host], pages=20, latency_ms=5) as site:
        origin = site.urls[host].rstrip("/")
        redis.set(KEYS.record(origin), record)
        nodes = run_nodes(tmp_path, env, redis, site, settings, 2)
        hits = site.requests()
    pages = Counter(h.path for h in hits if h.path != "/robots.txt")
    assert set(pages) == site.expected_paths(host) and set(pages.values()) == {1}
    fetches = [n.stat("robotstxt/request_count") for n in nodes]
    assert sum(fetches) == len([h for h in hits if h.path == "/robots.txt"]) >= 1
    for n, fetched in zip(nodes, fetches):
        crawled = n.stat("downloader/response_count") - fetched
        assert fetched == (1 if crawled else 0), (n.name, fetched, crawled)
        assert "FRONTIER_SECRET is not set: robots.txt records in Redis cannot be proven" \
            in n.text()
    assert redis.get(KEYS.record(origin)) == record.encode()
    assert not redis.exists(KEYS.fetch_lock(origin), KEYS.index)
