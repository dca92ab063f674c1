#!/bin/sh
# Installs Grafana Pyroscope's Node.js SDK (npm @pyroscope/nodejs, Apache-2.0), pinned by the
# committed lock file, into BUILD_DIR/tests/pyro/node_modules unless it is there already, with
# sdk_app.js beside it. Used by test_pyro.
# usage: tests/pyro/install.sh BUILD_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="$1/tests/pyro"
mkdir -p "$work"
command -v npm >/dev/null || { echo "pyro: npm is missing (.ci/deps)" >&2; exit 1; }
if [ ! -f "$work/node_modules/@pyroscope/nodejs/package.json" ] ||
   ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp "$here/sdk_app.js" "$work/sdk_app.js"
