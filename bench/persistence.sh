#!/usr/bin/env bash
# The durable-session figures of docs/persistence.md, on this machine:
#   1. QoS 1 throughput to a persistent session (clean start false, expiry 3600): the memory
#      store, the disk store with sync durability (default) and with async, in one run.
#   2. SESSIONS offline persistent sessions with 10 queued 1 KiB messages each: broker RSS with
#      them all queued, then the time from starting the broker to accepting connections, and
#      its RSS once restarted.
# Usage: cargo build --release -p braid && bench/persistence.sh
# Knobs: BRAID (binary), PORT, MSGS (throughput messages), SESSIONS (default 100000).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BRAID=${BRAID:-${CARGO_TARGET_DIR:-target}/release/braid}
PORT=${PORT:-18830}
MSGS=${MSGS:-300000}
SESSIONS=${SESSIONS:-100000}
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

start() {
    # The QUIC and admin listeners on free ports, not the defaults another broker may hold.
    "$BRAID" serve --listen "127.0.0.1:$PORT" --set sys.interval_secs=0 \
        --set 'listeners.quic="127.0.0.1:0"' --set 'listeners.http="127.0.0.1:0"' \
        --set "store.data_dir=\"$work/data\"" "$@" >>"$work/broker.log" 2>&1 &
    pid=$!
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "broker exited:" >&2
            tail -5 "$work/broker.log" >&2
            exit 1
        fi
        sleep 0.01
    done
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }
rss_mb() { echo $(( $(ps -o rss= -p "$pid") / 1024 )); }

echo "== QoS 1, 1 KiB, 10 publishers (in-flight 100) -> 1 persistent subscriber, $MSGS messages"
for store in "memory:--set store.backend=memory" "disk sync:" "disk async:--set store.durability=async"; do
    label=${store%%:*}
    flags=${store#*:}
    rm -rf "$work/data"
    # shellcheck disable=SC2086
    start $flags
    line=$("$BRAID" bench pub -p "$PORT" -c 10 -i 0 -I 0 -q 1 -s 1024 -F 100 -L "$MSGS" -t 'bench/t/%i' \
        --sub 1 --sub-topic 'bench/t/+' -C false -x 3600 --prefix "tp$RANDOM" --quiet 2>&1 |
        grep -E '^(publish|receive):' | tr '\n' ' ')
    echo "$label: $line"
    stop
done

echo "== $SESSIONS offline persistent sessions x 10 queued 1 KiB messages (disk, sync)"
rm -rf "$work/data"
start
for ((n = 0; n < SESSIONS; n += 10000)); do
    c=$((SESSIONS - n < 10000 ? SESSIONS - n : 10000))
    "$BRAID" bench sub -p "$PORT" -c "$c" -n "$n" -i 0 -t bench/offline -q 1 -C false -x 86400 \
        --prefix off --duration 1 --quiet >/dev/null 2>&1
done
"$BRAID" bench pub -p "$PORT" -c 1 -i 0 -I 0 -q 1 -s 1024 -F 1 -L 10 -t bench/offline --prefix offpub \
    --quiet 2>&1 | grep -E '^publish:'
echo "broker RSS with the sessions offline and their messages queued: $(rss_mb) MB"
echo "data directory: $(du -sh "$work/data" | cut -f1)"
stop
sync
t0=$(date +%s.%N)
start
t1=$(date +%s.%N)
echo "restart to accepting connections: $(echo "$t1 - $t0" | bc) s"
echo "broker RSS after the restart: $(rss_mb) MB"
grep -o 'store opened in [0-9.]*s' "$work/broker.log" | tail -1
"$BRAID" bench sub -p "$PORT" -c 100 -n 0 -i 0 -t bench/offline -q 1 -C false -x 86400 --prefix off \
    --idle-timeout 2 2>&1 | grep -E '^receive' || true
stop
