#!/bin/sh
# Installs workerd (npm's @cloudflare/workerd-linux-64, pinned by the committed lock file)
# into BUILD_DIR/tests/v8/node_modules unless it is there already. Used by test_v8.
# usage: tests/v8/install.sh BUILD_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="$1/tests/v8"
mkdir -p "$work"
command -v npm >/dev/null || { echo "v8: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
if [ ! -x "$work/node_modules/@cloudflare/workerd-linux-64/bin/workerd" ] ||
   ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
