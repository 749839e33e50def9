"""Say when a budget is spent: one INFO line per politeness key (and one for
the crawl's budget) when the frontier starts refusing its new pages.

The frontier's SYNC script counts new pages per key in the partition's budget
hash (``"admitted|refused"``, field ``||crawl`` for the partition) and refuses
what is over a budget (``FRONTIER_SITE_BUDGET``, ``FRONTIER_CRAWL_BUDGET``,
``crawlctl politeness --budget``); its reply says only how many pages of the
call were refused. When a reply refuses some, :class:`BudgetWatch` reads the
counts of the call's keys not announced yet (one HMGET, off the event loop's
critical path: a task of its own) and logs each key that refuses once per node.
Refused pages are counted, never queued: they are no pending work, so a node
whose frontier holds nothing else idle-closes as usual
(``MAX_IDLE_TIME_BEFORE_CLOSE``). ``crawlctl status`` and the dashboard show
the same counts (:mod:`crawlproject.ops.budgets`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from crawlproject.connection import REDIS_FAILURES

logger = logging.getLogger(__name__)

#: keys announced per node at most; past it one line says the rest are not
#: named (a crawl of a million sites with a budget each must not flood the log)
ANNOUNCED_MAX = 10_000
CRAWL = "||crawl"


class BudgetWatch:
    """Per node: the keys whose budget was announced, and the reads under way."""

    def __init__(self, count: Callable[[str, int], None], log_extra: dict,
                 idle_close: float | None = None):
        self.count, self.log_extra = count, log_extra
        #: MAX_IDLE_TIME_BEFORE_CLOSE when known (None: not said in the line)
        self.idle_close = idle_close
        self.announced: set[str] = set()
        self._crawl_said = False
        self._full_said = False
        self._tasks: set[asyncio.Task] = set()

    def refused(self, frontier, batch) -> None:
        """A call of *batch* to *frontier* (an AsyncFrontier) refused new pages
        over a budget: find and announce the keys (in a task; nothing waits)."""
        if batch is None:
            return
        keys = sorted({add[0] for add in batch.adds if add[1]} - self.announced)
        if not keys and self._crawl_said:
            return
        task = asyncio.ensure_future(self._announce(frontier, keys))
        self._tasks.add(task)   # (the loop holds tasks only weakly)
        task.add_done_callback(self._tasks.discard)

    async def _announce(self, frontier, keys: list[str]) -> None:
        fields = [*keys, CRAWL]
        try:
            raw = await frontier.client.hmget(frontier.keys.budget, fields)
        except REDIS_FAILURES:
            return   # the sync loop reports outages; the next refusal asks again
        except Exception:  # noqa: BLE001 - the key of another type: SYNC says so itself
            return
        counts = {}
        for name, value in zip(fields, raw):
            try:
                admitted, refused = (int(x) for x in _text(value).split("|"))
            except (TypeError, ValueError, AttributeError):   # absent, or not ours
                continue
            counts[name] = (admitted, refused)
        crawl = counts.pop(CRAWL, (0, 0))
        crawl_budget = frontier.politeness.crawl_budget
        per_part = -(-crawl_budget // max(1, frontier.politeness.partitions))
        crawl_spent = crawl_budget > 0 and crawl[0] >= per_part
        if crawl_spent and not self._crawl_said and crawl[1]:
            self._crawl_said = True
            self.count("scheduler/budget_reached/crawl", 1)
            logger.info("Crawl budget reached in %s: %d new pages admitted (FRONTIER_CRAWL_BUDGET"
                        " %d over %d partition(s)), %d refused so far; new pages are counted, "
                        "not queued%s", frontier.keys.budget, crawl[0], crawl_budget,
                        frontier.politeness.partitions, crawl[1], self._then(),
                        extra=self.log_extra)
        site_budget = frontier.politeness.default.budget
        for key, (admitted, refused) in sorted(counts.items()):
            if not refused or key in self.announced:
                continue
            if crawl_spent and not (site_budget and admitted >= site_budget):
                continue   # refused by the crawl's budget, not its own: said above
            if len(self.announced) >= ANNOUNCED_MAX:
                if not self._full_said:
                    self._full_said = True
                    logger.info("Budgets reached for more than %d keys: the others are not named "
                                "(crawlctl status SPIDER lists them)", ANNOUNCED_MAX,
                                extra=self.log_extra)
                return
            self.announced.add(key)
            self.count("scheduler/budget_reached", 1)
            source = (f"FRONTIER_SITE_BUDGET {site_budget}" if site_budget
                      and admitted >= site_budget else "its own budget: crawlctl politeness "
                      "--budget or FRONTIER_HOST_LIMITS")
            logger.info("Budget reached for %s: %d new pages admitted, %d refused so far (%s); "
                        "its new pages are counted, not queued%s", key, admitted, refused,
                        source, self._then(), extra=self.log_extra)

    def _then(self) -> str:
        if self.idle_close is None:
            return ""
        if self.idle_close > 0:
            return (f"; this node closes after {self.idle_close:g}s with nothing else to do "
                    "(MAX_IDLE_TIME_BEFORE_CLOSE)")
        return "; this node waits for more work (MAX_IDLE_TIME_BEFORE_CLOSE = 0: never closes idle)"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value
