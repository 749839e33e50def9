"""Render bench/results/*.json into BENCHMARKS.md's generated blocks.

Each block sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``
markers; only the text between the markers is replaced, the hand-written
analysis around them stays. ``python -m bench.report`` re-renders from the
last results without running anything.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

from bench.common import RESULTS_DIR, ROOT, fmt, table

BENCHMARKS = ("crawl", "commands", "memory", "dedupe", "seeds", "costs")
MARKDOWN = ROOT / "BENCHMARKS.md"
SCALING = ROOT / "docs" / "scaling.md"


def load(name: str, results_dir: Path = RESULTS_DIR) -> dict | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render_block(name: str, data: dict) -> str:
    module = importlib.import_module(f"bench.{name}")
    mode = data.get("mode", "?")
    if name == "projection":
        head = f"_Computed {data.get('created', '?')} from the results of that run._"
    else:
        head = (f"_Measured {data.get('created', '?')} ({mode} mode, {fmt(data.get('duration_s'))} s; "
                f"load average at start "
                f"{', '.join(f'{x:.2f}' for x in data['machine']['load_avg_at_start'])})._")
    return head + "\n\n" + module.render(data)


def summary(results: dict[str, dict]) -> str:
    rows = []
    titles = {"crawl": "1. crawl pages/s", "commands": "2. Redis commands/page",
              "memory": "3. memory", "dedupe": "4. dedupe", "seeds": "5. seed feed"}
    for name in ("crawl", "commands", "memory", "dedupe", "seeds"):
        data = results.get(name)
        if not data:
            rows.append([titles[name], "not run", "", "", ""])
            continue
        for c in data.get("checks", []):
            value = c.get("ratio", c.get("value"))
            if c["floor"] is None:  # measured and reported, no floor to hold
                rows.append([titles[name], c["check"], value, "reported", "-"])
                continue
            floor = c["floor"] if isinstance(c["floor"], str) else (
                f"≥ {c['floor']}" if "ours/" in c["check"] else f"≤ {c['floor']}")
            rows.append([titles[name], c["check"], value, floor, c["pass"]])
    return table(["benchmark", "check", "measured", "floor", "result"], rows)


def update_markdown(path: Path = MARKDOWN, results_dir: Path = RESULTS_DIR) -> list[str]:
    """Re-render the generated blocks of BENCHMARKS.md and docs/scaling.md."""
    results = {n: load(n, results_dir) for n in BENCHMARKS + ("projection",)}
    blocks = {"summary": summary(results)}
    for name, data in results.items():
        if data:
            blocks[name] = render_block(name, data)
    updated = []
    for target in (path, SCALING):
        if target.exists():
            updated += [f"{target.name}:{name}" for name in _replace_blocks(target, blocks)]
    return updated


def _replace_blocks(path: Path, blocks: dict[str, str]) -> list[str]:
    text = path.read_text()
    updated = []
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- bench:{name} -->).*?(<!-- /bench:{name} -->)", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda m: m.group(1) + "\n" + body + "\n" + m.group(2), text)
            updated.append(name)
    path.write_text(text)
    return updated


if __name__ == "__main__":
    print("updated blocks:", ", ".join(update_markdown()) or "none", file=sys.stderr)
