#!/bin/sh
# Lua adapter overhead: a CPU-bound Lua workload (cpu.lua in 4 states, 2 worker threads)
# in contprof-lua-host, without the agent (-A, twice: the A/A row is the machine's noise)
# and with it at 100 Hz and 1000 Hz, alternated in one run (REPS repetitions, the order
# rotating). Every run serves the same number of requests; its process CPU time (from
# the first request to the last) is compared as the end of this file says. Prints rows "name | value | floor | ok".
# The agent runs with its default 10 s window: a run is shorter, so the cost of building
# and writing a window (once per 10 s in production) is not in the ratio; sampling, the
# Lua hook and walk, allocation sampling and the agent thread's 100 ms drains are.
#   bench/lua/run.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 31), REQUESTS (default 500), ARG (default 20: fib(20) ...).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
HOST=$BUILD/collector/lua/contprof-lua-host
DIR=$(cd "$(dirname "$0")" && pwd)
REPS=${REPS:-31}
REQ=${REQUESTS:-500}
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
    # the order rotates with each repetition: no variant always runs first or last
    for k in 0 1 2 3; do
        case $(((i + k) % 4)) in
        0) run base "$HOST" -A ;;
        1) run hz100 agent 100 "$HOST" ;;
        2) run hz1000 agent 1000 "$HOST" ;;
        3) run base2 "$HOST" -A ;;
        esac
    done
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

# Each variant's CPU time is divided by the mean of the two baselines of the same
# repetition (neighbours share the machine's load of the moment); the gating rows are the
# medians of those ratios over the repetitions. Short runs, many repetitions: the load of
# other processes on this machine changes on a scale of seconds.
# ratio2 VARIANT: median over repetitions of cpu(VARIANT) / mean(cpu(base), cpu(base2))
ratio2() {
    j=1
    : > "$TMP/r"
    while [ $j -le "$REPS" ]; do
        awk -v a="$(col "$1" $j 1)" -v b="$(col base $j 1)" -v c="$(col base2 $j 1)" \
            'BEGIN { print a / ((b + c) / 2) }' >> "$TMP/r"
        j=$((j + 1))
    done
    sort -n "$TMP/r" | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
base_cpu=$(cat "$TMP/base" "$TMP/base2" | awk '{ s += $1 } END { printf "%.3f", s / NR }')
printf 'lua.baseline_cpu_s_per_run | %s | (reference) | -\n' "$base_cpu"
printf 'lua.noise_a_a_cpu_ratio | %s | (reference) | -\n' "$(ratio base2 base)"
row lua.cpu_100hz_cpu_ratio "$(ratio2 hz100)" "<=" 1.03
printf 'lua.cpu_1000hz_cpu_ratio | %s | (reported) | -\n' "$(ratio2 hz1000)"
