#!/bin/sh
# Installs workerd (npm's @cloudflare/workerd-linux-64) and esbuild, pinned by the committed
# lock file, into BUILD_DIR/tests/v8/node_modules unless they are there already, then
# bundles and minifies the TypeScript Worker ts/worker.ts into BUILD_DIR/tests/v8/typed.js
# with an inline source map (its sources read "ts/worker.ts"), next to a copy of
# typed.capnp. Used by test_v8.
# usage: tests/v8/install.sh BUILD_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work="$1/tests/v8"
mkdir -p "$work/ts"
command -v npm >/dev/null || { echo "v8: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
if [ ! -x "$work/node_modules/@cloudflare/workerd-linux-64/bin/workerd" ] ||
   [ ! -x "$work/node_modules/.bin/esbuild" ] ||
   ! cmp -s "$here/package-lock.json" "$work/package-lock.json"; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp "$here/ts/worker.ts" "$work/ts/worker.ts"
cp "$here/typed.capnp" "$work/typed.capnp"
(cd "$work" && node_modules/.bin/esbuild ts/worker.ts --bundle --minify --format=esm \
  --sourcemap=inline --log-level=warning --outfile=typed.js)
