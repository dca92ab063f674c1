#!/bin/sh
# Import benchmark: a burst of 360 realistic 10 s CPU windows of one series (about 67 KB
# gzip'd each, bench/genwindows) sent by `contprof import` to a fresh contprofd with its
# embedded broker, once waiting until contprofd says every window is stored (flow control:
# GET /api/v1/ingest/offsets, at most 3 MiB unstored in flight), once fire-and-forget
# (--no-wait, the send before flow control), alternating, ROUNDS times, in one run.
# Windows per second are counted until the store holds the windows (fire-and-forget: until
# /metrics shows every window ingested or counted lost), on a consumer that is ready. A
# fire-and-forget round whose windows the broker dropped (it drops when ingest falls behind)
# did less ingest work: such rounds are listed apart, and the cost of flow control is
# measured against the median of the fire-and-forget rounds that stored all 360 (against
# the send alone, until the import exits, when no round stored everything; the row says
# which). Both modes poll /metrics or the offsets while they wait, so ingest writes its
# batches alike (a caught-up batch waits 10 ms while someone asks). The rate until a
# fire-and-forget import exits (nothing confirmed yet) is shown too. Then the burst right
# after contprofd starts, as a new user would: windows stored in each mode.
# Prints table rows: name | value | floor | ok.
# usage: bench/import/run.sh BUILD_DIR [ROUNDS]
set -eu
build=$1
rounds=${2:-3}
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
n=360
mkdir "$work/w"
"$build/bench/genwindows" "$work/w" $n
now() { date +%s.%N; }
metric() { curl -s "$url/metrics" | awk -v k="$1" '$1 == k { print $2 }'; }

# Starts a fresh contprofd; with "ready", waits until its consumer has its partitions.
start() {
    rm -rf "$work/data" "$work/log"
    "$build/query/contprofd" --data "$work/data" --http 127.0.0.1:0 > "$work/log" 2>&1 &
    pid=$!
    port=
    while [ -z "$port" ]; do
        sleep 0.05
        port=$(sed -n 's|.*query API on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$work/log")
    done
    url=http://127.0.0.1:$port
    if [ "$1" = ready ]; then
        until [ "$(metric contprof_ingest_ready)" = 1 ]; do sleep 0.05; done
    fi
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }

# Waits until ingest has stored (or counted lost) every window of the burst; prints stored.
drained() {
    t_end=$(( $(date +%s) + 120 ))
    while :; do
        s=$(metric contprof_ingest_windows_total)
        l=$(curl -s "$url/metrics" | awk '/^contprof_ingest_lost_total/ { t += $2 } END { print t + 0 }')
        # (not the lag gauge: ingest updates it once a second; a loss is counted as soon as
        # a later message is read, and the last one of the burst is never dropped)
        [ $((s + l)) -ge $n ] && break
        [ "$(date +%s)" -gt $t_end ] && { echo "no progress: stored $s lost $l" >&2; exit 1; }
        sleep 0.02
    done
    echo "$s"
}

ack=; ff=; ffx=; ffs=; ffw=; ffl=
for r in $(seq "$rounds"); do
    start ready
    t0=$(now)
    "$build/query/contprof" import --server "$url" --service ack$r "$work"/w/*.pb.gz 2> "$work/imp" ||
        { cat "$work/imp" >&2; exit 1; }
    t1=$(now)
    grep -q "$n of $n window(s)" "$work/imp" || { cat "$work/imp" >&2; exit 1; }
    ack="$ack $(echo "$t0 $t1" | awk -v n=$n '{ printf "%.1f", n / ($2 - $1) }')"
    stop
    start ready
    t0=$(now)
    "$build/query/contprof" import --no-wait --server "$url" --service ff$r "$work"/w/*.pb.gz 2> "$work/imp" ||
        { cat "$work/imp" >&2; exit 1; }
    t1=$(now)
    stored=$(drained)
    t2=$(now)
    ffs="$ffs $stored"
    rate=$(echo "$t0 $t2" | awk -v n=$n '{ printf "%.1f", n / ($2 - $1) }')
    ff="$ff $rate"
    if [ "$stored" = $n ]; then ffw="$ffw $rate"; else ffl="$ffl $rate($stored)"; fi
    ffx="$ffx $(echo "$t0 $t1" | awk -v n=$n '{ printf "%.1f", n / ($2 - $1) }')"
    stop
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ma=$(median $ack); mx=$(median $ffx)
echo "import: $n-window burst, acknowledged (exit when all stored), windows/s (median of $rounds; runs:$ack) | $ma | - | -"
if [ -n "$ffw" ]; then
    mw=$(median $ffw)
    echo "import: the same, fire-and-forget, until ingest has stored all $n, windows/s (rounds that stored all:$ffw; rounds the broker dropped from, rate(stored):${ffl:- none}) | $mw | - | -"
    base=$mw
    what="fire-and-forget rounds that stored all $n"
else
    echo "import: the same, fire-and-forget: no round stored all $n (rate(stored):$ffl) | - | - | -"
    base=$mx
    what="the fire-and-forget send alone, until it exits"
fi
echo "import: the same, fire-and-forget, until import exits (nothing confirmed), windows/s (runs:$ffx) | $mx | - | -"
echo "$ma $base" | awk -v w="$what" '{ c = 100 * (1 - $1 / $2); printf "import: cost of flow control (1 - acknowledged / %s) | %.1f%% | <= 10%% | %s\n", w, c, (c <= 10 ? "ok" : "ABOVE CEILING") }'

# right after start, as in issue 13
start cold
"$build/query/contprof" import --server "$url" --service cold "$work"/w/*.pb.gz 2> "$work/imp" || true
sa=$(drained)
stop
start cold
"$build/query/contprof" import --no-wait --server "$url" --service cold "$work"/w/*.pb.gz 2> "$work/imp" || true
sf=$(drained)
stop
echo "import: burst right after contprofd starts, windows stored of $n: acknowledged / fire-and-forget | $sa / $sf | acknowledged == $n | $([ "$sa" = $n ] && echo ok || echo no)"
