#!/bin/sh
# Collector overhead: the same workloads (cpb) with and without libcontprof, alternated in
# one run. Each repetition runs every variant back to back and divides its process CPU
# time by the baseline's of the same repetition (neighbours share the machine's load);
# the median of REPS such ratios is reported. Prints rows "name | value | floor | ok".
#   bench/collector/run.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 9), UNITS_CPU (default 40), UNITS_MALLOC (default 15).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
CPB=$BUILD/bench/collector/cpb
GPERF=$(ls /usr/lib/x86_64-linux-gnu/libprofiler.so.0 2>/dev/null || true)
REPS=${REPS:-9}
UC=${UNITS_CPU:-40}
UM=${UNITS_MALLOC:-15}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[ -x "$CPB" ] && [ -f "$LIB" ] || { echo "collector bench: build $CPB and $LIB first" >&2; exit 1; }

# run VARIANT CMD...: appends "cpu maxrss" of one run to $TMP/VARIANT
run() {
    v=$1; shift
    out=$("$@" 2>>"$TMP/stderr") || { echo "collector bench: $v failed" >&2; cat "$TMP/stderr" >&2; exit 1; }
    echo "$out" | awk '{print $2, $3}' >> "$TMP/$v"
}

agent() { # HZ RATE CMD...
    hz=$1 rate=$2; shift 2
    env CONTPROF_CPU_HZ="$hz" CONTPROF_ALLOC_RATE="$rate" CONTPROF_WINDOW=1s \
        CONTPROF_OUTPUT_DIR="$TMP/out" LD_PRELOAD="$LIB" "$@"
}

i=0
while [ $i -lt "$REPS" ]; do
    run cpu_base "$CPB" cpu 2 "$UC"
    run cpu_100 agent 100 -1 "$CPB" cpu 2 "$UC"
    run cpu_1000 agent 1000 -1 "$CPB" cpu 2 "$UC"
    if [ -n "$GPERF" ]; then
        run gperf_100 env CPUPROFILE="$TMP/g.prof" CPUPROFILE_FREQUENCY=100 LD_PRELOAD="$GPERF" "$CPB" cpu 2 "$UC"
        run gperf_1000 env CPUPROFILE="$TMP/g.prof" CPUPROFILE_FREQUENCY=1000 LD_PRELOAD="$GPERF" "$CPB" cpu 2 "$UC"
    fi
    run malloc_base "$CPB" malloc 2 "$UM"
    run malloc_agent agent 100 524288 "$CPB" malloc 2 "$UM"
    rm -rf "$TMP/out"
    i=$((i + 1))
done

cpu_of() { sed -n "${2}p" "$TMP/$1" | awk '{print $1}'; }
maxrss() { sort -n -k2 "$TMP/$1" | tail -1 | awk '{print $2}'; }
# ratio VARIANT BASE: median over repetitions of cpu(VARIANT)/cpu(BASE)
ratio() {
    j=1
    : > "$TMP/r"
    while [ $j -le "$REPS" ]; do
        awk -v a="$(cpu_of "$1" $j)" -v b="$(cpu_of "$2" $j)" 'BEGIN { print a / b }' >> "$TMP/r"
        j=$((j + 1))
    done
    sort -n "$TMP/r" | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
row() { # name value op floor
    ok=$(awk -v v="$2" -v f="$4" -v op="$3" 'BEGIN { print ((op == "<=" ? v <= f : v >= f) ? "ok" : "FAIL") }')
    printf '%s | %s | %s %s | %s\n' "$1" "$2" "$3" "$4" "$ok"
}

c100=$(ratio cpu_100 cpu_base)
c1000=$(ratio cpu_1000 cpu_base)
row collector.cpu_100hz_cpu_ratio "$c100" "<=" 1.01
row collector.cpu_1000hz_cpu_ratio "$c1000" "<=" 1.03
if [ -n "$GPERF" ]; then
    g100=$(ratio gperf_100 cpu_base)
    g1000=$(ratio gperf_1000 cpu_base)
    printf 'collector.gperftools_100hz_cpu_ratio | %s | (reference) | -\n' "$g100"
    printf 'collector.gperftools_1000hz_cpu_ratio | %s | (reference) | -\n' "$g1000"
    # ours must cost less than gperftools at the same rate: overhead(ours) - overhead(gperf)
    row collector.cpu_100hz_minus_gperftools "$(awk -v a="$c100" -v b="$g100" 'BEGIN{printf "%.4f", a-b}')" "<=" 0
    row collector.cpu_1000hz_minus_gperftools "$(awk -v a="$c1000" -v b="$g1000" 'BEGIN{printf "%.4f", a-b}')" "<=" 0
fi
row collector.malloc_512k_cpu_ratio "$(ratio malloc_agent malloc_base)" "<=" 1.05
rss=$(awk -v a="$(maxrss malloc_agent)" -v b="$(maxrss malloc_base)" 'BEGIN { printf "%.1f", (a - b) / 1024 }')
row collector.agent_rss_growth_mib "$rss" "<=" 16
