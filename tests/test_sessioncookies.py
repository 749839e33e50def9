"""Sticky sessions across two nodes: a login flow (``meta["session"]``) keeps
its proxy on every node, and its cookies follow it to whichever node downloads
its next pages (crawlproject.identity.cookies)."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.demo.proxy import ForwardProxy
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import Node, crawl_until_done, node_env

pytestmark = pytest.mark.slow
SESSIONS = ("alice", "bob", "carol", "dave")
PAGES = 8
PASSWORD = "St1cky-Pr0xy-Pass"


class LoginSite:
    """``/login/S`` sets ``sid=S-token`` and links ``/page/S/1..PAGES``; every
    request's path and Cookie header are recorded. 50 ms per answer, so that
    both nodes get pages of every session."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with site._lock:
                    site.seen.append((self.path, self.headers.get("Cookie") or ""))
                time.sleep(0.05)  # the site's own thread: a slow page
                parts = self.path.strip("/").split("/")
                extra = []
                if parts[0] == "login":
                    links = "".join(f'<a class="page" href="/page/{parts[1]}/{n}">{n}</a>'
                                    for n in range(1, PAGES + 1))
                    extra = [("Set-Cookie", f"sid={parts[1]}-token; Path=/")]
                else:
                    links = ""
                body = f"<html><body>{self.path}{links}</body></html>".encode()
                self.send_response(200)
                for name, value in [("Content-Type", "text/html"),
                                    ("Content-Length", str(len(body)))] + extra:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_session_keeps_its_proxy_and_its_cookies_on_every_node(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    with LoginSite() as site, ForwardProxy("p0", PASSWORD) as p0, \
            ForwardProxy("p1", PASSWORD) as p1, ForwardProxy("p2", PASSWORD) as p2:
        proxies = (p0, p1, p2)
        settings = {"SPIDER_MODULES": "tests.spiders", "ROBOTSTXT_OBEY": False,
                    "MAX_IDLE_TIME_BEFORE_CLOSE": 3, "CONCURRENT_REQUESTS": 2,
                    "SCHEDULER_PREFETCH": 1, "PROXY_POOL_ENABLED": True,
                    "PROXY_POOL": ",".join(p.url for p in proxies)}
        nodes = [Node(f"s{i}", tmp_path, env, spider="sessions", settings=settings)
                 for i in (1, 2)]
        codes = crawl_until_done(nodes, lambda: redis.lpush(start_urls_key("sessions"), *(
            json.dumps({"url": f"{site.url}login/{s}", "meta": {"session": s}})
            for s in SESSIONS)))
        assert codes == [0, 0], [n.tail() for n in nodes]
        via = defaultdict(set)  # session -> proxies its requests went through
        for i, proxy in enumerate(proxies):
            for record in proxy.relayed():
                via[record.path.split("/")[2]].add(i)
        seen = list(site.seen)
    stored = {d["url"] for d in database["sessions"].find({}, {"url": 1})}
    assert len(stored) == len(SESSIONS) * (PAGES + 1), [n.tail() for n in nodes]
    # Sticky: each session's login and pages through one proxy, whichever node sent them.
    assert {s: len(via[s]) for s in SESSIONS} == {s: 1 for s in SESSIONS}, dict(via)
    # Cookies follow the session: every page request carried its own session's cookie.
    pages = [(path, cookie) for path, cookie in seen if path.startswith("/page/")]
    assert len(pages) == len(SESSIONS) * PAGES
    wrong = [(p, c) for p, c in pages if c != f"sid={p.split('/')[2]}-token"]
    assert not wrong, wrong
    # Both nodes worked, and pages of a session logged in on the other node got
    # their cookies from the request (the case a per-process jar loses).
    assert all(n.stat("item_scraped_count") >= 1 for n in nodes)
    assert sum(n.stat("session_cookies/restored") for n in nodes) >= 1
    assert not [e for n in nodes for e in n.errors()]
