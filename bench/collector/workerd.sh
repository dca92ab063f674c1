#!/bin/sh
# workerd's CPU per request with the agent (LD_PRELOAD=libcontprof.so, 100 Hz, 1 s windows
# to files, the perf map read) against without, serving tests/collector/workerd/worker.js
# with V8's perf map on (tests/collector/workerd/run.sh: N sequential curl requests;
# workerd's own user + system time from /proc/PID/stat, 10 ms ticks). Alternating, RUNS
# each; prints rows "name | value" (medians).
#   bench/collector/workerd.sh [BUILD_DIR]   (default: build)
# Environment: RUNS (default 5), N (requests per run, default 300).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$(cd "$BUILD/collector" && pwd)/libcontprof.so
RUNS=${RUNS:-5}
N=${N:-300}
here=$(cd "$(dirname "$0")/../../tests/collector/workerd" && pwd)
[ -f "$LIB" ] || { echo "no $LIB (build first)" >&2; exit 1; }
WORKERD=$(sh "$here/install.sh" "$BUILD/tests/collector/workerd" | tail -1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
port=$((21000 + $$ % 9000))
i=0
while [ $i -lt "$RUNS" ]; do
  env -u LD_PRELOAD sh "$here/run.sh" "$WORKERD" $port "$N" | awk '/workerd_cpu_ticks/ {print $2}' >> "$TMP/plain"
  mkdir -p "$TMP/out$i"
  LD_PRELOAD=$LIB CONTPROF_OUTPUT_DIR="$TMP/out$i" CONTPROF_WINDOW=1s \
    sh "$here/run.sh" "$WORKERD" $port "$N" | awk '/workerd_cpu_ticks/ {print $2}' >> "$TMP/agent"
  i=$((i + 1))
done
python3 - "$TMP/plain" "$TMP/agent" "$N" "$(getconf CLK_TCK)" <<'PY'
import statistics, sys
plain = [int(x) for x in open(sys.argv[1])]
agent = [int(x) for x in open(sys.argv[2])]
n, hz = int(sys.argv[3]), int(sys.argv[4])
p, a = statistics.median(plain), statistics.median(agent)
print("workerd_cpu_ms_per_request_plain | %.3f" % (p * 1000 / hz / n))
print("workerd_cpu_ms_per_request_agent | %.3f" % (a * 1000 / hz / n))
print("workerd_cpu_added_pct | %.1f" % (100 * (a / p - 1)))
PY
