#!/bin/sh
# What one CPU sample costs at 1 kHz (perf task-clock, the agent's engine above 125 Hz), and
# where: the kernel's part measured without the agent (sigcost), the agent's handler timed
# inside it (libcontprof_timing.so: TSC cycles from entry to return), the whole from the
# agent's CPU ratio. Prints rows "name | value | floor | ok", like run.sh.
#   bench/collector/handler.sh [BUILD_DIR]   (default: build; Release numbers: build-release)
# Environment: REPS (default 5).
#
# Timed rows are run.sh's method: a variant and its baseline at once, pinned to the same core
# (interleaved by the scheduler every few ms), on both cores, REPS times; medians of the
# pairs, with their range in a `_spread` row. Per-sample costs divide the CPU a variant adds
# (its CPU minus its pair's) by the samples it took:
#   perf_ring_us_per_sample       the event alone, a ring record per 1 ms of CPU, no signal:
#                                 the timer interrupt, the overflow, the hrtimer restarted
#                                 at each context switch (sigcost ring)
#   perf_signal_us_per_sample     the same with a signal to an empty handler per sample
#                                 (O_ASYNC: irq_work wake-up, signal frame, sigreturn)
#   handler_ns_median / _p99      the agent's handler itself (unwinding a ~20-frame cpb
#                                 stack into the ring), from libcontprof_timing.so
#   cpu_1000hz_cpu_ratio          the agent at 1 kHz on cpb cpu (floor 1.015), and
#   cpu_1000hz_us_per_sample      its cost per sample, everything included
#   cpu_1000hz_timer_cpu_ratio    CONTPROF_CPU_ENGINE=timer at 1 kHz: the scheduler tick's
#                                 250 signals/s, each weighted 1 + overruns (reference)
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
TLIB=$BUILD/collector/libcontprof_timing.so
CPB=$BUILD/bench/collector/cpb
SC=$BUILD/bench/collector/sigcost
REPS=${REPS:-5}
for f in "$LIB" "$TLIB" "$CPB" "$SC"; do [ -e "$f" ] || { echo "handler bench: no $f (build first)" >&2; exit 1; }; done
command -v taskset > /dev/null 2>&1 || { echo "handler bench: needs taskset" >&2; exit 1; }
CORES=0
[ "$(nproc)" -gt 1 ] && CORES="0 1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run VARIANT CORE: one run pinned to CORE; prints "cpu_seconds samples"
run() {
    pin="taskset -c $2"
    case $1 in
    none | none2) $pin "$SC" none 60 | awk '{ print $1, 0 }' ;;
    ring) $pin "$SC" ring 60 1000000 | awk '{ print $1, $3 }' ;;
    signal) $pin "$SC" signal 60 1000000 | awk '{ print $1, $2 }' ;;
    cpb) $pin "$CPB" cpu 1 120 0 | awk '{ print $2, 0 }' ;;
    agent | timer)
        eng=perf
        [ "$1" = timer ] && eng=timer
        c=$(env CONTPROF_CPU_HZ=1000 CONTPROF_CPU_ENGINE=$eng CONTPROF_ALLOC_RATE=-1 CONTPROF_WINDOW=1s \
            CONTPROF_OUTPUT_DIR="$TMP/out.$2" CP_HANDLER_TIMING_OUT="$TMP/tm.$1.$2" LD_PRELOAD="$TLIB" \
            $pin "$CPB" cpu 1 120 0 | awk '{ print $2 }')
        # handler calls counted by the timing build; its cycles kept for the ns rows
        n=$(($(wc -l < "$TMP/tm.$1.$2") - 1))
        tail -n +2 "$TMP/tm.$1.$2" | awk -v g="$(head -1 "$TMP/tm.$1.$2")" '{ printf "%.0f\n", $1 / g }' >> "$TMP/$1.ns"
        rm -rf "$TMP/out.$2"
        echo "$c $n" ;;
    esac
}

# pair VARIANT BASE: both at once on each core; appends "ratio extra_us_per_sample" per core
pair() {
    for c in $CORES; do
        run "$1" "$c" > "$TMP/a.$c" &
        run "$2" "$c" > "$TMP/b.$c" &
    done
    wait
    for c in $CORES; do
        paste "$TMP/a.$c" "$TMP/b.$c" | awk '{ printf "%.5f %.3f\n", $1 / $3, ($2 > 0 ? ($1 - $3) / $2 * 1e6 : 0) }' >> "$TMP/$1.r"
    done
}

i=0
while [ $i -lt "$REPS" ]; do
    pair none2 none
    pair ring none
    pair signal none
    pair agent cpb
    pair timer cpb
    i=$((i + 1))
done

col() { awk -v k="$2" '{ print $k }' "$TMP/$1.r"; }
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.4f-%.4f", lo, hi }'; }
pct() { sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int(NR * p); if (i < 1) i = 1; print v[i] }'; }
ref() { printf 'handler.%s | %s | (reference) | -\n' "$1" "$2"; }
row() { # name value floor(<=)
    printf 'handler.%s | %s | <= %s | %s\n' "$1" "$2" "$3" "$(awk -v v="$2" -v f="$3" 'BEGIN { print (v <= f ? "ok" : "FAIL") }')"
}

ref bench_setup "$REPS reps x cores $CORES, variant and baseline side by side on one core; load $(cut -d' ' -f1-3 /proc/loadavg)"
ref noise_none_vs_none_ratio "$(col none2 1 | median)"
ref noise_none_vs_none_ratio_spread "$(col none2 1 | spread)"
ref perf_ring_us_per_sample "$(col ring 2 | median)"
ref perf_ring_us_per_sample_spread "$(col ring 2 | spread)"
ref perf_signal_us_per_sample "$(col signal 2 | median)"
ref perf_signal_us_per_sample_spread "$(col signal 2 | spread)"
ref handler_ns_median "$(pct 0.5 < "$TMP/agent.ns")"
ref handler_ns_p99 "$(pct 0.99 < "$TMP/agent.ns")"
row cpu_1000hz_cpu_ratio "$(col agent 1 | median)" 1.015
ref cpu_1000hz_cpu_ratio_spread "$(col agent 1 | spread)"
ref cpu_1000hz_us_per_sample "$(col agent 2 | median)"
ref cpu_1000hz_us_per_sample_spread "$(col agent 2 | spread)"
ref cpu_1000hz_timer_cpu_ratio "$(col timer 1 | median)"
ref cpu_1000hz_timer_cpu_ratio_spread "$(col timer 1 | spread)"
ref timer_handler_ns_median "$(pct 0.5 < "$TMP/timer.ns")"
