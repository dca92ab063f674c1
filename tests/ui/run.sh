#!/bin/sh
# The web UI's browser test: Debian's chromium driven by playwright-core against the built
# contprofd (see ui_test.js). Builds nothing; fails, never skips, when node, npm or chromium
# is missing. usage: tests/ui/run.sh [BUILD_DIR]   screenshots: BUILD_DIR/tests/ui/artifacts/
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../../build}" && pwd)
"$here/install.sh" "$build"
rm -rf "$build/tests/ui/artifacts"
NODE_PATH="$build/tests/ui/node_modules" exec node "$here/ui_test.js" "$build" "$build/tests/ui/artifacts"
