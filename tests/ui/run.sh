#!/bin/sh
# The web UI's browser test: installs playwright-core (npm ci, from the committed lock file)
# into BUILD_DIR/tests/ui, then drives Debian's chromium against the built contprofd.
# Builds nothing; fails (never skips) when node, npm or chromium is missing.
# usage: tests/ui/run.sh [BUILD_DIR]    screenshots: BUILD_DIR/tests/ui/artifacts/
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
work="$build/tests/ui"
mkdir -p "$work"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "ui test: $tool is missing (apt-get install nodejs npm)" >&2; exit 1; }
done
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "ui test: $chromium is missing (apt-get install chromium)" >&2; exit 1; }
[ -x "$build/query/contprofd" ] || { echo "ui test: no $build/query/contprofd; build first" >&2; exit 1; }
if [ ! -d "$work/node_modules/playwright-core" ] || ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
fi
rm -rf "$work/artifacts"
NODE_PATH="$work/node_modules" exec node "$here/ui_test.js" "$build" "$work/artifacts"
