#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite (tests start their
# own Redis, MongoDB-wire server, demo site, Chromium and scrapyd).
# Tests run on parallel workers (pytest-xdist; every fixture picks its own
# free ports and temporary directories): most of a test's time is spent
# waiting on subprocess crawls, so three workers per core, at least 6
# (TEST_WORKERS overrides). The benchmarks' smoke runs: deploy/bench-smoke.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh dev
cores=$(nproc 2>/dev/null || echo 2)
workers=${TEST_WORKERS:-$(( cores * 3 > 6 ? cores * 3 : 6 ))}
exec .venv/bin/python -m pytest tests -ra --timeout=600 -n "$workers" --dist worksteal \
  --durations=25 "$@"
