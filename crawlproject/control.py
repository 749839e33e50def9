"""Cluster-wide operator control of a crawl (pause, resume, drain, stop), and
the nodes' reports that ``crawlctl status`` shows.

``crawlctl pause|resume|drain|stop SPIDER`` writes the state (``run``,
``pause``, ``drain`` or ``stop``, with ``since`` and ``by``) into the hash
``{spider}:control``; every node reads it once per ``CONTROL_POLL_INTERVAL`` in
the background, so a change is in force on all nodes within about a second.
``CONTROL_ON_START`` says what a node that starts in a ``stop`` or ``drain``
does. Every field is untrusted: anything but the four states counts as
``run``, a key of another type as ``pause``. In the same loop each node writes
its report into ``{spider}:node_reports``.

The states, the start, ``--then-clear`` and the reports in full:
``docs/frontier.md``, "Operator control (crawlproject/control.py)".
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Awaitable, Callable

from redis.exceptions import ResponseError

from crawlproject.connection import REDIS_FAILURES
from crawlproject.keys import FrontierKeys

logger = logging.getLogger(__name__)

STATES = ("run", "pause", "drain", "stop")


def control_key(spider: str) -> str:
    """The control hash of *spider* (hash-tagged with the spider's frontier)."""
    return f"{{{spider}}}:control"


def node_reports_key(spider: str) -> str:
    """Hash: node id → JSON report (pages, items, errors, rates, at) of each node."""
    return f"{{{spider}}}:node_reports"


REPORT_STALE_S = 600  # reports older than this are pruned by `crawlctl status`


def node_reports(client, spider: str, now_ms: int | None = None) -> list[dict]:
    """The nodes' last reports (sync client), newest first; prunes stale ones.
    Values come from Redis: anything that is not a JSON object of numbers and
    short strings is skipped."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    out, stale = [], []
    for node, raw in client.hgetall(node_reports_key(spider)).items():
        node = node.decode(errors="replace") if isinstance(node, bytes) else str(node)
        try:
            report = json.loads(raw)
        except (ValueError, TypeError, RecursionError):  # any bytes may be there
            stale.append(node)
            continue
        if not isinstance(report, dict) or not isinstance(report.get("at"), int):
            stale.append(node)
            continue
        if now_ms - report["at"] > REPORT_STALE_S * 1000:
            stale.append(node)
            continue
        clean = {k: v for k, v in report.items()
                 if isinstance(k, str) and (isinstance(v, (int, float)) and not isinstance(v, bool)
                                            or isinstance(v, str) and len(v) <= 100)}
        clean["node"] = node[:200]
        clean["age_s"] = round(max(0, now_ms - report["at"]) / 1000, 1)
        out.append(clean)
    if stale:
        client.hdel(node_reports_key(spider), *stale)
    return sorted(out, key=lambda r: r["age_s"])


BROKEN_STATE = "pause"  # what nodes assume while the control key is not a hash


class ControlKeyError(ValueError):
    """The control key holds another type than a hash (nothing was written)."""


def _wrong_type(exc: Exception) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("WRONGTYPE")


def _type_name(raw) -> str:
    return (raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw))[:20]


def broken_key_message(key: str, type_name: str, spider: str) -> str:
    """What is wrong with a control key of *type_name*, and the way out."""
    return (f"{key} is a {type_name}, not a hash: nodes count it as {BROKEN_STATE!r} until "
            f"it is replaced (crawlctl resume {spider} --force, or pause/drain/stop --force)")


BY_MAX = 100           # characters of `by` kept (written and read)
SINCE_MAX_MS = 253_402_300_799_000   # 9999-12-31: a `since` beyond (or < 1) is no time


def printable(value, limit: int = BY_MAX) -> str:
    """*value* read from Redis as printable text: control characters escaped
    (``\\n``, ``\\x1b``), at most *limit* characters."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return text[:limit]


def control_info(raw: dict) -> dict:
    """The control hash's fields (as read from Redis: untrusted), checked:
    ``state`` (one of :data:`STATES`, else ``run``), ``since`` (ms, or None
    when absent or implausible), ``by`` (printable text, or ``""``),
    ``then_clear`` (bool)."""
    def text(name):
        value = raw.get(name, raw.get(name.encode()))
        return value.decode(errors="replace") if isinstance(value, bytes) else value

    state = text("state")
    return {"state": state if state in STATES else "run",
            "since": since_ms(text("since")),
            "by": printable(text("by") or ""),
            "then_clear": text("then_clear") == "1"}


def since_ms(value) -> int | None:
    """A control hash's ``since`` as a time in ms, or None for an unknown time:
    absent, or anything but 1 to 20 ASCII digits of a time before 9999-12-31
    (``int()`` would take ``" 5"``, ``"+5"``, ``"5_0"``). CLEAR_DRAIN applies the
    same rule: a drain of unknown time is ended by a node that read it so."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,20}", value):
        return None
    ms = int(value)
    return ms if 0 < ms < SINCE_MAX_MS else None


def who_and_when(info: dict, now_ms: int | None = None) -> str:
    """``set by alice@ops1 at 2026-12-05 21:00:03 UTC (3h 10m ago)``, from
    :func:`control_info`'s fields; unknown parts are said to be unknown."""
    by = info.get("by") or "an unknown writer"
    since = info.get("since")
    if not since:
        return f"set by {by} at an unknown time"
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since / 1000))
    return f"set by {by} at {stamp} ({_age(max(0, now_ms - since) // 1000)} ago)"


def _age(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes}m"
    hours = minutes // 60
    return f"{hours}h {minutes % 60}m" if hours < 48 else f"{hours // 24}d {hours % 24}h"


def resume_command(spider: str) -> str:
    return f"crawlctl resume {spider}"


def set_state(client, spider: str, state: str, by: str = "", force: bool = False,
              then_clear: bool = False) -> str:
    """Write *state* (a sync redis client) with ``since`` (now, ms) and ``by``;
    returns the previous state. *then_clear* (a drain only): the drain sets
    the state back to ``run`` once it is complete. A control key of another
    type raises :class:`ControlKeyError` unless *force*, which replaces it (the
    previous state is then ``broken (<type>)``)."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r} (one of {', '.join(STATES)})")
    if then_clear and state != "drain":
        raise ValueError("then_clear is for a drain only")
    key = control_key(spider)
    value = {"state": state, "since": int(time.time() * 1000), "by": printable(by)}
    if then_clear:
        value["then_clear"] = "1"
    try:
        raw = client.hget(key, "state")
    except ResponseError as exc:
        if not _wrong_type(exc):
            raise
        type_name = _type_name(client.type(key))
        if not force:
            raise ControlKeyError(f"{key} is a {type_name}, not a hash: nodes count it as "
                                  f"{BROKEN_STATE!r}. Replace it with: crawlctl {_command(state)} "
                                  f"{spider} --force") from None
        previous = f"broken ({type_name}, replaced)"
    else:
        raw = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        previous = raw if raw in STATES else "run"
    # One key, one slot: a transaction is fine on a cluster too. The whole hash
    # is written anew: no field of an older state (then_clear) outlives it.
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=value)
    pipe.execute()
    return previous


def _command(state: str) -> str:
    return "resume" if state == "run" else state


def read_state(client, spider: str) -> dict:
    """The control hash, checked (:func:`control_info`; sync client): state,
    since (ms or None), by, then_clear; for a key of another type, state
    ``pause`` (what nodes assume) and ``error``."""
    key = control_key(spider)
    try:
        raw = client.hmget(key, ["state", "since", "by", "then_clear"])
    except ResponseError as exc:
        if not _wrong_type(exc):
            raise
        return {"state": BROKEN_STATE, "since": None, "by": "", "then_clear": False,
                "error": broken_key_message(key, _type_name(client.type(key)), spider)}
    return control_info(dict(zip(("state", "since", "by", "then_clear"), raw)))


async def read_control(redis, spider: str) -> dict:
    """:func:`read_state` with an asyncio client (a key of another type: ``pause``)."""
    try:
        raw = await redis.hmget(control_key(spider), ["state", "since", "by", "then_clear"])
    except ResponseError as exc:
        if not _wrong_type(exc):
            raise
        return {**control_info({}), "state": BROKEN_STATE}
    return control_info(dict(zip(("state", "since", "by", "then_clear"), raw)))


async def drain_complete(redis, spider: str, partitions: int, node: str,
                         registered_max: int = 1000) -> bool:
    """Whether a drain is over (async client): nothing queued, delayed or
    leased in any partition, and every live node registered in the frontier
    is *node* or reports that it waits at start. A node whose lease deadline
    has passed is dead, not live (its leases would still count)."""
    seconds, micros = await redis.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    live: set[str] = set()
    for p in range(partitions):
        keys = FrontierKeys(spider, p, partitions)
        queued = await redis.hget(keys.kstate, "||qlen")
        if queued is None:   # a crawl begun by an older version keeps it in the qlen key
            try:
                queued = await redis.get(keys.qlen)
            except ResponseError:
                return False
        queued = queued.decode(errors="replace") if isinstance(queued, bytes) else queued
        if queued is not None and not re.fullmatch(r"[0-9]{1,18}", queued):
            return False   # junk: the next frontier call recounts it (qlen_recounted)
        if int(queued or 0) > 0:
            return False
        if await redis.zcard(keys.delayed) or await redis.hlen(keys.inflight):
            return False
        if await redis.zcard(keys.nodes) > registered_max:
            return False
        for member, deadline in await redis.zrange(keys.nodes, 0, -1, withscores=True):
            # (a deadline beyond the longest lease the frontier honours was
            # written by someone else: that node is gone, as SYNC reckons it)
            if now_ms < deadline <= now_ms + LEASE_MAX_MS:
                live.add(member.decode(errors="replace") if isinstance(member, bytes)
                         else str(member))
    live.discard(node)
    if not live:
        return True
    others = sorted(live)
    for name, raw in zip(others, await redis.hmget(node_reports_key(spider), others)):
        try:
            report = json.loads(raw) if raw is not None else None
        except (ValueError, TypeError, RecursionError):
            report = None
        if not isinstance(report, dict) or report.get("waiting") != 1 \
                or not isinstance(report.get("at"), int) \
                or now_ms - report["at"] > WAITING_REPORT_FRESH_S * 1000:
            return False
    return True


WAITING_REPORT_FRESH_S = 15   # a node's "waiting" report counts this long (sent every 5 s)
#: The longest lease the frontier honours (lua/sync/contract.lua's LEASE_HARD_MS).
LEASE_MAX_MS = 3_600_000


async def clear_finished_drain(redis, spider: str, since: int | None, by: str) -> bool:
    """Set the state back to ``run`` if it is still the drain of *since* with
    ``then_clear`` (atomic: :data:`crawlproject.frontier.scripts.CLEAR_DRAIN`)."""
    from crawlproject.frontier.library import script
    from crawlproject.frontier.scripts import CLEAR_DRAIN

    done = await script(redis, CLEAR_DRAIN)(keys=[control_key(spider)], args=[
        "" if since is None else str(since), str(int(time.time() * 1000)), printable(by)])
    return bool(done)


class ControlWatcher:
    """Polls a spider's control state and calls ``on_change(old, new)``."""

    def __init__(self, redis, spider: str, on_change: Callable[[str, str], None],
                 interval: float = 1.0, log_extra: dict | None = None,
                 on_ready: Callable[[str], None] | None = None,
                 report: Callable[[], dict] | None = None, node: str = "",
                 report_interval: float = 5.0,
                 on_tick: Callable[[], Awaitable[None]] | None = None):
        self.redis = redis
        self.spider = spider
        self.key = control_key(spider)
        self.reports_key = node_reports_key(spider)
        #: this node's report for `crawlctl status` (sent every report_interval)
        self.report, self.node, self.report_interval = report, node, report_interval
        # None: not reported yet (never 0.0: a machine up for less than the
        # interval would wait for it; time.monotonic() counts from boot)
        self._last_report: float | None = None
        self.on_change = on_change
        #: called once with the first state read (before it, a node takes nothing)
        self.on_ready = on_ready
        #: awaited after each read of the state (a waiting node's own checks)
        self.on_tick = on_tick
        self.interval = interval
        self.log_extra = log_extra or {}
        self.state = "run"
        #: the state with who set it and when (:func:`control_info`), read
        #: before on_ready and each on_change are called
        self.info: dict = control_info({})
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._refused: set[str] = set()
        self._broken: str | None = None   # the control key's wrong type, once logged

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            # The flag ends the loop even when the cancellation is swallowed:
            # redis-py may turn a CancelledError in a command into a
            # connection error (caught like an outage), and the node then
            # waited here for ever at close (seen 1 close in ~20).
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=self.interval + 5)
        await self._send_report(final=True)  # a closed node is no longer listed

    async def poll(self) -> str:
        """Read the state once (an unreachable Redis keeps the last one)."""
        try:
            new = await self._fetch()
        except REDIS_FAILURES:
            return self.state  # the frontier loop reports outages
        if new != self.state:
            await self._read_info(new)
            old, self.state = self.state, new
            self.on_change(old, new)
            self._last_report = None  # `crawlctl status` shows the new state within a second
        return new

    async def _run(self) -> None:
        ready = self.on_ready is None
        while not self._stopping:
            try:
                if not ready:
                    # A node started while the crawl is paused or stopped must
                    # not take anything first: the state as read, before any
                    # change callback. Until Redis has answered and on_ready
                    # has run, the node takes nothing: a failed first read or a
                    # failing on_ready is tried again, never skipped (skipped,
                    # the node stayed paused for good).
                    state = await self._fetch()
                    await self._read_info(state)
                    self.state = state
                    self.on_ready(state)
                    ready = True
                else:
                    await self.poll()
                await self._send_report()
                if self.on_tick is not None:
                    await self.on_tick()
            except REDIS_FAILURES:
                pass  # the frontier loop reports outages; try again next interval
            except Exception:  # a bug in a handler must not end the watcher
                logger.exception("Control watcher error", extra=self.log_extra)
            await asyncio.sleep(self.interval)

    async def _send_report(self, final: bool = False) -> None:
        now = time.monotonic()
        if self.report is None or (self._last_report is not None and not final
                                   and now - self._last_report < self.report_interval):
            return
        self._last_report = now
        try:
            if final:
                await self.redis.hdel(self.reports_key, self.node)
            else:
                await self.redis.hset(self.reports_key, self.node, json.dumps(
                    {**self.report(), "at": int(time.time() * 1000)}))
        except REDIS_FAILURES:
            pass  # the frontier loop reports outages

    async def _read_info(self, state: str) -> None:
        """Who set *state* and when (one more read, only when the state is
        new); the state itself is the one :meth:`_fetch` returned."""
        info = control_info({})
        if state != "run" and self._broken is None:
            try:
                raw = await self.redis.hmget(self.key, ["since", "by", "then_clear"])
            except ResponseError as exc:   # replaced by another type meanwhile
                if not _wrong_type(exc):
                    raise
            else:
                info = control_info(dict(zip(("since", "by", "then_clear"), raw)))
        self.info = {**info, "state": state, "broken": self._broken is not None}

    async def _fetch(self) -> str:
        """The state in Redis: ``run`` when none or not a known state (the
        value is untrusted; an unknown one is logged once). Raises what the
        Redis call raised when Redis cannot answer."""
        try:
            raw = await self.redis.hget(self.key, "state")
        except ResponseError as exc:
            if not _wrong_type(exc):
                raise
            return await self._broken_key()
        if self._broken is not None:
            self._broken = None
            logger.info("Control key %s is a hash again: its state applies", self.key,
                        extra=self.log_extra)
        value = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        if value is not None and value not in STATES:
            if value[:50] not in self._refused:
                self._refused.add(value[:50])
                logger.warning("Ignoring unknown control state %r in %s (known: %s)",
                               value[:50], self.key, ", ".join(STATES), extra=self.log_extra)
            value = None
        return value or "run"

    async def _broken_key(self) -> str:
        """The state assumed while the control key is not a hash (logged once
        per change of its type, not each poll)."""
        type_name = _type_name(await self.redis.type(self.key))
        if type_name in ("none", "hash"):   # replaced since the HGET: read it next poll
            return self.state
        if type_name != self._broken:
            self._broken = type_name
            logger.error("Control key %s", broken_key_message(self.key, type_name, self.spider),
                         extra=self.log_extra)
        return BROKEN_STATE
