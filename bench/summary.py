"""The summary table at the top of BENCHMARKS.md, generated from bench/figures.json and
bench/results/*.json.

``python -m bench.summary`` prints it; ``--write`` replaces the text between
``<!-- summary:start -->`` and ``<!-- summary:end -->`` in BENCHMARKS.md; ``--record``
copies the checks of result files newer than the committed figures into bench/figures.json.
One row per floor check (the figure, its floor and PASS/FAIL, the command, when it was
measured). bench/results/ is not in git, so the figures a fresh clone shows come from
bench/figures.json, kept in git; a result file replaces its section's committed figures
when it is at least as new. A benchmark with neither (measured only before the per-host
frontier) has no row: BENCHMARKS.md lists it under "To re-measure".
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
FIGURES = ROOT / "bench" / "figures.json"
START, END = "<!-- summary:start -->", "<!-- summary:end -->"


@dataclass(frozen=True)
class Section:
    title: str      # the section of BENCHMARKS.md, as "§N name"; the key in figures.json
    pattern: str | None  # result file(s) in bench/results/, the newest by name; None: a
                         # figure no benchmark module writes
    command: str    # shown when a result file does not name its own


SECTIONS = (
    Section("§1 crawl", "crawl.json", "python -m bench.crawl"),
    Section("§2 Redis commands", "commands.json", "python -m bench.commands"),
    Section("§3 memory", "memory.json", "python -m bench.memory"),
    Section("§4 dedupe", "dedupe.json", "python -m bench.dedupe"),
    Section("§5 seed file", None, "python -m crawlproject.cli seed products --file seeds.txt"),
    Section("§5 seeds crawled", "seeds.json", "python -m bench.seeds"),
    Section("§6 frontier capacity", "frontier_capacity.json",
            "python -m bench.frontier_capacity --repeat 6"),
    Section("§7 polite crawl", "polite.json", "python -m bench.polite"),
    Section("§8 one node, CR=16", "crawl_cr16.json",
            "python -m bench.crawl --concurrency 16 --products 5000 "
            "--only 'ours|1|0,plain|1|0,ours|1|50,plain|1|50' --repeat 4 "
            "--out bench/results/crawl_cr16.json"),
    Section("§9 middlewares", "middlewares.json", "python -m bench.middlewares"),
    Section("§10 incremental recrawl", "recrawl.json", "python -m bench.recrawl"),
    Section("§11 per-key state", "kstate.json", "python -m bench.kstate"),
    Section("§11 operator reads", "status_reads.json", "python -m bench.status_reads"),
    Section("§12 proxy REFRESH", "proxy_refresh.json", "python -m bench.proxy_refresh"),
    Section("§13 fault soak", "soak-*.json", "python -m bench.soak --duration 600"),
    Section("§14 frontier costs", "costs.json", "python -m bench.costs"),
    Section("§15 impersonation", "impersonate.json", "python -m bench.impersonate"),
    Section("backoff (issue 38)", "backoff.json", "python -m bench.backoff"),
    Section("whole product (issue 38)", "product.json", "python -m bench.product"),
    Section("synthetic web (issue 46)", "web.json", "python -m bench.web"),
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


def load_figures(figures: Path = FIGURES) -> list[dict]:
    """The committed figures: entries of section, command, measured and checks."""
    if not figures.exists():
        return []
    return json.loads(figures.read_text())["figures"]


def fresh(section: Section, committed: list[dict], results_dir: Path) -> tuple | None:
    """(path, data, measured) of the section's newest result file if it is at least as new
    as its committed figures, else None."""
    path = newest(section, results_dir)
    if path is None:
        return None
    data = json.loads(path.read_text())
    when = measured(data, path)
    if committed and when < max(entry["measured"] for entry in committed):
        return None  # an old result file left behind: the committed figures are newer
    return path, data, when


def rows(results_dir: Path = RESULTS_DIR, figures: Path = FIGURES) -> list[list]:
    kept = load_figures(figures)
    out = []
    for section in SECTIONS:
        committed = [entry for entry in kept if entry["section"] == section.title]
        result = fresh(section, committed, results_dir)
        if result is not None:
            path, data, when = result
            command = data.get("command") or section.command
            for figure, value, floor, ok in check_rows(data):
                out.append([section.title, figure, value, floor, ok, f"`{command}`", when])
            continue
        for entry in committed:
            for c in entry["checks"]:
                ok = "—" if c.get("pass") is None else c["pass"]  # a figure only reported
                out.append([section.title, c["check"], c["value"], c["floor"], ok,
                            f"`{entry['command']}`", entry["measured"]])
    return out


def record(results_dir: Path = RESULTS_DIR, figures: Path = FIGURES) -> list[str]:
    """Replace the committed figures of every section whose result file is at least as new;
    return those sections' titles."""
    doc = json.loads(figures.read_text()) if figures.exists() else {"figures": []}
    updated = []
    for section in SECTIONS:
        committed = [e for e in doc["figures"] if e["section"] == section.title]
        result = fresh(section, committed, results_dir)
        if result is None:
            continue
        path, data, when = result
        checks = [{"check": figure, "value": value, "floor": floor, "pass": ok}
                  for figure, value, floor, ok in check_rows(data)]
        entry = {"section": section.title, "command": data.get("command") or section.command,
                 "measured": when, "checks": checks}
        at = doc["figures"].index(committed[0]) if committed else len(doc["figures"])
        doc["figures"] = [e for e in doc["figures"] if e["section"] != section.title]
        doc["figures"].insert(min(at, len(doc["figures"])), entry)
        updated.append(section.title)
    figures.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return updated


def render(results_dir: Path = RESULTS_DIR, figures: Path = FIGURES) -> str:
    cells = [[fmt(c).replace("|", "\\|") if not isinstance(c, str) else c.replace("|", "\\|")
              for c in row] for row in rows(results_dir, figures)]
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def write(markdown: Path = MARKDOWN, results_dir: Path = RESULTS_DIR,
          figures: Path = FIGURES) -> None:
    text = markdown.read_text()
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{markdown}: no {START} … {END} markers")
    body = START + "\n" + render(results_dir, figures) + "\n" + END
    markdown.write_text(pattern.sub(lambda _: body, text, count=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in the file")
    parser.add_argument("--record", action="store_true",
                        help="copy newer result files' checks into the figures file first")
    parser.add_argument("--markdown", type=Path, default=MARKDOWN)
    parser.add_argument("--results", type=Path, default=RESULTS_DIR)
    parser.add_argument("--figures", type=Path, default=FIGURES)
    args = parser.parse_args(argv)
    if args.record:
        updated = record(args.results, args.figures)
        print(f"recorded in {args.figures}: {', '.join(updated) or 'nothing newer'}",
              file=sys.stderr)
    if args.write:
        write(args.markdown, args.results, args.figures)
        print(f"updated the summary table of {args.markdown}", file=sys.stderr)
    elif not args.record:
        print(render(args.results, args.figures))


if __name__ == "__main__":
    main()
