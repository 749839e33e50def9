"""Shared machinery of the benchmarks: servers, crawler nodes, RSS sampling,
Redis command statistics, result files and tables.

Everything runs on this machine and talks to 127.0.0.1 only; every wait is
bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import io
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import psutil
import redis as redis_lib

from devtools.services import RedisServer

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"

SPIDERS = {"ours": "bench_ours", "ours-old": "bench_ours", "ours-shipped": "bench_ours",
           "ours-capped": "bench_ours", "scrapy-redis": "bench_scrapy_redis",
           "plain": "bench_plain", "plain-tuned": "bench_plain", "plain-capped": "bench_plain"}
# The frontier before the per-host one (issue 8): one global queue, per-process politeness.
BASELINE_REF = "5440a15"
LABELS = {"ours": "ours (RedisScheduler)", "ours-old": f"ours before per-host queues ({BASELINE_REF})",
          "ours-shipped": "ours with the project's CONCURRENT_ITEMS and GC freeze",
          "scrapy-redis": "scrapy-redis 0.9.1",
          "plain": "plain Scrapy",
          "plain-tuned": "plain Scrapy with the same CONCURRENT_ITEMS and GC freeze",
          "ours-capped": "ours, a per-host limit that binds (cluster-wide)",
          "plain-capped": "plain Scrapy, a per-host limit that binds (per process)"}
# Redis commands the harness itself sends (not the crawl's).
HARNESS_COMMANDS = {"config", "info", "flushall", "slowlog", "memory", "dbsize", "ping"}


class BenchError(RuntimeError):
    pass


def machine_info() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_avg_at_start": os.getloadavg(),
            "mem_total_gb": round(psutil.virtual_memory().total / 2**30, 1)}


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smoke mode (small, 1 repetition)")
    parser.add_argument("--smallest", action="store_true",
                        help="tiniest mode (the test suite's smoke test)")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions per configuration")
    parser.add_argument("--out", type=Path, default=None, help="JSON result path")
    return parser


def mode_of(args) -> str:
    return "smallest" if args.smallest else "quick" if args.quick else "full"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# -- Redis ----------------------------------------------------------------------
class BenchRedis:
    """A private redis-server for one benchmark (no persistence)."""

    def __init__(self, modules=(), executable=None):
        self.dir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
        self.server = RedisServer(data_dir=self.dir, modules=modules, executable=executable)
        self.client: redis_lib.Redis | None = None

    def __enter__(self) -> "BenchRedis":
        self.server.start()
        self.client = redis_lib.Redis.from_url(self.server.url, socket_timeout=120)
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return self.server.url

    def reset(self) -> None:
        """Empty every key, then zero INFO commandstats and the SLOWLOG."""
        self.client.flushall()
        self.client.slowlog_reset()
        self.client.config_resetstat()

    def commandstats(self) -> dict[str, dict]:
        """{command: {calls, usec}} from INFO commandstats (Lua-internal calls
        included: Redis counts every command a script runs)."""
        raw = self.client.info("commandstats")
        out = {}
        for key, value in raw.items():
            name = key[len("cmdstat_"):] if key.startswith("cmdstat_") else key
            out[name] = {"calls": int(value["calls"]), "usec": int(value["usec"])}
        return out


def crawl_commands(stats: dict[str, dict]) -> dict[str, dict]:
    """Commandstats without the harness' own commands."""
    return {k: v for k, v in stats.items()
            if k.split("|")[0] not in HARNESS_COMMANDS}


# -- CPU accounting (to see other programs competing for the 2 cores) ------------
DISTURBED_CORES = 0.25  # CPU used by programs outside the benchmark during a run


def machine_busy_cpu() -> float:
    """CPU seconds the whole machine has been busy (all cores)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


class CpuWatch:
    """CPU seconds of a set of processes (dead ones keep their last value)."""

    def __init__(self, pids=()):
        self.procs = {}
        self.last = {}
        for pid in [os.getpid(), *pids]:
            self.add(pid)

    def add(self, pid) -> None:
        if pid is None:
            return
        try:
            self.procs[pid] = psutil.Process(pid)
        except psutil.Error:
            pass

    def total(self) -> float:
        for pid, proc in self.procs.items():
            try:
                t = proc.cpu_times()
                self.last[pid] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return sum(self.last.values())


def external_cores(samples, start: float | None, end: float | None) -> float | None:
    """Average cores used outside the benchmark's processes between start and end,
    from samples [(ts, machine_busy, ours)]."""
    if not samples or start is None or end is None or end <= start:
        return None
    inside = [s for s in samples if start <= s[0] <= end]
    before = [s for s in samples if s[0] <= start]
    after = [s for s in samples if s[0] >= end]
    a = before[-1] if before else (inside[0] if inside else samples[0])
    b = after[0] if after else (inside[-1] if inside else samples[-1])
    if b[0] - a[0] <= 0:
        return None
    return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / (b[0] - a[0]))


# -- crawler nodes --------------------------------------------------------------
def export_baseline(ref: str, into: Path) -> str:
    """Unpack *ref*'s ``crawlproject/`` into *into*; return the commit."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    data = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "crawlproject"],
                          capture_output=True, check=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return commit


_baselines: dict[str, tuple[Path, str]] = {}


def baseline_available(ref: str = BASELINE_REF) -> bool:
    """Whether this checkout holds *ref* (a shallow clone may not)."""
    try:
        subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                        f"{ref}^{{commit}}"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def baseline_package(ref: str = BASELINE_REF) -> tuple[Path, str]:
    """A directory holding *ref*'s package (exported once per process) and its commit."""
    if ref not in _baselines:
        into = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
        _baselines[ref] = (into, export_baseline(ref, into))
    return _baselines[ref]


def node_env(redis_url: str | None = None, first: Path | None = None,
             settings_module: str = "bench.settings") -> dict:
    """Environment of a node; *first* goes before this checkout on the path."""
    env = dict(os.environ)
    env["SCRAPY_SETTINGS_MODULE"] = settings_module
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(first) if first else None, str(ROOT),
                                                      env.get("PYTHONPATH")]))
    env.pop("SCRAPY_PROJECT", None)
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


class Node:
    """One ``python -m scrapy crawl`` process with a record file (bench.recorder)."""

    def __init__(self, system: str, workdir: Path, index: int, redis_url: str | None,
                 settings: dict | None = None, spider_args: dict | None = None,
                 spider: str | None = None, settings_module: str = "bench.settings"):
        self.system = system
        self.name = f"{system}-{index}"
        self.record_file = workdir / f"{self.name}.json"
        self.log_file = workdir / f"{self.name}.log"
        cmd = [sys.executable, "-m", "scrapy", "crawl", spider or SPIDERS[system],
               "-s", f"BENCH_RECORD_FILE={self.record_file}", "-s", f"LOG_FILE={self.log_file}",
               "-s", f"NODE_ID={self.name}"]
        profile_dir = os.environ.get("BENCH_PROFILE_DIR")
        if profile_dir:
            # Where a node's CPU goes (cProfile slows it: compare systems, not rates).
            cmd[1:1] = ["-m", "cProfile", "-o", str(Path(profile_dir) / f"{self.name}.prof")]
        all_settings = dict(settings or {})
        if redis_url:
            all_settings["REDIS_URL"] = redis_url
        for key, value in all_settings.items():
            cmd += ["-s", f"{key}={value}"]
        for key, value in (spider_args or {}).items():
            cmd += ["-a", f"{key}={value}"]
        # The old frontier's nodes import its package: run from its directory
        # (``python -m`` puts the working directory first on the path).
        first = baseline_package(BASELINE_REF)[0] if system == "ours-old" else None
        self.started = time.time()
        self.proc = subprocess.Popen(cmd, cwd=first or ROOT, env=node_env(redis_url, first, settings_module),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        # started once the spider is open: the samples cover the crawl, not imports
        self.spy: subprocess.Popen | None = None
        self.rss: list[tuple[float, int]] = []
        self.cpu_s: float | None = None  # psutil: user + system CPU, last sample
        self.exited_at: float | None = None

    def _sample_stacks(self) -> subprocess.Popen | None:
        """With ``BENCH_PYSPY`` (the path of a py-spy binary: not a project
        dependency), sample the node's on-CPU stacks into
        ``bench/results/stacks/<name>-<pid>.stacks`` (``python -m bench.stacks``
        sums them), from the moment the spider is open (start-up imports are
        not the crawl's cost). Unlike cProfile it barely slows the node and counts CPU,
        not the time a preempted function waits."""
        spy = os.environ.get("BENCH_PYSPY")
        if not spy:
            return None
        out = RESULTS_DIR / "stacks" / f"{self.name}-{self.proc.pid}.stacks"
        out.parent.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([spy, "record", "--pid", str(self.proc.pid), "--rate", "500",
                                 "--nonblocking", "--format", "raw", "--output", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def ready(self) -> bool:
        ready = Path(str(self.record_file) + ".ready").exists()
        if ready and self.spy is None:
            self.spy = self._sample_stacks()
        return ready

    def sample(self) -> None:
        if self.proc.poll() is not None:
            if self.exited_at is None:
                self.exited_at = time.time()
            return
        try:
            rss = self.ps.memory_info().rss
            times = self.ps.cpu_times()
        except psutil.Error:
            return
        if rss:
            self.cpu_s = times.user + times.system
        if rss:  # an exiting (zombie) process reports 0: not a reading
            self.rss.append((time.time(), rss))

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)

    def record(self) -> dict:
        if not self.record_file.exists():
            raise BenchError(f"{self.name} wrote no record (exit {self.proc.returncode}):\n"
                             + self.tail())
        return json.loads(self.record_file.read_text())

    def tail(self, lines: int = 30) -> str:
        if not self.log_file.exists():
            return "(no log)"
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def errors(self) -> list[str]:
        if not self.log_file.exists():
            return []
        return [line for line in self.log_file.read_text(errors="replace").splitlines()
                if "] ERROR:" in line or line.startswith("Traceback")]


def run_nodes(system: str, count: int, *, redis_url: str | None, settings: dict | None = None,
              spider_args: dict | None = None, push=None, timeout: float = 300,
              rss_interval: float = 0.1, ready_timeout: float = 60, watch_pids=(),
              spider: str | None = None, settings_module: str = "bench.settings") -> dict:
    """Run *count* nodes until they all exit; *push()* is called once every
    node has opened its spider. *spider* replaces the system's usual spider
    (one of the same system); *settings_module* the nodes' Scrapy settings
    (``bench.readme_settings``: the README block). Returns timing, pages and RSS per node. With
    ``BENCH_KEEP_WORKDIR=1`` in the environment the nodes' logs and record
    files stay in their ``/tmp/bench-<system>-*`` directory."""
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-{system}-"))
    settings = dict(settings or {})
    if system == "scrapy-redis" and count > 1:
        settings.setdefault("MAX_IDLE_TIME_BEFORE_CLOSE", 5)
    if system.startswith("ours") and count == 1:
        settings.setdefault("MAX_IDLE_TIME_BEFORE_CLOSE", 1)
    nodes = [Node(system, workdir, i + 1, redis_url, settings, spider_args, spider,
                  settings_module) for i in range(count)]
    stop = threading.Event()
    watch = CpuWatch(list(watch_pids) + [n.proc.pid for n in nodes])
    cpu_samples: list[tuple[float, float, float]] = []

    def sampler():
        while not stop.is_set():
            for node in nodes:
                node.sample()
            cpu_samples.append((time.time(), machine_busy_cpu(), watch.total()))
            stop.wait(rss_interval)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    launched = time.time()
    try:
        deadline = time.monotonic() + ready_timeout
        while not all(n.ready for n in nodes):
            for n in nodes:
                if n.proc.poll() is not None and not n.ready:
                    raise BenchError(f"{n.name} exited before opening its spider:\n{n.tail()}")
            if time.monotonic() > deadline:
                raise BenchError(f"nodes not ready in {ready_timeout}s")
            time.sleep(0.05)
        pushed_at = time.time()
        if push is not None:
            push()
        deadline = time.monotonic() + timeout
        for node in nodes:
            left = deadline - time.monotonic()
            try:
                node.proc.wait(max(0.1, left))
            except subprocess.TimeoutExpired:
                raise BenchError(f"{node.name} did not finish in {timeout}s:\n{node.tail()}")
    finally:
        stop.set()
        thread.join(5)
        for node in nodes:
            node.kill()
    records = [n.record() for n in nodes]
    errors = [e for n in nodes for e in n.errors()]
    firsts = [r["first_request"] for r in records if r["first_request"]]
    lasts = [r["last_response"] for r in records if r["last_response"]]
    pages = sum(r["responses"] for r in records)
    elapsed = (max(lasts) - min(firsts)) if firsts and lasts else None
    result = {
        "system": system, "nodes": count, "pages": pages,
        "items": sum(r["stats"].get("item_scraped_count", 0) for r in records),
        "elapsed_s": elapsed,
        "pages_per_s": pages / elapsed if elapsed else None,
        "launch_to_last_response_s": (max(lasts) - launched) if lasts else None,
        "push_to_last_response_s": (max(lasts) - pushed_at) if lasts else None,
        "cpu_ms_per_page": (1000 * sum(r.get("crawl_cpu_s") or 0 for r in records) / pages
                            if pages else None),
        "gc_ms_per_page": (1000 * sum(r.get("gc_cpu_s") or 0 for r in records) / pages
                           if pages else None),
        # downloads under way on average, summed over nodes (bench.recorder)
        "occupancy": (sum(r.get("occupancy") or 0 for r in records)
                      if all(r.get("occupancy") is not None for r in records) else None),
        "download_ms": median([r.get("download_ms") for r in records]),
        # one node: its ramp, steady rate and tail (bench.recorder.phases)
        "phases": records[0].get("phases") if len(records) == 1 else None,
        "loop_lag_ms": [r.get("loop_lag_ms") for r in records],
        "bunched_starts": median([r.get("bunched_starts") for r in records]),
        "priority_wait_ms": median([(r.get("priority_wait_ms") or {}).get("p50")
                                    for r in records]),
        # requests held in a node's memory at most (bench.recorder), and the
        # mean CPU ms of one full (generation 2) collection, which walks them
        "held_peak": max((r.get("held_peak") or 0 for r in records), default=None),
        # asyncio tasks alive and responses being scraped in one node at most
        # (sampled once a second): what every collection of that node walks
        "tasks_peak": max((r.get("tasks_peak") or 0 for r in records), default=None),
        "scraping_peak": max((r.get("scraping_peak") or 0 for r in records), default=None),
        "full_gc_ms": median([1000 * g[2][1] / g[2][0] for g in
                              (r.get("gc_by_generation") for r in records) if g and g[2][0]]),
        "per_node": [{"pages": r["responses"], "reason": r["reason"], "stats": r["stats"],
                      "crawl_cpu_s": r.get("crawl_cpu_s"),
                      # the whole process (start-up included), psutil's last sample
                      "process_cpu_s": n.cpu_s,
                      "connections": r.get("connections"),
                      "gc_by_generation": r.get("gc_by_generation"),
                      "gc_tracked": r.get("gc_tracked"),
                      **{k: r.get(k) for k in ("user_cpu_s", "sys_cpu_s", "idle_waits",
                                                 "preempted")},
                      "first_request": r["first_request"], "last_response": r["last_response"],
                      "closed_at": r["closed_at"],
                      "peak_rss_mb": (max((s for _, s in n.rss), default=0) / 2**20
                                      or (r.get("maxrss_kb") or 0) / 1024),
                      "progress": r["progress"], "rss": n.rss}
                     for n, r in zip(nodes, records)],
        "errors": errors[:10],
        "load_avg_after": os.getloadavg()[0],
        "external_cores": external_cores(cpu_samples, min(firsts) if firsts else None,
                                         max(lasts) if lasts else None),
        "exit_codes": [n.proc.returncode for n in nodes],
    }
    result["disturbed"] = (result["external_cores"] or 0) > DISTURBED_CORES
    if not os.environ.get("BENCH_KEEP_WORKDIR"):
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def other_programs_cores(seconds: float = 1.0) -> float:
    """Cores busy right now outside this process (nothing of ours running)."""
    me = CpuWatch()
    busy0, mine0 = machine_busy_cpu(), me.total()
    time.sleep(seconds)
    return max(0.0, (machine_busy_cpu() - busy0) - (me.total() - mine0)) / seconds


def wait_for_quiet(max_wait: float) -> float:
    """Wait (at most *max_wait* s) until other programs use < DISTURBED_CORES."""
    deadline = time.monotonic() + max_wait
    load = other_programs_cores()
    while load > DISTURBED_CORES and time.monotonic() < deadline:
        load = other_programs_cores()
    return load


def rerun_disturbed(runs: dict[str, list], run_fn, wanted: int, max_extra: int,
                    max_seconds: float) -> int:
    """Re-run configurations that have fewer than *wanted* undisturbed runs
    (other programs used > DISTURBED_CORES during the run), fewest first,
    after waiting a little for the machine to be quiet. Bounded in count and
    time; returns how many extra runs were made."""
    start, extra = time.monotonic(), 0
    clean = lambda key: sum(1 for r in runs[key] if not r.get("disturbed"))
    while extra < max_extra and time.monotonic() - start < max_seconds:
        short = [k for k in runs if clean(k) < wanted]
        if not short:
            break
        key = min(short, key=clean)
        load = wait_for_quiet(min(20.0, max(0.0, max_seconds - (time.monotonic() - start))))
        print(f"    re-running {key} (had {clean(key)} undisturbed run(s); other programs "
              f"now {load:.2f} cores)", flush=True)
        runs[key].append(run_fn(key))
        extra += 1
    return extra


def undisturbed(runs: list[dict]) -> list[dict]:
    """The runs not disturbed by other programs, or all when none was clean."""
    clean = [r for r in runs if not r.get("disturbed")]
    return clean or runs


def strip_series(run: dict) -> dict:
    """A run without its per-sample series (kept small in JSON)."""
    out = dict(run)
    out["per_node"] = [{k: v for k, v in n.items() if k not in ("progress", "rss")}
                       for n in run["per_node"]]
    return out


def results_dir(mode: str = "full") -> Path:
    """bench/results/ for full runs; bench/results/<mode>/ for smoke runs, so
    that a --quick run never replaces the figures BENCHMARKS.md is made from."""
    return RESULTS_DIR if mode == "full" else RESULTS_DIR / mode


def write_result(name: str, data: dict, out: Path | None = None) -> Path:
    path = out or results_dir(data.get("mode", "full")) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": machine_info(), **data}
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def finish(name: str, data: dict, out: Path | None, render) -> dict:
    """The end of every benchmark: write the result file, print the table, return *data*."""
    path = write_result(name, data, out)
    print(render(data))
    print(f"\nwritten {path} in {data['duration_s']:.0f}s")
    return data


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (also readable on a terminal)."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h))
              for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(str(v).ljust(w) for v, w in zip(vals, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in cells])


def fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "PASS" if value else "FAIL"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        if abs(value) >= 0.995:
            return f"{value:.2f}"
        if abs(value) >= 0.1:
            return f"{value:.3f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None
