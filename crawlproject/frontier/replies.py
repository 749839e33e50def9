"""A partition's reply applied to a node's view: sizes, entries taken, what the
frontier found written by someone else (:class:`Replies`)."""

from __future__ import annotations

import logging
import time

from crawlproject.frontier.partition import Entry, Rejected, member_priority
from crawlproject.frontier.queue import Batch, SyncResult, member_key

# The node's sync loop logs under one name, whichever of its parts speaks.
logger = logging.getLogger("crawlproject.frontier.client")

#: Seconds between two log lines about the same junk the frontier read back
#: (a forged state, a budget key of the wrong type, refused reports): the
#: stats count every one, the log says it once a minute, like an outage.
JUNK_LOG_INTERVAL = 60.0


class Replies:
    """Applies each reply of a client's calls to its state."""

    def __init__(self, client: "FrontierClient"):
        self.client = client
        #: what was said about junk read back: kind -> (when last said, times since)
        self.said: dict[str, tuple[float, int]] = {}

    def apply(self, p: int, result: SyncResult, asked: int, batch: Batch | None = None) -> None:
        """Partition *p*'s *result*, for a call that asked for *asked* entries
        and sent *batch* (None: the last call, at close)."""
        client = self.client
        remote = client.parts[p].remote
        remote.queued = result.queued
        remote.backlog = result.backlog
        if client.mover is not None:
            if result.moves:
                client.mover.wake(p)          # keys wait for a spill or a refill
            elif result.backlog:
                client.mover.active[p] = True  # looked at on its next poll
        if result.delayed >= 0:
            remote.delayed, remote.inflight = result.delayed, result.inflight
        elif batch is not None and any(add[4] for add in batch.adds):
            # Delayed adds (a retry's backoff, a page waiting for robots.txt):
            # work this node knows of until a maintenance reply counts it.
            remote.delayed = max(0, remote.delayed) + sum(1 for add in batch.adds if add[4])
        if asked or result.delayed >= 0:
            remote.next_ready_ms = result.next_ready_ms
        elif result.added or (batch is not None and (batch.acks or batch.nacks)):
            # New work, or keys with a free slot again: ready times unknown.
            remote.next_ready_ms = None
        if result.now_ms >= 0:
            remote.server_ms, remote.at = result.now_ms, time.monotonic()
        if result.capped:
            client.parts[p].capped = True
        elif asked and (result.next_ready_ms == -2 or result.queued == 0):
            client.parts[p].capped = False  # got all it asked for, or nothing waits
        client.count("scheduler/added", result.added)
        if result.budget_refused:
            client.count("scheduler/budget_refused", result.budget_refused)
            client.budgets.refused(client.partitions[p], batch)
        client.count("dupefilter/filtered", result.duplicates)
        client.count("scheduler/stale", result.stale)
        client.count("scheduler/trimmed", result.trimmed)
        if result.stale:
            logger.warning("%d acknowledgement(s) for requests this node no longer held (its "
                           "lease had expired and another node took them): ignored",
                           result.stale, extra=client.log_extra)
        if result.missing:
            client.count("scheduler/invalid", result.missing)
            logger.error("%d queue entries had no payload: moved to %s", result.missing,
                         client.partitions[p].keys.invalid, extra=client.log_extra)
        if result.reclaimed:
            client.count("scheduler/reclaimed", result.reclaimed)
            logger.warning("Reclaimed %d requests leased by nodes that stopped answering",
                           result.reclaimed, extra=client.log_extra)
        # When the lease reached this node: the lease itself is at most one
        # round trip earlier (counted from the call's sending, a slow Redis or
        # a cluster's round trips would make every polite entry late).
        leased_at = time.monotonic()
        for member, payload in result.taken:
            self._take(p, member, payload, result.polite_keys, leased_at)
        if result.taken or result.added or (batch is not None and batch.adds):
            remote.misses = 0
        elif asked or (batch is not None and batch.maintenance
                       and not (client.held or client.buffer)):
            if result.queued == 0 or result.next_ready_ms >= 0:
                remote.misses += 1   # nothing queued, or a ready time named: look less often
            else:
                # Entries wait for slots other nodes hold: this node is wanting
                # (it gets its share only while it keeps asking, SHARE_WINDOW).
                remote.misses = 0
        if result.taken:
            client.nudge()
        client.handoff.apply(p, result)
        self._apply_junk(p, result)

    def _apply_junk(self, p: int, result: SyncResult) -> None:
        """Say what the frontier found written by someone else (counted in
        stats each time, logged at most once a minute per kind)."""
        client = self.client
        keys = client.partitions[p].keys
        if result.state_junk:
            client.count("scheduler/state_junk", result.state_junk)
            self._say("state_junk", logging.WARNING,
                      "%d field(s) of the frontier's state in %s held junk (written by "
                      "someone else: per-key states, overrides, counts, node deadlines, ready "
                      "times); read field by field, what was valid kept, the rest mended",
                      result.state_junk, keys.tag)
        if result.budget_skipped:
            client.count("scheduler/budget_skipped", 1)
            self._say("budget_skipped", logging.ERROR,
                      "%s is not a hash: budgets of its partition are not counted (new pages "
                      "admitted) until it is deleted (redis-cli DEL %s: counting starts again)",
                      keys.budget, keys.budget)
        if result.sent_refused:
            client.count("politeness/sent_refused", result.sent_refused)
            self._say("sent_refused", logging.WARNING,
                      "%d late-send report(s) refused by %s: the requests were no longer "
                      "leased to this node (its lease expired, or the report was not this "
                      "node's)", result.sent_refused, keys.tag)
        if result.bounds_ms is not None and "bounds" not in self.said:
            block, backoff = result.bounds_ms
            pol = client.politeness
            if block < pol.retry_after_max * 1000 or backoff < pol.backoff_max * 1000:
                self.said["bounds"] = (time.monotonic(), 0)
                logger.warning("This crawl records a longest block of %gs and a longest backoff "
                               "or crawl delay of %gs (its first node's FRONTIER_RETRY_AFTER_MAX "
                               "and FRONTIER_BACKOFF_MAX, field '||bounds' of %s); this node's "
                               "settings (%gs, %gs) are held to them (docs/frontier.md)",
                               block / 1000, backoff / 1000, keys.kstate, pol.retry_after_max,
                               pol.backoff_max, extra=client.log_extra)

    def _say(self, kind: str, level: int, message: str, *args) -> None:
        now = time.monotonic()
        last, since = self.said.get(kind, (None, 0))
        if last is not None and now - last < JUNK_LOG_INTERVAL:
            self.said[kind] = (last, since + 1)
            return
        if since:
            message += " (%d more time(s) in the last minute)"
            args = (*args, since)
        self.said[kind] = (now, 0)
        logger.log(level, message, *args, extra=self.client.log_extra)

    def accepted(self, p: int, member: str, payload: bytes) -> Entry | None:
        """A leased entry as the adapter makes it, now owned here (None: rejected,
        kept in the invalid list)."""
        client = self.client
        try:
            item = client.accept(p, member, payload)
        except Rejected as exc:
            client.count("scheduler/invalid", 1)
            client.parts[p].outbox.fail(member, "invalid", {
                "member": member, "payload": payload.decode("utf-8", "replace"),
                "reason": str(exc), "node": client.node, "at": time.time()})
            return None
        client.identity.own(member, p)
        return Entry(member, p, item, member_priority(member), member_key(member))

    def _take(self, p: int, member: str, payload: bytes, polite: dict | None = None,
              leased_at: float = 0.0) -> None:
        entry = self.accepted(p, member, payload)
        if entry is None:
            return
        interval = (polite or {}).get(entry.key)
        if interval is not None:
            entry.polite, entry.leased_at = True, leased_at
            pad = self.client.politeness.pad(interval)
            if pad > 0:  # (no margin: the operator chose limits held at lease only)
                entry.lag_allowed = pad
        buffer = self.client.buffer
        if not buffer or buffer[-1].priority >= entry.priority:
            buffer.append(entry)  # the common case: FIFO among equal priorities
            return
        at = len(buffer)
        while at and buffer[at - 1].priority < entry.priority:
            at -= 1
        buffer.insert(at, entry)
