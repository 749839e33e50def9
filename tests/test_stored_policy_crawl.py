"""One trust policy for stored requests, through real nodes: hostile frontier
payloads and page records (a proxy of the writer's choice, ``file://`` URLs,
another host, an included browser page, a forged POST, credentials, a
forged signature) are refused, counted and set aside, and the rest of the
crawl goes on."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools.demo.site import DemoSite
from crawlproject.frontier.queue import Frontier
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import Node, node_env
from tests.test_recrawl_crawl import SETTINGS as RECRAWL_SETTINGS
from tests.test_recrawl_crawl import first_pass, recrawl, revisit_pass

pytestmark = pytest.mark.slow
GOOD = 20


class Recorder:
    """An HTTP server on its own loopback host that records every request it
    gets, as an origin or as a proxy (an absolute URI in the request line)."""

    def __init__(self, host: str = "127.0.0.77"):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                body = b"<html><a href='file:///etc/hostname'>x</a></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                seen.append((self.command, self.path))
                self.do_GET()

            do_PUT = do_DELETE = do_PATCH = do_POST

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    server = Recorder()
    yield server
    server.close()


def test_hostile_frontier_payloads_are_refused_counted_and_the_crawl_goes_on(
        redis, redis_url, mongo_uri, database, tmp_path, recorder):
    secret = tmp_path / "secret.html"
    secret.write_text(f"<a href='file://{tmp_path}/other.html'>next</a>")
    with DemoSite(products=GOOD, latency_ms=5, faults=False) as site:
        good = [f"{site.url}product/{i}" for i in range(1, GOOD + 1)]
        frontier = Frontier(redis, "leaf", "attacker")
        hostile = {
            "proxy_not_allowed": {"url": f"{site.url}product/1?via-proxy",
                                  "meta": {"proxy": recorder.url}},
            "scheme_not_allowed": {"url": secret.as_uri()},
            "meta_not_allowed": {"url": f"{site.url}product/2?robots",
                                 "meta": {"dont_obey_robotstxt": True}},
        }
        include_page = {"url": f"{site.url}product/3?page",
                        "meta": {"playwright": True, "playwright_include_page": True}}
        # What a node of this crawl would store, written by someone without the
        # crawl's secret: scrapyd's egg upload (scrapyd installs and runs what is
        # posted there), credentials and a Host header, a private callback under a
        # made-up signature. Each gets the seed policy: refused, never sent.
        multipart = base64.b64encode(b"--x\r\nContent-Disposition: form-data; name=\"egg\""
                                     b"\r\n\r\nPK\x03\x04\r\n--x--\r\n").decode()
        forged = {
            "method_not_allowed": {"url": f"{recorder.url}/addversion.json", "method": "POST",
                                   "body": multipart, "headers": {
                                       "Content-Type": ["multipart/form-data; boundary=x"]}},
            "header_not_allowed": {"url": f"{recorder.url}/creds",
                                   "headers": {"Authorization": ["Basic YWRtaW46YWRtaW4="]}},
            "callback_not_allowed": {"url": f"{recorder.url}/private", "callback": "_parse"},
        }
        host_header = {"url": f"{recorder.url}/vhost", "headers": {"Host": ["internal"]}}
        for p in [*hostile.values(), include_page, *forged.values(), host_header]:
            frontier.push(json.dumps(p))
        frontier.push("~1" + "A" * 22 + ":" + json.dumps(  # a signature no node made
            {"url": f"{recorder.url}/signed", "callback": "_parse", "method": "PUT"}))
        # Limits beyond the node's own are capped, not refused: this one is crawled.
        frontier.push(json.dumps({"url": f"{site.url}product/4?limits",
                                  "meta": {"download_timeout": 1e9, "download_maxsize": 0}}))
        redis.lpush(start_urls_key("leaf"), *good)
        node = Node("n1", tmp_path, node_env(redis_url, mongo_uri, database.name), spider="leaf",
                    settings={"MAX_IDLE_TIME_BEFORE_CLOSE": 2, "ROBOTSTXT_OBEY": False,
                              "SPIDER_MODULES": "tests.spiders", "RENDERING_ENABLED": False})
        try:
            assert node.wait(240) == 0, node.tail()
        finally:
            node.stop()
    log = node.text()
    assert "'finish_reason': 'finished'" in log, node.tail()
    assert recorder.seen == []     # nothing through the writer's proxy, nothing forged sent
    stored = {d["url"] for d in database["leaf"].find()}
    assert set(good) <= stored and f"{site.url}product/4?limits" in stored
    assert not any(url.startswith("file:") or "?via-proxy" in url or "?robots" in url
                   or "?page" in url for url in stored)
    refused = len(hostile) + 1 + len(forged) + 2
    invalid = frontier.invalid_entries()
    assert len(invalid) == refused and all(r["reason"] for r in invalid)
    assert node.stat("scheduler/invalid") == refused
    for code in [*hostile, *forged]:
        assert node.stat(f"scheduler/invalid/{code}") >= 1, code
    assert node.stat("scheduler/invalid/meta_not_allowed") == 2   # the included page too
    assert node.stat("scheduler/invalid/header_not_allowed") == 2     # and the Host header
    assert node.stat("scheduler/invalid/callback_not_allowed") == 2   # the forged signature


def test_hostile_page_records_are_refused_marked_and_the_revisits_go_on(
        redis, redis_url, mongo_uri, database, tmp_path, recorder):
    env = node_env(redis_url, mongo_uri, database.name)
    secret = tmp_path / "secret.html"
    secret.write_text(f"<a href='file://{tmp_path}/other.html'>next</a>")
    with DemoSite(products=10, per_page=5, faults=False) as site:
        first_pass(redis, tmp_path, env, site, RECRAWL_SETTINGS)
        pages = database["products_pages"]
        total = pages.count_documents({})
        base = site.url.rstrip("/")
        hostile = {
            f"{base}/product/1": ("scheme_not_allowed", {"url": secret.as_uri(),
                                                         "callback": "parse_product"}),
            f"{base}/product/2": ("other_site", {"url": f"{recorder.url}/product/2",
                                                 "callback": "parse_product"}),
            f"{base}/product/3": ("proxy_not_allowed", {"url": f"{base}/product/3",
                                                        "meta": {"proxy": recorder.url}}),
        }
        for url, (_, request) in hostile.items():
            assert pages.update_one({"url": url}, {"$set": {"request": json.dumps(request)}}
                                    ).matched_count == 1
        out = recrawl(redis_url, mongo_uri, database.name, "--now")
        assert out.returncode == 0, out
        nodes, codes = revisit_pass(tmp_path, env)
        served = site.served()
    node = nodes[0]
    assert codes == [0], node.tail()
    assert recorder.seen == []
    assert node.stat("recrawl/invalid_records") == len(hostile)
    for url, (code, _) in hostile.items():
        assert node.stat(f"recrawl/invalid_records/{code}") == 1, code
        record = pages.find_one({"url": url})
        assert record["invalid"]["code"] == code and "next_visit" not in record, record
    # Every other page was revisited; no item came from a local file.
    assert node.stat("recrawl/fed") == total - len(hostile)
    assert served["paths"].get("/product/4")
    assert not any(d["url"].startswith("file:") for d in database["products"].find())
