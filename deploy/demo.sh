#!/usr/bin/env bash
# README command 1: set up, then run a real two-node demo crawl on local
# embedded services (Redis, a MongoDB-wire server, the demo site).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
exec .venv/bin/python -m devtools.demo.run "$@"
