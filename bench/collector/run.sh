#!/bin/sh
# Collector overhead: the same workloads (cpb) with and without libcontprof, alternated in
# one run. Each repetition runs every variant back to back and divides its process CPU
# time by the baseline's of the same repetition (neighbours share the machine's load);
# the median of REPS such ratios is reported. Prints rows "name | value | floor | ok".
#   bench/collector/run.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 9), UNITS_CPU (default 40), UNITS_MALLOC (default 15).
#
# On a shared 2-core machine the timed ratios move by a few percent from run to run, more
# than the overheads being measured. So, when valgrind is installed, the same workloads
# are also counted in instructions (cachegrind, deterministic), as marginal costs between
# a short and a long run so that start-up and the last window cancel out:
#   cpu_instr_per_sample      agent instructions per CPU sample (handler, unwinding,
#                             aggregation, profile building), from 1000 Hz runs
#   cpu_{100,1000}hz_est      that cost at 100/1000 Hz on one busy thread, as a fraction
#                             of its native instruction rate (kernel signal delivery not
#                             included)
#   malloc_512k_instr_ratio   instructions with/without the agent per unit of the malloc
#                             workload (hooks, sampling, frees of sampled blocks)
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
    run cpu_base2 "$CPB" cpu 2 "$UC"
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

# the same program twice without the agent: how far this machine moves a ratio by itself
printf 'collector.noise_base_vs_base_cpu_ratio | %s | (reference) | -\n' "$(ratio cpu_base2 cpu_base)"
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

if command -v valgrind > /dev/null 2>&1 && [ -x "$BUILD/query/contprof" ]; then
    # instr [VAR=VALUE...] CMD...: instructions executed (all threads)
    instr() { env "$@" 2>&1 >/dev/null | awk '/I *refs/ { gsub(",", "", $4); print $4 }'; }
    VG="valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null"
    # samples DIR: CPU samples in the profiles written there
    samples() { "$BUILD/query/contprof" merge --format top --sample-index samples "$1"/*.cpu.* | awk 'NR == 2 { gsub(",", "", $5); print $5 }'; }
    # agent DIR HZ RATE: the variables that run a command under the agent
    # (one window for the whole run, so both runs do the same end-of-window work)
    agent_env() { echo "CONTPROF_CPU_HZ=$2 CONTPROF_ALLOC_RATE=$3 CONTPROF_OUTPUT_DIR=$1 CONTPROF_WINDOW=10m LD_PRELOAD=$LIB"; }
    a1=$(instr $(agent_env "$TMP/v1" 1000 -1) $VG "$CPB" cpu 1 10); n1=$(samples "$TMP/v1")
    a2=$(instr $(agent_env "$TMP/v2" 1000 -1) $VG "$CPB" cpu 1 60); n2=$(samples "$TMP/v2")
    b1=$(instr $VG "$CPB" cpu 1 10); b2=$(instr $VG "$CPB" cpu 1 60)
    per=$(awk -v a1="$a1" -v a2="$a2" -v b1="$b1" -v b2="$b2" -v n1="$n1" -v n2="$n2" \
        'BEGIN { printf "%.0f", ((a2 - a1) - (b2 - b1)) / (n2 - n1) }')
    # native instruction rate of the workload: instructions / CPU seconds of a native run
    nat=$("$CPB" cpu 1 60 | awk '{print $2}')
    ips=$(awk -v b="$b2" -v t="$nat" 'BEGIN { printf "%.0f", b / t }')
    row collector.cpu_instr_per_sample "$per" "<=" 30000
    row collector.cpu_100hz_est_overhead "$(awk -v p="$per" -v i="$ips" 'BEGIN { printf "%.5f", 100 * p / i }')" "<=" 0.01
    row collector.cpu_1000hz_est_overhead "$(awk -v p="$per" -v i="$ips" 'BEGIN { printf "%.5f", 1000 * p / i }')" "<=" 0.03
    m1=$(instr $(agent_env "$TMP/v3" 100 524288) $VG "$CPB" malloc 2 3)
    m2=$(instr $(agent_env "$TMP/v4" 100 524288) $VG "$CPB" malloc 2 15)
    c1=$(instr $VG "$CPB" malloc 2 3); c2=$(instr $VG "$CPB" malloc 2 15)
    row collector.malloc_512k_instr_ratio "$(awk -v a1="$m1" -v a2="$m2" -v b1="$c1" -v b2="$c2" 'BEGIN { printf "%.4f", (a2 - a1) / (b2 - b1) }')" "<=" 1.05
fi
rss=$(awk -v a="$(maxrss malloc_agent)" -v b="$(maxrss malloc_base)" 'BEGIN { printf "%.1f", (a - b) / 1024 }')
row collector.agent_rss_growth_mib "$rss" "<=" 16
