#!/usr/bin/env bash
# The benchmarks' smoke runs: every bench/ script end to end in its smallest
# mode (no timing judged). Kept out of the test suite (deploy/test.sh) so that
# the suite stays under 10 minutes; run it after changing bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh dev
exec .venv/bin/python -m pytest bench/test_smoke.py -ra --timeout=600 -n "${BENCH_WORKERS:-2}" "$@"
