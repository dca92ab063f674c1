#!/bin/sh
# What reading V8's perf map costs the agent, under a node script that keeps compiling new
# code (bench/collector/js/compile.js): node with --perf-basic-prof
# --interpreted-frames-native-stack, alone and under LD_PRELOAD=libcontprof.so (1 s
# windows, files), alternating, RUNS each. Prints rows "name | value": the process's CPU
# (user + system, wait4's rusage) per run, median, with and without the agent; the
# functions compiled per run; the perf map's size at exit; the agent's contprof:symbolize
# CPU (which holds the perf map reading) per run, from its contprof-agent profiles.
#   bench/collector/perfmap.sh [BUILD_DIR]   (default: build)
# Environment: RUNS (default 5), COUNT (functions compiled per run, default 4000).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
RUNS=${RUNS:-5}
COUNT=${COUNT:-4000}
JS=$(dirname "$0")/js/compile.js
[ -f "$LIB" ] || { echo "no $LIB (build first)" >&2; exit 1; }
command -v node >/dev/null || { echo "no node" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$LIB" "$RUNS" "$COUNT" "$JS" "$TMP" <<'PY'
import os, subprocess, sys, statistics, glob, re
lib, runs, secs, js, tmp = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
flags = ["--perf-basic-prof", "--interpreted-frames-native-stack"]
js = os.path.abspath(js)
os.chdir(tmp)  # V8's isolate-*-v8.log files go away with tmp
res = {"plain": [], "agent": []}
maps, sym = [], []
for i in range(runs):
    for agent in (False, True):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTPROF_") and k != "LD_PRELOAD"}
        out = os.path.join(tmp, "out%d%s" % (i, "a" if agent else "p"))
        os.mkdir(out)
        if agent:
            env.update(LD_PRELOAD=lib, CONTPROF_OUTPUT_DIR=out, CONTPROF_WINDOW="1s")
        pid = os.posix_spawnp("node", ["node"] + flags + [js, secs], env, file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)])
        _, st, ru = os.wait4(pid, 0)
        key = "agent" if agent else "plain"
        res[key].append(ru.ru_utime + ru.ru_stime)
        m = "/tmp/perf-%d.map" % pid
        if os.path.exists(m):
            if agent: maps.append(os.path.getsize(m))
            os.unlink(m)
        if agent:
            files = glob.glob(os.path.join(out, "*.cpu.contprof-agent.pb.gz"))
            ns = 0
            if files:
                t = subprocess.run(["go", "tool", "pprof", "-top", "-unit=ms", "-sample_index=cpu"]
                                   + files, capture_output=True, text=True).stdout
                for line in t.splitlines():
                    f = line.split()
                    if len(f) >= 6 and f[5] == "contprof:symbolize":
                        ns = float(f[3].rstrip("ms")) * 1e6
            sym.append(ns)
med = lambda v: statistics.median(v)
print("node_cpu_plain_s | %.3f" % med(res["plain"]))
print("node_cpu_agent_s | %.3f" % med(res["agent"]))
print("node_cpu_added_pct | %.1f" % (100 * (med(res["agent"]) / med(res["plain"]) - 1)))
print("perf_map_bytes_at_exit | %d" % (med(maps) if maps else 0))
print("agent_symbolize_ms_per_run | %.1f" % (med(sym) / 1e6 if sym else 0))
PY
