"""A Prometheus endpoint per node (prometheus-client, the ``metrics`` extra), opt-in.

``METRICS_ENABLED = True`` serves ``http://METRICS_HOST:METRICS_PORT/metrics``
(127.0.0.1:9410 by default; ``METRICS_PORT = 0`` picks a free port, logged) from
a thread of the node. Counters are read from the crawler's stats when Prometheus
scrapes, so they cost nothing per request; only the download-time histogram is
observed per response. Labels are bounded: ``spider``, and for errors ``kind``
(download, callback, dead letter, retry: a download retried, e.g. a 503 or a
timeout) and ``type`` (an exception class name, a dead-letter kind or a retry
reason such as ``503 Service Unavailable``, all from code, never from pages). No URL, host, proxy or
credential is ever a label or a value.

``deploy/prometheus.yml`` scrapes the nodes; ``deploy/grafana/crawlproject.json``
is a dashboard of these metrics (``tests/test_metrics.py`` checks that every
metric it queries is one this exporter serves).
"""

from __future__ import annotations

import logging

from scrapy import signals
from scrapy.exceptions import NotConfigured

from crawlproject.defaults import setting

logger = logging.getLogger(__name__)

PREFIX = "crawlproject"
METRICS_EXTRA = "pip install '/path/to/checkout[metrics]' (this package's checkout or wheel)"

#: counter name (without _total) → (help, stats key)
COUNTERS = {
    "requests": ("requests sent to the downloader", "downloader/request_count"),
    "pages": ("responses received", "response_received_count"),
    "items": ("items scraped", "item_scraped_count"),
    "items_dropped": ("items dropped (validation)", "item_dropped_count"),
    "download_bytes": ("response bytes downloaded", "downloader/response_bytes"),
    "retries": ("download retries (through the frontier's delayed set)", "retry/count"),
    "callback_retries": ("pages retried after their callback raised",
                         "scheduler/callback_retries"),
    "dead_letters": ("requests dead-lettered", "scheduler/dead"),
    "enqueued": ("requests this node sent to the frontier", "scheduler/enqueued/redis"),
    "duplicates": ("requests the Bloom filter or the node found already seen",
                   "dupefilter/filtered"),
    "acked": ("requests acknowledged (done, items stored)", "scheduler/acked"),
    "reclaimed": ("leases of dead nodes this node put back", "scheduler/reclaimed"),
    "redis_errors": ("failed frontier calls (Redis unreachable)", "scheduler/redis_errors"),
    "mongo_items": ("items handed to the MongoDB writer", "mongo/items"),
    "mongo_batches": ("MongoDB bulk writes", "mongo/batches"),
    "mongo_retries": ("MongoDB bulk write retries", "mongo/retries"),
    "mongo_spooled": ("items written to the local spool (MongoDB unreachable)", "mongo/spooled"),
    "mongo_replayed": ("spooled items stored after all", "mongo/replayed"),
    "mongo_outages": ("MongoDB outages seen", "mongo/outages"),
    "proxy_bans": ("proxy bans detected", "proxy/bans"),
    "recrawl_fed": ("due pages this node put back into the frontier", "recrawl/fed"),
    "recrawl_unchanged": ("revisits that found the page unchanged (304 or same body)",
                          "recrawl/unchanged"),
    "recrawl_changed": ("revisits that found the page changed", "recrawl/changed"),
    "recrawl_gone": ("revisits that found the page gone (404/410)", "recrawl/gone"),
}
#: gauge name → help, read from the frontier client
FRONTIER_GAUGES = {
    "frontier_queued": "requests queued in the frontier (cluster, last seen by this node)",
    "frontier_delayed": "requests waiting in the delayed set (retries, politeness)",
    "frontier_inflight": "requests leased to nodes (cluster, last seen by this node)",
    "node_prefetched": "requests prefetched by this node, not yet started",
    "node_leases": "requests leased to this node (prefetched or being worked on)",
    "node_downloading": "requests in this node's downloader (waiting for a slot or under way)",
}
#: errors by kind: stats prefix → kind label
ERROR_PREFIXES = {
    "downloader/exception_type_count/": "download",
    "spider_exceptions/": "callback",
    "scheduler/dead/": "dead_letter",
    # Scrapy's retry/reason_count/<reason>: an answer it retries (429, 5xx) raises no
    # exception, so without these 503s retried through the frontier counted nowhere
    "retry/reason_count/": "retry",
}
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def load_prometheus_client():
    """prometheus_client, or NotConfigured naming the ``metrics`` extra (imported
    only when metrics are on: a node without them needs no prometheus-client)."""
    try:
        import prometheus_client
        import prometheus_client.core
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "prometheus_client":
            raise
        raise NotConfigured(f"METRICS_ENABLED needs prometheus-client ({exc.name} is "
                            f"missing): {METRICS_EXTRA}, or METRICS_ENABLED = False") from None
    return prometheus_client


class StatsCollector:
    """A prometheus-client collector over one crawler's stats and frontier."""

    def __init__(self, crawler):
        self.crawler = crawler

    def _stats(self) -> dict:
        for _ in range(3):  # the reactor thread may add a key while we copy
            try:
                return dict(self.crawler.stats.get_stats())
            except RuntimeError:
                continue
        return {}

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self._stats()
        spider = getattr(self.crawler.spider, "name", "") or ""
        for name, (help_, key) in COUNTERS.items():
            family = CounterMetricFamily(f"{PREFIX}_{name}", help_, labels=["spider"])
            family.add_metric([spider], float(stats.get(key, 0) or 0))
            yield family
        errors = CounterMetricFamily(f"{PREFIX}_errors", "errors by kind and type",
                                     labels=["spider", "kind", "type"])
        for key, value in stats.items():
            for prefix, kind in ERROR_PREFIXES.items():
                rest = key[len(prefix):] if key.startswith(prefix) else None
                if rest and "/" not in rest:
                    errors.add_metric([spider, kind, rest.rpartition(".")[2][:60]], float(value))
        yield errors
        sizes = self._frontier_sizes()
        for name, help_ in FRONTIER_GAUGES.items():
            family = GaugeMetricFamily(f"{PREFIX}_{name}", help_, labels=["spider"])
            family.add_metric([spider], float(sizes.get(name, 0)))
            yield family
        for name, help_, value in (
                ("mongo_unavailable", "1 while MongoDB is unreachable and items go to the spool",
                 1.0 if self._mongo_outage() else 0.0),
                ("mongo_spool_pending", "items this node spooled and has not stored yet "
                                        "(spooled - replayed)",
                 float(max(0, (stats.get("mongo/spooled", 0) or 0)
                           - (stats.get("mongo/replayed", 0) or 0))))):
            family = GaugeMetricFamily(f"{PREFIX}_{name}", help_, labels=["spider"])
            family.add_metric([spider], value)
            yield family
        up = GaugeMetricFamily(f"{PREFIX}_node_up", "1 while the node's spider is open",
                               labels=["spider"])
        up.add_metric([spider], 1.0 if self.crawler.spider is not None else 0.0)
        yield up

    def _mongo_outage(self) -> bool:
        itemproc = getattr(getattr(self.crawler.engine, "scraper", None), "itemproc", None)
        for pipeline in getattr(itemproc, "middlewares", ()):
            outage = getattr(pipeline, "outage", None)
            if outage is not None and hasattr(outage, "active"):
                return bool(outage.active)
        return False

    def _frontier_sizes(self) -> dict[str, int]:
        scheduler = getattr(self.crawler.engine, "scheduler", None)
        client = getattr(scheduler, "client", None)
        if client is None:
            return {}
        try:
            sizes = client.sizes()
            return {"frontier_queued": sizes["queued"], "frontier_delayed": sizes["delayed"],
                    "frontier_inflight": sizes["inflight"],
                    "node_prefetched": sizes["prefetched"],
                    "node_leases": len(client.held) + len(client.buffer),
                    "node_downloading": scheduler.downloading}
        except (RuntimeError, KeyError, AttributeError):
            return {}


class PrometheusMetrics:
    """The extension (see the module docstring)."""

    def __init__(self, crawler, host: str, port: int):
        client = load_prometheus_client()
        self.crawler = crawler
        self.host, self.port = host, port
        self.registry = client.CollectorRegistry(auto_describe=False)
        self.registry.register(StatsCollector(crawler))
        self.latency = client.Histogram(f"{PREFIX}_download_seconds",
                                        "download time of responses (DNS, connect, transfer)",
                                        ["spider"], buckets=LATENCY_BUCKETS,
                                        registry=self.registry)
        self.server = None

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not setting(s, "METRICS_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        ext = cls(crawler, setting(s, "METRICS_HOST"), setting(s, "METRICS_PORT"))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.response_received, signal=signals.response_received)
        return ext

    def spider_opened(self, spider) -> None:
        from prometheus_client import start_http_server

        self.server, _ = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self.server.server_address[1]
        logger.info("Prometheus metrics on http://%s:%d/metrics", self.host, self.port,
                    extra={"spider": spider})

    def spider_closed(self, spider) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def response_received(self, response, request, spider) -> None:
        latency = request.meta.get("download_latency")
        if isinstance(latency, (int, float)):
            self.latency.labels(spider.name).observe(latency)
