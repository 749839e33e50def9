"""Benchmark 4: dedupe alone — inserts/s and bytes per URL.

Fingerprints are SHA1s of distinct URLs, all new (the write path of a crawl):

* ours: :class:`crawlproject.frontier.bloom.BloomFilter` ``add_many`` in
  batches (100 = what the scheduler sends per SYNC call at most; 1,000 too),
  sized for the run (capacity = N, error rate 1e-3); 20-byte fingerprints as
  Scrapy's fingerprinter gives them to the scheduler;
* scrapy-redis-bloomfilter 0.8.1: its ``BloomFilter`` as its dupefilter's
  ``request_seen`` uses it, one fingerprint at a time (``exists`` = 6 GETBIT,
  then ``insert`` = 6 SETBIT, each a round trip; defaults bit=30, 6 hashes);
  measured on fewer fingerprints and extrapolated (its cost per insert does
  not depend on the fill);
* a Redis SET: one ``SADD`` round trip per fingerprint, exactly what
  scrapy-redis' ``RFPDupeFilter.request_seen`` does; and, for context only,
  ``SADD`` pipelined 1,000 at a time (no dupefilter does that);
* RedisBloom ``BF.MADD`` (1,000 at a time) for context, when the module loads.

Memory is ``MEMORY USAGE`` (all samples) of the keys / fingerprints held. The
false-positive rate is measured on fresh fingerprints after the inserts.

    python -m bench.dedupe [--quick] [--count N]
"""

from __future__ import annotations

import hashlib
import time

from crawlproject.frontier.bloom import BloomConfig, BloomFilter
from devtools.services import find_redisbloom
from bench.common import BenchRedis, base_parser, mode_of, ratio, table, finish

NAME = "dedupe"
COUNTS = {"full": 1_000_000, "quick": 50_000, "smallest": 3_000}
SR_BLOOM_COUNTS = {"full": 20_000, "quick": 3_000, "smallest": 300}
SET_SINGLE_COUNTS = {"full": 250_000, "quick": 20_000, "smallest": 3_000}
FP_CHECKS = {"full": 100_000, "quick": 20_000, "smallest": 1_000}
ERROR_RATE = 1e-3
FLOOR_VS_SR_BLOOM = 8.0
FLOOR_VS_SET = 1.0
FLOOR_BYTES_PER_URL = 2.0


def fingerprints(start: int, count: int) -> list[bytes]:
    return [hashlib.sha1(f"http://127.0.0.1:8000/product/{i}".encode()).digest()
            for i in range(start, start + count)]


def memory_usage(client, keys) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


def bench_ours(client, fps, batch: int, fresh: list[bytes]) -> dict:
    client.flushall()
    bloom = BloomFilter(client, "{bench}:bloom", BloomConfig(capacity=len(fps), error_rate=ERROR_RATE))
    t = time.perf_counter()
    new = 0
    for i in range(0, len(fps), batch):
        new += sum(bloom.add_many(fps[i:i + batch]))
    elapsed = time.perf_counter() - t
    est = bloom.estimates()
    mem = memory_usage(client, [bloom.meta_key] + bloom.shard_keys())
    false_pos = sum(sum(bloom.check_many(fresh[i:i + 1000])) for i in range(0, len(fresh), 1000))
    variant = f"ours: BloomFilter.add_many, batches of {batch:,}"
    return {"variant": variant, "count": len(fps),
            "measured_count": len(fps), "seconds": elapsed, "inserts_per_s": len(fps) / elapsed,
            "new_reported": new, "memory_bytes": mem, "bytes_per_url": mem / len(fps),
            "bits_bytes_per_url": est["bits"] / 8 / len(fps),
            "false_positive_rate": false_pos / len(fresh), "layers": est["layers"],
            "est_fp_rate": est["est_fp_rate"]}


def bench_ours_growth(client, fps, batch: int) -> dict:
    """Memory when the filter outgrows its plan (capacity N/8, growth 2)."""
    client.flushall()
    config = BloomConfig(capacity=max(1, len(fps) // 8), error_rate=ERROR_RATE)
    bloom = BloomFilter(client, "{bench}:bloom", config)
    t = time.perf_counter()
    for i in range(0, len(fps), batch):
        bloom.add_many(fps[i:i + batch])
    elapsed = time.perf_counter() - t
    mem = memory_usage(client, [bloom.meta_key] + bloom.shard_keys())
    est = bloom.estimates()
    return {"variant": f"ours, planned for 1/8 of it then grown (growth {config.growth:g}, "
                       f"tightening {config.tightening:g}), batches of {batch:,}",
            "count": len(fps), "measured_count": len(fps), "seconds": elapsed,
            "inserts_per_s": len(fps) / elapsed, "memory_bytes": mem,
            "bytes_per_url": mem / len(fps), "bits_bytes_per_url": est["bits"] / 8 / len(fps),
            "layers": est["layers"], "est_fp_rate": est["est_fp_rate"]}


def bench_sr_bloom(client, hexes: list[str], full_count: int, fresh_hex: list[str]) -> dict:
    from scrapy_redis_bloomfilter.bloomfilter import BloomFilter as SRBloom
    from scrapy_redis_bloomfilter.defaults import BLOOMFILTER_BIT, BLOOMFILTER_HASH_NUMBER

    client.flushall()
    bf = SRBloom(client, "bench:bloomfilter", BLOOMFILTER_BIT, BLOOMFILTER_HASH_NUMBER)
    t = time.perf_counter()
    new = 0
    for fp in hexes:  # RFPDupeFilter.request_seen of scrapy-redis-bloomfilter
        if not bf.exists(fp):
            bf.insert(fp)
            new += 1
    elapsed = time.perf_counter() - t
    mem = memory_usage(client, ["bench:bloomfilter"])
    false_pos = sum(1 for fp in fresh_hex if bf.exists(fp))
    rate = len(hexes) / elapsed
    return {"variant": "scrapy-redis-bloomfilter 0.8.1: exists()+insert() per fingerprint "
                       f"(bit={BLOOMFILTER_BIT}, {BLOOMFILTER_HASH_NUMBER} hashes)",
            "count": full_count, "measured_count": len(hexes),
            "extrapolated": len(hexes) < full_count,
            "seconds": full_count / rate, "measured_seconds": elapsed, "inserts_per_s": rate,
            "new_reported": new, "memory_bytes": mem, "bytes_per_url": mem / full_count,
            "false_positive_rate": false_pos / len(fresh_hex),
            "false_positive_checks": len(fresh_hex)}


def bench_set(client, hexes: list[str], pipelined: bool, full_count: int | None = None) -> dict:
    client.flushall()
    t = time.perf_counter()
    if pipelined:
        for i in range(0, len(hexes), 1000):
            pipe = client.pipeline(transaction=False)
            for fp in hexes[i:i + 1000]:
                pipe.sadd("bench:dupefilter", fp)
            pipe.execute()
    else:
        sadd = client.sadd
        for fp in hexes:  # RFPDupeFilter.request_seen: one SADD round trip
            sadd("bench:dupefilter", fp)
    elapsed = time.perf_counter() - t
    mem = memory_usage(client, ["bench:dupefilter"])
    full_count = full_count or len(hexes)
    rate = len(hexes) / elapsed
    return {"variant": ("Redis SET: SADD pipelined 1,000 per round trip (context)" if pipelined
                        else "Redis SET: one SADD round trip per fingerprint (scrapy-redis RFPDupeFilter)"),
            "count": full_count, "measured_count": len(hexes),
            "extrapolated": len(hexes) < full_count, "seconds": full_count / rate,
            "measured_seconds": elapsed, "inserts_per_s": rate, "memory_bytes": mem,
            "bytes_per_url": mem / len(hexes), "false_positive_rate": 0.0}


def bench_redisbloom(fps_hex: list[str], fresh_hex: list[str]) -> dict | None:
    module = find_redisbloom()
    if not module:
        return None
    try:
        with BenchRedis(modules=[module]) as rb:
            client = rb.client
            client.execute_command("BF.RESERVE", "bench:rb", ERROR_RATE, len(fps_hex))
            t = time.perf_counter()
            for i in range(0, len(fps_hex), 1000):
                client.execute_command("BF.MADD", "bench:rb", *fps_hex[i:i + 1000])
            elapsed = time.perf_counter() - t
            mem = memory_usage(client, ["bench:rb"])
            false_pos = 0
            for i in range(0, len(fresh_hex), 1000):
                false_pos += sum(client.execute_command("BF.MEXISTS", "bench:rb", *fresh_hex[i:i + 1000]))
    except Exception as exc:  # module not loadable on this redis-server
        return {"variant": "RedisBloom BF.MADD (context)", "error": str(exc)[:200]}
    return {"variant": "RedisBloom BF.MADD, 1,000 per call (context)", "count": len(fps_hex),
            "measured_count": len(fps_hex), "seconds": elapsed,
            "inserts_per_s": len(fps_hex) / elapsed, "memory_bytes": mem,
            "bytes_per_url": mem / len(fps_hex), "false_positive_rate": false_pos / len(fresh_hex)}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=None)
    args = parser.parse_args(argv)
    mode = mode_of(args)
    n = args.count or COUNTS[mode]
    n_sr = min(n, SR_BLOOM_COUNTS[mode])
    t0 = time.monotonic()
    fps = fingerprints(0, n)
    fresh = fingerprints(n + 10_000_000, FP_CHECKS[mode])
    hexes = [fp.hex() for fp in fps]
    fresh_hex = [fp.hex() for fp in fresh]
    results = {}
    with BenchRedis() as redis:
        client = redis.client
        results["ours_100"] = bench_ours(client, fps, 100, fresh)
        print(f"  ours, batch 100: {results['ours_100']['inserts_per_s']:,.0f}/s", flush=True)
        results["ours_1000"] = bench_ours(client, fps, 1000, fresh)
        print(f"  ours, batch 1000: {results['ours_1000']['inserts_per_s']:,.0f}/s", flush=True)
        results["ours_growth"] = bench_ours_growth(client, fps[:max(1000, n // 4)], 1000)
        results["set_single"] = bench_set(client, hexes[:min(n, SET_SINGLE_COUNTS[mode])],
                                          pipelined=False, full_count=n)
        print(f"  SET single: {results['set_single']['inserts_per_s']:,.0f}/s", flush=True)
        results["set_pipelined"] = bench_set(client, hexes, pipelined=True)
        results["sr_bloom"] = bench_sr_bloom(client, hexes[:n_sr], n,
                                             fresh_hex[:max(100, len(fresh_hex) // 20)])
        print(f"  sr-bloom: {results['sr_bloom']['inserts_per_s']:,.0f}/s", flush=True)
        client.flushall()
    rb = bench_redisbloom(hexes, fresh_hex)
    if rb:
        results["redisbloom"] = rb
    ours = results["ours_100"]
    checks = [
        {"check": "ours (batch 100) inserts/s ÷ scrapy-redis-bloomfilter",
         "ratio": ratio(ours["inserts_per_s"], results["sr_bloom"]["inserts_per_s"]),
         "floor": f"≥ {FLOOR_VS_SR_BLOOM}"},
        {"check": "ours (batch 100) inserts/s ÷ SET, one SADD per fingerprint",
         "ratio": ratio(ours["inserts_per_s"], results["set_single"]["inserts_per_s"]),
         "floor": f"≥ {FLOOR_VS_SET}"},
        {"check": "ours bytes per URL at 1e-3 (filter at its planned capacity)",
         "ratio": ours["bytes_per_url"], "floor": f"≤ {FLOOR_BYTES_PER_URL} B"},
    ]
    checks[0]["pass"] = checks[0]["ratio"] >= FLOOR_VS_SR_BLOOM
    checks[1]["pass"] = checks[1]["ratio"] >= FLOOR_VS_SET
    checks[2]["pass"] = ours["bytes_per_url"] <= FLOOR_BYTES_PER_URL
    data = {"mode": mode, "count": n, "sr_bloom_measured": n_sr, "error_rate": ERROR_RATE,
            "results": results, "checks": checks, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    base = data["results"]["ours_100"]["inserts_per_s"]
    rows = []
    for key in ("ours_100", "ours_1000", "ours_growth", "sr_bloom", "set_single",
                "set_pipelined", "redisbloom"):
        r = data["results"].get(key)
        if not r or "error" in r:
            continue
        count = f"{r['measured_count']:,}" + (f" (→ {r['count']:,} extrapolated)"
                                             if r.get("extrapolated") else "")
        rows.append([r["variant"], count, r["seconds"], r["inserts_per_s"],
                     ratio(base, r["inserts_per_s"]), r["bytes_per_url"],
                     r.get("bits_bytes_per_url"), r.get("false_positive_rate")])
    out = table(["variant", "fingerprints", "time s (for all)", "inserts/s", "ours(100) ×",
                 "bytes/URL (MEMORY USAGE)", "bytes/URL (bits only)", "measured FP rate"], rows)
    out += "\n\n" + table(["floor check", "value", "floor", "result"],
                          [[c["check"], c["ratio"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
