#!/bin/sh
# Captures, the agent's side (issue 29), against librdkafka's mock cluster in capbench:
# (a) what watching the control topic costs when no capture runs: PAIRS pairs of
#     `cpcap cpu SECS` (threads alpha and beta burning SECS of CPU each) under the agent
#     with brokers, CONTPROF_CAPTURES=1 against =0, alternating; the child's CPU from
#     wait4; the median ratio (floor 1.0005: 0.05%);
# (b) the time from the control message's produce call to the capture's first window
#     start (the agent's tick that boosted the isolate), median and p99 over N captures.
# Prints rows "name | value | floor | ok".
#   bench/collector/capture.sh [BUILD_DIR]   (default: build)
# Environment: PAIRS (default 8), SECS (default 10), N (default 25).
set -eu
BUILD=${1:-${BUILD_DIR:-build}}
make -C "$BUILD" -j2 capbench cpcap contprof_lib >/dev/null
"$BUILD/bench/collector/capbench" cost "$BUILD/collector/libcontprof.so" \
    "$BUILD/tests/collector/cpcap" "${PAIRS:-8}" "${SECS:-10}"
"$BUILD/bench/collector/capbench" latency "$BUILD/collector/libcontprof.so" \
    "$BUILD/tests/collector/cpcap" "${N:-25}"
