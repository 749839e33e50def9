"""OpenTelemetry tracing (crawlproject/extensions/tracing.py) on a real crawl.

The node exports to the OpenTelemetry SDK's own ``InMemorySpanExporter``
(installed in the node by tests/tracing_probe.py, which also notes when each
item came out of the last pipeline); the spans are compared with what the
demo site served and what MongoDB holds.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from urllib.parse import urlsplit

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from devtools.demo.site import DemoSite
from crawlproject.extensions.tracing import RequestTracing
from crawlproject.hooks import request_hooks
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import Node, assert_fetched_once, node_env, stored_products

pytestmark = pytest.mark.slow
PRODUCTS = 40
SECRET = "s3cr3t-t0ken"
DEAD_LINK = "/product/999999"  # the demo shop's 404


def test_one_span_per_fetched_page_from_lease_to_ack(redis, redis_url, mongo_uri, database,
                                                      tmp_path):
    probe_file = tmp_path / "spans.json"
    settings = {
        "TRACING_ENABLED": True, "TRACING_PROBE_FILE": probe_file,
        "EXTENSIONS": json.dumps({"tests.tracing_probe.SpanProbe": 100,
                                  "crawlproject.extensions.tracing.RequestTracing": 510}),
        "MAX_IDLE_TIME_BEFORE_CLOSE": 5, "RETRY_BACKOFF_BASE": 0.1,
        # the dead link (404) is retried twice, then dead-lettered: every outcome shows
        "RETRY_HTTP_CODES": "503,404", "RETRY_TIMES": 2,
        "RENDERING_ENABLED": False}  # no browser: product 7 is fetched statically (no item)
    with DemoSite(products=PRODUCTS) as site:  # with its 503-once pages
        node = Node("traced", tmp_path, node_env(redis_url, mongo_uri, database.name),
                    settings=settings)
        try:
            node.wait_for_log("Reading seeds from")
            seed = f"{site.url}?token={SECRET}"  # a secret in the query: redacted in spans
            redis.lpush(start_urls_key("products"), seed)
            assert node.wait(180) == 0, node.tail()
        finally:
            node.stop()
        served = site.stats()
    assert "OpenTelemetry tracing on" in node.text()
    data = json.loads(probe_file.read_text())
    spans, stored = data["spans"], data["stored"]
    assert_fetched_once(served, PRODUCTS)
    assert served[DEAD_LINK] == 3

    # One span per page the site served (every fetch went through a lease),
    # and one for the seed's first lease: it went back to the frontier,
    # unfetched, to wait for its site's robots.txt (fetched once for the
    # cluster: crawlproject.robots), a retry with no status. A lease given back
    # unstarted (a reserve sent back when a slow-down answer backed the site
    # off, which timing decides) ends as released, with no status either.
    waits = [s for s in spans if "http.response.status_code" not in s["attributes"]]
    seed_waits = [s for s in waits if urlsplit(s["attributes"]["url.full"]).path == "/"]
    assert [s["attributes"]["crawl.outcome"] for s in seed_waits] == ["retry"]
    assert all(s["attributes"]["crawl.outcome"] == "released"
               for s in waits if s not in seed_waits), waits
    spans = [s for s in spans if s not in waits]
    fetched = Counter(served)   # robots.txt too: leased from the frontier like any page
    assert Counter(urlsplit(s["attributes"]["url.full"]).path for s in spans) == fetched
    assert all(s["name"] == "crawl.request" for s in spans)

    host = urlsplit(site.url).hostname
    node_ids = {s["attributes"]["crawl.node"] for s in spans}
    assert len(node_ids) == 1 and node_ids.pop().startswith("traced-")
    for span in spans:
        attrs = span["attributes"]
        assert attrs["crawl.politeness_key"] == host and attrs["crawl.partition"] == 0
        assert attrs["crawl.spider"] == "products"
        assert attrs["http.response.status_code"] in (200, 404, 503), attrs
        assert span["start"] <= span["end"]
        if urlsplit(attrs["url.full"]).path == DEAD_LINK:
            continue
        # a 503 answer is retried through the frontier; everything else is done
        assert attrs["crawl.outcome"] == ("retry" if attrs["http.response.status_code"] == 503
                                          else "ack"), attrs
        assert span["status"] == "UNSET"
    dead_link = sorted((s["attributes"]["crawl.outcome"], s["status"]) for s in spans
                       if urlsplit(s["attributes"]["url.full"]).path == DEAD_LINK)
    assert dead_link == [("dead", "ERROR"), ("retry", "UNSET"), ("retry", "UNSET")]
    urls = [s["attributes"]["url.full"] for s in spans]
    assert SECRET not in json.dumps(spans)
    assert f"{site.url}?token=***" in urls

    # Items: each acknowledged span counts the items its page stored, and ends
    # only after they came out of the last pipeline.
    products = stored_products(database["products"])
    assert len(products) == PRODUCTS - 1  # product 7 needs the browser
    done = [s for s in spans if s["attributes"]["crawl.outcome"] == "ack"]
    by_page = {s["attributes"]["url.full"]: s for s in done}
    assert len(by_page) == len(done)
    for url, span in by_page.items():
        assert span["attributes"]["crawl.items_stored"] == (1 if url in products else 0), url
    assert Counter(item["page"] for item in stored) == Counter(list(products))
    for item in stored:
        assert by_page[item["page"]]["end"] >= item["at"], item["page"]
    assert sum(s["attributes"]["crawl.items_stored"] for s in spans) == len(products)


def test_without_the_packages_the_extension_is_disabled_with_a_reason(monkeypatch):
    # The venv has OpenTelemetry installed (requirements-dev.txt): hiding it from
    # the import system is the only way to be without it here.
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    crawler = get_crawler(Spider, {"TRACING_ENABLED": True})
    with pytest.raises(NotConfigured) as raised:
        RequestTracing.from_crawler(crawler)
    assert "checkout[tracing]" in str(raised.value)
    assert "TRACING_ENABLED is on" in str(raised.value)
    assert request_hooks(crawler) == []


def test_off_by_default_and_silent():
    crawler = get_crawler(Spider)
    with pytest.raises(NotConfigured) as raised:
        RequestTracing.from_crawler(crawler)
    assert raised.value.args == ()  # Scrapy logs a warning only for a reason given
    assert request_hooks(crawler) == []


def test_an_unknown_exporter_is_refused_by_name():
    crawler = get_crawler(Spider, {"TRACING_ENABLED": True, "TRACING_EXPORTER": "zipkin"})
    with pytest.raises(NotConfigured, match="TRACING_EXPORTER must be one of otlp, console"):
        RequestTracing.from_crawler(crawler)


def test_spans_reach_an_otlp_collector_over_http(tmp_path):
    """The exporter the extension makes itself (no provider in the process): OTLP/HTTP
    to a receiver on 127.0.0.1 that decodes what it gets with OpenTelemetry's protobufs."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from scrapy import Request

    from crawlproject.frontier.retrypolicy import LEASE_META

    received = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, ExportTraceServiceRequest.FromString(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        crawler = get_crawler(Spider, {"TRACING_ENABLED": True, "TRACING_ENDPOINT": endpoint})
        crawler.spider = crawler._create_spider("otlp")
        ext = RequestTracing.from_crawler(crawler)
        assert ext.provider is not None and request_hooks(crawler) == [ext]
        request = Request(f"http://user:{SECRET}@127.0.0.1:9/p?api_key={SECRET}&page=2",
                          meta={LEASE_META: "m1"})
        ext.request_leased(request, member="m1", partition=3, node="n-1-x", key="127.0.0.1")
        ext.request_settled(request, member="m1", outcome="dead")
        ext.provider.shutdown()  # what spider_closed does, in a thread
    finally:
        server.shutdown()
        server.server_close()
    assert [path for path, _ in received] == ["/v1/traces"]
    (resource,) = received[0][1].resource_spans
    service = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert service["service.name"] == "crawlproject"
    (span,) = [s for scope in resource.scope_spans for s in scope.spans]
    attrs = {a.key: a.value for a in span.attributes}
    assert span.name == "crawl.request" and span.status.code == 2  # STATUS_CODE_ERROR
    assert attrs["url.full"].string_value == "http://user:***@127.0.0.1:9/p?api_key=***&page=2"
    assert attrs["crawl.partition"].int_value == 3
    assert attrs["crawl.outcome"].string_value == "dead"
    assert SECRET.encode() not in received[0][1].SerializeToString()
