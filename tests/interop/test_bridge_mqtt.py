"""The MQTT bridge (`[[bridges.mqtt]]`) against a real Mosquitto (Debian's `mosquitto`, run here on
a free port with a configuration of the test's own) and against another Braid over QUIC, with the
real `braid serve`, driven by independent clients: paho-mqtt and mosquitto_pub/_sub on both sides.

What is checked is what a user sees:

* `out` lines with prefixes (Mosquitto's `topic pattern out qos local-prefix remote-prefix`): the
  remote topic, the lower of the message's and the line's QoS (1 and 2), RETAIN as published; a
  topic outside the line is not bridged. With `protocol_version` mqttv5 and mqttv311.
* `in` lines: the local topic, QoS 1 and 2; retained messages the remote holds arrive retained;
  a live retained message keeps its flag over v5 (Retain As Published), not over 3.1.1.
* `both` lines do not loop: a message published on either side arrives once on the other and does
  not come back (v5: No Local on both sides); over 3.1.1 (no No Local, no bridge flag) a message
  from Braid comes back into Braid once, as docs/bridges.md says, and no further.
* Notifications: `$SYS/broker/connection/<client id>/state` (or `notification_topic`) is "1" /
  "0", retained, when the remote connects / is killed; `$SYS/bridges/mqtt/<name>/state` up/down;
  one WARN line per failing stretch.
* Chaos: the remote Mosquitto killed (SIGKILL) for 10 s during a QoS 1 stream published in Braid
  (each publish waiting for its PUBACK), started again on its persistence: every message Braid
  acknowledged reaches the remote's persistent subscriber (none lost; duplicates are printed).
  Braid killed (SIGKILL) while the remote is stopped: its outbox is in its store, and every
  message it acknowledged reaches the remote, in order, once both are back.
* TLS, WebSocket and WebSocket over TLS to Mosquitto.
* Another Braid as the remote over QUIC: both directions, each topic line on its own data stream
  with its priority; the remote restarted, the bridge resumes.
* Bad `[[bridges.mqtt]]` configurations: exit status 2, the message naming the key.
"""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import pytest

from bridgeutil import BridgedBraid, assert_refused
from conftest import Broker, free_port, toml_value, wait_for_port
from helpers import MQTTv311, MQTTv5, mosquitto_pub, unique, wait_until
from pki import Pki

pytestmark = pytest.mark.braid_only

WAIT = 10  # seconds a message or a state gets to cross the bridge


# --------------------------------------------------------------------------------------------------
# The remote Mosquitto, and Braid with a bridge configuration
# --------------------------------------------------------------------------------------------------

class Mosquitto(Broker):
    """`mosquitto -c FILE` on a free loopback port, a conftest Broker (`host`/`port` for the
    client helpers, `kill()` (SIGKILL), `stop()`, `start()` again on the same port and files),
    with `save()` (SIGUSR1: write the persistence database now). `lines` are more configuration
    lines for the listener (TLS, websockets) and after it."""

    def __init__(self, directory, lines=()):
        os.makedirs(directory, exist_ok=True)
        self.conf = os.path.join(directory, "mosquitto.conf")
        self.lines = lines
        super().__init__({}, directory)

    def start(self):
        if not os.path.exists(self.conf):
            with open(self.conf, "w") as f:
                f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
                f.write("max_queued_messages 100000\n")
                if os.geteuid() == 0:
                    # Started as root, Mosquitto would run as the user `mosquitto`, which may
                    # not read the test's certificates nor write its store.
                    f.write("user root\n")
                f.write("".join(line + "\n" for line in self.lines))
        self.proc = subprocess.Popen(["mosquitto", "-c", self.conf], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.proc)

    def save(self):
        self.proc.send_signal(signal.SIGUSR1)


def bridge_toml(*bridges):
    """A braid.toml with $SYS every second and one `[[bridges.mqtt]]` per dict in `bridges`."""
    lines = ["[sys]", "interval_secs = 1"]
    for b in bridges:
        lines += ["", "[[bridges.mqtt]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in b.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def remote(tmp_path):
    """Factory: remote(lines=()) -> a running Mosquitto; stopped after the test."""
    started = []

    def make(lines=()):
        started.append(Mosquitto(str(tmp_path / f"mosquitto{len(started)}"), lines))
        return started[-1]

    yield make
    for m in started:
        m.stop()


@pytest.fixture
def bridged(tmp_path):
    """Factory: bridged(*bridges) -> a running BridgedBraid with those `[[bridges.mqtt]]`."""
    started = []

    def make(*bridges):
        b = BridgedBraid(bridge_toml(*bridges), str(tmp_path / f"braid{len(started)}"), 'mqtt bridge')
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def bridge(name, address, **settings):
    """A `[[bridges.mqtt]]` to `address` (a Broker-like object or "host:port"), reconnecting
    within a second or so."""
    if not isinstance(address, str):
        address = f"{address.host}:{address.port}"
    return dict(dict(name=name, address=address, restart_timeout_secs=1), **settings)


class Retained:
    """A v5 subscriber, in `broker`, to a retained state topic (the bridge's notification topic,
    or its `$SYS/bridges/mqtt/<name>/state`): every value received, in order."""

    def __init__(self, connect, broker, topic, context=None):
        self.topic = topic
        self.context = context
        self.client = connect(broker, protocol=MQTTv5)
        self.client.subscribe(topic, 1)

    def values(self):
        return [m.payload.decode() for m in list(self.client.received) if m.topic == self.topic]

    def wait(self, want, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while not (self.values() and self.values()[-1] == want):
            if time.monotonic() > deadline:
                more = self.context.bridge_log() if self.context else ""
                raise AssertionError(f"{self.topic}: {self.values()} after {timeout}s, not ending "
                                     f"with {want!r}{more}")
            time.sleep(0.05)


def notification_topic(name):
    return f"$SYS/broker/connection/braid-{name}/state"


def wait_up(connect, braid, name):
    """Waits for the bridge `name` (default client id and notification topic) to be up: connected
    to its remote and subscribed there."""
    Retained(connect, braid, notification_topic(name), braid).wait("1")


# --------------------------------------------------------------------------------------------------
# out, in, both
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_out_with_prefixes_qos_and_retain(version, remote, bridged, connect, mosquitto_sub):
    uid = unique("out")
    m = remote()
    b = bridged(bridge(uid, m, protocol_version=version, topic=[f"{uid}/# out 2 local/ remote/"]))
    wait_up(connect, b, uid)
    rsub = mosquitto_sub(m, f"remote/{uid}/#", qos=2, version="mqttv5")
    pub = connect(b, protocol=MQTTv5)
    pub.publish(f"local/{uid}/a", b"q1", qos=1)
    pub.publish(f"local/{uid}/b/c", b"q2", qos=2)
    pub.publish(f"local/{uid}/d", b"q0", qos=0)
    mosquitto_pub(b, f"{uid}/outside-the-prefix", "no", qos=1)
    got = rsub.wait_messages(3, timeout=WAIT)
    assert sorted((x.topic, x.payload, x.qos) for x in got) == [
        (f"remote/{uid}/a", b"q1", 1), (f"remote/{uid}/b/c", b"q2", 2), (f"remote/{uid}/d", b"q0", 0)
    ], b.bridge_log()
    rsub.expect_no_message(0.5)
    # RETAIN as published: Mosquitto keeps it, a new subscriber there gets it retained.
    pub.publish(f"local/{uid}/state", b"kept", qos=1, retain=True)
    assert rsub.get_message(WAIT).payload == b"kept"
    late = connect(m, protocol=MQTTv311)
    late.subscribe(f"remote/{uid}/state", 1)
    r = late.get_message()
    assert (r.payload, r.retain) == (b"kept", True)
    # The admin API lists the bridge with its counts, and /metrics has them.
    [entry] = [x for x in b.admin_get("/api/v1/bridges")["data"] if x["name"] == uid]
    assert (entry["kind"], entry["state"], entry["out_sent"]) == ("mqtt", "up", 4), entry
    assert f'braid_bridge_sent_total{{kind="mqtt",bridge="{uid}"}} 4' in b.admin_get("/metrics")


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_in_with_prefixes_qos_and_retain(version, remote, bridged, connect):
    uid = unique("in")
    m = remote()
    rpub = connect(m, protocol=MQTTv5)
    rpub.publish(f"remote/{uid}/before", b"held", qos=1, retain=True)
    b = bridged(bridge(uid, m, protocol_version=version, topic=[f"{uid}/# in 2 local/ remote/"]))
    lsub = connect(b, protocol=MQTTv5)
    lsub.subscribe(f"local/{uid}/#", 2)
    wait_up(connect, b, uid)
    # What the remote held retained came with the bridge's subscription (and is retained in
    # Braid: see the new subscriber below).
    held = lsub.get_message(WAIT)
    assert (held.topic, held.payload) == (f"local/{uid}/before", b"held")
    rpub.publish(f"remote/{uid}/x", b"one", qos=1)
    rpub.publish(f"remote/{uid}/y/z", b"two", qos=2)
    mosquitto_pub(m, f"{uid}/x", "outside the prefix", qos=1)
    got = lsub.wait_messages(2, timeout=WAIT)
    assert [(x.topic, x.payload, x.qos) for x in got] == [
        (f"local/{uid}/x", b"one", 1), (f"local/{uid}/y/z", b"two", 2)], b.bridge_log()
    lsub.expect_no_message(0.5)
    # A live retained message: RETAIN as published over v5; 3.1.1 delivers it without the flag.
    rpub.publish(f"remote/{uid}/live", b"now", qos=1, retain=True)
    assert lsub.get_message(WAIT).payload == b"now"
    fresh = connect(b, protocol=MQTTv5)
    fresh.subscribe(f"local/{uid}/+", 1)
    retained = {x.payload for x in fresh.collect(0.7) if x.retain}
    want = {b"held", b"now"} if version == "mqttv5" else {b"held"}
    assert retained == want


@pytest.mark.parametrize("version", ["mqttv5", "mqttv311"])
def test_both_ways_without_loops(version, remote, bridged, connect):
    uid = unique("both")
    m = remote()
    b = bridged(bridge(uid, m, protocol_version=version, topic=[f"{uid}/# both 1"]))
    wait_up(connect, b, uid)
    lsub, rsub = connect(b, protocol=MQTTv5), connect(m, protocol=MQTTv311)
    lsub.subscribe(f"{uid}/#", 1)
    rsub.subscribe(f"{uid}/#", 1)
    connect(b, protocol=MQTTv311).publish(f"{uid}/from-braid", b"B", qos=1)
    connect(m, protocol=MQTTv5).publish(f"{uid}/from-mosquitto", b"M", qos=2)
    wait_until(lambda: len(lsub.received) >= 2 and len(rsub.received) >= 2, WAIT,
               message="both messages on both sides")
    time.sleep(1.5)  # anything that loops would keep coming
    local = sorted(x.payload for x in lsub.received)
    there = sorted(x.payload for x in rsub.received)
    assert there == [b"B", b"M"], b.bridge_log()
    if version == "mqttv5":
        assert local == [b"B", b"M"], b.bridge_log()
    else:
        # 3.1.1 has no No Local: Mosquitto sends the bridge back what it published there, once.
        assert local == [b"B", b"B", b"M"], b.bridge_log()
        assert "come back into Braid once" in b.log_text()


# --------------------------------------------------------------------------------------------------
# State and notifications
# --------------------------------------------------------------------------------------------------

def test_notifications_when_the_remote_is_killed_and_started(remote, bridged, connect):
    uid = unique("note")
    m = remote()
    custom = f"{uid}/bridge/state"
    b = bridged(bridge(uid, m, topic=[f"{uid}/# out 1"]),
                bridge(uid + "-2", m, topic=[f"{uid}/x/# in 1"], notification_topic=custom),
                bridge(uid + "-3", m, topic=[f"{uid}/y/# out 1"], notifications=False))
    note = Retained(connect, b, notification_topic(uid), b)
    note2 = Retained(connect, b, custom, b)
    sys_state = Retained(connect, b, f"$SYS/bridges/mqtt/{uid}/state", b)
    note.wait("1")
    note2.wait("1")
    sys_state.wait("up")
    m.kill()
    note.wait("0")
    note2.wait("0")
    sys_state.wait("down")
    time.sleep(2)  # a few reconnect attempts
    m.start()
    note.wait("1")
    note2.wait("1")
    sys_state.wait("up")
    assert note.values()[-3:] == ["1", "0", "1"]
    warnings = [line for line in b.log_text().splitlines()
                if "WARN" in line and "mqtt bridge" in line and f"bridge={uid} " in line + " "]
    assert len(warnings) == 1, "\n".join(warnings)
    silent = Retained(connect, b, notification_topic(uid + "-3"), b)
    silent.client.expect_no_message(0.3)


# --------------------------------------------------------------------------------------------------
# Chaos: the remote killed during a stream
# --------------------------------------------------------------------------------------------------

def test_remote_killed_during_a_qos1_stream_loses_nothing(remote, bridged, connect, tmp_path):
    uid = unique("chaos")
    store = tmp_path / "mosquitto-db"
    store.mkdir()
    m = remote(["persistence true", f"persistence_location {store}/"])
    sub_id = unique("chaos-sub")
    sub = connect(m, client_id=sub_id, protocol=MQTTv311, clean_session=False)
    sub.subscribe(f"remote/{uid}/#", 1)
    b = bridged(bridge(uid, m, topic=[f"{uid}/# out 1 \"\" remote/"], restart_timeout_secs=2))
    wait_up(connect, b, uid)
    m.save()  # the subscriber's session and subscription are on disk from now on
    time.sleep(0.5)

    n, acked, failures = 1000, [], []
    pub = connect(b, protocol=MQTTv5)

    def stream():
        try:
            for i in range(n):
                pub.publish(f"{uid}/{i % 7}", str(i).encode(), qos=1)  # waits for Braid's PUBACK
                acked.append(i)
                time.sleep(0.011)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            failures.append(e)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    time.sleep(1.5)
    m.kill()
    killed_at = len(acked)
    time.sleep(10)
    m.start()
    sub2 = connect(m, client_id=sub_id, protocol=MQTTv311, clean_session=False)
    t.join(30)
    assert not failures and len(acked) == n, f"publisher: {failures}, {len(acked)} acknowledged"

    def payloads():
        return [int(x.payload) for x in list(sub.received) + list(sub2.received)]

    try:
        wait_until(lambda: set(payloads()) >= set(acked), 30, interval=0.1,
                   message="every acknowledged message at the remote subscriber")
    finally:
        got = payloads()
        lost = sorted(set(acked) - set(got))
        dups = len(got) - len(set(got))
        firsts = []
        for x in (int(x.payload) for x in sub2.received):
            if x not in firsts:
                firsts.append(x)
        out_of_order = sum(1 for a, c in zip(firsts, firsts[1:]) if c < a)
        print(f"\nchaos: {n} acknowledged by Braid ({killed_at} before the kill), {len(got)} "
              f"received ({len(sub.received)} before the kill, {len(sub2.received)} after), "
              f"lost {len(lost)}, duplicates {dups}, out of order after the restart {out_of_order}")
    assert not lost, f"lost: {lost[:20]}{b.bridge_log()}"


def test_braid_killed_while_the_remote_is_away_keeps_the_outbox(remote, bridged, connect, tmp_path):
    """The outbox is a persistent session in Braid's store: messages Braid acknowledged while the
    remote was stopped survive a SIGKILL of Braid and reach the remote, in order, once both are
    back."""
    uid = unique("kill9")
    store = tmp_path / "mosquitto-db"
    store.mkdir()
    m = remote(["persistence true", f"persistence_location {store}/"])
    sub_id = unique("kill9-sub")
    connect(m, client_id=sub_id, protocol=MQTTv311, clean_session=False).subscribe(f"remote/{uid}/#", 1)
    b = bridged(bridge(uid, m, topic=[f"{uid}/# out 1 \"\" remote/"]))
    wait_up(connect, b, uid)
    m.stop()  # SIGTERM: Mosquitto writes its sessions to its store
    pub = connect(b, protocol=MQTTv5)
    n = 200
    for i in range(n):
        pub.publish(f"{uid}/k", str(i).encode(), qos=1)  # Braid's PUBACK: in the outbox
    b.kill()
    m.start()
    b.start()
    sub = connect(m, client_id=sub_id, protocol=MQTTv311, clean_session=False)
    try:
        wait_until(lambda: {int(x.payload) for x in list(sub.received)} >= set(range(n)), WAIT,
                   interval=0.1, message="every acknowledged message at the remote subscriber")
    finally:
        got = [int(x.payload) for x in list(sub.received)]
        print(f"\nkill -9: {n} acknowledged, {len(got)} received, lost {n - len(set(got))}, "
              f"duplicates {len(got) - len(set(got))}")
    firsts = list(dict.fromkeys(got))
    assert firsts == sorted(firsts), f"not in order: {firsts[:40]}"


# --------------------------------------------------------------------------------------------------
# Transports: TLS and WebSocket to Mosquitto, QUIC to another Braid
# --------------------------------------------------------------------------------------------------

@pytest.fixture
def pki(tmp_path):
    p = Pki(tmp_path / "pki")
    os.makedirs(p.dir, exist_ok=True)
    p.ca("ca")
    p.issue("server", "localhost", ca="ca")
    return p


@pytest.mark.parametrize("transport", ["tls", "ws", "wss"])
def test_tls_and_websocket_transports(transport, pki, remote, bridged, connect):
    uid = unique(transport)
    secure = transport in ("tls", "wss")
    port = free_port()
    lines = [f"listener {port} 127.0.0.1"]
    if transport != "tls":
        lines.append("protocol websockets")
    if secure:
        lines += [f"cafile {pki.path('ca.pem')}", f"certfile {pki.path('server.pem')}",
                  f"keyfile {pki.path('server.key')}"]
    m2 = remote(lines)  # its first listener is plain, for the test's own clients
    extra = dict(ca_file=pki.path("ca.pem")) if secure else {}
    b = bridged(bridge(uid, f"127.0.0.1:{port}", transport=transport, topic=[f"{uid}/# both 1"],
                       **extra))
    wait_up(connect, b, uid)
    lsub, rsub = connect(b, protocol=MQTTv5), connect(m2, protocol=MQTTv5)
    lsub.subscribe(f"{uid}/#", 1)
    rsub.subscribe(f"{uid}/#", 1)
    connect(b).publish(f"{uid}/b", b"from braid", qos=1)
    connect(m2).publish(f"{uid}/m", b"from mosquitto", qos=1)
    wait_until(lambda: len(rsub.received) >= 2 and len(lsub.received) >= 2, WAIT,
               message=f"messages both ways over {transport}")
    assert sorted(x.payload for x in rsub.received) == [b"from braid", b"from mosquitto"]
    assert sorted(x.payload for x in lsub.received) == [b"from braid", b"from mosquitto"]


def free_udp_port():
    return free_port(kind=socket.SOCK_DGRAM)


def test_quic_to_another_braid_one_stream_per_topic_line(make_broker, bridged, connect):
    uid = unique("quic")
    udp = free_udp_port()
    other = make_broker(braid={"listeners.quic": f"127.0.0.1:{udp}"})
    urgent, bulk = f"{uid}/urgent/#", f"{uid}/bulk/#"
    b = bridged(bridge(uid, f"127.0.0.1:{udp}", transport="quic", insecure=True,
                       topic=[f"{urgent} in 1", f"{bulk} in 1", f"{uid}/up/# out 1 \"\" remote/"],
                       priorities={urgent: 10, bulk: 1}))
    wait_up(connect, b, uid)
    streams = {}
    for line in b.log_text().splitlines():
        found = re.search(r"pattern=(\S+) priority=(-?\d+) stream=(\d+)", line)
        if "QUIC data stream opened" in line and found:
            streams[found.group(1)] = (int(found.group(2)), int(found.group(3)))
    assert streams.get(urgent, (None,))[0] == 10 and streams.get(bulk, (None,))[0] == 1, streams
    assert len({s for _, s in streams.values()}) == 3, f"one data stream per line: {streams}"

    lsub = connect(b, protocol=MQTTv5)
    lsub.subscribe([(urgent, 1), (bulk, 1)])
    rsub = connect(other, protocol=MQTTv5)
    rsub.subscribe(f"remote/{uid}/#", 1)
    rpub = connect(other, protocol=MQTTv5)
    rpub.publish(f"{uid}/bulk/big", b"x" * 1_000_000, qos=1)
    rpub.publish(f"{uid}/urgent/alarm", b"now", qos=1)
    connect(b, protocol=MQTTv5).publish(f"{uid}/up/reading", b"21.5", qos=1)
    got = {x.topic: x.payload for x in lsub.wait_messages(2, timeout=WAIT)}
    assert got == {f"{uid}/bulk/big": b"x" * 1_000_000, f"{uid}/urgent/alarm": b"now"}, b.bridge_log()
    r = rsub.get_message(WAIT)
    assert (r.topic, r.payload) == (f"remote/{uid}/up/reading", b"21.5")

    # The remote restarts (on its store): the bridge opens a new connection and its streams.
    note = Retained(connect, b, notification_topic(uid), b)
    other.stop()
    note.wait("0")
    other.start()
    note.wait("1")
    rsub = connect(other, protocol=MQTTv5)
    rsub.subscribe(f"remote/{uid}/#", 1)
    connect(b, protocol=MQTTv5).publish(f"{uid}/up/again", b"22", qos=1)
    assert rsub.get_message(WAIT).payload == b"22", b.bridge_log()
    connect(other, protocol=MQTTv5).publish(f"{uid}/urgent/again", b"ok", qos=1)
    assert lsub.get_message(WAIT).payload == b"ok", b.bridge_log()


# --------------------------------------------------------------------------------------------------
# Bad configurations
# --------------------------------------------------------------------------------------------------

GOOD = dict(name="b", address="127.0.0.1:1883", topic=["a/# out 1"])

BAD_CONFIGS = {
    "unknown direction": (dict(GOOD, topic=["a/# sideways 1"]), "bridges.mqtt[0].topic[0]"),
    "qos 3": (dict(GOOD, topic=["a/# in 3"]), "bridges.mqtt[0].topic[0]"),
    "pattern not a filter": (dict(GOOD, topic=["a/# out 1", "a/#/b both 1"]), "bridges.mqtt[0].topic[1]"),
    "wildcard in a prefix": (dict(GOOD, topic=["a/# out 1 l/+/ r/"]), "bridges.mqtt[0].topic[0]"),
    "one prefix only": (dict(GOOD, topic=["a/# out 1 l/"]), "bridges.mqtt[0].topic[0]"),
    "no topic": ({k: v for k, v in GOOD.items() if k != "topic"}, "bridges.mqtt[0].topic"),
    "missing address": ({k: v for k, v in GOOD.items() if k != "address"}, "bridges.mqtt[0].address"),
    "bad transport": (dict(GOOD, transport="udp"), "bridges.mqtt[0].transport"),
    "bad protocol_version": (dict(GOOD, protocol_version="mqttv4"), "bridges.mqtt[0].protocol_version"),
    "priorities without quic": (dict(GOOD, priorities={"a/#": 3}), "bridges.mqtt[0].priorities"),
    "priority for no line": (dict(GOOD, transport="quic", priorities={"b/#": 3}), "bridges.mqtt[0].priorities"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS) + ["duplicate names"])
def test_bad_bridge_configuration_is_refused_naming_the_key(tmp_path, case):
    """`braid serve` exits with status 2 before listening, the message naming the key."""
    if case == "duplicate names":
        text, key = bridge_toml(GOOD, GOOD), "bridges.mqtt[1].name"
    else:
        bad, key = BAD_CONFIGS[case]
        text = bridge_toml(bad)
    assert_refused(tmp_path, text, key)


# --------------------------------------------------------------------------------------------------
# In a cluster
# --------------------------------------------------------------------------------------------------

def test_in_a_cluster_each_message_crosses_the_bridge_once(remote, braid_cluster, connect):
    """Two Braid nodes on one Redis, each with the same bridge to one Mosquitto: an `in` line's
    subscription on the remote is shared by the nodes, so each message from the remote comes
    into the cluster once (subscribers on both nodes get it once); each node bridges out what is
    published on it, so the remote gets each message once."""
    uid = unique("clm")
    m = remote()
    nodes = braid_cluster(2, settings={"bridges.mqtt": [bridge(uid, m, topic=[f"{uid}/in/# in 1",
                                                                               f"{uid}/out/# out 1"])]})
    for n in nodes:
        Retained(connect, n, f"$SYS/broker/connection/braid-{uid}-{n.node}/state", n).wait("1")
    subs = [connect(n, protocol=MQTTv5) for n in nodes]
    for s in subs:
        s.subscribe(f"{uid}/in/#", 1)
    rsub = connect(m, protocol=MQTTv5)
    rsub.subscribe(f"{uid}/out/#", 1)
    time.sleep(1.0)  # the subscriptions reach both nodes' routes
    rpub = connect(m, protocol=MQTTv5)
    for i in range(20):
        rpub.publish(f"{uid}/in/x", f"in-{i:02d}".encode(), qos=1)
    for i, n in enumerate(nodes):
        pub = connect(n, protocol=MQTTv5)
        for j in range(10):
            pub.publish(f"{uid}/out/n{i + 1}", f"out-{i + 1}-{j:02d}".encode(), qos=1)
    want_in = [f"in-{i:02d}".encode() for i in range(20)]
    for s, n in zip(subs, nodes):
        got = [x.payload for x in s.wait_messages(20, timeout=WAIT)]
        s.expect_no_message(1.0)
        assert sorted(got) == want_in, f"subscriber on {n.node}: {len(got)} messages, {got[:5]}..."
    got = [x.payload for x in rsub.wait_messages(20, timeout=WAIT)]
    rsub.expect_no_message(1.0)
    assert sorted(got) == sorted(f"out-{i}-{j:02d}".encode() for i in (1, 2) for j in range(10)), got
    # Each node's admin API lists both nodes, itself marked.
    for n in nodes:
        listed = n.admin_get("/api/v1/nodes")["data"]
        assert sorted((x["name"], x["this_node"]) for x in listed) == sorted(
            (o.node, o.node == n.node) for o in nodes), listed
    # Each message from the remote entered on one node and was forwarded to the other once.
    def total(name):
        return sum(float(line.rsplit(" ", 1)[1]) for n in nodes for line in n.admin_get("/metrics").splitlines()
                   if line.startswith(name + " "))
    assert total("braid_cluster_forwarded_messages_total") >= 20
    assert total("braid_cluster_received_messages_total") >= 20


# --------------------------------------------------------------------------------------------------
# reload
# --------------------------------------------------------------------------------------------------

def test_a_reload_adds_changes_and_removes_bridges_without_a_restart(remote, bridged, connect, mosquitto_sub):
    """SIGHUP with a changed [[bridges.mqtt]] list: a new bridge starts, a changed one restarts
    with its new lines, a removed one stops and its outbox session in Braid is ended; the
    broker's clients stay connected throughout."""
    a, c = unique("rla"), unique("rlc")
    m = remote()
    b = bridged(bridge(a, m, topic=[f"{a}/# out 1 local/ one/"]))
    wait_up(connect, b, a)
    bystander = connect(b, protocol=MQTTv5)
    rsub = mosquitto_sub(m, [f"one/{a}/#", f"two/{a}/#", f"{c}/#"], qos=1, version="mqttv5")
    pub = connect(b, protocol=MQTTv5)
    pub.publish(f"local/{a}/x", b"before", qos=1)
    assert rsub.get_message(WAIT).topic == f"one/{a}/x", b.bridge_log()
    # a changes its remote prefix, c is new.
    with open(b.config_file, "w") as f:
        f.write(bridge_toml(bridge(a, m, topic=[f"{a}/# out 1 local/ two/"]), bridge(c, m, topic=[f"{c}/# out 1"])))
    url = b.admin_url()
    req = urllib.request.Request(url + "/api/v1/reload", method="POST")
    with urllib.request.urlopen(req, timeout=15) as r:
        outcome = json.loads(r.read())
    assert sorted(outcome["bridges"]) == sorted([f"mqtt/{a} restarted", f"mqtt/{c} started"]), outcome
    assert outcome["restart_needed"] == [], outcome
    wait_up(connect, b, c)
    deadline = time.monotonic() + WAIT
    got = []
    while time.monotonic() < deadline and f"two/{a}/x" not in [x.topic for x in got]:
        pub.publish(f"local/{a}/x", b"after", qos=1)
        got += rsub.collect(0.5)
    assert f"two/{a}/x" in [x.topic for x in got], (got, b.bridge_log())
    pub.publish(f"{c}/y", b"new bridge", qos=1)
    deadline = time.monotonic() + WAIT
    while f"{c}/y" not in [x.topic for x in got]:
        assert time.monotonic() < deadline, (got, b.bridge_log())
        got += rsub.collect(0.3)
    # Both removed: stopped, and their sessions in Braid ended.
    with open(b.config_file, "w") as f:
        f.write(bridge_toml())
    with urllib.request.urlopen(urllib.request.Request(url + "/api/v1/reload", method="POST"), timeout=15) as r:
        outcome = json.loads(r.read())
    assert sorted(outcome["bridges"]) == sorted([f"mqtt/{a} stopped", f"mqtt/{c} stopped"]), outcome
    assert b.admin_get("/api/v1/bridges")["data"] == []
    left = b.admin_get("/api/v1/clients?prefix=%24internal%2Fbridge%2F")["data"]
    assert left == [], left
    assert bystander.is_connected() and pub.is_connected()


def test_a_rule_sends_its_outputs_to_another_broker_through_an_mqtt_sink(remote, make_broker, connect,
                                                                        mosquitto_sub, tmp_path):
    """An `mqtt` sink: each output of the rule is published to Mosquitto at QoS 1 with its topic
    and payload templates, read there by mosquitto_sub; while Mosquitto is away the outputs wait
    in the outbox and arrive once it is back."""
    # Mosquitto keeps the watcher's session across its restart.
    m = remote(["persistence true", f"persistence_location {tmp_path}/"])
    sub = mosquitto_sub(m, ["alerts/#"], qos=1, version="mqttv5", client_id="sinkwatch", extra=["-c"])
    rule = {"name": "hot", "actions": ["fwd"],
            "sql": 'SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30'}
    sink = {"name": "fwd", "type": "mqtt", "url": f"mqtt://127.0.0.1:{m.port}", "topic": "alerts/${clientid}",
            "body": "${temp} C"}
    braid = make_broker(braid={"rules": [rule], "sinks": [sink]})
    publisher = connect(braid, client_id="dev1")
    for temp in (31, 5, 32):
        assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": temp}), qos=1) == 0
    got = sub.wait_messages(2)
    assert sorted((x.topic, x.payload) for x in got) == [("alerts/dev1", b"31 C"), ("alerts/dev1", b"32 C")]
    m.stop()
    for temp in (40, 41):
        assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": temp}), qos=1) == 0
    wait_until(lambda: "writes failed" in braid.log_text(), message="the sink found Mosquitto away")
    m.start()
    got = sub.wait_messages(2, timeout=30)
    assert sorted(x.payload for x in got) == [b"40 C", b"41 C"], got
