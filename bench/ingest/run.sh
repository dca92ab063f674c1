#!/bin/sh
# Ingest benchmark: realistic 10 s CPU windows (2,000 distinct stacks of depth 10-60 in the
# service, 1,000 samples per window, raw pprof with lz4 on the topic, as the agent sends
# them) from Kafka (the embedded mock cluster) into the store with synced LevelDB writes;
# and the same decode + store path on one thread without Kafka, gzip'd and raw. Prints table rows: name | value | floor | ok.
# usage: bench/ingest/run.sh BUILD_DIR [WINDOWS]
set -eu
build=$1
n=${2:-3000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bench/ingest/bench_ingest" "$work" "$n" > "$work/out.txt" 2> "$work/err.txt" || {
    cat "$work/err.txt" >&2
    exit 1
}
awk -v n="$n" '
    { v[$1] = $2 }
    END {
        printf "ingest: Kafka (mock) -> synced LevelDB, %d windows, wall | %d windows/s | - | -\n", n, v["kafka_windows_per_s"]
        k = v["kafka_windows_per_cpu_s"]
        printf "ingest: Kafka (raw pprof, lz4) -> store, windows per CPU-second (consumer + broker + store) | %d | >= 5000 | %s\n", k, (k >= 5000 ? "ok" : "BELOW FLOOR")
        d = v["direct_windows_per_cpu_s"]
        printf "ingest: decode + store on one thread, gzip pprof, windows per CPU-second | %d | >= 5000 | %s\n", d, (d >= 5000 ? "ok" : "BELOW FLOOR")
        r = v["direct_raw_windows_per_cpu_s"]
        printf "ingest: decode + store on one thread, raw pprof, windows per CPU-second | %d | >= 5000 | %s\n", r, (r >= 5000 ? "ok" : "BELOW FLOOR")
    }' "$work/out.txt"
