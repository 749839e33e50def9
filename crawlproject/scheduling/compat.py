"""scrapy-redis' scheduler settings in a project that moved to RedisScheduler.

A project that follows "Use it in your own Scrapy project" keeps the
settings it had for scrapy-redis. Each is honoured, or refused with a
message that says what to use instead, once, when the scheduler opens:

=============================  ==============================================
``SCHEDULER_PERSIST = True``   what the frontier always does (silent)
``SCHEDULER_PERSIST = False``  refused: a closing node never deletes shared
                               state (scrapy-redis' flush on close loses the
                               requests other nodes still work on)
``SCHEDULER_FLUSH_ON_START``   refused: ``crawlctl reset SPIDER --yes
                               --keep-seeds`` before the run starts afresh
``SCHEDULER_IDLE_BEFORE_CLOSE`` honoured: seconds a node whose crawl is done
                               (start requests handled, nothing queued,
                               delayed or leased anywhere) waits before it
                               closes (scrapy-redis: the blocking pop's wait)
``SCHEDULER_QUEUE_CLASS`` /    refused: one priority queue per site, FIFO
``SCHEDULER_QUEUE_KEY``        within a priority; ``DEPTH_PRIORITY`` orders
                               it breadth- or depth-first
``SCHEDULER_SERIALIZER``       refused: requests are stored as signed JSON
``DUPEFILTER_CLASS``,          not used: the frontier deduplicates with its
``SCHEDULER_DUPEFILTER_*``     Bloom filter, in the same call that enqueues
=============================  ==============================================

The seed settings (``REDIS_START_URLS_KEY``, ``REDIS_START_URLS_AS_SET``,
``REDIS_START_URLS_BATCH_SIZE``, ``REDIS_ENCODING``, ``redis_key``,
``make_request_from_data``) are the spiders' (scrapy-redis' own, or
:class:`crawlproject.spiders.RedisSpider`), honoured there.
"""

from __future__ import annotations

import logging

from crawlproject.defaults import is_set, setting

__all__ = ["scrapy_redis_notes", "idle_before_close"]

_QUEUE = ("is not used by crawlproject's RedisScheduler: the frontier keeps one priority "
          "queue per site (FIFO within a priority, sites served in turns); order it "
          "breadth-first or depth-first with Scrapy's DEPTH_PRIORITY (1 or -1)")
_DUPEFILTER = ("is not used by crawlproject's RedisScheduler: it deduplicates with the "
               "frontier's Bloom filter in the same Redis call that enqueues (remove the line)")


def _is_set(settings, name: str) -> bool:
    return settings.get(name) not in (None, "")


def scrapy_redis_notes(settings) -> list[tuple[int, str]]:
    """(log level, message) for each scrapy-redis scheduler setting *settings*
    holds that RedisScheduler does not apply as scrapy-redis did."""
    notes: list[tuple[int, str]] = []
    if is_set(settings, "SCHEDULER_PERSIST") and not setting(settings, "SCHEDULER_PERSIST"):
        notes.append((logging.WARNING,
                      "SCHEDULER_PERSIST = False is not applied: a closing node never deletes "
                      "the shared queue and filter, which other nodes may still be working on "
                      "(scrapy-redis' flush on close loses their requests). To start a run "
                      "afresh: python -m crawlproject.cli reset SPIDER --yes --keep-seeds "
                      "before it (remove the setting to silence this)"))
    if setting(settings, "SCHEDULER_FLUSH_ON_START"):
        notes.append((logging.WARNING,
                      "SCHEDULER_FLUSH_ON_START is not applied: a node joining a running crawl "
                      "would delete the other nodes' queue. To start a run afresh: python -m "
                      "crawlproject.cli reset SPIDER --yes --keep-seeds before it"))
    for name in ("SCHEDULER_QUEUE_CLASS", "SCHEDULER_QUEUE_KEY"):
        if _is_set(settings, name):
            notes.append((logging.WARNING, f"{name} {_QUEUE}"))
    if _is_set(settings, "SCHEDULER_SERIALIZER"):
        notes.append((logging.WARNING,
                      "SCHEDULER_SERIALIZER is not used by crawlproject's RedisScheduler: "
                      "requests are stored as JSON signed by the node (never pickle; "
                      "docs/frontier.md, trust model)"))
    for name in ("SCHEDULER_DUPEFILTER_CLASS", "SCHEDULER_DUPEFILTER_KEY"):
        if _is_set(settings, name):
            notes.append((logging.INFO, f"{name} {_DUPEFILTER}"))
    dupefilter = str(settings.get("DUPEFILTER_CLASS") or "")
    if dupefilter.startswith(("scrapy_redis.", "crawlproject.")):
        notes.append((logging.INFO, f"DUPEFILTER_CLASS = {dupefilter!r} {_DUPEFILTER}"))
    return notes


def idle_before_close(settings) -> float:
    """scrapy-redis' ``SCHEDULER_IDLE_BEFORE_CLOSE`` (seconds, 0: none)."""
    return max(0.0, setting(settings, "SCHEDULER_IDLE_BEFORE_CLOSE"))
