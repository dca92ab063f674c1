#!/bin/sh
# Installs workerd (npm's @cloudflare/workerd-linux-64) and esbuild, pinned by the committed
# lock file, into BUILD_DIR/tests/v8/node_modules unless they are there already, then
# bundles and minifies the TypeScript Worker ts/worker.ts into BUILD_DIR/tests/v8/typed.js
# with an inline source map (its sources read "ts/worker.ts"), next to a copy of
# typed.capnp; smap/worker.js with its map in smap/worker.js.map; late/ (a module node
# loads after attach). Used by test_v8.
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
# A module loaded late by node (late/main.js requires late/late.js a second in): CommonJS,
# minified, its map inline.
mkdir -p "$work/late"
cp "$here/ts/late.ts" "$work/ts/late.ts"
cp "$here/late_main.js" "$work/late/main.js"
(cd "$work" && node_modules/.bin/esbuild ts/late.ts --bundle --minify --format=cjs \
  --sourcemap=inline --log-level=warning --outfile=late/late.js)
# The same Worker with its map in a file beside it (smap/worker.js, smap/worker.js.map), for
# the query-time source maps (`contprof symbols upload`), run by node through ts_driver.mjs.
mkdir -p "$work/smap"
(cd "$work" && node_modules/.bin/esbuild ts/worker.ts --bundle --minify --format=esm \
  --sourcemap --log-level=warning --outfile=smap/worker.js)
