"""A node's view of one frontier partition: the entries it leased, what the
last calls said, and what it has to tell (:class:`PartitionState`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from crawlproject.frontier.queue import Batch


class Rejected(Exception):
    """Raised by ``accept``: the payload is not a request this node may run."""


@dataclass
class Entry:
    """A leased entry: its member, partition, and what ``accept`` made of it."""

    member: str
    partition: int
    item: Any
    priority: int = 0
    #: its politeness key (from the member)
    key: str = ""
    #: its download ended (its slot is free or handed off)
    ended: bool = False
    #: its key has an interval: counted as started when leased, it must not wait
    polite: bool = False
    #: when the lease reached this node (``time.monotonic()``)
    leased_at: float = 0.0
    #: how long after ``leased_at`` a polite entry may still start (the safety
    #: margin the frontier added to its key's interval, ``PolitenessConfig.pad``):
    #: later, the site could see it closer than the interval to the key's next
    #: request, leased by any node on time
    lag_allowed: float = float("inf")


def member_priority(member: str) -> int:
    """The priority an entry's member carries (``"<prio>:<seq>[@key]"``; 0 if none)."""
    head = member.partition(":")[0]
    try:
        return int(head)
    except ValueError:  # written by something else than this project's script
        return 0


@dataclass
class Remote:
    """What the last calls said about one partition."""

    queued: int = 0
    delayed: int = -1
    inflight: int = 0
    #: entries in the MongoDB tier (kstate '||backlog'): work, though not in Redis
    backlog: int = 0
    #: earliest ready time (Redis ms), -1 when nothing is queued, None unknown
    next_ready_ms: int | None = None
    #: Redis time of the last call that reported it, and our clock then
    server_ms: int = -1
    at: float | None = None   # None: no call reported it yet
    #: -inf: never looked at (the first idle look goes at once, however
    #: recently the machine booted: time.monotonic() counts from boot)
    last_poll: float = float("-inf")
    #: looks in a row that found nothing to take (the idle pace slows down)
    misses: int = 0

    def ready_now(self, now: float) -> bool:
        if self.next_ready_ms is None or self.next_ready_ms == -2:
            return True
        if self.next_ready_ms < 0 or self.server_ms < 0 or self.at is None:
            return False
        return self.next_ready_ms <= self.server_ms + (now - self.at) * 1000


@dataclass
class PartitionState:
    """What a node keeps about one partition between its calls."""

    #: what the node has to tell the partition and has not sent yet
    outbox: Batch = field(default_factory=Batch)
    #: what the last calls said about it
    remote: Remote = field(default_factory=Remote)
    # Its takes were held back by a key's concurrency: there a download's end
    # is reported at once (its slot is what the next take waits for),
    # elsewhere it waits for the ack, which frees it too.
    capped: bool = False
    # New requests since the last call that outrank the buffer's last entry:
    # the next call takes as many back (see FrontierClient.add()).
    outranking: int = 0
    #: sequence numbers of its adds not stored yet, and of those among them
    #: made without a parent (see :class:`~crawlproject.frontier.acks.AckOrder`)
    unsent: deque[int] = field(default_factory=deque)
    unsent_orphans: deque[int] = field(default_factory=deque)
    # When its lease was last renewed, and how its calls fail; -inf: never
    # (time.monotonic() counts from boot: 0.0 would look recent on a machine
    # up for less than the interval).
    maintained: float = float("-inf")
    errors: int = 0
    retry_at: float = float("-inf")
    # Its last call stopped inside the script: its next calls go in check mode
    # (every key checked before any write) until one goes through.
    check: bool = False
