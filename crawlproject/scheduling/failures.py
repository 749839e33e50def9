"""Requests that failed on this node: recorded while they are in the engine
(a download whose retries are exhausted, a callback that raised), then, once
they have left it, a failed callback retried (``CALLBACK_RETRY_TIMES``)
and anything else dead-lettered with its reason (``python -m
crawlproject.cli dead`` / ``replay``). A request kept on this node (not
storable: :mod:`crawlproject.scheduling.local`) gets a dead letter too,
without a payload to replay.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from scrapy import Request

from crawlproject.frontier.queue import ATTEMPT_META_KEYS
from crawlproject.frontier.retrypolicy import CALLBACK_ATTEMPTS_META, LEASE_META
from crawlproject.hooks import DEAD, RETRY
from crawlproject.scheduling.local import KEPT_META, is_kept
from crawlproject.serialization import RequestEncodeError, request_to_json

# The scheduler's own lines: they keep its logger's name.
logger = logging.getLogger("crawlproject.scheduler")


class Failures:
    """The failures of the requests this node leased through *client* (a
    :class:`~crawlproject.frontier.client.FrontierClient`), and what is done
    with them. *count* adds a scheduler stat; *spider*, *policy* and
    *signer* encode a request to store it again."""

    def __init__(self, client, politeness, retry, count, *, spider, policy, signer):
        self.client, self.politeness, self.retry, self.count = client, politeness, retry, count
        self.spider, self.policy, self.signer = spider, policy, signer
        #: leased member -> (kind, reason), until the request leaves the engine
        self.failed: dict[str, tuple[str, str]] = {}
        #: dead letters of kept requests being written (awaited at close)
        self.kept_tasks: set[asyncio.Future] = set()

    def download_failed(self, member: str, reason: str) -> None:
        """The errback of a leased request saw its download fail."""
        # What was recorded first wins: the retry middleware's "retries
        # exhausted" (mark_failed) comes before the errback sees the failure.
        if member in self.client.held:
            self.failed.setdefault(member, ("download", reason))

    def mark_failed(self, request: Request, reason: str, kind: str = "download") -> None:
        """Dead-letter *request* when it leaves the engine (retries exhausted)."""
        member = request.meta.get(LEASE_META)
        if member in self.client.held:
            self.failed[member] = (kind, reason)
        elif is_kept(request):
            self._kept_failed(request, kind, reason)

    def on_spider_error(self, failure, response, spider):
        request = getattr(response, "request", None)
        member = request.meta.get(LEASE_META) if request is not None else None
        exc = failure.value
        if member in self.client.held:
            self.failed[member] = ("callback", f"{type(exc).__name__}: {exc}")
        elif request is not None and is_kept(request):
            self._kept_failed(request, "callback", f"{type(exc).__name__}: {exc}")

    def _kept_failed(self, request: Request, kind: str, reason: str) -> None:
        """A request this node kept (it cannot be stored) failed for good: a
        dead letter too, with its URL and reason (no payload to replay)."""
        if request.meta.get(KEPT_META) == "dead":
            return   # said already (a callback raising for each of its outputs)
        request.meta[KEPT_META] = "dead"
        key = self.politeness.key(request)
        record = {"member": "", "key": key, "payload": None, "priority": request.priority,
                  "url": request.url, "kind": kind,
                  "reason": f"{reason}; kept on this node (not storable): not replayable",
                  "attempts": request.meta.get("retry_times", 0) + 1,
                  "node": self.client.node, "at": time.time()}
        self.count("scheduler/dead")
        self.count(f"scheduler/dead/{kind}")
        logger.error("Dead-lettered %s (kept on this node) after %s attempt(s): %s", request,
                     record["attempts"], reason, extra={"spider": self.spider})
        frontier = self.client.partitions[self.client.partition_of(key)]
        task = asyncio.ensure_future(frontier.keep_dead(json.dumps(record)))
        self.kept_tasks.add(task)
        task.add_done_callback(self._kept_dead_written)

    def _kept_dead_written(self, task: asyncio.Future) -> None:
        self.kept_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:   # logged above already
            logger.warning("Could not write a kept request's dead letter to Redis: %s",
                           task.exception(), extra={"spider": self.spider})

    def handle(self, member: str, request: Request, kind: str, reason: str) -> str:
        """Retry a failed callback or dead-letter *request*; the outcome (retry, dead)."""
        attempts = request.meta.get(CALLBACK_ATTEMPTS_META, 0) + 1
        key = self.politeness.key(request)
        if kind == "callback" and self.retry.retry_callback(attempts):
            retry = request.replace(dont_filter=True)
            retry.meta.pop(LEASE_META, None)
            retry.meta[CALLBACK_ATTEMPTS_META] = attempts
            try:
                payload = request_to_json(retry, self.spider, self.policy, self.signer)
            except RequestEncodeError as exc:  # a callback put something odd in meta
                reason = f"{reason}; cannot be retried: {exc}"
            else:
                self.client.add(payload, None, retry.priority,
                                int(self.retry.delay(attempts) * 1000), key, parent=member)
                self.client.ack(member)
                self.count("scheduler/callback_retries")
                return RETRY
        request.meta.pop(LEASE_META, None)
        retries = request.meta.get("retry_times", 0)
        try:
            # Stored without its attempt counters: a replay gets fresh retries, and
            # a signed payload is replayed byte for byte (nobody else may edit it).
            fresh = request.replace(meta={k: v for k, v in request.meta.items()
                                          if k not in ATTEMPT_META_KEYS})
            payload = request_to_json(fresh, self.spider, self.policy, self.signer)
        except RequestEncodeError as exc:  # kept without a payload: visible, not replayable
            payload, reason = None, f"{reason}; request not storable: {exc}"
        record = {"member": member, "key": key, "payload": payload,
                  "priority": request.priority, "url": request.url, "kind": kind,
                  "reason": reason, "attempts": (attempts if kind == "callback" else retries + 1),
                  "node": self.client.node, "at": time.time()}
        self.client.fail(member, "dead", record)
        self.count("scheduler/dead")
        self.count(f"scheduler/dead/{kind}")
        logger.error("Dead-lettered %s after %s attempt(s): %s", request, record["attempts"],
                     reason, extra={"spider": self.spider})
        return DEAD

    async def close(self) -> None:
        """Write the dead letters of kept requests before the node leaves."""
        if self.kept_tasks:
            await asyncio.gather(*self.kept_tasks, return_exceptions=True)
