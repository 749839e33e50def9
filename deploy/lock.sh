#!/usr/bin/env bash
# Regenerate the hashed locks from pyproject.toml (and requirements-dev.in), for
# CPython 3.11 on Linux x86_64 only (the Dockerfile's and the nodes' Python):
#   requirements.txt        a crawler node: the package + extras render, ops
#   requirements-local.txt  one machine with the embedded servers: + local
#   requirements-dev.txt    tests and benchmarks: every extra (impersonate too) + requirements-dev.in
# Existing pins are kept (pip-compile prefers them); --upgrade-package NAME moves one.
# Needs pip-tools: python3 -m venv /tmp/pt && /tmp/pt/bin/pip install pip-tools
# Usage: LOCK_PIP_COMPILE=/tmp/pt/bin/pip-compile bash deploy/lock.sh [pip-compile options]
set -euo pipefail
cd "$(dirname "$0")/.."
PC="${LOCK_PIP_COMPILE:-pip-compile}"
export CUSTOM_COMPILE_COMMAND="bash deploy/lock.sh    # for CPython 3.11 on Linux x86_64 only"
opts=(--quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links "$@")
"$PC" "${opts[@]}" --extra render --extra ops -o requirements.txt pyproject.toml
"$PC" "${opts[@]}" --extra render --extra ops --extra local -o requirements-local.txt pyproject.toml
"$PC" "${opts[@]}" --extra render --extra ops --extra tracing --extra local --extra scrapy-redis --extra impersonate -o requirements-dev.txt pyproject.toml requirements-dev.in
