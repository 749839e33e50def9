"""Exponential backoff with jitter, used wherever something is retried later
(download and callback retries through Redis, MongoDB writes, Redis calls)."""

from __future__ import annotations

import random


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before retry *attempt* (1, 2, ...).

    ``base * 2^(attempt-1)``, at most *cap*, times a random factor in
    [0.5, 1] ("equal jitter"): retries of many nodes spread out instead of
    arriving together, and the wait never drops below half the nominal one.
    """
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return delay * random.uniform(0.5, 1.0)
