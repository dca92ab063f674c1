#!/bin/sh
# V8 source: windows converted per second (convert.c), and workerd's own CPU time per
# request (tests/v8/workers.capnp: two Workers, requests alternating between them, one
# at a time) with `contprof v8` attached: CPU profiler at 10 ms and at 1 ms (heap
# sampling off), at 10 ms without source maps (no Debugger domain: what source maps
# cost), heap sampler at 512 KiB (CPU profiler off), against no source; the
# variants alternated REPS times in rotating order on one workerd; the machine's load
# printed before and after. The source's own process is not counted: the cost to the host is
# V8's sampler thread and profilers inside workerd. Prints rows "name | value | floor | ok".
#   bench/v8/run.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 5), REQUESTS (default 60 per run).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
DIR=$(cd "$(dirname "$0")" && pwd)
TESTS=$DIR/../../tests/v8
. "$DIR/workerd.sh"
REPS=${REPS:-5}
REQ=${REQUESTS:-60}
CP=$BUILD/query/contprof
TMP=$(mktemp -d)
WPID=
trap '[ -n "$WPID" ] && kill $WPID 2>/dev/null; rm -rf "$TMP"' EXIT
[ -x "$CP" ] && [ -x "$BUILD/bench/v8/v8-convert-bench" ] || { echo "v8 bench: build first" >&2; exit 1; }
"$BUILD/bench/v8/v8-convert-bench" 3 || exit 1
start_workerd "$BUILD" "$TESTS" "$TMP"
echo "v8 machine load before (1, 5, 15 min) | $(cut -d' ' -f1-3 /proc/loadavg) | - | -"
ticks() { awk '{ print $14 + $15 }' "/proc/$WPID/stat"; }
requests() {
    n=0
    while [ $n -lt "$REQ" ]; do
        curl -s -o /dev/null "http://127.0.0.1:$PA/"; curl -s -o /dev/null "http://127.0.0.1:$PB/"
        n=$((n + 2))
    done
}
# run VARIANT [CPU_INTERVAL HEAP_INTERVAL [FLAG]]: appends workerd's CPU ticks for REQ requests
# to $TMP/VARIANT
run() {
    cpid=
    if [ -n "${2:-}" ]; then
        "$CP" v8 --inspector 127.0.0.1:$PI --output-dir "$TMP/out" --cpu-interval "$2" \
            --heap-interval "$3" --window 10s ${4:-} > "$TMP/cp.log" 2>&1 &
        cpid=$!
        sleep 1.5
    fi
    requests # warm
    t0=$(ticks); requests; t1=$(ticks)
    echo $((t1 - t0)) >> "$TMP/$1"
    [ -n "$cpid" ] && { kill -TERM $cpid; wait $cpid; }
    sleep 0.5
}
i=0
while [ $i -lt "$REPS" ]; do
    for k in 0 1 2 3 4; do
        case $(((i + k) % 5)) in
        0) run none ;;
        1) run i10 10ms 0 ;;
        2) run i1 1ms 0 ;;
        3) run heap 0 524288 ;;
        4) run i10nomaps 10ms 0 --no-source-maps ;;
        esac
    done
    i=$((i + 1))
done
echo "v8 machine load after (1, 5, 15 min) | $(cut -d' ' -f1-3 /proc/loadavg) | - | -"
med() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
NONE=$(med "$TMP/none"); I10=$(med "$TMP/i10"); I1=$(med "$TMP/i1"); HEAP=$(med "$TMP/heap")
I10N=$(med "$TMP/i10nomaps")
hz=$(getconf CLK_TCK)
awk -v n="$NONE" -v a="$I10" -v b="$I1" -v h="$HEAP" -v m="$I10N" -v r="$REQ" -v hz="$hz" 'BEGIN {
    per = n / r / hz * 1000
    printf "workerd CPU per request, no source (ms) | %.2f | - | -\n", per
    o10 = (a - n) / n * 100; o1 = (b - n) / n * 100
    printf "workerd CPU per request, contprof v8 at 10 ms (overhead) | %+.1f%% | <= 1%% | %s\n", o10, o10 <= 1 ? "yes" : "no"
    printf "workerd CPU per request, contprof v8 at 1 ms (overhead) | %+.1f%% | <= 5%% | %s\n", o1, o1 <= 5 ? "yes" : "no"
    om = (m - n) / n * 100
    printf "workerd CPU per request, contprof v8 at 10 ms without source maps (overhead) | %+.1f%% | - | -\n", om
    oh = (h - n) / n * 100
    printf "workerd CPU per request, heap sampler at 512 KiB (overhead) | %+.1f%% | - | -\n", oh
}'
