#!/bin/sh
# Pyroscope ingest benchmark: N realistic 10 s CPU windows (bench/genwindows: 2,000 stacks,
# about 60 KB gzip'd each), sent to a fresh contprofd (embedded broker) four ways:
# POST /ingest?format=pprof, Push (protobuf, one profile per request, the gzip'd pprof as
# raw_profile), Push gzip'd (the request body gzip'd, Content-Encoding: gzip, around the
# plain pprof, as clients that compress the request send it), and `contprof import` (the
# agent's path: envelopes straight to Kafka). Each way waits until the store holds all
# N (/metrics contprof_ingest_windows_total), then reads contprofd's CPU time
# (/proc/PID/stat utime+stime): profiles per contprofd CPU-second, HTTP parsing, decoding,
# re-encoding and producing included for the first three; ingest and store for all four.
# One client, sequential, keep-alive.
# usage: bench/pyro/run.sh BUILD_DIR [N]
set -eu
build=$1
n=${2:-500}
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/bench/contprofd.sh"
work=$(mktemp -d /tmp/pyro-bench-XXXXXX)
dpid=
trap '[ -n "$dpid" ] && kill -TERM $dpid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
start_contprofd "$build" "$work"
port=${url##*:}
cpu() { awk '{print $14 + $15}' /proc/$dpid/stat; }
hz=$(getconf CLK_TCK)
windows() { curl -s "$url/metrics" | sed -n 's/^contprof_ingest_windows_total \([0-9]*\)$/\1/p'; }
wait_windows() {
    until [ "$(windows)" -ge "$1" ]; do sleep 0.05; done
}
# the broker's partitions are assigned a few seconds after start
until curl -s "$url/healthz" | grep -q '"ok"'; do sleep 0.2; done
mkdir "$work/w"
"$build/bench/genwindows" "$work/w" "$n" >/dev/null
base=$(( $(date +%s) - 3 * 3600 ))
stored=0
for way in ingest push pushgz import; do
    c0=$(cpu)
    t0=$(date +%s.%N)
    if [ "$way" = import ]; then
        "$build/query/contprof" import --server "$url" --service bench-import "$work"/w/*.pb.gz \
            >/dev/null 2>&1
    else
        python3 - "$port" "$work/w" "$n" "$way" "$base" <<'PY'
import gzip, http.client, sys, os
port, d, n, way, base = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
files = sorted(os.listdir(d))[:n]
c = http.client.HTTPConnection('127.0.0.1', port)
def varint(v):
    out = b''
    while True:
        b = v & 0x7f; v >>= 7
        out += bytes([b | 0x80]) if v else bytes([b])
        if not v: return out
def field(num, p): return varint(num << 3 | 2) + varint(len(p)) + p
for i in range(n):
    raw = open(os.path.join(d, files[i]), 'rb').read()
    if way == 'ingest':
        c.request('POST', '/ingest?format=pprof&name=bench-ingest%%7Bi%%3D%d%%7D&from=%d&until=%d' % (i % 50, base + 10 * i, base + 10 * i + 10), raw, {'Content-Type': 'application/octet-stream'})
    else:
        svc = b'bench-' + way.encode()
        lab = field(1, field(1, b'service_name') + field(2, svc)) + field(1, field(1, b'i') + field(2, str(i).encode()))
        hdrs = {'Content-Type': 'application/proto'}
        if way == 'pushgz':
            raw = gzip.decompress(raw)
            hdrs['Content-Encoding'] = 'gzip'
        body = field(1, lab + field(2, field(1, raw)))
        if way == 'pushgz':
            body = gzip.compress(body, 6)
        c.request('POST', '/push.v1.PusherService/Push', body, hdrs)
    r = c.getresponse(); r.read()
    if r.status != 200: sys.exit('%s %d: %d' % (way, i, r.status))
PY
    fi
    t1=$(date +%s.%N)
    stored=$((stored + n))
    wait_windows $stored
    t2=$(date +%s.%N)
    c1=$(cpu)
    echo "$way $n $c0 $c1 $hz $t0 $t1 $t2" | awk '{cpu = ($4 - $3) / $5;
        printf "%-7s %d profiles: contprofd %.2f CPU-s, %.0f profiles per contprofd CPU-second; sent in %.2f s, stored %.2f s later\n",
        $1, $2, cpu, $2 / cpu, $7 - $6, $8 - $7}'
done
