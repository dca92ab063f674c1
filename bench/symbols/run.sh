#!/bin/sh
# Server-side symbolization (CONTPROF_SYMBOLIZE=server) against the default (agent), in one
# run. Prints table rows: name | value | floor | ok.
#   bench/symbols/run.sh [BUILD_DIR]        SECS (default 20), WINDOWS (ingest, default 3000)
# EPOCHS_BASELINE=1 adds two copies whose agents keep no epoch (CONTPROF_EPOCH_STREAMS=0:
# every window built fresh, as before epochs, collector/README.md), modes agent-fresh and
# server-fresh, run at the same time as the others so the comparison sees the same load.
#
# Agent rows: three copies of tests/demo/demo_service (six threads, C stacks 10-30 deep)
# run at the same time for SECS seconds: one without the agent (the RSS baseline), one
# under the agent with CONTPROF_SYMBOLIZE=agent, one with =server; 1 s windows (ten times
# the default rate, so that a short run holds many windows), written as files. While they
# run, /proc is read every 0.2 s: the agent thread's ("contprof-agent") CPU time, the
# process's age and VmRSS; the last reading before exit counts.
#   profile bytes       one profile (one kind, one isolate, one window), the mean over the
#                       run's files: cpu profiles, and every kind; gzip'd as written, and raw
#                       pprof as sent to Kafka (lz4 on the topic)
#   agent CPU/window    the agent thread's user+system time / window ends so far (the
#                       process's age in whole 1 s windows); and in steady state: from the
#                       first reading at 5 window ends on (libdw loaded, first stacks named)
#   agent RSS           VmRSS minus the baseline copy's VmRSS
# Epoch rows: bench/symbols/epochs.sh (when valgrind is installed).
# Ingest rows: bench/ingest's Kafka path (embedded mock broker -> ingest -> synced LevelDB)
# for the 2,000-stack synthetic service's windows, symbolized as the agent sends them by
# default and unsymbolized (CP_BENCH_UNSYMBOLIZED=1: addresses and a mapping with a build
# ID), windows per CPU-second of the process without the embedded broker's thread.
set -eu
build=${1:-build}
secs=${SECS:-20}
nwin=${WINDOWS:-3000}
work=$(mktemp -d /tmp/contprof-bench-symbols-XXXXXX)
trap 'rm -rf "$work"' EXIT
demo=$build/tests/demo/demo_service
lib=$(cd "$build/collector" && pwd)/libcontprof.so
hz=$(getconf CLK_TCK)

modes="agent server"
[ "${EPOCHS_BASELINE:-0}" = 1 ] && modes="$modes agent-fresh server-fresh"
start() { # mode -> pid on stdout
    mkdir -p "$work/$1"
    case $1 in
    none) "$demo" --duration "$secs" > "$work/$1.log" 2>&1 & ;;
    *-fresh)
        LD_PRELOAD=$lib CONTPROF_SYMBOLIZE=${1%-fresh} CONTPROF_EPOCH_STREAMS=0 CONTPROF_WINDOW=1s \
            CONTPROF_SERVICE=bench CONTPROF_OUTPUT_DIR=$work/$1 "$demo" --duration "$secs" \
            > "$work/$1.log" 2>&1 & ;;
    *)
        LD_PRELOAD=$lib CONTPROF_SYMBOLIZE=$1 CONTPROF_WINDOW=1s CONTPROF_SERVICE=bench \
            CONTPROF_OUTPUT_DIR=$work/$1 "$demo" --duration "$secs" > "$work/$1.log" 2>&1 & ;;
    esac
    echo $!
}
p_none=$(start none)
pids=""
for m in $modes; do
    pids="$pids $(start "$m"):$m"
done

# one reading of a process: agent_cpu_ns window_ends rss_kib (stays at the last good one)
read_proc() { # pid mode
    ticks=0
    for t in /proc/"$1"/task/*; do
        [ "$(cat "$t/comm" 2>/dev/null)" = contprof-agent ] || continue
        ticks=$(awk '{ print $1 }' "$t/schedstat" 2>/dev/null || echo 0) # ns on CPU
    done
    rss=$(awk '/^VmRSS:/ { print $2 }' /proc/"$1"/status 2>/dev/null || echo 0)
    st=$(awk '{ sub(/^.*\) /, ""); print $20 }' /proc/"$1"/stat 2>/dev/null || echo 0)
    ends=$(awk -v st="$st" -v hz="$hz" '{ print int($1 - st / hz) }' /proc/uptime)
    [ -n "$rss" ] && [ "$rss" -gt 0 ] && echo "$ticks $ends $rss" > "$work/$2.last"
    [ -f "$work/$2.warm" ] || [ "$ends" -lt 5 ] || cp "$work/$2.last" "$work/$2.warm"
    return 0
}
running() {
    for pm in $pids; do kill -0 "${pm%%:*}" 2>/dev/null && return 0; done
    return 1
}
while running; do
    read_proc "$p_none" none
    for pm in $pids; do read_proc "${pm%%:*}" "${pm#*:}"; done
    sleep 0.2
done
wait || true

base_rss=$(awk '{ print $3 }' "$work/none.last")
for m in $modes; do
    set -- $(cat "$work/$m.last")
    ticks=$1 ends=$2 rss=$3
    set -- $(cat "$work/$m.warm" 2>/dev/null || echo 0 0 0)
    wticks=$1 wends=$2
    files=$(ls "$work/$m" | wc -l)
    gz=$(cat "$work/$m"/*.pb.gz | wc -c)
    raw=$(for f in "$work/$m"/*.pb.gz; do gzip -dc "$f"; done | wc -c)
    cfiles=$(ls "$work/$m"/*.cpu.*.pb.gz | wc -l)
    cgz=$(cat "$work/$m"/*.cpu.*.pb.gz | wc -c)
    craw=$(for f in "$work/$m"/*.cpu.*.pb.gz; do gzip -dc "$f"; done | wc -c)
    awk -v m="$m" -v ticks="$ticks" -v ends="$ends" -v hz="$hz" -v rss="$rss" -v base="$base_rss" \
        -v files="$files" -v gz="$gz" -v raw="$raw" -v cfiles="$cfiles" -v cgz="$cgz" \
        -v craw="$craw" -v wticks="$wticks" -v wends="$wends" 'BEGIN {
        printf "symbols: %s: bytes of a cpu profile (one isolate-window), gzip / raw pprof | %d / %d | - | -\n", m, cgz / cfiles, craw / cfiles
        printf "symbols: %s: bytes of a profile of any kind (%d profiles), gzip / raw pprof | %d / %d | - | -\n", m, files, gz / files, raw / files
        printf "symbols: %s: agent thread CPU per window end (ms, %d ends) | %.2f | - | -\n", m, ends, ends ? ticks / 1e6 / ends : 0
        printf "symbols: %s: agent thread CPU per window end in steady state (ms, ends %d to %d) | %.2f | - | -\n", m, wends, ends, (ends > wends ? (ticks - wticks) / 1e6 / (ends - wends) : 0)
        printf "symbols: %s: agent RSS (KiB over the same program without the agent) | %d | - | -\n", m, rss - base
    }'
done

for u in 0 1; do
    mkdir -p "$work/ingest$u"
    CP_BENCH_UNSYMBOLIZED=$u "$build/bench/ingest/bench_ingest" "$work/ingest$u" "$nwin" kafka \
        > "$work/ingest$u.txt" 2> "$work/ingest$u.err" || { cat "$work/ingest$u.err" >&2; exit 1; }
done
awk '
    FNR == 1 { f++ }
    { v[f, $1] = $2 }
    END {
        printf "symbols: ingest, symbolized windows (raw pprof bytes %d), windows per CPU-second without the broker thread | %d | - | -\n", v[1, "raw_bytes_per_window"], v[1, "kafka_windows_per_cpu_s_nobroker"]
        u = v[2, "kafka_windows_per_cpu_s_nobroker"]
        printf "symbols: ingest, unsymbolized windows (raw pprof bytes %d), windows per CPU-second without the broker thread | %d | >= 5000 | %s\n", v[2, "raw_bytes_per_window"], u, (u >= 5000 ? "ok" : "BELOW FLOOR")
        if (v[1, "kafka_windows_per_cpu_s_nobroker"] > 0)
            printf "symbols: ingest, unsymbolized / symbolized windows per CPU-second | %.2f | - | -\n", u / v[1, "kafka_windows_per_cpu_s_nobroker"]
    }' "$work/ingest0.txt" "$work/ingest1.txt"

# what epochs save the agent in building windows, in instructions (deterministic, callgrind)
if command -v valgrind > /dev/null 2>&1; then
    sh "$(dirname "$0")/epochs.sh" "$build"
fi
