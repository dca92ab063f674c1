#!/bin/sh
# Cluster benchmark (issue 18): the same data in one contprofd and in three nodes (static
# partitions, node 1 hosting the embedded broker with 6 partitions), then:
# - fan-out cost: a 24 h query (pprof and JSON tree, median of REPS) through node 3 of the
#   cluster against the same query on the single node, as a ratio;
# - per-node figures for the capacity model (query/README.md "A cluster of nodes"): windows
#   stored per CPU-second of each node (process CPU from /proc, the broker's thread included
#   on the node that hosts it), bytes on disk per window, query time per day of data, and
#   the wall-clock rate the whole path held (imports one after the other, each waiting for
#   the store: the fleet's windows replayed as fast as the cluster acknowledges them).
# Data: SERVICES services x one window a minute over 24 h (1,440 windows each; the
#   synthetic 2,000-stack service's shape, bench/genwindows), each service one series.
# Prints table rows: name | value | floor | ok.
# usage: bench/cluster/run.sh BUILD_DIR [SERVICES] [REPS]
set -eu
build=$1
services=${2:-6}
reps=${3:-7}
work=$(mktemp -d)
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
n=1440
mkdir "$work/w"
"$build/bench/genwindows" "$work/w" $n 2000 1000 60
printf 'embedded.partitions = 6\ncluster.peer_timeout = 30s\ncluster.token = bench-cluster-secret\n' > "$work/node1.conf"
printf 'cluster.token = bench-cluster-secret\n' > "$work/peer.conf"

# A port below the kernel's ephemeral range (32768-60999), not listened on: every node must
# know the others' URLs before they start.
free_port() {
    while :; do
        p=$(awk -v s="$$$(date +%N)" 'BEGIN { srand(s % 2147483647); print 20000 + int(rand() * 12000) }')
        grep -q ":$(printf '%04X' "$p") " /proc/net/tcp || { echo "$p"; return; }
    done
}
calc() { awk "BEGIN { printf \"$1\", $2 }"; }
# start NAME PORT ARGS...: contprofd with its log in $work/NAME.log; sets $pid
start() {
    name=$1 port=$2
    shift 2
    "$build/query/contprofd" --data "$work/$name" --http 127.0.0.1:"$port" "$@" \
        > "$work/$name.log" 2>&1 &
    pid=$!
    pids="$pids $pid"
    until curl -sf "http://127.0.0.1:$port/healthz" > /dev/null 2>&1; do sleep 0.1; done
}
cpu_s() { awk '{ printf "%.3f", ($14 + $15) / 100 }' "/proc/$1/stat"; }
# import_all URL: every service, each waiting until stored; prints wall seconds
import_all() {
    t0=$(date +%s.%N)
    i=0
    while [ $i -lt "$services" ]; do
        "$build/query/contprof" import --server "$1" --service "svc$i" "$work/w"/*.pb.gz \
            > /dev/null 2>> "$work/import.err" || { tail -3 "$work/import.err" >&2; exit 1; }
        i=$((i + 1))
    done
    calc %.3f "$(date +%s.%N) - $t0"
}
# median_ms URL FORMAT: the 24 h query's median wall time over $reps runs, in ms
median_ms() {
    to=$(date +%s)
    from=$((to - 86400 - 1800))
    r=0
    : > "$work/times"
    while [ $r -lt "$reps" ]; do
        curl -sf -o /dev/null -w '%{time_total}\n' \
            "$1/api/v1/profile?type=cpu&from=$from&to=$to&format=$2" >> "$work/times"
        r=$((r + 1))
    done
    sort -n "$work/times" | awk '{ v[NR] = $1 } END { printf "%.1f", v[int((NR + 1) / 2)] * 1000 }'
}
windows() { curl -s "$1/metrics" | awk '$1 == "contprof_ingest_windows_total" { print $2 }'; }

# ---- one node ------------------------------------------------------------------------
p1=$(free_port)
start single "$p1" --config "$work/node1.conf"
single=$pid
c0=$(cpu_s $single)
wall1=$(import_all "http://127.0.0.1:$p1")
c1=$(cpu_s $single)
w1=$(windows "http://127.0.0.1:$p1")
d1=$(du -sb "$work/single" | cut -f1)
q1p=$(median_ms "http://127.0.0.1:$p1" pprof)
q1j=$(median_ms "http://127.0.0.1:$p1" json)

# ---- three nodes -----------------------------------------------------------------------
a=$(free_port) b=$(free_port) c=$(free_port)
peers="http://127.0.0.1:$a,http://127.0.0.1:$b,http://127.0.0.1:$c"
start n1 "$a" --config "$work/node1.conf" --peers "$peers" --partitions 0-1
n1=$pid
brokers=$(curl -s "http://127.0.0.1:$a/api/v1/brokers" | sed 's/.*"brokers":"\([^"]*\)".*/\1/')
start n2 "$b" --config "$work/peer.conf" --brokers "$brokers" --peers "$peers" --partitions 2-3
n2=$pid
start n3 "$c" --config "$work/peer.conf" --brokers "$brokers" --peers "$peers" --partitions 4-5
n3=$pid
for p in $n1 $n2 $n3; do eval "cpu0_$p=$(cpu_s $p)"; done
# senders ask the node that hosts the embedded broker: it knows the broker's limits (3 MiB
# unstored in flight), and its offsets carry every node's partitions
wall3=$(import_all "http://127.0.0.1:$a")
q3p=$(median_ms "http://127.0.0.1:$c" pprof)
q3j=$(median_ms "http://127.0.0.1:$c" json)

total=$((services * n))
echo "cluster.setup | $services services x $n windows (1/min over 24 h, 2,000-stack shape), 1 node vs 3 nodes (6 partitions, 2 each; node 1 hosts the broker) | (reference) | -"
echo "cluster.windows_stored_1node | $w1 of $total | = $total | $([ "$w1" = "$total" ] && echo ok || echo no)"
echo "cluster.query_24h_pprof_ms_1node | $q1p | (reference) | -"
echo "cluster.query_24h_pprof_ms_3nodes | $q3p | (reference) | -"
echo "cluster.fanout_cost_24h_pprof_ratio | $(calc %.2f "$q3p / $q1p") | (reference) | -"
echo "cluster.query_24h_json_ms_1node | $q1j | (reference) | -"
echo "cluster.query_24h_json_ms_3nodes | $q3j | (reference) | -"
echo "cluster.fanout_cost_24h_json_ratio | $(calc %.2f "$q3j / $q1j") | (reference) | -"
echo "cluster.ingest_windows_per_cpu_s_1node | $(calc %.0f "$w1 / ($c1 - $c0)") (broker thread included) | (reference) | -"
echo "cluster.bytes_per_window_1node | $(calc %.0f "$d1 / $w1") | (reference) | -"
echo "cluster.import_wall_windows_per_s_1node | $(calc %.0f "$total / $wall1") | (reference) | -"
echo "cluster.import_wall_windows_per_s_3nodes | $(calc %.0f "$total / $wall3") | (reference) | -"
sum=0
k=1
for p in $n1 $n2 $n3; do
    port=$(eval "echo \$$(echo a b c | cut -d' ' -f$k)")
    w=$(windows "http://127.0.0.1:$port")
    eval "c0=\$cpu0_$p"
    cs=$(calc %.3f "$(cpu_s $p) - $c0")
    d=$(du -sb "$work/n$k" | cut -f1)
    sum=$((sum + w))
    echo "cluster.node${k}_windows | $w, $cs CPU-s, $(calc %.0f "$w / $cs") windows per CPU-s$([ $k = 1 ] && echo ' (broker thread included)'), $(calc %.0f "$d / ($w > 0 ? $w : 1)") bytes per window | (reference) | -"
    k=$((k + 1))
done
echo "cluster.windows_stored_3nodes | $sum of $total | = $total | $([ "$sum" = "$total" ] && echo ok || echo no)"
