#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite (tests start their
# own Redis, MongoDB-wire server, demo site, Chromium and scrapyd).
# Tests run on parallel workers (pytest-xdist; every fixture picks its own
# free ports and temporary directories): most of a test's time is spent
# waiting on subprocess crawls, so three workers per core, at least 6
# (TEST_WORKERS overrides). The benchmarks' smoke runs: deploy/bench-smoke.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# scrapyd's virtualenv for tests/test_scrapyd.py, made by deploy/scrapyd-node.sh as
# an operator makes it, while the setup's pip below keeps one core busy and leaves
# the other idle (built during the tests instead, it took a minute of CPU from them).
# The tests wait for it, or build it themselves if it failed.
prebuilt=$(mktemp -d "${TMPDIR:-/tmp}/crawlproject-test-node.XXXXXX")
trap 'rm -rf "$prebuilt"' EXIT
( code=0
  bash deploy/scrapyd-node.sh --prefix "$prebuilt/node" --no-systemd --bind 127.0.0.1 \
    --port 6800 > "$prebuilt/setup.out" 2>&1 || code=$?
  echo "$code" > "$prebuilt/exit.tmp" && mv "$prebuilt/exit.tmp" "$prebuilt/exit" ) &
export CRAWLPROJECT_TEST_SCRAPYD_NODE="$prebuilt"
bash deploy/setup.sh dev
cores=$(nproc 2>/dev/null || echo 2)
workers=${TEST_WORKERS:-$(( cores * 3 > 6 ? cores * 3 : 6 ))}
code=0
.venv/bin/python -m pytest tests -ra --timeout=600 -n "$workers" --dist worksteal \
  --durations=25 "$@" || code=$?
wait
exit "$code"
