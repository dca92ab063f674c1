#!/bin/sh
# Captures, the agent's side (issue 29), against librdkafka's mock cluster in capbench:
# (a0) what watching costs the agent alone: /bin/sleep 1 and 11 under the agent, watching
#     against CONTPROF_CAPTURES=0, PAIRS pairs each; the slope is the steady cost per
#     second (floor 0.05% of a core), the rest the consumer's start;
# (a) what watching the control topic costs when no capture runs: PAIRS pairs of
#     `cpcap cpu SECS` (threads alpha and beta burning SECS of CPU each) under the agent
#     with brokers, CONTPROF_CAPTURES=1 against =0, alternating; the child's CPU from
#     wait4; the median ratio (floor 1.0005: 0.05%);
# (a0, a) again with the agents polling a contprofd (CAPBENCH_SERVER) instead of
#     consuming the control topic: rows "watch_poll_*"; and one poll's CPU, measured in
#     this process over 2,000 back to back and over 20 spaced as the agent spaces them
#     (cold caches: the cost that counts; steadier than the pairs on a loaded machine);
# (b) the time from the control message's produce call to the capture's first window
#     start (the agent's tick that boosted the isolate), median and p99 over N captures.
# Prints rows "name | value | floor | ok".
#   bench/collector/capture.sh [BUILD_DIR]   (default: build)
# Environment: PAIRS (default 6), SECS (default 4), N (default 25).
set -eu
BUILD=${1:-${BUILD_DIR:-build}}
make -C "$BUILD" -j2 capbench cpcap contprof_lib contprofd >/dev/null
work=$(mktemp -d /tmp/contprof-bench-capwatch-XXXXXX)
dpid=
trap 'kill -TERM $dpid 2>/dev/null; wait $dpid 2>/dev/null; rm -rf "$work"' EXIT INT TERM
. "$(dirname "$0")/../contprofd.sh"
start_contprofd "$BUILD" "$work"
for server in "" "$url"; do
    export CAPBENCH_SERVER="$server"
    [ -n "$server" ] || unset CAPBENCH_SERVER
"$BUILD/bench/collector/capbench" pollcost "$url" 2000
"$BUILD/bench/collector/capbench" pollcost "$url" 20 750
    "$BUILD/bench/collector/capbench" idle "$BUILD/collector/libcontprof.so" \
        "$BUILD/tests/collector/cpcap" "${PAIRS:-6}"
    "$BUILD/bench/collector/capbench" cost "$BUILD/collector/libcontprof.so" \
        "$BUILD/tests/collector/cpcap" "${PAIRS:-6}" "${SECS:-4}"
done
unset CAPBENCH_SERVER
"$BUILD/bench/collector/capbench" pollcost "$url" 2000
"$BUILD/bench/collector/capbench" pollcost "$url" 20 750
"$BUILD/bench/collector/capbench" latency "$BUILD/collector/libcontprof.so" \
    "$BUILD/tests/collector/cpcap" "${N:-25}"
