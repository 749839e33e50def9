"""Benchmark: the frontier's capacity without HTTP — today's frontier vs the per-host one.

Simulated crawler nodes (``--nodes``, default 3; each a process with its own
synchronous redis-py client) do to the frontier what a crawler node does, with
no download and no Scrapy. Each round a node takes a batch (``TAKE`` = 32),
"processes" every entry at once, adds the ``LINKS`` = 5 links found on each page
and acknowledges the processed entries, all in the same SYNC call; every
``HEARTBEAT`` = 2 s the call also does maintenance (lease renewal, reclaim), as
the scheduler does. A link is a URL seen before (a seed or one the node added
earlier) with probability ``DUP_SHARE`` = 0.8, else a new URL, so on average one
new URL per page keeps the frontier's size steady: seeded with a few thousand
URLs, it never runs dry. Payloads are ~200 bytes of JSON
(``{"url": "http://host123.example/p/4567", "callback": "parse_page", ...}``),
fingerprints 20-byte SHA1s, sites ``HOSTS`` = 500 (the politeness key is the
host). Each run: every node seeds its share, then all start together; a
warm-up, then the measured window.

Configurations, all in the same run, interleaved (order reversed every other
repetition):

1. ``baseline`` — the frontier before per-host queues, commit ``5440a15`` (one global priority queue
   per spider, its own SYNC layout), single Redis;
2. ``new_p1`` — the per-host frontier of this branch, ``partitions=1``, single
   Redis, politeness off (no interval, no concurrency limit: the frontier is
   measured, not politeness). Each processed entry is reported ``fetched`` and
   acknowledged in the same call, as the scheduler does (it reports every
   download's end);
3. ``new_p12`` — the same with ``partitions=12`` on a 3-master Redis Cluster
   (:class:`devtools.services.RedisCluster`, redis-py ``RedisCluster``).
   A node groups its adds and acks by partition (``partition_of(host, 12)``),
   spreads its take over the partitions that reported queued work (as
   ``SyncLoop._plan_takes`` does) and calls ``Frontier.sync`` of every
   partition that has work, one after the other. (``FrontierClient`` calls them
   concurrently: a round here is up to 12 round trips in a row, so this
   configuration's pages/s is a lower bound; its point is how the load spreads.)
   The Bloom capacity is split over the partitions, as the scheduler does.

**Loading the baseline.** ``git archive <ref> crawlproject`` (``--baseline-ref``,
default ``bench.common.BASELINE_REF``) is unpacked into a temporary directory; the baseline's node
processes run with that directory as their working directory and first on
``PYTHONPATH`` (``python -m`` puts the working directory first on ``sys.path``),
so ``import crawlproject`` finds the baseline's package while ``bench`` comes from this
checkout. Each node reports the package it imported; a run fails if it is not
the expected one. The checkout's own package is never touched.

**The baseline with this checkout's Bloom argument change.** Since 2026-12-04 the
Bloom filter passes BITFIELD's value as the string ``'1'`` (Redis formats every
number a script passes with ``%.17g``), which makes the check-and-add, most of
a call, cheaper for the new frontier only. To see what the per-host parts cost
apart from that, give the old frontier the same change
(``bench/baseline_bloom_value.patch``, one line) and name that commit::

    git worktree add --detach /tmp/base-wt 5440a15
    git -C /tmp/base-wt apply "$PWD/bench/baseline_bloom_value.patch"
    git -C /tmp/base-wt -c user.name=bench -c user.email=bench@localhost commit -qam bloom
    python -m bench.frontier_capacity --only baseline,new_p1 \
        --baseline-ref "$(git -C /tmp/base-wt rev-parse HEAD)"

Measured over the window, per run: pages/s (entries acknowledged by all nodes
÷ window); Redis CPU µs per page (``INFO cpu`` used_cpu_user + used_cpu_sys of
every server, delta ÷ pages); Redis commands per page (``INFO commandstats``:
every command, including those run inside Lua, minus the harness' INFO; delta
÷ pages) and script calls per page; on the cluster, each master's share of the
Redis CPU. Derived: the pages/s at which one Redis core (the busiest master)
would be saturated, 1e6 ÷ its CPU µs per page. Per command, calls and server
µs per page (commandstats ``usec``: wall time, so it includes any time Redis
was descheduled; a script's time includes the commands it runs, and the rest
of it, "Lua", is the interpreter's own work). Floors: new (partitions=1)
pages/s ÷ baseline ≥ 0.9; busiest master's share ≤ 0.45.

    python -m bench.frontier_capacity [--quick | --smallest] [--repeat N]
        [--nodes N] [--duration S] [--only baseline,new_p1,new_p12] [--baseline-ref REF]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis as redis_lib

from bench.common import (BASELINE_REF, HARNESS_COMMANDS, ROOT, export_baseline, BenchError, BenchRedis, CpuWatch, base_parser,
                          machine_busy_cpu, median, mode_of, node_env, ratio, rerun_disturbed,
                          table, undisturbed, finish, DISTURBED_CORES)
from crawlproject.keys import FrontierKeys
from devtools.services import RedisCluster

NAME = "frontier_capacity"
SPIDER = "capacity"
HOSTS = 500
LINKS = 5
DUP_SHARE = 0.8
TAKE = 32
HEARTBEAT = 2.0
LEASE_TTL = 10.0
#: DUPEFILTER_CAPACITY's default (split over partitions, as the scheduler does)
BLOOM_CAPACITY = 10_000_000
MAX_SEED_CALL = 1000
CLUSTER_MASTERS = 3
# mode -> measured seconds, warm-up seconds, repetitions, seeded URLs
MODES = {"full": (15.0, 2.0, 3, 20_000), "quick": (5.0, 1.0, 1, 8_000),
         "smallest": (1.5, 0.5, 1, 2_000)}
READY_TIMEOUT = 60.0
FLOOR_VS_BASELINE = 0.9
FLOOR_BUSIEST_SHARE = 0.45
SCRIPT_COMMANDS = ("evalsha", "eval", "eval_ro", "evalsha_ro", "fcall")


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    impl: str  # "baseline" (the --baseline-ref package) or "new" (this checkout)
    partitions: int
    cluster: bool


CONFIGS = [
    Config("baseline", "before per-host queues (5440a15): one global queue, single Redis", "baseline",
           1, False),
    Config("new_p1", "new frontier: per-host queues, partitions=1, single Redis", "new", 1, False),
    Config("new_p12", "new frontier: partitions=12, 3-master Redis Cluster", "new", 12, True),
]


# -- the simulated node (runs in its own process) ------------------------------
def host_of(url_id: int) -> str:
    return f"host{url_id % HOSTS}.example"


def url_of(url_id: int) -> str:
    return f"http://{host_of(url_id)}/p/{url_id}"


def payload_of(url_id: int, referer: str, depth: int) -> str:
    """A request as a node would queue it (~200 bytes of JSON)."""
    return json.dumps({"url": url_of(url_id), "callback": "parse_page", "priority": 0,
                       "meta": {"depth": depth, "link_text": f"Page {url_id}",
                                "download_timeout": 30},
                       "headers": {"Referer": referer}}, separators=(",", ":"))


class Links:
    """The links one node finds: a URL seen before (a seed or one this node
    added in an earlier call) with probability DUP_SHARE, else a new one."""

    def __init__(self, index: int, nodes: int, seeds: int):
        self.rng = random.Random(1000 + index)
        self.seeds = seeds
        self.own: list[int] = []
        self.pending: list[int] = []
        self.next_id, self.step = seeds + index, nodes

    def pick(self) -> int:
        if self.rng.random() < DUP_SHARE:
            i = self.rng.randrange(self.seeds + len(self.own))
            return i if i < self.seeds else self.own[i - self.seeds]
        url_id, self.next_id = self.next_id, self.next_id + self.step
        self.pending.append(url_id)
        return url_id

    def sent(self) -> None:
        self.own += self.pending
        self.pending = []


class Node:
    """One simulated node's frontier: one Frontier per partition, and the
    difference between the baseline's API and the new one in one place."""

    def __init__(self, spec: dict):
        import crawlproject
        from crawlproject.frontier.bloom import BloomConfig
        from crawlproject.frontier.queue import Batch, Frontier

        self.origin = str(Path(crawlproject.__file__).resolve().parent)
        self.new = spec["impl"] == "new"
        self.partitions = spec["partitions"]
        self.Batch = Batch
        url = spec["url"]
        self.client = (redis_lib.RedisCluster.from_url(url) if spec["cluster"]
                       else redis_lib.Redis.from_url(url))
        bloom = BloomConfig(capacity=max(1, BLOOM_CAPACITY // self.partitions))
        if not self.new:
            self.frontiers = [Frontier(self.client, SPIDER, spec["name"], lease_ttl=LEASE_TTL,
                                       bloom=bloom)]
            self.partition_of = lambda host: 0
            return
        from crawlproject.frontier.sitelimits import Limits, PolitenessConfig, partition_of

        politeness = PolitenessConfig(enabled=False, default=Limits(),
                                      partitions=self.partitions)
        self.frontiers = [Frontier(self.client, SPIDER, spec["name"], lease_ttl=LEASE_TTL,
                                   bloom=bloom, partition=p, partitions=self.partitions,
                                   politeness=politeness)
                          for p in range(self.partitions)]
        self.partition_of = lambda host: partition_of(host, self.partitions)

    def batches(self) -> list:
        return [self.Batch(maintenance=False, promote=False) for _ in self.frontiers]

    def add(self, batches: list, url_id: int, referer: str, depth: int) -> None:
        host = host_of(url_id)
        batch = batches[self.partition_of(host)]
        payload = payload_of(url_id, referer, depth)
        fp = hashlib.sha1(url_of(url_id).encode()).digest()
        if self.new:
            batch.add(payload, fp, key=host)
        else:
            batch.add(payload, fp)

    def done(self, batch, member: str) -> None:
        batch.acks.append(member)
        if self.new:
            batch.fetched.append(member)


def seed(node: Node, ids: range) -> None:
    """Queue *ids* (fingerprints included, so later links to them are duplicates)."""
    for start in range(ids.start, ids.stop, MAX_SEED_CALL * ids.step):
        batches = node.batches()
        for url_id in range(start, min(ids.stop, start + MAX_SEED_CALL * ids.step), ids.step):
            node.add(batches, url_id, "http://seeds.example/", 0)
        for frontier, batch in zip(node.frontiers, batches):
            if batch:
                frontier.sync(batch)


def run_node(spec: dict) -> dict:
    """The node's life: seed its share, say it is ready, wait for the start,
    run rounds until the window ends; count what finished inside the window."""
    node = Node(spec)
    if spec["expect_origin"] and node.origin != spec["expect_origin"]:
        raise BenchError(f"imported crawlproject from {node.origin}, "
                         f"expected {spec['expect_origin']}")
    seed(node, range(spec["index"], spec["seeds"], spec["nodes"]))
    Path(spec["ready"]).write_text(node.origin)
    go, deadline = Path(spec["go"]), time.monotonic() + READY_TIMEOUT
    while not go.exists():
        if time.monotonic() > deadline:
            raise BenchError("no start signal")
        time.sleep(0.005)
    times = json.loads(go.read_text())
    start, t1, t2 = times["start"], times["t1"], times["t2"]
    while time.time() < start:
        time.sleep(0.001)
    links = Links(spec["index"], spec["nodes"], spec["seeds"])
    queued = [1] * len(node.frontiers)  # unknown: assume work everywhere
    taken: list[tuple[int, str, bytes]] = []
    counts = dict(pages=0, calls=0, rounds=0, adds=0, added=0, duplicates=0, taken=0, stale=0,
                  call_s=0.0)
    next_maintenance, cpu = start, None
    while True:
        now = time.time()
        if now >= t2:
            break
        if cpu is None and now >= t1:
            cpu = time.process_time()
        batches = node.batches()
        for p, member, payload in taken:
            node.done(batches[p], member)
            request = json.loads(payload)
            depth = request["meta"]["depth"] + 1
            for _ in range(LINKS):
                node.add(batches, links.pick(), request["url"], depth)
        maintenance = now >= next_maintenance
        if maintenance:
            next_maintenance = now + HEARTBEAT
        ready = [p for p, q in enumerate(queued) if q > 0] or list(range(len(queued)))
        for p in ready:
            batches[p].take = -(-TAKE // len(ready))
        taken = []
        for p, (frontier, batch) in enumerate(zip(node.frontiers, batches)):
            if not (batch or maintenance):
                continue
            batch.maintenance = batch.promote = maintenance
            began = time.time()
            result = frontier.sync(batch)
            ended = time.time()
            queued[p] = result.queued
            taken += [(p, member, payload) for member, payload in result.taken]
            if t1 <= ended <= t2:
                counts["pages"] += len(batch.acks)
                counts["calls"] += 1
                counts["adds"] += len(batch.adds)
                counts["added"] += result.added
                counts["duplicates"] += result.duplicates
                counts["taken"] += len(result.taken)
                counts["stale"] += result.stale
                counts["call_s"] += ended - began
        links.sent()
        if t1 <= time.time() <= t2:
            counts["rounds"] += 1
    counts["cpu_s"] = time.process_time() - cpu if cpu is not None else 0.0
    counts["origin"] = node.origin
    return counts


# -- the harness -------------------------------------------------------------------
class Target:
    """The Redis servers of a configuration: one server, or a cluster's masters."""

    def __init__(self, url: str, servers: list, cluster=None):
        self.url = url
        self.servers = servers  # objects with host, port, pid
        self.cluster = cluster
        self.clients = [redis_lib.Redis(host=s.host, port=s.port, socket_timeout=30)
                        for s in servers]

    def pids(self) -> list[int]:
        return [s.pid for s in self.servers]

    def flush(self) -> None:
        for client in self.clients:
            client.flushall()

    def snapshot(self) -> list[dict]:
        """Per server: CPU seconds, {command: calls} and {command: usec} (INFO cpu,
        commandstats; a script's usec includes the commands it runs)."""
        out = []
        for client in self.clients:
            cpu = client.info("cpu")
            stats = client.info("commandstats")
            out.append({"cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                        "calls": {k.removeprefix("cmdstat_"): int(v["calls"])
                                  for k, v in stats.items()},
                        "usec": {k.removeprefix("cmdstat_"): int(v["usec"])
                                 for k, v in stats.items()}})
        return out

    def partition_map(self, partitions: int) -> list[int]:
        """For each partition, the index of the server that holds it."""
        if self.cluster is None:
            return [0] * partitions
        client = self.cluster.client()
        try:
            ports = [s.port for s in self.servers]
            keys = [FrontierKeys(SPIDER, p, partitions).ready for p in range(partitions)]
            return [ports.index(client.get_node_from_key(key).port) for key in keys]
        finally:
            client.close()

    def close(self) -> None:
        for client in self.clients:
            client.close()


def spawn_nodes(config: Config, target: Target, args, baseline_dir: Path, workdir: Path,
                seeds: int) -> list[tuple[subprocess.Popen, dict]]:
    env = node_env()
    cwd = ROOT
    expect = str((ROOT / "crawlproject").resolve())
    if config.impl == "baseline":
        env["PYTHONPATH"] = os.pathsep.join([str(baseline_dir), env["PYTHONPATH"]])
        cwd = baseline_dir
        expect = str((baseline_dir / "crawlproject").resolve())
    nodes = []
    for i in range(args.nodes):
        spec = {"impl": config.impl, "partitions": config.partitions, "cluster": config.cluster,
                "url": target.url, "name": f"{config.key}-{i}", "index": i, "nodes": args.nodes,
                "seeds": seeds, "expect_origin": expect,
                "ready": str(workdir / f"{config.key}-{i}.ready"), "go": str(workdir / "go"),
                "out": str(workdir / f"{config.key}-{i}.json")}
        log = open(workdir / f"{config.key}-{i}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "bench.frontier_capacity", "--node",
                                 json.dumps(spec)], cwd=cwd, env=env, stdout=log, stderr=log,
                                start_new_session=True)
        log.close()
        nodes.append((proc, spec))
    return nodes


def run_once(config: Config, target: Target, args, baseline_dir: Path, seconds: float,
             warmup: float, seeds: int) -> dict:
    """One measured run of *config*: fresh Redis, seeded, nodes started together."""
    target.flush()
    workdir = Path(tempfile.mkdtemp(prefix="bench-capacity-"))
    nodes = spawn_nodes(config, target, args, baseline_dir, workdir, seeds)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not all(Path(spec["ready"]).exists() for _, spec in nodes):
            for proc, spec in nodes:
                if proc.poll() is not None:
                    raise BenchError(f"{spec['name']} exited before starting:\n" + _tail(spec))
            if time.monotonic() > deadline:
                raise BenchError(f"nodes not ready in {READY_TIMEOUT}s")
            time.sleep(0.02)
        start = time.time() + 0.2
        t1, t2 = start + warmup, start + warmup + seconds
        (workdir / "go.tmp").write_text(json.dumps({"start": start, "t1": t1, "t2": t2}))
        (workdir / "go.tmp").rename(workdir / "go")
        watch = CpuWatch([*target.pids(), *(proc.pid for proc, _ in nodes)])
        time.sleep(max(0.0, t1 - time.time()))
        before, busy0, ours0 = target.snapshot(), machine_busy_cpu(), watch.total()
        time.sleep(max(0.0, t2 - time.time()))
        after, busy1, ours1 = target.snapshot(), machine_busy_cpu(), watch.total()
        reports = []
        for proc, spec in nodes:
            try:
                code = proc.wait(30)
            except subprocess.TimeoutExpired:
                raise BenchError(f"{spec['name']} did not stop:\n" + _tail(spec))
            if code != 0 or not Path(spec["out"]).exists():
                raise BenchError(f"{spec['name']} failed (exit {code}):\n" + _tail(spec))
            reports.append(json.loads(Path(spec["out"]).read_text()))
    finally:
        for proc, _ in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    run = figures(config, target, before, after, reports, seconds)
    run["external_cores"] = max(0.0, (busy1 - busy0) - (ours1 - ours0)) / seconds
    run["disturbed"] = run["external_cores"] > DISTURBED_CORES
    run["origin"] = reports[0]["origin"]
    return run


def _tail(spec: dict, lines: int = 20) -> str:
    path = Path(spec["out"]).with_suffix(".log")
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def figures(config: Config, target: Target, before, after, reports, seconds: float) -> dict:
    """Per-page figures of one run from the servers' deltas and the nodes' counts."""
    total = {k: sum(r[k] for r in reports) for k in reports[0] if k != "origin"}
    pages = total["pages"]
    if not pages:
        raise BenchError(f"{config.key}: no page acknowledged in the window")
    masters, commands, usec = [], {}, {}
    for b, a in zip(before, after):
        calls = {k: v - b["calls"].get(k, 0) for k, v in a["calls"].items()
                 if k.split("|")[0] not in HARNESS_COMMANDS and v - b["calls"].get(k, 0)}
        for k, v in calls.items():
            commands[k] = commands.get(k, 0) + v
            usec[k] = usec.get(k, 0) + a["usec"][k] - b["usec"].get(k, 0)
        masters.append({"cpu_s": a["cpu_s"] - b["cpu_s"], "commands": sum(calls.values()),
                        "script_calls": sum(calls.get(k, 0) for k in SCRIPT_COMMANDS)})
    cpu = sum(m["cpu_s"] for m in masters)
    scripts = sum(m["script_calls"] for m in masters)
    owner = target.partition_map(config.partitions)
    hosts = [0] * config.partitions
    if config.partitions > 1:
        from crawlproject.frontier.sitelimits import partition_of

        for h in range(HOSTS):
            hosts[partition_of(host_of(h), config.partitions)] += 1
    for i, m in enumerate(masters):
        m["port"] = target.servers[i].port
        m["cpu_share"] = m["cpu_s"] / cpu if cpu else None
        m["script_share"] = m["script_calls"] / scripts if scripts else None
        m["partitions"] = [p for p, o in enumerate(owner) if o == i]
        m["hosts"] = sum(hosts[p] for p in m["partitions"]) if config.partitions > 1 else HOSTS
        m["cpu_us_per_page"] = 1e6 * m["cpu_s"] / pages
    busiest = max(masters, key=lambda m: m["cpu_s"])
    scripts_us = sum(usec.get(k, 0) for k in SCRIPT_COMMANDS)
    return {
        "config": config.key, "seconds": seconds, "pages": pages, "pages_per_s": pages / seconds,
        "redis_cpu_us_per_page": 1e6 * cpu / pages, "redis_cores": cpu / seconds,
        "commands_per_page": sum(commands.values()) / pages,
        "script_calls_per_page": sum(commands.get(k, 0) for k in SCRIPT_COMMANDS) / pages,
        "commands": {k: v / pages for k, v in sorted(commands.items(), key=lambda kv: -kv[1])},
        "command_us": {k: v / pages for k, v in sorted(usec.items(), key=lambda kv: -kv[1])},
        # time inside scripts not spent in the commands they run (Lua itself, ARGV parsing)
        "lua_us_per_page": (scripts_us - sum(v for k, v in usec.items()
                                             if k not in SCRIPT_COMMANDS)) / pages,
        "busiest_share": busiest["cpu_share"] if len(masters) > 1 else None,
        "saturation_pages_per_s": 1e6 / busiest["cpu_us_per_page"] if busiest["cpu_s"] else None,
        "masters": masters,
        "node_cpu_us_per_page": 1e6 * total["cpu_s"] / pages,
        "client_ms_per_call": 1000 * total["call_s"] / total["calls"] if total["calls"] else None,
        "calls_per_round": total["calls"] / total["rounds"] if total["rounds"] else None,
        "adds_per_page": total["adds"] / pages,
        "duplicate_share": total["duplicates"] / total["adds"] if total["adds"] else None,
        "stale": total["stale"],
    }


def summarize(runs: list[dict]) -> dict:
    used = undisturbed(runs)
    keys = ("pages_per_s", "redis_cpu_us_per_page", "redis_cores", "commands_per_page",
            "script_calls_per_page", "busiest_share", "saturation_pages_per_s",
            "node_cpu_us_per_page", "client_ms_per_call", "calls_per_round", "adds_per_page",
            "duplicate_share", "external_cores", "lua_us_per_page")
    out = {k: median([r[k] for r in used]) for k in keys}
    pages = sum(r["pages"] for r in used)
    for field in ("commands", "command_us"):
        totals: dict[str, float] = {}
        for r in used:  # over all runs used: the sum of their calls ÷ the sum of their pages
            for k, v in r[field].items():
                totals[k] = totals.get(k, 0.0) + v * r["pages"] / pages
        out[field] = dict(sorted(totals.items(), key=lambda kv: -kv[1]))
    masters = []
    for i, m in enumerate(used[0]["masters"]):
        masters.append({**{k: m[k] for k in ("port", "partitions", "hosts")},
                        **{k: median([r["masters"][i][k] for r in used])
                           for k in ("cpu_share", "script_share")}})
    out["masters"] = masters
    out["runs"], out["runs_used"] = len(runs), len(used)
    out["stale"] = sum(r["stale"] for r in runs)
    return out


def checks_for(summary: dict, baseline_ref: str = BASELINE_REF) -> list[dict]:
    checks = []
    if "baseline" in summary and "new_p1" in summary:
        value = ratio(summary["new_p1"]["pages_per_s"], summary["baseline"]["pages_per_s"])
        checks.append({"check": f"new (partitions=1) pages/s ÷ baseline ({baseline_ref}), single Redis",
                       "value": value, "floor": f"≥ {FLOOR_VS_BASELINE}",
                       "pass": value is not None and value >= FLOOR_VS_BASELINE})
    if "new_p12" in summary:
        value = summary["new_p12"]["busiest_share"]
        checks.append({"check": "busiest master's share of Redis CPU (partitions=12, 3 masters)",
                       "value": value, "floor": f"≤ {FLOOR_BUSIEST_SHARE}",
                       "pass": value is not None and value <= FLOOR_BUSIEST_SHARE})
    return checks


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--node"]:
        spec = json.loads(argv[1])
        Path(spec["out"]).write_text(json.dumps(run_node(spec)))
        return {}
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="simulated nodes (processes)")
    parser.add_argument("--duration", type=float, default=None, help="measured seconds per run")
    parser.add_argument("--only", default="", help=f"subset of {[c.key for c in CONFIGS]}")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="git ref of today's frontier")
    args = parser.parse_args(argv)
    mode = mode_of(args)
    seconds, warmup, repeat, seeds = MODES[mode]
    seconds = args.duration or seconds
    repeat = args.repeat or repeat
    configs = [c for c in CONFIGS if not args.only or c.key in args.only.split(",")]
    runs: dict[str, list] = {c.key: [] for c in configs}
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-capacity-")))
        baseline_commit = export_baseline(args.baseline_ref, tmp)
        targets = {}
        if any(not c.cluster for c in configs):
            single = stack.enter_context(BenchRedis())
            targets[False] = Target(single.url, [single.server])
            stack.callback(targets[False].close)
        if any(c.cluster for c in configs):
            cluster = stack.enter_context(RedisCluster(masters=CLUSTER_MASTERS))
            targets[True] = Target(cluster.url, cluster.nodes, cluster)
            stack.callback(targets[True].close)
        by_key = {c.key: c for c in configs}

        def one(key: str) -> dict:
            config = by_key[key]
            run = run_once(config, targets[config.cluster], args, tmp, seconds, warmup, seeds)
            print(f"  {key}: {run['pages_per_s']:,.0f} pages/s, Redis "
                  f"{run['redis_cpu_us_per_page']:.1f} µs/page ({run['redis_cores']:.2f} cores), "
                  f"{run['commands_per_page']:.2f} commands/page, "
                  f"{run['script_calls_per_page']:.3f} scripts/page"
                  + (f", busiest master {run['busiest_share']:.2f}" if run["busiest_share"] else "")
                  + f", other programs {run['external_cores']:.2f} cores", flush=True)
            return run

        for rep in range(repeat):
            for config in configs if rep % 2 == 0 else configs[::-1]:
                runs[config.key].append(one(config.key))
        if mode == "full":
            rerun_disturbed(runs, one, wanted=min(2, repeat), max_extra=2 * len(configs),
                            max_seconds=120)
    summary = {key: summarize(rs) for key, rs in runs.items()}
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    data = {"mode": mode, "repeat": repeat, "seconds": seconds, "warmup_s": warmup,
            "nodes": args.nodes, "hosts": HOSTS, "links_per_page": LINKS,
            "duplicate_share": DUP_SHARE, "take": TAKE, "seeds": seeds,
            "baseline": {"ref": args.baseline_ref, "commit": baseline_commit}, "new_commit": head,
            "labels": {c.key: c.label for c in configs}, "summary": summary,
            "checks": checks_for(summary, args.baseline_ref[:12]), "runs": runs, "duration_s": time.monotonic() - t0}
    return finish(NAME, data, args.out, render)


def commands_table(summary: dict, count: int = 14) -> str:
    """Calls and server µs per page of the busiest commands (script calls
    include the commands they run; "Lua" is the scripts' time outside them)."""
    ranked = sorted({cmd for s in summary.values() for cmd in s["commands"]},
                    key=lambda cmd: -max(s["command_us"].get(cmd, 0.0) for s in summary.values()))
    rows = [[cmd, *(x for s in summary.values()
                    for x in (s["commands"].get(cmd, 0.0), s["command_us"].get(cmd, 0.0)))]
            for cmd in ranked[:count]]
    rows.append(["(Lua, outside its commands)",
                 *(x for s in summary.values() for x in ("", s["lua_us_per_page"]))])
    rows.append(["all commands",
                 *(x for s in summary.values()
                   for x in (s["commands_per_page"], s["redis_cpu_us_per_page"]))])
    headers = ["command"] + [f"{key} {what}" for key in summary
                             for what in ("calls/page", "µs/page")]
    return table(headers, rows)


def render(data: dict) -> str:
    summary = data["summary"]
    rows = []
    for key, s in summary.items():
        rows.append([data["labels"][key], f"{s['runs_used']}/{s['runs']}", s["pages_per_s"],
                     s["redis_cpu_us_per_page"], s["redis_cores"], s["commands_per_page"],
                     s["script_calls_per_page"], s["saturation_pages_per_s"],
                     s["node_cpu_us_per_page"], s["client_ms_per_call"], s["duplicate_share"]])
    out = table(["configuration", "runs used", "pages/s", "Redis CPU µs/page", "Redis cores",
                 "commands/page", "script calls/page", "pages/s at 1 busy core (derived)",
                 "node CPU µs/page", "client ms/call", "duplicate share"], rows)
    if "new_p12" in summary:
        rows = [[m["port"], ",".join(map(str, m["partitions"])), m["hosts"], m["cpu_share"],
                 m["script_share"]] for m in summary["new_p12"]["masters"]]
        out += "\n\n" + table(["master (port)", "partitions", "hosts", "share of Redis CPU",
                               "share of script calls"], rows)
    out += "\n\n" + commands_table(summary)
    out += "\n\n" + table(["floor check", "value", "floor", "result"],
                          [[c["check"], c["value"], c["floor"], c["pass"]] for c in data["checks"]])
    return out


if __name__ == "__main__":
    main()
