#!/bin/sh
# What the agent adds to a process that does nothing: /bin/true with and without
# LD_PRELOAD=libcontprof.so at default settings (windows to files in $TMPDIR/contprof-UID),
# wall time and CPU time (user + system of every thread, from wait4's rusage) per process.
# Prints rows "name | value | floor | ok", like run.sh.
#   bench/collector/startup.sh [BUILD_DIR]   (default: build)
# Environment: RUNS (default 100).
#
# Each run is posix_spawn + wait4 from one Python process; the variants alternate run by
# run (agent, plain, agent loaded but disabled), so drift of this shared machine touches
# them alike; each row is the median of RUNS, the *_added rows the difference of medians.
# Floors (issue 24): at most 1 ms of wall time and 0.5 ms of CPU time added.
# The `loaded` variant (CONTPROF_DISABLE=1: the library and its dependencies mapped and
# relocated, constructors run, no agent started) splits the cost into loading and running.
# Fork without exec (forkbench: N children in turn, each exiting at once, as a shell's
# subshells do): the parent's CPU per fork, the child's (its threads included) and the
# child's page faults, variants alternating run by run (FORK_RUNS of FORK_N children); the
# floor (0.5 ms) is on parent + child added.
# Idle memory: `sleep 3` with and without the agent side by side, Rss/Pss/Private_Dirty of
# /proc/PID/smaps_rollup at 1.5 s (past the agent thread's first tick), medians of RSS_RUNS;
# the floor (1 MiB) is on Rss added.
# Two reference rows time growing a fresh process's fd table to 4096 entries with one thread
# and with two (medians of 15 Python processes): the reason for fd.c's cp_fd_reserve.
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
FORKB=$BUILD/bench/collector/forkbench
RUNS=${RUNS:-100}
[ -f "$LIB" ] && [ -x "$FORKB" ] || { echo "no $LIB or $FORKB (build first)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$LIB" "$RUNS" "$TMP" "$FORKB" "${FORK_RUNS:-15}" "${FORK_N:-100}" "${RSS_RUNS:-5}" <<'EOF'
import os, subprocess, sys, time
lib, runs, tmp = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
forkb, fork_runs, fork_n, rss_runs = sys.argv[4], int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
base = {k: v for k, v in os.environ.items() if not k.startswith("CONTPROF_") and k != "LD_PRELOAD"}
base["TMPDIR"] = tmp
base.pop("XDG_RUNTIME_DIR", None)  # the default directory under TMPDIR, not the user's runtime dir
variants = {
    "plain": dict(base),
    "agent": dict(base, LD_PRELOAD=lib),
    "loaded": dict(base, LD_PRELOAD=lib, CONTPROF_DISABLE="1"),
}
wall = {k: [] for k in variants}
cpu = {k: [] for k in variants}
for i in range(runs + 5):
    for name, env in variants.items():
        t0 = time.monotonic_ns()
        pid = os.posix_spawn("/bin/true", ["/bin/true"], env)
        _, status, ru = os.wait4(pid, 0)
        t1 = time.monotonic_ns()
        if status != 0:
            sys.exit("/bin/true (%s) exited with %d" % (name, status))
        if i >= 5:  # warm-up runs left out
            wall[name].append((t1 - t0) / 1e6)
            cpu[name].append((ru.ru_utime + ru.ru_stime) * 1e3)
med = lambda v: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2
def row(name, value, floor=None):
    if floor is None:
        print("startup.%s | %.3f | (reference) | -" % (name, value))
    else:
        print("startup.%s | %.3f | <= %s | %s" % (name, value, floor, "ok" if value <= floor else "FAIL"))
for k in variants:
    row("true_wall_ms_" + k, med(wall[k]))
    row("true_cpu_ms_" + k, med(cpu[k]))
row("true_wall_ms_added", med(wall["agent"]) - med(wall["plain"]), 1.0)
row("true_cpu_ms_added", med(cpu["agent"]) - med(cpu["plain"]), 0.5)
row("true_cpu_ms_added_loading", med(cpu["loaded"]) - med(cpu["plain"]))
files = sum(len(f) for _, _, f in os.walk(tmp))
row("true_files_written", files)

fork = {k: [] for k in ("plain", "agent")}
for i in range(fork_runs):
    for name in fork:
        out = subprocess.run([forkb, fork_n], env=variants[name], capture_output=True, text=True, check=True)
        fork[name].append([float(x) for x in out.stdout.split()])
fm = {k: [med([r[j] for r in v]) for j in range(3)] for k, v in fork.items()}
for k in fork:
    row("fork_parent_us_" + k, fm[k][0])
    row("fork_child_us_" + k, fm[k][1])
row("fork_parent_us_added", fm["agent"][0] - fm["plain"][0])
row("fork_child_us_added", fm["agent"][1] - fm["plain"][1])
row("fork_us_added", fm["agent"][0] + fm["agent"][1] - fm["plain"][0] - fm["plain"][1], 500)
row("fork_child_minflt_added", fm["agent"][2] - fm["plain"][2])

def rollup(pid):
    v = {}
    with open("/proc/%d/smaps_rollup" % pid) as f:
        for line in f:
            k, _, rest = line.partition(":")
            if k in ("Rss", "Pss", "Private_Dirty"):
                v[k] = int(rest.split()[0])
    return v
mem = {k: [] for k in ("plain", "agent")}
for i in range(rss_runs):
    pids = {k: os.posix_spawn("/bin/sleep", ["/bin/sleep", "3"], variants[k]) for k in mem}
    time.sleep(1.5)
    for k, pid in pids.items():
        mem[k].append(rollup(pid))
    for pid in pids.values():
        os.waitpid(pid, 0)
for key, name in (("Rss", "rss"), ("Pss", "pss"), ("Private_Dirty", "private_dirty")):
    added = med([a[key] - p[key] for a, p in zip(mem["agent"], mem["plain"])])
    row("idle_%s_kb_added" % name, added, 1024 if key == "Rss" else None)

# Why the agent grows the fd table in the constructor (fd.c cp_fd_reserve): the first fd at
# 3904 (the table grows from 64 to 4096 entries) in a fresh process with one thread, and
# with a second thread alive (expand_fdtable then waits for an RCU grace period).
import subprocess
grow = '''
import fcntl, os, sys, threading, time
if sys.argv[1] == "threaded":
    threading.Thread(target=time.sleep, args=(1,), daemon=True).start()
fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
t0 = time.perf_counter_ns()
hi = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3904)
print((time.perf_counter_ns() - t0) / 1e3)
'''
for mode in ("single", "threaded"):
    us = [float(subprocess.run([sys.executable, "-c", grow, mode], capture_output=True, text=True,
                               env=base).stdout) for _ in range(15)]
    row("fd_table_grow_us_" + mode, med(us))
EOF
