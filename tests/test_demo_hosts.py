"""Tests for the multi-host demo site (real HTTP to a subprocess, no mocks)."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest
from scrapy import Selector

from devtools.demo.hosts import (
    Hit, MultiHostSite, expected_paths, max_in_window, max_overlap, page_links, render_path,
)
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import Node, node_env

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
BIG, SMALL, SLOW = HOSTS
PAGES = {BIG: 120, SMALL: 7, SLOW: 3}
SLOW_MS = 1500  # long enough that a fast request finishes while a slow one is in flight

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str) -> tuple[int, dict, str]:
    """(status, headers, body) without raising on 4xx/5xx."""
    try:
        with _OPENER.open(url, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode("utf-8")


@pytest.fixture(scope="module")
def running():
    with MultiHostSite(HOSTS, pages=PAGES, latency_ms={SLOW: SLOW_MS}) as site:
        yield site


@pytest.fixture
def site(running):
    running.reset()
    return running


def page(site: MultiHostSite, host: str, path: str) -> Selector:
    status, _, body = fetch(site.url(host, path))
    assert status == 200, (host, path)
    return Selector(text=body)


# ----------------------------------------------------------------- content


def test_every_host_is_its_own_site(site):
    assert set(site.urls) == set(HOSTS)
    for host in HOSTS:
        assert site.urls[host].startswith(f"http://{host}:")
        assert host in page(site, host, "/").css("h1::text").get()
    assert [h.host for h in site.requests()] == HOSTS


def test_listings_link_every_page_once_and_chain_with_next(site):
    linked, path, listings = [], "/", []
    while path:
        listings.append(path)
        sel = page(site, BIG, path)
        linked += sel.css("a.page::attr(href)").getall()
        path = sel.css("a.next::attr(href)").get()
    assert listings == ["/", "/list/2", "/list/3"]
    assert linked == [f"/p/{n}" for n in range(1, PAGES[BIG] + 1)]
    assert set(listings) | set(linked) == site.expected_paths(BIG) == expected_paths(120, 50)


def test_pages_link_pages_of_the_same_host_with_duplicates(site):
    for n in (1, 60, PAGES[BIG]):
        sel = page(site, BIG, f"/p/{n}")
        assert sel.css("h1.title::text").get() == f"Page {n} of {BIG}"
        links = sel.css("a.link::attr(href)").getall()
        assert links == [f"/p/{m}" for m in page_links(BIG, n, PAGES[BIG])]
        assert len(set(links)) < len(links)
        assert all(1 <= int(link.rsplit("/", 1)[1]) <= PAGES[BIG] for link in links)
    assert page_links(BIG, 5, 120) != page_links(SMALL, 5, 120)  # hosts differ


@pytest.mark.parametrize("path", ["/p/0", "/p/01", "/p/121", "/list/4", "/list/0", "/nope"])
def test_unknown_paths_answer_404(site, path):
    assert fetch(site.url(BIG, path))[0] == 404


def test_robots_txt_allows_everything(site):
    status, headers, body = fetch(site.url(SMALL, "/robots.txt"))
    assert status == 200 and "Allow: /" in body and headers["Content-Type"].startswith("text/plain")
    assert "Crawl-delay" not in body
    assert "Crawl-delay: 3\n" in render_path(SMALL, "/robots.txt", 5, 10, crawl_delay=3).body.decode()


# ----------------------------------------------------------------- recording


def test_every_request_is_recorded_in_order_with_its_status(site):
    sent = [(BIG, "/"), (SMALL, "/p/3"), (BIG, "/p/999"), (SMALL, "/list/2"), (BIG, "/p/1")]
    for host, path in sent:
        fetch(site.url(host, path))
    hits = site.requests()
    assert [(h.host, h.path, h.status) for h in hits] == [
        (BIG, "/", 200), (SMALL, "/p/3", 200), (BIG, "/p/999", 404), (SMALL, "/list/2", 404),
        (BIG, "/p/1", 200)]
    times = [h.t for h in hits]
    assert times == sorted(times) and all(h.done >= h.t for h in hits)
    assert site.per_host_times(BIG) == [times[0], times[2], times[4]]
    assert site.requests(SMALL) == [hits[1], hits[3]]
    assert site.served_after(BIG, times[2]) == [hits[4]]
    assert times[0] <= site.now()


def test_reset_clears_the_record_and_reading_is_incremental(site):
    fetch(site.url(BIG, "/"))
    first = site.requests()
    fetch(site.url(BIG, "/p/2"))
    assert site.requests()[:1] == first and len(site.requests()) == 2
    site.reset()
    assert site.requests() == []
    fetch(site.url(SMALL, "/"))
    assert [h.path for h in site.requests()] == ["/"]


def test_latency_delays_answers_without_blocking_other_hosts(site):
    slow = threading.Thread(target=fetch, args=(site.url(SLOW, "/p/1"),))
    slow.start()
    try:
        (in_flight,) = site.wait_for_requests(1, SLOW)
        assert in_flight.done is None
        fetch(site.url(BIG, "/"))  # answered while the slow one is still in flight
    finally:
        slow.join(10)
    slow_hit, fast_hit = site.requests(SLOW)[0], site.requests(BIG)[0]
    assert fast_hit.done < slow_hit.done
    assert slow_hit.done - slow_hit.t >= SLOW_MS / 1000
    assert site.max_in_flight(SLOW) == 1 and site.max_in_flight(BIG) == 1


def test_concurrent_slow_requests_are_in_flight_together(site):
    threads = [threading.Thread(target=fetch, args=(site.url(SLOW, f"/p/{n}"),)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    try:
        hits = site.wait_for_requests(2, SLOW)
        # Both arrived before either was answered (the site is not serialising them).
        assert max(h.t for h in hits) < min(h.done or float("inf") for h in hits)
    finally:
        for thread in threads:
            thread.join(10)
    assert site.max_in_flight(SLOW) == 2


# ----------------------------------------------------------------- throttling


def test_throttle_by_count_answers_429_with_retry_after_then_recovers(site):
    armed = site.throttle(SMALL, status=429, retry_after=5, count=2)
    answers = [fetch(site.url(SMALL, "/p/1")) for _ in range(3)]
    assert [a[0] for a in answers] == [429, 429, 200]
    assert [a[1].get("Retry-After") for a in answers] == ["5", "5", None]
    assert fetch(site.url(BIG, "/"))[0] == 200  # other hosts unaffected
    blocks = site.blocks(SMALL)
    assert [(b.status, b.retry_after) for b in blocks] == [(429, 5), (429, 5)]
    assert armed <= blocks[0].t
    after = site.served_after(SMALL, blocks[-1].t)
    assert [(h.path, h.status) for h in after] == [("/p/1", 200)]


def test_throttle_by_time_window_ends_on_the_site_clock(site):
    window = 0.3
    armed = site.throttle(BIG, status=503, retry_after=1, seconds=window)
    statuses, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline:  # the window ends after 0.3 s of site time
        statuses.append(fetch(site.url(BIG, "/"))[0])
        if statuses[-1] == 200:
            break
    assert statuses[-1] == 200 and set(statuses[:-1]) <= {503}
    hits = site.requests(BIG)
    assert all(h.t < armed + window for h in hits if h.status == 503)
    assert hits[-1].t >= armed + window
    assert all(h.retry_after == 1 for h in site.blocks(BIG))


def test_throttle_without_retry_after_and_unthrottle(site):
    site.throttle(SMALL, status=503, retry_after=None, seconds=600)
    status, headers, _ = fetch(site.url(SMALL, "/"))
    assert status == 503 and "Retry-After" not in headers
    site.unthrottle(SMALL)
    assert fetch(site.url(SMALL, "/"))[0] == 200
    site.throttle(SMALL, count=5)
    site.reset()  # a reset ends throttles too
    assert fetch(site.url(SMALL, "/"))[0] == 200
    assert site.blocks(SMALL) == []


@pytest.mark.parametrize("kwargs", [
    {"host": "127.0.0.99", "count": 1}, {"host": BIG, "status": 500, "count": 1}, {"host": BIG}])
def test_bad_throttle_arguments_are_refused(site, kwargs):
    with pytest.raises(ValueError):
        site.throttle(**kwargs)
    assert fetch(site.url(BIG, "/"))[0] == 200


# ----------------------------------------------------------------- faults


@pytest.fixture(scope="module")
def faulty():
    with MultiHostSite(HOSTS, pages=PAGES, latency_ms={SLOW: SLOW_MS}, fail_every=5,
                       overload={SLOW: (1, 7)}) as site:
        yield site


def test_every_nth_page_answers_503_once_then_200(faulty):
    faulty.reset()
    first = {n: fetch(faulty.url(BIG, f"/p/{n}")) for n in (4, 5, 10, 11)}
    assert {n: a[0] for n, a in first.items()} == {4: 200, 5: 503, 10: 503, 11: 200}
    assert "Retry-After" not in first[5][1]
    assert [fetch(faulty.url(BIG, f"/p/{n}"))[0] for n in (5, 10, 5)] == [200, 200, 200]
    assert fetch(faulty.url(BIG, "/"))[0] == 200  # listings and robots.txt never fail
    assert fetch(faulty.url(BIG, "/robots.txt"))[0] == 200
    assert fetch(faulty.url(SMALL, "/p/5"))[0] == 503  # per host
    hits = faulty.requests()
    assert [(h.path, h.status, h.retry_after) for h in hits if h.status != 200] == [
        ("/p/5", 503, None), ("/p/10", 503, None), ("/p/5", 503, None)]
    assert [h.host for h in faulty.blocks(SMALL)] == [SMALL]
    faulty.reset()  # a reset makes the same pages fail again
    assert fetch(faulty.url(BIG, "/p/5"))[0] == 503


def test_fail_every_per_host_overrides_and_zero_is_off():
    with MultiHostSite([BIG, SMALL], pages=20, fail_every={BIG: 3}) as site:
        assert [fetch(site.url(BIG, f"/p/{n}"))[0] for n in (3, 3, 6)] == [503, 200, 503]
        assert fetch(site.url(SMALL, "/p/3"))[0] == 200 and fetch(site.url(SMALL, "/p/5"))[0] == 200
    assert "--host-fail-every" not in " ".join(MultiHostSite([BIG], fail_every=0).command())
    with pytest.raises(ValueError):
        MultiHostSite([BIG], overload={"127.0.0.99": (1, 1)})


def test_overload_answers_429_with_retry_after_while_k_are_in_flight(faulty):
    faulty.reset()
    slow = threading.Thread(target=fetch, args=(faulty.url(SLOW, "/p/1"),))
    slow.start()
    try:
        faulty.wait_for_requests(1, SLOW)
        status, headers, _ = fetch(faulty.url(SLOW, "/p/2"))  # answered at once
        assert status == 429 and headers["Retry-After"] == "7"
        assert fetch(faulty.url(BIG, "/p/2"))[0] == 200  # other hosts unaffected
    finally:
        slow.join(10)
    assert fetch(faulty.url(SLOW, "/p/3"))[0] == 200  # nothing in flight any more
    hits = faulty.requests(SLOW)
    assert [(h.path, h.status, h.retry_after) for h in hits] == [
        ("/p/1", 200, None), ("/p/2", 429, 7), ("/p/3", 200, None)]
    assert hits[1].done - hits[1].t < SLOW_MS / 1000 < hits[0].done - hits[0].t
    # only the slow 200 occupied the host: the 429 was answered while it was in flight
    assert faulty.blocks(SLOW) == [hits[1]]


def test_fault_options_on_the_command_line():
    from devtools.demo.hosts import config_from_args, parse_args

    config = config_from_args(parse_args(
        ["--hosts", f"{BIG},{SMALL}", "--fail-every", "50", "--host-fail-every", f"{SMALL}=0",
         "--host-overload", f"{BIG}=2,5"]))
    assert config.fail_every == {BIG: 50, SMALL: 0} and config.overload == {BIG: (2, 5)}
    for bad in (f"{BIG}=0,5", f"{BIG}=2", f"{BIG}=x,1"):
        with pytest.raises(Exception):
            parse_args(["--hosts", BIG, "--host-overload", bad]) and config_from_args(
                parse_args(["--hosts", BIG, "--host-overload", bad]))


# ----------------------------------------------------------------- analysis


def test_max_in_window_on_known_sequences():
    assert max_in_window([], 1.0) == 0
    assert max_in_window([5.0], 1.0) == 1
    # Half-open windows: requests exactly one window apart are never counted together.
    assert max_in_window([0.0, 1.0, 2.0, 3.0], 1.0) == 1
    assert max_in_window([0.0, 0.25, 0.5, 0.75, 1.0, 1.25], 1.0) == 4
    assert max_in_window([0.0, 0.1, 0.2, 1.0, 1.05, 2.5], 1.0) == 4  # [0.1, 1.1)
    assert max_in_window([3.0, 0.0, 2.9, 0.05], 0.2) == 2  # order does not matter
    paced = [i * 0.25 for i in range(100)]  # exactly 4/s
    assert max_in_window(paced, 2.0) == 8
    assert max_in_window(paced[:50] + [12.49] + paced[50:], 2.0) == 9


def test_max_overlap_on_known_intervals():
    assert max_overlap([]) == 0
    assert max_overlap([(0, 1), (1, 2), (2, 3)]) == 1  # back to back
    assert max_overlap([(0, 2), (1, 3), (1.5, 1.6), (2.5, 4)]) == 3
    assert max_overlap([(0, None), (10, 11)]) == 2  # None: still in flight


def test_hit_is_a_plain_tuple():
    hit = Hit("127.0.0.2", "/", 200, 1.0, 1.5, None)
    assert hit == ("127.0.0.2", "/", 200, 1.0, 1.5, None) and hit.done == 1.5


# ----------------------------------------------------------------- a real crawl


@pytest.mark.slow
def test_hosts_spider_crawls_every_page_of_every_host_once(redis, redis_url, mongo_uri, database,
                                                           tmp_path):
    pages = {"127.0.0.5": 130, "127.0.0.6": 12, "127.0.0.7": 1}
    with MultiHostSite(list(pages), pages=pages) as site:
        redis.lpush(start_urls_key("hosts"), *site.root_urls())
        settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                    "MAX_IDLE_TIME_BEFORE_CLOSE": 2}
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    spider="hosts", settings=settings)
        try:
            assert node.wait(180) == 0, node.tail()
        finally:
            node.stop()
        hits = site.requests()
    for host, count in pages.items():
        fetched = Counter(h.path for h in hits if h.host == host)
        assert set(fetched) == expected_paths(count), host
        assert set(fetched.values()) == {1}, host
    assert {h.status for h in hits} == {200}
    stored = list(database["hosts"].find({}, {"_id": 0, "url": 1, "host": 1}))
    assert len(stored) == sum(pages.values())
    assert Counter(d["host"] for d in stored) == Counter(pages)
    assert not node.errors()
