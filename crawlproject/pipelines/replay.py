"""Replaying spooled items into MongoDB, with or without a crawl.

:func:`replay_segment` is what the pipeline does for each spool segment once
MongoDB answers; :func:`replay_spool` does it for a whole spool directory
without Scrapy, for ``python -m crawlproject.cli spool-replay`` (a node's
machine after it closed with ``mongo_unavailable``, a volume of a container
that is gone...). Both only take segments of this process or of dead
processes (flock adoption, see :mod:`.spool`): a live node's own segments are
left to it, and no segment is replayed by two processes at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from pymongo.errors import PyMongoError

from crawlproject.keys import FrontierKeys
from crawlproject.pipelines.errors import MongoPipelineError
from crawlproject.pipelines.handoff import RedisHandoff
from crawlproject.pipelines.spool import Spool, count_records, target_dir
from crawlproject.pipelines.writer import Counters, MongoWriter

__all__ = ["replay_segment", "replay_spool"]

logger = logging.getLogger(__name__)

CHECK_TIMEOUT = 5.0


async def replay_segment(writer: MongoWriter, spool: Spool, path: Path, *, bulk_size: int,
                         budget: float) -> int | None:
    """Write the segment *path* of *spool*, then delete it.

    Returns how many items were stored, or ``None`` when MongoDB stopped
    answering (the segment stays, to be replayed again: upserts are idempotent).
    """
    extra = writer.log_extra
    segment = await spool.read(path)
    if segment.corrupt_lines:
        writer.stats.inc_value("mongo/spool_corrupt_lines", segment.corrupt_lines)
    stored = await writer.write_spooled(segment.ops, bulk_size=bulk_size, budget=budget)
    if stored is None:
        logger.warning("Replay of %s interrupted (%s); retrying later", path,
                       writer.last_error, extra=extra)
        return None
    await spool.remove(segment)
    logger.info("Replayed %d spooled items from %s", len(segment.ops), path.name, extra=extra)
    return stored


async def replay_spool(uri: str, database: str, spool_dir: str | os.PathLike, *,
                       client_options: dict[str, Any] | None = None, bulk_size: int = 500,
                       budget: float = 10.0, redis=None,
                       spider: str | None = None) -> tuple[int, int]:
    """Replay the spool of MongoDB *uri* / *database* kept under *spool_dir*
    (``MONGO_SPOOL_DIR``, already resolved: see :func:`.spool.spool_path`).

    With an asyncio Redis client *redis* and a *spider* name, the items
    handed over to Redis for this target are replayed too. Returns
    ``(replayed, left)``: items stored, items still waiting (segments of live
    nodes included). Raises :class:`MongoPipelineError` (password scrubbed)
    when MongoDB does not answer, before or during the replay.
    """
    stats = Counters()
    writer = MongoWriter(uri, client_options=client_options, stats=stats)
    where = f"MongoDB at {writer.scrub.redacted} (database {database!r})"
    directory = target_dir(spool_dir, uri, database)
    try:
        try:
            await writer.check(CHECK_TIMEOUT)
        except PyMongoError as exc:
            raise MongoPipelineError(
                f"{where} is not reachable: {writer.scrub.exception(exc)[:300]}") from None
        interrupted = False
        if directory.is_dir():
            spool = Spool(directory).open()
            try:
                for path in spool.replayable():
                    if await replay_segment(writer, spool, path, bulk_size=bulk_size,
                                            budget=budget) is None:
                        interrupted = True
                        break
            finally:
                spool.close()
        left = await asyncio.to_thread(_left_in, directory)
        if redis is not None and spider and not interrupted:
            handoff = RedisHandoff(redis, FrontierKeys(spider).mongo_spool(directory.name),
                                   database)
            interrupted = await handoff.drain(writer, bulk_size=bulk_size, budget=budget) is None
            left += await handoff.count_items()
        replayed = stats.get_value("mongo/replayed", 0)
        if interrupted:
            raise MongoPipelineError(
                f"{where} stopped answering during the replay ({writer.last_error[:200]}): "
                f"{replayed} item(s) replayed, {left} left")
        return replayed, left
    finally:
        await writer.close()


def _left_in(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return count_records(sorted(directory.glob("*.jsonl")))
