#!/bin/sh
# Heap snapshots (model/heapsnap.c, issue 39): for node heaps of about 10, 50 and 120 MB
# (tests/model/js/hoard.js with more objects), V8's own cost to write the snapshot (the
# isolate is paused for it: v8.writeHeapSnapshot's wall time, measured in node) and
# contprof's cost to read it as a retainer profile (`contprof merge --format top`: CPU
# seconds and peak RSS, from /usr/bin/time), each per MB of heap. Prints rows
# "name | value | floor | ok"; the load average before and after.
#   bench/v8/heapsnap.sh [BUILD_DIR]   (default: build; Release numbers: build-release)
# Environment: SIZES (default "65000 330000 800000": objects for ~10, 50, 120 MB).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
CP=$BUILD/query/contprof
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SIZES=${SIZES:-"65000 330000 800000"}
[ -x "$CP" ] || { echo "heapsnap bench: build $BUILD first" >&2; exit 1; }
command -v node > /dev/null 2>&1 && [ -x /usr/bin/time ] || { echo "heapsnap bench: needs node and /usr/bin/time" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "load_before | $(cut -d' ' -f1-3 /proc/loadavg) | |"
# node: heapUsed after collections, and the snapshot's wall time
cat > "$TMP/snap.js" << 'JS'
const v8 = require('v8');
const n = Number(process.argv[3]);
const HOARD = [];
for (let i = 0; i < n; i++) HOARD.push({ id: i, name: 'item' + i, tags: [i, i + 1] });
globalThis.keep = () => HOARD.length;
setTimeout(() => {
  gc(); gc();
  const used = process.memoryUsage().heapUsed;
  const t0 = process.hrtime.bigint();
  v8.writeHeapSnapshot(process.argv[2]);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  console.log(used, ms.toFixed(1));
}, 10);
JS
for n in $SIZES; do
    out=$(node --expose-gc --max-old-space-size=1024 "$TMP/snap.js" "$TMP/h.heapsnapshot" "$n") || exit 1
    used=$(echo "$out" | cut -d' ' -f1)
    pause=$(echo "$out" | cut -d' ' -f2)
    file=$(stat -c %s "$TMP/h.heapsnapshot")
    /usr/bin/time -f '%U %S %M' -o "$TMP/t" "$CP" merge --format top "$TMP/h.heapsnapshot" > /dev/null || exit 1
    read -r u s rss < "$TMP/t"
    mb=$(awk -v b="$used" 'BEGIN { printf "%.0f", b / 1048576 }')
    awk -v mb="$mb" -v u="$u" -v s="$s" -v rss="$rss" -v pause="$pause" -v file="$file" 'BEGIN {
        printf "heap_%dmb_snapshot_file_mb | %.0f | |\n", mb, file / 1048576
        printf "heap_%dmb_v8_pause_ms_per_mb | %.1f (%.0f ms) | |\n", mb, pause / mb, pause
        printf "heap_%dmb_read_cpu_ms_per_mb | %.1f (%.2f s) | <= 50 | %s\n", mb, (u + s) * 1000 / mb, u + s, (u + s) * 1000 / mb <= 50 ? "ok" : "FAIL"
        printf "heap_%dmb_read_peak_rss_mb | %.0f (%.1fx the heap) | <= 4x heap | %s\n", mb, rss / 1024, rss / 1024 / mb, rss / 1024 <= 4 * mb ? "ok" : "FAIL"
    }'
    rm -f "$TMP/h.heapsnapshot"
done
echo "load_after | $(cut -d' ' -f1-3 /proc/loadavg) | |"
