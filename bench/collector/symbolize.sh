#!/bin/sh
# Symbolization's cost to the host (issue 24): CPU time (user + system of the whole process
# tree) of programs under libcontprof at its defaults (LD_PRELOAD, windows written to a
# temporary CONTPROF_OUTPUT_DIR) against the same programs alone, in one run.
# Prints rows "name | value | floor | ok".
#   bench/collector/symbolize.sh [BUILD_DIR]   (default: build)
# Environment: REPS (default 3), NODE (default node; rows skipped when absent), NODE_ROUNDS
# (2000: about 2 s of CPU per thread here).
#
#   make_ratio        `make -j2 -B` of a generated C project (21 files, gcc -O2: cc1,
#                     as, collect2, ld: ~60 short processes, each symbolizing at exit)
#   make_server_ratio the same with CONTPROF_SYMBOLIZE=server (no names in the agent: what
#                     sampling, hooks, start-up and the windows' files cost without them)
#   make_lines_ratio  the same with CONTPROF_SYMBOLIZE=lines (libdw per pc, file:line and
#                     inline frames: what the agent did by default before; reference)
#   node_ratio        node running a fixed JS job (calls, objects, strings: JIT code, pcs in
#                     no module, GC) on its main thread and in a worker at the default 100 Hz
#
# As bench/collector/run.sh does, a variant and its baseline run at the same time pinned
# (taskset) to the same core, so both see that core in the same conditions; with two
# cores a second pair runs on core 1 at once. The row is the median of the pairs' ratios,
# `_spread` their range.
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$(cd "$BUILD" && pwd)/collector/libcontprof.so
REPS=${REPS:-3}
NODE=${NODE:-node}
CORES=0
[ "$(nproc)" -gt 1 ] && CORES="0 1"
command -v taskset > /dev/null 2>&1 || { echo "symbolize bench: needs taskset" >&2; exit 1; }
[ -f "$LIB" ] || { echo "symbolize bench: build $LIB first" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --- the C project: 21 files of 40 functions each, a Makefile
gen_project() {
    d=$1
    mkdir -p "$d"
    i=0
    while [ $i -lt 21 ]; do
        awk -v f=$i 'BEGIN {
            print "#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>"
            for (j = 0; j < 40; j++) printf "int f%d_%d(int n);\n", f, j
            for (j = 0; j < 40; j++) {
                printf "struct s%d_%d { int a[%d]; double d; char n[32]; };\n", f, j, j + 4
                printf "static int cmp%d_%d(const void *x, const void *y) { return *(const int *)x - *(const int *)y; }\n", f, j
                printf "int f%d_%d(int n) {\n  struct s%d_%d s; memset(&s, 0, sizeof s);\n", f, j, f, j
                printf "  for (int i = 0; i < n; i++) { s.a[i %% %d] += i * %d; s.d += s.a[i %% %d] / 3.0;\n", j + 4, j + 1, j + 4
                printf "    if (s.d > %d) { snprintf(s.n, sizeof s.n, \"%%d\", i); s.d = strlen(s.n); } }\n", 1000 + j
                printf "  qsort(s.a, %d, sizeof(int), cmp%d_%d);\n", j + 4, f, j
                printf "  switch (n %% 7) { case 0: return s.a[0]; case 1: return s.a[1] + (int)s.d; case 2: return f%d_%d(n - 1); default: return (int)s.d; }\n}\n", f, (j + 39) % 40
            }
        }' > "$d/f$i.c"
        i=$((i + 1))
    done
    printf 'int main(void) { return 0; }\n' > "$d/main.c"
    {
        printf 'OBJS = main.o'
        i=0
        while [ $i -lt 21 ]; do printf ' f%d.o' $i; i=$((i + 1)); done
        printf '\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n%%.o: %%.c\n\t$(CC) -O2 -Wall -c $< -o $@\n'
    } > "$d/Makefile"
}

# the JS workload: a CPU loop on the main thread and in a worker thread
cat > "$TMP/loop.js" << 'EOJS'
const { Worker, isMainThread } = require('worker_threads');
function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
function work(rounds) { /* a fixed amount of work: the CPU time compared is the same job's */
  let x = 0, o = {};
  for (let i = 0; i < rounds; i++) {
    x += fib(25);
    for (let j = 0; j < 2000; j++) o['k' + ((x + j) % 5000)] = [x, String(x + j)];
  }
  return x;
}
if (isMainThread) { new Worker(__filename); work(ROUNDS); } else { work(ROUNDS); }
EOJS
sed -i "s/ROUNDS/${NODE_ROUNDS:-2000}/g" "$TMP/loop.js"

# cputime CMD...: runs CMD, prints the CPU seconds (user + system) of it and its children
cputime() {
    python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)' "$@"
}

# run VARIANT CORE: one run pinned to CORE; prints its CPU seconds
run() {
    out=$TMP/out.$1.$2
    mkdir -p "$out"
    pin="taskset -c $2"
    case $1 in
    make_base) cputime $pin make -s -B -j2 -C "$TMP/proj.$2.b" ;;
    make_agent)
        cputime env LD_PRELOAD="$LIB" CONTPROF_OUTPUT_DIR="$out" $pin make -s -B -j2 -C "$TMP/proj.$2.a" ;;
    make_server)
        cputime env LD_PRELOAD="$LIB" CONTPROF_OUTPUT_DIR="$out" CONTPROF_SYMBOLIZE=server \
            $pin make -s -B -j2 -C "$TMP/proj.$2.a" ;;
    make_lines)
        cputime env LD_PRELOAD="$LIB" CONTPROF_OUTPUT_DIR="$out" CONTPROF_SYMBOLIZE=lines \
            $pin make -s -B -j2 -C "$TMP/proj.$2.a" ;;
    node_base) cputime $pin "$NODE" "$TMP/loop.js" ;;
    node_agent) cputime env LD_PRELOAD="$LIB" CONTPROF_OUTPUT_DIR="$out" $pin "$NODE" "$TMP/loop.js" ;;
    esac
    [ "$1" = make_agent ] && ls "$out" | grep -q '\.cpu\.' || [ "$1" != make_agent ] ||
        echo "symbolize bench: no profile from make_agent" >&2
    rm -rf "$out"
}

# pair VARIANT BASE: on each core at once, VARIANT and BASE side by side; appends the
# ratios to $TMP/VARIANT.r
pair() {
    for c in $CORES; do
        run "$1" "$c" > "$TMP/a.$c" 2>> "$TMP/stderr" &
        run "$2" "$c" > "$TMP/b.$c" 2>> "$TMP/stderr" &
    done
    wait
    for c in $CORES; do
        [ -s "$TMP/a.$c" ] && [ -s "$TMP/b.$c" ] || { echo "symbolize bench: $1 or $2 failed" >&2; cat "$TMP/stderr" >&2; exit 1; }
        paste "$TMP/a.$c" "$TMP/b.$c" | awk '{ print $1 / $2 }' >> "$TMP/$1.r"
        paste "$TMP/a.$c" "$TMP/b.$c" >> "$TMP/$1.cpu"
    done
}

for c in $CORES; do
    gen_project "$TMP/proj.$c.a"
    gen_project "$TMP/proj.$c.b"
done
VARIANTS="make_agent make_server make_lines"
command -v "$NODE" > /dev/null 2>&1 && VARIANTS="$VARIANTS node_agent"
i=0
while [ $i -lt "$REPS" ]; do
    for v in $VARIANTS; do
        case $v in make_*) pair "$v" make_base ;; node_*) pair "$v" node_base ;; esac
    done
    i=$((i + 1))
done

median() { sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.4f-%.4f", lo, hi }'; }
row() { # name value op floor
    ok=$(awk -v v="$2" -v f="$4" -v op="$3" 'BEGIN { print ((op == "<=" && v <= f) || (op == ">=" && v >= f)) ? "ok" : "FAIL" }')
    printf '%s | %s | %s %s | %s\n' "$1" "$2" "$3" "$4" "$ok"
}
ref() { printf '%s | %s | (reference) | -\n' "$1" "$2"; }

echo "name | value | floor | ok"
row make_ratio "$(median < "$TMP/make_agent.r")" "<=" 1.05
ref make_ratio_spread "$(spread < "$TMP/make_agent.r")"
ref make_cpu_s_agent_base "$(awk '{ a += $1; b += $2 } END { printf "%.2f/%.2f", a / NR, b / NR }' "$TMP/make_agent.cpu")"
ref make_server_ratio "$(median < "$TMP/make_server.r")"
ref make_server_ratio_spread "$(spread < "$TMP/make_server.r")"
ref make_lines_ratio "$(median < "$TMP/make_lines.r")"
ref make_lines_ratio_spread "$(spread < "$TMP/make_lines.r")"
if [ -f "$TMP/node_agent.r" ]; then
    row node_ratio "$(median < "$TMP/node_agent.r")" "<=" 1.05
    ref node_ratio_spread "$(spread < "$TMP/node_agent.r")"
    ref node_cpu_s_agent_base "$(awk '{ a += $1; b += $2 } END { printf "%.2f/%.2f", a / NR, b / NR }' "$TMP/node_agent.cpu")"
fi
