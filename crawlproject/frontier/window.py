"""A politeness key's window in Redis: the MongoDB tier's rule (issue 49).

``W(k) = clamp(ceil(FRONTIER_BACKLOG_WINDOW_SECONDS x pace(k)),
FRONTIER_BACKLOG_WINDOW_MIN, FRONTIER_BACKLOG_WINDOW_MAX)`` with ``pace(k)``
what the key's limits allow (1 / its interval; ``WINDOW_MAX`` without one).
Once a partition queues more than ``FRONTIER_BACKLOG_SPILL_ABOVE`` entries in
Redis, a key over ``1.25 W`` is spilled down to ``W``; a key taken below
``W / 2`` with entries in MongoDB is refilled (docs/frontier.md, "The window
rule"). SYNC (``lua/sync/backlog.lua``) flags the keys with this rule, the
mover (:mod:`crawlproject.frontier.movertask`) sizes its moves with it.
The design's *observed* pace (a moving average of starts) is not kept yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crawlproject import defaults
from crawlproject.defaults import setting

__all__ = ["WindowRule", "SPILL_FACTOR"]

#: a key spills only once over this many times its window (no thrash)
SPILL_FACTOR = 1.25


@dataclass(frozen=True)
class WindowRule:
    """The tier's switch and window settings, read once."""

    enabled: bool = defaults.FRONTIER_BACKLOG_ENABLED
    spill_above: int = defaults.FRONTIER_BACKLOG_SPILL_ABOVE
    seconds: float = defaults.FRONTIER_BACKLOG_WINDOW_SECONDS
    minimum: int = defaults.FRONTIER_BACKLOG_WINDOW_MIN
    maximum: int = defaults.FRONTIER_BACKLOG_WINDOW_MAX

    def __post_init__(self):
        if self.spill_above < 0 or self.seconds <= 0 or not 1 <= self.minimum <= self.maximum:
            raise ValueError(
                "FRONTIER_BACKLOG_SPILL_ABOVE must be >= 0, FRONTIER_BACKLOG_WINDOW_SECONDS > 0 "
                "and 1 <= FRONTIER_BACKLOG_WINDOW_MIN <= FRONTIER_BACKLOG_WINDOW_MAX, got "
                f"{self.spill_above!r}, {self.seconds!r}, {self.minimum!r}, {self.maximum!r}")

    @classmethod
    def from_settings(cls, settings) -> "WindowRule":
        return cls(enabled=setting(settings, "FRONTIER_BACKLOG_ENABLED"),
                   spill_above=int(setting(settings, "FRONTIER_BACKLOG_SPILL_ABOVE")),
                   seconds=float(setting(settings, "FRONTIER_BACKLOG_WINDOW_SECONDS")),
                   minimum=int(setting(settings, "FRONTIER_BACKLOG_WINDOW_MIN")),
                   maximum=int(setting(settings, "FRONTIER_BACKLOG_WINDOW_MAX")))

    def window(self, interval: float) -> int:
        """W of a key whose limits allow one start every *interval* seconds."""
        if interval <= 0:
            return self.maximum
        return max(self.minimum, min(self.maximum, math.ceil(self.seconds / interval)))

    def sync_args(self) -> list:
        """SYNC's last four ARGV (lua/sync/backlog.lua): spill above (0: the
        tier is off), window ms, min, max. Spill above is at least 1 while on."""
        if not self.enabled:
            return [0, 0, 1, 1]
        return [max(1, self.spill_above), int(round(self.seconds * 1000)), self.minimum,
                self.maximum]
