"""Benchmark: the frontier with a large backlog — Redis memory, enqueue rate, take cost.

Issue 49 (a frontier larger than RAM) starts from today's figures: how much
Redis memory a queued request costs, how fast requests are queued, and
whether a take gets slower as the backlog grows. Measured directly on a
private Redis (no persistence) through the real SYNC path
(:class:`crawlproject.frontier.queue.Frontier`, one partition), as
``bench.costs`` and ``bench.frontier_capacity`` do; no crawl, no HTTP.

**The backlog.** ``--queued`` N new requests over ``--sites`` K politeness keys
(default 10^7 over 10^4; ``--quick`` 10^6 over 10^3; ``--smallest`` 10^4 over
100): request *i* is ``http://site<i % K>.example/p/<i>``, priority ``-(i % 3)``
(a link's depth), its ~200-byte JSON payload as a node queues it (URL,
callback, meta, a Referer), its fingerprint the URL's 20-byte SHA1, so every
add is checked against and added to the Bloom filter (capacity ``--bloom-capacity``,
default the run's URLs ÷ 0.85: planned for the backlog, as an operator sizes
``DUPEFILTER_CAPACITY``, so no growth layer opens).
Politeness as a crawl's defaults have it: no interval, 8 in flight per key
(Scrapy's ``CONCURRENT_REQUESTS_PER_DOMAIN``), the default per-site budget.
The backlog is filled in SYNC calls of 1,000 adds (a node's largest batch);
one thread builds the next batch while Redis runs the current call.

**At each checkpoint** (10^5, 10^6, 10^7 queued, up to N):

* memory: ``INFO memory`` ``used_memory`` less that of the empty frontier, and
  the Bloom filter apart (``MEMORY USAGE`` of its layer table and every shard):
  the queue's bytes per queued request = (used_memory delta − Bloom) ÷ queued;
  also ``MEMORY USAGE`` of the payloads hash, the per-key queue zsets and the
  per-key bookkeeping (ready zset, kstate, budget), summed;
* the enqueue rate at batch sizes 100 and 1,000 (new requests; calls in a row;
  median of three rounds, interleaved with the take's):
  requests/s as one client sees it (``Frontier.sync`` wall time: packing,
  round trip, server) and as Redis' time allows (``INFO commandstats`` µs of
  the script calls);
* a take's cost: server µs per SYNC call of a take of 32 (take only), and of
  a node's steady call without adds (take 32 + ack and ``fetched`` of the
  previous 32). Taken entries are acknowledged, so the backlog only shrinks by them.

**Configurations** (``--configs``, in the same run, one after the other):
``today`` (every queued request in Redis) and ``spill`` (issue 49: a bounded
window per key in Redis, the rest in MongoDB) — *not built yet*: listed in the
results as such until ``crawlproject/frontier/backlog.py`` exists; its run
then adds MongoDB's bytes and operations per spilled request.

Bounds: the fill stops before a checkpoint it would not reach within
``--max-seconds`` (default 600, projected from the fill rate so far) or when
Redis' used_memory passes ``--max-redis-gib`` (default 6); the table says
which sizes ran.

    python -m bench.backlog [--quick | --smallest] [--queued N] [--sites K]
        [--configs today,spill] [--max-seconds S] [--max-redis-gib G]
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from dataclasses import dataclass

from bench.common import BenchRedis, base_parser, finish, median, mode_of, table
from crawlproject import defaults
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.library import SCRIPT_COMMANDS
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.frontier.sitelimits import Limits, PolitenessConfig

NAME = "backlog"
SPIDER = "backlog"
# mode -> (queued, sites)
SIZES = {"full": (10**7, 10**4), "quick": (10**6, 10**3), "smallest": (10**4, 100)}
CHECKPOINTS = (10**5, 10**6, 10**7, 10**8)   # sizes measured on the way (and N)
FILL_BATCH = 1000
# mode -> {batch size: calls measured}, per round
ENQUEUE_CALLS = {"full": {100: 100, 1000: 20}, "quick": {100: 100, 1000: 20},
                 "smallest": {100: 10, 1000: 2}}
TAKE = 32
TAKE_CALLS = {"full": 100, "quick": 100, "smallest": 20}
ROUNDS = 3                                # interleaved rounds per checkpoint (the median kept)
#: the newest Bloom layer opens the next one ahead from 90 % full: the default
#: capacity keeps every URL of the run below that (one layer, as planned)
BLOOM_FILL = 0.85
PER_KEY_CONCURRENCY = 8                   # Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN
GIB = 2**30


# -- the synthetic backlog -------------------------------------------------------
def request_of(i: int, sites: int) -> tuple[str, bytes, int, str]:
    """(politeness key, fingerprint, priority, payload) of request *i*."""
    host = f"site{i % sites}.example"
    url = f"http://{host}/p/{i}"
    depth = i % 3
    payload = ('{"url":"%s","callback":"parse_page","priority":%d,"meta":{"depth":%d,'
               '"link_text":"Page %d","download_timeout":30},"headers":{"Referer":'
               '"http://%s/p/%d"}}' % (url, -depth, depth, i, host, i // 7))
    return host, hashlib.sha1(url.encode()).digest(), -depth, payload


class Source:
    """Request ids handed out in order: every add is a new URL."""

    def __init__(self, sites: int):
        self.sites, self.next = sites, 0

    def batch(self, size: int) -> Batch:
        batch = Batch(maintenance=False, promote=False)
        for i in range(self.next, self.next + size):
            key, fp, priority, payload = request_of(i, self.sites)
            batch.add(payload, fp, priority=priority, key=key)
        self.next += size
        return batch


def script_usec(client) -> tuple[int, int]:
    """Script calls (FCALL/EVALSHA) and their server µs so far."""
    calls = usec = 0
    for name, s in client.info("commandstats").items():
        if name.removeprefix("cmdstat_") in SCRIPT_COMMANDS:
            calls, usec = calls + int(s["calls"]), usec + int(s["usec"])
    return calls, usec


# -- today's frontier ------------------------------------------------------------
class Today:
    """Every queued request in Redis: the frontier as it is."""

    def __init__(self, redis: BenchRedis, sites: int, bloom_capacity: int):
        self.redis, self.client = redis, redis.client
        politeness = PolitenessConfig(default=Limits(0.0, PER_KEY_CONCURRENCY,
                                                     defaults.FRONTIER_SITE_BUDGET))
        self.frontier = Frontier(self.client, SPIDER, "bench-node", lease_ttl=600.0,
                                 bloom=BloomConfig(capacity=bloom_capacity),
                                 politeness=politeness)
        self.source = Source(sites)
        self.queued = 0
        self.frontier.sync(Batch())           # the script loaded, the node registered
        self.used0 = self.client.info("memory")["used_memory"]

    def send(self, batch: Batch) -> None:
        result = self.frontier.sync(batch)
        self.queued = result.queued

    def fill(self, target: int, deadline: float, max_bytes: int) -> str | None:
        """Add new requests until *target* are queued; None, or why it stopped."""
        todo = max(0, target - self.queued)
        built: queue.Queue = queue.Queue(maxsize=3)
        stop = threading.Event()

        def build():   # the next batch is built while Redis runs the current call
            left = todo
            while left > 0 and not stop.is_set():
                n = min(FILL_BATCH, left)
                built.put(self.source.batch(n))
                left -= n
            built.put(None)

        thread = threading.Thread(target=build, daemon=True)
        thread.start()
        why, calls = None, 0
        try:
            while (batch := built.get()) is not None:
                self.send(batch)
                calls += 1
                if calls % 200 == 0:
                    if time.monotonic() > deadline:
                        why = "time"
                        break
                    if self.client.info("memory")["used_memory"] > max_bytes:
                        why = "memory"
                        break
        finally:
            stop.set()
            while thread.is_alive():   # unblock the builder if it waits on a full queue
                try:
                    built.get_nowait()
                except queue.Empty:
                    pass
                thread.join(0.05)
        return why

    def memory(self) -> dict:
        c, k = self.client, self.frontier.keys
        info = c.info("memory")

        def usage(key) -> int:
            return int(c.memory_usage(key, samples=0) or 0)

        def scan_usage(pattern: str) -> tuple[int, int]:
            total = n = 0
            for key in c.scan_iter(match=pattern, count=1000):
                total, n = total + usage(key), n + 1
            return total, n

        queue_pattern, _, bloom_pattern, _ = k.patterns()
        shards, shard_count = scan_usage(bloom_pattern)
        bloom = usage(k.bloom) + shards
        zsets, keys = scan_usage(queue_pattern)
        payloads = usage(k.payloads)
        per_key = sum(usage(x) for x in (k.ready, k.kstate, k.budget, k.limits, k.qlen))
        used = info["used_memory"] - self.used0
        queued = self.queued
        return {"queued": queued, "used_memory": info["used_memory"],
                "used_memory_rss": info["used_memory_rss"], "used_delta": used,
                "bloom_bytes": bloom, "bloom_shards": shard_count,
                "bloom_bytes_per_url": bloom / max(1, self.source.next),
                "bloom_bytes_per_planned_url": bloom / self.frontier.bloom.capacity,
                "queue_bytes": used - bloom,
                "queue_bytes_per_request": (used - bloom) / max(1, queued),
                "payloads_bytes": payloads, "queue_zsets_bytes": zsets, "queue_keys": keys,
                "per_key_bytes": per_key,
                "structures_bytes_per_request": (payloads + zsets + per_key) / max(1, queued),
                "payloads_bytes_per_request": payloads / max(1, queued),
                "zsets_bytes_per_request": zsets / max(1, queued)}

    def enqueue_rate(self, size: int, calls: int) -> dict:
        batches = [self.source.batch(size) for _ in range(calls)]
        c0, u0 = script_usec(self.client)
        wall = 0.0
        for batch in batches:
            t = time.perf_counter()
            self.send(batch)
            wall += time.perf_counter() - t
        c1, u1 = script_usec(self.client)
        adds = size * calls
        server_us = (u1 - u0) / max(1, c1 - c0)
        return {"batch": size, "calls": calls, "server_us_per_call": server_us,
                "client_ms_per_call": 1000 * wall / calls,
                "requests_per_s": adds / wall,
                "requests_per_s_server": 1e6 * size / server_us if server_us else None}

    def take_cost(self, calls: int) -> dict:
        """Server µs per take-only call and per take + ack of the previous take."""
        f = self.frontier

        def call(take: int, acks: list[str]) -> list[str]:
            batch = Batch(take=take, maintenance=False, promote=False)
            batch.acks, batch.fetched = list(acks), list(acks)
            result = f.sync(batch)
            self.queued = result.queued
            return [m for m, _ in result.taken]

        out = {}
        for shape in ("take", "take_ack"):
            held: list[str] = []
            c0, u0 = script_usec(self.client)
            wall, taken = 0.0, 0
            for _ in range(calls):
                t = time.perf_counter()
                got = call(TAKE, held if shape == "take_ack" else [])
                wall += time.perf_counter() - t
                taken += len(got)
                held = got if shape == "take_ack" else held + got
            c1, u1 = script_usec(self.client)
            call(0, held)    # acknowledged: not measured
            out[shape] = {"calls": calls, "taken": taken,
                          "server_us_per_call": (u1 - u0) / max(1, c1 - c0),
                          "client_ms_per_call": 1000 * wall / calls}
        return out


@dataclass(frozen=True)
class Config:
    """A frontier measured: *frontier* builds it (``Today``'s interface: ``fill``,
    ``memory``, ``enqueue_rate``, ``take_cost``, ``queued``, ``source``); None: not built yet."""

    key: str
    label: str
    frontier: type | None


CONFIGS = {
    "today": Config("today", "today: every queued request in Redis", Today),
    # issue 49: a Spill class over crawlproject/frontier/backlog.py, its memory() adding
    # MongoDB's bytes and operations per spilled request
    "spill": Config("spill", "two tiers (issue 49): a window per key in Redis, the rest in "
                             "MongoDB", None),
}


def run_config(config: Config, args, redis: BenchRedis, n: int, sites: int, t_end: float,
               mode: str) -> dict:
    redis.reset()
    sizes = sorted({c for c in CHECKPOINTS if c < n} | {n})
    enqueue_calls, take_calls = ENQUEUE_CALLS[mode], TAKE_CALLS[mode]
    extra = len(sizes) * ROUNDS * sum(size * calls for size, calls in enqueue_calls.items())
    capacity = args.bloom_capacity or int((n + extra) / BLOOM_FILL) + 1
    today = config.frontier(redis, sites, capacity)
    points, stopped = [], None
    max_bytes = int(args.max_redis_gib * GIB)
    fill_s, filled = 0.0, 0
    for target in sizes:
        # projected from the fill so far: a checkpoint that would not end in time is skipped
        rate = filled / fill_s if fill_s else None
        left = t_end - time.monotonic()
        if rate and (target - today.queued) / rate * 1.15 > left:
            stopped = f"time: {target:,} queued would take past --max-seconds"
            break
        t = time.monotonic()
        before = today.source.next
        why = today.fill(target, t_end, max_bytes)
        fill_s += time.monotonic() - t
        filled += today.source.next - before
        if why:
            stopped = f"{why}: stopped at {today.queued:,} queued on the way to {target:,}"
            break
        point = {"target": target, "memory": today.memory(),
                 "fill_rate": filled / fill_s if fill_s else None}
        rounds: dict = {"enqueue": {size: [] for size in enqueue_calls}, "take": []}
        for r in range(ROUNDS):
            for size in sorted(enqueue_calls, reverse=bool(r % 2)):
                rounds["enqueue"][size].append(today.enqueue_rate(size, enqueue_calls[size]))
            rounds["take"].append(today.take_cost(take_calls))
        point["enqueue"] = [{**runs[0], **{k: median([x[k] for x in runs]) for k in
                                          ("server_us_per_call", "client_ms_per_call",
                                           "requests_per_s", "requests_per_s_server")},
                             "rounds": [x["requests_per_s"] for x in runs]}
                            for runs in rounds["enqueue"].values()]
        point["take"] = {shape: {**rounds["take"][0][shape],
                                 "server_us_per_call": median(
                                     [x[shape]["server_us_per_call"] for x in rounds["take"]]),
                                 "client_ms_per_call": median(
                                     [x[shape]["client_ms_per_call"] for x in rounds["take"]]),
                                 "rounds": [x[shape]["server_us_per_call"]
                                            for x in rounds["take"]]}
                         for shape in ("take", "take_ack")}
        points.append(point)
        m = point["memory"]
        print(f"  {config.key} {target:>11,}: used_memory {m['used_memory'] / 2**20:,.0f} MiB, "
              f"{m['queue_bytes_per_request']:.0f} B/queued + Bloom "
              f"{m['bloom_bytes'] / 2**20:.1f} MiB; fill {point['fill_rate']:,.0f} req/s; "
              f"take {point['take']['take']['server_us_per_call']:.0f} µs "
              f"({time.monotonic() - t:.0f}s)", flush=True)
    return {"config": config.key, "status": "ok" if not stopped else "partial",
            "stopped": stopped, "sites": sites, "target": n, "points": points,
            "bloom_capacity": capacity,
            "fill_s": fill_s, "filled": filled,
            "payload_bytes": median([len(request_of(i, sites)[3])
                                     for i in range(0, n, max(1, n // 1000))])}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=None, help="requests queued at the end")
    parser.add_argument("--sites", type=int, default=None, help="politeness keys (sites)")
    parser.add_argument("--configs", default="today,spill",
                        help=f"comma-separated, of: {', '.join(CONFIGS)}")
    parser.add_argument("--bloom-capacity", type=int, default=None,
                        help="Bloom filter capacity (default: --queued)")
    parser.add_argument("--max-seconds", type=float, default=600.0,
                        help="time for each configuration's fill and measurements")
    parser.add_argument("--max-redis-gib", type=float, default=6.0,
                        help="stop filling when Redis' used_memory passes this")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    n, sites = SIZES[mode]
    n, sites = args.queued or n, args.sites or sites
    names = [c for c in args.configs.split(",") if c]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(sorted(unknown))}")
    t0 = time.monotonic()
    runs = {}
    with BenchRedis() as redis:
        for name in names:
            config = CONFIGS[name]
            if config.frontier is None:
                print(f"  {name}: not built yet ({config.label})", flush=True)
                runs[name] = {"config": name, "status": "not built yet", "label": config.label}
                continue
            runs[name] = {**run_config(config, args, redis, n, sites,
                                       time.monotonic() + args.max_seconds, mode),
                          "label": config.label}
            redis.reset()
    data = {"mode": mode, "queued": n, "sites": sites, "configs": names, "runs": runs,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows, notes = [], []
    for name, run in data["runs"].items():
        if run["status"] == "not built yet":
            rows.append([name, "not built yet"] + [""] * 11)
            continue
        if run.get("stopped"):
            notes.append(f"{name}: {run['stopped']} (the largest size run is the last row)")
        for p in run["points"]:
            m, e = p["memory"], {x["batch"]: x for x in p["enqueue"]}
            rows.append([name, m["queued"], m["used_memory"] / 2**20,
                         m["queue_bytes_per_request"], m["structures_bytes_per_request"],
                         m["bloom_bytes"] / 2**20, m["bloom_bytes_per_planned_url"],
                         e[100]["requests_per_s"], e[100]["requests_per_s_server"],
                         e[1000]["requests_per_s"], e[1000]["requests_per_s_server"],
                         p["take"]["take"]["server_us_per_call"],
                         p["take"]["take_ack"]["server_us_per_call"]])
    out = table(["config", "queued", "used_memory MiB", "queue B/request (used_memory)",
                 "B/request (MEMORY USAGE)", "Bloom MiB", "Bloom B/planned URL",
                 "enqueue req/s @100", "@100 server-bound", "@1,000", "@1,000 server-bound",
                 "take 32: server µs/call", "take 32 + ack 32: µs/call"], rows)
    today = data["runs"].get("today")
    if today and today.get("points"):
        p = today["points"][-1]["memory"]
        out += (f"\n\n{data['sites']:,} sites; payload {today['payload_bytes']:.0f} B median; "
                f"of the structures at {p['queued']:,} queued: payloads hash "
                f"{p['payloads_bytes_per_request']:.0f} B/request, per-key queue zsets "
                f"{p['zsets_bytes_per_request']:.0f} B/request; Bloom capacity "
                f"{today['bloom_capacity']:,} ({p['bloom_bytes'] / today['bloom_capacity']:.2f} "
                f"B per planned URL); fill rate (1,000-add calls, "
                f"batches built alongside) {today['filled'] / max(1e-9, today['fill_s']):,.0f} "
                f"req/s")
    if notes:
        out += "\n" + "\n".join(notes)
    return out


if __name__ == "__main__":
    main()
