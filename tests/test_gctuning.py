"""The garbage-collector freeze of crawlproject/extensions/gctuning.py, on a
real Crawler's signals (the crawl-level check is in test_crawl_e2e.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
from scrapy import Spider
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from crawlproject.extensions.gctuning import GcFreeze, parse_threshold


class LeafSpider(Spider):
    name = "leaf"


@pytest.fixture
def gc_state():
    """Whatever a test does to the collector is undone for the next one."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def make(settings):
    crawler = get_crawler(LeafSpider, settings)
    crawler.spider = LeafSpider()
    crawler.stats.open_spider()
    return crawler, GcFreeze.from_crawler(crawler)


def test_off_unless_enabled():
    with pytest.raises(NotConfigured):
        GcFreeze.from_crawler(get_crawler(LeafSpider, {}))


def test_freezes_what_is_alive_at_open_and_undoes_it_at_close(gc_state):
    # The handlers are called directly (the crawler's other extensions want a
    # reactor); the real nodes of test_crawl_e2e.py show them connected.
    crawler, ext = make({"GC_FREEZE_ENABLED": True, "GC_THRESHOLD": "5000, 20"})
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    ext.spider_opened(crawler.spider)
    frozen = gc.get_freeze_count()
    assert frozen > 10_000                          # the interpreter, pytest, Scrapy
    # Read after the stat: a frozen object freed by its reference count leaves
    # the count, and the suite's background threads (tests/conftest.py) free
    # objects while this runs; nothing is added to the frozen set after freeze.
    assert 0 <= crawler.stats.get_value("gc/frozen_objects") - frozen < 1_000
    assert gc.get_threshold()[:2] == (5000, 20)
    gc.collect(0)
    ext.spider_closed(crawler.spider, "finished")
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert crawler.stats.get_value("gc/collections/0") >= 1


class Node:
    def __init__(self):
        self.me = self          # a reference cycle: only the collector frees it


def test_garbage_of_the_start_up_is_collected_not_frozen(gc_state):
    crawler, ext = make({"GC_FREEZE_ENABLED": True})
    gc.disable()  # no automatic collection between here and the freeze
    try:
        garbage = Node()
        dead = weakref.ref(garbage)
        del garbage
        assert dead() is not None
        ext.spider_opened(crawler.spider)
        # Frozen with the rest, it would live (and be walked by nobody) until close.
        assert dead() is None
    finally:
        gc.enable()
        ext.spider_closed(crawler.spider, "finished")


@pytest.mark.parametrize("value, expected", [
    (None, None), ("", None), ([], None), ("10000", (10000,)), ("10000,10,10", (10000, 10, 10)),
    ([700, 10], (700, 10)), ("700 10 10", (700, 10, 10)), ("[10000, 10, 10]", (10000, 10, 10)),
])
def test_threshold_values(value, expected):
    assert parse_threshold(value) == expected


@pytest.mark.parametrize("value", ["x", "0", "1,2,3,4", [-1], "1.5", {"a": 1}])
def test_bad_thresholds_are_refused_with_the_value(value):
    with pytest.raises(ValueError, match="GC_THRESHOLD"):
        parse_threshold(value)
