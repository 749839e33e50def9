#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite (tests start their
# own Redis, MongoDB-wire server, demo site, Chromium and scrapyd).
# Tests run on parallel workers (pytest-xdist; every fixture picks its own
# free ports and temporary directories): most of a test's time is spent
# waiting on subprocess crawls, so three workers per core, at least 6
# (TEST_WORKERS overrides). The benchmarks' smoke runs: deploy/bench-smoke.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# The suite's two virtualenvs (tests/prebuilt.py): the wheel installed clean, and
# scrapyd's as deploy/scrapyd-node.sh makes it, built while the setup's pip below
# keeps one core busy and leaves the other idle (built during the tests, they took
# over a minute of CPU from them). The tests wait for them, or build them
# themselves if a build failed.
prebuilt=$(mktemp -d "${TMPDIR:-/tmp}/crawlproject-test-venvs.XXXXXX")
trap 'rm -rf "$prebuilt"' EXIT
build() {  # build DIR COMMAND...: the command's output in DIR/out, its exit code in DIR/exit
  local dir=$1 code=0; shift
  mkdir -p "$dir"
  "$@" > "$dir/out" 2>&1 || code=$?
  echo "$code" > "$dir/exit.tmp" && mv "$dir/exit.tmp" "$dir/exit"
}
build "$prebuilt/node" bash deploy/scrapyd-node.sh --prefix "$prebuilt/node/node" --no-systemd \
  --bind 127.0.0.1 --port 6800 &
build "$prebuilt/installed" "${PYTHON:-python3}" tests/prebuilt.py installed "$prebuilt/installed" &
export CRAWLPROJECT_TEST_SCRAPYD_NODE="$prebuilt/node" CRAWLPROJECT_TEST_INSTALLED="$prebuilt/installed"
bash deploy/setup.sh dev
cores=$(nproc 2>/dev/null || echo 2)
workers=${TEST_WORKERS:-$(( cores * 3 > 6 ? cores * 3 : 6 ))}
code=0
.venv/bin/python -m pytest tests -ra --timeout=600 -n "$workers" --dist worksteal \
  --durations=25 "$@" || code=$?
wait
exit "$code"
