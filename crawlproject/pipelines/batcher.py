"""Group commit: items buffered and handed to a writer in batches.

:class:`Batcher` knows nothing of MongoDB: it holds :class:`Pending` entries
(a write and the future its ``process_item`` awaits) and calls an async
*flush* function with a batch when the buffer holds ``bulk_size`` entries,
when its oldest entry waited ``flush_interval`` seconds, at close, and (with
``flush_when_idle``) as soon as no flush is running. At most ``max_flushes``
flushes run at once; a batch is taken only when one may start, so while the
writer is busy the next batch grows (the busier the database, the bigger the
batches). The flush settles the futures of its batch (:func:`settle`) or
puts entries back with :meth:`Batcher.requeue`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from crawlproject.pipelines.documents import WriteOp

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Pending:
    """One buffered write: *future* is settled once it is durable (or refused)."""

    op: WriteOp
    future: asyncio.Future
    at: float


def settle(future: asyncio.Future, exc: BaseException | None = None) -> None:
    """Resolve *future* (with *exc* as its exception, if given) unless it is done."""
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
        future.exception()  # mark retrieved: the awaiting process_item may be gone


class Batcher:
    """Buffer writes and start *flush(batch)* by size, age and idleness.

    *flush* must settle or :meth:`requeue` every entry of its batch; if it
    raises (a bug), the batch's futures get the error instead of waiting
    forever. *log_extra* goes with the log lines (Scrapy's ``spider``).
    """

    def __init__(self, flush: Callable[[list[Pending]], Awaitable[None]], *,
                 bulk_size: int = 500, flush_interval: float = 0.2, max_flushes: int = 2,
                 flush_when_idle: bool = True, log_extra: dict | None = None):
        if bulk_size < 1:
            raise ValueError(f"MONGO_BULK_SIZE must be >= 1, got {bulk_size}")
        self.flush = flush
        self.bulk_size = bulk_size
        self.flush_interval = flush_interval
        self.max_flushes = max_flushes
        self.flush_when_idle = flush_when_idle
        self.log_extra = log_extra or {}
        self._pending: deque[Pending] = deque()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._inflight: set[asyncio.Future] = set()
        self._writing = 0
        self._slots = asyncio.Semaphore(max_flushes)
        self._closing = False

    def start(self) -> None:
        """Start the flush loop (in the running event loop)."""
        self._loop_task = asyncio.ensure_future(self._flush_loop())

    def add(self, op: WriteOp) -> asyncio.Future:
        """Buffer *op*; the returned future is settled by its batch's flush."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(Pending(op, future, time.monotonic()))
        if len(self._pending) == 1 or len(self._pending) >= self.bulk_size:
            self._wake.set()
        return future

    def requeue(self, entries: list[Pending]) -> None:
        """Put *entries* back at the head of the buffer, in their order."""
        self._pending.extendleft(reversed(entries))

    async def close(self) -> None:
        """Flush everything buffered (and put back) and wait for every flush."""
        self._closing = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task

    async def _flush_loop(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    if not self._inflight:
                        return
                    await asyncio.wait(set(self._inflight))
                    continue  # a flush may have put items back
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self._closing and len(self._pending) < self.bulk_size:
                if self.flush_when_idle and not self._writing:
                    await asyncio.sleep(0)  # let the items of this burst land first
                else:
                    wait = self.flush_interval - (time.monotonic() - self._pending[0].at)
                    if wait > 0:
                        self._wake.clear()
                        try:
                            await asyncio.wait_for(self._wake.wait(), wait)
                        except asyncio.TimeoutError:
                            pass
                        continue
            await self._slots.acquire()
            if not self._pending:
                self._slots.release()
                continue
            count = min(self.bulk_size, len(self._pending))
            batch = [self._pending.popleft() for _ in range(count)]
            self._writing += 1
            task = asyncio.ensure_future(self._flush_guarded(batch))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _flush_guarded(self, batch: list[Pending]) -> None:
        try:
            await self.flush(batch)
        except Exception as exc:  # a bug: never leave process_item waiting forever
            logger.exception("MongoPipeline flush failed", extra=self.log_extra)
            for entry in batch:
                settle(entry.future, RuntimeError(f"MongoPipeline flush failed: {exc!r}"))
        finally:
            self._writing -= 1
            self._slots.release()
            self._wake.set()
