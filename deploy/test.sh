#!/usr/bin/env bash
# README command 2: set up, then run the whole test suite (tests start their
# own Redis, MongoDB-wire server, demo site, Chromium and scrapyd).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh dev
exec .venv/bin/python -m pytest tests -ra --timeout=600 "$@"
