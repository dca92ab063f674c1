#!/bin/sh
# Tests of the dependency check (.ci/check-deps): it passes on a copy of the tree as it is,
# and fails, naming the file, the line and the rule, on each kind of planted bad dependency.
# usage: check_deps_test.sh SOURCE_DIR CASE
#   CASE: clean | upstream | sideways | model | ambiguous | link | cycle2 | cycle3 | cycle_int |
#         allowed
set -eu
src=$1
case_=$2
check="$src/.ci/check-deps"
work=$(mktemp -d /tmp/contprof-check-deps.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM

# A copy of the folders the check reads (sources, headers, protos, CMakeLists).
for d in model collector ingest store query cmd tests bench; do
    (cd "$src" && find "$d" -type d -name node_modules -prune -o -type f \
        \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.proto' -o -name 'CMakeLists.txt' \
        -o -name '*.cmake' \) -print) |
        while read -r f; do
            mkdir -p "$work/$(dirname "$f")"
            cp "$src/$f" "$work/$f"
        done
done

fail() {
    echo "FAIL ($case_): $*"
    echo "--- check-deps said:"
    cat "$work/out"
    exit 1
}

# run_check WANT_STATUS: runs the check on the copy, output in $work/out
run_check() {
    set +e
    python3 "$check" "$work" > "$work/out" 2>&1
    rc=$?
    set -e
    [ "$rc" -eq "$1" ] || fail "exit status $rc, expected $1"
}

# expect TEXT: the output holds TEXT (fixed string)
expect() {
    grep -qF -- "$1" "$work/out" || fail "no line with: $1"
}

# plant FILE LINE_TEXT: appends a line to FILE; prints the new line's number
plant() {
    printf '%s\n' "$2" >> "$work/$1"
    wc -l < "$work/$1" | tr -d ' '
}

case "$case_" in
clean)
    run_check 0
    expect "no include against the flow, no cycle between modules"
    ;;
upstream)
    # query reaches back into ingest: the issue's own example
    n=$(plant query/api.c '#include "ingest.h"')
    run_check 1
    expect "query/api.c:$n: includes \"ingest.h\" (ingest/ingest.h), against the flow: query may include model, store, query only"
    # and the agent into the store
    n=$(plant collector/agent.c '#include "store.h"')
    run_check 1
    expect "collector/agent.c:$n: includes \"store.h\" (store/store.h)"
    ;;
sideways)
    # the store knows nothing of query/, ingest/ nothing of collector/
    n=$(plant store/block.c '#include "render.h"')
    m=$(plant ingest/ingest.c '#include "window.h"')
    run_check 1
    expect "store/block.c:$n: includes \"render.h\" (query/render.h), against the flow: store may include model, store only"
    expect "ingest/ingest.c:$m: includes \"window.h\" (collector/window.h)"
    expect "check-deps: 2 problem(s)"
    ;;
model)
    # model/ is included by everyone and includes no stage, nor the binaries' wiring
    n=$(plant model/pprof.c '#include "store.h"')
    m=$(plant model/labels.h '#include "cli.h"')
    run_check 1
    expect "model/pprof.c:$n: includes \"store.h\" (store/store.h)"
    expect "model/labels.h:$m: includes \"cli.h\" (cmd/contprof/cli.h)"
    ;;
ambiguous)
    # a header name in two folders, one allowed and one not: which one the compiler takes
    # depends on the include path's order, so the include is refused as ambiguous
    mkdir -p "$work/store"
    printf '/* a planted header */\n' > "$work/store/kafka.h"
    n=$(plant ingest/broker.c '#include "kafka.h"')
    run_check 1
    expect "ingest/broker.c:$n: includes \"kafka.h\", which is ambiguous: collector/kafka.h, store/kafka.h; collector/kafka.h is against the flow"
    ;;
link)
    # a stage's library linking a later stage's library
    printf 'target_link_libraries(cpstore PUBLIC cpquery_core)\n' >> "$work/store/CMakeLists.txt"
    n=$(wc -l < "$work/store/CMakeLists.txt" | tr -d ' ')
    run_check 1
    expect "store/CMakeLists.txt:$n: cpstore links cpquery_core (query/), against the flow: store may link model, store only"
    ;;
cycle2)
    # two modules of one folder that include each other's header
    printf '#include "pb.h"\n' > "$work/query/pa.h"
    printf '#include "pa.h"\nint pa;\n' > "$work/query/pa.c"
    printf '/* b */\n#include "pa.h"\n' > "$work/query/pb.h"
    run_check 1
    expect 'query: cycle between modules pa -> pb -> pa (query/pa.h:1 includes "pb.h"; query/pb.h:2 includes "pa.h")'
    ;;
cycle3)
    # a longer cycle through .c files, the way collector's agent/thread/alloc could form one
    printf '#include "cx.h"\n' > "$work/collector/ca.c"
    printf 'int ca;\n' > "$work/collector/ca.h"
    printf '\n#include "cc.h"\n' > "$work/collector/cx.c"
    printf 'int cx;\n' > "$work/collector/cx.h"
    printf '#include "ca.h"\n' > "$work/collector/cc.h"
    run_check 1
    expect 'collector: cycle between modules ca -> cx -> cc -> ca (collector/ca.c:1 includes "cx.h"; collector/cx.c:2 includes "cc.h"; collector/cc.h:1 includes "ca.h")'
    ;;
cycle_int)
    # foo_int.h is foo's private header: foo.c <-> foo_int.h is no cycle, but through it
    # to another module and back is one
    printf '#include "qm_int.h"\n' > "$work/query/qm.c"
    printf '#include "qm.h"\n' > "$work/query/qm_int.h"
    printf 'int qm;\n' > "$work/query/qm.h"
    run_check 0
    printf '#include "qn.h"\n' >> "$work/query/qm_int.h"
    printf '#include "qm.h"\n' > "$work/query/qn.h"
    run_check 1
    expect 'query: cycle between modules qm -> qn -> qm (query/qm_int.h:2 includes "qn.h"; query/qn.h:1 includes "qm.h")'
    ;;
allowed)
    # the binaries' wiring, tests and benchmarks include anything; a module including its
    # own header is no cycle; an unknown (system) header is not ours to check
    plant cmd/contprofd/contprofd.c '#include "window.h"' > /dev/null
    plant tests/test.h '#include "ingest.h"' > /dev/null
    plant bench/synth.c '#include "cli.h"' > /dev/null
    plant query/api.c '#include "api.h"' > /dev/null
    plant query/api.c '#include "no_such_header_anywhere.h"' > /dev/null
    run_check 0
    ;;
*)
    echo "unknown case $case_"
    exit 2
    ;;
esac
echo "ok: $case_"
