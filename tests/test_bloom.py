"""The Redis Bloom filter: no false negatives, measured false-positive rates,
growth past capacity, sharding, and use as a standalone DUPEFILTER_CLASS."""

import hashlib

import pytest

from crawlproject.frontier.bloom import BloomConfig, BloomFilter, filter_estimates


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
