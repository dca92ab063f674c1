#!/bin/sh
# What Python frames cost (collector/python.c): the agent's handler timed inside it
# (libcontprof_timing.so) on a CPU-bound Python program with a ~12-frame Python stack, with
# the walk and without it (CONTPROF_PYTHON=0), in a program with a sub-interpreter
# (py/subburn.py: the state a thread runs is looked for), and that program's CPU ratio under the agent
# at 100 Hz (the default) and 1 kHz against the program alone. Prints rows
# "name | value | floor | ok", like run.sh.
#   bench/collector/python.sh [BUILD_DIR]   (default: build; Release numbers: build-release)
# Environment: REPS (default 5), ROUNDS (default 6000: ~2 s of CPU), PY (default
# /usr/bin/python3, Debian's: the interpreter inside the executable).
#
# Ratios are handler.sh's method: the variant and the program alone at once, pinned to one
# core (interleaved by the scheduler), on both cores, REPS times; medians of the pairs and
# their range. CPU is the process's, the agent's thread included (/usr/bin/time).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
TLIB=$BUILD/collector/libcontprof_timing.so
PY=${PY:-/usr/bin/python3}
BURN=$(dirname "$0")/py/burn.py
SUBBURN=$(dirname "$0")/py/subburn.py
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-6000}
for f in "$LIB" "$TLIB" "$PY"; do [ -e "$f" ] || { echo "python bench: no $f (build first)" >&2; exit 1; }; done
command -v taskset > /dev/null 2>&1 || { echo "python bench: needs taskset" >&2; exit 1; }
CORES=0
[ "$(nproc)" -gt 1 ] && CORES="0 1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# cpu VARIANT CORE: one run pinned to CORE; prints its CPU seconds (user + system)
cpu() {
    case $1 in
    plain) set -- "$2" ;;
    hz100) set -- "$2" env CONTPROF_ALLOC_RATE=-1 CONTPROF_OUTPUT_DIR="$TMP/out.$1.$2" LD_PRELOAD="$LIB" ;;
    hz1000) set -- "$2" env CONTPROF_CPU_HZ=1000 CONTPROF_ALLOC_RATE=-1 CONTPROF_OUTPUT_DIR="$TMP/out.$1.$2" \
        LD_PRELOAD="$LIB" ;;
    esac
    core=$1
    shift
    /usr/bin/time -f '%U %S' -o "$TMP/t.$$.$core" taskset -c "$core" "$@" "$PY" "$BURN" "$ROUNDS"
    awk '{ printf "%.3f\n", $1 + $2 }' "$TMP/t.$$.$core"
    rm -rf "$TMP"/out.*."$core"
}

# pair VARIANT: the variant and the program alone at once on each core; appends ratios
pair() {
    for c in $CORES; do
        (cpu "$1" "$c" > "$TMP/a.$c") &
        (cpu plain "$c" > "$TMP/b.$c") &
    done
    wait
    for c in $CORES; do
        paste "$TMP/a.$c" "$TMP/b.$c" | awk '{ printf "%.5f\n", $1 / $2 }' >> "$TMP/$1.r"
    done
}

# timed WALK [PROGRAM]: the timing build at 1 kHz, alone; its handler calls' ns into
# $TMP/WALK.ns (PROGRAM subburn: into $TMP/sub.ns)
timed() {
    prog=$BURN out=walk$1
    [ "${2:-}" = subburn ] && prog=$SUBBURN out=sub
    env CONTPROF_CPU_HZ=1000 CONTPROF_ALLOC_RATE=-1 CONTPROF_PYTHON="$1" CONTPROF_OUTPUT_DIR="$TMP/out.t" \
        CP_HANDLER_TIMING_OUT="$TMP/tm" LD_PRELOAD="$TLIB" "$PY" "$prog" "$ROUNDS"
    tail -n +2 "$TMP/tm" | awk -v g="$(head -1 "$TMP/tm")" '{ printf "%.0f\n", $1 / g }' >> "$TMP/$out.ns"
    rm -rf "$TMP/out.t" "$TMP/tm"
}

i=0
while [ $i -lt "$REPS" ]; do
    timed 1
    timed 0
    timed 1 subburn
    pair hz100
    pair hz1000
    i=$((i + 1))
done

median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.4f-%.4f", lo, hi }'; }
pct() { sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int(NR * p); if (i < 1) i = 1; print v[i] }'; }
ref() { printf 'python.%s | %s | (reference) | -\n' "$1" "$2"; }
row() { # name value floor(<=)
    printf 'python.%s | %s | <= %s | %s\n' "$1" "$2" "$3" "$(awk -v v="$2" -v f="$3" 'BEGIN { print (v <= f ? "ok" : "FAIL") }')"
}

ref bench_setup "$REPS reps x cores $CORES, $PY $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
ref handler_ns_median "$(pct 0.5 < "$TMP/walk1.ns")"
ref handler_ns_p99 "$(pct 0.99 < "$TMP/walk1.ns")"
ref handler_no_walk_ns_median "$(pct 0.5 < "$TMP/walk0.ns")"
ref handler_no_walk_ns_p99 "$(pct 0.99 < "$TMP/walk0.ns")"
ref handler_subinterp_ns_median "$(pct 0.5 < "$TMP/sub.ns")"
ref handler_subinterp_ns_p99 "$(pct 0.99 < "$TMP/sub.ns")"
row cpu_100hz_cpu_ratio "$(median < "$TMP/hz100.r")" 1.02
ref cpu_100hz_cpu_ratio_spread "$(spread < "$TMP/hz100.r")"
ref cpu_1000hz_cpu_ratio "$(median < "$TMP/hz1000.r")"
ref cpu_1000hz_cpu_ratio_spread "$(spread < "$TMP/hz1000.r")"
