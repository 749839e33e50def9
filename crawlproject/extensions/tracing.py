"""OpenTelemetry tracing: one span per request, from its lease to its ack (opt-in).

``TRACING_ENABLED = True`` with the ``tracing`` extra
(``pip install '/path/to/checkout[tracing]'``, from this package's checkout or wheel; without it the extension is disabled
with one warning). The span's attributes and outcomes, where spans go and what
they cost: docs/deploy.md, "Tracing".
"""

from __future__ import annotations

import logging
import os

from scrapy import signals
from scrapy.exceptions import NotConfigured
from twisted.internet import threads

from crawlproject.connection import redact_url
from crawlproject.defaults import setting
from crawlproject.frontier.retrypolicy import LEASE_META
from crawlproject.hooks import DEAD, RELEASED, RequestHooks, add_request_hooks

logger = logging.getLogger(__name__)

SPAN_NAME = "crawl.request"
EXPORTERS = ("otlp", "console")
INSTALL_HINT = "pip install '/path/to/checkout[tracing]' (this package's checkout or wheel)"


class RequestTracing(RequestHooks):
    """The extension (see the module docstring)."""

    def __init__(self, crawler, tracer, *, provider=None, status_error=None):
        self.crawler = crawler
        self.tracer = tracer
        #: the provider this extension made (flushed and shut down at close), or None
        self.provider = provider
        self._status_error = status_error
        self._spans: dict[str, list] = {}  # member -> [span, items stored, items dropped]

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        if not setting(s, "TRACING_ENABLED"):
            raise NotConfigured
        try:
            from opentelemetry import trace
            from opentelemetry.trace import Status, StatusCode
        except ImportError as exc:
            raise NotConfigured(f"TRACING_ENABLED is on but OpenTelemetry is not installed "
                                f"({exc}): no spans; {INSTALL_HINT}") from None
        provider = None
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            provider = _make_provider(setting(s, "TRACING_EXPORTER"),
                                      setting(s, "TRACING_ENDPOINT") or None)
        tracer = (provider or trace.get_tracer_provider()).get_tracer("crawlproject")
        ext = cls(crawler, tracer, provider=provider,
                  status_error=lambda text: Status(StatusCode.ERROR, text))
        crawler.signals.connect(ext.response_downloaded, signal=signals.response_downloaded)
        crawler.signals.connect(ext.item_scraped, signal=signals.item_scraped)
        crawler.signals.connect(ext.item_dropped, signal=signals.item_dropped)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        add_request_hooks(crawler, ext)
        logger.info("OpenTelemetry tracing on: one %r span per request (%s)", SPAN_NAME,
                    "tracer provider of this process" if provider is None
                    else f"exporter {setting(s, 'TRACING_EXPORTER')}")
        return ext

    # -- the scheduler's hooks ---------------------------------------------------
    def request_leased(self, request, *, member: str, partition: int, node: str,
                       key: str) -> None:
        span = self.tracer.start_span(SPAN_NAME, attributes={
            "url.full": redact_url(request.url),
            "crawl.spider": self.crawler.spider.name,
            "crawl.politeness_key": key,
            "crawl.partition": partition,
            "crawl.node": node})
        self._spans[member] = [span, 0, 0]

    def request_settled(self, request, *, member: str, outcome: str) -> None:
        entry = self._spans.pop(member, None)
        if entry is None:
            return
        span, stored, dropped = entry
        span.set_attribute("crawl.outcome", outcome)
        span.set_attribute("crawl.items_stored", stored)
        if dropped:
            span.set_attribute("crawl.items_dropped", dropped)
        if outcome == DEAD:
            span.set_status(self._status_error("dead-lettered"))
        span.end()

    # -- Scrapy's signals ----------------------------------------------------------
    def _entry(self, request) -> list | None:
        member = request.meta.get(LEASE_META) if request is not None else None
        return self._spans.get(member) if member is not None else None

    def response_downloaded(self, response, request, spider) -> None:
        # Before the downloader middlewares: a 503 that the retry middleware
        # turns into a retry has its status on the span too.
        entry = self._entry(request)
        if entry is not None:
            entry[0].set_attribute("http.response.status_code", response.status)

    def item_scraped(self, item, response, spider) -> None:
        entry = self._entry(getattr(response, "request", None))
        if entry is not None:
            entry[1] += 1

    def item_dropped(self, item, response, exception, spider) -> None:
        entry = self._entry(getattr(response, "request", None))
        if entry is not None:
            entry[2] += 1

    def spider_closed(self, spider):
        for member in list(self._spans):  # the scheduler released them; be sure
            self.request_settled(None, member=member, outcome=RELEASED)
        if self.provider is not None:
            # Exporting what is left may take the exporter's timeout: not on the reactor.
            return threads.deferToThread(self.provider.shutdown)
        return None


def _make_provider(exporter: str, endpoint: str | None):
    """A tracer provider of our own, exporting with *exporter* (``NotConfigured``
    when it is unknown or its package is missing)."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise NotConfigured(f"TRACING_ENABLED is on but the OpenTelemetry SDK is not "
                            f"installed ({exc}): no spans; {INSTALL_HINT}") from None
    exporter = exporter.lower()
    if exporter not in EXPORTERS:
        raise NotConfigured(f"TRACING_EXPORTER must be one of {', '.join(EXPORTERS)}, "
                            f"not {exporter!r}: no spans")
    if exporter == "console":
        span_exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise NotConfigured(f"TRACING_EXPORTER is otlp but its exporter is not "
                                f"installed ({exc}): no spans; {INSTALL_HINT}") from None
        span_exporter = OTLPSpanExporter(endpoint=endpoint)
    # An explicit service name would override $OTEL_SERVICE_NAME: give one only without it.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: "crawlproject"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider
