"""The slot hand-off: entries leased in reserve per key, started on the slot
a download of the same key just freed here (:class:`SlotHandoff`)."""

from __future__ import annotations

from collections import deque

from crawlproject.frontier.partition import Entry
from crawlproject.frontier.queue import SyncResult


class SlotHandoff:
    """A node's reserve: entries leased per key (holding no slot), the keys worth
    a reserve (found at their concurrency), and the share of a key's concurrency
    this node may hand off (only while the frontier last said its reserve may
    be used)."""

    def __init__(self, client: "FrontierClient"):
        self.client = client
        self.reserve: dict[str, deque[Entry]] = {}
        #: key -> its partition
        self.keys: dict[str, int] = {}
        self.share: dict[str, int] = {}

    def hand_off(self, ended: Entry) -> bool:
        """Start a reserved entry of *ended*'s key on the slot it just freed."""
        client = self.client
        stock = self.reserve.get(ended.key)
        share = self.share.get(ended.key)
        if not stock or share is None or client.paused:
            return False
        if 1 + self.running().get(ended.key, 0) > share:
            return False  # more than our share of the key: the slot goes back to all nodes
        entry = stock.popleft()
        if not stock:
            del self.reserve[ended.key]
        client.parts[ended.partition].outbox.handoffs.append((ended.member, entry.member))
        client.buffer.appendleft(entry)
        client.count("scheduler/handoffs", 1)
        client.nudge()
        return True

    def return_reserve(self, key: str) -> None:
        """Send *key*'s reserve back to its queue (its slots are for all nodes)."""
        self.share.pop(key, None)
        for entry in self.reserve.pop(key, ()):
            self.client.give_back(entry)

    def asks(self, p: int) -> list[tuple[str, int]]:
        """What partition *p*'s next call asks for the reserve: per key worth
        one, as many more entries as the node runs downloads of it (up to its
        share), or 0 to hear whether the reserve held may still be used."""
        if not self.keys or self.client.paused:
            return []
        running = self.running()
        asks = []
        for key, kp in list(self.keys.items()):
            if kp != p:
                continue
            n = running.get(key, 0)
            if not n:
                # nothing of it runs here: no slot of ours to hand a reserve
                del self.keys[key]
                self.return_reserve(key)
                continue
            want = min(n, self.share.get(key, n)) - len(self.reserve.get(key, ()))
            asks.append((key, max(0, want)))
        return asks

    def running(self) -> dict[str, int]:
        """Per key worth a reserve: this node's entries that hold a slot of it
        (downloading, or leased and waiting in the buffer)."""
        running: dict[str, int] = {}
        keys = self.keys
        for e in (*self.client.held.values(), *self.client.buffer):
            if not e.ended and e.key in keys:
                running[e.key] = running.get(e.key, 0) + 1
        return running

    def apply(self, p: int, result: SyncResult) -> None:
        """What partition *p*'s reply says about the reserve."""
        for key in result.capped_keys:
            self.keys.setdefault(key, p)
        for key, (usable, share) in result.reserve_status.items():
            if usable:
                self.share[key] = share
            else:  # an interval, a block (maybe another node's 429), over its limit:
                # not asked about again until a take finds it at its concurrency
                self.return_reserve(key)
                self.keys.pop(key, None)
        for member, payload in result.reserved:
            entry = self.client.replies.accepted(p, member, payload)
            if entry is not None:
                self.reserve.setdefault(entry.key, deque()).append(entry)
        if result.reserved:
            self.client.count("scheduler/reserved", len(result.reserved))

    def reserved_count(self) -> int:
        """Entries leased in reserve."""
        return sum(len(stock) for stock in self.reserve.values())

    def clear(self) -> None:
        self.reserve.clear()
        self.keys.clear()
        self.share.clear()
