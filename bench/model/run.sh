#!/bin/sh
# Decode + merge of N realistic CPU windows (2,000 distinct stacks of depth 10-60, 1,000
# samples per window, long C++-like names, gzip'd) by contprof versus `go tool pprof -proto`
# merging the same files, both in this run. Prints table rows: name | value | floor | ok.
# usage: bench/model/run.sh BUILD_DIR [N]
set -eu
build=$1
n=${2:-360}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bench/model/bench_merge" gen "$work" "$n" >/dev/null
ours1=$("$build/bench/model/bench_merge" merge "$work" "$n" 1)
ours=$("$build/bench/model/bench_merge" merge "$work" "$n" 0)
export GOCACHE="$work/gocache" HOME="${HOME:-$work}"
best=""
for rep in 1 2 3; do
    t0=$(date +%s%N)
    go tool pprof -proto "$work"/w*.pb.gz > "$work/go.pb.gz" 2>/dev/null
    t1=$(date +%s%N)
    t=$(echo "$t0 $t1" | awk '{ printf "%.6f", ($2 - $1) / 1e9 }')
    if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$t; fi
done
awk -v n="$n" -v ours="$ours" -v ours1="$ours1" -v go="$best" -v cpus="$(nproc)" 'BEGIN {
    ratio = go / ours
    printf "decode+merge %d windows: contprof, 1 thread | %.1f ms (%.0f windows/s) | - | -\n", n, ours1 * 1000, n / ours1
    printf "decode+merge %d windows: contprof, %d decoder threads | %.1f ms (%.0f windows/s) | - | -\n", n, cpus, ours * 1000, n / ours
    printf "decode+merge %d windows: go tool pprof -proto | %.1f ms | - | -\n", n, go * 1000
    printf "decode+merge speed vs go tool pprof | %.1fx | >= 20x | %s\n", ratio, (ratio >= 20 ? "ok" : "BELOW FLOOR")
}'
