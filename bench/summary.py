"""The summary table at the top of BENCHMARKS.md, generated from bench/results/*.json.

``python -m bench.summary`` prints it; ``--write`` replaces the text between
``<!-- summary:start -->`` and ``<!-- summary:end -->`` in BENCHMARKS.md. One row per
floor check of every benchmark that has a result file (the figure, its floor and
PASS/FAIL, the command, the day it was measured); a benchmark without one gets a row
"not measured since <date>" with its command and the last figure BENCHMARKS.md keeps.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import RESULTS_DIR, ROOT, fmt

MARKDOWN = ROOT / "BENCHMARKS.md"
START, END = "<!-- summary:start -->", "<!-- summary:end -->"


@dataclass(frozen=True)
class Section:
    title: str      # the section of BENCHMARKS.md, as "§N name"
    pattern: str | None  # result file(s) in bench/results/, the newest by name; None: a
                         # figure no benchmark module writes
    command: str
    since: str      # when the figure BENCHMARKS.md keeps was measured ("": never)
    last: str       # that figure, shown while no result file exists


SECTIONS = (
    Section("§1 crawl", "crawl.json", "python -m bench.crawl", "2026-12-04",
            "CR=64: ours ÷ scrapy-redis 1.64 (1 node), 1.83 (2) at 0 ms; ÷ plain 1.07"),
    Section("§2 Redis commands", "commands.json", "python -m bench.commands", "2026-12-04",
            "from bench.crawl (§8): 1.56–1.68 (0 ms), 2.09–2.36 (50 ms) a page; floor ≤ 3"),
    Section("§3 memory", "memory.json", "python -m bench.memory", "2026-11-30",
            "stale (before the per-host frontier)"),
    Section("§4 dedupe", "dedupe.json", "python -m bench.dedupe", "2026-11-30",
            "stale (before the per-host frontier)"),
    Section("§5 seed file", None, "python -m crawlproject.cli seed products --file seeds.txt",
            "2026-12-05", "1,000,000 URLs in 28.1 s (≈ 36,000 seeds/s)"),
    Section("§5 seeds crawled", "seeds.json", "python -m bench.seeds", "2026-11-30",
            "stale (before the per-host frontier)"),
    Section("§6 frontier capacity", "frontier_capacity.json",
            "python -m bench.frontier_capacity --repeat 6", "2026-12-04",
            "partitions=1 ÷ old frontier 1.09 (floor ≥ 0.9); busiest master 0.408 (≤ 0.45)"),
    Section("§7 polite crawl", "polite.json", "python -m bench.polite", "2026-12-06",
            "per-host peak ÷ limit 1.00 (≤ 1.05), time ÷ ideal 1.106–1.108 (≤ 1.15), "
            "--quick --only ours --repeat 3"),
    Section("§8 one node, CR=16", "crawl_cr16.json",
            "python -m bench.crawl --concurrency 16 --products 5000 "
            "--only 'ours|1|0,plain|1|0,ours|1|50,plain|1|50' --repeat 4 "
            "--out bench/results/crawl_cr16.json", "2026-12-04",
            "ours ÷ plain 1.04 at 0 ms (≥ 0.95), 1.01 at 50 ms (≥ 1.0)"),
    Section("§9 middlewares", "middlewares.json", "python -m bench.middlewares", "2026-12-01",
            "CPU on ÷ off 1.10 (≤ 1.15); banned ÷ no bans 1.01 (≥ 0.6)"),
    Section("§10 incremental recrawl", "recrawl.json", "python -m bench.recrawl", "2026-12-01",
            "full ÷ incremental bytes 5.53 (1 KiB pages), 121 (21 KiB); floor ≥ 5"),
    Section("§11 per-key state", "kstate.json", "python -m bench.kstate", "2026-12-02",
            "sweep at 1,000,000 hosts 6.18 ms ÷ incumbent 6,256 ms = 0.00099"),
    Section("§11 operator reads", "status_reads.json", "python -m bench.status_reads",
            "2026-12-04", "`status` at 1,000,000 hosts: longest command 0.016 ms (was 279)"),
    Section("§12 proxy REFRESH", "proxy_refresh.json", "python -m bench.proxy_refresh",
            "2026-12-05", "20,000 bans, 10 proxies: 0.091 ms of Redis a REFRESH (was ≈ 14)"),
    Section("§13 fault soak", "soak-*.json", "python -m bench.soak --duration 600",
            "2026-12-05", "22,500/22,500 stored once, 0 dead letters, 17 faults"),
    Section("§14 frontier costs", "costs.json", "python -m bench.costs", "2026-11-30",
            "stale (before the per-host frontier)"),
    Section("backoff (issue 38)", "backoff.json", "python -m bench.backoff", "", "–"),
    Section("whole product (issue 38)", "product.json", "python -m bench.product", "", "–"),
    Section("§15 impersonation", "impersonate.json", "python -m bench.impersonate", "", "–"),
    Section("synthetic web (issue 46)", "web.json", "python -m bench.web", "", "–"),
)

HEADERS = ["benchmark", "figure", "value", "floor", "result", "command", "measured"]


def newest(section: Section, results_dir: Path) -> Path | None:
    if section.pattern is None:
        return None
    paths = sorted(p for p in results_dir.glob(section.pattern) if p.is_file())
    return paths[-1] if paths else None


def measured(data: dict, path: Path) -> str:
    created = data.get("created")
    if created:
        return str(created)[:16]
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))


def floor_text(check: dict) -> str:
    floor = check.get("floor")
    if isinstance(floor, str):
        return floor
    return f"≥ {floor}"  # bench.crawl and bench.recrawl keep the number of a lower bound


def check_rows(data: dict) -> list[list]:
    """One row per floor check (figures only reported are in the sections); the soak's one
    check is whether every page was stored once."""
    checks = [c for c in data.get("checks", []) if c.get("floor") is not None]
    if checks:
        return [[c["check"], c.get("ratio", c.get("value")), floor_text(c), c.get("pass")]
                for c in checks]
    if data.get("benchmark") == "soak" and "check" in data:
        c = data["check"]
        ok = c.get("missing") == 0 and c.get("duplicated") == 0 and c.get("dead_letters") == 0
        return [[f"pages stored once ÷ expected ({len(data.get('faults', []))} faults)",
                 f"{fmt(c.get('stored_once'))}/{fmt(c.get('expected_products'))}",
                 "0 missing, 0 duplicated, 0 dead", ok]]
    return [["(no floor check: see its section)", "-", "-", "-"]]


def rows(results_dir: Path = RESULTS_DIR) -> list[list]:
    out = []
    for section in SECTIONS:
        path = newest(section, results_dir)
        data = json.loads(path.read_text()) if path else None
        if data is None:
            status = f"not measured since {section.since}" if section.since else "not measured yet"
            out.append([section.title, section.last, status, "", "", f"`{section.command}`",
                        section.since or "–"])
            continue
        command = data.get("command") or section.command
        for figure, value, floor, result in check_rows(data):
            out.append([section.title, figure, value, floor, result, f"`{command}`",
                        measured(data, path)])
    return out


def render(results_dir: Path = RESULTS_DIR) -> str:
    cells = [[fmt(c).replace("|", "\\|") if not isinstance(c, str) else c.replace("|", "\\|")
              for c in row] for row in rows(results_dir)]
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def write(markdown: Path = MARKDOWN, results_dir: Path = RESULTS_DIR) -> None:
    text = markdown.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{markdown}: no {START} … {END} markers")
    body = START + "\n" + render(results_dir) + "\n" + END
    markdown.write_text(pattern.sub(lambda _: body, text, count=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in the file")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.write:
        write(args.markdown, args.results)
        print(f"updated the summary table of {args.markdown}", file=sys.stderr)
    else:
        print(render(args.results))


if __name__ == "__main__":
    main()
