#!/bin/sh
# Installs workerd (npm's @cloudflare/workerd-linux-64, the version pinned by the committed
# lock file) into DIR/node_modules unless it is there already; prints the binary's path.
# Used by tests/collector/test_js.
# usage: tests/collector/workerd/install.sh DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="$1"
mkdir -p "$work"
command -v npm >/dev/null || { echo "workerd: npm is missing (apt-get install npm)" >&2; exit 1; }
bin="$work/node_modules/@cloudflare/workerd-linux-64/bin/workerd"
if [ ! -x "$bin" ] || ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$bin"
