#!/bin/sh
# What the agent costs a process for each way its windows leave it (issue 34): a program
# alone against the same program under libcontprof with the windows going
#   relay       to contprofd's relay on this host (CONTPROF_RELAY=DATA/relay; for make,
#               `contprof run --server URL -- make`, which finds that relay)
#   relay_down  to a relay directory whose contprofd was stopped: each window into its spool
#   kafka       to a Kafka producer of the process's own (CONTPROF_BROKERS from the running
#               contprofd's /api/v1/brokers)
#   files       to files (CONTPROF_OUTPUT_DIR)
#   relay_down_tmpfs, files_tmpfs (tiny only; reference): the same two with the spool and the
#               files on tmpfs (/dev/shm): what they cost without the file system of TMPDIR.
#               An ext4 without a journal (this VM's root) checks, for each inode it hands
#               out, that none deleted in the last minute is reused, scanning the inode bitmap
#               past them (ext4's recently_deleted): after a churn of files on that disk, each
#               file created costs from 0.1 to over 1 ms of system time. The first row says
#               what TMPDIR's file system is.
# for two workloads:
#   tiny   a C program that burns ~20 ms of CPU (a fixed loop, calibrated here) and exits
#   make   `make -j2 -B` of contprof's own model/*.c (20 real files, gcc -O2 -c: ~60 short
#          processes: make, gcc, cc1, as)
# Reference variants: plain2 (the program alone again: how far this machine moves a ratio by
# itself); for tiny, to split its cost: loaded (CONTPROF_DISABLE=1: the library and its
# dependencies loaded and relocated, no agent), relay_names_server (relay with
# CONTPROF_SYMBOLIZE=server: no symbol tables read in the process), relay_no_cache (relay
# with CONTPROF_NAMES_CACHE=0: names read from the objects' symbol tables in the process, as
# before the relay's name cache; relay itself names from the cache, filled by the warm-up
# rounds), relay_captures (relay
# with CONTPROF_SERVER, as `contprof run --server` sets it: a poller thread asks contprofd
# for captures over HTTP), kafka_down (brokers unreachable: the exit waits for
# CONTPROF_FLUSH, 1 s; KAFKA_DOWN runs).
# CPU is user + system of the process and its children (wait4's rusage); wall is spawn to
# reaped. Rows are ratios to the program alone measured in the same run, medians with
# p25-p75, and the median of the differences in ms:
#   tiny: the modes alternate run by run (round robin, the order rotated each round), so the
#     drift of this shared machine touches them alike; per round, mode / plain of the round.
#   make CPU: make's CPU time moves by 10-15% from one run to the next here (plain against
#     plain, run after run: 0.86-1.01), more than the floor. So, as symbolize.sh does, a mode
#     and plain run at the same time pinned to the same core (taskset; a second mode's pair
#     on core 1 at once): both see that core in the same conditions (plain against plain:
#     0.99-1.00). Sharing the core doubles each process's wall time, and with it the agent's
#     per-second work (its 0.5 s ticks); 6 modes at once on one core (6x) gave relay 1.10
#     where pairs gave 1.05. REPS rounds of every mode's pair.
#   make wall: make's wall time moves by 40% within a minute here (plain against plain,
#     rounds a minute apart: 1.39). So each mode runs right before or after (alternating) a
#     plain run of its own, REPS rounds; their CPU, `cpu_sequential`, for reference.
# Floors (issue 34): relay, relay_down and files at most 1.05 (tiny: CPU; make: CPU and
# wall); kafka is the comparison (reference). contprofd's own CPU (its threads' schedstat),
# from one sequential run's start to the next's, less plain's, is the host's share of the relay and Kafka
# modes (reference rows).
# Then the relay that was down starts again: the spool files before, after, and what its
# relay drained and its ingest took (its /metrics).
# Prints rows "name | value | floor | ok", like run.sh; the load average before and after.
#   bench/collector/relay.sh [BUILD_DIR]   (default: build)
# Environment: RUNS (default 30: tiny rounds), REPS (default 1: make rounds; 0: none), KAFKA_DOWN
# (default 3). About 5 minutes at the defaults, +4 per REPS (a make alone: 12-15 s of wall here).
set -u
BUILD=${1:-${BUILD_DIR:-build}}
BUILD=$(cd "$BUILD" && pwd)
LIB=$BUILD/collector/libcontprof.so
CLI=$BUILD/query/contprof
RUNS=${RUNS:-30}
REPS=${REPS:-1}
KAFKA_DOWN=${KAFKA_DOWN:-3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ -f "$LIB" ] && [ -x "$CLI" ] && [ -x "$BUILD/query/contprofd" ] || { echo "relay bench: build $BUILD first" >&2; exit 1; }
[ -f "$BUILD/model/envelope.pb-c.h" ] || { echo "relay bench: no $BUILD/model/envelope.pb-c.h" >&2; exit 1; }
for t in make gcc taskset curl; do command -v $t > /dev/null 2>&1 || { echo "relay bench: needs $t" >&2; exit 1; }; done
TMP=$(mktemp -d)
pids=
SHM=
[ "$(stat -f -c %T /dev/shm 2> /dev/null)" = tmpfs ] && SHM=$(mktemp -d -p /dev/shm)
trap 'for p in $pids; do kill -TERM $p 2> /dev/null; wait $p 2> /dev/null; done; rm -rf "$TMP" ${SHM:+"$SHM"}' EXIT
. "$SRC/bench/contprofd.sh"

# the 20 ms program: N rounds of a loop whose result the compiler must keep
cat > "$TMP/burn.c" << 'EOF'
#include <stdlib.h>
int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    volatile unsigned long x = 1;
    for (long i = 0; i < n; i++)
        for (int j = 0; j < 1000; j++) x = x * 6364136223846793005ul + (unsigned long)j;
    return (int)(x & 0);
}
EOF
cc -O2 -o "$TMP/burn" "$TMP/burn.c" || exit 1

# the C project: model/*.c as CMake builds them (its include directories), gcc -O2 -c each
mkdir -p "$TMP/proj"
cp "$SRC"/model/*.c "$TMP/proj/"
{
    printf 'OBJS ='
    for f in "$TMP"/proj/*.c; do printf ' %s.o' "$(basename "$f" .c)"; done
    printf '\nall: $(OBJS)\n%%.o: %%.c\n\tgcc -O2 -D_GNU_SOURCE -std=c11 -I%s/model -I%s/model -c $< -o $@\n' "$SRC" "$BUILD"
} > "$TMP/proj/Makefile"
make -s -B -j2 -C "$TMP/proj" > /dev/null 2>&1 || { echo "relay bench: the C project does not build" >&2; exit 1; }

# contprofd A runs throughout; B's relay directory is the one that is down
mkdir -p "$TMP/a" "$TMP/b"
start_contprofd "$BUILD" "$TMP/b"
bpid=$dpid
pids=$bpid
burl=$url
kill -TERM "$bpid"
wait "$bpid"
pids=
crelay=
if [ -n "$SHM" ]; then # C: a relay directory on tmpfs whose contprofd was stopped
    mkdir -p "$SHM/c"
    start_contprofd "$BUILD" "$SHM/c"
    kill -TERM "$dpid"
    wait "$dpid"
    crelay=$SHM/c/data/relay
fi
start_contprofd "$BUILD" "$TMP/a"
apid=$dpid
pids=$apid
aurl=$url
brokers=$(curl -s "$aurl/api/v1/brokers" | sed -n 's/.*"brokers":"\([^"]*\)".*/\1/p')
arelay=$TMP/a/data/relay
brelay=$TMP/b/data/relay
[ -n "$brokers" ] && [ -S "$arelay/relay.sock" ] && [ ! -e "$brelay/relay.sock" ] && [ -d "$brelay/spool" ] ||
    { echo "relay bench: contprofd: brokers '$brokers', relay $arelay, $brelay" >&2; exit 1; }
# `contprof run --server` picks the relay when it is on this host
picked=$(env CONTPROF_LIB="$LIB" "$CLI" run --server "$aurl" -- sh -c 'echo "$CONTPROF_RELAY"' 2> /dev/null)
[ "$picked" = "$arelay" ] || { echo "relay bench: contprof run --server gave CONTPROF_RELAY='$picked', not $arelay" >&2; exit 1; }

echo "relay.load_before | $(cut -d' ' -f1-3 /proc/loadavg) | (reference) | -"
fs=$(findmnt -no FSTYPE --target "$TMP" 2> /dev/null | head -1)
dev=$(findmnt -no SOURCE --target "$TMP" 2> /dev/null | head -1)
[ "$fs" = ext4 ] && [ "$(cat "/sys/fs/ext4/${dev##*/}/journal_task" 2> /dev/null)" = "<none>" ] && fs="$fs without a journal"
fs="$fs on ${dev:-?}"
echo "relay.tmp_filesystem | ${fs:-unknown} ($TMP: the spool of relay_down, the files of files) | (reference) | -"
[ -n "$SHM" ] || echo "relay.tmpfs_rows | none: /dev/shm is not a tmpfs here | (reference) | -"
python3 - "$LIB" "$CLI" "$aurl" "$arelay" "$brelay" "$brokers" "$apid" "$TMP" "$RUNS" "$REPS" "$KAFKA_DOWN" "$crelay" "$SHM" << 'EOF'
import glob, os, shutil, sys, time
lib, cli, aurl, arelay, brelay, brokers, apid, tmp = sys.argv[1:9]
runs, reps, kafka_down = int(sys.argv[9]), int(sys.argv[10]), int(sys.argv[11])
crelay, shm = sys.argv[12:14]
base = {k: v for k, v in os.environ.items() if not k.startswith("CONTPROF_") and k != "LD_PRELOAD"}
base["TMPDIR"] = tmp
agent = dict(base, LD_PRELOAD=lib)
modes = {
    "plain": base,
    "relay": dict(agent, CONTPROF_RELAY=arelay),
    "relay_down": dict(agent, CONTPROF_RELAY=brelay),
    "kafka": dict(agent, CONTPROF_BROKERS=brokers),
    "files": dict(agent, CONTPROF_OUTPUT_DIR=tmp + "/files"),
}
burn = tmp + "/burn"
proj = tmp + "/proj"
devnull = os.open(os.devnull, os.O_WRONLY)

def contprofd_ns():
    t = 0
    for f in glob.glob("/proc/%s/task/*/schedstat" % apid):
        try:
            t += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return t

def start(argv, env):
    fa = [(os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)]
    return os.posix_spawnp(argv[0], argv, env, file_actions=fa)

def reap(pid, argv):
    """Waits for pid; returns the cpu ms of it and its children."""
    _, status, ru = os.wait4(pid, 0)
    if status != 0:
        sys.exit("relay bench: %s exited with status %d" % (" ".join(argv), status))
    return (ru.ru_utime + ru.ru_stime) * 1e3

def spawn(argv, env):
    """Runs argv; returns (wall ms, cpu ms of it and its children)."""
    t0 = time.monotonic_ns()
    c = reap(start(argv, env), argv)
    return (time.monotonic_ns() - t0) / 1e6, c

# calibrate the loop to ~20 ms of CPU alone
n = 2000
for _ in range(3):
    c = sorted(spawn([burn, str(n)], base)[1] for _ in range(5))[2]
    n = max(1, int(n * 20.0 / max(c, 0.5)))

def argv_of(work, mode, where=proj):
    if work == "tiny":
        return [burn, str(n)]
    mk = ["make", "-s", "-B", "-j2", "-C", where]
    if mode == "relay":  # as a user would: contprof run --server finds the relay
        return [cli, "run", "--server", aurl, "--"] + mk
    return mk

def env_of(work, mode):
    if work == "make" and mode == "relay":
        return dict(base, CONTPROF_LIB=lib)
    if mode == "plain2":
        return base
    if mode == "kafka_down":
        return dict(agent, CONTPROF_BROKERS="127.0.0.1:9")  # discard port: nothing listens
    if mode == "loaded":  # the library and its dependencies loaded, no agent started
        return dict(agent, CONTPROF_DISABLE="1")
    if mode == "relay_names_server":  # relay, no names in the agent
        return dict(modes["relay"], CONTPROF_SYMBOLIZE="server")
    if mode == "relay_no_cache":  # relay, names read in the process (no names/ cache)
        return dict(modes["relay"], CONTPROF_NAMES_CACHE="0")
    if mode == "relay_captures":  # relay, captures asked of contprofd (contprof run --server)
        return dict(modes["relay"], CONTPROF_SERVER=aurl)
    if mode == "relay_down_tmpfs":
        return dict(agent, CONTPROF_RELAY=crelay)
    if mode == "files_tmpfs":
        return dict(agent, CONTPROF_OUTPUT_DIR=shm + "/files")
    return modes[mode]

# rounds: every mode once per round, order rotated; per round and mode (wall, cpu, host ms)
def measure(work, names, rounds, warm):
    res = {m: [] for m in names}
    for r in range(rounds + warm):
        k = r % len(names)
        for m in names[k:] + names[:k]:
            h0 = contprofd_ns()
            w, c = spawn(argv_of(work, m), env_of(work, m))
            res[m].append((w, c, h0))
    return res, warm

# pairs, as symbolize.sh runs them: a mode and plain at the same time pinned to the same
# core, so both see that core in the same conditions (the same program against itself:
# 0.99-1.01 here; all modes at once on one core stretched each process ~6x in wall time and
# with it the agent's per-second work: relay 1.10 where pairs give 1.05); with two cores,
# another mode's pair on core 1 at once. Per mode, the CPU ratios to plain.
def measure_pairs(work, names, rounds, cores):
    ratios = {m: [] for m in names}
    dirs = {}
    for c in cores:
        for m in names + ["plain"]:
            dirs[m, c] = "%s.%s.%d" % (proj, m, c)
            if not os.path.isdir(dirs[m, c]):
                shutil.copytree(proj, dirs[m, c])
    for r in range(rounds):
        k = r % len(names)
        order = names[k:] + names[:k]
        for i in range(0, len(order), len(cores)):
            running = []
            for c, m in zip(cores, order[i:i + len(cores)]):
                for mm in (m, "plain"):
                    argv = ["taskset", "-c", str(c)] + argv_of(work, mm, dirs[mm, c])
                    running.append((mm, c, argv, start(argv, env_of(work, mm))))
            cpu = {(mm, c): reap(pid, argv) for mm, c, argv, pid in running}
            for c, m in zip(cores, order[i:i + len(cores)]):
                ratios[m].append(cpu[m, c] / cpu["plain", c])
    return ratios

# adjacent pairs: each mode right after or right before (alternating) a plain run of its
# own, so that the load of this machine, which moves over tens of seconds, is the same for
# both; per mode, a list of (mode run, its plain run), each [wall, cpu, contprofd ms from
# the run's start to the next run's]
def measure_adjacent(work, names, rounds):
    runs, pairs = [], {m: [] for m in names}
    for r in range(rounds):
        k = r % len(names)
        for j, m in enumerate(names[k:] + names[:k]):
            got = {}
            for mm in (("plain", m) if (r + j) % 2 == 0 else (m, "plain")):
                h0 = contprofd_ns()
                got[mm] = list(spawn(argv_of(work, mm), env_of(work, mm))) + [h0]
                runs.append(got[mm])
            pairs[m].append((got[m], got["plain"]))
    hs = [x[2] for x in runs] + [contprofd_ns()]
    for i, x in enumerate(runs):
        x[2] = (hs[i + 1] - hs[i]) / 1e6
    return pairs

def report_adjacent(work, pairs, floors):
    plains = [b for m in pairs for _, b in pairs[m]]
    row("%s_plain_wall_cpu_ms" % work, "%.1f / %.1f (medians of %d runs)" % (
        q([b[0] for b in plains], .5), q([b[1] for b in plains], .5), len(plains)))
    for m, v in pairs.items():
        for i, what in ((0, "wall"), (1, "cpu_sequential")):
            ratios = [a[i] / b[i] for a, b in v]
            diffs = [a[i] - b[i] for a, b in v]
            med = q(ratios, .5)
            detail = "%.3f (p25-p75 %.3f-%.3f; %+.0f ms, p25-p75 %+.0f to %+.0f; %d pairs)" % (
                med, q(ratios, .25), q(ratios, .75), q(diffs, .5), q(diffs, .25), q(diffs, .75), len(v))
            fl = floors.get(m) if what == "wall" else None
            if fl is None:
                row("%s_%s_ratio_%s" % (work, what, m), detail)
            else:
                print("relay.%s_%s_ratio_%s | %s | <= %s | %s" % (work, what, m, detail, fl, "ok" if med <= fl else "FAIL"))
        if m in ("relay", "kafka"):
            h = [a[2] - b[2] for a, b in v]
            row("%s_contprofd_cpu_ms_added_%s" % (work, m), "%+.1f (p25-p75 %+.1f to %+.1f)" % (
                q(h, .5), q(h, .25), q(h, .75)))

def host_ms(res, names):
    """contprofd's CPU ms from each run's start to the next run's start."""
    ev = sorted((h0, m, i) for m in names for i, (_, _, h0) in enumerate(res[m]))
    out = {m: [0.0] * len(res[m]) for m in names}
    for j, (h0, m, i) in enumerate(ev):
        nxt = ev[j + 1][0] if j + 1 < len(ev) else contprofd_ns()
        out[m][i] = (nxt - h0) / 1e6
    return out

def q(v, p):
    v = sorted(v)
    x = p * (len(v) - 1)
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)

def row(name, value, floor=None, op="<="):
    if floor is None:
        print("relay.%s | %s | (reference) | -" % (name, value))
    else:
        ok = value <= floor if op == "<=" else value >= floor
        print("relay.%s | %.3f | %s %s | %s" % (name, value, op, floor, "ok" if ok else "FAIL"))

def report(work, res, warm, names, floors, plain_row=True):
    hs = host_ms(res, names)
    base = res["plain"][warm:]
    if plain_row:
        row("%s_plain_wall_cpu_ms" % work, "%.1f / %.1f (medians over %d rounds)" % (
            q([w for w, _, _ in base], .5), q([c for _, c, _ in base], .5), len(base)))
    for m in names:
        if m == "plain":
            continue
        v = res[m][warm:]
        for i, what in ((0, "wall"), (1, "cpu")):
            ratios = [a[i] / b[i] for a, b in zip(v, base)]
            diffs = [a[i] - b[i] for a, b in zip(v, base)]
            fl = floors.get((m, what))
            med = q(ratios, .5)
            detail = "%.3f (p25-p75 %.3f-%.3f; %+.2f ms, p25-p75 %+.2f to %+.2f)" % (
                med, q(ratios, .25), q(ratios, .75), q(diffs, .5), q(diffs, .25), q(diffs, .75))
            if fl is None:
                row("%s_%s_ratio_%s" % (work, what, m), detail)
            else:
                ok = med <= fl
                print("relay.%s_%s_ratio_%s | %s | <= %s | %s" % (work, what, m, detail, fl, "ok" if ok else "FAIL"))
        if m in ("relay", "kafka"):
            h = [a - b for a, b in zip(hs[m][warm:], hs["plain"][warm:])]
            row("%s_contprofd_cpu_ms_added_%s" % (work, m), "%+.2f (p25-p75 %+.2f to %+.2f)" % (
                q(h, .5), q(h, .25), q(h, .75)))

t0 = time.monotonic()
names = ["plain", "plain2", "relay", "relay_down", "kafka", "files", "loaded", "relay_names_server",
         "relay_no_cache", "relay_captures"] + (["relay_down_tmpfs", "files_tmpfs"] if shm else [])
res, warm = measure("tiny", names, runs, 2)
row("tiny_loop_rounds", "%d (about 20 ms of CPU alone)" % n)
report("tiny", res, warm, names, {(m, "cpu"): 1.05 for m in ("relay", "relay_down", "files")})
row("tiny_names_files", "%d in %s/names (the relay's name cache)" % (
    len([f for f in os.listdir(arelay + "/names") if not f.startswith(".")]), arelay))
if kafka_down > 0:
    kd, _ = measure("tiny", ["plain", "kafka_down"], kafka_down, 0)
    report("tiny", kd, 0, ["plain", "kafka_down"], {}, plain_row=False)
row("tiny_seconds", "%.0f" % (time.monotonic() - t0))

if reps > 0:  # REPS=0: the tiny program only
    t0 = time.monotonic()
    names = ["plain", "plain2", "relay", "relay_down", "kafka", "files"]
    floors = {m: 1.05 for m in ("relay", "relay_down", "files")}
    cores = [0, 1] if (os.cpu_count() or 1) > 1 else [0]
    pairs = measure_pairs("make", names[1:], reps, cores)
    for m in names[1:]:
        v = pairs[m]
        detail = "%.3f (p25-p75 %.3f-%.3f; %d pairs on one core)" % (q(v, .5), q(v, .25), q(v, .75), len(v))
        if m in floors:
            print("relay.make_cpu_ratio_%s | %s | <= %s | %s" % (m, detail, floors[m], "ok" if q(v, .5) <= floors[m] else "FAIL"))
        else:
            row("make_cpu_ratio_%s" % m, detail)
    report_adjacent("make", measure_adjacent("make", names[1:], reps), floors)
    row("make_seconds", "%.0f" % (time.monotonic() - t0))
EOF
rc=$?
echo "relay.load_after | $(cut -d' ' -f1-3 /proc/loadavg) | (reference) | -"
[ $rc = 0 ] || exit $rc

metric() { curl -s "$1/metrics" | awk -v m="$2" '$1 == m { v = $2 } END { print v + 0 }'; }
# what the running relay took, and whether it lost or spooled any (busy)
lost=$(metric "$aurl" contprof_relay_lost_total)
echo "relay.running_relay_envelopes_spooled | $(metric "$aurl" contprof_relay_envelopes_total) / $(metric "$aurl" contprof_relay_spooled_total) (contprof_relay_envelopes_total / _spooled_total) | (reference) | -"
printf 'relay.running_relay_lost | %s | = 0 | %s\n' "$lost" "$([ "$lost" = 0 ] && echo ok || echo FAIL)"
echo "relay.running_relay_names_built_refused | $(metric "$aurl" contprof_relay_names_built_total) / $(metric "$aurl" contprof_relay_names_refused_total) (contprof_relay_names_built_total / _refused_total) | (reference) | -"

# the relay that was down comes back: does it take what was spooled (SLOT.env, SLOT.envs)?
before=$(ls "$brelay/spool" | grep -c '\.envs\{0,1\}$')
start_contprofd "$BUILD" "$TMP/b"
pids="$pids $dpid"
i=0
t0=$(date +%s)
while [ "$(ls "$brelay/spool" | grep -c '\.envs\{0,1\}$')" -gt 0 ] && [ $i -lt 120 ]; do
    sleep 0.5
    i=$((i + 1))
done
after=$(ls "$brelay/spool" | grep -c '\.envs\{0,1\}$')
secs=$(($(date +%s) - t0))
i=0 # the restarted contprofd's ingest takes them from its broker
while [ "$(metric "$url" contprof_ingest_messages_total)" -lt "$(metric "$url" contprof_relay_drained_total)" ] && [ $i -lt 60 ]; do
    sleep 0.5
    i=$((i + 1))
done
printf 'relay.spool_files_before_restart | %s (one a window: a batch) | >= 1 | %s\n' "$before" "$([ "$before" -ge 1 ] && echo ok || echo FAIL)"
printf 'relay.spool_files_after_restart | %s (drained in %s s) | = 0 | %s\n' "$after" "$secs" "$([ "$after" = 0 ] && echo ok || echo FAIL)"
echo "relay.restarted_relay_drained_ingested | $(metric "$url" contprof_relay_drained_total) / $(metric "$url" contprof_ingest_messages_total) (contprof_relay_drained_total / contprof_ingest_messages_total) | (reference) | -"
