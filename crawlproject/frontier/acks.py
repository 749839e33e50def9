"""Acknowledgement order across partitions: a request is never acknowledged
before the requests it produced are stored (:class:`AckOrder`)."""

from __future__ import annotations

from crawlproject.frontier.partition import PartitionState
from crawlproject.frontier.queue import Batch

INF = float("inf")


class AckOrder:
    """A node's acknowledgements, held until the adds they depend on are stored.

    Every add gets a sequence number; an ack waits until the adds it depends on
    are stored (or go in the same atomic call), so a request is never
    acknowledged before the requests it produced are safe. An add made with the
    member that produced it (its parent) is a dependency of that member's ack
    only; one made without is one of every ack after it.
    """

    def __init__(self, parts: list[PartitionState]):
        self.parts = parts
        self.seq = 0
        #: parent member -> {partition: sequence number of its last add there}
        self.children: dict[str, dict[int, int]] = {}
        #: acks not sent yet: (member, partition, relieve, last add before it, children)
        self.pending: list[tuple[str, int, bool, int, dict[int, int] | None]] = []

    def added(self, p: int, parent: str | None) -> None:
        """A new request for partition *p*, produced by *parent* (if known)."""
        self.seq += 1
        self.parts[p].unsent.append(self.seq)
        if parent is None:
            self.parts[p].unsent_orphans.append(self.seq)
        else:
            self.children.setdefault(parent, {})[p] = self.seq

    def ack(self, member: str, p: int, relieve: bool) -> None:
        """*member* of partition *p* is done: its ack waits for its adds."""
        self.pending.append((member, p, relieve, self.seq, self.children.pop(member, None)))

    def attach(self, batches: dict[int, Batch]) -> None:
        """Move the acks that may go now into the batches about to be sent.

        An ack for partition p may go when every add it depends on is either
        stored, or in p's batch (the script stores adds before it applies
        acks, atomically): the adds made with it as their parent, and every
        add made without a parent before it. Such adds still unsent or in
        another partition's call (which may fail while p's succeeds) make it
        wait for a later call; the adds of other parents do not.
        """
        if not self.pending:
            return
        sending = {p: len(b.adds) for p, b in batches.items()}
        first, after, first_orphan, after_orphan = [], [], [], []
        for p, state in enumerate(self.parts):
            pending = state.unsent
            n = sending.get(p, 0)
            first.append(pending[0] if pending else INF)
            # the first unsent add of each partition once this round is stored
            after.append(pending[n] if len(pending) > n else INF)
            orphans = state.unsent_orphans
            first_orphan.append(orphans[0] if orphans else INF)
            after_orphan.append(next((s for s in orphans if s >= after[p]), INF)
                                if n else first_orphan[p])
        # An ack for p waits for the orphan adds of every other partition.
        lowest = sorted((s, q) for q, s in enumerate(first_orphan))[:2]
        keep = []
        for ack in self.pending:
            member, p, relieve, epoch, children = ack
            batch = batches.get(p)
            others = next((s for s, q in lowest if q != p), INF)
            ready = batch is not None and epoch < min(after_orphan[p], others)
            if ready and children:
                ready = all(seq < (after[q] if q == p else first[q])
                            for q, seq in children.items())
            if not ready:
                keep.append(ack)
                continue
            batch.acks.append(member)
            if not relieve:
                batch.unrelieved.add(member)
        self.pending = keep

    def stored(self, p: int, count: int) -> None:
        """The first *count* unsent adds of partition *p* are stored."""
        state = self.parts[p]
        pending, orphans, last = state.unsent, state.unsent_orphans, 0
        for _ in range(count):
            last = pending.popleft()
        while orphans and orphans[0] <= last:
            orphans.popleft()
