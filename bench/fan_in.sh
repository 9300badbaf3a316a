#!/usr/bin/env bash
# Seed 004's overload case, issue 7's bar: 1000 publishers at in-flight 1 into one subscriber,
# QoS 1, 1 KiB, 30 s, each broker on its default settings (Mosquitto: a listener and
# allow_anonymous; Braid: only a listener and a temporary data directory), same run.
# Prints what each broker acknowledged to the publishers and what it delivered.
# Usage: bench/fan_in.sh [seconds]   (needs a release build and mosquitto)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-30}
BRAID=target/release/braid
[ -x "$BRAID" ] || cargo build --release -p braid
command -v mosquitto >/dev/null || { echo "mosquitto is not installed (scripts/install-test-deps)"; exit 1; }
ulimit -n 20000 2>/dev/null || true
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$TMP"' EXIT

run() { # name port -> json in $TMP/name.json
  "$BRAID" bench pub -c 1000 -i 0 -I 0 -q 1 -s 1024 -t bench/f/%i -F 1 --sub 1 --sub-topic 'bench/f/+' \
    --duration "$SECS" --drain-timeout 10 -p "$2" --json --quiet > "$TMP/$1.json"
}

printf "listener 18830 127.0.0.1\nallow_anonymous true\n" > "$TMP/mosquitto.conf"
mosquitto -c "$TMP/mosquitto.conf" > "$TMP/mosquitto.log" 2>&1 & M=$!
sleep 0.5; run mosquitto 18830; kill $M; wait $M 2>/dev/null || true

# The QUIC and admin listeners on free ports, not the defaults another broker may hold.
"$BRAID" serve --listen 127.0.0.1:18831 --set "store.data_dir=\"$TMP/data\"" \
  --set 'listeners.quic="127.0.0.1:0"' --set 'listeners.http="127.0.0.1:0"' > "$TMP/braid.log" 2>&1 & B=$!
sleep 0.5; run braid 18831; kill $B; wait $B 2>/dev/null || true

python3 - "$TMP" "$SECS" <<'PY'
import json, sys
tmp, secs = sys.argv[1], sys.argv[2]
rows = {n: json.load(open(f"{tmp}/{n}.json")) for n in ("mosquitto", "braid")}
print(f"1000 publishers -> 1 subscriber, QoS 1, 1 KiB, {secs} s, default settings")
print("| broker | acknowledged to publishers | delivered | lost after acknowledgement |")
print("| --- | --- | --- | --- |")
for n, d in rows.items():
    print(f"| {n} | {d['published']:,} | {d['received']:,} | {d['published'] - d['received']:,} |")
m, b = rows["mosquitto"]["received"], rows["braid"]["received"]
print(f"Delivered, Braid / Mosquitto: {b / max(m, 1):.1f}x")
PY
