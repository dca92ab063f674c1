#!/bin/sh
# Web UI benchmarks in Debian's chromium: prints rows "name | value | floor | ok" for the
# draw time of a 20,000-node flamegraph served by the built contprofd (see bench.js).
# usage: bench/ui/run.sh [BUILD_DIR]   needs node, npm and chromium (tests/ui/install.sh)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
make -C "$build" contprofd contprof >/dev/null
"$here/../../tests/ui/install.sh" "$build" >&2
NODE_PATH="$build/tests/ui/node_modules" exec node "$here/bench.js" "$build"
