"""Moving a politeness key's entries between its Redis window and the MongoDB backlog.

The protocol of docs/frontier.md ("Spill and refill: every marked URL durably
in exactly one place"): a member is at every instant in exactly one of its
key's queue (``T:q:<key>``), the moving set (``T:moving:<key>``, payload kept,
not takeable), a live MongoDB document, or queued again and recorded in
``T:refilled:<key>`` until its MongoDB copy is tombstoned.

**Spill** (:meth:`Mover.spill`): CLAIM_MOVES takes the key's lease and moves
its worst-ranked members beyond the window (at most a batch) from the queue to
the moving set (step 1); once that is on disk the members are inserted into
MongoDB (step 2, idempotent); SPILL_COMMIT (fenced) deletes their payloads and
counts them in ``T:backlog`` (step 3).

**Refill** (:meth:`Mover.refill`): CLAIM_MOVES takes the lease; one range scan
reads the key's head from MongoDB (step 1); REFILL_COMMIT (fenced) queues those
members not already in Redis and records them all in ``T:refilled:<key>``
(step 2); once that is on disk their MongoDB copies are tombstoned (step 3);
REFILL_DONE clears the record (step 4).

A claim that finds a dead predecessor's leftovers (a non-empty moving set or
refilled record) gets them instead, and the mover finishes them first. Every
commit checks the lease's epoch (fencing): a mover whose lease expired or was
taken over can never commit (:class:`StaleMove`).

*On disk*: a MongoDB step that follows a Redis commit waits until the commit
is durable, so that a Redis restarted from its AOF never lacks a commit that
MongoDB acted on: ``WAITAOF 1 0`` where Redis has it, >= 7.2 (on the mover's one
connection: WAITAOF waits for that connection's writes, and the claim it just
made is after every earlier commit in the AOF), else ``FRONTIER_BACKLOG_SETTLE``
seconds (appendfsync everysec's bound) and a re-read of the marker: only the
members still in it are acted on. A Redis without an AOF (``INFO persistence``:
``aof_enabled:0``) is not waited on: a restart loses its recent writes whatever
the mover waits (an RDB snapshot is minutes old), and the settle would only slow
every move (measured: ``python -m bench.spill``).

Its callers (:mod:`crawlproject.frontier.movertask`) say which key to move and
how far.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass, field

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from crawlproject import defaults
from crawlproject.defaults import setting
from crawlproject.frontier.backlog import Backlog, BacklogEntry
from crawlproject.frontier.library import script
from crawlproject.frontier.scripts import CLAIM_MOVES, REFILL_COMMIT, REFILL_DONE, SPILL_COMMIT
from crawlproject.keys import FrontierKeys, as_text

__all__ = ["Claim", "Mover", "MoveResult", "StaleMove", "MOVE_BATCH"]

logger = logging.getLogger(__name__)

#: Members one step moves at most (URL Frontier's 256 doubled its ingest).
MOVE_BATCH = 256
#: Rounds one :meth:`Mover.spill` call makes at most (a key far over its
#: window is brought down over several calls: the node's other keys wait less).
SPILL_ROUNDS = 16
#: ms WAITAOF waits for the local fsync before the step is refused
WAITAOF_TIMEOUT_MS = 5000
#: the steps FRONTIER_BACKLOG_CRASH_AT may name (docs/frontier.md's numbering)
STEPS = ("spill:1", "spill:2", "spill:3", "refill:1", "refill:2", "refill:3", "refill:4")


class StaleMove(RuntimeError):
    """A commit refused: this mover's lease of the key expired or was taken
    over (another mover finishes the move)."""


@dataclass
class Claim:
    """What CLAIM_MOVES gave: the lease (``epoch``, ``deadline`` ms) and the
    members to finish or move."""

    key: str
    status: str
    epoch: str = ""
    deadline: int = 0
    #: (member, score, payload) leaving for MongoDB
    moving: list[tuple[str, int, bytes]] = field(default_factory=list)
    #: members queued again whose MongoDB copies are still live
    refilled: list[str] = field(default_factory=list)
    #: how many of ``moving`` this claim's step 1 moved (0: leftovers)
    moved: int = 0


@dataclass
class MoveResult:
    """What a :meth:`Mover.spill` or :meth:`Mover.refill` call did."""

    spilled: int = 0          # members that left Redis for MongoDB
    refilled: int = 0         # members queued again from MongoDB
    skipped: int = 0          # documents read whose member was already in Redis
    tombstoned: int = 0       # MongoDB copies tombstoned
    leftovers: int = 0        # members of a dead predecessor's move finished
    busy: bool = False        # another node holds the key's lease


class Mover:
    """Moves one partition's keys between Redis (*redis*, an asyncio redis-py
    client) and *backlog* (:class:`crawlproject.frontier.backlog.Backlog` of
    the same spider), as node *node*.

    The mover works on a single connection of *redis*'s pool (``client()``):
    WAITAOF waits for its own connection's writes (a cluster client has no
    such connection: it waits *settle* instead). *lease_ttl* and *settle*
    are in seconds (``FRONTIER_BACKLOG_LEASE_TTL``, ``FRONTIER_BACKLOG_SETTLE``);
    *clock* (tests) gives the time in ms instead of Redis.
    """

    def __init__(self, redis, backlog: Backlog, keys: FrontierKeys, node: str, *,
                 lease_ttl: float = defaults.FRONTIER_BACKLOG_LEASE_TTL,
                 settle: float = defaults.FRONTIER_BACKLOG_SETTLE, batch: int = MOVE_BATCH,
                 stats=None, clock=None, crash_at: str | None = None):
        self.redis = redis.client() if hasattr(redis, "client") else redis
        self.backlog = backlog
        self.keys = keys
        self.node = node
        if lease_ttl <= 0 or settle < 0:
            raise ValueError(f"FRONTIER_BACKLOG_LEASE_TTL must be > 0 and "
                             f"FRONTIER_BACKLOG_SETTLE >= 0, got {lease_ttl!r}, {settle!r}")
        self.lease_ms = max(1, int(lease_ttl * 1000))
        self.settle = settle
        self.batch = max(1, min(int(batch), 1024))
        self.stats = stats
        # clock() -> ms; None means Redis server time (node clocks never matter)
        self.clock = clock
        self._move_keys = self.keys.move_keys()
        self._claim = script(self.redis, CLAIM_MOVES)
        self._spill_commit = script(self.redis, SPILL_COMMIT)
        self._refill_commit = script(self.redis, REFILL_COMMIT)
        self._refill_done = script(self.redis, REFILL_DONE)
        # None: not known yet. A cluster client has no single connection to give
        # (its commands go over per-master pools), and WAITAOF waits only for the
        # writes of the connection it is sent on: there the settle delay it is.
        self._waitaof: bool | None = None if hasattr(redis, "client") else False
        self._info_refused = False            # INFO persistence refused (ACL)
        self.crash_at = _crash_at(crash_at)

    @classmethod
    def from_settings(cls, settings, redis, backlog: Backlog, keys: FrontierKeys, node: str, *,
                      stats=None) -> "Mover":
        """A mover with ``FRONTIER_BACKLOG_LEASE_TTL``, ``FRONTIER_BACKLOG_SETTLE``
        and ``FRONTIER_REFILL_BATCH`` (the batch of both moves) from *settings*;
        ``FRONTIER_BACKLOG_CRASH_AT``: the tests' crash point (:meth:`_after`)."""
        return cls(redis, backlog, keys, node,
                   lease_ttl=setting(settings, "FRONTIER_BACKLOG_LEASE_TTL"),
                   settle=setting(settings, "FRONTIER_BACKLOG_SETTLE"),
                   batch=setting(settings, "FRONTIER_REFILL_BATCH"), stats=stats,
                   crash_at=setting(settings, "FRONTIER_BACKLOG_CRASH_AT"))

    async def close(self) -> None:
        await self.redis.aclose()

    # -- the two moves -----------------------------------------------------------
    async def spill(self, key: str, window: int) -> MoveResult:
        """Bring *key*'s queue down to *window* entries, the rest to MongoDB
        (a dead predecessor's leftovers first). At most :data:`SPILL_ROUNDS`
        batches per call. Raises :class:`StaleMove` when the lease was lost
        midway, :class:`~crawlproject.frontier.backlog.BacklogUnavailable` when
        MongoDB does not answer (the members wait in the moving set)."""
        result = MoveResult()
        for _ in range(SPILL_ROUNDS):
            claim = await self.claim(key, "spill", window)
            if claim.status == "busy":
                result.busy = True
                return result
            if claim.status == "idle":
                return result
            if claim.refilled:
                await self._finish_refill(claim, result)
            if claim.moving:
                written = await self.write_spill(claim)
                done = await self.commit_spill(claim, written, release=True)
                if claim.moved:
                    result.spilled += done
                else:
                    result.leftovers += done
            else:
                await self.release(claim)
            if claim.moved and claim.moved < self.batch:
                return result   # within the window now
        return result

    async def refill(self, key: str, want: int) -> MoveResult:
        """Queue up to *want* (at most a batch) of *key*'s entries from MongoDB
        again, first in queue order (a dead predecessor's leftovers first).
        Raises as :meth:`spill`; MongoDB down mid-refill loses nothing (a
        retry finishes it)."""
        result = MoveResult()
        claim = await self.claim(key, "refill")
        if claim.status == "busy":
            result.busy = True
            return result
        if claim.moving:
            written = await self.write_spill(claim)
            result.leftovers += await self.commit_spill(claim, written, release=False)
        if claim.refilled:
            await self._finish_refill(claim, result)
        entries = await self.read_refill(claim, min(want, self.batch))
        if not entries:
            # (none live in MongoDB: a count left by documents deleted outside
            # the crawl is cleared, fenced like any commit)
            await self.commit_refill(claim, [])
            await self.release(claim)
            return result
        queued, skipped = await self.commit_refill(claim, entries)
        result.refilled += queued
        result.skipped += skipped
        members = [e.member for e in entries]
        result.tombstoned += await self.tombstone(claim, members)
        await self.refill_done(claim, members, release=True)
        return result

    async def _finish_refill(self, claim: Claim, result: MoveResult) -> None:
        members = list(claim.refilled)
        result.tombstoned += await self.tombstone(claim, members)
        result.leftovers += await self.refill_done(claim, members, release=False)
        claim.refilled = []

    # -- the steps (public: the tests run them one by one) -----------------------
    async def claim(self, key: str, kind: str, window: int = 0) -> Claim:
        """CLAIM_MOVES: the key's lease, its leftovers, and for a spill step 1."""
        raw = await self._claim(keys=self._move_keys,
                                args=[self._now(), self.node, key, self.lease_ms, kind,
                                      max(0, window), self.batch])
        status, epoch, deadline, moving, refilled, moved = raw
        claim = Claim(key, as_text(status), as_text(epoch), int(deadline), moved=int(moved))
        claim.moving = [(as_text(moving[i]), int(float(moving[i + 1])), moving[i + 2])
                        for i in range(0, len(moving), 3)]
        claim.refilled = [as_text(m) for m in refilled]
        if kind == "spill" and claim.moved:
            self._after("spill:1")
        return claim

    async def write_spill(self, claim: Claim) -> list[str]:
        """Spill step 2: once the claim is on disk, insert the members still
        in the moving set into MongoDB; returns the members written."""
        await self._on_disk()
        moving = claim.moving
        if self._waitaof is False and moving:
            # settled, not proven: act only on what the marker still holds
            # (a batch at most: read whole, with a command a node's ACL user has)
            there = {as_text(m) for m in await self.redis.zrange(self.keys.moving(claim.key),
                                                                   0, -1)}
            moving = [entry for entry in moving if entry[0] in there]
        await self.backlog.spill(self.keys.partition, claim.key, moving, epoch=int(claim.epoch))
        if moving:
            self._after("spill:2")
        return [m for m, _, _ in moving]

    async def commit_spill(self, claim: Claim, members: list[str], *, release: bool) -> int:
        """Spill step 3 (SPILL_COMMIT, fenced): returns how many left Redis."""
        reply = await self._spill_commit(keys=self._move_keys,
                                         args=self._commit_args(claim, release, members))
        done = self._ok(reply, claim)[0]
        if members:
            self._after("spill:3")
        return done

    async def read_refill(self, claim: Claim, n: int) -> list[BacklogEntry]:
        """Refill step 1: the key's next *n* live documents (one range scan)."""
        entries = await self.backlog.peek(self.keys.partition, claim.key, n)
        if entries:
            self._after("refill:1")
        return entries

    async def commit_refill(self, claim: Claim, entries: list[BacklogEntry]) -> tuple[int, int]:
        """Refill step 2 (REFILL_COMMIT, fenced): ``(queued, skipped)``."""
        args = [self._now(), self.node, claim.key, claim.epoch]
        for entry in entries:
            args += [entry.member, entry.payload]
        queued, skipped, junk, cleared = self._ok(
            await self._refill_commit(keys=self._move_keys, args=args), claim)
        if junk:
            logger.warning("The frontier backlog held %d entries of %r that are not its "
                           "members: tombstoned, not queued", junk, claim.key)
        if cleared:
            self._count("frontier/backlog/lost", cleared)
            logger.warning("MongoDB holds none of the %d entries of %r the frontier counts "
                           "there (deleted outside the crawl?): the count is cleared, so the "
                           "crawl can end", cleared, claim.key)
        if entries:
            self._after("refill:2")
        return queued, skipped

    async def tombstone(self, claim: Claim, members: list[str]) -> int:
        """Refill step 3: once the commit is on disk, tombstone the MongoDB
        copies of the members still recorded as refilled."""
        await self._on_disk()
        if self._waitaof is False and members:
            there = {as_text(m) for m in await self.redis.smembers(
                self.keys.refilled(claim.key))}
            members = [m for m in members if m in there]
        done = await self.backlog.tombstone(self.keys.partition, members,
                                            epoch=int(claim.epoch))
        if members:
            self._after("refill:3")
        return done

    async def refill_done(self, claim: Claim, members: list[str], *, release: bool) -> int:
        """Refill step 4 (REFILL_DONE, fenced): the record cleared."""
        reply = await self._refill_done(keys=self._move_keys,
                                        args=self._commit_args(claim, release, members))
        done = self._ok(reply, claim)[0]
        if members:
            self._after("refill:4")
        return done

    async def release(self, claim: Claim) -> None:
        """End the lease with nothing (more) to commit."""
        await self.refill_done(claim, [], release=True)

    # -- helpers -------------------------------------------------------------------
    def _now(self) -> str:
        return str(int(self.clock())) if self.clock else ""

    def _commit_args(self, claim: Claim, release: bool, members: list[str]) -> list:
        return [self._now(), self.node, claim.key, claim.epoch, "1" if release else "0",
                *members]

    def _ok(self, reply, claim: Claim) -> list[int]:
        status = as_text(reply[0])
        if status == "fenced":
            self._count("frontier/backlog/stale_commits")
            raise StaleMove(f"move of {claim.key!r} (epoch {claim.epoch}) refused: "
                            f"{as_text(reply[1])}")
        return [int(x) for x in reply[1:]]

    async def _on_disk(self) -> None:
        """Wait until this connection's writes (the last claim or commit, and
        every write before it in the AOF) are durable in Redis."""
        if self._waitaof is not False:
            try:
                local, _ = await self.redis.execute_command("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)
            except ResponseError as exc:
                # Redis < 7.2 (unknown command), no AOF at all, or a user that
                # may not: nothing to wait on but the settle delay
                text = str(exc).lower()
                if not any(w in text for w in ("unknown command", "appendonly", "permission",
                                               "noperm")):
                    raise
                if self._waitaof is None and "unknown command" not in text:
                    logger.warning("WAITAOF refused (%s): spills and refills wait "
                                   "FRONTIER_BACKLOG_SETTLE (%gs) for the AOF instead",
                                   exc, self.settle)
                self._waitaof = False
            else:
                self._waitaof = True
                if int(local) < 1:
                    raise TimeoutError(f"Redis did not fsync its AOF within "
                                       f"{WAITAOF_TIMEOUT_MS} ms: the move waits")
                return
        if self.settle > 0 and await self._aof_enabled():
            await asyncio.sleep(self.settle)

    async def _aof_enabled(self) -> bool:
        """Whether Redis keeps an AOF now (asked each time: ``CONFIG SET
        appendonly`` may turn it on); True when INFO is refused (an ACL user),
        and on a cluster (INFO goes to one node, not surely this partition's master)."""
        if isinstance(self.redis, RedisCluster) or self._info_refused:
            return True
        try:
            info = await self.redis.info("persistence")
        except ResponseError:
            # (INFO is @dangerous: a node's ACL user may not; asked once, not per
            # move, so Redis' ACL LOG holds one refusal, not one per move)
            self._info_refused = True
            return True
        return str(info.get("aof_enabled", 1)) != "0"

    def _after(self, step: str) -> None:
        """The tests' crash point (``FRONTIER_BACKLOG_CRASH_AT``, off by
        default): right after *step* (``"spill:2"``...) the node SIGKILLs
        itself (``":stop"`` appended: SIGSTOPs itself, a test then sends
        SIGCONT), once. Read once from the node's own settings, never from
        Redis: nothing but the node's operator can stop a node."""
        if self.crash_at is None or self.crash_at[0] != step:
            return
        how = self.crash_at[1]
        self.crash_at = None        # once
        logger.warning("FRONTIER_BACKLOG_CRASH_AT: %s this node after %s step %s",
                       "stopping" if how == "stop" else "killing", *step.split(":"))
        os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)

    def _count(self, name: str, n: int = 1) -> None:
        if self.stats is not None and n:
            self.stats.inc_value(name, n)


def _crash_at(value) -> tuple[str, str] | None:
    """``FRONTIER_BACKLOG_CRASH_AT`` parsed: ``(step, "kill" | "stop")``."""
    if not value:
        return None
    step, _, how = str(value).rpartition(":") if str(value).endswith(":stop") else (
        str(value), "", "kill")
    if step not in STEPS:
        raise ValueError(f"FRONTIER_BACKLOG_CRASH_AT must be one of {', '.join(STEPS)} "
                         f"(':stop' appended: SIGSTOP), got {value!r}")
    return step, how
