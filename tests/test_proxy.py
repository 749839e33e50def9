"""Proxy pool: entry parsing (fuzzed), ban rules, choice, shared state in a real
Redis, the middleware's decisions, and no credential in frontier payloads."""

import json
import random
from types import SimpleNamespace

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from scrapy import Request
from scrapy.exceptions import DownloadConnectionRefusedError, IgnoreRequest, NotConfigured
from scrapy.http import HtmlResponse, Response
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError

from crawlproject.frontier.library import SCRIPT_COMMANDS
from crawlproject.frontier.retrypolicy import RETRY_DELAY_META
from crawlproject.proxies.middleware import BAN_TRIES, ProxyPoolMiddleware
from crawlproject.identity.session import PROXY_CONTEXT, PROXY_ID
from crawlproject.proxies.pool import (SCHEMES, BanRules, Health, InvalidProxy, PoolView, Proxy,
                                  _compile, parse_proxy)
from crawlproject.proxies.store import HealthBatch, ProxyStore
from crawlproject.serialization import request_to_json

SECRET = "Pa55-W0rd-Xyzzy"


# --------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("entry, expected", [
    (f"http://user:{SECRET}@127.0.0.1:8080", ("http", "127.0.0.1", 8080, "user", SECRET)),
    ("https://Proxy.Example.com:443/", ("https", "proxy.example.com", 443, "", "")),
    ("http://u%40x:p%3Aw@[::1]:3128", ("http", "[::1]", 3128, "u@x", "p:w")),
    ("  http://10.0.0.1:1  ", ("http", "10.0.0.1", 1, "", "")),
])
def test_valid_entries(entry, expected):
    p = parse_proxy(entry)
    assert (p.scheme, p.host, p.port, p.username, p.password) == expected
    assert p.id == f"{expected[1]}:{expected[2]}"
    assert parse_proxy(p.url) == p


@pytest.mark.parametrize("entry, code", [
    (f"socks5://user:{SECRET}@127.0.0.1:1080", "unsupported_scheme"),
    (f"socks5h://user:{SECRET}@127.0.0.1:1080", "unsupported_scheme"),
    (f"ftp://user:{SECRET}@127.0.0.1:21", "unsupported_scheme"),
    (f"http://user:{SECRET}@127.0.0.1", "bad_port"),
    ("http://127.0.0.1:0", "bad_port"),
    ("http://127.0.0.1:70000", "bad_port"),
    (f"http://user:{SECRET}@127.0.0.1:80/path", "malformed"),
    ("http://127.0.0.1:80?x=1", "malformed"),
    (f"user:{SECRET}@127.0.0.1:80", "malformed"),
    ("http://bad_host!:80", "bad_host"),
    ("http://999.1.1.1:80", "bad_host"),
    ("http://[12345::1]:80", "bad_host"),
    ("http://[zz::1]:80", "malformed"),
    (f"http://:{SECRET}@h:80", "malformed"),
    ("", "bad_length"),
    (b"\xff\xfe", "not_utf8"),
    (12, "not_text"),
])
def test_invalid_entries_are_refused_without_repeating_them(entry, code):
    with pytest.raises(InvalidProxy) as info:
        parse_proxy(entry)
    assert info.value.code == code
    assert SECRET not in str(info.value)


def test_socks_is_refused_with_the_reason():
    with pytest.raises(InvalidProxy, match="no SOCKS support"):
        parse_proxy("socks5://127.0.0.1:1080")


@hsettings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=80), st.binary(max_size=80),
                 st.from_regex(r"\A[a-z5]{2,7}://([^@]{0,12}@)?[^/]{0,20}(:[0-9]{0,6})?/?\Z"),
                 st.builds(lambda s, u, h, p: f"{s}://{u}@{h}:{p}",
                           st.sampled_from(["http", "https", "socks5", "HTTP"]),
                           st.text(max_size=10), st.text(max_size=15),
                           st.integers(-5, 70000))))
def test_any_entry_parses_to_a_usable_proxy_or_is_refused(entry):
    try:
        p = parse_proxy(entry)
    except InvalidProxy as exc:
        assert exc.code and "\n" not in str(exc)
        return
    assert p.scheme in SCHEMES and 1 <= p.port <= 65535 and p.host
    assert "@" not in p.id and "/" not in p.id
    assert parse_proxy(p.url) == p                # what goes to meta["proxy"] reads back


@given(st.sampled_from(["http", "https"]), st.from_regex(r"\A[a-z]([a-z0-9-]{0,18}[a-z0-9])?\Z"),
       st.integers(1, 65535), st.text(min_size=1, max_size=12), st.text(max_size=12))
def test_built_urls_round_trip(scheme, host, port, user, password):
    p = Proxy(scheme, host, port, user, password)
    assert parse_proxy(p.url) == p
    assert "password=" not in repr(p) and "username=" not in repr(p)


# --------------------------------------------------------------------------- ban rules

RULES = BanRules(body_patterns=_compile([r"(?i)captcha"], "x"),
                 redirect_patterns=_compile([r"/blocked\b"], "x"))


@pytest.mark.parametrize("status, body, location, url, reason", [
    (403, b"", None, "", "status_403"),
    (429, b"", None, "", "status_429"),
    (404, b"captcha", None, "", None),
    (500, b"captcha", None, "", None),
    (503, b"down for maintenance", None, "", None),
    (503, b"solve the CAPTCHA", None, "", "status_503_body"),
    (200, b"<title>Captcha</title>", None, "", "body"),
    (200, b"<h1>A product</h1>", None, "", None),
    (302, b"", "https://site/blocked?from=x", "", "redirect"),
    (302, b"", "https://site/next", "", None),
    (200, b"", None, "https://site/blocked", "redirect"),
])
def test_ban_classification(status, body, location, url, reason):
    assert RULES.classify(status, body, location, url) == reason


def test_body_markers_only_searched_in_the_first_bytes():
    rules = BanRules(body_patterns=_compile(["captcha"], "x"), body_max_bytes=10)
    assert rules.classify(200, b"x" * 20 + b"captcha") is None


def test_a_bad_pattern_is_a_clear_error():
    with pytest.raises(ValueError, match="PROXY_BAN_BODY_PATTERNS: invalid regular"):
        _compile(["(unclosed"], "PROXY_BAN_BODY_PATTERNS")


# --------------------------------------------------------------------------- choice

A, B, C = (Proxy("http", "10.0.0.1", p, "u", SECRET) for p in (1, 2, 3))


def view(proxies=(A, B, C), health=None, retired=None, bans=None, seed=1):
    v = PoolView(random.Random(seed))
    v.update({p.id: p for p in proxies}, health or {}, retired or {}, bans or {})
    return v


def test_a_proxy_banned_for_one_domain_still_serves_the_others_and_is_revived():
    v = view()
    v.ban(A.id, "shop", until=100.0, strikes=1)
    assert {v.choose("shop", 50.0).id for _ in range(200)} == {B.id, C.id}
    assert {v.choose("news", 50.0).id for _ in range(200)} == {A.id, B.id, C.id}
    assert A.id in {v.choose("shop", 100.5).id for _ in range(200)}      # revived


def test_retired_proxies_are_never_chosen_and_all_banned_means_none():
    v = view(retired={C.id: "dead"})
    assert {v.choose("x", 0).id for _ in range(200)} == {A.id, B.id}
    v.ban(A.id, "x", 10, 1)
    v.ban(B.id, "x", 20, 1)
    assert v.choose("x", 5) is None
    assert v.next_unban("x", 5) == 5


def test_fast_healthy_proxies_get_most_traffic_and_slow_ones_some():
    v = view(health={A.id: Health(ok=100, latency_ms=50), B.id: Health(ok=100, latency_ms=500),
                     C.id: Health(ok=10, failures=90, latency_ms=50)})
    picks = [v.choose("x", 0).id for _ in range(3000)]
    assert picks.count(A.id) > 2 * picks.count(B.id) > 0
    assert picks.count(A.id) > 4 * picks.count(C.id) > 0


def test_a_session_keeps_one_proxy_on_every_node_and_moves_when_banned():
    node1, node2 = view(seed=1), view(proxies=(C, A, B), seed=2)
    for session in ("login-1", "login-2", "x"):
        chosen = {node1.sticky(session, "d", 0)[0].id for _ in range(20)}
        assert chosen == {node2.sticky(session, "d", 0)[0].id}
    home = node1.sticky("login-1", "d", 0)[0]
    node1.ban(home.id, "d", 10, 1)
    moved, was = node1.sticky("login-1", "d", 0)
    assert was == home and moved != home
    assert node1.sticky("login-1", "d", 11)[0] == home                  # back after revival
    # a new proxy moves only the sessions it ranks first for
    bigger = view(proxies=(A, B, C, Proxy("http", "10.0.0.9", 9)))
    same = sum(view().sticky(f"s{i}", "d", 0)[0] == bigger.sticky(f"s{i}", "d", 0)[0]
               for i in range(400))
    assert 250 < same < 370


# --------------------------------------------------------------------------- Redis state

def test_refresh_flushes_health_and_reads_the_shared_state(redis):
    store = ProxyStore(redis, "s", retire_after=3, latency_alpha=0.5)
    redis.sadd(store.keys.pool, A.url, "socks5://x:1")
    batch = HealthBatch()
    batch.success(A.id, 0.2)
    batch.success(A.id, 0.4)
    batch.failure(B.id, "ConnectionRefusedError")
    batch.ban(A.id, "shop", 30, 1)
    snap = store.read(batch, now_ms=1_000_000)
    assert snap.pool_type == "set" and sorted(snap.entries) == sorted(
        [A.url.encode(), b"socks5://x:1"])
    assert snap.health[A.id]["ok"] == 2 and snap.health[A.id]["lat"] == 300
    assert snap.health[B.id]["fail"] == 1 and snap.health[B.id]["consec"] == 1
    assert snap.bans == {(A.id, "shop"): (1_030_000, 1)}
    # latency is an EWMA; a later, shorter ban does not shorten the longer one
    again = HealthBatch()
    again.success(A.id, 0.1)
    again.ban(A.id, "shop", 5, 2)
    snap = store.read(again, now_ms=1_001_000)
    assert snap.health[A.id]["lat"] == 200
    assert snap.bans[(A.id, "shop")] == (1_030_000, 2)
    assert SECRET.encode() not in b"".join(redis.hgetall(store.keys.health)) + b"".join(
        redis.hgetall(store.keys.bans))


def test_failures_in_a_row_retire_a_proxy_and_a_success_resets_the_run(redis):
    store = ProxyStore(redis, "s", retire_after=3)
    for errors, success in ((2, False), (0, True), (2, False)):
        batch = HealthBatch()
        for _ in range(errors):
            batch.failure(B.id, "ConnectionRefusedError")
        if success:
            batch.success(B.id, 0.1)
        snap = store.read(batch)
        assert not snap.retired
    batch = HealthBatch()
    batch.failure(B.id, "ConnectionRefusedError: <evil>\n")
    snap = store.read(batch)
    assert snap.retired[B.id]["reason"] == (
        "3 connection failures in a row (last: ConnectionRefusedError)")
    assert store.revive(B.id) and not store.read().retired


def test_pool_as_a_hash_and_as_a_wrong_type(redis):
    store = ProxyStore(redis, "s")
    redis.hset(store.keys.pool, mapping={"eu-1": A.url, "eu-2": B.url})
    assert sorted(store.read().entries) == sorted([A.url.encode(), B.url.encode()])
    redis.delete(store.keys.pool)
    redis.set(store.keys.pool, A.url)
    snap = store.read()
    assert snap.pool_type == "string" and snap.entries == []


def test_expired_bans_are_forgotten_and_a_success_after_revival_clears_strikes(redis):
    store = ProxyStore(redis, "s", forget_after=60)
    batch = HealthBatch()
    batch.ban(A.id, "a", 10, 3)
    batch.ban(B.id, "b", 10, 1)
    first = store.read(batch, now_ms=1_000_000)
    clear = HealthBatch()
    clear.clear(A.id, "a")
    # a node reads the clear as a change (a deletion); one starting afresh reads what is left
    snap = store.read(clear, now_ms=1_011_000, since=first.ban_version)
    assert snap.bans == {(A.id, "a"): None} and not snap.full
    assert {k: v for k, v in store.read(now_ms=1_011_000).bans.items() if v} == {
        (B.id, "b"): (1_010_000, 1)}
    assert store.read(None, now_ms=1_071_000).bans == {}
    keys = store.keys
    assert not redis.exists(keys.bans, keys.ban_log, keys.ban_expiry)   # nothing left behind


# --------------------------------------------------------------------------- middleware

def middleware(**settings):
    crawler = get_crawler(settings_dict={"PROXY_POOL_ENABLED": True,
                                         "PROXY_POOL": [A.url, B.url],
                                         # the pool's proxies (A, B, C) are on 10.0.0.1
                                         "DOWNLOAD_ALLOWED_NETWORKS": ["private"], **settings})
    return build_from_crawler(ProxyPoolMiddleware, crawler)


def test_off_by_default():
    with pytest.raises(NotConfigured):
        build_from_crawler(ProxyPoolMiddleware, get_crawler())


def test_a_request_gets_a_pool_proxy_its_masked_id_and_a_browser_context():
    mw = middleware(PROXY_POOL=[A.url, "socks5://s:1080", "nonsense"])
    request = Request("http://shop/p/1", meta={"proxy": "http://evil:1"},
                      headers={"Proxy-Authorization": "Basic stale"})
    assert mw.process_request(request) is None
    assert request.meta["proxy"] == A.url and request.meta[PROXY_ID] == A.id
    assert request.meta[PROXY_CONTEXT] == {"server": "http://10.0.0.1:1", "username": "u",
                                           "password": SECRET}
    assert b"Proxy-Authorization" not in request.headers
    assert mw.stats.get_value("proxy/invalid/unsupported_scheme") == 1
    assert mw.stats.get_value("proxy/invalid/malformed") == 1


def test_a_session_gets_its_cookie_jar_and_keeps_its_proxy():
    mw = middleware(PROXY_POOL=[A.url, B.url, C.url])
    ids = set()
    for _ in range(10):
        request = Request("http://shop/", meta={"session": "login"})
        mw.process_request(request)
        ids.add(request.meta[PROXY_ID])
        assert request.meta["cookiejar"] == "login"
    assert len(ids) == 1
    request = Request("http://shop/", meta={"session": "login", "cookiejar": 7})
    mw.process_request(request)
    assert request.meta["cookiejar"] == 7


def sent(mw, url="http://shop/p/1", **meta):
    request = Request(url, meta=meta)
    mw.process_request(request)
    # what Scrapy's HttpProxyMiddleware (750) does with the credentials
    request.headers[b"Proxy-Authorization"] = b"Basic c2VjcmV0"
    request.meta["_auth_proxy"] = request.meta["proxy"].split("@")[0]
    return request


def test_a_404_or_500_is_not_a_ban_and_reaches_the_spider():
    mw = middleware()
    for status in (404, 500, 200):
        request = sent(mw)
        response = Response(request.url, status=status, request=request)
        assert mw.process_response(request, response) is response
        assert PROXY_CONTEXT not in request.meta
        assert b"Proxy-Authorization" not in request.headers
    assert not mw.view.bans and mw.stats.get_value("proxy/bans") is None
    assert sum(c.ok for c in mw.batch.counts.values()) == 3


def test_a_ban_sends_the_request_to_another_proxy_then_dead_letters_it():
    mw = middleware(PROXY_BAN_MAX_TRIES=2)
    # The engine's scheduler is not running in a unit test: a stand-in records
    # the dead-letter call (the end-to-end test runs the real one).
    failed = []
    mw.crawler.engine = SimpleNamespace(scheduler=SimpleNamespace(
        mark_failed=lambda request, reason, kind: failed.append((request, reason, kind))))
    first = sent(mw)
    banned_id = first.meta[PROXY_ID]
    page = HtmlResponse(first.url, status=200, body=b"<title>captcha</title>", request=first)
    retry = mw.process_response(first, page)
    assert isinstance(retry, Request) and retry.dont_filter and retry.meta[BAN_TRIES] == 1
    assert not {"proxy", "_auth_proxy", PROXY_ID, PROXY_CONTEXT} & set(retry.meta)
    assert b"Proxy-Authorization" not in retry.headers
    assert mw.view.banned_until(banned_id, "shop", 0) and mw.batch.bans[0][:2] == (banned_id,
                                                                                  "shop")
    assert SECRET not in request_to_json(retry, None)
    mw.process_request(retry)
    assert retry.meta[PROXY_ID] != banned_id                  # another proxy
    response = Response(retry.url, status=403, request=retry)
    with pytest.raises(IgnoreRequest):
        mw.process_response(retry, response)
    assert [(r.url, reason, kind) for r, reason, kind in failed] == [(first.url, "banned",
                                                                      "download")]
    assert "proxy" not in failed[0][0].meta
    assert mw.stats.get_value("proxy/dead/banned") == 1


def test_every_proxy_banned_for_a_host_makes_its_requests_wait():
    mw = middleware()
    for proxy in (A, B):
        mw.view.ban(proxy.id, "shop", 1e12, 1)
    request = Request("http://shop/", meta={"_crawlproject_lease": "m"})
    waiting = mw.process_request(request)
    assert isinstance(waiting, Request) and waiting.meta[RETRY_DELAY_META] == 1800.0
    assert waiting.meta["_crawlproject_lease"] == "m" and "proxy" not in waiting.meta
    other = Request("http://news/")
    assert mw.process_request(other) is None                  # other hosts go on


@pytest.mark.parametrize("error", [ConnectionRefusedError(), DownloadConnectionRefusedError()])
def test_a_connection_error_is_a_failure_and_the_request_tries_another_proxy(error):
    mw = middleware()
    request = sent(mw)
    retry = mw.process_exception(request, error)
    assert isinstance(retry, Request) and retry.meta[BAN_TRIES] == 1
    failed_id = request.meta.get(PROXY_ID) or next(iter(mw.batch.counts))
    assert mw.batch.counts[failed_id].fail == 1
    assert mw.process_exception(sent(mw), ValueError("not the proxy")) is None


def test_a_refreshed_snapshot_replaces_the_pool_with_redis_entries(redis):
    mw = middleware(PROXY_POOL=[A.url])
    mw.store = ProxyStore(redis, "s")
    redis.sadd(mw.store.keys.pool, C.url, "socks5://u:p@h:1")
    batch = HealthBatch()
    batch.ban(A.id, "shop", 60, 1)
    mw.apply(mw.store.read(batch))
    assert set(mw.view.proxies) == {A.id, C.id}
    assert {mw.view.choose("shop", 0).id for _ in range(50)} == {C.id}
    assert mw.stats.get_value("proxy/invalid/unsupported_scheme") == 1
    mw.apply(mw.store.read())
    assert mw.stats.get_value("proxy/invalid/unsupported_scheme") == 1   # logged once


def test_a_redis_proxy_on_a_refused_address_is_never_used_one_of_the_settings_is(redis):
    """Whoever writes Redis must not aim every request at 127.0.0.1:6379 or a
    metadata endpoint by naming it a proxy; the operator's own proxies are trusted."""
    local = Proxy("http", "127.0.0.1", 6379)
    mw = middleware(PROXY_POOL=[local.url], DOWNLOAD_ALLOWED_NETWORKS=[])
    mw.store = ProxyStore(redis, "s")
    redis.sadd(mw.store.keys.pool, "http://169.254.169.254:80", "http://[::1]:3128", C.url)
    mw.apply(mw.store.read())
    assert set(mw.view.proxies) == {local.id}
    assert mw.stats.get_value("proxy/invalid/address_refused") == 3


# --------------------------------------------------------------------------- frontier payloads

def test_frontier_payloads_never_hold_proxy_credentials():
    request = Request("http://shop/", headers={"Proxy-Authorization": "Basic dTpw"},
                      meta={"proxy": f"http://u:{SECRET}@10.0.0.1:1", "_auth_proxy": "x",
                            PROXY_CONTEXT: {"password": SECRET}, PROXY_ID: A.id})
    payload = json.loads(request_to_json(request, None))
    assert SECRET not in json.dumps(payload) and "dTpw" not in json.dumps(payload)
    # The pool's choice is for one download: never stored (the next one chooses
    # again), so a payload naming a proxy is one the policy refuses.
    assert "meta" not in payload


# --------------------------------------------------------------------------- command line

def test_cli_shows_masked_proxies_with_health_bans_and_retirement_and_revives(
        redis, redis_url, capsys):
    from crawlproject.cli import main

    store = ProxyStore(redis, "s", retire_after=1)
    redis.hset(store.keys.pool, mapping={"a": A.url, "bad": f"socks5://u:{SECRET}@h:1"})
    batch = HealthBatch()
    batch.success(A.id, 0.05)
    batch.ban(A.id, "shop", 60, 2)
    batch.failure(B.id, "ConnectionRefusedError")
    store.read(batch)
    assert main(["--redis-url", redis_url, "proxies", "s", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["proxies"][A.id]["ok"] == 1 and shown["proxies"][A.id]["in_redis_pool"]
    assert shown["proxies"][A.id]["banned"]["shop"]["strikes"] == 2
    assert "1 connection failures in a row" in shown["proxies"][B.id]["retired"]
    assert shown["invalid_entries"][0]["error"] == "unsupported_scheme"
    assert main(["--redis-url", redis_url, "proxies", "s"]) == 0
    table = capsys.readouterr().out
    assert A.id in table and B.id in table and "shop" in table
    assert main(["--redis-url", redis_url, "proxies", "s", "--revive", B.id]) == 0
    assert "revived" in capsys.readouterr().out and not store.read().retired
    everything = json.dumps(shown) + table
    assert SECRET not in everything and "u:" not in everything


# --------------------------------------------------------------------------- bad stored state

def middleware_on(redis, **settings):
    """A middleware whose shared state is *redis* (sync client: apply(read()))."""
    mw = middleware(**settings)
    mw.store = ProxyStore(redis, "s")
    return mw


def dead_letters(mw):
    """The engine's scheduler is not running in a unit test: a stand-in records
    the dead-letter calls (the end-to-end tests run the real one)."""
    failed = []
    mw.crawler.engine = SimpleNamespace(scheduler=SimpleNamespace(
        mark_failed=lambda request, reason, kind: failed.append((request.url, reason, kind))))
    return failed


@pytest.mark.parametrize("bad", ["inf", "-inf", "nan", "1e400", "-5", "garbage", "1e9"])
def test_a_bad_health_value_is_ignored_with_one_warning_and_requests_go_on(redis, caplog, bad):
    mw = middleware_on(redis)
    health = mw.store.keys.health
    redis.hset(health, mapping={f"{A.id}|lat": bad, f"{B.id}|lat": bad, f"{A.id}|ok": bad,
                                f"{B.id}|consec": bad, f"{A.id}|seen": bad})
    redis.hset(mw.store.keys.bans, f"{A.id}|shop", bad)
    redis.zadd("{s}:proxy:banlog", {f"{A.id}|shop": 1})     # as if changed by a node
    for _ in range(3):
        mw.apply(mw.store.read())
        chosen = {sent(mw).meta[PROXY_ID] for _ in range(200)}
        assert chosen == {A.id, B.id}
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "ignored" in r.message]
    assert len(warnings) == 6 and all(health in r.message or "bans" in r.message
                                      for r in warnings)
    assert mw.stats.get_value("proxy/bad_state") == 6
    # the next flush repairs the bad counters and latency instead of failing
    batch = HealthBatch()
    batch.success(A.id, 0.05)
    batch.failure(B.id, "ConnectionRefusedError")
    snap = mw.store.read(batch)
    assert snap.health[A.id]["lat"] == 50 and snap.health[A.id]["ok"] == 1
    assert snap.health[B.id]["consec"] == 1
    assert sorted(name for _, name, _ in snap.bad) == [f"{A.id}|shop", f"{B.id}|lat"]


def test_the_refresh_loop_survives_a_failed_run(redis_url):
    """A run that raises (an error injected into apply: no known stored value
    does it any more) is logged and the next run goes on."""
    import asyncio

    import redis.asyncio as aredis

    mw = middleware(PROXY_REFRESH_INTERVAL=0.05)
    runs = []

    def apply(snap, real=mw.apply):
        runs.append(snap)
        if len(runs) == 1:
            raise RuntimeError("injected")
        real(snap)

    mw.apply = apply

    async def main():
        mw.store = ProxyStore(aredis.from_url(redis_url), "s")
        mw._closing = asyncio.Event()
        task = asyncio.ensure_future(mw._loop())
        for _ in range(200):
            if len(runs) >= 3 or task.done():
                break
            await asyncio.sleep(0.05)
        mw._closing.set()
        await task
        await mw.store.client.aclose()

    asyncio.run(main())
    assert len(runs) >= 3 and mw.stats.get_value("proxy/refresh_errors") == 1


def test_cli_and_dashboard_read_bad_values_without_a_traceback(redis, redis_url, capsys):
    from crawlproject.cli import main
    from crawlproject.ops.proxies import proxy_report
    from crawlproject.dashboard.render import proxies_fragment

    store = ProxyStore(redis, "s")
    redis.sadd(store.keys.pool, A.url)
    redis.hset(store.keys.health, mapping={f"{A.id}|lat": "inf", f"{A.id}|ok": "inf",
                                           f"{A.id}|consec": "nan", f"{B.id}|fail": "3"})
    assert main(["--redis-url", redis_url, "proxies", "s"]) == 0
    out = capsys.readouterr().out
    assert A.id in out and B.id in out and "inf" not in out
    html = proxies_fragment({"proxies": proxy_report(redis, "s")})
    assert A.id in html and "inf" not in html


# --------------------------------------------------------------------------- no usable proxy

def test_with_no_usable_proxy_requests_wait_then_are_dead_lettered_as_no_proxy(redis, caplog):
    mw = middleware_on(redis, PROXY_POOL=[], PROXY_POOL_EMPTY_MAX_WAIT=60)
    failed = dead_letters(mw)
    redis.rpush(mw.store.keys.pool, A.url)                      # a list: a wrong type
    mw.apply(mw.store.read())
    assert [r for r in caplog.records if r.levelname == "ERROR" and mw.store.keys.pool in
            r.message and "is a list, expected a set or a hash" in r.message]
    waiting = mw.process_request(Request("http://shop/1"))
    assert isinstance(waiting, Request) and waiting.meta[RETRY_DELAY_META] > 0
    mw._empty_since = (mw._empty_since[0] - 61, mw._empty_since[1])   # a minute later
    with pytest.raises(IgnoreRequest, match="no_proxy"):
        mw.process_request(Request("http://shop/2"))
    assert failed == [("http://shop/2", "no_proxy", "download")]
    assert mw.stats.get_value("proxy/dead/no_proxy") == 1
    # proxies back: requests go through again, the state ends
    redis.delete(mw.store.keys.pool)
    redis.sadd(mw.store.keys.pool, A.url)
    mw.apply(mw.store.read())
    assert mw.process_request(Request("http://shop/3")) is None and mw._empty_since is None


def test_every_proxy_retired_is_no_usable_proxy(redis):
    mw = middleware_on(redis, PROXY_POOL_EMPTY_MAX_WAIT=0)
    failed = dead_letters(mw)
    for proxy in (A, B):
        redis.hset(mw.store.keys.retired, proxy.id, json.dumps({"reason": "dead", "at": 1}))
    mw.apply(mw.store.read())
    with pytest.raises(IgnoreRequest):
        mw.process_request(Request("http://shop/1"))
    assert failed == [("http://shop/1", "no_proxy", "download")]


def test_a_proxy_key_of_a_wrong_type_is_named_in_the_node_log_and_the_cli(
        redis, redis_url, caplog, capsys):
    import asyncio

    import redis.asyncio as aredis

    from crawlproject.cli import main

    keys = ProxyStore(redis, "s").keys
    redis.set(keys.health, "x")
    mw = middleware(PROXY_POOL=[], PROXY_POOL_EMPTY_MAX_WAIT=0)
    failed = dead_letters(mw)

    async def refresh_twice():
        mw.store = ProxyStore(aredis.from_url(redis_url), "s")
        await mw.refresh()
        await mw.refresh()
        await mw.store.client.aclose()

    asyncio.run(refresh_twice())
    errors = [r.message for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"{keys.health} is a string, expected a hash" in errors[0]
    with pytest.raises(IgnoreRequest):
        mw.process_request(Request("http://shop/1"))
    assert failed and failed[0][1] == "no_proxy"
    assert main(["--redis-url", redis_url, "proxies", "s"]) == 1
    assert f"{keys.health} is a string, expected a hash" in capsys.readouterr().err
    redis.delete(keys.health)
    redis.rpush(keys.pool, A.url)
    assert main(["--redis-url", redis_url, "proxies", "s", "--json"]) == 1
    captured = capsys.readouterr()
    assert f"{keys.pool} is a list, expected a set or a hash" in captured.err
    assert json.loads(captured.out)["pool_key_type"] == "list"


# --------------------------------------------------------------------------- cost of REFRESH

def _ban_batch(count: int, proxies: int = 10) -> HealthBatch:
    batch = HealthBatch()
    for i in range(count):
        batch.ban(f"10.1.0.{i % proxies}:80", f"host{i // proxies}.example", 60, 1)
    return batch


def _commands(redis) -> dict[str, int]:
    stats = redis.info("commandstats")
    return {name: s["calls"] for name, s in stats.items()
            if not name.split("_", 1)[1] in (*SCRIPT_COMMANDS, "info", "config", "slowlog",
                                             "script", "function|load")}


def _leaves(value) -> int:
    return sum(_leaves(v) for v in value) if isinstance(value, list) else 1


def _measured_refresh(redis, store, since: int, **kwargs):
    """One REFRESH as an up-to-date node makes it: the reply, the Redis commands it
    ran (INFO commandstats counts the ones a script calls) and its SLOWLOG duration."""
    redis.config_resetstat()
    redis.slowlog_reset()
    reply = store._refresh(keys=store.keys.refresh_keys(),
                           args=store._args(HealthBatch(), None, since, None), **kwargs)
    commands = _commands(redis)
    micros = [e["duration"] for e in redis.slowlog_get(10)
              if (e["command"] or b"").split(b" ")[0].lower().decode() in SCRIPT_COMMANDS]
    return reply, commands, micros


def test_refresh_costs_the_same_with_100_or_20000_bans(redis):
    """Deterministic: the reply of an up-to-date node and the Redis commands the
    script runs do not grow with the number of bans (they did: the whole bans hash
    came back each second). The SLOWLOG durations are printed, not asserted."""
    old = redis.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"]
    redis.config_set("slowlog-log-slower-than", 0)
    try:
        measured = {}
        for count in (100, 20_000):
            store = ProxyStore(redis, f"cost{count}")
            for proxy in range(10):
                redis.sadd(store.keys.pool, f"http://10.1.0.{proxy}:80")
            snap = store.read(_ban_batch(count))
            for _ in range(20):                                  # catch up, 2,000 a call
                if len(snap.bans) < store.ban_changes:
                    break
                snap = store.read(since=snap.ban_version)
            assert int(redis.hget(store.keys.state, "ban_version")) == count
            measured[count] = _measured_refresh(redis, store, snap.ban_version)
    finally:
        redis.config_set("slowlog-log-slower-than", old)
    (small, small_cmds, small_us), (big, big_cmds, big_us) = measured[100], measured[20_000]
    print(f"REFRESH of an up-to-date node: {small_us} us with 100 bans, {big_us} us with 20,000")
    assert big[4] == small[4] == []                         # no ban changed: none sent
    assert _leaves(big) == _leaves(small) and abs(len(repr(big)) - len(repr(small))) < 100
    assert big_cmds == small_cmds and sum(big_cmds.values()) < 40, big_cmds


def test_expired_bans_are_forgotten_a_bounded_number_per_call(redis):
    store = ProxyStore(redis, "s", forget_after=60)
    store.read(_ban_batch(1000), now_ms=1_000_000)
    redis.config_resetstat()
    snap = store.read(now_ms=2_000_000)                     # all 1,000 long past forgetting
    assert _commands(redis)["cmdstat_hdel"] == 100 and redis.hlen(store.keys.bans) == 900
    for _ in range(9):
        store.read(now_ms=2_000_000)
    assert not redis.exists(store.keys.bans, store.keys.ban_log, store.keys.ban_expiry)
    assert len(snap.bans) == 900                            # what was left after that call


def test_nodes_see_each_others_ban_changes_and_a_reset(redis):
    """Ban changes reach the other nodes (bans, clears); a new node catches up
    over several calls; a deleted state (crawlctl reset) starts every node afresh."""
    node1, node2 = middleware_on(redis), middleware_on(redis)
    node2.store.ban_changes = 7
    node1.view.ban(A.id, "shop", 1e12, 1)
    node1.batch.ban(A.id, "shop", 60, 1)
    batch = _ban_batch(20)
    batch.bans.append((A.id, "shop", 60_000, 1))
    node1.apply(node1.store.read(batch))
    for _ in range(4):                                    # 21 changes, 7 a call
        node2.apply(node2.store.read(since=node2._ban_version))
    assert node2.view.banned_until(A.id, "shop", 0) and len(
        [1 for d in node2.view.bans.values() for _ in d]) == 21
    assert {node2.view.choose("shop", 0).id for _ in range(50)} == {B.id}
    clear = HealthBatch()
    clear.clear(A.id, "shop")
    redis.hset(node1.store.keys.bans, f"{A.id}|shop", "1|1")  # its ban is over
    node1.store.read(clear)
    node2.apply(node2.store.read(since=node2._ban_version))
    assert node2.view.strikes(A.id, "shop") == 0
    for key in node1.store.keys.refresh_keys()[1:]:
        redis.delete(key)
    node2.apply(node2.store.read(since=node2._ban_version))
    assert node2.view.bans == {} and node2._ban_version == 0


def test_cli_and_dashboard_show_the_most_troubled_proxies_and_counts(redis, redis_url, capsys):
    from crawlproject.cli import main
    from crawlproject.ops.proxies import proxy_report
    from crawlproject.dashboard.render import proxies_fragment

    store = ProxyStore(redis, "s")
    redis.sadd(store.keys.pool, *(f"http://10.2.{i // 250}.{i % 250}:80" for i in range(300)))
    batch = HealthBatch()
    for i in range(300):
        batch.success(f"10.2.{i // 250}.{i % 250}:80", 0.05)
    batch.ban("10.2.1.7:80", "shop", 600, 1)
    store.read(batch)
    assert main(["--redis-url", redis_url, "proxies", "s", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["proxies"]) == 50 and shown["counts"]["proxies"] == 300
    assert shown["ranked"][0] == "10.2.1.7:80"                 # banned: first
    assert main(["--redis-url", redis_url, "proxies", "s", "--limit", "5"]) == 0
    table = capsys.readouterr().out
    assert "10.2.1.7:80" in table and len(table.splitlines()) < 25 and "5 of 300" in table
    assert main(["--redis-url", redis_url, "proxies", "s", "--all", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["proxies"]) == 300
    html = proxies_fragment({"proxies": proxy_report(redis, "s")})
    assert html.count("<tr") <= 52 and "50 of 300" in html


def test_a_node_reads_the_health_hash_and_marks_its_proxies_only_every_few_calls(redis_url):
    """The health hash and the "still in the pool" marks are O(pool): read every
    HEALTH_READ_PERIOD (10 calls at 1 s), marked every 60 calls; bans, the pool
    and retirements every call."""
    import asyncio

    import redis as redis_lib
    import redis.asyncio as aredis

    from crawlproject.proxies.middleware import HEALTH_READ_PERIOD

    mw = middleware(PROXY_REFRESH_INTERVAL=1.0)
    read = []
    mw.apply = lambda snap, real=mw.apply: (read.append(snap.health is not None), real(snap))
    sync = redis_lib.Redis.from_url(redis_url)

    async def main():
        mw.store = ProxyStore(aredis.from_url(redis_url), "s")
        for call in range(1, 22):
            await mw.refresh()
            if call == 1:
                assert sync.hexists(mw.store.keys.health, f"{A.id}|seen")
                sync.delete(mw.store.keys.health)
        await mw.store.client.aclose()

    try:
        asyncio.run(main())
        assert HEALTH_READ_PERIOD == 10
        assert [i for i, r in enumerate(read, 1) if r] == [1, 11, 21]
        assert not sync.exists(mw.store.keys.health)       # no mark after the first call
    finally:
        sync.flushall()
        sync.close()
