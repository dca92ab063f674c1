#!/bin/sh
# contprof against Austin, a peer that reads CPython's frames from outside the process, on
# the same programs (tests/collector/py: ratio.py, calls.py, pool.py): each Python
# function's inclusive share of the program's CPU as each tool saw it, and the largest
# difference, floor 5 points (issue 38). Prints rows "name | value | floor | ok".
#   AUSTIN=/path/to/austin bench/collector/pyaustin.sh [BUILD_DIR]   (default: build)
# Environment: AUSTIN (default: `austin` on PATH), PY (default /usr/bin/python3), SECS
# (default 3: each program's seconds of work).
#
# Debian 12's austin (1.0.1) predates 3.11 and cannot be the peer: `austin python3 ...`
# exits 33 ("Interpreter state search timed out") and attached with -p it writes samples
# with no frame. Austin 3.7.0 built from its source reads 3.11: pass it as AUSTIN.
# Austin runs with -s (CPU only: idle samples left out) every 1 ms, contprof at 1 kHz.
set -u
BUILD=${1:-${BUILD_DIR:-build}}
LIB=$BUILD/collector/libcontprof.so
CLI=$BUILD/query/contprof
PY=${PY:-/usr/bin/python3}
AUSTIN=${AUSTIN:-$(command -v austin || true)}
SECS=${SECS:-3}
PROGS=$(dirname "$0")/../../tests/collector/py
for f in "$LIB" "$CLI" "$PY"; do [ -e "$f" ] || { echo "pyaustin bench: no $f (build first)" >&2; exit 1; }; done
[ -n "$AUSTIN" ] && [ -x "$AUSTIN" ] || { echo "pyaustin bench: no austin (set AUSTIN)" >&2; exit 1; }
case $("$AUSTIN" -V 2>&1) in
*" 0."* | *" 1."* | *" 2."*)
    echo "pyaustin bench: $("$AUSTIN" -V 2>&1 | head -1) cannot read CPython 3.11's frames;" \
        "build Austin 3.7 from its source and set AUSTIN" >&2
    exit 1
    ;;
esac
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# shares FORMAT FILE: "function share" for each Python function, inclusive (once a stack)
shares() {
    "$PY" - "$1" "$2" << 'PYEOF'
import sys
fmt, path = sys.argv[1], sys.argv[2]
tot, inc = 0, {}
for line in open(path, errors="replace"):
    line = line.rstrip("\n")
    if not line or line.startswith("#"):
        continue
    stack, _, v = line.rpartition(" ")
    try:
        v = int(v)
    except ValueError:
        continue
    if fmt == "austin":  # P<pid>;T<iid>:<tid>;file:function:line;...
        names = {f.rsplit(":", 2)[-2] for f in stack.split(";")[2:] if f.count(":") >= 2}
    else:  # contprof's folded stacks: Python frames by name, native ones too
        names = set(stack.split(";"))
    tot += v
    for n in names:
        inc[n] = inc.get(n, 0) + v
for n, v in inc.items():
    print(n, v / tot if tot else 0.0)
PYEOF
}

row() { # name value floor(<=)
    printf 'pyaustin.%s | %s | <= %s | %s\n' "$1" "$2" "$3" "$(awk -v v="$2" -v f="$3" 'BEGIN { print (v <= f ? "ok" : "FAIL") }')"
}
ref() { printf 'pyaustin.%s | %s | (reference) | -\n' "$1" "$2"; }

ref bench_setup "$($AUSTIN -V 2>&1 | head -1), $PY, $SECS s a program; load $(cut -d' ' -f1-3 /proc/loadavg)"
for prog in ratio calls pool; do
    "$AUSTIN" -s -i 1ms -o "$TMP/$prog.austin" "$PY" "$PROGS/$prog.py" "$SECS" > /dev/null 2> "$TMP/err" ||
        { echo "pyaustin bench: austin on $prog.py failed: $(tail -1 "$TMP/err")" >&2; exit 1; }
    env CONTPROF_CPU_HZ=1000 CONTPROF_ALLOC_RATE=-1 CONTPROF_WINDOW=1s CONTPROF_OUTPUT_DIR="$TMP/$prog.out" \
        LD_PRELOAD="$LIB" "$PY" "$PROGS/$prog.py" "$SECS" > /dev/null
    "$CLI" merge --format folded $(ls "$TMP/$prog.out"/*.cpu.* | grep -v contprof-agent) > "$TMP/$prog.folded"
    shares austin "$TMP/$prog.austin" | sort > "$TMP/$prog.a"
    shares folded "$TMP/$prog.folded" | sort > "$TMP/$prog.c"
    # the functions Austin named with a share of 5% or more in either tool; not <module>,
    # which names every module's top-level code (and which Austin 3.7.0 gives the pool
    # workers' _WorkItem.run frame, thread.py's <module> at line 5)
    join "$TMP/$prog.a" "$TMP/$prog.c" | awk '$1 != "<module>" && ($2 >= 0.05 || $3 >= 0.05)' > "$TMP/$prog.j"
    top=$(sort -k2 -g -r "$TMP/$prog.j" | awk 'NR <= 6 { printf "%s%s %.1f/%.1f", (NR > 1 ? ", " : ""), $1, 100 * $2, 100 * $3 }')
    ref "${prog}_shares_austin_contprof" "$top"
    row "${prog}_max_diff_points" "$(awk '{ d = 100 * ($2 - $3); if (d < 0) d = -d; if (d > m) m = d } END { printf "%.1f", m }' "$TMP/$prog.j")" 5
done
