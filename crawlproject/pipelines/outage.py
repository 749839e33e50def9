"""MongoDB outages: where a batch goes, when the outage ends, what happens at close.

:class:`OutageHandler` is the storage side of :class:`~.mongo.MongoPipeline`,
without Scrapy:

* :meth:`~OutageHandler.store` writes a batch through the
  :class:`~.writer.MongoWriter`; when MongoDB stays unavailable for
  ``MONGO_SPOOL_AFTER`` seconds the outage begins: the rest of the batch and
  every later batch go to the local :class:`~.spool.Spool`, and a probe pings
  MongoDB every ``MONGO_PROBE_INTERVAL`` seconds and replays the spool once it
  answers (the outage ends when the spool is empty).
* :meth:`~OutageHandler.idle_close` decides the idle close: held while items
  are spooled and MongoDB is down, for at most ``MONGO_CLOSE_WAIT`` seconds,
  then a close with the finish reason :data:`CLOSE_REASON`.
* :meth:`~OutageHandler.close` makes the last replay and, if MongoDB is still
  down, hands the spool to Redis (:class:`~.handoff.RedisHandoff`, up to
  ``MONGO_SPOOL_HANDOFF_MAX_MB``) and logs one ERROR with what is left and where.
* Items other nodes handed to Redis are stored in the background at open and
  whenever an outage ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from scrapy.exceptions import CloseSpider, DontCloseSpider, DropItem

from crawlproject.pipelines.batcher import Pending, settle
from crawlproject.pipelines.config import MongoConfig
from crawlproject.pipelines.errors import Scrubber
from crawlproject.pipelines.handoff import RedisHandoff
from crawlproject.pipelines.replay import replay_segment
from crawlproject.pipelines.spool import Spool, count_records
from crawlproject.pipelines.writer import MongoWriter

logger = logging.getLogger(__name__)

#: Finish reason of a node that stopped waiting for MongoDB (see ``MONGO_CLOSE_WAIT``).
CLOSE_REASON = "mongo_unavailable"
REPLAY_COMMAND = "python -m crawlproject.cli spool-replay"


class OutageHandler:
    """Write batches, spool them through outages, decide the close.

    *config* gives the spool directory, the batch size and the outage's
    timings. *requeue* puts entries back into the buffer (the spool could not
    be written, or MongoDB came back while a batch waited for it). The spool
    and the handoff are given by :meth:`attach` once the pipeline opens.
    """

    def __init__(self, writer: MongoWriter, stats, config: MongoConfig, *, requeue,
                 redis_scrub: Scrubber | None = None):
        self.writer = writer
        self.stats = stats
        self.requeue = requeue
        self.config = config
        self.redis_scrub = redis_scrub or Scrubber("")
        self.spool: Spool | None = None
        self.handoff: RedisHandoff | None = None
        self.spider_name = ""
        self.log_extra: dict = {}
        self.active = False  # MongoDB is unavailable: batches go to the spool
        self._since: float | None = None   # when the outage began; None: none yet
        self._held_since: float | None = None
        self._closing = False
        self._probe: asyncio.Task | None = None
        self._drain: asyncio.Task | None = None
        self._replay_lock = asyncio.Lock()

    def attach(self, spool: Spool, handoff: RedisHandoff | None, *, spider_name: str,
               log_extra: dict) -> None:
        """Give the opened spool (and the Redis handoff, if any)."""
        self.spool = spool
        self.handoff = handoff
        self.spider_name = spider_name
        self.log_extra = log_extra

    # -- open --------------------------------------------------------------------
    async def recover(self) -> None:
        """At open: replay what earlier runs left in the spool, then start
        storing what other nodes handed to Redis."""
        if self.spool.replayable():
            logger.info("Replaying spooled items left by an earlier run", extra=self.log_extra)
            try:
                replayed = await self.replay()
            except Exception:
                logger.exception("Replaying the spool failed", extra=self.log_extra)
                replayed = False
            if not replayed:  # the probe keeps trying, new items go to the spool meanwhile
                self.enter("the replay of the spool failed")
        if not self.active:
            self._start_drain()

    # -- batches -----------------------------------------------------------------
    async def store(self, batch: list[Pending]) -> None:
        """Write *batch* to MongoDB, or to the spool during an outage."""
        self.stats.inc_value("mongo/batches")
        leftover = batch
        if not self.active:
            outcome = await self.writer.write([e.op for e in batch], budget=self.config.spool_after)
            unavailable = {id(op) for op in outcome.unavailable}
            leftover = []
            for entry in batch:
                key = id(entry.op)
                if key in unavailable:
                    leftover.append(entry)
                elif key in outcome.failed:
                    settle(entry.future, DropItem(outcome.failed[key]))
                else:
                    settle(entry.future)
            if not leftover:
                return
            self.enter(outcome.error)
        try:
            async with self.spool.lock:
                spooled = self.active
                if spooled:
                    await self.spool.append_locked([e.op for e in leftover])
        except OSError as exc:
            self.stats.inc_value("mongo/spool_errors")
            logger.error("Cannot write the spool in %s (%s); keeping %d items in memory and "
                         "retrying", self.spool.directory, exc, len(leftover),
                         extra=self.log_extra)
            self.requeue(leftover)
            await asyncio.sleep(self.config.backoff_max)
            return
        if not spooled:  # MongoDB came back while we waited: write them normally
            self.requeue(leftover)
            return
        self.stats.inc_value("mongo/spooled", len(leftover))
        for entry in leftover:
            settle(entry.future)

    # -- outage state ------------------------------------------------------------
    def enter(self, reason: str) -> None:
        """MongoDB is unavailable: spool from now on, probe until it answers."""
        if self.active:
            return
        self.active = True
        self._since = time.monotonic()
        self.stats.inc_value("mongo/outages")
        logger.error("MongoDB unavailable for more than %.1fs (%s): spooling items to %s until it "
                     "answers again", self.config.spool_after, reason or "unknown error",
                     self.spool.directory, extra=self.log_extra)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_loop())

    def _leave(self) -> None:
        self.active = False
        logger.info("MongoDB answers again after %.1fs; the spool is replayed and empty",
                    time.monotonic() - self._since, extra=self.log_extra)
        self._start_drain()  # nodes that closed meanwhile may have handed items over

    async def _probe_loop(self) -> None:
        while self.active and not self._closing:
            await asyncio.sleep(self.config.probe_interval)
            if self._closing:
                return
            try:
                if await self.writer.ping() and await self.replay():
                    return
            except Exception:  # e.g. the spool directory became unreadable: keep trying
                logger.exception("Replaying the spool failed; retrying", extra=self.log_extra)

    async def replay(self) -> bool:
        """Write every replayable spool segment; True when the spool is empty
        (then the outage, if any, is over)."""
        async with self._replay_lock:
            while True:
                if self.active or self.spool.active_records:
                    await self.spool.seal()
                paths = self.spool.replayable()
                if not paths:
                    async with self.spool.lock:
                        if self.spool.active_records == 0:
                            if self.active:
                                self._leave()
                            return True
                    continue
                for path in paths:
                    if await replay_segment(self.writer, self.spool, path,
                                            bulk_size=self.config.bulk_size,
                                            budget=self.config.spool_after) is None:
                        return False

    # -- closing -----------------------------------------------------------------
    def idle_close(self, now: float) -> None:
        """Hold the idle close while items are spooled and MongoDB is down.

        Items in a local spool are lost with the machine (ephemeral
        containers), so wait up to ``close_wait`` seconds (by the clock that
        gave *now*) for the probe to replay them; then close with a finish
        reason of its own. Raises ``DontCloseSpider`` or ``CloseSpider``.
        """
        if not self.active or self.spool is None:
            self._held_since = None
            return
        if self._held_since is None:
            self._held_since = now
            if self.config.close_wait > 0:
                logger.warning("Not closing yet: MongoDB is unreachable and items are spooled "
                               "in %s; waiting up to %.0fs for it to answer (MONGO_CLOSE_WAIT)",
                               self.spool.directory, self.config.close_wait, extra=self.log_extra)
        if now - self._held_since < self.config.close_wait:
            raise DontCloseSpider
        logger.warning("MongoDB still unreachable after %.0fs of MONGO_CLOSE_WAIT: closing "
                       "(finish reason %r)", now - self._held_since, CLOSE_REASON,
                       extra=self.log_extra)
        raise CloseSpider(CLOSE_REASON)

    def begin_close(self) -> None:
        """The pipeline closes: no new probe round, no new handoff drain."""
        self._closing = True

    async def close(self) -> None:
        """After the last flush: stop the probe, wait for the handoff drain,
        try a last replay; if MongoDB is still down, hand the spool to Redis
        and report what is left."""
        self._closing = True
        if self._probe is not None:
            self._probe.cancel()
            try:
                await self._probe
            except (asyncio.CancelledError, Exception):
                pass
        if self._drain is not None:
            await self._drain  # stops by itself if MongoDB stops answering
        if self.spool is not None:
            if self.active or self.spool.replayable():
                if await self.writer.ping():
                    await self.replay()
            await self._report_leftovers()

    # -- handoff through Redis -----------------------------------------------------
    def _start_drain(self) -> None:
        if self.handoff is not None and not self._closing and (
                self._drain is None or self._drain.done()):
            self._drain = asyncio.ensure_future(self._drain_handoff())

    async def _drain_handoff(self) -> None:
        """Store the items other nodes handed over to Redis (in the background)."""
        try:
            await self.handoff.drain(self.writer, bulk_size=self.config.bulk_size,
                                     budget=self.config.spool_after, log_extra=self.log_extra)
        except Exception as exc:  # Redis down: they wait for the next node or the next outage end
            logger.warning("Cannot replay the spooled items handed over in Redis list %s (%s); "
                           "set MONGO_SPOOL_HANDOFF = False if this project has no Redis",
                           self.handoff.key, self.redis_scrub.exception(exc)[:300],
                           extra=self.log_extra)

    async def _report_leftovers(self) -> None:
        """MongoDB is still down at close: hand what this node spooled (and
        adopted) to Redis, and log one ERROR with what is left and where."""
        await self.spool.seal()
        paths = self.spool.replayable()
        if not paths:
            return
        if self.handoff is None:
            handed, reason = 0, "MONGO_SPOOL_HANDOFF is off"
        else:
            handed, reason = await self._hand_off(paths)
        kept_paths = [path for path in paths if path.exists()]
        kept = await asyncio.to_thread(count_records, kept_paths)
        if handed + kept == 0:
            return
        self.stats.set_value("mongo/spool_left_items", handed + kept)
        if handed:
            self.stats.set_value("mongo/spool_handed_off", handed)
        if kept_paths:
            self.stats.set_value("mongo/spool_left", len(kept_paths))
        directory = self.spool.directory
        if not kept:
            logger.error("MongoDB still unreachable at close: %d items not stored were moved "
                         "from the spool in %s to Redis list %s; any node of this spider "
                         "stores them when MongoDB answers (or run: %s --spider %s)",
                         handed, directory, self.handoff.key, REPLAY_COMMAND,
                         self.spider_name, extra=self.log_extra)
            return
        moved = (f", {handed} moved to Redis list {self.handoff.key}" if handed else "")
        logger.error("MongoDB still unreachable at close: %d items not stored%s, %d left in "
                     "%d spool file(s) in %s (not handed to Redis: %s); replay them with: "
                     "%s --spool-dir %s (or start a node with this MONGO_SPOOL_DIR)",
                     handed + kept, moved, kept, len(kept_paths), directory, reason,
                     REPLAY_COMMAND, self.config.spool_dir, extra=self.log_extra)

    async def _hand_off(self, paths: list[Path]) -> tuple[int, str]:
        """Push whole segments to Redis, deleting each once pushed.

        Returns the items moved and, if some stay, why. A crash between a push
        and the delete leaves the items in both places: replayed twice, harmlessly.
        """
        room = self.config.handoff_max_bytes
        handed = 0
        for path in paths:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size > room:
                most = self.config.handoff_max_bytes >> 20
                return handed, f"over MONGO_SPOOL_HANDOFF_MAX_MB ({most})"
            segment = await self.spool.read(path)
            try:
                await self.handoff.push(segment.ops)
            except Exception as exc:
                return handed, f"Redis: {self.redis_scrub.exception(exc)[:300]}"
            await self.spool.remove(segment)
            room -= size
            handed += len(segment.ops)
        return handed, ""
