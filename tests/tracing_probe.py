"""Test-only extension: the OpenTelemetry SDK's own in-memory exporter inside a node.

Built before :class:`crawlproject.extensions.tracing.RequestTracing` (a lower
``EXTENSIONS`` order), it makes an SDK tracer provider exporting to
``InMemorySpanExporter`` the process's provider, so the tracing extension uses
it as it would a provider set up by ``opentelemetry-instrument``. It also
notes when each item came out of the last pipeline (``item_scraped``: stored),
and writes the finished spans and those times as JSON to
``TRACING_PROBE_FILE`` when the engine stops.
"""

from __future__ import annotations

import json
import time

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scrapy import signals


class SpanProbe:
    def __init__(self, path: str):
        self.path = path
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        trace.set_tracer_provider(provider)
        self.stored: list[dict] = []

    @classmethod
    def from_crawler(cls, crawler):
        probe = cls(crawler.settings.get("TRACING_PROBE_FILE"))
        crawler.signals.connect(probe.item_scraped, signal=signals.item_scraped)
        crawler.signals.connect(probe.engine_stopped, signal=signals.engine_stopped)
        return probe

    def item_scraped(self, item, response, spider) -> None:
        self.stored.append({"page": response.url, "at": time.time_ns()})

    def engine_stopped(self) -> None:
        spans = [{"name": s.name, "start": s.start_time, "end": s.end_time,
                  "attributes": dict(s.attributes), "status": s.status.status_code.name}
                 for s in self.exporter.get_finished_spans()]
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump({"spans": spans, "stored": self.stored}, f)
