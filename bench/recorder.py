"""A tiny extension that records when a node sent its first request and got
its last response, and its progress every second, into ``BENCH_RECORD_FILE``.

Timing from the first request that reached the downloader to the last
response received excludes process start-up and the idle wait before the
node closes, for every system alike.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time

from scrapy import signals

STATS_KEPT = ("elapsed_time_seconds", "item_scraped_count", "response_received_count",
              "dupefilter/filtered", "finish_reason", "downloader/request_count",
              "scheduler/enqueued/redis", "scheduler/dequeued/redis", "seeds/read",
              "log_count/ERROR", "scheduler/dead", "scheduler/reclaimed",
              "downloader/response_bytes", "recrawl/not_modified", "recrawl/unchanged",
              "recrawl/changed", "recrawl/new", "recrawl/fed", "mongo/modified", "mongo/upserted",
              "gc/frozen_objects")


class BenchRecorder:
    def __init__(self, crawler, path: str):
        self.crawler = crawler
        self.path = path
        self.first_request = None
        self.last_response = None
        self.responses = 0
        self.cpu_first = self.cpu_last = None
        self.progress: list[tuple[float, int]] = []
        self._last_tick = 0.0
        # CPU seconds the garbage collector took from the first request to
        # close: a gc.callbacks timer.
        self.gc_cpu_s = 0.0
        self._gc_start: float | None = None

    @classmethod
    def from_crawler(cls, crawler):
        path = crawler.settings.get("BENCH_RECORD_FILE")
        ext = cls(crawler, path)
        if path:
            crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
            crawler.signals.connect(ext.request_reached, signal=signals.request_reached_downloader)
            crawler.signals.connect(ext.response_received, signal=signals.response_received)
            crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider):
        with open(self.path + ".ready", "w") as f:
            f.write(str(time.time()))

    def request_reached(self, request, spider):
        if self.first_request is None:
            self.first_request = time.time()
            self.cpu_first = time.process_time()
            self.progress.append((self.first_request, 0))
            gc.callbacks.append(self._gc_timer)

    def _gc_timer(self, phase, info):
        if phase == "start":
            self._gc_start = time.process_time()
        elif self._gc_start is not None:
            self.gc_cpu_s += time.process_time() - self._gc_start
            self._gc_start = None

    def response_received(self, response, request, spider):
        now = time.time()
        self.last_response = now
        self.cpu_last = time.process_time()
        self.responses += 1
        if now - self._last_tick >= 1.0:
            self._last_tick = now
            self.progress.append((now, self.responses))

    def spider_closed(self, spider, reason):
        if self._gc_timer in gc.callbacks:
            gc.callbacks.remove(self._gc_timer)
        if self.last_response is not None:
            self.progress.append((self.last_response, self.responses))
        stats = self.crawler.stats.get_stats()
        kept = {k: (v if isinstance(v, (int, float, str)) else str(v))
                for k, v in stats.items() if k in STATS_KEPT}
        record = {"pid": os.getpid(), "first_request": self.first_request,
                  "last_response": self.last_response, "responses": self.responses,
                  "crawl_cpu_s": (self.cpu_last - self.cpu_first
                                  if self.cpu_first is not None and self.cpu_last is not None
                                  else None),
                  "gc_cpu_s": self.gc_cpu_s,
                  "reason": reason, "closed_at": time.time(), "progress": self.progress,
                  # the process's own peak (KiB on Linux): there even if the
                  # harness never sampled a process that lived very briefly
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "stats": kept}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)
