"""Garbage-collector tuning for a crawling node: freeze the start-up heap.

A Scrapy node allocates container objects at a high rate (every response's
output starts ``CONCURRENT_ITEMS`` asyncio tasks, every request a handful of
dicts), so CPython's cyclic garbage collector runs thousands of times per
thousand pages, and each of its full (generation 2) collections walks every
tracked object of the process: the ~120,000 a node holds when its
spider opens (modules, classes, settings, fake-useragent's data, the
middlewares) and which live until it exits. On the benchmark crawl that was
a large part of the node's CPU (`python -m bench.gcfreeze`; BENCHMARKS.md §8).

``GC_FREEZE_ENABLED = True`` (the project's default) runs one full collection
when the spider opens and then :func:`gc.freeze`: the objects alive at that
moment move to a permanent generation that later collections do not walk.
Reference counting still frees them; only a reference cycle among them that
becomes garbage later is kept until the spider closes (the heap of the start-up
is bounded, and the crawl's own objects are collected as before). At close the
extension unfreezes the heap, so a process that runs another crawl starts over
(with several crawlers in one process, the first to close unfreezes for all:
they run on, only without the saving).

``GC_THRESHOLD`` (default unset: CPython's own) sets :func:`gc.set_threshold`
for the crawl, e.g. ``[10000, 10, 10]``: fewer, larger young collections.

Stats at close: ``gc/frozen_objects`` and ``gc/collections/<generation>``
(collections during the crawl).
"""

from __future__ import annotations

import gc
import logging

from scrapy import signals
from scrapy.exceptions import NotConfigured

from crawlproject.defaults import setting

logger = logging.getLogger(__name__)


def parse_threshold(value) -> tuple[int, ...] | None:
    """``GC_THRESHOLD`` as a tuple of 1 to 3 positive ints; None when unset."""
    if value in (None, "", [], ()):
        return None
    if isinstance(value, str):
        value = value.strip().strip("[]()").replace(",", " ").split()  # "-s GC_THRESHOLD=[…]"
    try:
        threshold = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"GC_THRESHOLD must be 1 to 3 integers, not {value!r}") from None
    if not 1 <= len(threshold) <= 3 or any(v < 1 for v in threshold):
        raise ValueError(f"GC_THRESHOLD must be 1 to 3 integers ≥ 1, not {value!r}")
    return threshold


class GcFreeze:
    """Freeze the heap alive when the spider opens; optionally set thresholds."""

    def __init__(self, crawler, threshold: tuple[int, ...] | None = None):
        self.crawler = crawler
        self.threshold = threshold
        self._saved_threshold: tuple[int, ...] | None = None
        # Collections per generation when the spider opened; None: not frozen.
        self._counts_at_open: list[int] | None = None

    @classmethod
    def from_crawler(cls, crawler):
        settings = crawler.settings
        if not setting(settings, "GC_FREEZE_ENABLED"):
            raise NotConfigured  # off by choice: bare, as Scrapy's own (no WARNING each start)
        ext = cls(crawler, threshold=parse_threshold(setting(settings, "GC_THRESHOLD")))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        return ext

    def spider_opened(self, spider) -> None:
        # Collect first: what is garbage now must not be frozen with the rest.
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
        if self.threshold:
            self._saved_threshold = gc.get_threshold()
            gc.set_threshold(*self.threshold)
        self._counts_at_open = [g["collections"] for g in gc.get_stats()]
        self.crawler.stats.set_value("gc/frozen_objects", frozen)
        logger.debug("froze %d objects for the garbage collector (threshold %s)",
                     frozen, gc.get_threshold())

    def spider_closed(self, spider, reason) -> None:
        if self._counts_at_open is None:
            return
        for generation, stats in enumerate(gc.get_stats()):
            self.crawler.stats.set_value(f"gc/collections/{generation}",
                                         stats["collections"] - self._counts_at_open[generation])
        self._counts_at_open = None
        if self._saved_threshold is not None:
            gc.set_threshold(*self._saved_threshold)
            self._saved_threshold = None
        gc.unfreeze()
