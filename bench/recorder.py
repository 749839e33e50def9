"""A tiny extension that records when a node sent its first request and got
its last response, and its progress every second, into ``BENCH_RECORD_FILE``.

It also records the downloader's flow: downloads under way on average
(``occupancy``), how long one took (``download_ms``), the share of download
starts that came in bursts (``bunched_starts``), the garbage collector's CPU
time, and with ``BENCH_LOOP_LAG_MS`` how late the event loop ran a timer.

Timing from the first request that reached the downloader to the last
response received excludes process start-up and the idle wait before the
node closes, for every system alike.
"""

from __future__ import annotations

import asyncio
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
              "gc/frozen_objects", "impersonate/responses", "impersonate/protocol/http1.1",
              "backlog/spilled", "backlog/refilled", "backlog/leftovers", "backlog/mongo_errors",
              "backlog/mover_errors", "frontier/backlog/stale_commits")


class BenchRecorder:
    def __init__(self, crawler, path: str):
        self.crawler = crawler
        self.path = path
        self.first_request = None
        self.last_response = None
        self.responses = 0
        self.cpu_first = self.cpu_last = None
        # rusage at the first request and the last response: the crawl's CPU
        # split into user and kernel time, and how often the node went to
        # sleep waiting (voluntary context switches: one per idle wait)
        self.ru_first = self.ru_last = None
        self.progress: list[tuple[float, int]] = []
        # The most requests the node held in its own memory, sampled once a
        # second: plain Scrapy's whole queue; ours only its frontier buffer
        # (the queue is in Redis). Each is a handful of objects that every
        # full garbage collection walks.
        self.held_peak = 0
        # The most asyncio tasks alive and responses in the scraper, sampled
        # with it: Scrapy 2.19 starts CONCURRENT_ITEMS tasks for every
        # response's output, and every collection walks the tasks alive.
        self.tasks_peak = 0
        self.scraping_peak = 0
        # when each response came (s after the first request): where a crawl
        # loses time, at its start, in its steady state or in its tail
        self.response_times: list[float] = []
        self._flow_until: tuple[float, float] | None = None
        self._flow_from = 0.0
        self._last_tick = 0.0
        # CPU seconds the garbage collector took from the first request to
        # close: a gc.callbacks timer.
        self.gc_cpu_s = 0.0
        self._gc_start: float | None = None
        #: per generation: [collections, CPU s] (which collections cost)
        self.gc_by_generation = [[0, 0.0], [0, 0.0], [0, 0.0]]
        # The downloader's flow: how many downloads were under way on average
        # (time-weighted, first request to last response) and how long one
        # took from reaching the downloader to leaving it. A node that waits
        # on its scheduler shows it as occupancy under CONCURRENT_REQUESTS.
        self._active = 0
        self._flow_t = 0.0
        self._flow_area = 0.0
        self._started: dict[int, float] = {}
        self.download_s = 0.0
        self.downloads = 0
        self.starts: list[float] = []
        # BENCH_LOOP_LAG_MS: a timer every that many ms measures how late the
        # event loop runs it (callbacks wait that long behind other work).
        self.lag_interval = crawler.settings.getfloat("BENCH_LOOP_LAG_MS", 0) / 1000
        self.lags: list[float] = []
        self._lag_handle = None
        # The crawl's critical path: how long a request of priority above 0 (the
        # demo's next listing page: the pages after it wait for it) takes from
        # being scheduled (yielded by a callback) to reaching the downloader.
        # Matched by URL: with a shared frontier the request that starts is a
        # copy decoded from Redis.
        self._scheduled: dict[str, float] = {}
        self.priority_waits: list[float] = []

    @classmethod
    def from_crawler(cls, crawler):
        path = crawler.settings.get("BENCH_RECORD_FILE")
        ext = cls(crawler, path)
        if path:
            crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
            crawler.signals.connect(ext.request_reached, signal=signals.request_reached_downloader)
            crawler.signals.connect(ext.request_scheduled, signal=signals.request_scheduled)
            crawler.signals.connect(ext.response_received, signal=signals.response_received)
            crawler.signals.connect(ext.request_left, signal=signals.request_left_downloader)
            crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider):
        _count_connections()
        with open(self.path + ".ready", "w") as f:
            f.write(str(time.time()))

    def request_scheduled(self, request, spider):
        if request.priority > 0 and self.first_request is not None:
            self._scheduled.setdefault(request.url, time.monotonic())

    def request_reached(self, request, spider):
        scheduled = self._scheduled.pop(request.url, None) if self._scheduled else None
        if scheduled is not None:
            self.priority_waits.append(time.monotonic() - scheduled)
        if self.first_request is None:
            self.first_request = time.time()
            self.cpu_first = time.process_time()
            self.ru_first = resource.getrusage(resource.RUSAGE_SELF)
            self.progress.append((self.first_request, 0))
            gc.callbacks.append(self._gc_timer)
            self._flow_t = self._flow_from = time.monotonic()
            if self.lag_interval > 0:
                self._lag_tick(None)
        self._flow(+1)
        self._started[id(request)] = now = time.monotonic()
        self.starts.append(now)

    def request_left(self, request, spider):
        started = self._started.pop(id(request), None)
        if started is not None:
            self._flow(-1)
            self.download_s += time.monotonic() - started
            self.downloads += 1

    def _lag_tick(self, due: float | None) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if due is not None:
            self.lags.append(now - due)
        self._lag_handle = loop.call_at(now + self.lag_interval, self._lag_tick,
                                        now + self.lag_interval)

    def _flow(self, change: int) -> None:
        now = time.monotonic()
        self._flow_area += self._active * (now - self._flow_t)
        self._flow_t = now
        self._active += change

    def _held_in_memory(self) -> int:
        scheduler = getattr(getattr(self.crawler.engine, "_slot", None), "scheduler", None)
        client = getattr(scheduler, "client", None)
        if client is not None and hasattr(client, "local_backlog"):
            return client.local_backlog()  # ours: the rest is in Redis
        try:
            return len(scheduler)  # Scrapy's scheduler (memory queues; no JOBDIR here)
        except TypeError:
            return 0

    def _sample_tasks(self) -> None:
        try:
            self.tasks_peak = max(self.tasks_peak, len(asyncio.all_tasks()))
        except RuntimeError:  # no running loop (not the asyncio reactor)
            pass
        slot = getattr(getattr(self.crawler.engine, "scraper", None), "slot", None)
        if slot is not None:
            self.scraping_peak = max(self.scraping_peak, len(slot.active) + len(slot.queue))

    def _gc_timer(self, phase, info):
        if phase == "start":
            self._gc_start = time.process_time()
        elif self._gc_start is not None:
            spent = time.process_time() - self._gc_start
            self.gc_cpu_s += spent
            generation = self.gc_by_generation[min(2, info.get("generation", 2))]
            generation[0] += 1
            generation[1] += spent
            self._gc_start = None

    def response_received(self, response, request, spider):
        now = time.time()
        self.last_response = now
        self.cpu_last = time.process_time()
        self.ru_last = resource.getrusage(resource.RUSAGE_SELF)
        mono = time.monotonic()
        self._flow_until = (mono, self._flow_area + self._active * (mono - self._flow_t))
        self.responses += 1
        if self.first_request is not None:
            self.response_times.append(now - self.first_request)
        if now - self._last_tick >= 1.0:
            self._last_tick = now
            self.progress.append((now, self.responses))
            self.held_peak = max(self.held_peak, self._held_in_memory())
            self._sample_tasks()

    def spider_closed(self, spider, reason):
        if self._gc_timer in gc.callbacks:
            gc.callbacks.remove(self._gc_timer)
        if self._lag_handle is not None:
            self._lag_handle.cancel()
        gaps = [b - a for a, b in zip(self.starts, self.starts[1:])]
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
                  **_rusage_delta(self.ru_first, self.ru_last),
                  "gc_by_generation": self.gc_by_generation,
                  # objects the collector tracks at the end (a full collection walks them all)
                  "gc_tracked": len(gc.get_objects()),
                  "held_peak": self.held_peak,
                  "tasks_peak": self.tasks_peak,
                  "scraping_peak": self.scraping_peak,
                  "occupancy": (self._flow_until[1] / (self._flow_until[0] - self._flow_from)
                                if self._flow_until and self._flow_until[0] > self._flow_from
                                else None),
                  "download_ms": (1000 * self.download_s / self.downloads
                                  if self.downloads else None),
                  # how bunched download starts are: the share that started
                  # within 0.5 ms of the one before (in the same burst)
                  "bunched_starts": (sum(1 for g in gaps if g < 0.0005) / len(gaps)
                                     if gaps else None),
                  "loop_lag_ms": _quantiles(self.lags),
                  "priority_wait_ms": _quantiles(self.priority_waits),
                  "phases": phases(self.response_times),
                  # TCP connections the node opened (HostnameEndpoint.connect calls)
                  "connections": _CONNECTS[0],
                  "reason": reason, "closed_at": time.time(), "progress": self.progress,
                  # the process's own peak (KiB on Linux): there even if the
                  # harness never sampled a process that lived very briefly
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "stats": kept}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)


_CONNECTS = [0]


def _rusage_delta(first, last) -> dict:
    if first is None or last is None:
        return {}
    return {"user_cpu_s": last.ru_utime - first.ru_utime,
            "sys_cpu_s": last.ru_stime - first.ru_stime,
            "idle_waits": last.ru_nvcsw - first.ru_nvcsw,
            "preempted": last.ru_nivcsw - first.ru_nivcsw}


def _count_connections() -> None:
    """Count the node's new TCP connections (Scrapy's HTTP/1.1 handler opens
    them through HostnameEndpoint): a system that reused fewer pooled
    connections would pay for connects the others do not."""
    from twisted.internet.endpoints import HostnameEndpoint

    connect = HostnameEndpoint.connect
    if getattr(connect, "_bench_counted", False):
        return

    def counted(self, factory):
        _CONNECTS[0] += 1
        return connect(self, factory)
    counted._bench_counted = True
    HostnameEndpoint.connect = counted


def phases(times: list[float]) -> dict | None:
    """A crawl in three phases, from its response times (s after the first
    request): ``ramp_s`` until the first 10 % of responses, ``steady_pages_s``
    the rate from 10 % to 90 %, ``tail_s`` from 90 % to the last. A system
    that loses only at the start or the end of a short crawl shows it here."""
    if len(times) < 20:
        return None
    times = sorted(times)
    lo, hi = times[len(times) // 10], times[(9 * len(times)) // 10]
    middle = (9 * len(times)) // 10 - len(times) // 10
    return {"ramp_s": lo, "tail_s": times[-1] - hi,
            "steady_pages_s": middle / (hi - lo) if hi > lo else None}


def _quantiles(values: list[float]) -> dict | None:
    """Mean, median, 90th percentile and maximum of *values* (s) in ms, and
    their number; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return {"mean": 1000 * sum(ordered) / len(ordered), "p50": 1000 * ordered[len(ordered) // 2],
            "p90": 1000 * ordered[int(len(ordered) * 0.9)], "max": 1000 * ordered[-1],
            "samples": len(ordered)}
