# Sourced by bench/v8's scripts: start_workerd BUILD TESTS TMP installs the pinned workerd
# (tests/v8/install.sh), serves tests/v8/workers.capnp (Workers alpha on $PA and beta on
# $PB, the inspector on $PI, all loopback) and waits until both Workers are listed; sets
# WD, PA, PB, PI and WPID. The caller's EXIT trap stops it.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_workerd() {
    sh "$2/install.sh" "$1" || exit 1
    WD=$1/tests/v8/node_modules/@cloudflare/workerd-linux-64/bin/workerd
    PA=$(port); PB=$(port); PI=$(port)
    "$WD" serve "$2/workers.capnp" --socket-addr a=127.0.0.1:$PA --socket-addr b=127.0.0.1:$PB \
        --inspector-addr=127.0.0.1:$PI > "$3/workerd.log" 2>&1 &
    WPID=$!
    _i=0
    until curl -sf "http://127.0.0.1:$PI/json/list" | grep -q 'worker beta'; do
        _i=$((_i + 1)); [ $_i -gt 100 ] && { echo "v8 bench: workerd did not start" >&2; exit 1; }
        sleep 0.1
    done
}
