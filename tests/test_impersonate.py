"""Browser TLS and HTTP/2 on the wire (crawlproject.impersonate).

Unit tests build the components from real settings with Scrapy's ``get_crawler``
and run the download handler on an asyncio loop against the local TLS server of
tests/tls_fingerprint.py, which computes what the client showed (JA4, JA3N, the
HTTP/2 fingerprint, header order) with its own parsers. The crawls of
tests/test_impersonate_crawl.py run real nodes."""

from __future__ import annotations

import asyncio
import base64
import gzip

import pytest
from scrapy import Request, Spider
from scrapy.downloadermiddlewares.retry import RetryMiddleware
from scrapy.exceptions import DownloadCancelledError, NotConfigured
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from crawlproject.identity.middleware import IdentityMiddleware
from crawlproject.identity.session import IDENTITY, SESSION
from crawlproject.impersonate import HANDLER, errors
from crawlproject.impersonate.addon import RENDERING_HANDLER, ImpersonateAddon
from crawlproject.impersonate.handler import ImpersonateDownloadHandler
from crawlproject.impersonate.profiles import available_profiles, profile_for
from devtools.demo.proxy import ForwardProxy
from tests.tls_fingerprint import FingerprintServer

curl_cffi = pytest.importorskip("curl_cffi")
from curl_cffi.requests import AsyncSession  # noqa: E402

CHROME_131 = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
              "Chrome/131.0.0.0 Safari/537.36")
FIREFOX_135 = "Mozilla/5.0 (X11; Linux x86_64; rv:135.0) Gecko/20100101 Firefox/135.0"
ON = {"IMPERSONATE_ENABLED": True, "DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER}}


def run(coro_fn, settings: dict | None = None):
    """Run ``coro_fn(handler, crawler)`` on a fresh asyncio loop (the handler is built
    inside it, as Scrapy builds it on the reactor's loop), then close the handler."""

    async def main():
        crawler = get_crawler(Spider, {**ON, **(settings or {})})
        handler = ImpersonateDownloadHandler(crawler)
        try:
            return await coro_fn(handler, crawler)
        finally:
            await handler.close()

    return asyncio.run(main())


def impersonated(url: str, profile: str | None = "chrome131", **meta) -> Request:
    identity = {"profile": profile} if profile else None
    return Request(url, meta={**({IDENTITY: identity} if identity else {}),
                              "download_timeout": 20, **meta})


async def library_fetch(url: str, profile: str) -> None:
    """What curl_cffi sends for *profile* on its own."""
    async with AsyncSession(verify=False) as session:
        await session.get(url, impersonate=profile)


# ------------------------------------------------------------------ profiles


@pytest.mark.parametrize("agent, profile", [
    (CHROME_131, "chrome131"),
    (CHROME_131.replace("Windows NT 10.0; Win64; x64", "Macintosh; Intel Mac OS X 10_15_7"),
     "chrome131"),
    (CHROME_131 + " Edg/131.0.0.0", "chrome131"),                  # Edge: Chromium's stack
    (CHROME_131.replace("131", "101") + " Edg/101.0.1210.39", "edge101"),
    ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.0.0 Mobile Safari/537.36", "chrome131_android"),
    (CHROME_131.replace("131", "134"), None),                       # no such profile
    (FIREFOX_135, "firefox135"),
    (FIREFOX_135.replace("135", "137"), None),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/17.0.1 Safari/605.1.15", "safari170"),               # patch: the major.minor's
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/26.0.1 Safari/605.1.15", "safari2601"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
     "Gecko) Version/18.4 Mobile/15E148 Safari/604.1", "safari184_ios"),
    ("curl/8.0", None),
])
def test_a_user_agent_maps_to_the_profile_of_its_browser_version(agent, profile):
    assert profile_for(agent) == profile


# ------------------------------------------------------------------ identity middleware


def identities(settings: dict) -> IdentityMiddleware:
    mw = IdentityMiddleware.from_crawler(get_crawler(Spider, settings))
    mw.spider_opened(Spider("s"))
    return mw


def test_with_impersonation_only_reproducible_user_agents_and_their_profile_are_given():
    plain = identities({})
    mw = identities(ON)
    assert 0 < len(mw.pool) < len(plain.pool)
    available = available_profiles()
    assert all(profile_for(i.user_agent, available) for i in mw.pool)
    assert {i.family for i in mw.pool} == {"chromium", "firefox", "safari"}
    again = identities(ON)
    for n in range(40):
        request = Request(f"https://site{n}.example/", meta={SESSION: f"s{n}"})
        mw.process_request(request)
        meta = request.meta[IDENTITY]
        assert meta["profile"] == profile_for(meta["user_agent"], available)
        assert request.headers[b"User-Agent"].decode() == meta["user_agent"]
        twin = Request(f"https://other{n}.example/", meta={SESSION: f"s{n}"})
        again.process_request(twin)                   # another node, the same session
        assert twin.meta[IDENTITY] == meta
    request = Request("https://a.example/")
    plain.process_request(request)
    assert "profile" not in request.meta[IDENTITY]


def test_impersonation_needs_its_handler_and_a_reproducible_pool():
    with pytest.raises(ValueError, match="ImpersonateAddon"):
        identities({"IMPERSONATE_ENABLED": True})
    with pytest.raises(ValueError, match="no User-Agent .* curl_cffi reproduces"):
        identities({**ON, "IDENTITY_BROWSERS": ["Opera"]})


# ------------------------------------------------------------------ add-on


def addon_settings(values: dict) -> Settings:
    settings = Settings()
    settings.setdict(values, priority="project")
    return settings


def test_the_addon_is_not_configured_when_off_and_installs_the_handler_when_on():
    with pytest.raises(NotConfigured) as off:
        ImpersonateAddon().update_settings(addon_settings({}))
    assert not off.value.args                           # bare: no warning at every start
    settings = addon_settings({"IMPERSONATE_ENABLED": True, "DOWNLOAD_HANDLERS": {
        "https": "scrapy.core.downloader.handlers.http11.HTTP11DownloadHandler"}})
    ImpersonateAddon().update_settings(settings)
    assert settings.getdict("DOWNLOAD_HANDLERS") == {"http": HANDLER, "https": HANDLER}
    assert "crawlproject.impersonate.errors.ImpersonateError" in settings.getlist(
        "RETRY_EXCEPTIONS")
    # with the rendering add-on on, the rendering handler that hands the rest to ours
    for handlers in ({}, {"https": "crawlproject.rendering.RenderingDownloadHandler"}):
        settings = addon_settings({"IMPERSONATE_ENABLED": True, "DOWNLOAD_HANDLERS": handlers,
                                   "ADDONS": {"crawlproject.rendering.RenderingAddon": 0}})
        ImpersonateAddon().update_settings(settings)
        assert set(settings.getdict("DOWNLOAD_HANDLERS").values()) == {RENDERING_HANDLER}
        settings.set("RENDERING_ENABLED", False)
        settings.set("DOWNLOAD_HANDLERS", {})
        ImpersonateAddon().update_settings(settings)
        assert set(settings.getdict("DOWNLOAD_HANDLERS").values()) == {HANDLER}


def test_the_addon_refuses_what_would_fail_every_request_later():
    with pytest.raises(ValueError, match="project's own"):
        ImpersonateAddon().update_settings(addon_settings({
            "IMPERSONATE_ENABLED": True, "DOWNLOAD_HANDLERS": {"https": "my.Handler"}}))
    with pytest.raises(ValueError, match="chrome999"):
        ImpersonateAddon().update_settings(addon_settings({
            "IMPERSONATE_ENABLED": True, "IMPERSONATE_DEFAULT_PROFILE": "chrome999"}))
    with pytest.raises(ValueError, match="TWISTED_REACTOR"):
        ImpersonateAddon().update_settings(addon_settings({
            "IMPERSONATE_ENABLED": True,
            "TWISTED_REACTOR": "twisted.internet.epollreactor.EPollReactor"}))


# ------------------------------------------------------------------ the handler on the wire


@pytest.mark.parametrize("profile", ["chrome131", "firefox135", "safari184"])
def test_the_handler_sends_exactly_what_the_library_sends_for_the_profile(profile):
    with FingerprintServer() as server:
        asyncio.run(library_fetch(server.url + "/library", profile))
        library = server.seen("/library")[0]

        async def fetch(handler, crawler):
            # the headers an identity of that browser gives (Scrapy's header case)
            request = impersonated(server.url + "/ours", profile)
            for name, value in library.headers:
                if name in ("user-agent", "accept", "accept-language", "accept-encoding") \
                        or name.startswith("sec-ch-ua"):
                    request.headers[name] = value
            return await handler.download_request(request)

        response = run(fetch)
        ours = server.seen("/ours")[0]
    assert response.status == 200 and response.protocol == "HTTP/2"
    assert ours.fingerprint["ja4"] == library.fingerprint["ja4"]
    assert ours.fingerprint["ja3n"] == library.fingerprint["ja3n"]
    assert ours.akamai == library.akamai
    assert ours.headers == library.headers        # names, values and the browser's order


def test_two_browser_families_show_two_fingerprints_and_the_request_headers_win():
    with FingerprintServer() as server:
        async def fetch(handler, crawler):
            for path, agent, profile in (("/chrome", CHROME_131, "chrome131"),
                                         ("/firefox", FIREFOX_135, "firefox135")):
                request = impersonated(server.url + path, profile)
                request.headers["User-Agent"] = agent
                request.headers["Accept-Language"] = "de-DE"
                request.headers["Cookie"] = "sid=1"
                await handler.download_request(request)

        run(fetch)
        chrome, firefox = server.seen("/chrome")[0], server.seen("/firefox")[0]
    assert chrome.fingerprint["ja4"] != firefox.fingerprint["ja4"]
    assert chrome.akamai != firefox.akamai
    assert chrome.pseudo_order == "m,a,s,p" and firefox.pseudo_order == "m,p,a,s"
    for seen, agent in ((chrome, CHROME_131), (firefox, FIREFOX_135)):
        assert seen.header("user-agent") == agent and seen.header("accept-language") == "de-DE"
        assert [v for k, v in seen.headers if k == "cookie"] == ["sid=1"]  # once
        # the browser's order: the request's value in the profile's place
        assert seen.header_names.index("user-agent") < seen.header_names.index("accept-language")
    # client hints come from the request only: none here, so the profile's are removed
    assert chrome.header("sec-ch-ua") is None and chrome.header("sec-ch-ua-platform") is None


def test_a_user_agent_without_identity_gets_its_own_profile_or_the_default_or_fails():
    with FingerprintServer() as server:
        async def fetch(handler, crawler):
            pinned = impersonated(server.url + "/pinned", None)
            pinned.headers["User-Agent"] = FIREFOX_135
            await handler.download_request(pinned)
            with pytest.raises(errors.ImpersonateProfileError, match="IMPERSONATE_DEFAULT"):
                await handler.download_request(impersonated(server.url + "/none", None))
            with pytest.raises(errors.ImpersonateProfileError, match="chrome999"):
                await handler.download_request(impersonated(server.url + "/bad", "chrome999"))
            return crawler.stats.get_stats()

        stats = run(fetch)
        assert server.seen("/pinned")[0].pseudo_order == "m,p,a,s"      # Firefox's
        assert not server.seen("/none") and not server.seen("/bad")
    assert stats["impersonate/errors/no_profile"] == 1
    assert stats["impersonate/errors/unknown_profile"] == 1

    async def default(handler, crawler):
        await handler.download_request(impersonated(server.url + "/default", None))

    with FingerprintServer() as server:
        run(default, {"IMPERSONATE_DEFAULT_PROFILE": "safari184"})
        assert server.seen("/default")[0].pseudo_order == "m,s,a,p"    # Safari's
    with pytest.raises(ValueError, match="safari1"):
        run(default, {"IMPERSONATE_DEFAULT_PROFILE": "safari1"})


def test_a_proxy_tunnel_keeps_the_fingerprint_and_the_credentials_stay_with_the_proxy():
    with FingerprintServer() as server, ForwardProxy("user", "s3cret") as proxy:
        async def fetch(handler, crawler):
            await handler.download_request(impersonated(server.url + "/direct"))
            via = impersonated(server.url + "/tunnel", proxy=f"http://127.0.0.1:{proxy.port}")
            via.headers["Proxy-Authorization"] = b"Basic " + base64.b64encode(b"user:s3cret")
            response = await handler.download_request(via)
            wrong = impersonated(server.url + "/refused", proxy=f"http://127.0.0.1:{proxy.port}")
            wrong.headers["Proxy-Authorization"] = b"Basic " + base64.b64encode(b"user:nope")
            with pytest.raises(errors.ImpersonateTunnelError):
                await handler.download_request(wrong)
            return response

        response = run(fetch)
        direct, tunnel = server.seen("/direct")[0], server.seen("/tunnel")[0]
        assert [r.path for r in proxy.relayed()] == ["CONNECT"] and proxy.unauthorised == 1
    assert response.status == 200
    assert direct.connection is not tunnel.connection
    assert tunnel.fingerprint == direct.fingerprint
    assert tunnel.header("proxy-authorization") is None


def test_an_http1_only_site_keeps_the_tls_fingerprint_and_says_so():
    with FingerprintServer(alpn=("http/1.1",)) as server:
        async def fetch(handler, crawler):
            response = await handler.download_request(impersonated(server.url + "/h1"))
            return response, crawler.stats.get_stats()

        response, stats = run(fetch)
        seen = server.seen("/h1")[0]
    with FingerprintServer() as server:
        asyncio.run(library_fetch(server.url + "/h2", "chrome131"))
        reference = server.seen("/h2")[0]
    assert response.protocol == "HTTP/1.1" and seen.protocol == "HTTP/1.1"
    assert seen.connection.hello.alpn == (b"h2", b"http/1.1")
    assert seen.fingerprint["ja4"] == reference.fingerprint["ja4"]
    assert stats["impersonate/http1_only"] == 1 and stats["impersonate/protocol/http1.1"] == 1


def test_a_tls_error_is_a_clear_retried_error_and_never_a_silent_fallback(caplog):
    with FingerprintServer(tls_fail=True) as server:
        async def fetch(handler, crawler):
            for _ in range(2):
                with pytest.raises(errors.ImpersonateTLSError):
                    await handler.download_request(impersonated(server.url + "/tls"))
            return crawler.stats.get_stats()

        stats = run(fetch)
        assert len(server.connections) == 2 and not server.seen()
    assert stats["impersonate/errors/tls_error"] == 2
    assert "impersonate/responses" not in stats
    warnings = [r for r in caplog.records if "tls_error" in r.getMessage()]
    assert len(warnings) == 1 and "IMPERSONATE_FALLBACK is off" in warnings[0].getMessage()
    # retried (then dead-lettered) like any download error: the add-on's RETRY_EXCEPTIONS
    settings = addon_settings({"IMPERSONATE_ENABLED": True})
    ImpersonateAddon().update_settings(settings)
    retry = RetryMiddleware.from_crawler(get_crawler(Spider, {
        "RETRY_EXCEPTIONS": settings.getlist("RETRY_EXCEPTIONS")}))
    for exc in (errors.ImpersonateTLSError("x"), errors.ImpersonateProfileError("x")):
        assert isinstance(exc, retry.exceptions_to_retry)


def test_scrapys_limits_and_decoding_stay_scrapys():
    body = gzip.compress(b"x" * 50_000)

    def route(seen):
        if seen.path == "/gzip":
            return 200, [("content-type", "text/plain"), ("content-encoding", "gzip")], body
        if seen.path == "/slow":
            import time
            time.sleep(3)
        return 200, [("content-type", "text/plain")], b"y" * 200_000

    with FingerprintServer(route=route) as server:
        async def fetch(handler, crawler):
            gz = await handler.download_request(impersonated(server.url + "/gzip"))
            with pytest.raises(DownloadCancelledError):
                await handler.download_request(impersonated(server.url + "/big",
                                                             download_maxsize=100_000))
            with pytest.raises(errors.DownloadTimeout):
                await handler.download_request(impersonated(server.url + "/slow",
                                                            download_timeout=1))
            return gz

        gz = run(fetch)
    # the body as sent: HttpCompressionMiddleware decodes it (and applies DOWNLOAD_MAXSIZE)
    assert gz.headers[b"Content-Encoding"] == b"gzip" and gz.body == body


def test_explicit_sessions_get_their_own_connections_and_reuse_them():
    def route(seen):  # a cookie is Scrapy's business: libcurl must not keep and resend it
        return 200, [("content-type", "text/html"), ("set-cookie", "kept=by-curl; Path=/")], b"ok"

    with FingerprintServer(route=route) as server:
        async def fetch(handler, crawler):
            for n in range(3):
                for who in ("alice", "bob"):
                    await handler.download_request(
                        impersonated(f"{server.url}/{who}/{n}", **{SESSION: who}))
                await handler.download_request(impersonated(f"{server.url}/anon/{n}"))
            return len(handler.pools)

        pools = run(fetch)
        by_path = {s.path: s.connection.id for s in server.seen()}
    assert pools == 3
    assert not any(s.header("cookie") for s in server.seen())
    for who in ("alice", "bob", "anon"):
        assert len({by_path[f"/{who}/{n}"] for n in range(3)}) == 1, who
    assert len({by_path["/alice/0"], by_path["/bob/0"], by_path["/anon/0"]}) == 3


def test_a_recrawls_conditional_request_gets_its_304():
    def route(seen):
        if seen.header("if-none-match") == '"v1"':
            return 304, [("etag", '"v1"')], b""
        return 200, [("etag", '"v1"'), ("content-type", "text/html")], b"<p>page</p>"

    with FingerprintServer(route=route) as server:
        async def fetch(handler, crawler):
            first = await handler.download_request(impersonated(server.url + "/p"))
            again = impersonated(server.url + "/p")
            again.headers["If-None-Match"] = first.headers[b"ETag"]
            return first, await handler.download_request(again)

        first, second = run(fetch)
    assert (first.status, second.status, second.body) == (200, 304, b"")


def test_session_pools_close_the_idle_and_the_least_recently_used():
    from crawlproject.impersonate.handler import SessionPools

    class Session:
        closed = 0

        async def close(self):
            Session.closed += 1

    async def main():
        now = [0.0]
        pools = SessionPools(lambda connections: Session(), limit=3, idle=60, clock=lambda: now[0])
        get = {}
        for who in ("a", "b", "c"):
            get[who] = pools.acquire(Request("https://x/", meta={SESSION: who}))
            now[0] += 1
        pools.release(get["a"])
        pools.release(get["c"])
        pools.acquire(Request("https://x/", meta={SESSION: "d"}))   # over the limit: a goes
        await asyncio.sleep(0)
        assert sorted(k[1] for k in pools.by_key) == ["b", "c", "d"] and Session.closed == 1
        now[0] += 120                                               # c idle; b, d still busy
        pools.acquire(Request("https://x/"))                        # shared: no sweep
        pools.acquire(Request("https://x/", meta={SESSION: "b"}))
        await asyncio.sleep(0)
        assert sorted(k[1] for k in pools.by_key) == ["b", "d"]    # d: a download under way
        assert Session.closed == 2
        await pools.close()

    asyncio.run(main())
