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
``today`` (every queued request in Redis, above) and ``spill`` (issue 49: a
bounded window per key in Redis, the rest in MongoDB), measured as follows.

**spill.** A MongoDB-wire server (``devtools.services.MongoServer``, the tests'
SecantusDB: a Python stand-in, far slower than mongod: its times bound this
run, not the design; its *operation counts* carry over to a real mongod) and
the same private Redis. ``sites × --window`` entries plus ``--spill`` more
(default 20,000; ``--smallest`` 2,000) are added through the real SYNC as
above, plus ``--refills × 256`` of one extra key; then the real
:class:`~crawlproject.frontier.mover.Mover` spills every key down to
``--window`` (default 100) entries. Reported:

* Redis: the queue's ``used_memory`` (Bloom filter apart) before the spill
  (everything in Redis: today's frontier) and after it, per queued request;
* MongoDB: bytes per spilled request from ``collStats`` (``size`` ÷ ``count``:
  the documents' BSON, and ``totalIndexSize`` ÷ ``count``: the two indexes and
  ``_id``);
* MongoDB operations per spilled and per refilled request: the commands the
  movers' client sent (pymongo command monitoring: ``update``, ``find``,
  ``getMore``…), over the requests moved;
* a refill's cost: ms of one ``Mover.refill`` of a batch of 256 (claim, one
  indexed read, commit, tombstones, done; the read apart), median of
  ``--refills`` keys' batches, at two backlog sizes (``--backlogs``, default
  10^4,10^5; ``--quick`` 10^5,10^6): the collection grown between them with
  documents of other keys written as spills write them (``insert_many``: the
  stand-in upserts ≈ 600 documents/s, a plain insert ≈ 8,000/s). The mover's
  lease is 900 s here: the stand-in's read of 256 took more than the default
  30 s at 10^6 documents (its index scan grows with the collection), and a
  move outliving its lease is refused at its commit, as it must be.

This configuration ignores ``--queued``/``--sites`` beyond the site count.

**scale** (``--configs scale``): the backlog of ``--queued`` over ``--sites``
with the tier on: the window rule enabled with every key's window
``--window`` (the bench's limits have no interval), SYNC filling in chunks of
``--chunk`` adds (default 10^6), and after each chunk the real Mover spilling
every key SYNC flagged (``T:moves``) down to its window. The mover's MongoDB
writes go to ``--sink``: ``insert`` (the same documents by ``insert_many``) or
``null`` (nothing: the Redis side alone; the stand-in cannot take 10^7 in a
bounded run), but for one key (REFILL_KEY) whose entries take the real spill
(upserts, timed) and are refilled ``--refills`` times at each checkpoint
(``SCALE_CHECKPOINTS`` of the total queued, Redis + MongoDB). At each: the
Redis queue's used_memory (Bloom apart) per queued request, the enqueue rate
at batches of 100 and 1,000 with the tier on and, interleaved, off (today's
SYNC, same load), a refill's ms.

Bounds: the fill stops before a checkpoint it would not reach within
``--max-seconds`` (default 600, projected from the fill rate so far) or when
Redis' used_memory passes ``--max-redis-gib`` (default 6); the table says
which sizes ran.

    python -m bench.backlog [--quick | --smallest] [--queued N] [--sites K]
        [--configs today,spill] [--max-seconds S] [--max-redis-gib G]
        [--window W] [--spill N] [--backlogs 100000,1000000] [--refills R]
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


# -- two tiers (issue 49) ----------------------------------------------------------
MOVE_BATCH = 256                       # a refill's batch (FRONTIER_REFILL_BATCH)
#: mode -> (entries spilled beyond the windows, backlog sizes a refill is timed at)
SPILL_SIZES = {"full": (20_000, (10**5, 10**6)), "quick": (20_000, (10**5, 10**6)),
               "smallest": (2_000, (10**4, 3 * 10**4))}
REFILL_KEY = "refill.example"
LEASE_TTL = 900.0                      # s (module docstring: the stand-in's reads)
FILLER_BATCH = 1000


class Commands:
    """pymongo command monitoring: the commands a client sent, by name."""

    def __init__(self):
        from pymongo import monitoring

        counts = self.counts = {}

        class Listener(monitoring.CommandListener):
            def started(self, event):
                counts[event.command_name] = counts.get(event.command_name, 0) + 1

            def succeeded(self, event):
                pass

            def failed(self, event):
                pass

        self.listener = Listener()

    def snapshot(self) -> dict:
        return dict(self.counts)

    @staticmethod
    def since(before: dict, after: dict) -> dict:
        moved = {k: v - before.get(k, 0) for k, v in after.items()}
        return {k: v for k, v in moved.items() if v and k not in ("ping", "hello", "isMaster",
                                                                   "endSessions")}


class Spill:
    """Today's frontier filled through SYNC, then spilled by the real Mover to
    a MongoDB-wire server (see the module docstring)."""

    def __init__(self, redis: BenchRedis, sites: int, bloom_capacity: int, mongo_uri: str,
                 window: int):
        import asyncio

        import redis.asyncio as aioredis

        from crawlproject.frontier.backlog import Backlog, BacklogConfig
        from crawlproject.frontier.mover import Mover

        self.today = Today(redis, sites, bloom_capacity)
        self.sites, self.window = sites, window
        self.loop = asyncio.new_event_loop()
        self.commands = Commands()
        config = BacklogConfig(uri=mongo_uri, database="bench_backlog", timeout=120.0,
                               client_options={"event_listeners": [self.commands.listener]})
        self.backlog = Backlog.from_config(config, SPIDER)
        self.run(self.backlog.open())
        self.aredis = aioredis.Redis.from_url(redis.url)
        # a long lease: the stand-in's read of 256 takes > 30 s (the default
        # lease) at 10^6 documents, and the commit would be refused (fenced)
        self.mover = Mover(self.aredis, self.backlog, self.today.frontier.keys, "bench-mover",
                           settle=0, batch=MOVE_BATCH, lease_ttl=LEASE_TTL)
        self.collection_name = config.collection
        self.mongo_uri = mongo_uri

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.mover.close())
        self.run(self.aredis.aclose())
        self.run(self.backlog.close())
        self.loop.close()

    def fill(self, extra: int, refill_entries: int, t_end: float, max_bytes: int) -> str | None:
        """``sites × window + extra`` entries over the sites, then *refill_entries* of
        REFILL_KEY, all through SYNC."""
        why = self.today.fill(self.sites * self.window + extra, t_end, max_bytes)
        if why:
            return why
        self.fill_key(refill_entries)
        return None

    def fill_key(self, refill_entries: int) -> None:
        """*refill_entries* new requests of REFILL_KEY, through SYNC."""
        frontier, left = self.today.frontier, refill_entries
        while left > 0:
            batch = Batch(maintenance=False, promote=False)
            for _ in range(min(FILL_BATCH, left)):
                i = self.today.source.next
                self.today.source.next += 1
                _, fp, priority, payload = request_of(i, self.sites)
                batch.add(payload.replace(f"site{i % self.sites}.example", REFILL_KEY),
                          hashlib.sha1(f"{REFILL_KEY}/{i}".encode()).digest(),
                          priority=priority, key=REFILL_KEY)
                left -= 1
            self.today.queued = frontier.sync(batch).queued

    def queue_bytes(self) -> dict:
        self.today.queued = self.today.frontier.queued()   # (the movers changed it)
        m = self.today.memory()
        return {"queued_redis": m["queued"], "used_delta": m["used_delta"],
                "bloom_bytes": m["bloom_bytes"], "queue_bytes": m["queue_bytes"],
                "queue_bytes_per_request": m["queue_bytes_per_request"]}

    def spill_all(self, keys: list[str]) -> dict:
        """Every key down to the window (the mover's spill, rounds until done)."""
        before, t, spilled = self.commands.snapshot(), time.perf_counter(), 0

        async def go():
            n = 0
            for key in keys:
                while True:
                    result = await self.mover.spill(key, self.window)
                    n += result.spilled
                    if result.spilled < MOVE_BATCH * 16:   # (SPILL_ROUNDS batches: again)
                        break
            return n

        spilled = self.run(go())
        seconds = time.perf_counter() - t
        ops = Commands.since(before, self.commands.snapshot())
        return {"spilled": spilled, "seconds": seconds, "per_s": spilled / seconds,
                "commands": ops, "ops_per_request": sum(ops.values()) / max(1, spilled)}

    def mongo_bytes(self) -> dict:
        db = self.backlog.client["bench_backlog"]
        stats = self.run(db.command("collStats", self.collection_name))
        count = max(1, int(stats.get("count", 0)))
        return {"documents": int(stats.get("count", 0)), "size": stats.get("size"),
                "index_size": stats.get("totalIndexSize"),
                "bytes_per_request": stats.get("size", 0) / count,
                "index_bytes_per_request": stats.get("totalIndexSize", 0) / count,
                "source": "collStats size/count, totalIndexSize/count"}

    def grow(self, documents: int) -> float:
        """The collection grown to *documents* with entries of other keys, as
        spills write them (one plain ``insert_many`` per 1,000: the stand-in's
        upserts are too slow to write 10^6 in a bounded run); seconds taken."""
        import pymongo

        have = self.run(self.backlog.collection.count_documents({}))
        client = pymongo.MongoClient(self.mongo_uri)
        coll = client["bench_backlog"].get_collection(
            self.collection_name, write_concern=pymongo.WriteConcern(w="majority", j=True))
        t = time.perf_counter()
        try:
            for start in range(have, documents, FILLER_BATCH):
                docs = []
                for i in range(start, min(documents, start + FILLER_BATCH)):
                    key, _, priority, payload = request_of(i, self.sites)
                    key = "filler-" + key
                    member = f"{priority}:{i}@{key}"
                    docs.append({"_id": f"{SPIDER}|0|{member}", "s": SPIDER, "p": 0, "k": key,
                                 "sc": -priority * 2**40 + i, "m": member,
                                 "pl": payload.encode(), "e": 1})
                coll.insert_many(docs, ordered=False)
        finally:
            client.close()
        return time.perf_counter() - t

    def refill_cost(self, n: int) -> dict:
        """*n* refills of a batch of 256 of REFILL_KEY: ms each (the read apart)."""
        backlog, read_ms = self.backlog, []
        peek = backlog.peek

        async def timed_peek(*a, **kw):
            t = time.perf_counter()
            try:
                return await peek(*a, **kw)
            finally:
                read_ms.append(1000 * (time.perf_counter() - t))

        backlog.peek = timed_peek
        before, total_ms, moved = self.commands.snapshot(), [], 0
        try:
            for _ in range(n):
                t = time.perf_counter()
                result = self.run(self.mover.refill(REFILL_KEY, MOVE_BATCH))
                total_ms.append(1000 * (time.perf_counter() - t))
                moved += result.refilled
        finally:
            backlog.peek = peek
        ops = Commands.since(before, self.commands.snapshot())
        documents = self.run(self.backlog.collection.count_documents({}))
        return {"refills": n, "refilled": moved, "ms": median(total_ms), "ms_all": total_ms,
                "read_ms": median(read_ms), "commands": ops,
                "ops_per_request": sum(ops.values()) / max(1, moved),
                "collection_documents": documents}


def run_spill(args, redis: BenchRedis, sites: int, t_end: float, mode: str) -> dict:
    """The ``spill`` configuration (module docstring)."""
    import tempfile

    from devtools.services import MongoServer

    redis.reset()
    extra = args.spill if args.spill is not None else SPILL_SIZES[mode][0]
    sizes = ([int(x) for x in args.backlogs.split(",")] if args.backlogs
             else list(SPILL_SIZES[mode][1]))
    refills = args.refills
    total = sites * args.window + extra + refills * len(sizes) * MOVE_BATCH + args.window
    capacity = args.bloom_capacity or int(total / BLOOM_FILL) + 1
    storage = tempfile.mkdtemp(prefix="bench-backlog-mongo-")
    server = MongoServer(storage_path=storage, port=args.mongo_port)
    server.start()
    out: dict = {"config": "spill", "sites": sites, "window": args.window, "extra": extra,
                 "bloom_capacity": capacity, "stopped": None, "points": []}
    spill = None
    try:
        spill = Spill(redis, sites, capacity, server.uri, args.window)
        t = time.monotonic()
        why = spill.fill(extra, refills * len(sizes) * MOVE_BATCH + args.window, t_end,
                         int(args.max_redis_gib * GIB))
        out["fill_s"] = time.monotonic() - t
        if why:
            out["stopped"] = f"{why}: while filling"
            return out
        out["before"] = spill.queue_bytes()
        out["queued"] = spill.today.source.next
        keys = [f"site{i}.example" for i in range(sites)] + [REFILL_KEY]
        out["spill"] = spill.spill_all(keys)
        out["after"] = spill.queue_bytes()
        out["after"]["queued_mongodb"] = int(
            redis.client.hget(spill.today.frontier.keys.kstate, "||backlog") or 0)
        out["mongo"] = spill.mongo_bytes()
        print(f"  spill: {out['queued']:,} queued, {out['spill']['spilled']:,} spilled in "
              f"{out['spill']['seconds']:.0f}s; Redis queue "
              f"{out['before']['queue_bytes'] / 2**20:.1f} -> "
              f"{out['after']['queue_bytes'] / 2**20:.1f} MiB; MongoDB "
              f"{out['mongo']['bytes_per_request']:.0f} B/request", flush=True)
        for size in sizes:
            left = t_end - time.monotonic()
            grown = out["mongo"]["documents"] if not out["points"] else \
                out["points"][-1]["refill"]["collection_documents"]
            rate = out.get("grow_rate") or 2000.0   # documents/s (the last growth, or a guess)
            if size > grown and (size - grown) / rate > left:
                out["stopped"] = f"time: a backlog of {size:,} would take past --max-seconds"
                break
            grow_s = spill.grow(size)
            if size > grown and grow_s > 0:
                out["grow_rate"] = (size - grown) / grow_s
            point = {"backlog": size, "grow_s": grow_s, "refill": spill.refill_cost(refills)}
            out["points"].append(point)
            r = point["refill"]
            print(f"  spill: backlog {r['collection_documents']:,} documents: refill of "
                  f"{MOVE_BATCH} {r['ms']:.0f} ms (read {r['read_ms']:.0f} ms), "
                  f"{r['ops_per_request']:.4f} MongoDB ops/request", flush=True)
    finally:
        if spill is not None:
            spill.close()
        server.stop()
        import shutil

        shutil.rmtree(storage, ignore_errors=True)
    out["status"] = "ok" if not out["stopped"] else "partial"
    return out


# -- scale: the backlog at 10^7 with the tier on (issue 49) -------------------------
#: total queued (Redis + MongoDB) at which the scale run measures
SCALE_CHECKPOINTS = (10**5, 10**6, 2 * 10**6, 4 * 10**6, 10**7)
#: adds between two passes of the mover over the flagged keys
SCALE_CHUNK = 10**6


def sink_backlog_class(sink: str):
    """A :class:`~crawlproject.frontier.backlog.Backlog` whose spill, but for
    REFILL_KEY's (the real spill), writes the same documents with one
    ``insert_many`` (unordered) instead of the bulk of upserts (*sink*
    ``insert``: the stand-in inserts ≈ 10× faster than it upserts), or writes
    nothing (*sink* ``null``: the Redis side alone, where the stand-in's ≈ 2,400
    inserts/s on a loaded machine would take over an hour for 10^7). The Redis
    side of every move, the reads and the tombstones are the real ones. Bench
    only: an insert cannot revive a tombstone, which no key but REFILL_KEY
    meets here."""
    from crawlproject.frontier.backlog import Backlog

    class SinkBacklog(Backlog):
        async def spill(self, partition, key, entries, *, epoch):
            if key == REFILL_KEY:
                return await super().spill(partition, key, entries, epoch=epoch)
            if sink == "null":
                return len(entries)
            docs = [{"_id": self._id(partition, m), "s": self.spider, "p": partition,
                     "k": key, "sc": int(sc), "m": m, "pl": pl, "e": epoch}
                    for m, sc, pl in entries]
            if not docs:
                return 0
            async with self._call(f"insert {len(docs)} entries of {key!r} into"):
                await self.collection.insert_many(docs, ordered=False)
            return len(docs)

    return SinkBacklog


class Scale(Spill):
    """Today's frontier with the window rule on (every key's window *window*),
    filled through SYNC in chunks; after each chunk the real Mover spills every
    key SYNC flagged (``T:moves``) down to its window."""

    def __init__(self, redis: BenchRedis, sites: int, bloom_capacity: int, mongo_uri: str,
                 window: int, sink: str = "insert"):
        import asyncio

        import redis.asyncio as aioredis

        from crawlproject.frontier.backlog import BacklogConfig
        from crawlproject.frontier.mover import Mover
        from crawlproject.frontier.window import WindowRule

        self.today = Today(redis, sites, bloom_capacity)
        # no interval in the bench's limits: every key's window is the maximum
        self.today.frontier.window = WindowRule(enabled=True, spill_above=1, minimum=window,
                                                maximum=window)
        self.sites, self.window = sites, window
        self.loop = asyncio.new_event_loop()
        self.commands = Commands()
        config = BacklogConfig(uri=mongo_uri, database="bench_backlog", timeout=600.0,
                               client_options={"event_listeners": [self.commands.listener]})
        self.backlog = sink_backlog_class(sink).from_config(config, SPIDER)
        self.run(self.backlog.open())
        self.aredis = aioredis.Redis.from_url(redis.url)
        self.mover = Mover(self.aredis, self.backlog, self.today.frontier.keys, "bench-mover",
                           settle=0, batch=MOVE_BATCH, lease_ttl=LEASE_TTL)
        self.collection_name = config.collection
        self.mongo_uri = mongo_uri
        self.mover_s, self.spilled, self.spill_calls = 0.0, 0, 0

    def in_mongodb(self) -> int:
        return int(self.today.client.hget(self.today.frontier.keys.kstate, "||backlog") or 0)

    def total(self) -> int:
        return self.today.frontier.queued() + self.in_mongodb()

    def drain(self, skip: str | None = None) -> int:
        """The mover's pass: every flagged key spilled down to its window."""
        keys, client = self.today.frontier.keys, self.today.client
        flagged = [k.decode() for k in client.zrange(keys.moves, 0, -1)]
        t = time.perf_counter()

        async def go():
            n = 0
            for key in flagged:
                if key == skip:
                    continue
                while True:
                    result = await self.mover.spill(key, self.window)
                    n += result.spilled
                    self.spill_calls += 1
                    if result.spilled < MOVE_BATCH * 16:
                        break
            return n

        n = self.run(go())
        if flagged:
            client.zrem(keys.moves, *flagged)
        self.mover_s += time.perf_counter() - t
        self.spilled += n
        return n

    def add(self, count: int, t_end: float, max_bytes: int) -> str | None:
        today = self.today
        today.queued = today.frontier.queued()
        return today.fill(today.queued + count, t_end, max_bytes)


def run_scale(args, redis: BenchRedis, n: int, sites: int, t_end: float, mode: str) -> dict:
    """The ``scale`` configuration (BENCHMARKS.md §16): *n* new requests over
    *sites* keys with the tier on, measured at SCALE_CHECKPOINTS of the total."""
    import shutil
    import tempfile

    from crawlproject.frontier.window import WindowRule
    from devtools.services import MongoServer

    redis.reset()
    targets = sorted({c for c in SCALE_CHECKPOINTS if c < n} | {n})
    refills, window = args.refills, args.window
    enqueue_calls = ENQUEUE_CALLS[mode]
    refill_entries = len(targets) * refills * MOVE_BATCH + window
    extra = 2 * len(targets) * ROUNDS * sum(size * calls for size, calls in enqueue_calls.items())
    capacity = args.bloom_capacity or int((n + refill_entries + extra) / BLOOM_FILL) + 1
    storage = tempfile.mkdtemp(prefix="bench-backlog-scale-")
    server = MongoServer(storage_path=storage, port=args.mongo_port)
    server.start()
    out: dict = {"config": "scale", "sites": sites, "window": window, "target": n,
                 "sink": args.sink, "chunk": args.chunk,
                 "bloom_capacity": capacity, "stopped": None, "points": []}
    scale = None
    max_bytes = int(args.max_redis_gib * GIB)
    try:
        scale = Scale(redis, sites, capacity, server.uri, window, args.sink)
        # REFILL_KEY's entries: through SYNC, then the real (upsert) spill
        scale.fill_key(refill_entries)
        before, t = scale.commands.snapshot(), time.perf_counter()
        real = scale.spill_all([REFILL_KEY])
        real["seconds"] = time.perf_counter() - t
        scale.today.client.zrem(scale.today.frontier.keys.moves, REFILL_KEY)
        out["real_spill"] = real
        print(f"  scale: real spill of {real['spilled']:,} entries in {real['seconds']:.1f}s "
              f"({real['per_s']:,.0f}/s), {real['ops_per_request']:.4f} commands/request",
              flush=True)
        sync_s = 0.0
        for target in targets:
            while True:
                total = scale.total()
                if total >= target:
                    break
                if time.monotonic() > t_end:
                    out["stopped"] = f"time: at {total:,} queued on the way to {target:,}"
                    break
                t = time.perf_counter()
                why = scale.add(min(args.chunk, target - total), t_end, max_bytes)
                sync_s += time.perf_counter() - t
                if why:
                    out["stopped"] = f"{why}: at {scale.total():,} queued"
                    break
                scale.drain(skip=REFILL_KEY)
            if out["stopped"]:
                break
            point = {"target": target, "total": scale.total(), "in_mongodb": scale.in_mongodb(),
                     "in_redis": scale.today.frontier.queued()}
            scale.today.queued = point["in_redis"]
            point["memory"] = scale.today.memory()
            point["documents"] = scale.mongo_bytes()["documents"]
            point["refill"] = scale.refill_cost(refills)
            # the enqueue rate with the tier on, new requests; then the mover's pass
            # (and, interleaved, the same calls with the tier off: today's SYNC, same load)
            frontier, rule = scale.today.frontier, scale.today.frontier.window
            rounds = {(tier, size): [] for tier in ("on", "off") for size in enqueue_calls}
            for r in range(ROUNDS):
                for size in sorted(enqueue_calls, reverse=bool(r % 2)):
                    for tier in (("on", "off") if r % 2 else ("off", "on")):
                        frontier.window = rule if tier == "on" else WindowRule(enabled=False)
                        rounds[tier, size].append(
                            scale.today.enqueue_rate(size, enqueue_calls[size]))
            frontier.window = rule
            summary = {key: {**runs[0], "tier": key[0],
                             **{k: median([x[k] for x in runs]) for k in
                                ("server_us_per_call", "client_ms_per_call",
                                 "requests_per_s", "requests_per_s_server")}}
                       for key, runs in rounds.items()}
            point["enqueue"] = [v for (tier, _), v in summary.items() if tier == "on"]
            point["enqueue_tier_off"] = [v for (tier, _), v in summary.items() if tier == "off"]
            scale.drain(skip=REFILL_KEY)
            point["mover"] = {"seconds": scale.mover_s, "spilled": scale.spilled,
                              "spill_calls": scale.spill_calls, "sync_fill_s": sync_s,
                              "used_memory_peak": scale.today.client.info("memory")
                              ["used_memory_peak"]}
            out["points"].append(point)
            m, r = point["memory"], point["refill"]
            print(f"  scale {point['total']:>11,} queued ({point['in_redis']:,} in Redis, "
                  f"{point['in_mongodb']:,} in MongoDB, {point['documents']:,} documents): "
                  f"Redis queue {m['queue_bytes'] / 2**20:,.0f} MiB "
                  f"({m['queue_bytes'] / max(1, point['total']):.0f} B/queued), Bloom "
                  f"{m['bloom_bytes'] / 2**20:.1f} MiB; refill {r['ms']:.0f} ms (read "
                  f"{r['read_ms']:.0f} ms); mover {scale.spilled:,} spilled in "
                  f"{scale.mover_s:.0f}s", flush=True)
        out["mongo"] = scale.mongo_bytes()
        stats = scale.run(scale.backlog.client["bench_backlog"].command(
            "collStats", scale.collection_name))
        out["mongo"]["index_sizes"] = dict(stats.get("indexSizes") or {})
        ops = Commands.since({}, scale.commands.snapshot())
        out["commands"] = ops
    finally:
        if scale is not None:
            scale.close()
        server.stop()
        shutil.rmtree(storage, ignore_errors=True)
    out["status"] = "ok" if not out["stopped"] else "partial"
    return out


def render_scale(run: dict) -> str:
    if not run.get("points"):
        return f"scale: {run.get('stopped')}"
    rows = []
    for p in run["points"]:
        m, r, e = p["memory"], p["refill"], {x["batch"]: x for x in p["enqueue"]}
        off = {x["batch"]: x for x in p.get("enqueue_tier_off", [])}
        rows.append([p["total"], p["in_redis"], p["in_mongodb"], m["queue_bytes"] / 2**20,
                     m["queue_bytes"] / max(1, p["total"]), m["bloom_bytes"] / 2**20,
                     e[100]["requests_per_s"], e[1000]["requests_per_s"],
                     off[100]["requests_per_s"] if off else "",
                     off[1000]["requests_per_s"] if off else "",
                     p["documents"], r["ms"], r["read_ms"], r["ops_per_request"]])
    out = table(["queued", "in Redis", "in MongoDB", "Redis queue MiB (used_memory − Bloom)",
                 "B per queued request", "Bloom MiB", "enqueue req/s @100 (SYNC)", "@1,000",
                 "tier off: @100", "@1,000", "documents", "refill of 256: ms", "read ms", "MongoDB commands/refilled"],
                rows)
    last, s = run["points"][-1], run["real_spill"]
    mv, mg = last["mover"], run["mongo"]
    out += (f"\n\nwindow {run['window']} per key, {run['sites']:,} sites, the mover's pass "
            f"every {run.get('chunk', SCALE_CHUNK):,} adds; mover: "
            f"{mv['spilled']:,} spilled in {mv['seconds']:.0f}s ({mv['spilled'] / max(1e-9, mv['seconds']):,.0f}/s,"
            f" {run['sink']} sink) in {mv['spill_calls']:,} spill calls; SYNC fill "
            f"{mv['sync_fill_s']:.0f}s; Redis used_memory peak {mv['used_memory_peak'] / 2**20:,.0f} MiB"
            f"\nreal spill (upserts) of {s['spilled']:,}: {s['per_s']:,.0f}/s, "
            f"{s['ops_per_request']:.4f} commands/request ({s['commands']})"
            f"\nMongoDB ({mg['documents']:,} documents): {mg['bytes_per_request']:.0f} B/document + "
            f"{mg['index_bytes_per_request']:.0f} B/document of indexes ({mg['index_sizes']})")
    if run.get("stopped"):
        out += f"\nscale: {run['stopped']}"
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
    # (run by run_spill: its own measurements, see the module docstring)
    "spill": Config("spill", "two tiers (issue 49): a window per key in Redis, the rest in "
                             "MongoDB", Spill),
    # (run by run_scale)
    "scale": Config("scale", "two tiers at scale: the window rule on, SYNC fills, the mover "
                             "spills the flagged keys", Scale),
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
    parser.add_argument("--window", type=int, default=100,
                        help="spill: entries each key keeps in Redis")
    parser.add_argument("--spill", type=int, default=None,
                        help="spill: entries added beyond the windows (spilled by the mover)")
    parser.add_argument("--backlogs", default=None,
                        help="spill: comma-separated backlog sizes (documents) a refill is "
                             "timed at")
    parser.add_argument("--refills", type=int, default=3,
                        help="spill: refills of 256 timed at each backlog size")
    parser.add_argument("--sink", choices=("insert", "null"), default="insert",
                        help="scale: what the mover's spills write to MongoDB (but the refill "
                             "key's, always real): the same documents by insert_many, or nothing")
    parser.add_argument("--chunk", type=int, default=SCALE_CHUNK,
                        help="scale: adds between two passes of the mover")
    parser.add_argument("--redis-port", type=int, default=None, help="the private Redis' port")
    parser.add_argument("--mongo-port", type=int, default=None,
                        help="the MongoDB-wire server's port")
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
    bench_redis = BenchRedis()
    if args.redis_port:
        bench_redis.server.port, bench_redis.server._port_fixed = args.redis_port, True
    with bench_redis as redis:
        for name in names:
            config = CONFIGS[name]
            if config.frontier is None:
                print(f"  {name}: not built yet ({config.label})", flush=True)
                runs[name] = {"config": name, "status": "not built yet", "label": config.label}
                continue
            if name == "scale":
                runs[name] = {**run_scale(args, redis, n, sites,
                                          time.monotonic() + args.max_seconds, mode),
                              "label": config.label}
                redis.reset()
                continue
            if name == "spill":
                runs[name] = {**run_spill(args, redis, sites,
                                          time.monotonic() + args.max_seconds, mode),
                              "label": config.label}
                redis.reset()
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
        if name in ("spill", "scale"):
            continue
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
    spill = data["runs"].get("spill")
    if spill and spill.get("status") != "not built yet":
        out += "\n\n" + render_spill(spill)
    if data["runs"].get("scale"):
        out += "\n\n" + render_scale(data["runs"]["scale"])
    return out


def render_spill(run: dict) -> str:
    if "spill" not in run:
        return f"spill: {run.get('stopped')}"
    b, a, s, m = run["before"], run["after"], run["spill"], run["mongo"]
    lines = [
        f"spill (window {run['window']} per key, {run['sites']:,} sites + 1): "
        f"{run['queued']:,} queued through SYNC, {s['spilled']:,} spilled by the mover in "
        f"{s['seconds']:.0f}s ({s['per_s']:,.0f}/s: the MongoDB-wire stand-in bounds it)",
        f"Redis queue (used_memory, Bloom apart): {b['queue_bytes'] / 2**20:.1f} MiB for "
        f"{b['queued_redis']:,} in Redis ({b['queue_bytes_per_request']:.0f} B/request, today) "
        f"-> {a['queue_bytes'] / 2**20:.1f} MiB for {a['queued_redis']:,} in Redis "
        f"({a['queue_bytes_per_request']:.0f} B/request in Redis, "
        f"{a['queue_bytes'] / max(1, run['queued']):.0f} B/request of the whole backlog: "
        f"{100 * a['queue_bytes'] / max(1, b['queue_bytes']):.0f} % of today's)",
        f"MongoDB ({m['source']}): {m['bytes_per_request']:.0f} B/request of documents + "
        f"{m['index_bytes_per_request']:.0f} B/request of indexes ({m['documents']:,} documents)",
        f"MongoDB commands per spilled request: {s['ops_per_request']:.4f} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(s['commands'].items()))})",
    ]
    rows = [[p["refill"]["collection_documents"], p["refill"]["refilled"], p["refill"]["ms"],
             p["refill"]["read_ms"], p["refill"]["ops_per_request"],
             ", ".join(f"{k} {v}" for k, v in sorted(p["refill"]["commands"].items()))]
            for p in run["points"]]
    lines.append(table(["documents in MongoDB", "refilled", "refill of 256: ms (median)",
                        "of which the read: ms", "MongoDB commands per refilled request",
                        "commands"], rows))
    if run.get("stopped"):
        lines.append(f"spill: {run['stopped']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
