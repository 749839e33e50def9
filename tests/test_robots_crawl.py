"""robots.txt as RFC 9309 says, in one real crawl: a real `scrapy crawl hosts`
node (FRONTIER_SECRET, the project's settings) against real local sites on
127.0.0.x whose robots.txt redirects (another host, http -> https with a
self-signed certificate, same host, a chain of three, a loop, six hops),
answers 404, 503 then recovers, refuses the first connections, is a gzip bomb,
is padded, or always answers 503. The in-process cases are in
tests/test_robots_rfc.py."""

import functools
import gzip
import os
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from crawlproject.frontier.queue import Frontier
from crawlproject.keys import start_urls_key
from crawlproject.robots import record as rec
from tests.crawl_helpers import Node, node_env
from tests.test_robots import KEYS, SIGNER
from tests.tls_fingerprint import make_certificate

PORT, TLS_PORT, LATE_PORT = 21010, 21011, 21012   # this helper's range (21000-21099)
RULES = b"User-agent: *\nDisallow: /p/2\n"
PAGES = {"/", "/p/1", "/p/2", "/p/3"}
RULED, ALL = PAGES - {"/p/2"}, PAGES
HOME = (b'<html><body><a class="page" href="/p/1">1</a><a class="page" href="/p/2">2</a>'
        b'<a class="page" href="/p/3">3</a></body></html>')


def http(n):
    return f"http://127.0.0.{n}:{PORT}"


def moved(location, status=301):
    return status, {"Location": location}, b""


@functools.cache
def _bomb() -> bytes:
    """32 MiB of robots.txt, 33 KiB of gzip."""
    return gzip.compress(RULES + b"#" * (32 << 20), 6)


@functools.cache
def _padded() -> bytes:
    """One rule, then 770 KiB of comments and groups for other crawlers."""
    return RULES + b"".join(b"# %s\nUser-agent: bot-%d\nDisallow: /%s\n" % (
        os.urandom(40).hex().encode(), i, os.urandom(8).hex().encode()) for i in range(6000))


#: host number -> path -> answer (status, headers, body), or a callable of the
#: count of that path's requests so far
SITES = {
    2: {"/robots.txt": moved(f"{http(3)}/robots.txt")},                     # other host
    3: {"/robots.txt": (200, {}, RULES)},
    4: {"/robots.txt": moved(f"https://127.0.0.4:{TLS_PORT}/robots.txt")},  # http -> https
    5: {"/robots.txt": moved("/robots-2024.txt", 302),                      # same host
        "/robots-2024.txt": (200, {}, RULES)},
    6: {"/robots.txt": moved("/r1"), "/r1": moved(f"{http(7)}/r2", 302),   # chain of three
        "/r3": (200, {}, RULES)},
    7: {"/r2": moved(f"{http(6)}/r3", 307)},
    8: {"/robots.txt": moved("/a"), "/a": moved("/robots.txt")},            # loop
    9: {"/robots.txt": moved("/h1"), **{f"/h{i}": moved(f"/h{i + 1}") for i in range(1, 6)},
        "/h6": (200, {}, b"User-agent: *\nDisallow: /\n")},                # six hops
    10: {"/robots.txt": (404, {}, b"")},
    11: {"/robots.txt": lambda n: (503, {}, b"") if n < 2 else (200, {}, RULES)},
    12: {"/robots.txt": (200, {}, RULES)},                                  # refused at first
    13: {"/robots.txt": lambda n: (200, {"Content-Encoding": "gzip"}, _bomb())},  # gzip bomb
    14: {"/robots.txt": (503, {}, b"")},                                    # always 503
    15: {"/robots.txt": lambda n: (200, {}, _padded())},                     # padded
    16: {"/robots.txt": (200, {}, RULES)},                                  # control
}
TLS_SITE = {"/robots.txt": (200, {}, RULES)}   # https://127.0.0.4
SEEDED = [2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16]


class Web:
    """The sites above, each on its own address; every request recorded."""

    def __init__(self, tmp_path):
        self.hits, self.lock = [], threading.Lock()
        self.servers = []
        web = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                host = int(self.server.server_address[0].rsplit(".", 1)[1])
                path = self.path
                with web.lock:
                    count = sum(1 for h in web.hits if h[:2] == (host, path))
                    web.hits.append((host, path, time.time()))
                tls = self.server.server_address[1] == TLS_PORT
                answer = (TLS_SITE if tls else SITES.get(host, {})).get(path)
                if callable(answer):
                    answer = answer(count)
                if answer is None:
                    answer = (200, {"Content-Type": "text/html"}, HOME if path == "/" else
                              b"<html><body>page</body></html>") if path in PAGES else \
                        (404, {}, b"")
                status, headers, body = answer
                self.send_response(status)
                for name, value in {"Content-Type": "text/plain", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.handler = Handler
        for n in {*SITES} - {12}:
            self._serve(ThreadingHTTPServer((f"127.0.0.{n}", PORT), Handler))
        cert, key = make_certificate(tmp_path, ips=("127.0.0.4",))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        tls = ThreadingHTTPServer(("127.0.0.4", TLS_PORT), Handler)
        tls.socket = context.wrap_socket(tls.socket, server_side=True)
        self._serve(tls)
        # Bound, not listening: connections are refused until listen() below.
        self.late = ThreadingHTTPServer(("127.0.0.12", LATE_PORT), Handler,
                                        bind_and_activate=False)
        self.late.server_bind()

    def _serve(self, server):
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def listen_late(self):
        self.late.server_activate()
        self._serve(self.late)

    def close(self):
        for server in self.servers:
            server.shutdown()
            server.server_close()
        self.late.server_close()

    def paths(self, n):
        return [h[1] for h in self.hits if h[0] == n]


def test_sites_whose_robots_txt_redirects_fails_or_explodes_are_crawled_by_the_rfc(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": True,
                "MAX_IDLE_TIME_BEFORE_CLOSE": 1, "DOWNLOAD_DELAY_JITTER": 0,
                "DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS": 32, "LOG_LEVEL": "INFO",
                "RETRY_TIMES": 1, "RETRY_BACKOFF_BASE": 0.1, "FRONTIER_BACKOFF_BASE": 0.2,
                "FRONTIER_BACKOFF_MAX": 1,
                "ROBOTSTXT_WAIT": 0.2, "ROBOTSTXT_MAX_WAIT": 4,
                "ROBOTSTXT_UNAVAILABLE_TTL": 0.5, "ROBOTSTXT_UNAVAILABLE_MAX_TTL": 1}
    late = f"http://127.0.0.12:{LATE_PORT}"
    web = Web(tmp_path)
    frontier = Frontier(redis, "hosts", "test")
    node = Node("r1", tmp_path, env, spider="hosts", settings=settings)
    try:
        node.wait_for_log("Reading seeds from")
        started = time.monotonic()
        redis.lpush(start_urls_key("hosts"),
                    *[f"{http(n)}/" for n in SEEDED if n != 12], f"{late}/")
        # The robots.txt of the late site failed through its retries (dead
        # letter): only then does the site listen.
        while not any(d["url"] == f"{late}/robots.txt" for d in frontier.dead_letters()):
            assert node.proc.poll() is None and time.monotonic() - started < 60, node.tail()
            time.sleep(0.05)
        web.listen_late()
        assert node.wait(120) == 0, node.tail()
    finally:
        node.stop()
        web.close()
    dead = {d["url"]: d for d in frontier.dead_letters()}

    # Redirects: the rules reached rule the ORIGINAL site; each hop once.
    for n in (2, 4, 5, 6):
        assert set(web.paths(n)) - {"/robots.txt", "/robots-2024.txt", "/r1", "/r3"} == RULED, n
    assert web.paths(3) == ["/robots.txt"] and web.paths(7) == ["/r2"]
    assert web.paths(2).count("/robots.txt") == 1
    assert web.paths(6).count("/r3") == 1
    assert redis.get(KEYS.record(f"{http(3)}")) is None
    # A loop and six hops: unavailable, allow all; the sixth target never fetched.
    assert ALL <= set(web.paths(8)) and ALL <= set(web.paths(9))
    assert "/h6" not in web.paths(9) and web.paths(9).count("/h5") == 1
    # 404: allow all. 503 twice, then rules: the pages waited, none dead-lettered.
    assert ALL <= set(web.paths(10))
    robots_11 = [t for n, p, t in web.hits if n == 11 and p == "/robots.txt"]
    assert len(robots_11) == 3
    assert min(t for n, p, t in web.hits if n == 11 and p in PAGES) > robots_11[-1]
    assert set(web.paths(11)) - {"/robots.txt"} == RULED
    # Refused connections (through the retries) were not the cluster's verdict.
    assert set(web.paths(12)) - {"/robots.txt"} == RULED
    # The gzip bomb: its rules obeyed, never decompressed beyond 500 KiB.
    assert set(web.paths(13)) - {"/robots.txt"} == RULED
    assert node.stat("httpcompression/response_bytes") < 1 << 20
    assert len(redis.get(KEYS.record(http(13)))) < 1024
    # every answer of the bomb and the padded file cut (once each, unless a
    # fetch was retried on a loaded machine), none of another site
    cut = web.paths(13).count("/robots.txt") + web.paths(15).count("/robots.txt")
    assert cut >= 2 and node.stat("robotstxt/truncated") == cut
    # The padded robots.txt: read up to 500 KiB, a record the size of its one rule.
    assert set(web.paths(15)) - {"/robots.txt"} == RULED
    raw = redis.get(KEYS.record(http(15)))
    assert len(raw) < 1024 and rec.decode_record(raw, SIGNER, http(15)).body == \
        b"user-agent: *\ndisallow: /p/2\n"
    # Always 503: its page dead-lettered with the reason after ROBOTSTXT_MAX_WAIT
    # seconds, and the node closed on its own.
    assert web.paths(14) and set(web.paths(14)) == {"/robots.txt"}
    reason = dead[f"{http(14)}/"]["reason"]
    assert f"robots.txt of {http(14)} not available after" in reason and "503" in reason
    pages_dead = [u for u in dead if not u.endswith(("/robots.txt", "/a", "/h5"))]
    assert pages_dead == [f"{http(14)}/"], pages_dead
    assert set(web.paths(16)) - {"/robots.txt"} == RULED
