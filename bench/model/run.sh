#!/bin/sh
# Decode + merge of N realistic CPU windows (2,000 distinct stacks of depth 10-60, 1,000
# samples per window, long C++-like names, gzip'd) by contprof versus `go tool pprof -proto`
# merging the same files. Both run in alternation, ROUNDS times: each round times ours (best
# of 5 inside the round) and pprof's next to each other, so that both see the same load on
# this shared machine, and the ratio reported is the median of the rounds' ratios.
# Prints table rows: name | value | floor | ok.
# usage: bench/model/run.sh BUILD_DIR [N]     (ROUNDS in the environment, default 5)
set -eu
build=$1
n=${2:-360}
rounds=${ROUNDS:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bm="$build/bench/model/bench_merge"
"$bm" gen "$work" "$n" >/dev/null
export GOCACHE="$work/gocache" HOME="${HOME:-$work}"
go tool pprof -proto "$work"/w*.pb.gz > "$work/go.pb.gz" 2>/dev/null # warm the go build cache
: > "$work/rounds"
r=0
while [ "$r" -lt "$rounds" ]; do
    ours1=$("$bm" merge "$work" "$n" 1)
    ours=$("$bm" merge "$work" "$n" 0)
    t0=$(date +%s%N)
    go tool pprof -proto "$work"/w*.pb.gz > "$work/go.pb.gz" 2>/dev/null
    t1=$(date +%s%N)
    echo "$ours1 $ours $(echo "$t0 $t1" | awk '{ printf "%.6f", ($2 - $1) / 1e9 }')" >> "$work/rounds"
    r=$((r + 1))
done
awk -v n="$n" -v cpus="$(nproc)" '
    { o1[NR] = $1; o[NR] = $2; g[NR] = $3; ratio[NR] = $3 / $2 }
    function median(a, k,   i, j, t, b) {
        for (i = 1; i <= k; i++) b[i] = a[i]
        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
        return (k % 2) ? b[(k + 1) / 2] : (b[k / 2] + b[k / 2 + 1]) / 2
    }
    function spread(a, k,   i, lo, hi) {
        lo = hi = a[1]
        for (i = 2; i <= k; i++) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
        return sprintf("%.1f-%.1f", lo, hi)
    }
    END {
        k = NR
        m1 = median(o1, k); m = median(o, k); mg = median(g, k); mr = median(ratio, k)
        printf "decode+merge %d windows: contprof, 1 thread (median of %d rounds) | %.1f ms (%.0f windows/s) | - | -\n", n, k, m1 * 1000, n / m1
        printf "decode+merge %d windows: contprof, %d decoder threads | %.1f ms (%.0f windows/s) | - | -\n", n, cpus, m * 1000, n / m
        printf "decode+merge %d windows: go tool pprof -proto | %.1f ms | - | -\n", n, mg * 1000
        printf "decode+merge speed vs go tool pprof (median of per-round ratios; range %sx) | %.1fx | >= 20x | %s\n", spread(ratio, k), mr, (mr >= 20 ? "ok" : "BELOW FLOOR")
    }' "$work/rounds"
