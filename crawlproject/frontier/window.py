"""A politeness key's window in Redis: the MongoDB tier's rule (issue 49).

``W(k) = clamp(ceil(FRONTIER_BACKLOG_WINDOW_SECONDS x pace(k)),
FRONTIER_BACKLOG_WINDOW_MIN, FRONTIER_BACKLOG_WINDOW_MAX)`` with ``pace(k)``
the key's *observed* starts per second (:func:`observed_pace`: a moving
average SYNC keeps in the key's state), at most what its limits allow (1 / its
interval); before the key started enough to say (``WINDOW_MIN`` starts or
:data:`PACE_SETTLED_MS` of history), what its limits allow (``WINDOW_MAX``
without an interval). Once a partition queues more than
``FRONTIER_BACKLOG_SPILL_ABOVE`` entries in Redis, a key over ``1.25 W`` is
spilled down to ``W``; a key taken below ``W / 2`` with entries in MongoDB is
refilled (docs/frontier.md, "The window rule"). SYNC (``lua/sync/backlog.lua``,
``lua/sync/pace.lua``) flags the keys with this rule, the mover
(:mod:`crawlproject.frontier.movertask`) sizes its moves with it: both compute
the same window from the same state (the same constants, the same float
operations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crawlproject import defaults
from crawlproject.defaults import setting

__all__ = ["WindowRule", "SPILL_FACTOR", "observed_pace"]

#: a key spills only once over this many times its window (no thrash)
SPILL_FACTOR = 1.25

# The observed pace (the same in lua/sync/pace.lua): a key's starts, counted
# in its state at each start as a count decaying with PACE_TAU_MS (x 1000, as
# of its last start) and the ms of history then (at most PACE_HISTORY_MS).
#: the moving average's time constant (ms)
PACE_TAU_MS = 60_000
#: history kept (ms): beyond it the average is whole
PACE_HISTORY_MS = 600_000
#: a key's pace is observed after this much history (ms), or WINDOW_MIN starts
PACE_SETTLED_MS = 5_000
#: a first burst of starts is never a pace over a shorter span (ms)
PACE_FLOOR_MS = 1_000


def observed_pace(state: str | bytes | None, now_ms: int, minimum: int) -> float | None:
    """A key's observed starts per second at *now_ms* (Redis time) from its
    state in ``T:kstate`` as SYNC wrote it, or None when it has no pace (not
    started with the tier on), a pace that is not SYNC's (read as none, as
    SYNC reads it), or fewer than *minimum* starts in under
    :data:`PACE_SETTLED_MS` of history."""
    per_ms = _pace_per_ms(state, now_ms, minimum)
    return None if per_ms is None else per_ms * 1000


def _pace_per_ms(state, now_ms: int, minimum: int) -> float | None:
    # (pace_of in lua/sync/pace.lua, operation for operation)
    if isinstance(state, bytes):
        state = state.decode("ascii", "replace")
    fields = state.split("|") if state else []
    if len(fields) != 8 or not all(f.isascii() and f.isdigit() and len(f) <= 17
                                   for f in (fields[1], fields[6], fields[7])):
        return None
    last, pc, ph = int(fields[1]), int(fields[6]), int(fields[7])
    if pc > 1e12 or ph > PACE_HISTORY_MS:
        return None
    if ph + now_ms - last < PACE_SETTLED_MS and pc < minimum * 1000:
        return None
    g = max(0, now_ms - last)
    span = PACE_TAU_MS * (1 - math.exp(-(ph + g) / PACE_TAU_MS))
    return pc / 1000 * math.exp(-g / PACE_TAU_MS) / max(PACE_FLOOR_MS, span)


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

    def window(self, interval: float, pace: float | None = None) -> int:
        """W of a key whose limits allow one start every *interval* seconds
        (0: no interval) and whose observed *pace* is that many starts per
        second (None: not observed yet, :func:`observed_pace`)."""
        return self._window(round(interval * 1000), None if pace is None else pace / 1000)

    def window_of_state(self, interval: float, state, now_ms: int) -> int:
        """W of a key from its state in ``T:kstate`` at *now_ms* (Redis time):
        what SYNC computes from the same (``window_of`` in lua/sync/pace.lua)."""
        return self._window(round(interval * 1000),
                            _pace_per_ms(state, now_ms, self.minimum))

    def _window(self, delay_ms: int, per_ms: float | None) -> int:
        # (window_of in lua/sync/pace.lua, operation for operation)
        window_ms = int(round(self.seconds * 1000))
        if per_ms is not None and (delay_ms <= 0 or per_ms * delay_ms < 1):
            w = math.ceil(window_ms * per_ms - 1e-9)
        elif delay_ms > 0:
            w = math.ceil(window_ms / delay_ms)
        else:
            return self.maximum
        return max(self.minimum, min(self.maximum, w))

    def sync_args(self) -> list:
        """SYNC's last four ARGV (lua/sync/backlog.lua): spill above (0: the
        tier is off), window ms, min, max. Spill above is at least 1 while on."""
        if not self.enabled:
            return [0, 0, 1, 1]
        return [max(1, self.spill_above), int(round(self.seconds * 1000)), self.minimum,
                self.maximum]
