"""The Prometheus endpoint of a node (crawlproject/extensions/metrics.py), scraped
over HTTP during a real crawl, and the Grafana dashboard in deploy/ checked
against what the exporter serves."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.demo.site import FLAKY_EVERY, DemoSite
from crawlproject.keys import start_urls_key
from tests.crawl_helpers import ROOT, Node, node_env

pytestmark = pytest.mark.slow
PRODUCTS = 40


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """name → {sorted label items: value} of every sample."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(requests.get(url, timeout=10).text):
        # a family without samples yet (no error so far) is served all the same
        out.setdefault(family.name + ("_total" if family.type == "counter" else ""), {})
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def total(samples: dict[str, dict], name: str, **labels) -> float:
    return sum(v for k, v in samples.get(name, {}).items()
               if all((key, value) in k for key, value in labels.items()))


def test_a_node_serves_its_metrics_and_the_dashboard_queries_only_those(
        redis, redis_url, mongo_uri, database, tmp_path):
    env = node_env(redis_url, mongo_uri, database.name)
    settings = {"METRICS_ENABLED": True, "METRICS_PORT": 0, "MAX_IDLE_TIME_BEFORE_CLOSE": 5,
                "RETRY_BACKOFF_BASE": 0.1}
    with DemoSite(products=PRODUCTS, latency_ms=10) as site:  # with its 503-once faults
        node = Node("metered", tmp_path, env, settings=settings)
        try:
            node.wait_for_log("Prometheus metrics on")
            url = re.search(r"Prometheus metrics on (http://\S+/metrics)", node.text()).group(1)
            assert url.startswith("http://127.0.0.1:")
            before = scrape(url)
            redis.lpush(start_urls_key("products"), site.url)
            deadline = time.monotonic() + 120
            # Every product stored (product 7 needs the browser: it is the slowest)
            while database["products"].count_documents({}) < PRODUCTS:
                assert time.monotonic() < deadline, node.tail()
                time.sleep(0.2)
            after = scrape(url)
            assert node.wait(120) == 0, node.tail()
        finally:
            node.stop()
        served = site.stats()
    assert total(before, "crawlproject_pages_total") == 0
    assert total(after, "crawlproject_node_up", spider="products") == 1
    pages = sum(served.values())
    assert PRODUCTS <= total(after, "crawlproject_pages_total", spider="products") <= pages
    assert total(after, "crawlproject_items_total") == PRODUCTS
    assert total(after, "crawlproject_mongo_items_total") == PRODUCTS
    assert total(after, "crawlproject_mongo_batches_total") >= 1
    # Pages with id % FLAKY_EVERY == 0 answer 503 once: retried through the frontier.
    flaky = PRODUCTS // FLAKY_EVERY
    assert total(after, "crawlproject_retries_total") >= flaky
    assert total(after, "crawlproject_errors_total", kind="retry",
                 type="503 Service Unavailable") >= flaky   # Grafana's "Errors by kind"
    assert total(after, "crawlproject_download_seconds_count") >= PRODUCTS
    assert total(after, "crawlproject_enqueued_total") > PRODUCTS
    assert total(after, "crawlproject_duplicates_total") > 0
    # Labels stay bounded: no URL, host or port anywhere in a label.
    labels = {value for samples in after.values() for key in samples for _, value in key}
    assert not [v for v in labels if "/" in v or "127.0.0.1" in v], labels
    # The dashboard queries nothing the exporter does not serve.
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "crawlproject.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m for e in exprs for m in re.findall(r"\bcrawlproject_[a-z_]+", e)}
    queried |= set(re.findall(r"\bcrawlproject_[a-z_]+", json.dumps(dashboard["templating"])))
    assert queried and not queried - set(after), sorted(queried - set(after))
    # ... and every metric the exporter serves is on the dashboard.
    families = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in after}
    shown = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in queried}
    assert not {f for f in families if f.startswith("crawlproject_")} - shown


def test_mongo_outage_and_spool_gauges_read_the_pipeline_and_stats():
    from types import SimpleNamespace

    from scrapy.pipelines import ItemPipelineManager
    from scrapy.utils.test import get_crawler

    from crawlproject.extensions.metrics import StatsCollector

    crawler = get_crawler(settings_dict={
        "ITEM_PIPELINES": {"crawlproject.pipelines.mongo.MongoPipeline": 800},
        "MONGO_URI": "mongodb://127.0.0.1:9/", "MONGO_SPOOL_HANDOFF": False})
    manager = ItemPipelineManager.from_crawler(crawler)   # the real pipeline objects
    crawler.engine = SimpleNamespace(scraper=SimpleNamespace(itemproc=manager))
    crawler.stats.set_value("mongo/spooled", 7)
    crawler.stats.set_value("mongo/replayed", 2)

    def gauges():
        return {m.name: m.samples[0].value for m in StatsCollector(crawler).collect()
                if m.name in ("crawlproject_mongo_unavailable", "crawlproject_mongo_spool_pending")}

    assert gauges() == {"crawlproject_mongo_unavailable": 0.0,
                        "crawlproject_mongo_spool_pending": 5.0}
    manager.middlewares[0].outage.active = True   # what an outage sets
    assert gauges()["crawlproject_mongo_unavailable"] == 1.0


def test_retried_503s_are_errors_by_kind():
    """Issue 48: crawlproject_errors_total had no sample after 11 retried 503s (an
    answer Scrapy retries raises no exception), so Grafana's "Errors by kind" was
    empty. The real retry middleware retries a 503 and a timeout; the exporter
    counts them as kind "retry"."""
    from scrapy import Request, Spider
    from scrapy.http import Response
    from scrapy.utils.test import get_crawler
    from twisted.internet.error import TimeoutError as TwistedTimeoutError

    from crawlproject.extensions.metrics import StatsCollector
    from crawlproject.middlewares.retry import BackoffRetryMiddleware

    crawler = get_crawler(Spider)
    crawler.spider = Spider.from_crawler(crawler, "shop")
    from types import SimpleNamespace

    crawler.engine = SimpleNamespace(scheduler=None)   # Scrapy's own retries, no frontier
    retry = BackoffRetryMiddleware.from_crawler(crawler)
    for n in range(11):
        request = Request(f"http://127.0.0.1/{n}")
        assert isinstance(retry.process_response(request, Response(request.url, status=503,
                                                                    request=request)), Request)
    retry.process_exception(Request("http://127.0.0.1/t"), TwistedTimeoutError())
    [errors] = [m for m in StatsCollector(crawler).collect()
                if m.name == "crawlproject_errors"]
    assert {(s.labels["kind"], s.labels["type"]): s.value for s in errors.samples} == {
        ("retry", "503 Service Unavailable"): 11.0, ("retry", "TimeoutError"): 1.0}
