#!/bin/sh
# Runs workerd (WORKERD) serving worker.js on 127.0.0.1:PORT with V8's perf map, under
# whatever LD_PRELOAD and CONTPROF_* the environment holds; sends N requests with curl to the Worker and N to its Durable Object,
# then prints workerd's CPU time so far ("workerd_cpu_ticks N", user + system, clock ticks)
# and sends SIGTERM (workerd ignores SIGINT). usage: run.sh WORKERD PORT N
set -eu
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$here/worker.js" "$tmp/"
cat > "$tmp/config.capnp" <<CAPNP
using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [(name = "main", worker = .w)],
  sockets = [(name = "http", address = "127.0.0.1:$2", http = (), service = "main")],
  v8Flags = ["--perf-basic-prof", "--interpreted-frames-native-stack"],
);
const w :Workerd.Worker = (
  modules = [(name = "worker", esModule = embed "worker.js")],
  compatibilityDate = "2024-01-01",
  durableObjectNamespaces = [(className = "Counter", uniqueKey = "contprof-test-counter")],
  durableObjectStorage = (inMemory = void),
  bindings = [(name = "COUNTER", durableObjectNamespace = "Counter")],
);
CAPNP
# in tmp: V8's log files (isolate-*-v8.log, written with the perf map) go away with it
(cd "$tmp" && exec "$bin" serve "$tmp/config.capnp" > "$tmp/log" 2>&1) &
pid=$!
i=0
until grep -q Listening "$tmp/log"; do
  i=$((i + 1))
  [ $i -lt 200 ] || { cat "$tmp/log"; kill -TERM $pid; exit 1; }
  sleep 0.05
done
n=0
while [ $n -lt "$3" ]; do
  curl -sf "http://127.0.0.1:$2/" > /dev/null
  curl -sf "http://127.0.0.1:$2/do" > /dev/null
  n=$((n + 1))
done
awk '{print "workerd_cpu_ticks", $14 + $15}' "/proc/$pid/stat"
kill -TERM $pid
wait $pid || true
rm -f "/tmp/perf-$pid.map"
