"""Per-operation costs of the frontier, for docs/scaling.md.

Measured directly on a private Redis with :class:`crawlproject.frontier.queue.Frontier`
(no crawl):

* payload bytes of a typical product request (our JSON; scrapy-redis' pickle);
* Redis memory per queued request (``MEMORY USAGE`` of the queue zset and the
  payloads hash / entries), and per request in scrapy-redis' PriorityQueue;
* server time of one SYNC call (``INFO commandstats`` usec of FCALL or EVALSHA) for
  typical batches: the steady state of a crawl node (adds with ~75 %
  duplicates, acks, a take), and bigger batches (how long one call blocks
  Redis);
* a node's CPU per SYNC call through the asyncio client, with redis-py's
  Python command packer and with hiredis' (what the project installs);
* the reclaim path: a SYNC that finds an expired node scans the whole
  ``inflight`` hash (HGETALL) — its time for several inflight sizes;
* FCALL against EVALSHA on Redis 7 (when a 7.x binary is found): the same
  steady-state SYNC call through the functions library and as a cached script,
  rounds interleaved: Redis server time and round trip per call;
* a node's CPU per request outside Redis: Scrapy's request fingerprint, the
  local dedupe's set lookup of a URL already sent (what replaces it for a
  repeat), the JSON encode of a new request and the decode of a leased one;
* SYNC's server time per part (``lua/sync/``): the same call shapes through
  a profiling build of the script (:func:`crawlproject.frontier.scripts.sync_profiled`:
  each step of ``lua/sync/main.lua`` timed with ``TIME`` inside the call),
  next to the whole call's time in that build and in the real one (the
  difference is what the timing itself costs). ``--parts`` runs only this.

    python -m bench.costs [--quick] [--parts]
"""

from __future__ import annotations

import pickle
from urllib.parse import urlsplit
import time

from scrapy import Request, Spider

from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.keys import FrontierKeys
from crawlproject.serialization import request_to_json
from bench.common import BenchRedis, base_parser, median, mode_of, table, finish
from crawlproject.frontier import library
from crawlproject.frontier.library import SCRIPT_COMMANDS
from devtools.services import ServiceError, find_redis_server, redis_server_version

NAME = "costs"
QUEUED = {"full": 20_000, "quick": 5_000, "smallest": 500}
SYNC_CALLS = {"full": 300, "quick": 100, "smallest": 20}
CLIENT_CALLS = {"full": 2000, "quick": 500, "smallest": 50}
INFLIGHT_SIZES = {"full": (1_000, 10_000, 100_000), "quick": (1_000, 10_000), "smallest": (1_000,)}
BASE = "http://127.0.0.1:8000/product/"


class _Spider(Spider):
    name = "costs"

    def parse_product(self, response):
        pass


def typical_request(i: int, spider: Spider) -> Request:
    return Request(f"{BASE}{i}", callback=spider.parse_product)


def steady_batch(take: int) -> Batch:
    """A batch as the scheduler sends it between maintenance rounds (lease
    renewal, reclaim and delayed promotion happen only every lease_ttl/3)."""
    batch = Batch(take=take)
    for flag in ("maintenance", "promote"):
        if hasattr(batch, flag):
            setattr(batch, flag, False)
    return batch


def evalsha_usec(client) -> tuple[int, int]:
    """Script calls (FCALL or EVALSHA) and their server µs so far."""
    stats = client.info("commandstats")
    calls = usec = 0
    for name, s in stats.items():
        if name.removeprefix("cmdstat_") in SCRIPT_COMMANDS:
            calls, usec = calls + int(s["calls"]), usec + int(s["usec"])
    return calls, usec


def fcall_vs_evalsha(spider, calls: int, rounds: int = 5) -> dict | None:
    """The steady-state SYNC call (7 new requests, 7 acks, a take of 7) on
    Redis 7, as FCALL of the library and as EVALSHA of the same script, in
    interleaved rounds: median server µs and client µs per call of each."""
    try:
        executable = find_redis_server(7)
    except ServiceError:
        return None
    payload = request_to_json(typical_request(1, spider), spider)
    results: dict[str, list] = {"fcall": [], "evalsha": []}
    with BenchRedis(executable=executable) as redis:
        client = redis.client
        for r in range(rounds):
            for kind in ("fcall", "evalsha") if r % 2 else ("evalsha", "fcall"):
                redis.reset()
                f = Frontier(client, "costs", "node-a", bloom=BloomConfig())
                library._HAS_FUNCTIONS[client] = kind == "fcall"
                pre = Batch()
                for j in range(calls * 7 + 100):
                    pre.add(payload, fingerprint=f"pre{j}")
                f.sync(pre)
                c0, u0 = evalsha_usec(client)
                wall, to_ack = 0.0, []
                for i in range(calls):
                    b = steady_batch(7)
                    for j in range(7):
                        b.add(payload, fingerprint=f"new{r}-{i}-{j}")
                    b.acks = to_ack
                    t = time.perf_counter()
                    to_ack = [m for m, _ in f.sync(b).taken]
                    wall += time.perf_counter() - t
                c1, u1 = evalsha_usec(client)
                stats = client.info("commandstats")
                assert f"cmdstat_{kind}" in stats, kind     # the kind measured
                results[kind].append(((u1 - u0) / max(1, c1 - c0), 1e6 * wall / calls))
    out = {"redis": ".".join(map(str, redis_server_version(executable))), "calls": calls,
           "rounds": rounds}
    for kind, rows in results.items():
        out[f"{kind}_server_us"] = round(median([x for x, _ in rows]), 1)
        out[f"{kind}_client_us"] = round(median([y for _, y in rows]), 1)
    return out


def payload_sizes(spider) -> dict:
    req = typical_request(123456, spider)
    ours = request_to_json(req, spider).encode()
    theirs = pickle.dumps(req.to_dict(spider=spider), protocol=-1)
    return {"url_bytes": len(req.url), "ours_json_bytes": len(ours),
            "scrapy_redis_pickle_bytes": len(theirs)}


def queued_memory(redis: BenchRedis, spider, n: int) -> dict:
    client = redis.client
    redis.reset()
    f = Frontier(client, "costs", "node-a", bloom=BloomConfig(capacity=max(1000, n)))
    for i in range(0, n, 100):
        batch = Batch()
        for j in range(i, min(n, i + 100)):
            req = typical_request(j, spider)
            host = urlsplit(req.url).hostname
            batch.add(request_to_json(req, spider), fingerprint=f"fp{j}", key=host)
        f.sync(batch)
    k = FrontierKeys("costs")
    queue = k.queue(host)  # one site: one queue (per-site queues cost a key each)
    mem = {key: int(client.memory_usage(key, samples=0) or 0) for key in (queue, k.payloads)}
    per_entry = sum(mem.values()) / n
    # scrapy-redis PriorityQueue: one ZADD of the pickled request per entry.
    client.delete("costs:requests")
    pipe = client.pipeline(transaction=False)
    for j in range(n):
        req = typical_request(j, spider)
        pipe.execute_command("ZADD", "costs:requests", 0,
                             pickle.dumps(req.to_dict(spider=spider), protocol=-1))
        if j % 1000 == 999:
            pipe.execute()
    pipe.execute()
    theirs = int(client.memory_usage("costs:requests", samples=0) or 0) / n
    return {"entries": n, "queue_bytes": mem[queue], "payloads_bytes": mem[k.payloads],
            "ours_bytes_per_queued": per_entry, "scrapy_redis_bytes_per_queued": theirs}


SYNC_SHAPES = [
    # name, adds per call, share of adds that are duplicates, acks, take
    ("steady state: 16 acks + 64 adds (75 % duplicates) + take 16", 64, 0.75, 16, 16),
    ("full batch: 100 new adds + 16 acks + take 16", 100, 0.0, 16, 16),
    ("same, adds without fingerprint (no Bloom work)", 100, None, 16, 16),
    ("take only: 16", 0, 0.0, 0, 16),
    ("big batch: 1,000 new adds", 1000, 0.0, 0, 0),
    ("huge batch: 10,000 new adds", 10_000, 0.0, 0, 0),
]
#: the shapes measured per part: a node's usual calls, and one with maintenance
#: (heartbeat, reclaim check, delayed promotion: every lease_ttl/3 per node)
PART_SHAPES = [SYNC_SHAPES[0], SYNC_SHAPES[1], SYNC_SHAPES[3],
               ("steady state + maintenance ('m', 'd')", 64, 0.75, 16, 16, True)]


def sync_costs(redis: BenchRedis, spider, calls: int, shapes=SYNC_SHAPES,
               profiled: bool = False) -> list[dict]:
    """Server µs per SYNC for a few batch shapes, on a 10M-capacity filter.
    With *profiled*, through SYNC's profiling build: each result also has
    ``parts`` (function -> server µs per call, from the stats hash)."""
    from crawlproject.frontier.scripts import sync_profiled

    client = redis.client
    out = []
    for name, adds, dup_share, acks, take, *maintenance in shapes:
        redis.reset()
        f = Frontier(client, "costs", "node-a", bloom=BloomConfig())
        if profiled:   # (EVALSHA of the profiling build: never in the library)
            f._sync = client.register_script(sync_profiled())
        seen = []
        payload = request_to_json(typical_request(1, spider), spider)
        # a queue to take from
        for i in range(0, calls * take + 1000, 1000):
            b = Batch()
            for j in range(i, i + 1000):
                b.add(payload, fingerprint=f"pre{j}")
            f.sync(b)
        n_calls = calls if adds < 1000 else max(3, calls // (adds // 100))
        prof = [k for k in client.hkeys(f.keys.stats) if k.startswith(b"prof:")]
        if prof:
            client.hdel(f.keys.stats, *prof)   # the queue filling above is not measured
        c0, u0 = evalsha_usec(client)
        wall = 0.0
        counter = 0
        to_ack: list[str] = []
        for _ in range(n_calls):
            b = steady_batch(take)
            if maintenance and maintenance[0]:
                b.maintenance = b.promote = True
            for j in range(adds):
                if dup_share is None:  # dont_filter requests: no Bloom work
                    b.add(payload, fingerprint=None)
                    continue
                if seen and (j / max(1, adds)) < dup_share:
                    fp = seen[(counter * 7 + j) % len(seen)]
                else:
                    fp = f"new{counter}"
                    seen.append(fp)
                counter += 1
                b.add(payload, fingerprint=fp)
            b.acks, to_ack = to_ack[:acks], []
            t = time.perf_counter()
            res = f.sync(b)
            wall += time.perf_counter() - t
            to_ack = [m for m, _ in res.taken]
        c1, u1 = evalsha_usec(client)
        out.append({"shape": name, "calls": n_calls, "server_us_per_call": (u1 - u0) / max(1, c1 - c0),
                    "client_ms_per_call": 1000 * wall / n_calls})
        if profiled:
            raw = {k.decode()[5:]: int(v) for k, v in client.hgetall(f.keys.stats).items()
                   if k.startswith(b"prof:")}
            n = max(1, raw.pop("calls", 0))
            out[-1]["parts"] = {k: v / n for k, v in raw.items()}
    return out


def sync_part_costs(redis: BenchRedis, spider, calls: int, rounds: int = 3) -> dict:
    """SYNC's server µs per part for :data:`PART_SHAPES`: the profiling build
    (steps timed inside the call) and, interleaved shape by shape, the real
    script (what the timing adds is the difference of the two whole calls);
    each figure the median of *rounds* rounds (the machine is shared)."""
    from crawlproject.frontier.scripts import SYNC_INNER, sync_steps

    plain, profiled = [], []
    for _ in range(rounds):
        for i, shape in enumerate(PART_SHAPES):
            p = sync_costs(redis, spider, calls, [shape])[0]
            q = sync_costs(redis, spider, calls, [shape], profiled=True)[0]
            if len(plain) <= i:
                plain.append({**p, "server_us_per_call": []})
                profiled.append({**q, "server_us_per_call": [], "parts": {}})
            plain[i]["server_us_per_call"].append(p["server_us_per_call"])
            profiled[i]["server_us_per_call"].append(q["server_us_per_call"])
            for name, us in q["parts"].items():
                profiled[i]["parts"].setdefault(name, []).append(us)
    for s in plain + profiled:
        s["server_us_per_call"] = median(s["server_us_per_call"])
        s["rounds"] = rounds
    for s in profiled:
        s["parts"] = {name: median(v + [0.0] * (rounds - len(v))) for name, v in s["parts"].items()}
    return {"steps": [[part, name] for part, name in sync_steps()], "inner": list(SYNC_INNER),
            "plain": plain, "profiled": profiled}


def client_cpu_costs(redis: BenchRedis, spider, calls: int, rounds: int = 3) -> list[dict]:
    """This process's CPU µs per SYNC call through the asyncio client a node
    uses (``connection.redis_from_url(..., asyncio=True)``), with redis-py's
    own Python command packer and with the hiredis packer the project installs
    on it (:func:`crawlproject.connection.hiredis_packing`); best of *rounds*,
    the two interleaved. Redis runs in its own process: its time is not in
    these figures, the event loop's and redis-py's are."""
    import asyncio

    from redis.asyncio.connection import Connection

    from crawlproject.connection import redis_from_url
    from crawlproject.frontier.queue import AsyncFrontier

    shapes = [  # name, new adds, acks (of the last take), take
        ("as in a crawl at 50 ms (a call every ~7 pages): 7 new adds + 7 acks + take 7", 7, 7, 7),
        ("steady state: 16 new adds + 16 acks + take 16", 16, 16, 16),
    ]

    async def run(name: str, adds: int, acks: int, take: int, hiredis: bool) -> float:
        client = redis_from_url(redis.url, asyncio=True)
        if not hiredis:
            client.connection_pool.connection_class = Connection
        f = AsyncFrontier(client, f"cpu{int(hiredis)}", "node-a", bloom=BloomConfig())
        counter, held = 0, []
        # encoded beforehand: the encode is measured on its own (node_costs)
        payloads = [request_to_json(typical_request(i, spider), spider)
                    for i in range(calls * adds)]
        try:
            await f.sync(Batch(take=0))  # connect and load the script first
            cpu = time.process_time()
            for _ in range(calls):
                b = steady_batch(take)
                for _ in range(adds):
                    b.add(payloads[counter], fingerprint=f"cpu{counter}", key="127.0.0.1")
                    counter += 1
                b.acks, held = held[:acks], held[acks:]
                held += [m for m, _ in (await f.sync(b)).taken]
            return (time.process_time() - cpu) / calls * 1e6
        finally:
            await client.aclose()

    out = []
    for name, adds, acks, take in shapes:
        best = {False: float("inf"), True: float("inf")}
        for _ in range(rounds):
            for hiredis in (False, True):
                redis.reset()
                best[hiredis] = min(best[hiredis],
                                    asyncio.run(run(name, adds, acks, take, hiredis)))
        out.append({"shape": name, "calls": calls,
                    "python_packer_us": round(best[False], 1),
                    "hiredis_packer_us": round(best[True], 1)})
    return out


def reclaim_costs(redis: BenchRedis, sizes) -> list[dict]:
    client = redis.client
    k = FrontierKeys("costs")
    out = []
    for size in sizes:
        redis.reset()
        now_ms = int(time.time() * 1000)
        pipe = client.pipeline(transaction=False)
        for i in range(0, size, 1000):
            mapping = {f"0:{j}@h": f"live-{j % 100}" for j in range(i, min(size, i + 1000))}
            pipe.hset(k.inflight, mapping=mapping)
            for j in range(i, min(size, i + 1000)):
                pipe.sadd(k.held(f"live-{j % 100}"), f"0:{j}@h")
        dead = {f"0:{size + j}@h": "dead-node" for j in range(64)}
        pipe.hset(k.inflight, mapping=dead)
        pipe.sadd(k.held("dead-node"), *dead)
        pipe.zadd(k.nodes, {f"live-{j}": now_ms + 3_600_000 for j in range(100)})
        pipe.zadd(k.nodes, {"dead-node": now_ms - 1000})
        pipe.execute()
        f = Frontier(client, "costs", "live-0", bloom=BloomConfig())
        c0, u0 = evalsha_usec(client)
        res = f.sync()  # finds dead-node expired: reads its held set, puts 64 back
        c1, u1 = evalsha_usec(client)
        res2 = f.sync()  # nothing expired now: the normal path
        c2, u2 = evalsha_usec(client)
        out.append({"inflight": size + 64, "reclaimed": res.reclaimed,
                    "reclaim_sync_us": u1 - u0, "normal_sync_us": u2 - u1,
                    "returned_ok": res2.reclaimed == 0})
    return out


def node_costs(spider, number: int) -> dict:
    """µs per call, on this process's CPU, of what a node does per request
    besides Redis (``timeit``, best of 5)."""
    import timeit

    from scrapy.utils.request import RequestFingerprinter

    from crawlproject.policy import InputPolicy
    from crawlproject.serialization import request_from_json

    from crawlproject.signing import Signer

    fingerprinter = RequestFingerprinter()
    policy = InputPolicy(spidercls=type(spider))
    signer = Signer([b"bench-secret-0123456789"], spider.name)   # as with FRONTIER_SECRET
    url = f"{BASE}123"
    request = typical_request(123, spider)
    payload = request_to_json(request, spider, policy)
    signed = request_to_json(request, spider, policy, signer)
    sent = {hash(f"{BASE}{i}") for i in range(20_000)}

    def best(fn) -> float:
        return round(min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6, 2)
    new_request = best(lambda: Request(url))
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler
    stats = MemoryStatsCollector(get_crawler())
    return {
        # a fresh Request each time: Scrapy caches the fingerprint per object
        "fingerprint_us": round(best(lambda: fingerprinter.fingerprint(Request(url)))
                                - new_request, 2),
        "url_lookup_us": best(lambda: hash(url) in sent),
        # without FRONTIER_SECRET (the seed policy both ways) and with it (signed, proven)
        "encode_us": best(lambda: request_to_json(request, spider, policy)),
        "decode_us": best(lambda: request_from_json(payload, spider, policy)),
        "encode_signed_us": best(lambda: request_to_json(request, spider, policy, signer)),
        "decode_signed_us": best(lambda: request_from_json(signed, spider, policy, signer)),
        "signature_bytes": len(signed) - len(payload),
        # what the scheduler now does once a loop turn instead of per request
        "stats_inc_us": best(lambda: stats.inc_value("scheduler/enqueued/redis")),
    }


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--parts", action="store_true",
                        help="only SYNC's server time per part (lua/sync/)")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    t0 = time.monotonic()
    spider = _Spider()
    if args.parts:
        with BenchRedis() as redis:
            parts = sync_part_costs(redis, spider, SYNC_CALLS[mode])
        return finish(NAME + "_parts", {"mode": mode, "sync_parts": parts,
                                        "duration_s": time.monotonic() - t0}, args.out, render)
    node = node_costs(spider, {"full": 20_000}.get(mode, 2_000))
    with BenchRedis() as redis:
        sizes = payload_sizes(spider)
        queued = queued_memory(redis, spider, QUEUED[mode])
        syncs = sync_costs(redis, spider, SYNC_CALLS[mode])
        client_cpu = client_cpu_costs(redis, spider, CLIENT_CALLS[mode])
        reclaim = reclaim_costs(redis, INFLIGHT_SIZES[mode])
        parts = sync_part_costs(redis, spider, SYNC_CALLS[mode])
    calls = fcall_vs_evalsha(spider, SYNC_CALLS[mode], 5 if mode == "full" else 3)
    data = {"mode": mode, "node": node, "payload": sizes, "queued": queued, "sync": syncs,
            "client_cpu": client_cpu, "reclaim": reclaim, "fcall_vs_evalsha": calls,
            "sync_parts": parts,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render_parts(parts: dict) -> str:
    """One column per call shape: each step's server µs per call and share of
    the whole call (the profiling build's), then the functions inside them."""
    prof, plain = parts["profiled"], parts["plain"]
    heads = [f"SYNC part (lua/sync/): server µs/call (share), median of "
             f"{prof[0].get('rounds', 1)} rounds"] + [
        f"{i + 1}: {s['shape']}" for i, s in enumerate(prof)]
    rows = []
    for part, name in parts["steps"]:
        row = [f"{part}.lua {name}"]
        for s in prof:
            us = s["parts"].get(name, 0.0)
            row.append(f"{us:.1f} ({100 * us / max(1e-9, s['server_us_per_call']):.0f} %)")
        rows.append(row)
    rows.append(["sum of the steps"] + [f"{sum(s['parts'].get(n, 0.0) for _, n in parts['steps']):.1f}"
                                        for s in prof])
    rows.append(["whole call, profiling build"] + [f"{s['server_us_per_call']:.1f}" for s in prof])
    rows.append(["whole call, real script (same shape)"] + [f"{s['server_us_per_call']:.1f}"
                                                          for s in plain])
    for name in parts["inner"]:
        if any(name in s["parts"] for s in prof):
            rows.append([f"  inside the steps: {name}"] + [f"{s['parts'].get(name, 0.0):.1f}"
                                                         for s in prof])
    return table(heads, rows)


def render(data: dict) -> str:
    if "payload" not in data:   # --parts
        return render_parts(data["sync_parts"])
    p, q = data["payload"], data["queued"]
    out = table(["what", "ours", "scrapy-redis"], [
        ["payload bytes of a product request", p["ours_json_bytes"], p["scrapy_redis_pickle_bytes"]],
        [f"Redis bytes per queued request ({q['entries']:,} queued)", q["ours_bytes_per_queued"],
         q["scrapy_redis_bytes_per_queued"]],
    ])
    out += "\n\n" + table(["SYNC call shape", "calls", "server µs/call", "client ms/call"],
                          [[s["shape"], s["calls"], s["server_us_per_call"], s["client_ms_per_call"]]
                           for s in data["sync"]])
    if data.get("client_cpu"):
        out += "\n\n" + table(["node CPU per SYNC call, asyncio client (µs)", "calls",
                               "redis-py's packer", "hiredis packer"],
                              [[c["shape"], c["calls"], c["python_packer_us"],
                                c["hiredis_packer_us"]] for c in data["client_cpu"]])
    n = data.get("node")
    if n:
        out += "\n\n" + table(["a node's CPU per request, besides Redis", "µs"], [
            ["Scrapy's request fingerprint", n["fingerprint_us"]],
            ["local dedupe: lookup of a URL already sent", n["url_lookup_us"]],
            ["JSON encode of a new request", n["encode_us"]],
            ["decode of a leased payload into a Request", n["decode_us"]],
            ["Scrapy's stats.inc_value (per-request counts: now once a loop turn)",
             n.get("stats_inc_us", "-")]])
    c = data.get("fcall_vs_evalsha")
    if c:
        out += "\n\n" + table([f"steady SYNC call on Redis {c['redis']} ({c['calls']} calls, "
                               f"median of {c['rounds']} rounds)", "FCALL", "EVALSHA"], [
            ["Redis server µs per call", c["fcall_server_us"], c["evalsha_server_us"]],
            ["client µs per call (round trip)", c["fcall_client_us"], c["evalsha_client_us"]]])
    out += "\n\n" + table(["inflight entries", "reclaimed", "reclaiming SYNC µs", "normal SYNC µs"],
                          [[r["inflight"], r["reclaimed"], r["reclaim_sync_us"], r["normal_sync_us"]]
                           for r in data["reclaim"]])
    if data.get("sync_parts"):
        out += "\n\n" + render_parts(data["sync_parts"])
    return out


if __name__ == "__main__":
    main()
