"""What the frontier reads back is parsed strictly and bounded (issue 45):
anyone who can write to Redis writes frontier state, so junk written into a
per-key state, an override, a budget count, a counter, the nodes zset, a
queue or the in-flight hash never lifts a block, stops a partition or a
call, or holds a site back for ever; it is counted (``state_junk``) and,
where the script owns the record, mended. Real Redis, injected clock."""

import hashlib
import json
import time

import pytest
import redis as redis_lib

from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.sitelimits import Limits, PolitenessConfig
from crawlproject.frontier.queue import Batch, Frontier


from tests.test_politeness import Clock, clock  # noqa: F401 - the same Redis-time clock


def polite(delay=0.0, concurrency=5, **kw):
    kw.setdefault("margin", 0.0)
    return PolitenessConfig(default=Limits(delay, concurrency), **kw)


@pytest.fixture
def node(redis, clock):
    def make(name, politeness=None):
        return Frontier(redis, "spider", name, lease_ttl=10, clock=clock,
                        bloom=BloomConfig(capacity=10_000),
                        politeness=politeness or polite(retry_after_max=300))
    return make


def add(frontier, key, n, start=0):
    batch = Batch(maintenance=False)
    for i in range(start, start + n):
        url = f"http://{key}/{i}"
        batch.add(json.dumps({"url": url}), hashlib.sha1(url.encode()).digest(), 0, 0, key)
    return frontier.sync(batch)


def keys_of(taken):
    return [m.partition("@")[2] for m, _ in taken]


def state(redis, frontier, key):
    return redis.hget(frontier.keys.kstate, key).decode()


# -- 1. a per-key state with a junk field keeps its other fields ------------------

@pytest.mark.parametrize("field, junk", [(5, "x"), (5, "-5"), (0, "abc"), (3, "1e3"),
                                         (4, "\u0665")])
def test_a_junk_field_in_a_key_state_does_not_lift_its_block(node, clock, redis, field, junk):
    """A state whose sixth field (error rate) is ``x`` or ``-5`` was read as all
    zeros: a 60 s block was lifted as soon as a call read the state (here the
    ack of the site's request in flight). Each field is read on its own: the
    block stays, the junk is counted (reply, partition stats) and mended."""
    a = node("a", polite(concurrency=1, retry_after_max=300))
    add(a, "h1", 5)
    add(a, "h2", 10)
    taken = a.take(10)
    assert sorted(keys_of(taken)) == ["h1", "h2"]
    said = Batch(maintenance=False)
    said.block("h1", 60)
    a.sync(said)
    fields = state(redis, a, "h1").split("|")
    assert int(fields[2]) == clock.ms + 60_000
    fields[field] = junk
    redis.hset(a.keys.kstate, "h1", "|".join(fields))
    shown = a.key_states(["h1"]).get("h1", {})    # crawlctl politeness' view
    clock.advance(1)
    acked = a.sync(Batch(acks=[m for m, _ in taken], maintenance=False))
    for _ in range(5):
        clock.advance(1)
        res = a.sync(Batch(take=10, maintenance=False))
        assert keys_of(res.taken) == ["h2"]       # h1 is still blocked
        assert res.state_junk == 0                # mended: not counted again
        a.ack(*(m for m, _ in res.taken))
    clock.advance(54)
    assert "h1" in keys_of(a.take(10))
    assert shown.get("blocked_until_ms") == clock.ms and shown["junk_fields"] == 1
    assert acked.state_junk == 1 and a.stats()["state_junk"] == 1
    mended = state(redis, a, "h1").split("|")
    assert all(f.isdigit() for f in mended)


def test_a_state_beyond_what_the_script_writes_is_brought_within_it(node, clock, redis):
    """A block of 317 years, a last start in the future, a huge backoff or
    crawl delay, an in-flight count above every lease: each is bounded as
    read (a block at most a day from now, an interval at most a day, a last
    start at most now, a count at most the leases there are), counted, and
    the key's ready time follows its mended state."""
    a = node("a")
    for key in ("blocked", "future", "slow", "full"):
        add(a, key, 3)
    year = 365 * 86_400_000
    far = clock.ms + 317 * year
    redis.hset(a.keys.kstate, mapping={
        "blocked": f"0|0|{far}|0|0|0", "future": f"0|{far}|0|0|0|0",
        "slow": f"0|0|0|{far}|{far}|0", "full": "999999|0|0|0|0|0"})
    redis.zadd(a.keys.ready, {"blocked": far, "future": far, "slow": far})
    # the call's paced look brings far ready times back to now, and a take
    # finds "full" with no lease (its count read as the leases there are)
    res = a.sync(Batch(take=10))
    assert sorted(set(keys_of(res.taken))) == ["full", "future"]
    assert res.state_junk >= 4
    states = a.key_states(["blocked", "slow", "future"])
    assert states["blocked"]["blocked_until_ms"] <= clock.ms + 86_400_000
    assert states["slow"]["backoff_ms"] == states["slow"]["crawl_delay_ms"] == 86_400_000
    clock.advance(86_400.1 * 2)
    assert {"blocked", "slow"} <= set(keys_of(a.sync(Batch(take=10)).taken))


def test_a_junk_override_mirror_leaves_the_nodes_setting_for_that_field(node, clock, redis):
    """An override read from kstate's mirror is read field by field: junk (or
    a delay over a day) is the nodes' setting, the rest is kept."""
    a = node("a", polite(delay=0, concurrency=5))
    add(a, "h1", 5)
    add(a, "h2", 5)
    a.set_limits({"h1": Limits(delay=0, concurrency=1), "h2": Limits(delay=0, concurrency=1)})
    redis.hset(a.keys.kstate, mapping={"|h1": "x|1|c", "|h2": "99999999999999|1|c"})
    res = a.sync(Batch(take=10, maintenance=False))
    assert keys_of(res.taken).count("h1") == 1 and keys_of(res.taken).count("h2") == 1
    assert res.state_junk == 2
    clock.advance(0.01)
    assert a.sync(Batch(take=10, maintenance=False)).taken == []   # concurrency 1 kept


# -- 2. a budget key of the wrong type stops no site ----------------------------

def test_a_budget_key_of_the_wrong_type_skips_budgets_and_stops_nothing(node, redis):
    """A budget key holding a string stopped every call that added a new page,
    for every site of the partition. Budgets of that call are skipped, said
    in the reply and counted; the key is left for the operator."""
    a = node("a", polite(retry_after_max=300))
    a.politeness = PolitenessConfig(default=Limits(0, 5, budget=2), margin=0.0)
    add(a, "h1", 1)
    redis.delete(a.keys.budget)
    redis.set(a.keys.budget, "junk")
    res = add(a, "h1", 3, start=1)
    assert res.added == 3 and res.budget_skipped and res.budget_refused == 0
    res = add(a, "h2", 3)
    assert res.added == 3 and res.budget_skipped
    assert a.stats()["budget_skipped"] == 2
    assert redis.get(a.keys.budget) == b"junk"    # not repaired: the operator's call
    assert len(a.take(20)) == 7
    redis.delete(a.keys.budget)                   # mended: budgets count again
    res = add(a, "h3", 3)
    assert (res.added, res.budget_refused, res.budget_skipped) == (2, 1, False)


def test_junk_budget_counts_are_read_field_by_field(node, redis):
    a = node("a")
    a.politeness = PolitenessConfig(default=Limits(0, 5, budget=3), margin=0.0)
    add(a, "h1", 1)
    redis.hset(a.keys.budget, "h1", "2|x")        # admitted kept, refused junk
    res = add(a, "h1", 3, start=1)
    assert (res.added, res.budget_refused) == (1, 2)
    assert redis.hget(a.keys.budget, "h1") == b"3|2" and res.state_junk == 1


def test_junk_in_the_budgets_count_checks_budgets_rather_than_none(node, redis):
    a = node("a")
    a.set_limits({"h1": Limits(0, 5, budget=1)})
    redis.hset(a.keys.kstate, "||budgets", "x")   # read as 0: budgets were skipped
    res = add(a, "h1", 3)
    assert (res.added, res.budget_refused) == (1, 2)
    assert res.state_junk == 1


# -- 3. a block is bounded by the crawl's recorded maximum, not by the call --------

def test_a_call_cannot_raise_the_crawl_s_longest_block(node, clock, redis):
    """A node's block feedback was capped by a bound the caller passes (ARGV):
    a call with its own bound blocked a site for 317 years. The crawl's bounds
    are recorded by the first call that needs them (its node's settings), a
    call is held to them and to the script's hard bound of a day."""
    a = node("a", polite(retry_after_max=60, backoff_max=30))
    add(a, "h1", 3)
    add(a, "h2", 3)
    first = Batch(maintenance=False)
    first.block("h1", 10)
    recorded = a.sync(first)
    forger = node("x", polite(retry_after_max=10**10, backoff_max=10**10))
    said = Batch(maintenance=False)
    said.block("h1", 10**10)
    said.crawl_delay("h2", 10**10)
    res = forger.sync(said)
    states = a.key_states(["h1", "h2"])
    assert states["h1"]["blocked_until_ms"] == clock.ms + 60_000
    assert states["h2"]["crawl_delay_ms"] == 30_000
    assert recorded.bounds_ms == res.bounds_ms == (60_000, 30_000)
    assert redis.hget(a.keys.kstate, "||bounds") == b"60000|30000"


def test_without_recorded_bounds_a_call_is_held_to_a_day(node, clock, redis):
    forger = node("x", polite(retry_after_max=10**10))
    add(forger, "h1", 3)
    redis.hset(forger.keys.kstate, "||bounds", "junk")
    said = Batch(maintenance=False)
    said.block("h1", 10**10)
    res = forger.sync(said)
    assert forger.key_states(["h1"])["h1"]["blocked_until_ms"] == clock.ms + 86_400_000
    assert res.state_junk == 1


# -- 4. 'sent' is taken only from the holder of the member's lease ----------------

def test_a_sent_report_from_a_node_that_holds_no_lease_is_refused(node, clock, redis):
    """``sent 0`` repeated every 0.25 s (it moves the key's last start to now)
    starved a site. It is taken only from the node holding the lease of the
    member it names; refused ones are counted and reported to the caller."""
    a, x = node("a", polite(delay=1, concurrency=5)), node("x", polite(delay=1, concurrency=5))
    add(a, "h1", 10)
    (member, _), = a.take(5)
    refused = 0
    for _ in range(8):                            # 2 s of reports from x
        clock.advance(0.25)
        forged = Batch(maintenance=False)
        forged.feedback.append(("h1", "sent", time.monotonic()))     # the old form
        forged.feedback.append((member, "sent", time.monotonic()))   # a's member
        refused += getattr(x.sync(forged), "sent_refused", 0)
    assert keys_of(x.take(5)) == ["h1"]           # the interval counted from a's lease
    assert refused == 16 and a.stats()["sent_refused"] == 16


def test_a_sent_report_from_the_holder_moves_the_key_s_next_start(node, clock):
    a, b = node("a", polite(delay=1, concurrency=5)), node("b", polite(delay=1, concurrency=5))
    add(a, "h1", 10)
    (member, _), = a.take(5)
    clock.advance(0.5)
    late = Batch(acks=[member], maintenance=False)  # acked in the same call: still counted
    late.sent_late(member, time.monotonic())
    res = a.sync(late)
    clock.advance(0.6)                            # 1.1 s after the lease, 0.6 after the send
    assert b.take(5) == []
    clock.advance(0.5)
    assert keys_of(b.take(5)) == ["h1"]
    assert res.sent_refused == 0


# -- 8. counters, members, node deadlines, ready times ----------------------------

def test_junk_in_a_partition_counter_stops_no_call(node, clock, redis):
    """The scripts add to counters of the partition's stats hash: junk in one
    (or a stats key of another type) stopped every call that counted there."""
    a = Frontier(redis, "spider", "a", lease_ttl=10, clock=clock, dead_max=1,
                 bloom=BloomConfig(capacity=1000))
    add(a, "h", 3)
    taken = a.take(3)
    redis.hset(a.keys.stats, "dead_trimmed", "junk")
    b = Batch(maintenance=False)
    for member, _ in taken[:2]:
        b.fail(member, "dead", {"member": member})
    a.sync(b)                                     # one record trimmed: counted anew
    assert redis.hget(a.keys.stats, "dead_trimmed") == b"1"
    redis.hset(a.keys.stats, "other", "x")
    assert a.stats()["dead_trimmed"] == 1         # junk said, not fatal
    redis.delete(a.keys.stats)
    redis.set(a.keys.stats, "junk")
    b = Batch(maintenance=False)
    b.fail(taken[2][0], "dead", {"member": taken[2][0]})
    a.sync(b)
    assert a.counts()["inflight"] == 0
    assert a.stats() == {}


@pytest.mark.parametrize("where", ["queue", "delayed", "inflight of a dead node"])
def test_a_malformed_member_is_set_aside_and_stops_no_call(node, clock, redis, where):
    """A member this script never writes (no ``<priority>:<seq>@<key>``, or of
    another key than its queue) made every take, promotion or reclaim that
    met it fail; leased, its ack failed every call of its node. It goes to the
    invalid list with its payload; the rest goes on."""
    a = node("a")
    add(a, "h1", 2)
    junk = {"queue": "junk@h1", "delayed": "junk", "inflight of a dead node": "7@"}[where]
    redis.hset(a.keys.payloads, junk, "{}")
    if where == "queue":
        redis.zadd(a.keys.queue("h1"), {junk: -1})   # first in line
        redis.zadd(a.keys.queue("h1"), {"0:99@h2": -2})  # another key's member
        redis.hset(a.keys.payloads, "0:99@h2", "{}")
    elif where == "delayed":
        redis.zadd(a.keys.delayed, {junk: 0})
    else:
        redis.hset(a.keys.inflight, junk, "ghost")
        redis.sadd(a.keys.held("ghost"), junk)
        redis.zadd(a.keys.nodes, {"ghost": 0})
    res = a.sync(Batch(take=10))
    assert sorted(keys_of(res.taken)) == ["h1", "h1"]
    assert res.missing == (2 if where == "queue" else 1)
    a.ack(*(m for m, _ in res.taken))
    records = [json.loads(r) for r in redis.lrange(a.keys.invalid, 0, -1)]
    assert {r["reason"] for r in records} == {"malformed member"}
    assert junk in {r["member"] for r in records}
    assert not redis.hexists(a.keys.payloads, junk)


def test_a_node_deadline_beyond_any_lease_is_expired(node, clock, redis):
    """A node registered with a deadline centuries away never expired: its
    leases never came back and it counted as live for ever."""
    a = node("a")
    add(a, "h1", 1)
    ghost = node("ghost")
    (member, _), = ghost.take(1)
    redis.zadd(a.keys.nodes, {"ghost": clock.ms + 10**13})
    clock.advance(0.2)                            # the paced look is due
    res = a.sync(Batch(take=1))
    assert res.reclaimed == 1 and keys_of(res.taken) == ["h1"] and res.state_junk >= 1
    assert redis.zscore(a.keys.nodes, "ghost") is None


def test_a_ready_time_beyond_any_state_is_brought_back(node, clock, redis):
    a = node("a")
    add(a, "h1", 1)
    a.sync(Batch())                                  # its tidy window: not due again for 100 ms
    redis.zadd(a.keys.ready, {"h1": clock.ms + 10**13})
    assert a.sync(Batch(take=1, maintenance=False)).taken == []
    clock.advance(0.2)
    res = a.sync(Batch(take=1))
    assert keys_of(res.taken) == ["h1"] and res.state_junk == 1


def test_a_raw_call_cannot_register_a_lease_longer_than_an_hour(redis, clock):
    x = Frontier(redis, "spider", "x", lease_ttl=10**9, clock=clock)
    x.sync(Batch())
    assert redis.zscore(x.keys.nodes, "x") == clock.ms + 3_600_000


def test_the_check_mode_does_not_refuse_for_the_stats_or_budget_key(node, redis):
    """Junk there stops no call any more: a call in check mode (after another
    key stopped one) is not refused for them."""
    a = node("a")
    add(a, "h1", 1)
    for key in (a.keys.stats, a.keys.budget):
        redis.set(key, "junk")
    res = a.sync(Batch(take=1, check=True))
    assert keys_of(res.taken) == ["h1"]
    with pytest.raises(redis_lib.ResponseError, match="BADKEY"):
        redis.set(a.keys.wanting, "junk")
        a.sync(Batch(take=1, check=True))


def test_a_junk_cluster_counter_starts_again_instead_of_failing_every_report(redis, clock):
    """Nodes add their counts with HINCRBY: junk in one counter failed the whole
    report, and the node sent the same deltas again for ever."""
    import asyncio

    from redis import asyncio as aioredis

    from crawlproject.frontier.queue import AsyncFrontier

    a = Frontier(redis, "spider", "a", clock=clock)
    redis.hset(a.keys.cluster_stats, mapping={"pages": "junk", "items": "5"})
    a.add_stats({"pages": 3, "items": 2})
    assert a.stats() == {"pages": 3, "items": 7}
    redis.hset(a.keys.cluster_stats, "pages", "1e9")

    async def report():
        port = redis.connection_pool.connection_kwargs["port"]
        client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
        try:
            await AsyncFrontier(client, "spider", "a").add_stats({"pages": 1, "items": 1})
        finally:
            await client.aclose()
    asyncio.run(report())
    assert a.stats() == {"pages": 1, "items": 8}


def test_a_dead_node_s_held_set_of_another_type_stops_no_call(node, clock, redis):
    """Reclaiming a dead node reads its held set: a string there failed every
    maintenance call of every node. Its entries come back with the sweep."""
    a = node("a")
    add(a, "h1", 1)
    ghost = node("ghost")
    (member, _), = ghost.take(1)
    redis.delete(a.keys.held("ghost"))
    redis.set(a.keys.held("ghost"), "junk")
    clock.advance(11)                               # ghost's lease expired
    res = a.sync(Batch(take=1))
    assert res.state_junk >= 1 and res.taken == []
    assert redis.zscore(a.keys.nodes, "ghost") is None and not redis.exists(a.keys.held("ghost"))
    res = a.sync(Batch(take=1, sweep=True))        # its entry: an orphan, swept back
    assert res.reclaimed == 1 and keys_of(res.taken) == ["h1"]
