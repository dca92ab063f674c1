#!/bin/sh
# What epochs (collector/README.md) save the agent thread when it builds windows: instructions
# counted by callgrind inside cp_window_finish only (deterministic for a given set of stacks),
# per profile written, with epochs (the default) and without (CONTPROF_EPOCH_STREAMS=0), for
# CONTPROF_SYMBOLIZE=agent and =server. Prints table rows: name | value | floor | ok.
#   bench/symbols/epochs.sh [BUILD_DIR]        SECS (default 40, wall time under valgrind)
#
# Four copies of tests/demo/demo_service run at the same time under valgrind with the agent
# preloaded and 1 s windows written as files. libdw's own instructions (libdw, libelf and
# their decompressors) are left out of the per-profile row: under valgrind a run holds few
# windows, and libdw's first look-ups in each object (reading its symbol table, tens of
# millions of instructions, the same with and without epochs) would hide the per-window cost.
set -eu
build=${1:-build}
secs=${SECS:-40}
work=$(mktemp -d /tmp/contprof-bench-epochs-XXXXXX)
trap 'rm -rf "$work"' EXIT
demo=$build/tests/demo/demo_service
lib=$(cd "$build/collector" && pwd)/libcontprof.so
command -v valgrind > /dev/null 2>&1 || { echo "epochs.sh: valgrind not found" >&2; exit 1; }

for m in agent server; do
    for e in epochs fresh; do
        streams=32
        [ "$e" = fresh ] && streams=0
        mkdir -p "$work/$m-$e"
        LD_PRELOAD=$lib CONTPROF_SYMBOLIZE=$m CONTPROF_EPOCH_STREAMS=$streams CONTPROF_WINDOW=1s \
            CONTPROF_SERVICE=bench CONTPROF_OUTPUT_DIR=$work/$m-$e \
            valgrind --tool=callgrind --callgrind-out-file="$work/$m-$e.cg" \
            --toggle-collect=cp_window_finish "$demo" --duration "$secs" \
            > "$work/$m-$e.log" 2>&1 &
    done
done
wait

for m in agent server; do
    for e in epochs fresh; do
        files=$(ls "$work/$m-$e" | wc -l)
        callgrind_annotate --threshold=100 "$work/$m-$e.cg" 2>/dev/null | awk -v n="$m-$e" \
            -v files="$files" '
            /PROGRAM TOTALS/ { next }
            /^ *[0-9,]+ .*\[/ {
                v = $1; gsub(",", "", v)
                if ($0 ~ /libdw|libelf|liblzma|libbz2|libz\.so|libzstd/) dw += v; else rest += v
            }
            END {
                printf "epochs: %s: instructions per profile built, libdw aside (%d profiles) | %.0f | - | -\n", n, files, files ? rest / files : 0
                printf "epochs: %s: libdw instructions, whole run | %.1fM | - | -\n", n, dw / 1e6
            }'
    done
done
