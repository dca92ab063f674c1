#!/bin/sh
# Old build against new on the query rows, interleaved (old, new, old, new, ...) so that a
# shared machine's noise touches both alike. Prints each run's rows "build run | name |
# value", then per row and build the min and median over the runs.
# usage: bench/query/ab.sh OLD_BUILD NEW_BUILD [RUNS (default 3)]
#   DIR (default /tmp/contprof-bench-ab): one store for both builds (the format is the same);
#   SECONDS_HOSTILE (default 20): bench_hostile --seconds.
# A tree older than bench_query's 1 h rows prints none (apply their bench_query.c there).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OLD_BUILD NEW_BUILD [RUNS]" >&2; exit 2; }
old=$1 new=$2 runs=${3:-3}
dir=${DIR:-/tmp/contprof-bench-ab}
mkdir -p "$dir"
for b in "$old" "$new"; do
    cmake --build "$b" --target bench_query bench_hostile contprofd >/dev/null
done
keep='7 d merged, store call: median|7 d merged, HTTP .*: median|unaligned 1 h|'
keep="${keep}series beside 4 slowest queries: p99|slowest queries completed|of which 503"
: >"$dir/rows"
i=1
while [ "$i" -le "$runs" ]; do
    for side in old new; do
        if [ "$side" = old ]; then b=$old; else b=$new; fi
        { "$b/bench/query/bench_query" --dir "$dir/query" --go-windows 0 --wrk-seconds 0 2>/dev/null
          "$b/bench/query/bench_hostile" --contprofd "$b/query/contprofd" --dir "$dir/hostile" \
              --seconds "${SECONDS_HOSTILE:-20}"; } |
            grep -E "$keep" | awk -F'|' -v t="$side $i" \
                '{ gsub(/^ +| +$/, "", $1); printf "%s | %s | %g\n", t, $1, $2 + 0 }' |
            tee -a "$dir/rows"
    done
    i=$((i + 1))
done
echo "--- min / median of $runs runs"
awk -F' [|] ' '{ split($1, a, " "); printf "%s|%s|%s\n", $2, a[1], $3 }' "$dir/rows" |
    sort -t'|' -k1,1 -k2,2r -k3,3g | awk -F'|' '
    function flush() { if (n) printf "%-48s | %s | %9g | %9g\n", k, s, v[1], v[int((n + 1) / 2)] }
    $1 != k || $2 != s { flush(); k = $1; s = $2; n = 0 }
    { v[++n] = $3 }
    END { flush() }'
