"""Run every benchmark, one after the other, and rewrite BENCHMARKS.md's figures.

    python -m bench.run_all            # full run (~15 min on 2 cores), rewrites BENCHMARKS.md
    python -m bench.run_all --quick    # smoke run (< 2 min); BENCHMARKS.md untouched unless --write
    python -m bench.run_all --only crawl,seeds
    python -m bench.summary --write    # re-render BENCHMARKS.md's summary (bench/figures.json + results)

Each benchmark runs as its own ``python -m bench.<name>`` process with a time
limit; results go to ``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

from bench import summary
from bench.common import ROOT, node_env, results_dir
from bench.report import BENCHMARKS, update_markdown

# Time limit per benchmark (s), full mode; quick mode uses a fifth.
LIMITS = {"crawl": 420, "commands": 150, "memory": 360, "dedupe": 300, "seeds": 300, "costs": 120,
          "projection": 30}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--write", action="store_true", help="rewrite BENCHMARKS.md in --quick mode too")
    parser.add_argument("--no-write", action="store_true", help="leave BENCHMARKS.md alone")
    args = parser.parse_args(argv)
    known = BENCHMARKS + ("projection",)
    names = [n for n in (args.only.split(",") if args.only else known) if n]
    unknown = set(names) - set(known)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    failed = []
    t0 = time.monotonic()
    for name in names:
        limit = LIMITS[name] / (5 if args.quick else 1) + 30
        cmd = [sys.executable, "-m", f"bench.{name}"] + (["--quick"] if args.quick else [])
        print(f"== {name} ({' '.join(cmd[1:])}, limit {limit:.0f}s)", flush=True)
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=node_env())
        try:
            code = proc.wait(limit)
        except subprocess.TimeoutExpired:
            # SIGINT first: the benchmark's finally blocks stop its servers and nodes.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = "timeout"
        print(f"== {name}: exit {code} in {time.monotonic() - start:.0f}s\n", flush=True)
        if code != 0:
            failed.append(name)
    if not args.no_write and (not args.quick or args.write):
        source = results_dir("quick" if args.quick else "full")
        print("blocks updated:", ", ".join(update_markdown(results_dir=source)))
        if not args.quick:  # a full run's figures are kept in git (bench/figures.json)
            summary.record(results_dir=source)
        summary.write(results_dir=source)
    print(f"total {time.monotonic() - t0:.0f}s; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
