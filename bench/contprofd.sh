# Sourced by the bench scripts that need a contprofd: start_contprofd BUILD WORK starts one
# with its embedded broker, data under WORK, on a free loopback port, waits for its API and
# sets dpid and url. The caller's EXIT trap stops it (kill -TERM $dpid).
start_contprofd() {
    "$1/query/contprofd" --data "$2/data" --http 127.0.0.1:0 2>"$2/contprofd.log" &
    dpid=$!
    _i=0
    until grep -qs 'query API on' "$2/contprofd.log"; do
        _i=$((_i + 1))
        [ $_i -lt 150 ] || { cat "$2/contprofd.log"; exit 1; }
        sleep 0.2
    done
    url=http://127.0.0.1:$(sed -n 's|.*query API on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' "$2/contprofd.log")
}
