"""The shared frontier over a real Redis, with an injected clock (no sleeping)."""

import hashlib
import json
import re

import pytest
import redis as redis_lib

from crawlproject.frontier.library import script_calls
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.queue import Batch, Frontier, stopped_in_script


class Clock:
    def __init__(self, ms=1_000_000):
        self.ms = ms

    def __call__(self):
        return self.ms

    def advance(self, seconds):
        self.ms += int(seconds * 1000)


def fp(text):
    return hashlib.sha1(text.encode()).digest()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def node(redis, clock):
    def make(name, ttl=10.0):
        return Frontier(redis, "spider", name, lease_ttl=ttl, clock=clock,
                        bloom=BloomConfig(capacity=10_000))
    return make


def add_all(frontier, items):
    batch = Batch()
    for payload, prio in items:
        batch.add(payload, fp(payload), prio)
    return frontier.sync(batch)


def payloads(taken):
    return [p.decode() for _, p in taken]


def test_priority_first_then_fifo(node):
    a = node("a")
    add_all(a, [("low1", -1), ("mid1", 0), ("high1", 5), ("mid2", 0), ("high2", 5), ("low2", -1)])
    assert payloads(a.take(10)) == ["high1", "high2", "mid1", "mid2", "low1", "low2"]


def test_identical_dont_filter_requests_are_not_merged(node, redis):
    a = node("a")
    batch = Batch()
    batch.add("same", None, 0)
    batch.add("same", None, 0)
    assert a.sync(batch).added == 2
    assert payloads(a.take(10)) == ["same", "same"]


def test_an_unfiltered_page_is_queued_every_time_and_recorded_in_the_filter(node):
    """A seed (``dont_filter``) is queued even if seen, but its fingerprint goes
    into the filter: a link to it from any node later is a duplicate (Scrapy
    records nothing for ``dont_filter``, so a start URL linked back from its
    own pages is fetched twice)."""
    a, b = node("a"), node("b")
    for _ in range(2):                           # pushed again: queued again
        batch = Batch()
        batch.add("seed", fp("seed"), 0, unfiltered=True)
        assert a.sync(batch).added == 1
    res = add_all(b, [("seed", 0), ("other", 0)])   # the link back, from another node
    assert (res.added, res.duplicates) == (1, 1)
    assert payloads(b.take(10)) == ["seed", "seed", "other"]


def test_duplicates_filtered_atomically_with_enqueue(node):
    a = node("a")
    res = add_all(a, [("u1", 0), ("u2", 0), ("u1", 0)])
    assert (res.added, res.duplicates, res.queued) == (2, 1, 2)
    res = add_all(a, [("u2", 0), ("u3", 0)])
    assert (res.added, res.duplicates) == (1, 1)


def test_take_leases_and_ack_forgets(node, redis):
    a = node("a")
    add_all(a, [("x", 0), ("y", 0)])
    taken = a.take(1)
    assert payloads(taken) == ["x"]
    assert redis.hget(a.keys.inflight, taken[0][0]) == b"a"
    a.ack(taken[0][0])
    assert a.counts()["inflight"] == 0 and redis.hlen(a.keys.payloads) == 1


def test_expired_lease_is_reclaimed_by_another_node(node, clock):
    a, b = node("a", ttl=10), node("b", ttl=10)
    add_all(a, [("x", 0), ("y", 0)])
    held = a.take(2)
    assert len(held) == 2
    clock.advance(9)
    assert b.sync(Batch(take=5)).taken == []     # a's lease still valid
    clock.advance(2)                             # a never renewed: expired
    res = b.sync(Batch(take=5))
    assert res.reclaimed == 2 and payloads(res.taken) == ["x", "y"]


def test_heartbeat_extends_lease(node, clock):
    a, b = node("a", ttl=10), node("b", ttl=10)
    add_all(a, [("x", 0)])
    a.take(1)
    for _ in range(5):                           # 25 s in all, renewed every 5 s
        clock.advance(5)
        a.heartbeat()
        assert b.sync(Batch(take=5)).taken == []
    assert a.counts()["inflight"] == 1


def test_nack_returns_entry_to_its_place(node):
    a = node("a")
    add_all(a, [("first", 0), ("second", 0)])
    first = a.take(1)[0][0]
    a.nack(first)
    assert payloads(a.take(2)) == ["first", "second"]


def test_leave_returns_unstarted_and_drops_heartbeat(node, redis):
    a, b = node("a"), node("b")
    add_all(a, [("x", 0)])
    member = a.take(1)[0][0]
    a.leave([member])
    assert redis.zscore(a.keys.nodes, "a") is None
    assert payloads(b.take(1)) == ["x"]


def test_delayed_retry_waits_out_its_backoff(node, clock):
    a = node("a")
    batch = Batch()
    batch.add("retry-me", None, 0, delay_ms=4000)
    a.sync(batch)
    assert a.take(1) == [] and a.counts()["delayed"] == 1
    clock.advance(3.9)
    assert a.take(1) == []
    clock.advance(0.2)
    assert payloads(a.take(1)) == ["retry-me"]


def host_of(url, data):
    """The nodes' default politeness key (the host) of a replayed dead letter."""
    from urllib.parse import urlsplit
    return urlsplit(url).hostname


def test_dead_letter_and_replay(node):
    a = node("a")
    doomed = json.dumps({"url": "http://h/doomed"})
    batch = Batch()
    batch.add(doomed, fp(doomed), 3, key="h")
    a.sync(batch)
    member = a.take(1)[0][0]
    batch = Batch()
    batch.fail(member, "dead", {"payload": doomed, "priority": 3, "reason": "HTTP 503",
                                "attempts": 3})
    a.sync(batch)
    assert a.counts()["inflight"] == 0
    (record,) = a.dead_letters()
    assert record["reason"] == "HTTP 503" and record["attempts"] == 3
    assert a.replay_dead(key_of=host_of) == 1
    assert payloads(a.take(1)) == [doomed] and a.dead_letters() == []


def test_replay_skips_garbage_records(node, redis):
    a = node("a")
    redis.lpush(a.keys.dead, "not json")
    redis.lpush(a.keys.dead, json.dumps({"payload": json.dumps({"url": "http://h/ok"}),
                                         "priority": 0}))
    skipped = []
    assert a.replay_dead(10, key_of=host_of, skipped=skipped) == 1
    assert [reason for _, reason in skipped] == ["not JSON"]
    assert redis.lrange(a.keys.dead, 0, -1) == [b"not json"]


@pytest.mark.parametrize("junk", ["counter not a number", "counter a list", "payloads a string",
                                  "delayed a hash"])
def test_replay_onto_a_junk_key_loses_no_dead_letter(node, redis, junk):
    # REPLAY_DEAD removes a record from the dead list before it writes the entry:
    # a key that fails a later write (a script is not rolled back) lost it.
    a = node("a")
    records = [json.dumps({"payload": json.dumps({"url": f"http://h/{i}"}), "priority": 0,
                           "key": "h"}) for i in range(3)]
    redis.lpush(a.keys.dead, *records)
    {"counter not a number": lambda: redis.set(a.keys.seq, "junk"),
     "counter a list": lambda: redis.lpush(a.keys.seq, "1"),
     "payloads a string": lambda: redis.set(a.keys.payloads, "x"),
     "delayed a hash": lambda: redis.hset(a.keys.delayed, "x", "1")}[junk]()
    with pytest.raises(redis_lib.ResponseError, match="BADKEY"):
        a.replay_dead(10, key_of=host_of)
    assert redis.lrange(a.keys.dead, 0, -1) == [r.encode() for r in reversed(records)]


def test_invalid_payload_is_moved_aside(node):
    a = node("a")
    add_all(a, [("garbage", 0)])
    member = a.take(1)[0][0]
    batch = Batch()
    batch.fail(member, "invalid", {"payload": "garbage", "reason": "not JSON"})
    a.sync(batch)
    assert a.invalid_entries()[0]["reason"] == "not JSON"
    assert a.counts() == {"queued": 0, "delayed": 0, "inflight": 0, "dead": 0,
                          "invalid": 1, "nodes": 1, "hosts": 1}


def test_ack_after_reclaim_removes_the_requeued_copy(node, clock):
    a, b = node("a"), node("b")
    add_all(a, [("x", 0)])
    member = a.take(1)[0][0]
    clock.advance(11)
    b.heartbeat()                                # reclaims x into the queue
    assert a.counts()["queued"] == 1
    a.ack(member)                                # a finished it after all
    assert a.counts()["queued"] == 0


def test_server_time_is_used_without_a_clock(redis):
    a = Frontier(redis, "spider", "a", lease_ttl=30)
    res = a.heartbeat()
    deadline = redis.zscore(a.keys.nodes, "a")
    assert deadline == res.now_ms + 30_000
    server = redis.time()
    assert abs(res.now_ms - (server[0] * 1000 + server[1] // 1000)) < 5000


def test_one_round_trip_per_batch(node, redis):
    a = node("a")
    redis.config_resetstat()
    batch = Batch(take=50)
    for i in range(200):
        batch.add(f"p{i}", fp(f"p{i}"), 0)
    a.sync(batch)
    stats = redis.info("commandstats")
    assert script_calls(stats) == 1
    total = sum(v["calls"] for v in stats.values())
    # commands inside the script, for 200 adds (3 of them: a new partition's
    # first call counts its queue, kept in kstate from then on; 1 whether an
    # operator set a budget; 2 the paced look for forged node deadlines and
    # ready times, with the tidy window)
    assert total < 46


# -- lease ownership: only the holder changes an entry ------------------------

def expire_and_retake(node, clock):
    """a takes x, a's lease expires, b reclaims and takes x: (a, b, member)."""
    a, b = node("a"), node("b")
    add_all(a, [("x", 0)])
    member = a.take(1)[0][0]
    clock.advance(11)
    taken = b.sync(Batch(take=1)).taken
    assert [m for m, _ in taken] == [member]
    return a, b, member


def test_a_node_that_lost_its_lease_cannot_ack_anothers(node, clock, redis):
    a, b, member = expire_and_retake(node, clock)
    res = a.sync(Batch(acks=[member]))
    assert res.stale == 1
    assert redis.hget(a.keys.inflight, member) == b"b"          # b's lease untouched
    assert redis.hexists(a.keys.payloads, member)               # and its payload
    b.ack(member)
    assert a.counts()["inflight"] == 0 and redis.hlen(a.keys.payloads) == 0


def test_a_late_ack_takes_an_entry_out_of_its_queue_until_another_node_took_it(
        node, clock, redis):
    """The race of a slow node with the reclaim: a's lease expired and x went
    back to its queue. a's late ack (the page was crawled, its items stored)
    takes x out while nobody holds it, so it is not fetched again; once b has
    taken it, x is b's and a's ack is stale (test above)."""
    a, b = node("a"), node("b")
    add_all(a, [("x", 0), ("y", 0)])
    (x, _), (y, _) = a.take(2)
    clock.advance(11)
    b.sync(Batch())                                           # the reclaim, no take
    assert not redis.hexists(a.keys.inflight, x) and a.counts()["queued"] == 2
    assert a.sync(Batch(acks=[x])).stale == 0                 # late, but first
    assert not redis.hexists(a.keys.payloads, x)
    assert [m for m, _ in b.take(5)] == [y]                   # x is not fetched twice
    assert a.sync(Batch(acks=[y])).stale == 1                 # b was first: b's
    assert redis.hget(a.keys.inflight, y) == b"b"
    b.ack(y)
    assert a.counts() == {**a.counts(), "queued": 0, "inflight": 0}


def test_an_ack_repeated_after_a_lost_reply_is_not_stale(node, redis):
    """Redis ran the call with the ack and stopped before answering: the node
    sends the ack again with its next call; the entry is already gone."""
    a = node("a")
    add_all(a, [("x", 0), ("y", 0)])
    x, y = (m for m, _ in a.take(2))
    assert a.sync(Batch(acks=[x])).stale == 0
    again = Batch(acks=[x])
    again.fail(y, "dead", {"payload": "y", "reason": "r"})
    assert a.sync(again).stale == 0
    retried = Batch()
    retried.fail(y, "dead", {"payload": "y", "reason": "r"})
    assert a.sync(retried).stale == 0 and len(a.dead_letters()) == 1
    assert a.counts()["inflight"] == 0 and redis.hlen(a.keys.payloads) == 0


def test_a_node_that_lost_its_lease_cannot_requeue_or_dead_letter_it(node, clock, redis):
    a, b, member = expire_and_retake(node, clock)
    assert a.sync(Batch(nacks=[member])).stale == 1
    fail = Batch()
    fail.fail(member, "dead", {"payload": "x", "reason": "stale"})
    assert a.sync(fail).stale == 1
    assert a.counts()["queued"] == 0 and a.dead_letters() == []
    assert redis.hget(a.keys.inflight, member) == b"b"


def test_every_take_registers_the_taker(node, clock, redis):
    """A node id that takes without maintenance (e.g. the new identity after a
    failed call) still gets a deadline, so its entries come back if it dies."""
    a, b = node("a~1"), node("b")
    add_all(b, [("x", 0)])
    taken = a.sync(Batch(take=1, maintenance=False, promote=False)).taken
    assert len(taken) == 1
    assert redis.zscore(a.keys.nodes, "a~1") is not None
    clock.advance(11)
    res = b.sync(Batch(take=1))
    assert res.reclaimed == 1 and payloads(res.taken) == ["x"]


def test_a_queue_length_holding_junk_is_recounted_not_fatal(node, redis):
    """The partition's queue length is a count in Redis (kstate's ``||qlen``):
    junk written there must not make every call fail; it is recounted from
    the entries themselves and the crawl goes on."""
    a = node("a")
    add_all(a, [(f"p{i}", 0) for i in range(5)])
    assert len(a.take(2)) == 2
    later = Batch()
    later.add("later", fp("later"), 0, 60_000)
    a.sync(later)                                  # one delayed entry
    junks = (lambda: redis.hset(a.keys.kstate, "||qlen", "abc"),
             lambda: redis.hset(a.keys.kstate, "||qlen", "1e3"),
             lambda: redis.hset(a.keys.kstate, "||qlen", "-7"))   # every node would close
    for n, junk in enumerate(junks):
        junk()
        assert a.sync(Batch()).queued == 3 + n      # 5 - 2 taken; the delayed one apart
        assert a.counts()["queued"] == 3 + n
        junk()
        res = a.sync(Batch(take=1))
        assert len(res.taken) == 1 and res.queued == 2 + n
        add_all(a, [(f"new{n}a", 0), (f"new{n}b", 0)])
        assert a.counts()["queued"] == 4 + n
    assert a.stats()["qlen_recounted"] == 2 * len(junks)


def test_a_call_that_touches_key_state_pays_no_command_for_the_queue_length(node, redis):
    """The queue length is read with the first states a call loads and written
    back with them: an ack-and-take call sends no command for it."""
    a = node("a")
    add_all(a, [(f"p{i}", 0) for i in range(10)])
    member = a.take(1)[0][0]
    redis.config_resetstat()
    res = a.sync(Batch(acks=[member], take=2))
    assert len(res.taken) == 2 and res.queued == 7
    stats = redis.info("commandstats")
    assert "cmdstat_incrby" not in stats and "cmdstat_get" not in stats, stats
    assert stats["cmdstat_hmget"]["calls"] <= 3        # state, ownership, payloads
    assert int(redis.hget(a.keys.kstate, "||qlen")) == 7


def test_a_sequence_counter_holding_junk_loses_no_request(node, redis):
    """New entries are numbered from a counter in Redis after their
    fingerprints went into the Bloom filter: junk in that counter must not fail
    the call (a retry would find them all "seen" and drop them). Numbering goes
    on above every entry there is, so no member is reused."""
    a = node("a")
    add_all(a, [(f"p{i}", 0) for i in range(3)])
    held = a.take(1)
    for junk in (lambda: redis.set(a.keys.seq, "abc"),
                 lambda: (redis.delete(a.keys.seq), redis.sadd(a.keys.seq, "x"))):
        junk()
        res = add_all(a, [(f"{junk}-{i}", 0) for i in range(2)])
        assert res.added == 2
    assert a.stats()["seq_recounted"] == 2
    taken = a.take(10)
    assert len(taken) == 6                        # 2 left of the first 3, and 4 new
    members = [m for m, _ in held + taken]
    assert len(set(members)) == 7 and redis.hlen(a.keys.payloads) == 7


def test_a_sweep_reclaims_entries_of_unregistered_owners(node, redis):
    a, b = node("a"), node("b")
    add_all(a, [("x", 0)])
    member = a.take(1)[0][0]
    redis.zrem(a.keys.nodes, "a")                 # an owner nobody knows
    assert b.sync(Batch(take=1)).taken == []       # no expired node: nothing to reclaim
    res = b.sync(Batch(take=1, sweep=True))
    assert res.reclaimed == 1 and [m for m, _ in res.taken] == [member]


def test_a_queue_member_without_payload_is_set_aside(node, redis):
    a = node("a")
    add_all(a, [("x", 0), ("y", 0)])
    first = redis.zrange(a.keys.queue(""), 0, 0)[0]
    redis.hdel(a.keys.payloads, first)
    res = a.sync(Batch(take=5))
    assert payloads(res.taken) == ["y"] and res.missing == 1
    (record,) = a.invalid_entries()
    assert record["member"] == first.decode() and record["reason"] == "no payload"
    assert record["node"] == "a"


def test_dead_and_invalid_lists_are_capped_and_trims_counted(redis, clock):
    a = Frontier(redis, "spider", "a", clock=clock, dead_max=3, invalid_max=2,
                 bloom=BloomConfig(capacity=1000))
    add_all(a, [(f"p{i}", 0) for i in range(5)])
    batch = Batch()
    for member, _ in a.take(5):
        batch.fail(member, "dead", {"payload": member, "reason": "x"})
    res = a.sync(batch)
    assert res.trimmed == 2 and len(a.dead_letters()) == 3
    assert a.stats()["dead_trimmed"] == 2


def test_replayed_dead_letters_start_with_fresh_attempt_counters(node):
    a = node("a")
    add_all(a, [("doomed", 3)])
    member = a.take(1)[0][0]
    stored = json.dumps({"url": "http://127.0.0.1/x", "meta": {
        "retry_times": 2, "crawlproject_callback_attempts": 3, "campaign": "c"}})
    batch = Batch()
    batch.fail(member, "dead", {"payload": stored, "priority": 3, "reason": "HTTP 503"})
    a.sync(batch)
    assert a.replay_dead(key_of=host_of) == 1
    (member, replayed), = a.take(1)
    assert member.startswith("3:")
    assert json.loads(replayed)["meta"] == {"campaign": "c"}


def test_a_node_adopts_its_leases_under_its_new_id(node, redis):
    a, a1 = node("a"), node("a~1")
    add_all(a, [("x", 0), ("y", 0)])
    x, y = (m for m, _ in a.take(2))
    res = a1.sync(Batch(adopt=[(x, "a")], acks=[x]))   # the id changed after a failed call
    assert res.stale == 0 and not redis.hexists(a.keys.payloads, x)
    assert redis.hget(a.keys.inflight, y) == b"a"       # not adopted: comes back when "a" expires
    assert a1.sync(Batch(adopt=[(y, "zzz")])).stale == 0 and redis.hget(a.keys.inflight, y) == b"a"


def _snapshot(redis):
    return {k: redis.dump(k) for k in sorted(redis.keys("*"))}


#: A key the SYNC script writes, holding another type: how to spoil it, which key.
_JUNK_SYNC_KEYS = {
    "payloads a string": lambda k: k.payloads,
    "queue a string": lambda k: k.queue("h"),
    "inflight a string": lambda k: k.inflight,
    "kstate a string": lambda k: k.kstate,
    "ready a string": lambda k: k.ready,
    "nodes a string": lambda k: k.nodes,
    "delayed a string": lambda k: k.delayed,
    "wanting a string": lambda k: k.wanting,
}


@pytest.mark.parametrize("junk", sorted(_JUNK_SYNC_KEYS))
def test_a_call_stopped_by_a_junk_key_loses_no_request(node, redis, junk):
    """A command on a key of the wrong type stops the script part way, and
    Redis does not roll a script back: the adds' fingerprints are in the filter
    but nothing is queued. Sent again as usual they would be dropped as
    duplicates (the request lost); forced, they are queued. The check-mode
    resend names the junk key and changes nothing."""
    a = node("a")
    add_all(a, [("old", 0)])
    a.take(1)
    bad = _JUNK_SYNC_KEYS[junk](a.keys)
    redis.delete(bad)
    redis.set(bad, "junk")

    def batch():
        b = Batch(take=1, maintenance=True)
        b.add("new", fp("new"), 0, key="h")
        return b
    first = batch()
    with pytest.raises(redis_lib.ResponseError) as failed:
        a.sync(first)
    assert stopped_in_script(failed.value), failed.value

    first.force_adds()
    first.check = True
    before = _snapshot(redis)
    with pytest.raises(redis_lib.ResponseError,
                       match=re.escape(f"BADKEY {bad} is a string, not a ")) as refused:
        a.sync(first)
    assert not stopped_in_script(refused.value)
    assert _snapshot(redis) == before                       # nothing changed

    redis.delete(bad)
    # The defect this guards against: the filter has the fingerprint now, so
    # the add sent again as usual is dropped.
    assert a.sync(Batch(adds=list(batch().adds), maintenance=False)).duplicates == 1
    res = a.sync(first)
    assert res.added == 1 and res.duplicates == 0
    taken = payloads(res.taken) + payloads(a.take(10))
    # Where the stopped call had queued it already, it is there twice: at
    # worst crawled twice, never lost.
    assert set(taken) == {"new"} and len(taken) <= 2, taken


def test_a_forced_add_is_queued_once_even_if_the_filter_has_it(node):
    a = node("a")
    add_all(a, [("p", 0)])
    again = Batch()
    again.add("p", fp("p"), 0)
    again.force_adds()
    again.force_adds()                                      # a second failure: one '!'
    assert again.adds[0][1] == "!" + fp("p").hex()
    assert a.sync(again).added == 1
    assert sorted(payloads(a.take(10))) == ["p", "p"]       # at worst crawled twice
    unforced = Batch()
    unforced.add("p", fp("p"), 0)
    assert a.sync(unforced).duplicates == 1                       # the filter still has it
    # A forced add goes into the filter under its own fingerprint.
    fresh = Batch()
    fresh.add("z", fp("z"), 0)
    fresh.force_adds()
    assert a.sync(fresh).added == 1
    unforced = Batch()
    unforced.add("z", fp("z"), 0)
    assert a.sync(unforced).duplicates == 1


def test_check_mode_on_healthy_keys_changes_nothing_but_the_call(node, redis):
    a = node("a")
    add_all(a, [(f"p{i}", 0) for i in range(4)])
    held = a.take(1)
    b = Batch(take=2, acks=[held[0][0]], maintenance=True)
    b.add("q", fp("q"), 3, key="other")
    b.check = True
    before = a.counts()["queued"]
    res = a.sync(b)
    assert res.added == 1 and len(res.taken) == 2
    assert a.counts()["queued"] == before + 1 - 2
    assert redis.hlen(a.keys.inflight) == 2                 # the ack went through
    rest = payloads(res.taken) + payloads(a.take(10))
    assert sorted(rest) == ["p1", "p2", "p3", "q"]
