"""A node's id at each partition, changed after a lost reply, and the leases
it still holds under a former one (:class:`Identity`)."""

from __future__ import annotations

from typing import Callable

from crawlproject.frontier.partition import PartitionState
from crawlproject.frontier.queue import AsyncFrontier, Batch, member_key


class Identity:
    """Which id of this node holds each leased member, per partition."""

    def __init__(self, partitions: list[AsyncFrontier], parts: list[PartitionState],
                 partition_of: Callable[[str], int]):
        self.partitions, self.parts, self.partition_of = partitions, parts, partition_of
        self.node_base = partitions[0].node
        self.incarnation = 0
        #: member -> the node id it is leased under (changes after a failed call)
        self.owners: dict[str, str] = {}

    def change(self, p: int) -> None:
        # The next call to partition p adopts what this node knows it holds
        # there (buffer, engine); whatever else the old id got from a lost
        # reply is reclaimed when the old id expires. Each partition has its
        # own lease (its own nodes zset): the others keep theirs.
        self.incarnation += 1
        self.partitions[p].node = f"{self.node_base}~{self.incarnation}"
        self.parts[p].maintained = float("-inf")  # register the new id at once

    def own(self, member: str, p: int) -> None:
        """*member* was leased to this node's current id at partition *p*."""
        self.owners[member] = self.partitions[p].node

    def settled(self, p: int, batch: Batch) -> None:
        """*batch*'s call to partition *p* went through."""
        for member, _ in batch.adopt:
            if member in self.owners:
                self.owners[member] = self.partitions[p].node
        # Forgotten only once the call that settles them went through: until
        # then a changed id must still adopt them for the settling call to count.
        for member in (*batch.acks, *(f[0] for f in batch.fails), *batch.nacks):
            self.owners.pop(member, None)

    def adoptions(self, p: int) -> list[tuple[str, str]]:
        """Leases of partition *p* this node holds under a former id of its own."""
        current = self.partitions[p].node
        return [(m, owner) for m, owner in self.owners.items()
                if owner != current and self.partition_of_member(m) == p]

    def partition_of_member(self, member: str) -> int:
        return self.partition_of(member_key(member))
