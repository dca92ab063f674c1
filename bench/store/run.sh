#!/bin/sh
# Store benchmarks: a 7-day store of one service (60,480 realistic 10 s CPU windows: 2,000
# distinct stacks of depth 10-60, 1,000 samples each) written through the store's batch
# API with synced LevelDB writes; bytes on disk per window (all levels, after compaction)
# against the window's gzip'd pprof; the merged profile of all 7 days and of unaligned
# 24 h windows; 20,000 per-process series past retention forgotten (heap a series holds,
# retention's CPU per series forgotten). Prints table rows: name | value | floor | ok.
# usage: bench/store/run.sh BUILD_DIR [WINDOWS]
set -eu
build=$1
n=${2:-60480}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bench/store/bench_store" build "$work/store" "$n" > "$work/build.txt"
"$build/bench/store/bench_store" query "$work/store" 9 > "$work/query.txt"
"$build/bench/store/bench_store" forget "$work/forget" 20000 > "$work/forget.txt"
cat "$work/build.txt" "$work/query.txt" "$work/forget.txt" | awk -v n="$n" '
    { v[$1] = $2 }
    END {
        printf "store: write %d windows, synced LevelDB (no Kafka) | %d windows/s (%d per CPU-second) | - | -\n", n, v["write_windows_per_s"], v["write_windows_per_cpu_s"]
        r = v["storage_ratio_pct"]
        printf "store: disk per window, all levels, vs gzip pprof (%d B) | %d B = %.2f%% | <= 10%% | %s\n", v["gzip_bytes_per_window"], v["bytes_per_window"], r, (r <= 10 ? "ok" : "BELOW FLOOR")
        w = v["whole_ms_median"]
        printf "store: merged profile of all %d windows (%.1f days) | %.2f ms | <= 50 ms | %s\n", n, v["whole_range_s"] / 86400, w, (w <= 50 ? "ok" : "BELOW FLOOR")
        d = v["day_ms_max"]
        printf "store: merged profile, unaligned 24 h (median / max of 9) | %.2f / %.2f ms | <= 100 ms | %s\n", v["day_ms_median"], d, (d <= 100 ? "ok" : "BELOW FLOOR")
        printf "store: heap per series after open (20,000 per-process series, LevelDB caches in) | %d B | - | -\n", v["heap_bytes_per_series"]
        f = v["forget_cpu_us_per_series"]
        printf "store: retention forgetting a series past retention, CPU | %.1f us | <= 200 us | %s\n", f, (f <= 200 ? "ok" : "BELOW FLOOR")
        printf "store: series left after a reopen, once all were forgotten | %d (heap %d B in all) | 0 | %s\n", v["reopened_series"], v["reopened_heap_bytes"], (v["reopened_series"] == 0 ? "ok" : "BELOW FLOOR")
    }'
