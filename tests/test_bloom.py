"""The Redis Bloom filter: no false negatives, measured false-positive rates,
growth past capacity, sharding, and use as a standalone DUPEFILTER_CLASS."""

import contextlib
import hashlib

import pytest

from crawlproject.frontier.library import SCRIPT_COMMANDS
from crawlproject.frontier.bloom import BloomConfig, BloomFilter, filter_estimates
from crawlproject.keys import spider_keys

#: Longest a single Bloom script call may block Redis (ms). The work per call
#: is ~10-30 ms; the margin is for a loaded 2-core machine.
SCRIPT_CALL_BOUND_MS = 250


def keys(prefix, n):
    return [hashlib.sha1(f"{prefix}-{i}".encode()).digest() for i in range(n)]


def add_in_batches(bf, fps, size=2000):
    new = []
    for i in range(0, len(fps), size):
        new += bf.add_many(fps[i:i + size])
    return new


def fp_rate(bf, n=100_000, size=5000):
    fresh = keys("fresh", n)
    hits = 0
    for i in range(0, n, size):
        hits += sum(bf.check_many(fresh[i:i + size]))
    return hits / n


@pytest.mark.parametrize("capacity,error_rate", [(20_000, 0.01), (100_000, 0.001)])
def test_no_false_negatives_and_fp_rate_at_capacity(redis, capacity, error_rate):
    bf = BloomFilter(redis, "{t}:bloom", BloomConfig(capacity=capacity, error_rate=error_rate))
    inserted = keys("in", capacity)
    new = add_in_batches(bf, inserted)
    assert sum(new) >= capacity * (1 - 2 * error_rate)   # few FPs while filling
    assert all(bf.check_many(inserted))                    # no false negatives
    assert not any(bf.add_many(inserted[:5000]))
    rate = fp_rate(bf)
    assert rate <= 1.2 * error_rate, rate
    est = bf.estimates()
    assert est["layers"] == 1 and 0 < est["fill_ratio"] < 1
    assert est["est_fp_rate"] <= error_rate


def test_scalable_growth_keeps_fp_rate_at_three_times_capacity(redis):
    capacity, error_rate = 20_000, 0.01
    bf = BloomFilter(redis, "{t}:bloom", BloomConfig(capacity=capacity, error_rate=error_rate))
    inserted = keys("in", 3 * capacity)
    add_in_batches(bf, inserted)
    assert bf.estimates()["layers"] >= 2
    assert all(bf.check_many(inserted))
    rate = fp_rate(bf)
    assert rate <= error_rate, rate


def test_memory_per_url_at_1e3(redis):
    """What Redis really reserves (MEMORY USAGE), at the planned capacity."""
    capacity = 200_000
    bf = BloomFilter(redis, "{t}:bloom", BloomConfig(capacity=capacity, error_rate=0.001))
    add_in_batches(bf, keys("in", capacity))
    used = sum(redis.memory_usage(k) for k in redis.scan_iter("{t}:bloom*"))
    assert used / capacity <= 2.0, used / capacity


def test_bits_are_sharded_over_several_keys(redis):
    config = BloomConfig(capacity=20_000, error_rate=0.01, shard_bits=2**14)
    bf = BloomFilter(redis, "{t}:bloom", config)
    inserted = keys("in", 20_000)
    add_in_batches(bf, inserted)
    shard_keys = list(redis.scan_iter("{t}:bloom:0:*"))
    meta = bf.meta()
    assert int(meta["shards0"]) == len(shard_keys) > 5
    assert max(redis.strlen(k) for k in shard_keys) <= 2**14 // 8
    assert all(bf.check_many(inserted))
    assert fp_rate(bf, n=20_000) <= 0.012


def test_parameters_are_fixed_by_the_first_node(redis):
    BloomFilter(redis, "{t}:bloom", BloomConfig(capacity=1000)).add(b"x" * 20)
    other = BloomFilter(redis, "{t}:bloom", BloomConfig(capacity=99))
    assert other.add(b"x" * 20) is False
    assert other.meta()["capacity"] == "1000"


def test_estimates_from_meta():
    meta = {"layers": "1", "n0": "1000", "cap0": "1000", "k0": "11", "bits0": "20000",
            "shards0": "1"}
    est = filter_estimates(meta)
    assert est["count"] == 1000 and 0.4 < est["fill_ratio"] < 0.5


def test_invalid_config_is_refused():
    with pytest.raises(ValueError):
        BloomConfig(error_rate=2)
    with pytest.raises(ValueError):
        BloomConfig(shard_bits=2**33)


@contextlib.contextmanager
def slowlog_every_command(client):
    """Log every command's duration in SLOWLOG; restore the config after."""
    old = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    try:
        yield
    finally:
        for name in ("slowlog-log-slower-than", "slowlog-max-len"):
            client.config_set(name, old[name])
        client.slowlog_reset()


def longest_script_ms(client) -> float:
    scripts = [entry["duration"] for entry in client.slowlog_get(100_000)
               if entry["command"].split(b" ", 1)[0].lower().decode() in SCRIPT_COMMANDS]
    assert scripts
    return max(scripts) / 1000


def test_growth_never_blocks_redis(redis):
    """A 240 MB layer 1 is allocated a shard per call while layer 0 fills up,
    never in the one call that opens it."""
    capacity = 100_000
    config = BloomConfig(capacity=capacity, error_rate=0.001, growth=1000)
    bf = BloomFilter(redis, "{t}:bloom", config)
    inserted = keys("in", capacity + 5_000)
    with slowlog_every_command(redis):
        add_in_batches(bf, inserted[:capacity - 2_000], size=1000)
        # Shards of layer 1 made ahead of time are found by the key listings.
        ahead = set(redis.scan_iter("{t}:bloom:1:*"))
        assert ahead and bf.meta()["layers"] == "1"
        assert ahead <= {k.encode() for k in spider_keys(redis, "t")}
        assert ahead <= {k.encode() for k in bf.shard_keys()}
        add_in_batches(bf, inserted[capacity - 2_000:], size=1000)
        longest = longest_script_ms(redis)
    print(f"longest Bloom script call: {longest:.1f} ms")
    meta = bf.meta()
    assert meta["layers"] == "2" and int(meta["n1"]) >= 4_900
    shards = [f"{{t}}:bloom:1:{s}" for s in range(int(meta["shards1"]))]
    assert len(shards) > 1 and all(redis.exists(k) for k in shards)
    # Made at their final size: no allocator slack beyond the string header.
    assert all(redis.memory_usage(k, samples=0) <= redis.strlen(k) * 1.01 + 4096 for k in shards)
    assert all(bf.check_many(inserted))
    assert sum(bf.add_many(keys("more", 5_000))) >= 4_990
    assert fp_rate(bf, n=20_000) <= 2 * config.error_rate
    assert longest <= SCRIPT_CALL_BOUND_MS, longest
    bf.clear()
    assert not list(redis.scan_iter("{t}:bloom*"))


def test_sync_derives_shard_keys_from_the_meta_key_in_keys(redis):
    """SYNC gets no key name in ARGV: shards are <KEYS[9]>:<layer>:<shard>, in its slot."""
    from crawlproject.frontier.queue import Batch, Frontier
    from crawlproject.frontier.scripts import SYNC

    assert "bloom prefix" not in SYNC.split("local node, ttl")[0].lower()
    frontier = Frontier(redis, "t", "node", bloom=BloomConfig(capacity=1000))
    fingerprint = hashlib.sha1(b"page").digest()
    for expected_added in (1, 0):                    # the second one is a duplicate
        batch = Batch()
        batch.add("{}", fingerprint)
        assert frontier.sync(batch).added == expected_added
    assert redis.exists(f"{frontier.keys.bloom}:0:0")
    assert all(k.decode().startswith("{t}:") for k in redis.scan_iter("*"))
