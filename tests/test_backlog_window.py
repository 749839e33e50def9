"""The window rule's observed pace (issue 49, docs/frontier.md "The window
rule"): SYNC counts each key's starts in its state, a key's window is
seconds x the pace it is served at (not the pace its limits allow), SYNC and
the mover compute the same window. Real redis-server, injected clock (one
test: Redis time)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random

import pytest

from crawlproject.frontier import scripts
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.frontier.sitelimits import Limits, Override, PolitenessConfig
from crawlproject.frontier.window import WindowRule, observed_pace

#: windows of 10 s of a key's starts, 4 to 1,000 entries, spilling above 1 entry
RULE = WindowRule(enabled=True, spill_above=1, seconds=10, minimum=4, maximum=1000)
POLITENESS = PolitenessConfig(default=Limits(0, 100), margin=0.0)


class Clock:
    def __init__(self, ms=1_000_000):
        self.ms = ms

    def __call__(self):
        return self.ms

    def advance(self, seconds):
        self.ms += int(seconds * 1000)


def _frontier(redis, clock, node="n1", rule=RULE, spider="pace"):
    f = Frontier(redis, spider, node, lease_ttl=30, clock=clock, politeness=POLITENESS,
                 bloom=BloomConfig(capacity=10_000))
    f.window = rule
    return f


def _add(frontier, key, n, start=0):
    batch = Batch()
    for i in range(start, start + n):
        url = f"http://{key}/{i}"
        batch.add(json.dumps({"url": url}), hashlib.sha1(url.encode()).digest(), 0, 0, key)
    return frontier.sync(batch)


def _serve(frontier, clock, every: float, take: int, calls: int) -> None:
    """*calls* calls *every* seconds, each taking *take* entries and acking
    the previous call's: a key served at take / every starts per second."""
    held: list[str] = []
    for _ in range(calls):
        clock.advance(every)
        batch = Batch(acks=held, take=take)
        held = [member for member, _ in frontier.sync(batch).taken]
        assert len(held) == take


def _flagged(redis, spider="pace") -> set[str]:
    return {k.decode() for k in redis.zrange("{%s}:moves" % spider, 0, -1)}


def test_a_key_served_at_n_per_second_gets_a_window_of_seconds_times_n(redis):
    """20 starts/s for 20 s: W = 10 s x 20 = 200, not the 1,000 its limits
    (no interval) allow; SYNC spills it above 250. A key never taken keeps
    what its limits allow; once nothing is taken the window shrinks to MIN."""
    clock = Clock()
    f = _frontier(redis, clock)
    f.set_limits({"polite.example": Override(delay=0.5)})     # allows 2/s: W = 20
    _add(f, "fast.example", 1000)
    assert _flagged(redis) == set()          # 1,000 < 1.25 x 1,000: what its limits allow
    _serve(f, clock, every=0.1, take=2, calls=200)
    state = redis.hget("{pace}:kstate", "fast.example")
    assert state.count(b"|") == 7, state     # the pace rides in the key's state
    assert observed_pace(state, clock.ms, RULE.minimum) == pytest.approx(20, rel=0.06)
    assert 190 <= RULE.window_of_state(0, state, clock.ms) <= 212
    # SYNC's window: the key (601 queued) is over 1.25 x 200, the polite key
    # never taken (24 queued) is within 1.25 x 20 (its limits' pace), not MIN
    redis.delete("{pace}:moves")      # (the acks above flagged it already)
    _add(f, "polite.example", 24)
    _add(f, "fast.example", 1, start=1000)
    assert _flagged(redis) == {"fast.example"}
    assert redis.hget("{pace}:kstate", "polite.example") is None   # never started
    # nothing taken for ten minutes: its pace decays, its window goes to MIN
    clock.advance(600)
    assert observed_pace(state, clock.ms, RULE.minimum) < 0.01
    assert RULE.window_of_state(0, state, clock.ms) == RULE.minimum


def test_a_slow_key_window_shrinks_to_min(redis):
    """A key allowed 1/s (W = 10 by its limits) but taken once every 30 s gets
    W = MIN: SYNC flags it with 9 queued (> 1.25 x 4, < 1.25 x 10)."""
    clock = Clock()
    f = _frontier(redis, clock)
    f.set_limits({"slow.example": Override(delay=1.0)})
    _add(f, "slow.example", 12)
    assert _flagged(redis) == set()          # 12 <= 1.25 x 10: its limits' pace
    _serve(f, clock, every=30, take=1, calls=4)
    clock.advance(30)
    redis.delete("{pace}:moves")      # (the acks above flagged it already)
    _add(f, "slow.example", 1, start=12)
    assert _flagged(redis) == {"slow.example"}
    state = redis.hget("{pace}:kstate", "slow.example")
    assert observed_pace(state, clock.ms, RULE.minimum) == pytest.approx(1 / 30, rel=0.3)
    assert RULE.window_of_state(1.0, state, clock.ms) == RULE.minimum


def test_a_fast_key_with_a_backlog_is_refilled_below_half_its_observed_window(redis):
    """The refill trigger (below W / 2, with entries in MongoDB) uses the
    observed window: 150 queued at 20/s (W = 200) ask for no refill, 90 do."""
    clock = Clock()
    f = _frontier(redis, clock)
    _add(f, "fast.example", 550)
    _serve(f, clock, every=0.1, take=2, calls=200)        # 150 left
    redis.delete("{pace}:moves")      # (spill flags of the acks above)
    redis.zadd("{pace}:backlog", {"fast.example": 100})   # as SPILL_COMMIT leaves it
    redis.hset("{pace}:kstate", "||backlog", 100)
    _serve(f, clock, every=0.1, take=2, calls=1)
    assert _flagged(redis) == set()           # 148 >= 100 (the limits' W / 2: 500)
    _serve(f, clock, every=0.1, take=2, calls=29)
    assert _flagged(redis) == {"fast.example"}   # 90 < 100


def test_starts_from_a_reserve_count_too(redis):
    """A key at its concurrency starts its entries from the node's reserve
    (hand-offs, no take): 10 hand-offs/s for 20 s are a pace of 10/s."""
    clock = Clock()
    f = _frontier(redis, clock)
    f.set_limits({"one.example": Override(concurrency=1)})
    _add(f, "one.example", 300)
    (running, _), = f.sync(Batch(take=1)).taken
    (spare, _), = f.sync(Batch(reserve=[("one.example", 1)])).reserved
    for _ in range(200):
        clock.advance(0.1)
        got = f.sync(Batch(handoffs=[(running, spare)], acks=[running],
                           reserve=[("one.example", 1)])).reserved
        running, spare = spare, got[0][0]
    state = redis.hget("{pace}:kstate", "one.example")
    assert observed_pace(state, clock.ms, RULE.minimum) == pytest.approx(10, rel=0.06)


def test_the_pace_is_kept_only_with_the_tier_on(redis):
    """With the tier off a key's state is what it was (six fields); on, below
    SPILL_ABOVE, the pace is kept (no command more: test_backlog_crawl)."""
    clock = Clock()
    for spider, rule in (("off", WindowRule(enabled=False)),
                         ("below", WindowRule(enabled=True, spill_above=1_000_000))):
        f = _frontier(redis, clock, rule=rule, spider=spider)
        _add(f, "a.example", 10)
        _serve(f, clock, every=0.5, take=2, calls=3)
        fields = redis.hget("{%s}:kstate" % spider, "a.example").split(b"|")
        assert len(fields) == (6 if spider == "off" else 8), fields


def test_a_pace_that_is_junk_starts_again_and_is_counted(redis):
    """A pace field someone else wrote (not digits) is read as no pace (the
    limits' window), counted as junk, the rest of the state kept; the next
    start begins a new count."""
    clock = Clock()
    f = _frontier(redis, clock)
    _add(f, "j.example", 10)
    redis.hset("{pace}:kstate", "j.example", f"0|{clock.ms - 5}|{clock.ms + 60_000}|0|0|0|x|5")
    assert f.key_states(["j.example"])["j.example"]["junk_fields"] == 1
    assert f.sync(Batch(take=1)).taken == []          # its block held
    assert int(redis.hget("{pace}:stats", "state_junk")) == 1
    clock.advance(61)
    assert len(f.sync(Batch(take=1)).taken) == 1
    assert redis.hget("{pace}:kstate", "j.example").endswith(b"|1000|0")


def test_a_key_idle_for_days_loses_its_state_pace_and_all(redis):
    """The tidy drops the state of a key idle for days with its pace in it,
    as it drops one without (a state of a key seen once is not kept for ever)."""
    clock = Clock()
    f = _frontier(redis, clock)
    _add(f, "gone.example", 1)
    (member, _), = f.sync(Batch(take=1)).taken
    f.sync(Batch(acks=[member]))
    assert redis.hget("{pace}:kstate", "gone.example").count(b"|") == 7
    clock.advance(4 * 86_400)
    f.sync(Batch(maintenance=True))
    assert redis.hget("{pace}:kstate", "gone.example") is None


def test_raising_the_concurrency_of_a_key_with_a_pace_makes_it_ready(redis):
    """SET_LIMITS reads a state with the pace's fields as one without: a key
    out of the ready set at its concurrency is back in it when it is raised."""
    clock = Clock()
    f = _frontier(redis, clock)
    f.set_limits({"c.example": Override(concurrency=1)})
    _add(f, "c.example", 3)
    assert len(f.sync(Batch(take=5)).taken) == 1
    assert redis.hget("{pace}:kstate", "c.example").count(b"|") == 7
    assert redis.zscore("{pace}:ready", "c.example") is None     # at its concurrency
    f.set_limits({"c.example": Override(concurrency=2)})
    assert redis.zscore("{pace}:ready", "c.example") is not None


#: window_of (lua/sync/pace.lua) alone, over states given field by field
_WINDOW_OF = "\n".join([scripts._lua("lib/clock"), scripts._lua("lib/score"),
                        scripts._lua("sync/context"), scripts._lua("sync/pace"), """
local c = {now_cache = tonumber(ARGV[1]), window_ms = tonumber(ARGV[2]),
           window_min = tonumber(ARGV[3]), window_max = tonumber(ARGV[4]), spill_above = 1}
local out = {}
for i = 5, #ARGV, 4 do
  c.LIM = {k = {delay = tonumber(ARGV[i])}}
  c.ST = {k = {last = tonumber(ARGV[i + 1]), pc = tonumber(ARGV[i + 2]),
               ph = tonumber(ARGV[i + 3])}}
  out[#out + 1] = window_of(c, 'k')
end
return out"""])


def test_sync_and_the_mover_compute_the_same_window(redis):
    """window_of in Lua and WindowRule.window_of_state in Python agree on
    random states (the mover sizes its moves with the latter)."""
    rng = random.Random(49)
    now = 5_000_000
    rule = WindowRule(enabled=True, spill_above=1, seconds=30, minimum=4, maximum=500)
    cases, args = [], []
    for _ in range(400):
        delay = rng.choice([0, 0, 50, 1000, 7000])
        last = now - rng.choice([0, rng.randrange(2000), rng.randrange(900_000)])
        pc = rng.choice(["", str(rng.randrange(10_000)), str(rng.randrange(10_000_000))])
        ph = "" if pc == "" else str(rng.randrange(600_001))
        state = f"0|{last}|0|0|0|0" + (f"|{pc}|{ph}" if pc else "")
        cases.append((delay, state))
        args += [delay, last, pc, ph]
    lua = redis.eval(_WINDOW_OF, 0, now, 30_000, 4, 500, *args)
    python = [rule.window_of_state(delay / 1000, state, now) for delay, state in cases]
    assert lua == python
    assert len(set(python)) > 10                   # not one answer for all


def test_the_mover_reads_the_pace_from_the_state_at_redis_time(redis, redis_url):
    """MoverTask sizes a key's window from its state as SYNC does, at the
    partition's Redis time (no clock given)."""
    import redis.asyncio as aioredis

    from crawlproject.frontier.movertask import MoverTask
    from crawlproject.frontier.queue import AsyncFrontier

    f = _frontier(redis, None)
    _add(f, "burst.example", 20)
    assert len(f.sync(Batch(take=8)).taken) == 8     # 8 starts at once: 8/s (1 s floor)

    async def main():
        client = aioredis.Redis.from_url(redis_url)
        try:
            af = AsyncFrontier(client, "pace", "n2", lease_ttl=30, politeness=POLITENESS)
            task = MoverTask([af], RULE, lambda: None, node="n2")
            return await task._window(af, "burst.example"), await task._window(af, "x")
        finally:
            await client.aclose()

    burst, never = asyncio.run(main())
    assert 70 <= burst <= 80        # 10 s x 8/s, decaying a little since
    assert never == RULE.maximum    # no state, no interval: what its limits allow
