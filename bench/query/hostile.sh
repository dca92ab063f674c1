#!/bin/sh
# contprofd under hostile clients: prints rows "name | value | floor | ok".
# usage: bench/query/hostile.sh [BUILD_DIR] [bench_hostile options]
#   --seconds S   how long /api/v1/series is measured beside the slowest queries (default 30)
#   --dir DIR     work directory (default /tmp/contprof-bench-hostile; the store is reused)
#   --stacks N --samples N   the big profile (default 11000 stacks, 220000 samples: ~50 MB folded)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target bench_hostile contprofd >/dev/null
exec "$build/bench/query/bench_hostile" --contprofd "$build/query/contprofd" "$@"
