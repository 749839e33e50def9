"""Sum the on-CPU stacks py-spy sampled from benchmark nodes (``BENCH_PYSPY``).

    BENCH_PYSPY=/path/to/py-spy python -m bench.crawl --concurrency 16 \\
        --only 'ours|1|0,plain|1|0' --repeat 1
    python -m bench.stacks bench/results/stacks/ours-1-*.stacks \\
        bench/results/stacks/plain-1-*.stacks

For each file (one node's run): its samples (500 per CPU second), then where
they went: self samples by package or project module, and the samples spent
inside this project's code (inclusive: a frame of ``crawlproject/`` anywhere on
the stack, counted once per sample). Two systems that crawled the same pages
compare directly in samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def module_of(path: str) -> str:
    """A short name for where a frame's code lives."""
    if "crawlproject/" in path:
        return "crawlproject/" + path.split("crawlproject/", 1)[1]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0]
    if "/python3." in path:
        rest = path.split("/python3.", 1)[1].split("/", 1)
        return "stdlib:" + (rest[1].split("/", 1)[0] if len(rest) > 1 else rest[0])
    return path


def parse(path: Path):
    """Yield (frames outermost first, samples) from a py-spy raw file."""
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = []
        for part in stack.split(";")[1:]:  # the first is the thread
            m = FRAME.match(part)
            frames.append((m["func"], m["file"]) if m else (part, ""))
        yield frames, int(count)


def summarise(path: Path, top: int) -> dict:
    total, own = 0, 0
    by_module, by_function, inside = Counter(), Counter(), Counter()
    for frames, n in parse(path):
        total += n
        if not frames:
            continue
        func, file = frames[-1]
        by_module[module_of(file)] += n
        by_function[f"{func} ({module_of(file)})"] += n
        outer = next((f"{fn} ({module_of(fl)})" for fn, fl in frames if "crawlproject/" in fl),
                     None)
        if outer is not None:
            own += n
            inside[outer] += n
    return {"file": path.name, "samples": total, "in_project": own,
            "modules": by_module.most_common(top), "functions": by_function.most_common(top),
            "project_entries": inside.most_common(top)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    for path in args.files:
        s = summarise(path, args.top)
        print(f"\n== {s['file']}: {s['samples']} samples, {s['in_project']} inside crawlproject "
              f"({s['in_project'] / max(1, s['samples']):.1%})")
        for title, rows in (("self, by module", s["modules"]), ("self, by function", s["functions"]),
                            ("inclusive, by outermost project frame", s["project_entries"])):
            print(f"  {title}:")
            for name, n in rows:
                print(f"    {n:6d}  {name}")


if __name__ == "__main__":
    main()
