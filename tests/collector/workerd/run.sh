#!/bin/sh
# Runs workerd (WORKERD) serving worker.js on 127.0.0.1:PORT with V8's perf map, under
# whatever LD_PRELOAD and CONTPROF_* the environment holds (curl runs without LD_PRELOAD);
# sends N requests with curl to the Worker and N to its Durable Object, then prints
# workerd's CPU time so far ("workerd_cpu_ticks N", user + system, clock ticks) and its pid
# ("workerd_pid P"), and sends
# SIGTERM (workerd ignores SIGINT). The config is the same whatever the port (given with
# --socket-addr): several processes of it are one service. usage: run.sh WORKERD PORT N
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
  sockets = [(name = "http", address = "127.0.0.1:8080", http = (), service = "main")],
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
: > "$tmp/log"
(cd "$tmp" && exec "$bin" serve "$tmp/config.capnp" -s "http=127.0.0.1:$2" > "$tmp/log" 2>&1) &
pid=$!
i=0
until grep -q Listening "$tmp/log"; do
  i=$((i + 1))
  [ $i -lt 200 ] || { cat "$tmp/log"; kill -TERM $pid; exit 1; }
  sleep 0.05
done
n=0
while [ $n -lt "$3" ]; do
  env -u LD_PRELOAD curl -sf "http://127.0.0.1:$2/" > /dev/null
  env -u LD_PRELOAD curl -sf "http://127.0.0.1:$2/do" > /dev/null
  n=$((n + 1))
done
awk '{print "workerd_cpu_ticks", $14 + $15}' "/proc/$pid/stat"
echo "workerd_pid $pid"
kill -TERM $pid
wait $pid || true
rm -f "/tmp/perf-$pid.map"
