#!/bin/sh
# Golden test against real Go profiles: contprof merge reads what runtime/pprof writes, and
# `go tool pprof` reads what contprof merge writes, with the same totals to the unit.
# usage: go_golden.sh CONTPROF_BINARY WORKDIR
set -eu
contprof=$1
work=$2
here=$(dirname "$0")
rm -rf "$work" && mkdir -p "$work"
export GOCACHE="$work/gocache" GOPATH="$work/gopath" GO111MODULE=off GOFLAGS=
export HOME="${HOME:-$work}"
go run "$here/golden/gen.go" "$work" 2>/dev/null

# Sums each value column of the samples listed by `go tool pprof -raw`.
sums() {
    go tool pprof -raw "$@" 2>/dev/null | awk '
        /^Samples:/ {s=1; next} /^Locations/ {s=0}
        s && /^ *-?[0-9]+( +-?[0-9]+)*:/ { sub(/:.*/, ""); for (i = 1; i <= NF; i++) t[i] += $i; n = NF }
        END { for (i = 1; i <= n; i++) printf "%s%d", (i > 1 ? " " : ""), t[i]; print "" }'
}

fail() { echo "FAIL: $*" >&2; exit 1; }

# CPU: two real profiles merged; pprof must agree that nothing was lost or added.
"$contprof" merge -o "$work/merged.pb.gz" "$work/cpu1.pb.gz" "$work/cpu2.pb.gz"
a=$(sums "$work/cpu1.pb.gz"); b=$(sums "$work/cpu2.pb.gz"); m=$(sums "$work/merged.pb.gz")
want=$(echo "$a $b" | awk '{ h = NF / 2; for (i = 1; i <= h; i++) printf "%s%d", (i > 1 ? " " : ""), $i + $(i + h); print "" }')
echo "cpu1: $a  cpu2: $b  merged: $m"
[ -n "$a" ] && [ "$a" != "0 0" ] || fail "the Go CPU profile has no samples"
[ "$m" = "$want" ] || fail "merged totals $m, want $want"

# The top view names the functions that burned the CPU, and its total matches pprof's.
"$contprof" merge --format top --sample-index samples "$work/cpu1.pb.gz" "$work/cpu2.pb.gz" > "$work/top.txt"
grep -q 'main.hashLoop' "$work/top.txt" || fail "top view lacks main.hashLoop"
total=$(sed -n 's/^Showing nodes accounting for \([0-9]*\),.*/\1/p' "$work/top.txt")
[ "$total" = "${want%% *}" ] || fail "top total $total, want ${want%% *}"

# Folded stacks carry the same total.
"$contprof" merge --format folded --sample-index samples "$work/cpu1.pb.gz" "$work/cpu2.pb.gz" > "$work/folded.txt"
ftotal=$(awk '{ t += $NF } END { print t }' "$work/folded.txt")
[ "$ftotal" = "${want%% *}" ] || fail "folded total $ftotal, want ${want%% *}"
grep -q 'main.burnA;main.hashLoop' "$work/folded.txt" || fail "folded view lacks main.burnA;main.hashLoop"

# Heap: four sample types, mappings and lines survive; a profile merged with itself doubles.
"$contprof" merge -o "$work/heap2.pb.gz" "$work/heap.pb.gz" "$work/heap.pb.gz"
h=$(sums "$work/heap.pb.gz"); h2=$(sums "$work/heap2.pb.gz")
hw=$(echo "$h" | awk '{ for (i = 1; i <= NF; i++) printf "%s%d", (i > 1 ? " " : ""), 2 * $i; print "" }')
echo "heap: $h  heap merged with itself: $h2"
[ "$h2" = "$hw" ] || fail "heap totals $h2, want $hw"
go tool pprof -top -sample_index=inuse_space "$work/heap2.pb.gz" 2>/dev/null | grep -q 'main.allocate' ||
    fail "pprof does not show main.allocate in the merged heap profile"
echo "go golden: ok"
