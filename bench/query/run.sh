#!/bin/sh
# Query benchmarks: prints rows "name | value | floor | ok".
# usage: bench/query/run.sh [BUILD_DIR] [bench_query options]
#   --windows N      windows in the store (default 60480 = 7 days of 10 s)
#   --go-windows N   windows merged by `go tool pprof -proto` to extrapolate from (default 360)
#   --wrk-seconds S  wrk duration (default 30; 0 skips)
#   --dir DIR        work directory (default /tmp/contprof-bench-query; the store is reused)
# Then bench/query/hostile.sh. Needs golang-go and wrk. The store takes a few minutes to build the first time.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target bench_query >/dev/null
"$build/bench/query/bench_query" "$@"
# contprofd under hostile clients (issue 16): series p99 beside slow queries, memory held by
# non-reading clients
sh "$here/hostile.sh" "$build" --seconds 20
