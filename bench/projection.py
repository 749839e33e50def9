"""What 1e9 URLs and 100 nodes need, from the measured per-operation costs.

Reads ``bench/results/{commands,costs,dedupe,crawl}.json`` (run those first)
and projects Redis memory, Redis CPU / ops, Bloom shards and MongoDB writes
for a crawl of ``--urls`` URLs by ``--nodes`` nodes. The Bloom sizing mirrors
the SYNC script's (layers, shards of at most 2^26 bits (the default), strings filling their
allocator size class). ``docs/scaling.md`` explains the model.

    python -m bench.projection [--urls 1e9] [--nodes 100]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench.common import RESULTS_DIR, table, write_result
from crawlproject.frontier.bloom import BloomConfig

NAME = "projection"
TARGET_UTIL = 0.7      # plan a Redis master's core at 70 % busy
MONGO_BULK = 500       # MONGO_BULK_SIZE: items per bulk write
POLITE_RATE = 20.0     # pages/s per node on real sites (politeness, latency)


def fitted_bytes(nbytes: int) -> int:
    need = nbytes + 16
    base = 2 ** math.floor(math.log2(need))
    for j in range(4, 9):
        if base * j / 4 >= need:
            return int(base * j / 4 - 16)
    return nbytes


def layer_memory(cap: float, p: float, shard_bits: int) -> tuple[int, int]:
    """(shards, bytes Redis allocates) of one Bloom layer."""
    bits = math.ceil(-cap * math.log(p) / math.log(2) ** 2)
    max_bytes = shard_bits // 8 - 16
    shards = math.ceil(bits / 8 / max_bytes)
    per = min(max_bytes, fitted_bytes(math.ceil(bits / shards / 8)))
    return shards, shards * (per + 16)


def bloom_memory(urls: float, config: BloomConfig) -> dict:
    cap, p = config.capacity, config.error_rate * (1 - config.tightening)
    total_cap, shards, nbytes, layers = 0.0, 0, 0, 0
    while total_cap < urls:
        s, b = layer_memory(cap, p, config.shard_bits)
        shards, nbytes, layers, total_cap = shards + s, nbytes + b, layers + 1, total_cap + cap
        cap, p = cap * config.growth, p * config.tightening
    return {"planned_capacity": config.capacity, "layers": layers, "shards": shards,
            "bytes": nbytes, "bytes_per_url": nbytes / urls}


def load(name, base=RESULTS_DIR):
    path = base / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=float, default=1e9)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="project from the --quick results (bench/results/quick/)")
    args = parser.parse_args(argv)
    base = RESULTS_DIR / "quick" if args.quick else RESULTS_DIR
    commands, costs, crawl = load("commands", base), load("costs", base), load("crawl", base)
    if not (commands and costs and crawl):
        raise SystemExit("run bench.commands, bench.costs and bench.crawl first")
    urls, nodes = args.urls, args.nodes
    ours = commands["runs"].get("ours|2") or commands["runs"]["ours|1"]
    sr = commands["runs"].get("scrapy-redis|2") or commands["runs"]["scrapy-redis|1"]
    node_rate = crawl["summary"]["ours|1|0"]["pages_per_s"]
    per_queued = costs["queued"]["ours_bytes_per_queued"]
    rows, scen = [], {}
    for label, rate in (("CPU-bound nodes (as measured here)", node_rate),
                        (f"polite nodes ({POLITE_RATE:g} pages/s each)", POLITE_RATE)):
        pages_s = nodes * rate
        cores = pages_s * ours["redis_cpu_us_per_page"] / 1e6
        sr_cores = pages_s * sr["redis_cpu_us_per_page"] / 1e6
        scen[label] = {
            "node_pages_per_s": rate, "cluster_pages_per_s": pages_s,
            "redis_cores": cores, "masters_at_70pct": math.ceil(cores / TARGET_UTIL),
            "scrapy_redis_cores": sr_cores,
            "redis_commands_per_s": pages_s * ours["calls_per_page"],
            "scrapy_redis_commands_per_s": pages_s * sr["calls_per_page"],
            "sync_calls_per_s": pages_s * ours["script_calls_per_page"],
            "mongo_items_per_s": pages_s * crawl["summary"]["ours|1|0"].get("items_per_page", 0.98),
            "days_for_urls": urls / pages_s / 86400,
        }
        scen[label]["mongo_bulk_writes_per_s"] = scen[label]["mongo_items_per_s"] / MONGO_BULK
    blooms = {
        "planned for the whole crawl": bloom_memory(urls, BloomConfig(capacity=int(urls))),
        "planned for 10M (default), grown": bloom_memory(urls, BloomConfig()),
        "planned for 100M, grown": bloom_memory(urls, BloomConfig(capacity=int(1e8))),
    }
    depths = {f"{d:.0e}": d * per_queued for d in (1e6, 1e7, 1e8, 1e9)}
    data = {"mode": "quick" if args.quick else "full", "urls": urls, "nodes": nodes, "inputs": {
                "ours_redis_cpu_us_per_page": ours["redis_cpu_us_per_page"],
                "ours_calls_per_page": ours["calls_per_page"],
                "ours_lua_us_per_page": ours.get("script_us_total_per_page"),
                "scrapy_redis_cpu_us_per_page": sr["redis_cpu_us_per_page"],
                "bytes_per_queued_request": per_queued,
                "node_pages_per_s": node_rate,
                "reclaim": costs["reclaim"], "sync": costs["sync"]},
            "scenarios": scen, "bloom": blooms, "queue_bytes_by_depth": depths}
    path = write_result(NAME, data, None if args.out is None else Path(args.out))
    print(render(data))
    print(f"\nwritten {path}")
    return data


def render(data: dict) -> str:
    rows = []
    for label, s in data["scenarios"].items():
        rows.append([label, s["cluster_pages_per_s"], s["redis_cores"], s["masters_at_70pct"],
                     s["scrapy_redis_cores"], s["redis_commands_per_s"],
                     s["scrapy_redis_commands_per_s"], s["mongo_items_per_s"],
                     s["mongo_bulk_writes_per_s"], s["days_for_urls"]])
    out = table([f"{data['nodes']} nodes", "pages/s", "Redis cores (ours)",
                 "frontier masters at 70 %", "Redis cores (scrapy-redis)", "Redis cmds/s (ours)",
                 "Redis cmds/s (scrapy-redis)", "Mongo items/s", "Mongo bulk writes/s",
                 f"days for {data['urls']:.0e} pages"], rows)
    out += "\n\n" + table(["Bloom filter for %.0e URLs at 1e-3" % data["urls"], "layers",
                           "32 MiB-max shards", "GiB", "bytes/URL"],
                          [[k, b["layers"], b["shards"], b["bytes"] / 2**30, b["bytes_per_url"]]
                           for k, b in data["bloom"].items()])
    out += "\n\n" + table(["frontier depth (queued requests)", "queue + payloads GiB"],
                          [[k, v / 2**30] for k, v in data["queue_bytes_by_depth"].items()])
    return out


if __name__ == "__main__":
    main()
