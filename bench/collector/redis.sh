#!/bin/sh
# The agent's cost on a real server: Debian's redis-server under libcontprof at its defaults
# (100 Hz CPU sampling, allocation sampling every 512 KiB, 10 s windows) against redis
# alone, in one run. Prints rows "name | value | floor | ok" as run.sh does.
#   bench/collector/redis.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 7), REQUESTS per round and server (default 200000),
# AGENT_ENV: more VAR=VALUE for the agent's server (CONTPROF_CPU_HZ=0: allocations only).
#
# Three servers run at once, pinned to core 0: one under the agent, two without (the
# second one measures how far this machine moves a ratio by itself); three redis-benchmark
# clients, pinned to core 1, load them at the same time with the same requests
# (pipelined by 16: set, get, incr, lpush, lpop, sadd, hset, 100-byte values, random keys
# among 100,000). The cost is each server's CPU time per request: the sum over its
# threads (the agent's thread included) of /proc/PID/task/*/schedstat's run time, in ns,
# around each round. A warm-up round comes first (the servers' data sets, the agent's
# start-up); the row is the median over REPS rounds, and a `_spread` row gives the range.
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$(cd "$BUILD/collector" 2> /dev/null && pwd)/libcontprof.so
REPS=${REPS:-7}
N=${REQUESTS:-200000}
for c in redis-server redis-benchmark redis-cli taskset; do
    command -v $c > /dev/null 2>&1 || { echo "redis bench: needs $c (sh .ci/deps)" >&2; exit 1; }
done
[ -f "$LIB" ] || { echo "redis bench: build $LIB first" >&2; exit 1; }
CORE_S=0
CORE_C=0
[ "$(nproc)" -gt 1 ] && CORE_C=1
TMP=$(mktemp -d)
PIDS=""
# the servers stopped and waited for (the agent writes its last window at exit)
trap 'for p in $PIDS; do kill "$p" 2> /dev/null; done; wait; rm -rf "$TMP"' EXIT

# a free loopback port (bound and released by the kernel's choice)
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start NAME [VAR=VALUE...]: a redis-server pinned to CORE_S with the variables given;
# sets NAME's port and pid in $TMP/NAME.port and $TMP/NAME.pid
start() {
    name=$1
    shift
    port=$(free_port)
    mkdir -p "$TMP/$name"
    env "$@" taskset -c $CORE_S redis-server --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --dir "$TMP/$name" --daemonize no > "$TMP/$name.log" 2>&1 &
    echo $! > "$TMP/$name.pid"
    echo "$port" > "$TMP/$name.port"
    PIDS="$PIDS $!"
    i=0
    until redis-cli -p "$port" ping > /dev/null 2>&1; do
        i=$((i + 1))
        [ $i -gt 200 ] && { echo "redis bench: $name did not start" >&2; cat "$TMP/$name.log" >&2; exit 1; }
        sleep 0.05
    done
}

# cpu_ns NAME: the server's CPU time so far, every thread's
cpu_ns() { cat /proc/"$(cat "$TMP/$1.pid")"/task/*/schedstat | awk '{ t += $1 } END { printf "%.0f", t }'; }
# agent_ns NAME: the CPU time so far of the agent's own thread in the server (0 if none)
agent_ns() {
    for t in /proc/"$(cat "$TMP/$1.pid")"/task/*; do
        [ "$(cat "$t/comm" 2> /dev/null)" = contprof-agent ] && cat "$t/schedstat"
    done | awk '{ t += $1 } END { printf "%.0f", t }'
}

SERVERS="agent plain plain2"
# shellcheck disable=SC2086
start agent ${AGENT_ENV:-} CONTPROF_OUTPUT_DIR="$TMP/windows" LD_PRELOAD="$LIB"
start plain
start plain2

# round: every server loaded at once; appends each one's ns per request to $TMP/NAME.ns
round() {
    for s in $SERVERS; do echo "$(cpu_ns $s)" > "$TMP/$s.before"; done
    echo "$(agent_ns agent)" > "$TMP/agent_thread.before"
    clients=""
    for s in $SERVERS; do
        taskset -c $CORE_C redis-benchmark -p "$(cat "$TMP/$s.port")" -n "$N" -P 16 -r 100000 \
            -d 100 -t set,get,incr,lpush,lpop,sadd,hset -q > "$TMP/$s.bench" 2>&1 &
        clients="$clients $!"
    done
    for p in $clients; do wait "$p"; done
    for s in $SERVERS; do
        kill -0 "$(cat "$TMP/$s.pid")" 2> /dev/null || { echo "redis bench: $s died" >&2; cat "$TMP/$s.log" >&2; exit 1; }
        # 7 tests of N requests each
        awk -v a="$(cat "$TMP/$s.before")" -v b="$(cpu_ns $s)" -v n="$N" \
            'BEGIN { printf "%.1f\n", (b - a) / (7 * n) }' >> "$TMP/$s.ns"
    done
    awk -v a="$(cat "$TMP/agent_thread.before")" -v b="$(agent_ns agent)" -v n="$N" \
        'BEGIN { printf "%.1f\n", (b - a) / (7 * n) }' >> "$TMP/agent_thread.ns"
}

round
rm -f "$TMP"/*.ns
i=0
while [ $i -lt "$REPS" ]; do
    round
    i=$((i + 1))
done

median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.4f-%.4f", lo, hi }'; }
ratios() { paste "$TMP/$1.ns" "$TMP/$2.ns" | awk '{ print $1 / $2 }'; }
row() { # name value op floor
    ok=$(awk -v v="$2" -v f="$4" -v op="$3" 'BEGIN { print ((op == "<=" ? v <= f : v >= f) ? "ok" : "FAIL") }')
    printf '%s | %s | %s %s | %s\n' "$1" "$2" "$3" "$4" "$ok"
}
ref() { printf '%s | %s | (reference) | -\n' "$1" "$2"; }

ref redis.bench_setup "$REPS rounds x $N requests x 7 tests, 3 servers on core $CORE_S, clients on core $CORE_C, redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*malloc=\([^ ]*\).*/\1 (\2)/')"
ref redis.plain_cpu_ns_per_request "$(median < "$TMP/plain.ns")"
ref redis.agent_cpu_ns_per_request "$(median < "$TMP/agent.ns")"
ref redis.noise_plain2_vs_plain_cpu_ratio "$(ratios plain2 plain | median)"
ref redis.noise_plain2_vs_plain_cpu_ratio_spread "$(ratios plain2 plain | spread)"
row redis.agent_100hz_512k_cpu_ratio "$(ratios agent plain | median)" "<=" 1.05
ref redis.agent_100hz_512k_cpu_ratio_spread "$(ratios agent plain | spread)"
# the agent's thread (draining rings, windows: symbolizing, encoding, writing) apart from
# what the hooks and the signal handler cost the server's own threads
ref redis.agent_thread_cpu_ns_per_request "$(median < "$TMP/agent_thread.ns")"
ref redis.agent_without_its_thread_cpu_ratio "$(paste "$TMP/agent.ns" "$TMP/agent_thread.ns" "$TMP/plain.ns" | awk '{ print ($1 - $2) / $3 }' | median)"
ref redis.agent_alloc_profiles_written "$(ls "$TMP/windows" 2> /dev/null | grep -c '\.alloc\.')"
