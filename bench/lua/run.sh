#!/bin/sh
# Lua adapter overhead: a CPU-bound Lua workload (cpu.lua in 4 states, 2 worker threads)
# in contprof-lua-host, without the agent (-A) and with it at 100 Hz and 1000 Hz,
# alternated in one run. Each repetition runs the variants back to back and divides the
# process CPU time of the same number of requests by the baseline's of that repetition;
# the median of REPS ratios is reported. Prints rows "name | value | floor | ok".
# The agent runs with its default 10 s window: a run is shorter, so the cost of building
# and writing a window (once per 10 s in production) is not in the ratio; sampling, the
# Lua hook and walk, allocation sampling and the agent thread's 100 ms drains are.
#   bench/lua/run.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 9), REQUESTS (default 1500), ARG (default 20: fib(20) ...).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
HOST=$BUILD/collector/lua/contprof-lua-host
DIR=$(cd "$(dirname "$0")" && pwd)
REPS=${REPS:-9}
REQ=${REQUESTS:-1500}
ARG=${ARG:-20}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -x "$HOST" ] || { echo "lua bench: build $HOST first" >&2; exit 1; }
SCRIPTS="s1=$DIR/cpu.lua s2=$DIR/cpu.lua s3=$DIR/cpu.lua s4=$DIR/cpu.lua"

# run VARIANT ARGS...: appends "cpu rate" of one run to $TMP/VARIANT
run() {
    v=$1; shift
    # shellcheck disable=SC2086
    out=$("$@" -t 2 -n "$REQ" -a "$ARG" $SCRIPTS) || { echo "lua bench: $v failed" >&2; exit 1; }
    echo "$out" | awk '/^total requests/ { print $7, $9 }' >> "$TMP/$v"
}
agent() { # HZ HOST ARGS...
    hz=$1; shift
    env CONTPROF_CPU_HZ="$hz" CONTPROF_WINDOW=10s CONTPROF_OUTPUT_DIR="$TMP/out" "$@"
}

i=0
while [ $i -lt "$REPS" ]; do
    run base "$HOST" -A
    run hz100 agent 100 "$HOST"
    run hz1000 agent 1000 "$HOST"
    rm -rf "$TMP/out"
    i=$((i + 1))
done

col() { sed -n "${2}p" "$TMP/$1" | awk -v c="$3" '{print $c}'; }
# ratio VARIANT BASE: median over repetitions of cpu(VARIANT)/cpu(BASE)
ratio() {
    j=1
    : > "$TMP/r"
    while [ $j -le "$REPS" ]; do
        awk -v a="$(col "$1" $j 1)" -v b="$(col "$2" $j 1)" 'BEGIN { print a / b }' >> "$TMP/r"
        j=$((j + 1))
    done
    sort -n "$TMP/r" | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
row() { # name value op floor
    ok=$(awk -v v="$2" -v f="$4" -v op="$3" 'BEGIN { print ((op == "<=" ? v <= f : v >= f) ? "ok" : "FAIL") }')
    printf '%s | %s | %s %s | %s\n' "$1" "$2" "$3" "$4" "$ok"
}

base_cpu=$(awk '{ s += $1 } END { printf "%.3f", s / NR }' "$TMP/base")
printf 'lua.baseline_cpu_s_per_run | %s | (reference) | -\n' "$base_cpu"
row lua.cpu_100hz_cpu_ratio "$(ratio hz100 base)" "<=" 1.03
printf 'lua.cpu_1000hz_cpu_ratio | %s | (reported) | -\n' "$(ratio hz1000 base)"
