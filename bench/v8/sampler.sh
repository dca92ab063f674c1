#!/bin/sh
# Where the V8 CPU profiler's cost goes, without and with contprof (issue 28).
# 1. node running burn.js (CPU-bound, ~3 s) alone, under V8's own `--cpu-prof` at 10 ms and
#    1 ms (no inspector, no contprof), and under `contprof v8` at 1 ms (--inspect-brk, heap
#    sampler off): process CPU against alone, and per V8 sample at 1 ms the extra CPU and
#    V8's sampler thread (v8:ProfEvntProc) alone.
# 2. workerd (tests/v8/workers.capnp, two Workers) with no request at all: its CPU per
#    second under `contprof v8` at 1 ms and 10 ms (V8 signals an isolate's thread every
#    interval whether it runs JS or not).
# Variants alternate REPS times in rotating order. Prints rows "name | median (min..max)".
#   bench/v8/sampler.sh [BUILD_DIR]   (default: build)   Environment: REPS (default 5).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
DIR=$(cd "$(dirname "$0")" && pwd)
TESTS=$DIR/../../tests/v8
. "$DIR/workerd.sh"
REPS=${REPS:-5}
CP=$BUILD/query/contprof
TMP=$(mktemp -d)
WPID=
trap '[ -n "$WPID" ] && kill $WPID 2>/dev/null; rm -rf "$TMP"' EXIT
[ -x "$CP" ] || { echo "v8 sampler bench: build first" >&2; exit 1; }
command -v node >/dev/null || { echo "v8 sampler bench: node is missing" >&2; exit 1; }
# field JSON KEY: cpu_ms, or a thread's ms
field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(round(d['cpu_ms'] if sys.argv[2] == 'cpu' else d['threads'].get(sys.argv[2], 0)))" "$1" "$2"; }
# node VARIANT: appends "cpu sampler_ms samples" to $TMP/VARIANT
node_run() {
    rm -rf "$TMP/prof"
    case $1 in
    none) j=$(node "$DIR/burn.js" 2>&1 >/dev/null) ;;
    prof10 | prof1)
        iv=10000; [ "$1" = prof1 ] && iv=1000
        j=$(node --cpu-prof --cpu-prof-dir="$TMP/prof" --cpu-prof-interval $iv "$DIR/burn.js" 2>&1 >/dev/null) ;;
    cp1)
        p=$(port)
        node --inspect-brk=127.0.0.1:$p "$DIR/burn.js" > /dev/null 2> "$TMP/node.err" &
        np=$!
        sleep 0.5
        "$CP" v8 --inspector 127.0.0.1:$p --output-dir "$TMP/out" --cpu-interval 1ms \
            --heap-interval 0 --exit-when-gone > "$TMP/cp.log" 2>&1 &
        cpid=$!
        wait $cpid || kill $np 2>/dev/null # a source that failed leaves node held
        wait $np
        j=$(grep '^{' "$TMP/node.err") ;;
    esac
    n=0
    [ -d "$TMP/prof" ] && n=$(python3 -c "import json,glob,sys; print(len(json.load(open(glob.glob(sys.argv[1] + '/*')[0]))['samples']))" "$TMP/prof")
    echo "$(field "$j" cpu) $(field "$j" v8:ProfEvntProc) $n" >> "$TMP/$1"
}
i=0
while [ $i -lt "$REPS" ]; do
    for k in 0 1 2 3; do
        case $(((i + k) % 4)) in
        0) node_run none ;; 1) node_run prof10 ;; 2) node_run prof1 ;; 3) node_run cp1 ;;
        esac
    done
    i=$((i + 1))
done
# workerd idle
start_workerd "$BUILD" "$TESTS" "$TMP"
curl -s -o /dev/null "http://127.0.0.1:$PA/"; curl -s -o /dev/null "http://127.0.0.1:$PB/"
ns() { cat /proc/$WPID/task/*/schedstat | awk '{ s += $1 } END { print s }'; }
# idle VARIANT [INTERVAL]: appends workerd's CPU ms in 3 s without requests to $TMP/VARIANT
idle() {
    cpid=
    if [ -n "${2:-}" ]; then
        "$CP" v8 --inspector 127.0.0.1:$PI --output-dir "$TMP/out" --cpu-interval "$2" \
            --heap-interval 0 --window 10s > "$TMP/cp.log" 2>&1 &
        cpid=$!
        sleep 1.5
    fi
    t0=$(ns); sleep 3; t1=$(ns)
    echo $(((t1 - t0) / 3000000)) >> "$TMP/$1"
    [ -n "$cpid" ] && { kill -TERM $cpid; wait $cpid; }
    sleep 0.5
}
i=0
while [ $i -lt "$REPS" ]; do
    for k in 0 1 2; do
        case $(((i + k) % 3)) in
        0) idle wnone ;; 1) idle w10 10ms ;; 2) idle w1 1ms ;;
        esac
    done
    i=$((i + 1))
done
# col FILE N: column N sorted, as "median min max"
col() { awk -v c="$2" '{ print $c }' "$1" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1], v[NR] }'; }
set -- $(col "$TMP/none" 1); NONE=$1
pct() { col "$TMP/$1" 1 | awk -v n="$NONE" '{ printf "%+.1f%% (%+.1f..%+.1f)", ($1 - n) / n * 100, ($2 - n) / n * 100, ($3 - n) / n * 100 }'; }
echo "node burn.js CPU alone (ms) | $(col "$TMP/none" 1 | awk '{ printf "%d (%d..%d)", $1, $2, $3 }')"
echo "... V8's --cpu-prof at 10 ms, no contprof (overhead) | $(pct prof10)"
echo "... V8's --cpu-prof at 1 ms, no contprof (overhead) | $(pct prof1)"
echo "... contprof v8 at 1 ms (overhead) | $(pct cp1)"
set -- $(col "$TMP/prof1" 1); P1=$1
set -- $(col "$TMP/prof1" 2); S1=$1
set -- $(col "$TMP/prof1" 3); N1=$1
awk -v a="$P1" -v n="$NONE" -v s="$S1" -v c="$N1" 'BEGIN {
    printf "... --cpu-prof at 1 ms: samples, extra CPU per sample, sampler thread per sample | %d, %.0f us, %.0f us\n", c, (a - n) * 1000 / c, s * 1000 / c }'
for v in wnone w10 w1; do
    case $v in wnone) t="no source" ;; w10) t="contprof v8 at 10 ms" ;; w1) t="contprof v8 at 1 ms" ;; esac
    echo "workerd idle, 2 Workers, $t (CPU ms per s) | $(col "$TMP/$v" 1 | awk '{ printf "%d (%d..%d)", $1, $2, $3 }')"
done
