#!/bin/sh
# Installs the browser tests' npm dependencies (playwright-core, from the committed lock file)
# into BUILD_DIR/tests/ui/node_modules unless they are there already; checks that node and
# Debian's chromium are present. Used by tests/ui/run.sh and bench/ui/run.sh.
# usage: tests/ui/install.sh BUILD_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="$1/tests/ui"
mkdir -p "$work"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "ui: $tool is missing (apt-get install nodejs npm)" >&2; exit 1; }
done
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "ui: $chromium is missing (apt-get install chromium)" >&2; exit 1; }
[ -x "$1/query/contprofd" ] && [ -x "$1/query/contprof" ] ||
  { echo "ui: no $1/query/contprofd or contprof; build first" >&2; exit 1; }
if [ ! -d "$work/node_modules/playwright-core" ] || ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
