"""The node's mover: the task that moves entries between Redis and MongoDB.

SYNC flags the keys that want a move in ``T:moves`` (``lua/sync/backlog.lua``)
and says in its reply how many wait; this task (one per node, over all its
partitions) wakes at once on such a reply, or polls while the partition has a
backlog or moves under way, and for up to :data:`KEYS_PER_ROUND` keys a round
(picked at random among the first flagged, so the nodes spread the work; their
moves side by side) runs
:meth:`crawlproject.frontier.mover.Mover.spill` or ``refill`` with the window
rule (:mod:`crawlproject.frontier.window`):

* a key over ``1.25 W`` while the partition queues over ``SPILL_ABOVE``: spill
  down to ``W``;
* a key below ``W / 2`` with entries in MongoDB: refill up to ``W``;
* a key whose mover died (its lease expired in ``T:mover``): its leftovers
  are finished, then as above;
* with a backlog but nothing flagged (a flag lost): every 30 s, eight keys
  of ``T:backlog`` at a random place, refilled if their window is low.

MongoDB errors are retried with backoff (:data:`BACKOFF_MIN` doubling to
:data:`BACKOFF_MAX`), one ERROR line per outage and the stat
``backlog/mongo_errors`` each time; a key whose move failed is flagged again.
Everything runs on the event loop (redis-py's and pymongo's asyncio clients):
the reactor never blocks. MongoDB is not connected to until the first move:
a crawl that never spills never touches it.

Off with ``FRONTIER_BACKLOG_ENABLED = False`` (:meth:`MoverTask.from_settings` gives None).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Callable

from redis.exceptions import RedisError

from crawlproject import acl
from crawlproject.defaults import setting
from crawlproject.frontier.backlog import Backlog, BacklogConfig, BacklogError
from crawlproject.frontier.mover import MOVE_BATCH, SPILL_ROUNDS, Claim, Mover, MoveResult, \
    StaleMove
from crawlproject.frontier.sitelimits import parse_override
from crawlproject.frontier.window import SPILL_FACTOR, WindowRule
from crawlproject.keys import as_text

__all__ = ["MoverTask", "BACKOFF_MIN", "BACKOFF_MAX", "KEYS_PER_ROUND"]

logger = logging.getLogger(__name__)

#: keys one round moves at most per partition (CLAIM_MOVES' share of a node)
KEYS_PER_ROUND = 8
#: flagged keys a round picks from (at random: nodes reading the same head
#: would all try the same keys, and all but one find them busy)
PICK_FROM = 32
#: seconds between two sweeps of a partition's largest backlogs when nothing
#: is flagged (a flag lost with a node: slow, and rare)
SWEEP_EVERY = 30.0
#: seconds between two looks at a partition no reply pointed to (at most: the
#: move lease's TTL if shorter). A mover killed in a move leaves its lease and
#: leftovers behind, which no SYNC reply reports (no flag, no backlog yet):
#: only a look at the partition's leases finds them.
LOOK_EVERY = 30.0
#: seconds between retries after a MongoDB error: doubling up to the max
BACKOFF_MIN, BACKOFF_MAX = 0.4, 5.0


class MoverTask:
    """Moves the keys SYNC flags, for each of *frontiers* (the node's
    :class:`~crawlproject.frontier.queue.AsyncFrontier` partitions), as node
    *node*. *backlog* makes the :class:`Backlog` on first use; *default_delay*
    is the nodes' interval between a key's starts (s) where it has no
    override; *poll* the seconds between looks while something is under way;
    *on_moved(p)* is called after a refill queued entries in partition *p*."""

    def __init__(self, frontiers, rule: WindowRule, backlog: Callable[[], Backlog], *,
                 node: str, settings=None, default_delay: float = 0.0, poll: float = 5.0,
                 stats=None, log_extra: dict | None = None,
                 on_moved: Callable[[int], None] = lambda p: None,
                 look_every: float = LOOK_EVERY):
        self.frontiers = frontiers
        self.rule = rule
        self._make_backlog = backlog
        self.backlog: Backlog | None = None
        self._opened = False
        self.node = node
        self.settings = settings
        self.default_delay = default_delay
        self.poll = poll
        self.stats = stats
        self.log_extra = log_extra or {}
        self.on_moved = on_moved
        self.movers: list[Mover] = []
        #: per partition: flagged keys and leases seen by the last look
        self.seen = [0] * len(frontiers)
        #: per partition: when the last backlog sweep ran (monotonic; -inf: never)
        self.swept = [float("-inf")] * len(frontiers)
        #: per partition: look at it next round (a reply said moves wait or a
        #: backlog exists, or the last look found work)
        self.active = [True] * len(frontiers)   # one look at start: leftovers
        #: per partition: when it was last looked at (monotonic), and how often
        #: at least (a dead mover's lease and leftovers: see LOOK_EVERY)
        self.looked = [float("-inf")] * len(frontiers)
        self.look_every = look_every
        self.moving = False
        self.closing = False
        self.down = False                       # in a MongoDB outage (said once)
        self.failed = False                     # an unexpected error was said
        self.refused = False                    # an ACL refusal was said
        self.wakeup = asyncio.Event()
        self._task: asyncio.Future | None = None

    @classmethod
    def from_settings(cls, settings, frontiers, spider: str, node: str,
                      **kwargs) -> "MoverTask | None":
        """The node's mover, or None with the tier off (the frontier imports
        nothing of Scrapy's: the scheduler, Scrapy's side, decides)."""
        rule = WindowRule.from_settings(settings)
        if not rule.enabled:
            return None
        config = BacklogConfig.from_settings(settings)
        stats = kwargs.get("stats")
        kwargs.setdefault("look_every", min(LOOK_EVERY, float(
            setting(settings, "FRONTIER_BACKLOG_LEASE_TTL"))))
        return cls(frontiers, rule, lambda: Backlog.from_config(config, spider, stats=stats),
                   node=node, settings=settings, **kwargs)

    # -- what the node sees -----------------------------------------------------
    def wake(self, p: int | None = None) -> None:
        """A reply said moves wait (or a backlog exists) in partition *p*."""
        if p is None:
            self.active = [True] * len(self.active)
        else:
            self.active[p] = True
        self.wakeup.set()

    def pending(self) -> bool:
        """Moves under way or waiting (flags, leases, one running): a node
        is not idle while any are."""
        return self.moving or any(self.seen)

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self.run())

    async def close(self) -> None:
        self.closing = True
        self.wakeup.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:
                logger.exception("The frontier's mover failed", extra=self.log_extra)
        for mover in self.movers:
            await mover.close()
        if self.backlog is not None:
            await self.backlog.close()

    async def run(self) -> None:
        backoff = BACKOFF_MIN
        while not self.closing:
            try:
                worked = await self.round()
            except (BacklogError, TimeoutError) as exc:
                self._count("backlog/mongo_errors")
                if not self.down:
                    self.down = True
                    logger.error("The frontier's backlog cannot move entries (%s): entries "
                                 "wait in Redis, retried every %g-%gs", exc, BACKOFF_MIN,
                                 BACKOFF_MAX, extra=self.log_extra)
                await self._pause(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
                continue
            except RedisError as exc:
                # (the sync loop says Redis outages; the mover only waits) An ACL
                # refusal is no outage: said once, counted, for the operator to fix
                # (the entries wait in Redis, nothing is lost meanwhile)
                if acl.refusal(exc):
                    self._count("redis/noperm")
                    if not self.refused:
                        self.refused = True
                        logger.error("The frontier's mover cannot move entries: %s",
                                     acl.describe(exc, self._redis_user()), extra=self.log_extra)
                else:
                    logger.debug("Mover: Redis error %s", exc, extra=self.log_extra)
                await self._pause(backoff)
                backoff = min(BACKOFF_MAX, backoff * 2)
                continue
            except Exception:
                # a bug or the unforeseen: said once, the node goes on crawling
                # (what the mover left is finished by the next claim of the key)
                self._count("backlog/mover_errors")
                if not self.failed:
                    self.failed = True
                    logger.exception("The frontier's mover failed; retrying",
                                     extra=self.log_extra)
                await self._pause(BACKOFF_MAX)
                continue
            if self.down:
                self.down = False
                logger.info("The frontier's backlog moves entries again", extra=self.log_extra)
            backoff = BACKOFF_MIN
            if worked:
                await asyncio.sleep(0)   # more may wait: go on, letting others run
            else:
                # (a round looks only at the partitions a reply or the last look
                # marked: an idle wake-up costs no command)
                await self._pause(self.poll)

    def _redis_user(self) -> str:
        """The Redis user of the node's connections (for an ACL refusal's line)."""
        pool = getattr(self.frontiers[0].client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None) or {}
        return kwargs.get("username") or "default"

    async def _pause(self, seconds: float) -> None:
        self.wakeup.clear()
        if self.closing:
            return
        try:
            await asyncio.wait_for(self.wakeup.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    # -- one round --------------------------------------------------------------
    async def round(self) -> bool:
        """One look at each active partition; whether any move was made."""
        worked = False
        for p, frontier in enumerate(self.frontiers):
            now = time.monotonic()
            due = now - self.looked[p] >= self.look_every
            if (self.active[p] or due) and not self.closing:
                self.active[p] = False
                self.looked[p] = now
                worked = await self._partition(p, frontier) or worked
        return worked

    async def _partition(self, p: int, frontier) -> bool:
        keys, r = frontier.keys, frontier.client
        async with r.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.moves, 0, PICK_FROM - 1)
            pipe.hgetall(keys.mover)
            pipe.hmget(keys.kstate, "||qlen", "||backlog")
            flagged, leases, (qlen, backlog) = await pipe.execute()
        flagged = [as_text(k) for k in flagged]
        # Keys another mover holds: a live lease makes CLAIM_MOVES answer busy
        # (nothing done); an expired one is a dead mover's, whose leftovers are
        # finished. (Whether it expired is the claim's to say, in the
        # partition's Redis time: no TIME here, which a cluster pipeline refuses.)
        expired = [k for k in map(as_text, leases) if not k.startswith("||")]
        held = len(expired)
        qlen, backlog = _int(qlen), _int(backlog)
        self.seen[p] = len(flagged) + held
        picks = random.sample(flagged, min(len(flagged), KEYS_PER_ROUND))
        picks += [k for k in expired if k not in picks][:KEYS_PER_ROUND]
        now = time.monotonic()
        if not picks and backlog > 0 and not held and now - self.swept[p] >= SWEEP_EVERY:
            # a backlog with nothing flagged (a flag lost): the largest backlogs,
            # refilled if their window is low; now and then, not every poll
            self.swept[p] = now
            # (a window of T:backlog at a random place: over the sweeps every
            # key is looked at; ZRANGE, which a node's ACL user has)
            at = random.randrange(max(1, await r.zcard(keys.backlog) - KEYS_PER_ROUND + 1))
            picks = [as_text(k) for k in await r.zrange(keys.backlog, at,
                                                        at + KEYS_PER_ROUND - 1)]
        if not picks:
            self.active[p] = backlog > 0      # (polled while a backlog exists)
            return False
        self.active[p] = True        # look again next round (more may wait)
        mover = await self._mover(p)
        self.moving = True

        async def move(k: str) -> bool:
            if self.closing:
                return False
            try:
                return await self._move(p, mover, k, qlen, k in expired)
            except StaleMove:
                return False    # another node took the key over: it finishes the move
            except BaseException:
                await self._flag(frontier, k)   # not lost: tried again
                raise

        try:
            # The keys' moves side by side: each waits on MongoDB and for its
            # commit to reach the AOF (WAITAOF, or the settle: 2 s), which one
            # after the other would hold every key behind the slowest (measured:
            # bench.spill, bench.soak). One Redis connection (the mover's:
            # WAITAOF still covers every commit made on it), one lease per key.
            done = await asyncio.gather(*(move(k) for k in picks), return_exceptions=True)
        finally:
            self.moving = False
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome
        return any(done)

    async def _move(self, p: int, mover: Mover, k: str, qlen: int, leftover: bool) -> bool:
        frontier = self.frontiers[p]
        keys, r = frontier.keys, frontier.client
        window = await self._window(frontier, k)
        async with r.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.queue(k))
            pipe.zscore(keys.backlog, k)
            queued, in_mongo = await pipe.execute()
        in_mongo = int(float(in_mongo or 0))
        if queued > SPILL_FACTOR * window and qlen > self.rule.spill_above:
            result = await mover.spill(k, window)
            self._moved(result)
            if result.spilled >= SPILL_ROUNDS * mover.batch:
                await self._flag(frontier, k)   # still over: the next round goes on
            return bool(result.spilled or result.leftovers)
        if queued < window / 2 and in_mongo > 0:
            result = await mover.refill(k, window - queued)
            self._moved(result)
            if result.refilled:
                self.on_moved(p)
            return bool(result.refilled or result.leftovers or result.tombstoned)
        if leftover:
            return await self._finish(mover, k)
        await r.zrem(keys.moves, k)   # nothing to do (any more): the flag goes
        return False

    async def _finish(self, mover: Mover, k: str) -> bool:
        """A dead mover's leftovers of *k* finished, its lease ended."""
        claim: Claim = await mover.claim(k, "refill")
        if claim.status != "claimed":
            return False
        result = MoveResult()
        if claim.moving:
            written = await mover.write_spill(claim)
            result.leftovers += await mover.commit_spill(claim, written, release=False)
        if claim.refilled:
            members = list(claim.refilled)
            result.tombstoned += await mover.tombstone(claim, members)
            result.leftovers += await mover.refill_done(claim, members, release=False)
        await mover.release(claim)
        self._moved(result)
        return True

    async def _window(self, frontier, k: str) -> int:
        """The key's window as SYNC computes it (``window_of`` in
        lua/sync/pace.lua): from its observed pace in its state, at most what
        its limits allow (its override's delay, else the nodes' default), at
        the partition's Redis time (or the frontier's test clock)."""
        state, raw = await frontier.client.hmget(frontier.keys.kstate, [k, "|" + k])
        interval = self.default_delay
        if raw is not None:
            try:
                delay = parse_override(as_text(raw))["delay"]
            except ValueError:
                delay = None
            if delay is not None:
                interval = delay
        now_ms = 0
        if state is not None and state.count(b"|" if isinstance(state, bytes) else "|") == 7:
            # (only a key with a pace needs the time: TIME on its own, which
            # a cluster pipeline refuses)
            if frontier.clock is not None:
                now_ms = int(frontier.clock())
            else:
                seconds, micros = await frontier.client.time()
                now_ms = int(seconds) * 1000 + int(micros) // 1000
        return self.rule.window_of_state(interval, state, now_ms)

    async def _mover(self, p: int) -> Mover:
        if self.backlog is None:
            self.backlog = self._make_backlog()     # (connects on first use)
        if not self._opened:
            await self.backlog.open()                # retried until MongoDB answers
            self._opened = True
        while len(self.movers) <= p:
            frontier = self.frontiers[len(self.movers)]
            if self.settings is not None:
                mover = Mover.from_settings(self.settings, frontier.client, self.backlog,
                                            frontier.keys, self.node, stats=self.stats)
            else:
                mover = Mover(frontier.client, self.backlog, frontier.keys, self.node,
                              batch=MOVE_BATCH, stats=self.stats)
            self.movers.append(mover)
        return self.movers[p]

    async def _flag(self, frontier, k: str) -> None:
        try:
            await frontier.client.zadd(frontier.keys.moves, {k: int(time.time() * 1000)},
                                       nx=True)
        except RedisError:
            pass   # Redis down too: the backlog sweep finds the key again

    def _moved(self, result: MoveResult) -> None:
        self._count("backlog/spilled", result.spilled)
        self._count("backlog/refilled", result.refilled)
        self._count("backlog/leftovers", result.leftovers)

    def _count(self, name: str, n: int = 1) -> None:
        if self.stats is not None and n:
            self.stats.inc_value(name, n)


def _int(raw) -> int:
    try:
        return max(0, int(as_text(raw)))
    except (TypeError, ValueError):
        return 0
