"""Impersonation in real crawls: ``scrapy crawl fingerprints`` nodes on a shared Redis
frontier, against the local TLS server of tests/tls_fingerprint.py (which computes
each connection's JA4/JA3N and HTTP/2 fingerprint itself)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from crawlproject.identity.middleware import IdentityMiddleware
from crawlproject.keys import FrontierKeys, start_urls_key
from crawlproject.impersonate import HANDLER
from crawlproject.impersonate.profiles import profile_for
from devtools.demo.proxy import ForwardProxy
from tests.crawl_helpers import ROOT, Node, crawl_until_done, node_env
from tests.tls_fingerprint import FingerprintServer

pytest.importorskip("curl_cffi")
from curl_cffi.requests import AsyncSession  # noqa: E402

pytestmark = pytest.mark.slow
PAGES = 8
PASSWORD = "Tls-Pr0xy-Pass"
BROWSERS = '["Chrome", "Firefox"]'
USER_SPIDER = '''
from crawlproject.spiders import RedisSpider


class ShopSpider(RedisSpider):
    name = "shop"
    seed_meta_allow = ["render"]

    def parse(self, response):
        yield {"url": response.url, "rendered": "playwright" in response.flags}
'''


class PlainPage:
    """A plain-http page for the browser (a self-signed certificate would stop Chromium)."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = b"<html><head><title>js</title></head><body><p>shown</p></body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/js"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def site(seen):
    """``/start/S`` links ``/page/S/1..PAGES``."""
    parts = seen.path.strip("/").split("/")
    links = ""
    if parts[0] == "start":
        links = "".join(f'<a class="page" href="/page/{parts[1]}/{n}">{n}</a>'
                        for n in range(1, PAGES + 1))
    return 200, [("content-type", "text/html")], f"<html><body>{links}</body></html>".encode()


def env_for(redis_url, mongo_uri, database) -> dict:
    env = node_env(redis_url, mongo_uri, database)
    # keep what this test process was given (e.g. curl_cffi from a directory of its own)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env["PYTHONPATH"],
                                                    os.environ.get("PYTHONPATH")) if p)
    return env


def sessions_of_each_family() -> dict[str, str]:
    """A session name whose identity is Chrome and one whose identity is Firefox, as
    every node computes them (the identity middleware of these settings)."""
    mw = IdentityMiddleware.from_crawler(get_crawler(Spider, {
        "IMPERSONATE_ENABLED": True, "IDENTITY_BROWSERS": json.loads(BROWSERS),
        "DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER}}))
    found: dict[str, str] = {}
    for n in range(200):
        identity = mw.choose(Request("https://x/", meta={"session": f"visitor{n}"}))
        found.setdefault(identity.family, f"visitor{n}")
    return {family: found[family] for family in ("chromium", "firefox")}


async def library_fetch(url: str, profile: str) -> None:
    async with AsyncSession(verify=False) as session:
        await session.get(url, impersonate=profile)


def test_two_nodes_send_each_sessions_browser_fingerprint_through_a_proxy_tunnel(
        redis, redis_url, mongo_uri, database, tmp_path):
    sessions = sessions_of_each_family()
    env = env_for(redis_url, mongo_uri, database.name)
    with FingerprintServer(route=site, latency=0.25) as server, \
            ForwardProxy("fp", PASSWORD) as proxy:
        settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                    "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 1,
                    "SCHEDULER_PREFETCH": 1, "IMPERSONATE_ENABLED": True,
                    "IDENTITY_BROWSERS": BROWSERS, "PROXY_POOL_ENABLED": True,
                    "PROXY_POOL": proxy.url}
        nodes = [Node(f"n{i}", tmp_path, env, spider="fingerprints", settings=settings)
                 for i in (1, 2)]
        codes = crawl_until_done(nodes, lambda: redis.lpush(start_urls_key("fingerprints"), *(
            json.dumps({"url": f"{server.url}/start/{s}", "meta": {"session": s}})
            for s in sessions.values())))
        assert codes == [0, 0], [n.tail() for n in nodes]
        seen = server.seen()
        tunnels = [r for r in proxy.relayed() if r.path == "CONNECT"]
        # what the library itself sends for each session's profile (direct, fresh)
        agents = {s: next(r.header("user-agent") for r in seen if f"/{s}" in r.path)
                  for s in sessions.values()}
        for s, agent in agents.items():
            asyncio.run(library_fetch(f"{server.url}/library/{s}", profile_for(agent)))
        reference = {s: server.seen(f"/library/{s}")[0].fingerprint for s in agents}
    node_of = {d["url"].split(str(server.port))[1]: d["node"]
               for d in database["fingerprints"].find({}, {"url": 1, "node": 1})}
    assert len(node_of) == len(sessions) * (PAGES + 1), [n.tail() for n in nodes]
    fingerprints = {}
    for family, s in sessions.items():
        pages = [r for r in seen if r.path.split("/")[2:3] == [s]]
        assert len(pages) == PAGES + 1
        # one story: every page of the session, whichever node sent it, the same
        # fingerprint, the same User-Agent, that of the session's profile
        wire = {json.dumps({k: v for k, v in r.fingerprint.items() if k != "header_order"},
                           sort_keys=True) for r in pages}
        assert wire == {json.dumps({k: v for k, v in reference[s].items()
                                    if k != "header_order"}, sort_keys=True)}, (family, wire)
        # the same headers in the same order (followed pages add a Referer)
        assert len({r.fingerprint["header_order"] for r in pages if "/page/" in r.path}) == 1
        assert {r.header("user-agent") for r in pages} == {agents[s]}
        assert pages[0].protocol == "HTTP/2" and not any(r.header("proxy-authorization")
                                                         for r in pages)
        # through the tunnel, by more than one node
        assert {node_of[r.path] for r in pages} == {"n1", "n2"}, family
        fingerprints[family] = pages[0].fingerprint
    assert re.search(r"Chrome/\d+", agents[sessions["chromium"]])
    assert fingerprints["chromium"]["ja4"] != fingerprints["firefox"]["ja4"]
    assert fingerprints["chromium"]["akamai"] != fingerprints["firefox"]["akamai"]
    assert len(tunnels) >= 2 and proxy.unauthorised == 0
    assert all(n.stat("impersonate/responses") >= 1 for n in nodes)
    assert not [e for n in nodes for e in n.errors()]
    assert not [n for n in nodes if "Disabled crawlproject.rendering" in n.text()]

    # Scrapy's own client (impersonation off): another fingerprint, HTTP/1.1
    database["fingerprints"].drop()
    with FingerprintServer(route=site) as server:
        plain = Node("plain", tmp_path, env, spider="fingerprints", settings={
            **settings, "IMPERSONATE_ENABLED": False, "PROXY_POOL_ENABLED": False})
        assert crawl_until_done([plain], lambda: redis.lpush(
            start_urls_key("fingerprints"), json.dumps({"url": f"{server.url}/start/x"}))) == [0]
        scrapy_seen = server.seen("/start/x")[0].fingerprint
    assert scrapy_seen["ja4"] not in (fingerprints["chromium"]["ja4"],
                                      fingerprints["firefox"]["ja4"])
    assert scrapy_seen["akamai"] is None and scrapy_seen["protocol"] == "HTTP/1.1"


def test_a_site_refusing_the_browser_hello_is_retried_then_dead_lettered_or_falls_back(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = env_for(redis_url, mongo_uri, database.name)

    def refuse_browsers(hello):   # Chromium's ALPS extension: curl's Chrome, not OpenSSL
        return 0x44cd in hello.extensions or 0x4469 in hello.extensions

    settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "IMPERSONATE_ENABLED": True,
                "IDENTITY_BROWSERS": '["Chrome"]', "RETRY_TIMES": 1,
                "RETRY_BACKOFF_BASE": 0.1}
    with FingerprintServer(route=site, tls_fail=refuse_browsers) as server:
        strict = Node("strict", tmp_path, env, spider="fingerprints", settings=settings)
        assert crawl_until_done([strict], lambda: redis.lpush(
            start_urls_key("fingerprints"), json.dumps({"url": f"{server.url}/page/x/1"}))) == [0]
        refused = len(server.connections)
        allowed = Node("fallback", tmp_path, env, spider="fingerprints",
                       settings={**settings, "IMPERSONATE_FALLBACK": True})
        assert crawl_until_done([allowed], lambda: redis.lpush(
            start_urls_key("fingerprints"), json.dumps({"url": f"{server.url}/page/y/1"}))) == [0]
        fetched = server.seen()
    # off: never downloaded with Scrapy's fingerprint; retried once, then dead-lettered
    assert refused == 2 and strict.stat("impersonate/errors/tls_error") == 2
    assert strict.stat("retry/count") == 1
    dead = [json.loads(v) for v in redis.lrange(FrontierKeys("fingerprints").dead, 0, -1)]
    assert any("tls" in json.dumps(d).lower() and "/page/x/1" in json.dumps(d) for d in dead), dead
    assert "IMPERSONATE_FALLBACK is off" in strict.text()
    # on: the page came with Scrapy's own client, flagged and counted
    assert [r.path for r in fetched] == ["/page/y/1"] and fetched[0].protocol == "HTTP/1.1"
    assert allowed.stat("impersonate/fallback/tls_error") == 1
    assert {d["url"] for d in database["fingerprints"].find()} == {f"{server.url}/page/y/1"}


def readme_blocks() -> str:
    """README's settings block for your own project, then its impersonation block."""
    section = (ROOT / "README.md").read_text().split("## Use it in your own Scrapy project", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "IMPERSONATE_ENABLED = True" in blocks[1]
    return blocks[0] + "\n" + blocks[1]


def test_the_readme_blocks_give_a_new_project_the_browsers_fingerprint_and_still_render(
        redis, redis_url, mongo_uri, database, tmp_path):
    subprocess.run([sys.executable, "-m", "scrapy", "startproject", "userproj"], cwd=tmp_path,
                   check=True, capture_output=True, timeout=60)
    project = tmp_path / "userproj"
    settings = project / "userproj" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + readme_blocks())
    (project / "userproj" / "spiders" / "shop.py").write_text(USER_SPIDER)
    env = env_for(redis_url, mongo_uri, database.name)
    log = tmp_path / "user.log"
    with FingerprintServer(route=site) as server, PlainPage() as page:
        redis.lpush(start_urls_key("shop"), f"{server.url}/start/user",
                    json.dumps({"url": page.url, "meta": {"render": True}}))
        out = subprocess.run(
            [sys.executable, "-m", "scrapy", "crawl", "shop", "-s", f"LOG_FILE={log}",
             "-s", "MAX_IDLE_TIME_BEFORE_CLOSE=2", "-s", f"REDIS_URL={redis_url}",
             "-s", f"MONGO_URI={mongo_uri}", "-s", f"MONGO_DATABASE={database.name}",
             "-s", "ROBOTSTXT_OBEY=False", "-s", "DOWNLOAD_DELAY=0",
             "-s", "DOWNLOAD_ALLOWED_NETWORKS=loopback"],   # the test sites
            cwd=project, env={**os.environ, **env}, capture_output=True, text=True, timeout=180)
        text = log.read_text(errors="replace")
        assert out.returncode == 0, text[-3000:] + out.stderr[-2000:]
        seen = server.seen("/start/user")[0]
        asyncio.run(library_fetch(server.url + "/library",
                                  profile_for(seen.header("user-agent"))))
        reference = server.seen("/library")[0]
    assert seen.fingerprint["ja4"] == reference.fingerprint["ja4"]
    assert seen.akamai == reference.akamai
    # the https page impersonated, the page marked for rendering rendered by Chromium
    assert "'impersonate/responses': 1" in text and "'rendering/responses': 1" in text
    assert not [line for line in text.splitlines() if "] WARNING:" in line or "ERROR" in line]
    assert {d["url"]: d["rendered"] for d in database["shop"].find()} == {
        f"{server.url}/start/user": False, page.url: True}
