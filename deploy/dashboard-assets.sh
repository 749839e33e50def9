#!/usr/bin/env bash
# Refresh the dashboard's vendored chart library (uPlot) from the npm registry.
# Run after changing its version in crawlproject/dashboard/package.json; nothing
# needs npm at run time or in CI. The package tarball is kept in vendor/ so that
# tests/test_dashboard.py can check it against the lockfile's integrity hash and
# the files in static/ against the tarball.
set -euo pipefail
cd "$(dirname "$0")/../crawlproject/dashboard"
npm install --package-lock-only --ignore-scripts --no-audit --no-fund
version=$(node -p 'require("./package-lock.json").packages["node_modules/uplot"].version')
want=$(node -p 'require("./package-lock.json").packages["node_modules/uplot"].integrity')
rm -f vendor/uplot-*.tgz
npm pack "uplot@$version" --pack-destination vendor --silent >/dev/null
tgz="vendor/uplot-$version.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
[ "$got" = "$want" ] || { echo "integrity mismatch: $got != $want" >&2; exit 1; }
tar -xzf "$tgz" -O package/dist/uPlot.iife.min.js > static/uPlot.iife.min.js
tar -xzf "$tgz" -O package/dist/uPlot.min.css > static/uPlot.min.css
tar -xzf "$tgz" -O package/LICENSE > static/uPlot.LICENSE
echo "uPlot $version vendored ($want)"
