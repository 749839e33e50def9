"""SeedQueue over a real Redis: atomic batches, claims, and restoring the
claims of a node that died between taking seeds and storing their requests."""

import asyncio

import pytest
from redis import asyncio as aioredis

from crawlproject.keys import SeedKeys, start_urls_key
from crawlproject.seeds import SeedQueue


def run(coro):
    return asyncio.run(coro)


class Clock:
    ms = 1_000_000

    def __call__(self):
        return self.ms


async def _with_queue(redis_url, kind, body, **kw):
    client = aioredis.Redis.from_url(redis_url)
    try:
        return await body(SeedQueue(client, start_urls_key("shop"), kind, **kw))
    finally:
        await client.aclose()


def test_list_seeds_oldest_first_in_one_batch(redis, redis_url):
    redis.lpush(start_urls_key("shop"), "u1", "u2", "u3")

    async def body(q):
        restored, got = await q.claim(2)
        return restored, [raw for _, raw in got], await q.size()

    assert run(_with_queue(redis_url, "list", body)) == (0, [b"u1", b"u2"], 1)
    assert redis.hlen(SeedKeys(start_urls_key("shop")).claims) == 2


def test_release_forgets_claims(redis, redis_url):
    redis.lpush(start_urls_key("shop"), "u1")

    async def body(q):
        _, got = await q.claim(5)
        await q.release([cid for cid, _ in got])

    run(_with_queue(redis_url, "list", body))
    assert redis.hlen(SeedKeys(start_urls_key("shop")).claims) == 0
    assert redis.zcard(SeedKeys(start_urls_key("shop")).claims_due) == 0


@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_claims_of_a_dead_node_come_back(redis, redis_url, kind):
    if kind == "list":
        redis.lpush(start_urls_key("shop"), "u1", "u2")
    elif kind == "set":
        redis.sadd(start_urls_key("shop"), "u1", "u2")
    else:
        redis.zadd(start_urls_key("shop"), {"u1": 5, "u2": 1})
    clock = Clock()

    async def body(q):
        _, first = await q.claim(10)            # this node then dies: never releases
        clock.ms += 5_000
        early = await q.claim(10)               # claims still valid: nothing to take
        clock.ms += 6_000
        restored, again = await q.claim(10)     # expired: put back, then taken again
        return first, early, restored, again

    first, early, restored, again = run(_with_queue(redis_url, kind, body, claim_ttl=10, clock=clock))
    assert sorted(raw for _, raw in first) == [b"u1", b"u2"]
    assert early == (0, [])
    assert restored == 2 and sorted(raw for _, raw in again) == [b"u1", b"u2"]
    if kind == "zset":
        assert [raw for _, raw in first] == [b"u1", b"u2"]   # highest score first


def test_claim_keys_share_the_seed_key_slot():
    """The claim script's keys must live on one Redis Cluster slot."""
    from redis.crc import key_slot

    keys = (start_urls_key("products"), SeedKeys(start_urls_key("products")).claims,
            SeedKeys(start_urls_key("products")).claims_due, SeedKeys(start_urls_key("products")).claims_seq)
    assert len({key_slot(k.encode()) for k in keys}) == 1


def _claim_keys():
    return SeedKeys(start_urls_key("shop"))


# Junk in a claim key: CLAIM_SEEDS writes these after it has popped the seeds,
# and a Lua script is not rolled back on error, so a check that came too late
# would drop a batch of seeds on every call.
JUNK_CLAIM_KEYS = {  # name: (make the junk, the start of the problem diagnose must report)
    "counter not a number": (lambda r, k: r.set(k.claims_seq, "junk"),
                             lambda k: f"{k.claims_seq} holds 'junk'"),
    "counter a hash": (lambda r, k: r.hset(k.claims_seq, "a", "1"),
                       lambda k: f"{k.claims_seq} is a hash"),
    "claims a string": (lambda r, k: r.set(k.claims, "x"),
                        lambda k: f"{k.claims} is a string, not a hash"),
}


@pytest.mark.parametrize("kind", ["list", "zset"])
@pytest.mark.parametrize("junk", sorted(JUNK_CLAIM_KEYS))
def test_junk_in_a_claim_key_takes_no_seed_and_is_named(redis, redis_url, kind, junk):
    keys = _claim_keys()
    if kind == "list":
        redis.lpush(keys.seeds, "u1", "u2", "u3")
    else:
        redis.zadd(keys.seeds, {"u1": 1, "u2": 2.5, "u3": 3})
    before = (redis.lrange(keys.seeds, 0, -1) if kind == "list"
              else redis.zrange(keys.seeds, 0, -1, withscores=True))
    make_junk, reported = JUNK_CLAIM_KEYS[junk]
    make_junk(redis, keys)

    async def body(q):
        with pytest.raises(aioredis.ResponseError, match="BADKEY"):
            await q.claim(2)
        return await q.diagnose()

    problems = run(_with_queue(redis_url, kind, body))
    after = (redis.lrange(keys.seeds, 0, -1) if kind == "list"
             else redis.zrange(keys.seeds, 0, -1, withscores=True))
    assert after == before  # every seed back, in its order, with its score
    assert len(problems) == 1 and problems[0].startswith(reported(keys)), problems


def test_a_seed_key_of_the_wrong_type_is_named_with_the_setting_to_change(redis, redis_url):
    keys = _claim_keys()
    redis.sadd(keys.seeds, "u1", "u2")  # pushed with SADD, read as a list

    async def body(q):
        with pytest.raises(aioredis.ResponseError):
            await q.claim(2)
        return await q.diagnose()

    problems = run(_with_queue(redis_url, "list", body))
    assert redis.scard(keys.seeds) == 2
    assert len(problems) == 1 and problems[0].startswith(f"{keys.seeds} is a set, not a list")
    assert "REDIS_START_URLS_AS_SET" in problems[0]


def test_healthy_keys_have_nothing_to_diagnose(redis, redis_url):
    redis.lpush(start_urls_key("shop"), "u1")

    async def body(q):
        await q.claim(1)
        return await q.diagnose()

    assert run(_with_queue(redis_url, "list", body)) == []
