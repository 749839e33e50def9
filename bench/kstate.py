"""Benchmark: the per-key state of a partition that has seen many hosts.

The state hash (``T:kstate``) has a field per politeness key ever seen. The
SYNC script used to read all of it in a sweep (``HKEYS`` and an ``HMGET`` of
every field: a sweep runs while a node holds nothing and others hold leases,
once per lease TTL); now a sweep recounts the keys with live leases plus a
window of the hash from an ``HSCAN`` cursor, and each maintenance call drops,
within a smaller window, the state of keys idle for days.

For each size N (``--keys``), in one private redis-server, interleaved per
repetition (order reversed every other one):

* the hash is filled with N states of keys that started a request a minute
  ago (nothing to drop), and one key has a live lease;
* ``incumbent`` (the SYNC script of ``--ref``, default the commit before the
  change, loaded with ``git show``) and ``ours`` (this checkout's) each make
  ``CALLS`` = 5 sweep calls, then ``MAINTENANCE_CALLS`` = 30 maintenance
  calls with nothing else in them, on a clock passed in that moves 0.2 s per
  call (so every paced window of ours is due). Measured: Redis server time
  per call (``INFO commandstats``, the script's ``usec``: it includes the
  commands it runs) and the longest call.

Then, ours only: N states idle for 4 days; how many maintenance calls (an idle
node makes one every ``SCHEDULER_IDLE_POLL`` = 0.2 s: the calls run on a clock
passed in that moves that much per call) drop them all, and the hash's memory
(``MEMORY USAGE``) before and after. The incumbent never drops
any (it has no such step).

    python -m bench.kstate [--quick | --smallest] [--repeat N] [--keys 10000,100000,1000000]
        [--ref REF] [--out PATH]
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

from bench.common import ROOT, BenchRedis, base_parser, finish, median, mode_of, table
from crawlproject.frontier.bloom import BloomConfig
from crawlproject.frontier.sitelimits import Limits, PolitenessConfig
from crawlproject.frontier.queue import Batch, Frontier
from crawlproject.frontier.scripts import SYNC

NAME = "kstate"
INCUMBENT_REF = "6215089"  # the last commit whose sweep read all of the state
CALLS = 5            # sweeps per run (the incumbent's take seconds at 1M keys)
MAINTENANCE_CALLS = 30
DAY_MS = 86_400_000


def incumbent_sync(ref: str) -> str:
    """The SYNC script of commit *ref* (its KEYS/ARGV contract is this one's)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:crawlproject/frontier/scripts.py"],
                            capture_output=True, text=True, check=True).stdout
    namespace: dict = {}
    exec(compile(source, f"{ref}:scripts.py", "exec"), namespace)  # string constants only
    return namespace["SYNC"]


def frontier(client, script: str, clock=None) -> Frontier:
    f = Frontier(client, "bench", "node-a", lease_ttl=10, clock=clock,
                 bloom=BloomConfig(capacity=100_000),
                 politeness=PolitenessConfig(default=Limits(0.0, 4)))
    f._sync = client.register_script(script)
    return f


def fill(client, key: str, n: int, last_ms: int) -> None:
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 10_000):
        pipe.hset(key, mapping={f"host{i}.example": f"0|{last_ms}|0|0|0"
                                for i in range(start, min(n, start + 10_000))})
    pipe.execute()


def server_now_ms(client) -> int:
    sec, usec = client.time()
    return sec * 1000 + usec // 1000


def script_usec(bench: BenchRedis) -> tuple[int, int]:
    stats = bench.commandstats()
    calls = sum(v["calls"] for k, v in stats.items() if k in ("evalsha", "eval"))
    usec = sum(v["usec"] for k, v in stats.items() if k in ("evalsha", "eval"))
    return calls, usec


def timed_calls(bench: BenchRedis, f: Frontier, batch_of, clock: dict, calls: int) -> dict:
    """*calls* calls of ``batch_of()``, 0.2 s apart on *clock*: server ms per
    call (mean), longest (ms)."""
    per_call = []
    for _ in range(calls):
        clock["ms"] += 200
        c0, u0 = script_usec(bench)
        f.sync(batch_of())
        c1, u1 = script_usec(bench)
        if c1 - c0 != 1:
            raise RuntimeError(f"expected one script call, Redis counted {c1 - c0}")
        per_call.append((u1 - u0) / 1000)
    return {"ms_per_call": sum(per_call) / len(per_call), "max_ms": max(per_call)}


def fresh(bench: BenchRedis) -> None:
    """Empty Redis and a new Lua interpreter: a sweep of the incumbent over a
    million keys leaves a heap that slows the next scripts run there."""
    bench.reset()
    bench.client.script_flush()


def one_run(bench: BenchRedis, script: str, n: int) -> dict:
    fresh(bench)
    client = bench.client
    clock = {"ms": server_now_ms(client)}     # 0.2 s per call: every tidy window is due
    f = frontier(client, script, clock=lambda: clock["ms"])
    fill(client, f.keys.kstate, n, clock["ms"] - 60_000)
    batch = Batch()
    url = "http://live.example/0"
    batch.add(json.dumps({"url": url}), hashlib.sha1(url.encode()).digest(), 0, 0, "live.example")
    f.sync(batch)
    assert len(f.take(1)) == 1                    # a live lease: sweeps recount it
    sweep = timed_calls(bench, f, lambda: Batch(sweep=True), clock, CALLS)
    tidy = timed_calls(bench, f, lambda: Batch(), clock, MAINTENANCE_CALLS)
    return {"sweep_ms": sweep["ms_per_call"], "sweep_max_ms": sweep["max_ms"],
            "maintenance_ms": tidy["ms_per_call"], "maintenance_max_ms": tidy["max_ms"],
            "fields": client.hlen(f.keys.kstate)}


def prune_run(bench: BenchRedis, n: int, max_calls: int) -> dict:
    fresh(bench)
    client = bench.client
    # The script paces its tidy windows (one per 100 ms per partition): the
    # calls run on a clock that moves 0.2 s per call, as an idle node polls.
    clock = {"ms": server_now_ms(client)}
    f = frontier(client, SYNC, clock=lambda: clock["ms"])
    fill(client, f.keys.kstate, n, clock["ms"] - 4 * DAY_MS)
    before = client.memory_usage(f.keys.kstate) or 0
    calls, longest = 0, 0.0

    def left() -> int:  # HLEN, not counts(): that reads every field
        own = sum(client.hexists(f.keys.kstate, name)
                  for name in ("||cursor", "||limits", "||qlen"))
        return client.hlen(f.keys.kstate) - own

    while calls < max_calls and left() > 0:
        u0 = script_usec(bench)[1]
        f.sync(Batch())
        longest = max(longest, (script_usec(bench)[1] - u0) / 1000)
        calls += 1
        clock["ms"] += 200
    return {"keys": n, "calls": calls, "left": left(), "longest_call_ms": longest,
            "memory_before_bytes": before,
            "memory_after_bytes": client.memory_usage(f.keys.kstate) or 0,
            "idle_node_seconds": round(calls * 0.2, 1)}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--keys", default=None, help="comma-separated state sizes")
    parser.add_argument("--ref", default=INCUMBENT_REF, help="git ref of the incumbent SYNC")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    mode = mode_of(args)
    sizes = ([int(x) for x in args.keys.split(",")] if args.keys else
             {"smallest": [2_000], "quick": [10_000, 100_000]}.get(mode, [10_000, 100_000, 1_000_000]))
    repeat = args.repeat or (1 if mode != "full" else 3)
    scripts = {"incumbent": incumbent_sync(args.ref), "ours": SYNC}
    t0 = time.monotonic()
    runs: dict = {f"{name}|{n}": [] for n in sizes for name in scripts}
    prunes = []
    with BenchRedis() as bench:
        for n in sizes:
            for rep in range(repeat):
                order = list(scripts) if rep % 2 == 0 else list(scripts)[::-1]
                for name in order:
                    run = one_run(bench, scripts[name], n)
                    runs[f"{name}|{n}"].append(run)
                    print(f"{name} {n:,} keys: sweep {run['sweep_ms']:.2f} ms "
                          f"(longest {run['sweep_max_ms']:.2f}), maintenance "
                          f"{run['maintenance_ms']:.2f} ms", flush=True)
            prunes.append(prune_run(bench, n, max_calls=4 * n // 150 + 50))
            print(f"ours drops {n:,} idle states in {prunes[-1]['calls']} calls", flush=True)
    summary = {}
    for key, rs in runs.items():
        summary[key] = {m: median([r[m] for r in rs]) for m in
                        ("sweep_ms", "sweep_max_ms", "maintenance_ms", "maintenance_max_ms")}
    ratios = [{"keys": n,
               "sweep": summary[f"ours|{n}"]["sweep_ms"] / summary[f"incumbent|{n}"]["sweep_ms"],
               "maintenance": (summary[f"ours|{n}"]["maintenance_ms"]
                               / summary[f"incumbent|{n}"]["maintenance_ms"])}
              for n in sizes]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    data = {"mode": mode, "repeat": repeat, "calls": CALLS,
            "maintenance_calls": MAINTENANCE_CALLS, "sizes": sizes,
            "incumbent": args.ref, "commit": commit, "summary": summary, "ratios": ratios,
            "prune": prunes, "runs": runs, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = []
    for n in data["sizes"]:
        inc, ours = data["summary"][f"incumbent|{n}"], data["summary"][f"ours|{n}"]
        ratio = next(r for r in data["ratios"] if r["keys"] == n)
        rows.append([n, inc["sweep_ms"], ours["sweep_ms"], ratio["sweep"], ours["sweep_max_ms"],
                     inc["maintenance_ms"], ours["maintenance_ms"], ratio["maintenance"]])
    out = table(["keys", "incumbent sweep ms", "ours sweep ms", "ours ÷ incumbent",
                 "ours longest sweep ms", "incumbent maintenance ms", "ours maintenance ms",
                 "ours ÷ incumbent"], rows)
    out += "\n\n" + table(
        ["idle keys", "maintenance calls to drop all", "left", "longest call ms",
         "idle node s (0.2 s poll)", "hash bytes before", "after"],
        [[p["keys"], p["calls"], p["left"], p["longest_call_ms"], p["idle_node_seconds"],
          p["memory_before_bytes"], p["memory_after_bytes"]] for p in data["prune"]])
    return out


if __name__ == "__main__":
    main()
