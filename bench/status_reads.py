"""Benchmark: what an operator's look at a crawl of many hosts costs Redis.

``crawlctl status`` (and the dashboard, which reads the same every few seconds)
counts the crawl's hosts; ``crawlctl politeness SPIDER`` lists the most queued.
The incumbent (before 2026-12-04) counted with ``HKEYS`` of the state hash and
listed with ``HGETALL`` of it plus a ``ZCARD`` and a ``ZSCORE`` per host, one
round trip each. Ours counts with ``HLEN`` (less the bookkeeping fields) and
lists from ``HSCAN`` windows with pipelined lookups, keeping the top ``-n``.

For each size N (``--keys``), in one private redis-server, the state hash gets N
hosts (one queued entry each for every 100th). Measured per look, interleaved
(order reversed every other repetition): the longest single Redis command
(``INFO commandstats`` per command type: while it runs, every node's SYNC call
waits) and the look's wall time. The incumbent's listing is measured only up to
``LIST_MAX`` hosts (it makes two round trips a host).

    python -m bench.status_reads [--quick | --smallest] [--repeat N] [--keys 10000,1000000]
        [--out PATH]
"""

from __future__ import annotations

import time

from bench.common import BenchRedis, base_parser, finish, median, mode_of, table
from crawlproject.ops.hosts import politeness_rows
from crawlproject.frontier.queue import Frontier

NAME = "status_reads"
SIZES = {"full": [10_000, 100_000, 1_000_000], "quick": [10_000, 100_000], "smallest": [2_000]}
LIST_MAX = 100_000
SHOWN = 50


def fill(client, f: Frontier, n: int) -> None:
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 10_000):
        end = min(n, start + 10_000)
        pipe.hset(f.keys.kstate, mapping={f"host{i}.example": "0|0|0|0|0"
                                          for i in range(start, end)})
        for i in range(start, end, 100):
            pipe.zadd(f.keys.queue(f"host{i}.example"), {f"m{i}": 0})
        pipe.execute()
    client.hset(f.keys.kstate, mapping={"||qlen": n // 100, "||limits": 0})


def longest_us(bench: BenchRedis, before: dict) -> float:
    """The most microseconds one command took since *before* (per command type:
    a type's mean over the calls it made in between)."""
    worst = 0.0
    for name, now in bench.commandstats().items():
        old = before.get(name, {"calls": 0, "usec": 0})
        calls = now["calls"] - old["calls"]
        if calls:
            worst = max(worst, (now["usec"] - old["usec"]) / calls)
    return worst


def incumbent_count(f: Frontier) -> int:
    return sum(1 for k in f.client.hkeys(f.keys.kstate) if not k.startswith(b"|"))


def incumbent_list(f: Frontier) -> list:
    rows = {}
    for key, value in f.client.hgetall(f.keys.kstate).items():
        if key.startswith(b"|"):
            continue
        key = key.decode()
        rows[key] = {"state": value, "queued": f.client.zcard(f.keys.queue(key)),
                     "ready_at_ms": f.client.zscore(f.keys.ready, key)}
    return sorted(rows.items(), key=lambda kv: -kv[1]["queued"])[:SHOWN]


def measure(bench: BenchRedis, look) -> dict:
    before = bench.commandstats()
    t0 = time.perf_counter()
    value = look()
    wall = time.perf_counter() - t0
    return {"wall_ms": 1000 * wall, "longest_command_ms": longest_us(bench, before) / 1000,
            "value": value}


def main(argv=None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--keys", default=None, help="comma-separated host counts")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    sizes = [int(k) for k in args.keys.split(",")] if args.keys else SIZES[mode]
    repeat = args.repeat or (3 if mode == "full" else 1)
    t0 = time.monotonic()
    results = []
    with BenchRedis() as bench:
        for n in sizes:
            bench.reset()
            f = Frontier(bench.client, "bench", "cli")
            fill(bench.client, f, n)
            looks = {("count", "incumbent"): lambda: incumbent_count(f),
                     ("count", "ours"): f.host_count,
                     ("list", "ours"): lambda: len(politeness_rows([f], [], SHOWN)[0])}
            if n <= LIST_MAX:
                looks[("list", "incumbent")] = lambda: len(incumbent_list(f))
            runs: dict = {k: [] for k in looks}
            for rep in range(repeat):
                order = list(looks) if rep % 2 == 0 else list(reversed(looks))
                for key in order:
                    runs[key].append(measure(bench, looks[key]))
            for (look, system), samples in runs.items():
                values = {s["value"] for s in samples}
                expected = n if look == "count" else min(SHOWN, n)
                if values != {expected}:
                    raise RuntimeError(f"{system} {look} at {n} hosts gave {values}, "
                                       f"expected {expected}")
                results.append({"hosts": n, "look": look, "system": system,
                                "wall_ms": median([s["wall_ms"] for s in samples]),
                                "longest_command_ms": median([s["longest_command_ms"]
                                                              for s in samples])})
    data = {"mode": mode, "repeat": repeat, "results": results,
            "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def render(data: dict) -> str:
    rows = []
    by = {(r["hosts"], r["look"], r["system"]): r for r in data["results"]}
    for (n, look, system), r in sorted(by.items()):
        if system != "ours":
            continue
        old = by.get((n, look, "incumbent"))
        rows.append([f"{n:,}", {"count": "status: host count", "list": f"politeness: top {SHOWN}"}[look],
                     old["longest_command_ms"] if old else None, r["longest_command_ms"],
                     old["wall_ms"] if old else None, r["wall_ms"],
                     (old["longest_command_ms"] / r["longest_command_ms"])
                     if old and r["longest_command_ms"] else None])
    return table(["hosts", "look", "incumbent longest command ms", "ours longest command ms",
                  "incumbent wall ms", "ours wall ms", "incumbent ÷ ours (longest)"], rows)


if __name__ == "__main__":
    main()
