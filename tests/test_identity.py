"""Browser identities (crawlproject.identity.useragents, crawlproject.identity.middleware).

Unit tests build the middleware from real settings with Scrapy's own
``get_crawler``; the end-to-end test runs two real ``scrapy crawl hosts`` nodes
against the multi-host demo site, which records every request's headers and
the node's source address (each node binds its own 127.0.0.x)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections import defaultdict

import pytest
from scrapy import Request, Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from crawlproject.identity.middleware import IdentityMiddleware, parse_rotation
from crawlproject.identity.session import IDENTITY, PROXY_ID, SESSION
from crawlproject.serialization import request_from_json, request_to_json
from crawlproject.signing import Signer

NODE = Signer([b"n" * 16], "demo")   # the requests a node stores itself
from crawlproject.identity.useragents import PoolFilter, identity_for, load_pool, pick
from tests.crawl_helpers import ROOT

BRANDS = re.compile(r'"([^"]+)";v="(\d+)"')
SCRAPY_UA = b"Scrapy/2.19.0 (+https://scrapy.org)"


def middleware(settings: dict | None = None, spider_ua: str | None = None) -> IdentityMiddleware:
    crawler = get_crawler(Spider, settings or {})
    mw = IdentityMiddleware.from_crawler(crawler)
    spider = Spider("s")
    if spider_ua is not None:
        spider.user_agent = spider_ua
    mw.spider_opened(spider)
    return mw


def scrapy_request(url: str, **kwargs) -> Request:
    """A request as it reaches 610: Scrapy's default headers already set at 400-590."""
    request = Request(url, **kwargs)
    request.headers.setdefault(b"Accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
    request.headers.setdefault(b"Accept-Language", b"en")
    request.headers.setdefault(b"User-Agent", SCRAPY_UA)
    request.headers.setdefault(b"Accept-Encoding", b"gzip, deflate, br, zstd")
    return request


def sent(mw: IdentityMiddleware, request: Request) -> dict[str, str]:
    assert mw.process_request(request) is None
    return {k.decode().lower(): v[-1].decode() for k, v in request.headers.items()}


def ua_major(user_agent: str, token: str) -> int:
    return int(re.search(re.escape(token) + r"(\d+)", user_agent).group(1))


def expected_platform(user_agent: str) -> str:
    for token, platform in (("Windows", "Windows"), ("Android", "Android"), ("CrOS", "Chrome OS"),
                            ("Macintosh", "macOS"), ("Linux", "Linux"), ("X11", "Linux")):
        if token in user_agent:
            return platform
    return "Unknown"


def assert_coherent(headers: dict[str, str]) -> None:
    """The headers a real browser of the User-Agent's family would send."""
    ua = headers["user-agent"]
    if "Chrome/" in ua:
        chrome = ua_major(ua, "Chrome/")
        if chrome < 89:  # Chromium sends no client hints before 89
            assert "sec-ch-ua" not in headers, headers
            return
        brands = dict(BRANDS.findall(headers["sec-ch-ua"]))
        assert brands["Chromium"] == str(chrome), headers
        own = {"Edg/": "Microsoft Edge", "OPR/": "Opera", "SamsungBrowser/": "Samsung Internet"}
        token = next((t for t in own if t in ua), None)
        name = own[token] if token else "Google Chrome"
        assert brands[name] == str(ua_major(ua, token) if token else chrome), headers
        assert len(brands) == 3  # Chromium, the browser, one GREASE brand
        assert headers["sec-ch-ua-platform"] == f'"{expected_platform(ua)}"', headers
        assert headers["sec-ch-ua-mobile"] == ("?1" if "Mobile" in ua else "?0"), headers
        assert "image/avif" in headers["accept"] and headers["accept-language"] == "en-US,en;q=0.9"
    else:
        assert not [h for h in headers if h.startswith("sec-ch-ua")], headers
        language = "en-US,en;q=0.5" if "Firefox/" in ua else "en-US,en;q=0.9"
        assert headers["accept-language"] == language, headers
        assert "image/avif" not in headers["accept"], headers
    assert headers["accept-encoding"].startswith("gzip, deflate, br"), headers


# ------------------------------------------------------------------ the pool


def test_filters_keep_only_the_requested_browsers_and_os():
    firefox_linux = load_pool(PoolFilter(browsers=("Firefox",), os=("Linux",)))
    assert firefox_linux and all(i.family == "firefox" for i in firefox_linux)
    assert all("Firefox/" in i.user_agent and ("Linux" in i.user_agent or "X11" in i.user_agent)
               for i in firefox_linux)
    safari = load_pool(PoolFilter(browsers=("Safari",), platforms=("desktop",)))
    assert safari and all("Macintosh" in i.user_agent and "Chrome/" not in i.user_agent
                          for i in safari)
    mobile = load_pool(PoolFilter(browsers=("Chrome Mobile",), platforms=("mobile",)))
    assert mobile and all("Android" in i.user_agent and "Mobile" in i.user_agent for i in mobile)
    recent = load_pool(PoolFilter(browsers=("Chrome",), min_version=130))
    assert recent and all(ua_major(i.user_agent, "Chrome/") >= 130 for i in recent)
    common = load_pool(PoolFilter(browsers=("Chrome",), min_percentage=0.05))
    assert 0 < len(common) < len(load_pool(PoolFilter(browsers=("Chrome",))))
    # Ordered and free of duplicates: every node holds the same pool.
    agents = [i.user_agent for i in load_pool(PoolFilter())]
    assert agents == sorted(set(agents)) and not [a for a in agents if a.startswith('"')]


def test_unknown_filter_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown identity browsers \['chrome'\].*'Chrome'"):
        load_pool(PoolFilter(browsers=("chrome",)))
    with pytest.raises(ValueError, match="unknown identity os"):
        load_pool(PoolFilter(os=("Windows 11",)))
    with pytest.raises(ValueError, match="no User-Agent matches"):
        load_pool(PoolFilter(browsers=("Safari",), min_version=500))


def test_every_identity_of_every_browser_has_coherent_headers():
    pool = load_pool(PoolFilter(browsers=("Chrome", "Edge", "Opera", "Firefox", "Safari",
                                          "Chrome Mobile", "Samsung Internet", "Mobile Safari"),
                                platforms=("desktop", "mobile", "tablet")))
    families = {i.family for i in pool}
    assert families == {"chromium", "firefox", "safari"}
    for identity in pool:
        assert_coherent({"user-agent": identity.user_agent,
                         **{k.lower(): v for k, v in identity.as_meta()["headers"].items()}})


@pytest.mark.parametrize("ua, sec_ch_ua", [
    # Values real browsers sent (their GREASE brand and order vary with the version).
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36",
     '"Not_A Brand";v="8", "Chromium";v="120", "Google Chrome";v="120"'),
    ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/124.0.0.0 Safari/537.36",
     '"Chromium";v="124", "Google Chrome";v="124", "Not-A.Brand";v="99"'),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/131.0.0.0 Safari/537.36",
     '"Google Chrome";v="131", "Chromium";v="131", "Not_A Brand";v="24"'),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/120.0.0.0 Safari/537.36 Edg/120.0.0.0",
     '"Not_A Brand";v="8", "Chromium";v="120", "Microsoft Edge";v="120"'),
])
def test_client_hints_are_those_the_real_browser_sent(ua, sec_ch_ua):
    assert dict(identity_for(ua).hints)["Sec-CH-UA"] == sec_ch_ua


def test_firefox_and_safari_send_no_client_hints():
    firefox = identity_for("Mozilla/5.0 (X11; Linux x86_64; rv:137.0) Gecko/20100101 Firefox/137.0")
    safari = identity_for("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 "
                          "(KHTML, like Gecko) Version/18.3.1 Safari/605.1.15")
    assert (firefox.family, firefox.hints) == ("firefox", ())
    assert (safari.family, safari.hints) == ("safari", ())
    assert dict(firefox.headers)["Accept-Encoding"] == "gzip, deflate, br, zstd"
    assert dict(safari.headers)["Accept-Encoding"] == "gzip, deflate, br"


# ------------------------------------------------------------- the middleware


def test_same_session_same_identity_on_every_node_and_sessions_vary():
    node_a, node_b = middleware(), middleware()  # two nodes: nothing shared but settings
    chosen = {}
    for n in range(60):
        url = f"https://shop{n}.example/p/{n}"
        a = sent(node_a, scrapy_request(url))
        for path in ("/", "/x", "/y"):
            assert sent(node_b, scrapy_request(f"https://shop{n}.example{path}")) == a
        assert_coherent(a)
        chosen[n] = a["user-agent"]
    assert len(set(chosen.values())) >= 15, chosen
    # The session, not the URL, decides: one explicit session over many hosts.
    agents = {sent(node_a, scrapy_request(f"https://h{n}.example/", meta={SESSION: "login"}))
              ["user-agent"] for n in range(20)}
    assert len(agents) == 1
    by_proxy = {sent(node_a, scrapy_request(f"https://h{n}.example/", meta={PROXY_ID: "p1:8080"}))
                ["user-agent"] for n in range(20)}
    assert len(by_proxy) == 1


def test_rotation_per_request_and_every_n_requests():
    per_request = middleware({"IDENTITY_ROTATION": "request"})
    agents = [sent(per_request, scrapy_request("https://a.example/"))["user-agent"]
              for _ in range(20)]
    assert len(set(agents)) >= 8, agents
    every_3 = middleware({"IDENTITY_ROTATION": 3})
    agents = [sent(every_3, scrapy_request("https://a.example/"))["user-agent"] for _ in range(30)]
    blocks = [agents[i:i + 3] for i in range(0, 30, 3)]
    assert all(len(set(block)) == 1 for block in blocks), blocks
    assert len({block[0] for block in blocks}) >= 4, blocks
    # Another session has its own count.
    assert len({sent(every_3, scrapy_request("https://b.example/"))["user-agent"]
                for _ in range(3)}) == 1
    assert [parse_rotation(v) for v in ("session", None, "request", "5", 7)] == [0, 0, 1, 5, 7]
    for bad in ("daily", 0, -2, True):
        with pytest.raises(ValueError, match="IDENTITY_ROTATION"):
            parse_rotation(bad)


def test_a_pinned_user_agent_is_left_alone():
    for mw in (middleware({"USER_AGENT": "mybot/1.0"}), middleware(spider_ua="mybot/1.0")):
        request = scrapy_request("https://a.example/", headers={"User-Agent": "mybot/1.0"})
        before = dict(request.headers)
        assert sent(mw, request) and dict(request.headers) == before
        assert IDENTITY not in request.meta
        assert mw.crawler.stats.get_value("identity/pinned/spider") == 1
    mw = middleware()
    own = scrapy_request("https://a.example/", headers={"User-Agent": "MyBrowser/2"})
    assert sent(mw, own)["user-agent"] == "MyBrowser/2" and "sec-ch-ua" not in sent(mw, own)
    kept = scrapy_request("https://a.example/", meta={"dont_rotate_identity": True})
    assert sent(mw, kept)["user-agent"] == SCRAPY_UA.decode()
    assert mw.crawler.stats.get_value("identity/pinned/request") == 3


def test_the_spiders_own_headers_win_but_hints_follow_the_user_agent():
    mw = middleware()
    request = scrapy_request("https://a.example/", headers={"Accept-Language": "de-DE,de;q=0.9",
                                                            "Accept": "application/json"})
    headers = sent(mw, request)
    assert headers["accept-language"] == "de-DE,de;q=0.9" and headers["accept"] == "application/json"
    assert headers["user-agent"] != SCRAPY_UA.decode()
    meta = request.meta[IDENTITY]
    assert meta["user_agent"] == headers["user-agent"] and meta["id"]
    assert meta["headers"]["Accept-Language"] in ("en-US,en;q=0.9", "en-US,en;q=0.5")
    # Transient: never written to the frontier.
    assert IDENTITY not in request_from_json(request_to_json(request, None, signer=NODE), None,
                                             signer=NODE).meta


def test_a_request_that_changes_session_changes_its_whole_identity():
    """A request back from the frontier (retry, redirect, another node) still
    carries its previous identity's headers: they are recognised and replaced."""
    mw = middleware()
    chromium = next(n for n in range(200) if pick(mw.pool, f"h:h{n}.example").hints)
    other = next(n for n in range(200)
                 if pick(mw.pool, f"h:h{n}.example").family != "chromium")
    first = scrapy_request(f"https://h{chromium}.example/")
    assert "sec-ch-ua" in sent(mw, first)
    stored = request_from_json(request_to_json(first, None, signer=NODE), None, signer=NODE)
    moved = stored.replace(url=f"https://h{other}.example/")
    headers = sent(mw, moved)
    assert headers["user-agent"] == pick(mw.pool, f"h:h{other}.example").user_agent
    assert_coherent(headers)  # no stale client hints, the new family's Accept-Language
    assert mw.crawler.stats.get_value("identity/pinned/request") is None


def test_client_hints_only_over_https_or_to_loopback():
    mw = middleware({"IDENTITY_BROWSERS": ["Chrome"], "IDENTITY_MIN_VERSION": 100})
    assert "sec-ch-ua" in sent(mw, scrapy_request("https://a.example/"))
    assert "sec-ch-ua" in sent(mw, scrapy_request("http://127.0.0.3:8000/"))
    plain = scrapy_request("http://a.example/")
    assert "sec-ch-ua" not in sent(mw, plain) and "Sec-CH-UA" not in plain.meta[IDENTITY]["headers"]


def test_settings_switch_it_off_and_bad_values_are_clear_errors():
    with pytest.raises(NotConfigured):
        middleware({"IDENTITY_ENABLED": False})
    with pytest.raises(ValueError, match="unknown identity browsers"):
        middleware({"IDENTITY_BROWSERS": "Chrome,Netscape"})
    no_compression = middleware({"COMPRESSION_ENABLED": False})
    headers = sent(no_compression, Request("https://a.example/"))
    assert "accept-encoding" not in headers and "accept-language" in headers


# ------------------------------------------------------------------ no network

NO_NETWORK = textwrap.dedent("""
    import socket, urllib.request

    calls = []

    def refuse(*args, **kwargs):  # recorded too: a caller may swallow the error
        calls.append(args)
        raise AssertionError(f"network call: {args!r}")

    socket.socket.connect = socket.socket.connect_ex = refuse
    socket.getaddrinfo = socket.create_connection = refuse
    try:  # the guard itself works
        urllib.request.urlopen("http://127.0.0.1:9/", timeout=1)
        raise SystemExit("guard failed")
    except AssertionError:
        calls.clear()

    from scrapy import Request, Spider
    from scrapy.utils.test import get_crawler
    from crawlproject.identity.middleware import IdentityMiddleware
    import fake_useragent
    mw = IdentityMiddleware.from_crawler(get_crawler(Spider, {"IDENTITY_ROTATION": "request"}))
    mw.spider_opened(Spider("s"))
    for n in range(50):
        request = Request(f"https://h{n}.example/")
        mw.process_request(request)
    print("UA", fake_useragent.UserAgent().random)
    assert not calls, calls
    print("OK", len(mw.pool), request.headers[b"User-Agent"].decode())
""")


def test_fake_useragent_makes_no_network_call():
    proc = subprocess.run([sys.executable, "-c", NO_NETWORK], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^OK \d+ Mozilla/5\.0", proc.stdout, re.M), proc.stdout


# ------------------------------------------------------------------ end to end


@pytest.mark.slow
def test_two_nodes_give_each_host_one_coherent_identity(redis, redis_url, mongo_uri, database,
                                                        tmp_path):
    from devtools.demo.hosts import MultiHostSite
    from crawlproject.keys import start_urls_key
    from tests.crawl_helpers import Node, crawl_until_done, node_env

    hosts = [f"127.0.0.{i}" for i in range(2, 8)]
    clients = {"n1": "127.0.0.201", "n2": "127.0.0.202"}
    env = node_env(redis_url, mongo_uri, database.name)
    base = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
            "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
            # Few requests per node: neither node can take a whole host's pages alone.
            "CONCURRENT_REQUESTS": 4,
            "LOG_LEVEL": "INFO"}
    with MultiHostSite(hosts, pages=30, per_page=10, latency_ms=50, record_headers=True) as site:
        nodes = [Node(name, tmp_path, env, spider="hosts",
                      settings={**base, "DOWNLOAD_BIND_ADDRESS": address})
                 for name, address in clients.items()]
        codes = crawl_until_done(
            nodes, lambda: redis.lpush(start_urls_key("hosts"), *site.root_urls()))
        seen = site.seen()
        expected = {h: site.expected_paths(h) for h in hosts}
    assert codes == [0, 0], [n.tail() for n in nodes]
    by_host = defaultdict(list)
    for record in seen:
        by_host[record.host].append(record)
    identity_headers = ("user-agent", "accept", "accept-language", "accept-encoding",
                        "sec-ch-ua", "sec-ch-ua-mobile", "sec-ch-ua-platform")
    agents = {}
    for host in hosts:
        records = by_host[host]
        assert {r.path for r in records} == expected[host]
        variants = {tuple(r.headers.get(h) for h in identity_headers) for r in records}
        assert len(variants) == 1, (host, variants)        # one identity per host, all nodes
        assert_coherent(records[0].headers)
        assert "Scrapy" not in records[0].headers["user-agent"]
        agents[host] = records[0].headers["user-agent"]
    both = [h for h in hosts if {r.client for r in by_host[h]} == set(clients.values())]
    assert len(both) >= 3, {h: {r.client for r in by_host[h]} for h in hosts}
    assert len(set(agents.values())) >= 2, agents             # hosts get different identities
    assert all(node.stat("identity/assigned") > 0 for node in nodes)
