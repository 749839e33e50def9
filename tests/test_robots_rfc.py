"""robots.txt as RFC 9309 says, for the cluster (crawlproject.robots): redirects
followed and their rules kept for the original site, what each status means,
waits bounded in seconds, bodies bounded, records that keep only the rules that
apply. The real middleware on a real Redis with a stand-in engine (what it puts
in the frontier, what it dead-letters) and a clock the test moves (records are
dated in wall time); the real crawl is tests/test_robots_crawl.py."""

import asyncio
import gzip
import os
import time
import tracemalloc

import pytest
from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest, StopDownload
from scrapy.http import Response, TextResponse

from crawlproject.policy import InputPolicy, Refused
from crawlproject.robots import middleware as mw_module
from crawlproject.robots import record as rec
from crawlproject.robots.rules import normalise
from crawlproject.signing import Signer
from tests.test_robots import (DISALLOW_P, KEYS, NORMAL_P, OTHER_SITE, SECRET, SIGNER, SITE,
                               look, node, stat)

HTTPS_SITE = "https://127.0.0.2:8443"


class Clock:
    """The middleware's ``time`` module, moved by the test."""

    def __init__(self):
        self.now = time.time()

    def time(self):
        return self.now

    def monotonic(self):
        return self.now

    def ctime(self, t=None):
        return time.ctime(t)


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(mw_module, "time", fake)
    return fake


def fetches(mw):
    """The robots.txt requests (first fetch or hop) *mw* put in the frontier, taken."""
    out = [r for r in mw.crawler.engine.crawled if r.meta.get("robotstxt_fetch")]
    mw.crawler.engine.crawled = [r for r in mw.crawler.engine.crawled if r not in out]
    return out


async def reply(mw, fetch, status, body=b"", headers=None):
    """*fetch* downloaded: the middleware sees it first as a request, then its
    answer (the downloader's response_downloaded signal included)."""
    assert await mw.process_request(fetch) is None, "a robots.txt fetch is never held back"
    response = Response(fetch.url, status=status, body=body, headers=headers or {},
                        request=fetch)
    bodies = getattr(mw, "_bodies", None)   # the response_downloaded handler
    if bodies is not None:
        bodies.downloaded(response, fetch)
    with pytest.raises(IgnoreRequest):
        await mw.process_response(fetch, response)


async def redirect(mw, fetch, location, status=301):
    await reply(mw, fetch, status, headers={"Location": location})
    [hop] = fetches(mw)
    return hop


def record_of(redis, origin):
    raw = redis.get(KEYS.record(origin))
    return rec.decode_record(raw, SIGNER, origin) if raw is not None else None


# -- redirects (RFC 9309 §2.3.1.2) ---------------------------------------------------

@pytest.mark.parametrize("chain", [
    [f"{OTHER_SITE}/robots.txt"],                                   # 301 to another host
    [f"{HTTPS_SITE}/robots.txt"],                                   # http -> https
    ["/robots-2024.txt"],                                           # 302 same host
    ["/r1", f"{OTHER_SITE}/r2", f"{SITE}/r3"],                      # a chain of three
    ["/h1", "/h2", "/h3", "/h4", "/h5"],                            # five: still followed
], ids=["other-host", "http-to-https", "same-host", "three-hops", "five-hops"])
def test_a_redirected_robots_txt_rules_its_original_site(redis, redis_url, chain):
    """Each hop is a request of its own site in the frontier (its politeness),
    marked as a fetch of the original site; the rules reached are stored
    under the ORIGINAL site's key (none under the target's), for every node."""
    parsed = []

    async def scenario():
        first, second = node(redis_url), node(redis_url, name="n2")
        first.crawler.signals.connect(lambda robotparser, request: parsed.append(request),
                                      signal=signals.robots_parsed, weak=False)
        assert await look(first, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(first)
        for location in chain:
            hop = await redirect(first, fetch, location, 302 if "2024" in location else 301)
            assert hop.url == (location if "://" in location else f"{SITE}{location}")
            assert hop.priority == 1000 and hop.dont_filter and hop.meta["dont_redirect"]
            fetch = hop
        await reply(first, fetch, 200, DISALLOW_P)
        assert await look(first, f"{SITE}/p/1") == "forbidden"
        assert await look(first, f"{SITE}/list/1") == "allowed"
        assert await look(second, f"{SITE}/p/2") == "forbidden"
        assert second.crawler.engine.crawled == []
        assert first.crawler.stats.get_value("robotstxt/redirects") == len(chain)
        await first._closed(), await second._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE).body == NORMAL_P
    assert record_of(redis, OTHER_SITE) is None and record_of(redis, HTTPS_SITE) is None
    # the scheduler applies the Crawl-delay to the site of the request it is given
    assert [mw_module.origin_of(r) for r in parsed] == [SITE]
    assert redis.exists(KEYS.fetch_lock(SITE)) == 0


@pytest.mark.parametrize("chain,why", [
    (["/a", "/robots.txt"], "loop"),
    (["/h1", "/h2", "/h3", "/h4", "/h5", "/h6"], "too_many"),
    ([f"/robots.txt?n={n}" for n in range(1, 30)], "too_many"),
    (["ftp://127.0.0.2/robots.txt"], "bad_target"),
])
def test_a_redirect_loop_or_a_sixth_hop_is_unavailable_so_allow_all(redis, redis_url, chain,
                                                                     why):
    """A loop, more than five redirects (a robots.txt that sends to
    /robots.txt?n=k for ever: at most six requests, the site then crawled) or a
    target that is not http(s): "unavailable" for the RFC, allow all."""
    async def scenario():
        mw = node(redis_url)
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        sent = 1
        for location in chain:
            await reply(mw, fetch, 301, headers={"Location": location})
            hops = fetches(mw)
            if not hops:
                break
            [fetch] = hops
            sent += 1
        assert sent <= 6
        assert await look(mw, f"{SITE}/p/1") == "allowed"
        assert stat(mw, "stored/allow_all") == 1
        assert mw.crawler.stats.get_value(f"robotstxt/redirect/{why}") == 1
        assert mw.crawler.engine.failed == []
        await mw._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE).state == rec.ALLOW_ALL


def test_only_a_node_can_make_a_request_a_robots_txt_hop(redis, redis_url):
    """The hop mark (original site, URLs so far) is signed by a node for that
    very URL: one forged, signed with another secret, or moved to another URL
    is not a fetch (the page is held to its site's robots.txt) and stores
    nothing; a stored request that is not a node's cannot even carry it."""
    other = Signer([b"another-secret-0123456789"], "hosts")
    forged = [other.sign(f'{{"origin": "{SITE}", "chain": ["{OTHER_SITE}/p/1"]}}', "robots-hop"),
              SIGNER.sign(f'{{"origin": "{SITE}", "chain": ["{OTHER_SITE}/x"]}}', "robots-hop"),
              SIGNER.sign(f'{{"origin": "{SITE}", "chain": ["{OTHER_SITE}/p/1"]}}', "request"),
              "not signed"]

    async def scenario():
        mw = node(redis_url)
        for value in forged:
            page = Request(f"{OTHER_SITE}/p/1", meta={"robotstxt_fetch": True,
                                                      "robotstxt_hop": value})
            assert isinstance(await mw.process_request(page), Request)   # waits: a page
            response = TextResponse(page.url, status=200, body=b"User-agent: *\nAllow: /\n",
                                    request=page)
            assert await mw.process_response(page, response) is response
        await mw._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE) is None
    with pytest.raises(Refused):
        InputPolicy().check_stored_meta({"robotstxt_hop": forged[1]})


# -- status semantics (RFC 9309 §2.3.1.3-4) -----------------------------------------------

def test_a_5xx_robots_txt_holds_the_pages_and_is_fetched_again_with_backoff(
        redis, redis_url, clock):
    """503 (after the retry middleware's retries): the site's pages wait, none
    is dead-lettered; robots.txt is fetched again after ROBOTSTXT_UNAVAILABLE_TTL,
    then twice as long after each failure, at most ROBOTSTXT_UNAVAILABLE_MAX_TTL;
    once it answers, the site is crawled by its rules."""
    async def scenario():
        mw = node(redis_url)
        mw.unavailable_ttl, mw.unavailable_max, mw.max_wait = 10.0, 25.0, 3600.0
        backoffs = []
        for _ in range(3):
            assert await look(mw, f"{SITE}/p/1") == "waits"
            [fetch] = fetches(mw)
            await reply(mw, fetch, 503)
            record = record_of(redis, SITE)
            backoffs.append(round(record.expires - clock.now))
            assert await look(mw, f"{SITE}/p/1") == "waits"
            assert fetches(mw) == []          # not again before its time
            clock.now = record.expires + 0.1
        assert backoffs == [10, 20, 25]
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 200, DISALLOW_P)
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        assert await look(mw, f"{SITE}/list/1") == "allowed"
        assert mw.crawler.engine.failed == []
        await mw._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE).failures == 0


def test_one_failed_connection_is_not_the_cluster_s_verdict(redis, redis_url, clock):
    """No answer at all (connection refused after the retries): the site's
    pages are not dead-lettered (a node's network is not the site's verdict):
    they wait, robots.txt is tried again, and the site is crawled once it answers."""
    async def scenario():
        mw = node(redis_url)
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        await mw.process_exception(fetch, ConnectionRefusedError("Connection was refused"))
        assert await look(mw, f"{SITE}/p/1") == "waits"
        assert await look(mw, f"{SITE}/list/1") == "waits"
        assert mw.crawler.engine.failed == []
        assert "ConnectionRefusedError" in record_of(redis, SITE).reason
        clock.now = record_of(redis, SITE).expires + 0.1
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 404)
        assert await look(mw, f"{SITE}/p/1") == "allowed"
        assert mw.crawler.engine.failed == []
        await mw._closed()

    asyncio.run(scenario())


def test_the_last_rules_serve_while_the_site_is_unreachable_up_to_max_age(
        redis, redis_url, clock):
    """Rules stored, then robots.txt is due again and the site answers 503:
    the last rules are used meanwhile (pages neither wait nor break them),
    until ROBOTSTXT_CACHE_MAX_AGE after they were read; then the pages wait."""
    async def scenario():
        mw = node(redis_url)
        mw.max_age = 3 * mw.cache_ttl
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 200, DISALLOW_P)
        fetched = clock.now
        clock.now += mw.cache_ttl + 1        # due again: fetched, the rules still apply
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        assert await look(mw, f"{SITE}/list/1") == "allowed"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 503)
        second = node(redis_url, name="n2")   # another node reads them from Redis
        assert await look(second, f"{SITE}/p/1") == "forbidden"
        assert await look(second, f"{SITE}/list/1") == "allowed"
        assert stat(second, "cached_rules") == 1
        assert record_of(redis, SITE).failures == 1
        clock.now = fetched + mw.max_age + 1
        mw._known.clear()
        assert await look(mw, f"{SITE}/list/1") == "waits"
        await mw._closed(), await second._closed()

    asyncio.run(scenario())


# -- waits bounded in seconds ----------------------------------------------------------

def test_a_page_waits_at_most_max_wait_seconds_then_is_dead_lettered(redis, redis_url,
                                                                    clock):
    """The wait is measured from when the page first waited (wall time, in its
    meta, so any node may take it again), not in looks: each look is at most
    what is left of it; after ROBOTSTXT_MAX_WAIT seconds the page is
    dead-lettered with the reason."""
    async def scenario():
        mw = node(redis_url)
        mw.max_wait = 60.0
        page = Request(f"{SITE}/p/1")
        again = await mw.process_request(page)
        started = again.meta["robotstxt_since"]
        assert started == clock.now
        delays = []
        for _ in range(4):
            delays.append(again.meta["_crawlproject_retry_delay"])
            clock.now += 10
            again = await mw.process_request(again)
            assert again.meta["robotstxt_since"] == started
        assert delays == sorted(delays) and delays[0] == mw.wait and delays[-1] <= 30
        clock.now = started + 60
        with pytest.raises(IgnoreRequest):
            await mw.process_request(again)
        [(failed, reason)] = mw.crawler.engine.failed
        assert failed.url == page.url
        assert f"robots.txt of {SITE} not available after 60 s" in reason
        assert stat(mw, "gave_up") == 1
        await mw._closed()

    asyncio.run(scenario())


# -- bodies and records bounded --------------------------------------------------------

@pytest.mark.parametrize("encoding", ["gzip", "br"])
def test_a_bomb_robots_txt_is_decoded_no_further_than_500_kib(redis, redis_url, encoding):
    """A 64 MiB gzip or brotli robots.txt (65 KiB or less on the wire): its rules
    are obeyed, the middleware decodes it itself (Scrapy's
    HttpCompressionMiddleware never sees the encoding) and no more than 500 KiB
    of it; memory stays bounded."""
    plain = DISALLOW_P + b"#" * (64 << 20)
    if encoding == "gzip":
        body = gzip.compress(plain, 9)
    else:
        try:
            import brotli
        except ImportError:
            import brotlicffi as brotli
        body = brotli.compress(plain, quality=1)

    async def scenario():
        mw = node(redis_url)
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        tracemalloc.start()
        await reply(mw, fetch, 200, body, headers={"Content-Encoding": encoding})
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 8 << 20, peak
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        assert mw.crawler.stats.get_value("robotstxt/truncated") == 1
        await mw._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE).body == NORMAL_P


def test_a_robots_txt_download_stops_after_500_kib():
    """The bytes_received handler stops a robots.txt download once 500 KiB came
    (what came is parsed: RFC 9309 §2.5); other downloads are left alone, a
    page that claims to be a fetch in its meta too."""
    mw = node("redis://127.0.0.1:1/0")
    fetch = Request(f"{SITE}/robots.txt", meta={"robotstxt_fetch": True})
    chunk = b"x" * (100 << 10)
    for _ in range(4):
        mw._bodies.bytes_received(chunk, fetch)
    with pytest.raises(StopDownload) as stopped:
        mw._bodies.bytes_received(chunk, fetch)
    assert stopped.value.fail is False
    for page in (Request(f"{SITE}/p/1"), Request(f"{SITE}/p/1", meta={"robotstxt_fetch": True})):
        for _ in range(10):
            mw._bodies.bytes_received(chunk, page)
        response = Response(page.url, headers={"Content-Encoding": "gzip"}, request=page)
        mw._bodies.downloaded(response, page)
        assert response.headers["Content-Encoding"] == b"gzip"   # Scrapy decodes it


def test_a_record_keeps_what_robots_txt_means_not_its_padding(redis, redis_url):
    """400 KiB of comments and groups for other crawlers around three rules
    that apply: the record holds those rules (the crawler's own group and *,
    normalised, with its Crawl-delay), well under a kilobyte."""
    agent = "crawlproject"
    padding = b"".join(b"# " + os.urandom(60).hex().encode() + b"\n"
                       b"User-agent: other-bot-%d\nDisallow: /%s\n" % (i, os.urandom(8).hex()
                                                                      .encode())
                       for i in range(2000))
    body = padding + (b"User-agent: Crawlproject\nCrawl-delay: 2\nDisallow: /p/\n"
                      b"User-agent: *\nDisallow: /private/\nAllow: /private/ok\n")
    assert len(body) > 300 << 10

    async def scenario():
        mw = node(redis_url, settings={"ROBOTSTXT_USER_AGENT": agent})
        assert await look(mw, f"{SITE}/list/1") == "waits"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 200, body)
        mw._known.clear()
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        await mw._closed()

    asyncio.run(scenario())
    raw = redis.get(KEYS.record(SITE))
    assert len(raw) < 1024, len(raw)
    assert record_of(redis, SITE).body == (
        b"user-agent: crawlproject\ncrawl-delay: 2\ndisallow: /p/\n"
        b"user-agent: *\ndisallow: /private/\nallow: /private/ok\n")


def test_rules_beyond_the_bound_are_dropped_and_counted(redis, redis_url):
    """A 500 KiB robots.txt of wildcard rules: ROBOTSTXT_MAX_RULES are kept, the
    rest counted (robotstxt/rules_dropped), so checking a URL costs a bounded time."""
    body = b"User-agent: *\n" + b"".join(b"Disallow: /*x%d$\n" % i for i in range(40_000))

    async def scenario():
        mw = node(redis_url)
        mw.max_rules = 500
        assert await look(mw, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(mw)
        await reply(mw, fetch, 200, body[:rec.MAX_BODY])
        assert mw.crawler.stats.get_value("robotstxt/rules_dropped") > 25_000
        assert await look(mw, f"{SITE}/p/x7") == "forbidden"
        assert await look(mw, f"{SITE}/p/x999") == "allowed"     # beyond the bound
        await mw._closed()

    asyncio.run(scenario())
    assert record_of(redis, SITE).body.count(b"\ndisallow: ") == 500


def test_normalised_rules_mean_what_the_whole_file_means_for_this_crawler():
    """Protego on the kept lines answers as on the whole file, for this
    crawler's user agent: its own group wins over *, a group without rules
    allows all, misspelt fields and a group's several user-agent lines count."""
    from protego import Protego

    agent = "Crawlproject/1.0 (+https://example.org/bot)"
    body = (b"\xef\xbb\xbfUser-agent: googlebot\nDisallow: /\n\n"
            b"User-agent: other\nuser agent: CRAWLPROJECT\nDissallow: /p/\nAllow: /p/ok\n"
            b"Request-rate: 1/5\nUser-agent: *\nDisallow: /q/\nSitemap: https://x/s.xml\n"
            b"User-agent: nobody\nUser-agent: crawlproject\n\nUser-agent: *\nDisallow: /r/\n")
    normal = normalise(body, agent, 100).text.decode()
    whole, kept = Protego.parse(body.decode("utf-8-sig")), Protego.parse(normal)
    for path in ("/", "/p/1", "/p/ok", "/q/1", "/r/1", "/x"):
        url = f"http://h{path}"
        assert kept.can_fetch(url, agent) == whole.can_fetch(url, agent), path
    assert list(kept.sitemaps) == ["https://x/s.xml"]
    assert "googlebot" not in normal and "other" not in normal
    empty = b"User-agent: crawlproject\nAllow:\n\nUser-agent: *\nDisallow: /\n"
    assert Protego.parse(empty.decode()).can_fetch("http://h/a", agent)
    assert Protego.parse(normalise(empty, agent, 9).text.decode()).can_fetch("http://h/a", agent)


# -- without FRONTIER_SECRET: each node fetches, the same rules ------------------------

def test_without_a_secret_a_node_follows_redirects_and_waits_out_a_5xx_itself(
        redis, redis_url, clock, monkeypatch):
    """No secret: the node downloads robots.txt itself (outside the frontier),
    follows its redirects to the rules of the original site; a 503 holds the
    site's pages (never dead-lettered) until it is fetched again and answers."""
    monkeypatch.delenv("FRONTIER_SECRET", raising=False)
    answers = {f"{SITE}/robots.txt": [(503, {}, b""), (301, {"Location": "/moved"}, b"")],
               f"{SITE}/moved": [(302, {"Location": f"{OTHER_SITE}/robots.txt"}, b"")],
               f"{OTHER_SITE}/robots.txt": [(200, {}, DISALLOW_P)]}
    downloaded = []

    async def download_async(request):
        downloaded.append(request.url)
        assert request.meta["dont_redirect"] and request.meta["dont_obey_robotstxt"]
        queue = answers[request.url]
        status, headers, body = queue.pop(0) if len(queue) > 1 else queue[0]
        return Response(request.url, status=status, headers=headers, body=body,
                        request=request)

    async def scenario():
        mw = node(redis_url, None)
        mw.crawler.engine.download_async = download_async
        assert await look(mw, f"{SITE}/p/1") == "waits"
        assert await look(mw, f"{SITE}/list/1") == "waits"
        assert downloaded == [f"{SITE}/robots.txt"]
        clock.now += mw.unavailable_ttl + 1
        assert await look(mw, f"{SITE}/p/1") == "forbidden"
        assert await look(mw, f"{SITE}/list/1") == "allowed"
        assert downloaded[1:] == [f"{SITE}/robots.txt", f"{SITE}/moved",
                                  f"{OTHER_SITE}/robots.txt"]
        assert mw.crawler.engine.failed == [] and mw.crawler.engine.crawled == []
        await mw._closed()

    asyncio.run(scenario())
    assert redis.keys("*") == []


def test_a_crawl_delay_reaches_the_frontier_before_the_rules_are_shared(redis, redis_url):
    """The first page of a site was leased at the interval the site had before
    its robots.txt: the record (which lets every node's pages go) is shared
    only once the frontier has the Crawl-delay (the scheduler's
    ``client.flushed()``; a stand-in here, whose future the test resolves)."""
    class Client:
        def __init__(self):
            self.asked, self.future = asyncio.Event(), None

        def flushed(self):
            self.future = asyncio.get_running_loop().create_future()
            self.asked.set()
            return self.future

    async def scenario():
        first, second = node(redis_url), node(redis_url, name="n2")
        client = first.crawler.engine.scheduler.client = Client()
        heard = []
        first.crawler.signals.connect(
            lambda robotparser, request: heard.append(robotparser.crawl_delay("*")),
            signal=signals.robots_parsed, weak=False)
        assert await look(first, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(first)
        answered = asyncio.ensure_future(
            reply(first, fetch, 200, b"User-agent: *\nCrawl-delay: 3\nDisallow: /p/\n"))
        await asyncio.wait_for(client.asked.wait(), 10)
        assert heard == [3.0]                                # the scheduler was told ...
        assert record_of(redis, SITE) is None                # ... and nothing is shared yet
        assert await look(second, f"{SITE}/list/1") == "waits"
        client.future.set_result(None)                       # the frontier has it
        await asyncio.wait_for(answered, 10)
        assert record_of(redis, SITE) is not None
        assert await look(second, f"{SITE}/list/2") == "allowed"
        # no Crawl-delay: nothing to wait for
        client.asked.clear()
        assert await look(first, f"{OTHER_SITE}/a") == "waits"
        [fetch] = fetches(first)
        await asyncio.wait_for(reply(first, fetch, 200, b"User-agent: *\nDisallow: /p/\n"), 10)
        assert not client.asked.is_set() and record_of(redis, OTHER_SITE) is not None
        await first._closed(), await second._closed()

    asyncio.run(scenario())


def test_a_fetch_that_ended_between_a_read_and_the_lock_is_not_made_again(redis, redis_url):
    """A node read no record, then another node's fetch stored it and released
    the lock, then the first took the lock: it finds the record and fetches
    nothing (robots.txt was fetched twice on a loaded machine)."""
    async def scenario():
        first, second = node(redis_url), node(redis_url, name="n2")
        assert await look(first, f"{SITE}/p/1") == "waits"
        [fetch] = fetches(first)
        await reply(first, fetch, 200, DISALLOW_P)          # stored, lock released
        assert await second._ask_for_fetch(SITE) is not None   # second's read came before
        assert fetches(second) == [] and redis.get(KEYS.fetch_lock(SITE)) is None
        assert stat(second, "fetched_meanwhile") == 1
        await first._closed(), await second._closed()

    asyncio.run(scenario())
