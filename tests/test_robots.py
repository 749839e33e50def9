"""robots.txt for the cluster (crawlproject.robots): one fetch per site under the
site's limits, shared through Redis, stored records read strictly; real
`scrapy crawl hosts` nodes against the multi-host site (devtools.demo.hosts)."""

import json
import time
from collections import Counter

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from crawlproject.keys import RobotsKeys, start_urls_key
from crawlproject.robots.record import (ALLOW_ALL, RULES, UNAVAILABLE, RobotsRecord,
                                        decode_record, encode_record)
from devtools.demo.hosts import DEFAULT_HOSTS, MultiHostSite, max_in_window
from tests.crawl_helpers import Node, node_env

BASE = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": True,
        "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "RANDOMIZE_DOWNLOAD_DELAY": False,
        "CONCURRENT_REQUESTS": 16, "LOG_LEVEL": "INFO"}


# -- the stored record ------------------------------------------------------------

def test_a_record_round_trips_and_says_what_the_status_means():
    for status, state in ((200, RULES), (404, ALLOW_ALL), (401, ALLOW_ALL), (429, UNAVAILABLE),
                          (503, UNAVAILABLE), (0, UNAVAILABLE), (301, UNAVAILABLE)):
        record = RobotsRecord(status, "User-agent: *\nDisallow: /x\n", 1.5, 2.5)
        assert decode_record(encode_record(record)) == record
        assert record.state == state


@pytest.mark.parametrize("raw", [
    b"", b"null", b"[]", b"{}", b"\xff\xfe", b'{"status": 200}',
    b'{"status": "200", "body": "", "fetched": 1, "expires": 2}',
    b'{"status": true, "body": "", "fetched": 1, "expires": 2}',
    b'{"status": 700, "body": "", "fetched": 1, "expires": 2}',
    b'{"status": 200, "body": 5, "fetched": 1, "expires": 2}',
    b'{"status": 200, "body": "", "fetched": 1, "expires": 1e999}',
    b'{"status": 200, "body": "", "fetched": -1, "expires": 2}',
    b'{"status": 200, "body": "", "fetched": 1, "expires": 2, "x": 1}',
])
def test_anything_else_stored_is_refused(raw):
    with pytest.raises(ValueError):
        decode_record(raw)


@hsettings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                              | st.text(max_size=20),
                              lambda inner: st.lists(inner, max_size=4)
                              | st.dictionaries(st.sampled_from(
                                  ["status", "body", "fetched", "expires", "x"]), inner,
                                  max_size=5)).map(lambda v: json.dumps(v).encode())))
def test_fuzz_a_stored_record_decodes_or_raises_value_error(raw):
    try:
        record = decode_record(raw)
    except ValueError:
        return
    assert isinstance(record.status, int) and isinstance(record.body, str)
    assert record.state in (RULES, ALLOW_ALL, UNAVAILABLE)


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
    assert decode_record(redis.get(key)).state == RULES
    assert 0 < redis.pttl(key) <= 86_400_000


@pytest.mark.slow
def test_stored_rules_hold_for_every_node_and_junk_is_fetched_again(
        redis, redis_url, mongo_uri, database, tmp_path):
    """A site whose stored robots.txt disallows /p/: no node fetches its pages
    (nor its robots.txt again); a site whose stored record is junk: said,
    counted, fetched again, crawled."""
    env = node_env(redis_url, mongo_uri, database.name)
    ruled, junk = DEFAULT_HOSTS[:2]
    keys = RobotsKeys("hosts")
    now = time.time()
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 4}
    with MultiHostSite([ruled, junk], pages=20, latency_ms=5) as site:
        redis.set(keys.record(site.urls[ruled].rstrip("/")), encode_record(
            RobotsRecord(200, "User-agent: *\nDisallow: /p/\n", now, now + 3600)))
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
    crawled, each page once."""
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
    assert f"robots.txt of http://{host}:" in logs and "is unavailable (503)" in logs


@pytest.mark.slow
def test_an_unreachable_site_s_pages_are_dead_lettered_with_the_reason_at_once(
        redis, redis_url, mongo_uri, database, tmp_path):
    """No answer at all to robots.txt (connection refused, after its retries):
    the site's pages are not sent to a dead host but dead-lettered at once,
    with the reason (replayable); the other site is crawled, the crawl ends."""
    from crawlproject.frontier.queue import Frontier
    from tests.test_scheduler import closed_port

    env = node_env(redis_url, mongo_uri, database.name)
    dead_url = f"http://127.0.0.1:{closed_port()}/"
    settings = {**BASE, "DOWNLOAD_DELAY": 0, "RETRY_TIMES": 1, "RETRY_BACKOFF_BASE": 0.1}
    with MultiHostSite(DEFAULT_HOSTS[:1], pages=10, latency_ms=5) as site:
        nodes = [Node("u1", tmp_path, env, spider="hosts", settings=settings)]
        try:
            nodes[0].wait_for_log("Reading seeds from")
            redis.lpush(start_urls_key("hosts"), dead_url, *site.root_urls())
            assert nodes[0].wait(120) == 0, nodes[0].tail()
        finally:
            nodes[0].stop()
        hits = site.requests()
        expected = site.expected_paths(DEFAULT_HOSTS[0])
    assert expected <= {h.path for h in hits}
    dead = {d["url"]: d for d in Frontier(redis, "hosts", "test").dead_letters()}
    assert "ConnectionRefused" in dead[dead_url + "robots.txt"]["reason"]
    page = dead[dead_url]
    assert "robots.txt of http://127.0.0.1:" in page["reason"] and "unreachable" in page["reason"]
    assert "ConnectionRefused" in page["reason"] and page["payload"]
