"""RedisHandoff: spooled items handed to Redis so that they outlive their node.

A node that must close while MongoDB is still unreachable (after
``MONGO_CLOSE_WAIT``) moves its spool here rather than leave it on a disk
that may go away with the machine or container. Any node of the spider
replays it once MongoDB answers (when it opens, and when an outage of its
own ends), and so does ``python -m crawlproject.cli spool-replay --spider``.

Key: ``{<spider>}:mongo_spool:<target>``, a list (see :mod:`crawlproject.keys`);
``<target>`` is the spool's directory name, ``<database>-<hash of hosts>``,
so items only ever go to the deployment they were meant for. Each element
is a chunk of up to ``chunk_records`` spool lines
(:func:`~crawlproject.pipelines.documents.to_spool_line`), newline-separated.

A replay reads the head chunk (``LINDEX``, not a pop), writes it, and only
then removes that exact value (``LREM key 1 chunk``). Nodes draining at once
may write a chunk twice (idempotent upserts: harmless) but never remove one
that was not written; a node that dies mid-drain leaves the chunk in place.
"""

from __future__ import annotations

import logging

from crawlproject.pipelines.documents import WriteOp, from_spool_line, to_spool_line
from crawlproject.pipelines.writer import MongoWriter

__all__ = ["RedisHandoff"]

logger = logging.getLogger(__name__)

CHUNK_RECORDS = 500
COUNT_PAGE = 100


class RedisHandoff:
    """The handoff list *key* on the asyncio Redis *client*."""

    def __init__(self, client, key: str, database: str, chunk_records: int = CHUNK_RECORDS):
        self.client = client
        self.key = key
        #: the only database lines of this list may write to (the list is in
        #: Redis: a line naming another database is refused, not written)
        self.database = database
        self.chunk_records = chunk_records

    async def push(self, ops: list[WriteOp]) -> None:
        """Append *ops* in one ``RPUSH`` (all of them, or none if it fails)."""
        if not ops:
            return
        chunks = []
        for start in range(0, len(ops), self.chunk_records):
            lines = (to_spool_line(op) for op in ops[start:start + self.chunk_records])
            chunks.append("\n".join(lines).encode("utf-8"))
        await self.client.rpush(self.key, *chunks)

    async def count_items(self) -> int:
        """How many items the list holds (reads it a page of chunks at a time)."""
        total, start = 0, 0
        while True:
            chunks = await self.client.lrange(self.key, start, start + COUNT_PAGE - 1)
            total += sum(_raw(chunk).count(b"\n") + 1 for chunk in chunks if chunk)
            if len(chunks) < COUNT_PAGE:
                return total
            start += COUNT_PAGE

    async def drain(self, writer: MongoWriter, *, bulk_size: int, budget: float,
                    log_extra: dict | None = None) -> int | None:
        """Write every chunk to MongoDB, removing each once written.

        Returns how many items were stored, or ``None`` when MongoDB stopped
        answering (the unwritten chunks stay). Redis errors propagate.
        """
        extra = log_extra or {}
        stored = 0
        while True:
            chunk = await self.client.lindex(self.key, 0)
            if chunk is None:
                if stored:
                    logger.info("Stored %d spooled items handed over in Redis list %s", stored,
                                self.key, extra=extra)
                return stored
            ops = self._parse(chunk, writer, extra)
            written = await writer.write_spooled(ops, bulk_size=bulk_size, budget=budget)
            if written is None:
                logger.warning("Replay of Redis list %s interrupted (%s); retrying later",
                               self.key, writer.last_error, extra=extra)
                return None
            await self.client.lrem(self.key, 1, chunk)
            writer.stats.inc_value("mongo/handoff_replayed", written)
            stored += written

    def _parse(self, chunk, writer: MongoWriter, extra: dict) -> list[WriteOp]:
        ops = []
        for number, line in enumerate(_raw(chunk).split(b"\n"), 1):
            try:
                op = from_spool_line(line.decode("utf-8"))
                if op.database != self.database:
                    raise ValueError(f"names database {op.database[:100]!r}, not "
                                     f"{self.database!r}")
                ops.append(op)
            except (ValueError, UnicodeDecodeError) as exc:
                # Only lines parsed from a spool segment are pushed: this is
                # damage in Redis. Say what is lost rather than block the list.
                writer.stats.inc_value("mongo/spool_corrupt_lines")
                logger.error("Malformed line %d of a chunk in %s, not stored: %s: %r", number,
                             self.key, exc, line[:200], extra=extra)
        return ops


def _raw(chunk) -> bytes:
    return chunk.encode("utf-8") if isinstance(chunk, str) else chunk
