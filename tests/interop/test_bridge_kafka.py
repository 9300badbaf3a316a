"""The Kafka bridge (`[[bridges.kafka]]`) against a real Apache Kafka (tests/interop/kafkaproc.py:
one KRaft node run by scripts/services) and the real `braid serve`, driven by independent clients:
paho-mqtt and mosquitto_pub on the MQTT side, Kafka's own console producer and consumer (and
kafka-consumer-groups) on the Kafka side.

What is checked is what a user sees:

* MQTT -> Kafka (`[[bridges.kafka.out]]`): the payload as it was published, the key and the Kafka
  topic from their templates (`${topic}`, `${1}`, `${2}`..., or no key), the headers `mqtt.qos`,
  `mqtt.retain`, `mqtt.content_type` and every v5 user property; one record per matching route;
  the publish order of each MQTT topic kept (one partition per key). A message no record can be
  made for is dropped, logged and counted in `$SYS/bridges/kafka/<name>/out/dropped`.
* Kafka -> MQTT (`[[bridges.kafka.in]]`): records published on the templated MQTT topic at the
  configured QoS and RETAIN, headers as user properties; a record no MQTT topic can be made for
  is skipped, logged and counted (`.../in/skipped`); the group's offsets are committed, so a
  restarted Braid goes on where it stopped.
* The outbox (ack = "log", the default): PUBACK once the message is in Braid's store, whether
  Kafka is there or not; a Kafka stopped for 20 s mid-stream and a `kill -9` of Braid while Kafka
  is away lose no acknowledged message (duplicates are counted and printed).
* ack = "kafka": no PUBACK (nor PUBREC) while Kafka is stopped, every one once it is back, each
  message in Kafka once; a message Kafka can never take gets a v5 PUBACK 0x80.
* A topic Kafka does not have (and does not create): dropped, logged and counted.
* Unreachable Kafka at start, bad `[[bridges.kafka]]` configurations (exit status 2 naming the
  key), client ids under `$internal/` refused to network clients, SASL (SCRAM-SHA-256, PLAIN) and
  TLS towards Kafka.

One Kafka serves the module (each test has topics, bridge names and consumer groups of its own);
the tests that stop Kafka, and the SASL/TLS ones, run a node of their own.
"""
import json
import os
import threading
import time

import pytest

from bridgeutil import BridgedBraid, assert_refused
from conftest import free_port, toml_value
from helpers import (MQTTv311, MQTTv5, PacketTypes, RawClient, connack_return_code, mosquitto_pub,
                     unique, v5_properties, wait_until)
from kafkaproc import KafkaServer

pytestmark = pytest.mark.braid_only

CLIENT_ID_NOT_VALID = 0x85      # v5 CONNACK reason code
IDENTIFIER_REJECTED = 0x02      # 3.1.1 CONNACK return code
KAFKA_WAIT = 30                 # seconds a record gets to cross the bridge


# --------------------------------------------------------------------------------------------------
# Braid with a configuration file, and its bridge's $SYS topics
# --------------------------------------------------------------------------------------------------

def bridge_toml(*bridges):
    """A braid.toml with $SYS every second and one `[[bridges.kafka]]` per dict in `bridges`: its
    keys are the bridge's settings, "out" and "in" lists of dicts for its routes."""
    lines = ["[sys]", "interval_secs = 1"]
    for b in bridges:
        lines += ["", "[[bridges.kafka]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in b.items() if k not in ("out", "in")]
        for direction in ("out", "in"):
            for route in b.get(direction, []):
                lines += ["", f"[[bridges.kafka.{direction}]]"]
                lines += [f"{k} = {toml_value(v)}" for k, v in route.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def bridged(tmp_path):
    """Factory: bridged(*bridges, data_dir=None) -> a running BridgedBraid whose configuration is
    bridge_toml(*bridges); stopped after the test."""
    started = []

    def make(*bridges, data_dir=None):
        b = BridgedBraid(bridge_toml(*bridges), str(tmp_path / f"braid{len(started)}"), 'kafka', data_dir)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


class BridgeSys:
    """A v5 subscriber to `$SYS/bridges/kafka/<name>/#`: every value received, in order, with the
    time it came (the bridge publishes them, retained, every sys.interval_secs)."""

    def __init__(self, connect, broker, name):
        self.prefix = f"$SYS/bridges/kafka/{name}/"
        self.client = connect(broker, protocol=MQTTv5)
        self.client.subscribe(self.prefix + "#", 0)

    def values(self, key, since=0.0, until=float("inf")):
        """The values of `key` (e.g. "out/dropped") received between time.monotonic() `since` and
        `until`."""
        return [m.payload.decode() for m in list(self.client.received)
                if m.topic == self.prefix + key and since <= m.received_at <= until]

    def latest(self, key):
        v = self.values(key)
        return v[-1] if v else None

    def wait(self, key, want, timeout=15.0, context=""):
        """Waits until the latest value of `key` satisfies `want` (a value or a predicate on the
        string); returns it."""
        ok = want if callable(want) else (lambda v: v == str(want))
        deadline = time.monotonic() + timeout
        while True:
            v = self.latest(key)
            if v is not None and ok(v):
                return v
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.prefix}{key} is {v!r} after {timeout}s, not "
                                     f"{want if not callable(want) else 'as expected'}{context}")
            time.sleep(0.1)


def _headers(record):
    """A record's headers as [(name, str)]."""
    return [(k, None if v is None else v.decode()) for k, v in record.headers]


def _consume(kafka, topic, n, timeout=KAFKA_WAIT, braid=None):
    """The n records of `topic` (all of them from the start), failing with the bridge's log when
    fewer arrive."""
    records = kafka.consume(topic, n, timeout=timeout)
    assert len(records) == n, (f"Kafka topic {topic}: {len(records)} records instead of {n}: "
                               f"{[(r.key, r.value[:40] if r.value else r.value) for r in records]}"
                               f"{braid.bridge_log() if braid else ''}")
    return records


def _publish_props(**values):
    return v5_properties(PacketTypes.PUBLISH, **values)


def _dedupe(seq):
    """`seq` without repeats (first occurrence kept) and the number of repeats removed."""
    seen, out = set(), []
    for x in seq:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out, len(seq) - len(out)


def _one_route(kafka, bridged, tag, partitions=None):
    """A bridge named after `tag` on `kafka` whose one route takes `<uid>/#` to the Kafka topic
    `<tag>.<uid>` (created first with `partitions`, if given): (uid, Kafka topic, braid)."""
    uid = unique(tag)
    ktopic = f"{tag}.{uid}"
    if partitions:
        kafka.create_topic(ktopic, partitions=partitions)
    b = bridged(dict(name=uid, brokers=kafka.bootstrap, out=[dict(filter=f"{uid}/#", topic=ktopic)]))
    return uid, ktopic, b


@pytest.fixture(scope="module")
def kafka(tmp_path_factory):
    """One Kafka node for the module's tests that do not stop it."""
    k = KafkaServer(tmp_path_factory.mktemp("kafka"))
    yield k
    k.stop()


@pytest.fixture
def own_kafka(tmp_path):
    """Factory: own_kafka(**KafkaServer options) -> a Kafka node of the test's own (for tests that
    stop it); stopped after the test."""
    nodes = []

    def make(**kw):
        nodes.append(KafkaServer(tmp_path / f"kafka{len(nodes)}", **kw))
        return nodes[-1]

    yield make
    for k in nodes:
        k.stop()


# --------------------------------------------------------------------------------------------------
# 1-2. MQTT -> Kafka
# --------------------------------------------------------------------------------------------------

def test_out_publishes_become_records_with_key_value_and_headers(kafka, bridged, connect):
    """QoS 0/1/2 from a v5 publisher (user properties, content type, a binary payload with a line
    break) and QoS 1 from a 3.1.1 mosquitto_pub: one record each, key = MQTT topic (the default
    template), value = payload byte for byte, headers mqtt.qos / mqtt.retain /
    mqtt.content_type and the user properties in order (a repeated name too)."""
    uid = unique("out")
    ktopic = f"mqtt.{uid}"
    # qos = 2: the outbox subscribes at QoS 2, so a QoS 2 message keeps its QoS.
    b = bridged(dict(name=uid, brokers=[kafka.bootstrap],
                     out=[dict(filter=f"{uid}/#", topic=ktopic, qos=2)]))
    pub = connect(b, protocol=MQTTv5)
    binary = "line 1\nline 2 é ".encode() + bytes([0, 1, 2, 254, 255])
    props = _publish_props(ContentType="application/json",
                           UserProperty=[("site", "lab"), ("unité", "°C"), ("site", "lab-2")])
    pub.publish(f"{uid}/a", b"zero", qos=0)
    assert pub.publish(f"{uid}/a", b'{"t": 21.5}', qos=1, properties=props) == 0
    assert pub.publish(f"{uid}/a", b"two", qos=2) == 0
    assert pub.publish(f"{uid}/bin", binary, qos=1) == 0
    mosquitto_pub(b, f"{uid}/legacy", "from 3.1.1", qos=1, version="mqttv311")

    got = {r.value: r for r in _consume(kafka, ktopic, 5, braid=b)}
    expected = {
        b"zero": (f"{uid}/a", [("mqtt.qos", "0"), ("mqtt.retain", "false")]),
        b'{"t": 21.5}': (f"{uid}/a", [("mqtt.qos", "1"), ("mqtt.retain", "false"),
                                      ("mqtt.content_type", "application/json"), ("site", "lab"),
                                      ("unité", "°C"), ("site", "lab-2")]),
        b"two": (f"{uid}/a", [("mqtt.qos", "2"), ("mqtt.retain", "false")]),
        binary: (f"{uid}/bin", [("mqtt.qos", "1"), ("mqtt.retain", "false")]),
        b"from 3.1.1": (f"{uid}/legacy", [("mqtt.qos", "1"), ("mqtt.retain", "false")]),
    }
    assert set(got) == set(expected), f"record values {sorted(got)} instead of {sorted(expected)}"
    for value, (key, headers) in expected.items():
        r = got[value]
        assert r.key == key.encode(), f"record {value!r}: key {r.key!r}, not {key!r}"
        assert _headers(r) == headers, f"record {value!r}: headers {_headers(r)}, not {headers}"


def test_out_keeps_the_publish_order_of_each_mqtt_topic(kafka, bridged, connect):
    """400 QoS 1 messages on 4 MQTT topics, interleaved and not waited for one by one, into a Kafka
    topic of 3 partitions: the records of each key are all in one partition, in publish order,
    none missing or twice."""
    uid, ktopic, b = _one_route(kafka, bridged, "order", partitions=3)
    pub = connect(b, protocol=MQTTv5)
    topics = [f"{uid}/dev{i}" for i in range(4)]
    expected = {t: [] for t in topics}
    infos = []
    for i in range(400):
        t = topics[i % 4]
        expected[t].append(f"{i:04d}".encode())
        infos.append(pub.publish(t, f"{i:04d}", qos=1, wait=False))
    wait_until(lambda: all(i.is_published() for i in infos), timeout=15, message="400 PUBACKs")

    records = _consume(kafka, ktopic, 400, braid=b)
    for t in topics:
        mine = [r for r in records if r.key == t.encode()]
        partitions = {r.partition for r in mine}
        assert len(partitions) == 1, f"key {t}: records in partitions {partitions}, not in one"
        values = [r.value for r in sorted(mine, key=lambda r: r.offset)]
        assert values == expected[t], (
            f"key {t}: {len(values)} records, {len(values) - len(set(values))} twice, "
            f"{len(set(expected[t]) - set(values))} missing, order kept: "
            f"{[v for v in values if v in expected[t]] == expected[t]}")


def test_out_templates_with_topic_levels_and_without_key(kafka, bridged, connect):
    """`topic = "lvl.${1}"`, `key = "${2}"` make the Kafka topic from the first level and the key
    from the second; `key = ""` gives records without a key; a message matching two routes
    becomes one record for each."""
    uid = unique("tpl")
    b = bridged(dict(name=uid, brokers=kafka.bootstrap, out=[
        dict(filter=f"{uid}/+/temp", topic="lvl.${1}", key="${2}"),
        dict(filter=f"{uid}/nokey/#", topic="nokey.${1}", key=""),
    ]))
    pub = connect(b, protocol=MQTTv311)
    pub.publish(f"{uid}/kitchen/temp", b"21.5", qos=1)
    pub.publish(f"{uid}/hall/temp", b"19.0", qos=1)
    pub.publish(f"{uid}/nokey/x/y", b"no key", qos=1)
    pub.publish(f"{uid}/nokey/temp", b"both routes", qos=1)   # matches both filters

    lvl = _consume(kafka, f"lvl.{uid}", 3, braid=b)
    assert sorted((r.key, r.value) for r in lvl) == [
        (b"hall", b"19.0"), (b"kitchen", b"21.5"), (b"nokey", b"both routes")], \
        f"records of lvl.{uid}: {[(r.key, r.value) for r in lvl]}"
    nokey = _consume(kafka, f"nokey.{uid}", 2, braid=b)
    assert sorted((r.key, r.value) for r in nokey) == [(None, b"both routes"), (None, b"no key")], \
        f"records of nokey.{uid} (key = \"\": no key expected): {[(r.key, r.value) for r in nokey]}"


def test_out_retained_publish_is_bridged_with_retain_header_true(kafka, bridged, connect):
    """A message published with RETAIN reaches Kafka with header mqtt.retain = "true" (and one
    without, "false")."""
    uid, ktopic, b = _one_route(kafka, bridged, "ret")
    pub = connect(b, protocol=MQTTv5)
    pub.publish(f"{uid}/state", b"retained", qos=1, retain=True)
    pub.publish(f"{uid}/state", b"live", qos=1)
    got = {r.value: dict(_headers(r)) for r in _consume(kafka, ktopic, 2, braid=b)}
    assert got[b"live"].get("mqtt.retain") == "false", got
    assert got[b"retained"].get("mqtt.retain") == "true", (
        f"a message published with RETAIN reached Kafka with headers {got[b'retained']}")


def test_out_retained_message_is_not_bridged_again_when_braid_restarts(kafka, bridged, connect):
    """A retained message goes to Kafka once: a graceful restart of Braid (the outbox session
    resumes and subscribes again) must not send it again."""
    uid, ktopic, b = _one_route(kafka, bridged, "reret")
    pub = connect(b, protocol=MQTTv5)
    pub.publish(f"{uid}/state", b"retained once", qos=1, retain=True)
    pub.publish(f"{uid}/live", b"before restart", qos=1)
    _consume(kafka, ktopic, 2, braid=b)
    b.stop()
    b.start()
    connect(b, protocol=MQTTv5).publish(f"{uid}/live", b"after restart", qos=1)
    records = kafka.consume(ktopic, 10, timeout=4)
    values = [r.value for r in records]
    assert b"after restart" in values, f"nothing bridged after the restart: {values}{b.bridge_log()}"
    assert values == [b"retained once", b"before restart", b"after restart"], (
        f"records in Kafka after a restart of Braid: {[(r.value, _headers(r)) for r in records]} "
        f"(the retained message {values.count(b'retained once')} times)")


# --------------------------------------------------------------------------------------------------
# 3. Kafka -> MQTT
# --------------------------------------------------------------------------------------------------

def test_in_records_become_mqtt_messages_with_user_properties_qos_and_retain(kafka, bridged, connect):
    """Records from the console producer (key, value, headers) reach a v5 subscriber on the
    templated topics of four `in` routes of one Kafka topic (a consumer group each): QoS 0, 1, 2
    as configured, headers as user properties in order; the route with retain = true leaves
    retained messages that a later subscriber gets."""
    uid = unique("in")
    ktopic = f"cmd.{uid}"
    kafka.create_topic(ktopic)
    routes = [dict(topic=ktopic, mqtt_topic=f"{uid}/q{q}/" + "${key}/commands", qos=q,
                   group=f"{uid}-q{q}") for q in (0, 1, 2)]
    routes.append(dict(topic=ktopic, mqtt_topic=f"{uid}/state/" + "${topic}/${partition}/${key}",
                       qos=1, retain=True, group=f"{uid}-r"))
    b = bridged(dict(name=uid, brokers=kafka.bootstrap, **{"in": routes}))
    sys = BridgeSys(connect, b, uid)
    sub = connect(b, protocol=MQTTv5)
    assert sub.subscribe(f"{uid}/#", 2) == [2]
    kafka.produce(ktopic, [("dev1", "reboot", [("trace", "t-1"), ("origin", "ops"), ("empty", "")]),
                           ("dev2", "ping")])

    got = sub.wait_messages(8, timeout=KAFKA_WAIT)
    sub.expect_no_message(0.5)
    by_topic = {}
    for m in got:
        by_topic.setdefault(m.topic, []).append(m)
    expected_topics = {f"{uid}/q{q}/{dev}/commands" for q in (0, 1, 2) for dev in ("dev1", "dev2")}
    expected_topics |= {f"{uid}/state/{ktopic}/0/{dev}" for dev in ("dev1", "dev2")}
    assert set(by_topic) == expected_topics, f"topics {sorted(by_topic)}, not {sorted(expected_topics)}"
    assert all(len(ms) == 1 for ms in by_topic.values()), \
        f"some topic got more than one message: {[(t, len(ms)) for t, ms in by_topic.items()]}"
    for q in (0, 1, 2):
        [m1] = by_topic[f"{uid}/q{q}/dev1/commands"]
        [m2] = by_topic[f"{uid}/q{q}/dev2/commands"]
        assert (m1.payload, m2.payload) == (b"reboot", b"ping")
        assert (m1.qos, m2.qos) == (q, q), f"route qos = {q}: delivered at QoS {m1.qos}, {m2.qos}"
        user = list(getattr(m1.properties, "UserProperty", []) or [])
        assert user == [("trace", "t-1"), ("origin", "ops"), ("empty", "")], \
            f"route q{q}: user properties {user} from the record's headers"
        assert not getattr(m2.properties, "UserProperty", None), "dev2's record has no header"

    late = connect(b, protocol=MQTTv5)
    late.subscribe(f"{uid}/state/#", 1)
    retained = sorted((m.topic, m.payload, m.retain) for m in late.wait_messages(2, timeout=5))
    assert retained == [(f"{uid}/state/{ktopic}/0/dev1", b"reboot", True),
                        (f"{uid}/state/{ktopic}/0/dev2", b"ping", True)], \
        f"a later subscriber's retained messages: {retained}"
    late.expect_no_message(0.5)
    sys.wait("in/received", "8", context=b.bridge_log())
    assert sys.wait("state", "up") == "up"


def test_in_group_commits_offsets_and_resumes_after_a_restart(kafka, bridged, connect):
    """The bridge's consumer group (named after the bridge) commits the offsets of the records
    Braid took (kafka-consumer-groups shows them); after a restart of Braid it goes on from
    there: only the new records arrive, none again."""
    uid = unique("resume")
    ktopic = f"resume.{uid}"
    kafka.create_topic(ktopic)
    b = bridged(dict(name=uid, brokers=kafka.bootstrap,
                     **{"in": [dict(topic=ktopic, mqtt_topic=f"{uid}/" + "${key}")]}))
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe(f"{uid}/#", 1)
    kafka.produce(ktopic, [(f"k{i}", f"first {i}") for i in range(3)])
    first = sub.wait_messages(3, timeout=KAFKA_WAIT)
    assert [m.payload for m in first] == [b"first 0", b"first 1", b"first 2"]
    offsets = wait_until(lambda: kafka.group_offsets(uid) == {(ktopic, 0): 3} and kafka.group_offsets(uid),
                         timeout=20, interval=0.5, message=f"group {uid} to commit offset 3 of {ktopic}")
    assert offsets == {(ktopic, 0): 3}

    b.stop()
    b.start()
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe(f"{uid}/#", 1)
    kafka.produce(ktopic, [(f"k{i}", f"second {i}") for i in range(2)])
    again = sub.wait_messages(2, timeout=KAFKA_WAIT)
    again += sub.collect(1.5)
    assert [m.payload for m in again] == [b"second 0", b"second 1"], (
        f"after the restart: {[m.payload for m in again]} (records before the commit again?)"
        f"{b.bridge_log()}")


# --------------------------------------------------------------------------------------------------
# 4. What cannot cross the bridge
# --------------------------------------------------------------------------------------------------

def test_out_unbridgeable_messages_are_dropped_counted_logged_and_later_ones_flow(kafka, bridged, connect):
    """A topic template that needs ${3} for a 2-level topic, a template result that is no Kafka
    topic name (`${topic}` has '/'), and a message over max_record_bytes: each is acknowledged to
    the publisher, dropped, logged (WARN "kafka bridge out: message dropped", one a second at
    most, so they come 1.1 s apart) and counted in out/dropped; a good message after them
    arrives."""
    uid = unique("drop")
    b = bridged(dict(name=uid, brokers=kafka.bootstrap, max_record_bytes=2000, out=[
        dict(filter=f"{uid}/lvl/#", topic="lvl.${1}.${3}"),
        dict(filter=f"{uid}/raw/#", topic="${topic}"),
    ]))
    sys = BridgeSys(connect, b, uid)
    pub = connect(b, protocol=MQTTv5)
    bad = [(f"{uid}/lvl", b"no third level"), (f"{uid}/raw/x", b"slash in the Kafka topic"),
           (f"{uid}/lvl/big", b"x" * 5000)]
    for i, (topic, payload) in enumerate(bad):
        if i:
            time.sleep(1.1)
        assert pub.publish(topic, payload, qos=1) == 0, f"PUBACK for {topic} not a success"
    pub.publish(f"{uid}/lvl/ok", b"fine", qos=1)

    [r] = _consume(kafka, f"lvl.{uid}.ok", 1, braid=b)
    assert (r.key, r.value) == (f"{uid}/lvl/ok".encode(), b"fine")
    sys.wait("out/sent", "1")
    sys.wait("out/dropped", "3", timeout=3, context=b.bridge_log())
    dropped = [line for line in b.log_text().splitlines()
               if "WARN" in line and "kafka bridge out: message dropped" in line]
    for topic, _ in bad:
        assert any(f"topic={topic} " in line or f'topic="{topic}"' in line or line.endswith(f"topic={topic}")
                   for line in dropped), f"no WARN line for {topic}; dropped lines:\n" + "\n".join(dropped)
    assert f"lvl.{uid}.big" not in kafka.topics(), "the oversized message's topic exists in Kafka"


def test_in_unpublishable_records_are_skipped_counted_logged_and_later_ones_flow(kafka, bridged, connect):
    """With mqtt_topic "<uid>/in/${key}": a record without key, one whose key has '+' and one
    whose key has '#' (no valid topic) are skipped (WARN "kafka bridge in: record skipped", counted
    in in/skipped); the good records around them arrive, in order."""
    uid = unique("skip")
    ktopic = f"skip.{uid}"
    kafka.create_topic(ktopic)
    b = bridged(dict(name=uid, brokers=kafka.bootstrap,
                     **{"in": [dict(topic=ktopic, mqtt_topic=f"{uid}/in/" + "${key}")]}))
    sys = BridgeSys(connect, b, uid)
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe(f"{uid}/#", 1)
    kafka.produce(ktopic, [("first", "ok 1"), (None, "null key"), ("a+b", "plus"), ("x/#", "hash"),
                           ("last", "ok 2")])
    got = sub.wait_messages(2, timeout=KAFKA_WAIT)
    got += sub.collect(1.0)
    assert [(m.topic, m.payload) for m in got] == [(f"{uid}/in/first", b"ok 1"),
                                                   (f"{uid}/in/last", b"ok 2")]
    sys.wait("in/skipped", "3", context=b.bridge_log())
    sys.wait("in/received", "2")
    assert "kafka bridge in: record skipped" in b.log_text(), f"no WARN line{b.bridge_log()}"


# --------------------------------------------------------------------------------------------------
# 5-6. Chaos: Kafka away mid-stream; Braid killed while Kafka is away
# --------------------------------------------------------------------------------------------------

class Stream(threading.Thread):
    """Publishes QoS 1 messages "000000", "000001"... on `topics` in turn at `rate` a second, each
    waiting for its PUBACK (up to 30 s), until stop(). acked: [(topic, payload)] in publish order;
    unacked: what got no PUBACK in 30 s; waits: [(seconds since the start, PUBACK wait)]."""

    def __init__(self, client, topics, rate):
        super().__init__(daemon=True)
        self.client, self.topics, self.rate = client, topics, rate
        self.acked, self.unacked, self.waits = [], [], []
        self.t0 = time.monotonic()
        self._stop_ev = threading.Event()

    def run(self):
        self.t0, i = time.monotonic(), 0
        while not self._stop_ev.is_set():
            topic, payload = self.topics[i % len(self.topics)], f"{i:06d}".encode()
            start = time.monotonic()
            info = self.client.publish(topic, payload, qos=1, wait=False)
            info.wait_for_publish(30)
            if info.is_published():
                self.acked.append((topic, payload))
            else:
                self.unacked.append((topic, payload))
            self.waits.append((start - self.t0, time.monotonic() - start))
            i += 1
            time.sleep(max(0.0, self.t0 + i / self.rate - time.monotonic()))

    def slow(self, limit):
        """The publishes whose PUBACK took longer than `limit` seconds: [(at, wait)], rounded."""
        return [(round(at, 1), round(w, 1)) for at, w in self.waits if w > limit]

    def stop(self):
        self._stop_ev.set()
        self.join(40)


def _settle(sys, n, timeout):
    """Waits (at most `timeout` s, silently) until the bridge counts `n` messages sent to Kafka and
    none in flight: what is in Kafka then is what the checks compare."""
    try:
        sys.wait("out/sent", lambda v: int(v) >= n, timeout=timeout)
        sys.wait("out/inflight", "0", timeout=5)
    except AssertionError:
        pass


def _check_all_arrived(kafka, ktopic, acked, braid, what):
    """Reads every record of `ktopic`; asserts that each acknowledged (topic, payload) is there and
    that, duplicates removed, each key's records are in publish order. Returns the figures."""
    records = kafka.consume(ktopic, len(acked) * 3 + 100, timeout=5)
    seen = [(r.key.decode() if r.key else None, r.value) for r in records]
    in_kafka = set(seen)
    missing = [x for x in acked if x not in in_kafka]
    _, dups = _dedupe(seen)
    extra = len(in_kafka - set(acked))
    figures = (f"{what}: {len(acked)} acknowledged, {len(records)} records in Kafka, "
               f"{len(missing)} lost, {dups} duplicates, {extra} never acknowledged but in Kafka")
    print("\n" + figures)
    assert not missing, f"{figures}; lost e.g. {missing[:5]}{braid.bridge_log()}"
    for key in sorted({t for t, _ in acked}):
        published = [p for t, p in acked if t == key]
        order, _ = _dedupe([p for t, p in seen if t == key])
        order = [p for p in order if p in set(published)]   # without the unacknowledged ones
        assert order == published, (
            f"{figures}; key {key}: order broken, first difference at "
            f"#{next(i for i, (a, b) in enumerate(zip(order, published)) if a != b)}")
    return figures, dups


@pytest.mark.timeout(180)
def test_kafka_stopped_20s_mid_stream_loses_no_acknowledged_message(own_kafka, bridged, connect):
    """A QoS 1 stream of 20 messages a second on two topics, each waiting for its PUBACK; Kafka is
    stopped in the middle for 20 s and started again while the stream goes on. Every publish is
    acknowledged in time (PUBACK does not wait for Kafka); every acknowledged message ends up in
    Kafka; per key the publish order holds once duplicates are removed. The bridge's state is
    "down" during the outage and "up" again after. Duplicates are printed with the figures."""
    k = own_kafka()
    uid = unique("chaos")
    ktopic = f"chaos.{uid}"
    b = bridged(dict(name=uid, brokers=k.bootstrap, out=[dict(filter=f"{uid}/#", topic=ktopic)]))
    sys = BridgeSys(connect, b, uid)
    pub = connect(b, protocol=MQTTv5)
    stream = Stream(pub, [f"{uid}/dev0", f"{uid}/dev1"], rate=20)
    stream.start()
    try:
        time.sleep(3)
        stopping = time.monotonic()
        k.stop()
        time.sleep(20)
        k.start()
        back = time.monotonic()
        time.sleep(3)
    finally:
        stream.stop()
    during = set(sys.values("state", since=stopping + 2, until=back))
    queued = [int(v) for v in sys.values("out/queued", since=stopping + 2, until=back)]
    _settle(sys, len(stream.acked), timeout=60)
    assert queued and max(queued) > 0, f"out/queued during the outage: {queued}{b.bridge_log()}"
    sys.wait("out/queued", "0", context=" once Kafka is back")

    figures, dups = _check_all_arrived(k, ktopic, stream.acked, b, "Kafka stopped for 20 s")
    slowest = max(w for _, w in stream.waits)
    print(f"Kafka stopped {stopping - stream.t0:.1f}s after the stream's start, started again at "
          f"{back - stream.t0:.1f}s; slowest PUBACK {slowest:.2f}s, over 1 s: {stream.slow(1)}; "
          f"out/failed {sys.latest('out/failed')}; state during the outage {sorted(during)}")
    assert not stream.unacked, (f"{figures}; {len(stream.unacked)} publishes without PUBACK within "
                                f"30 s, e.g. {stream.unacked[:3]}{b.bridge_log()}")
    assert slowest < 5, (f"{figures}; PUBACKs waited for Kafka: (seconds after the stream's start, wait) "
                         f"{stream.slow(5)}; Kafka stopped at {stopping - stream.t0:.1f}s, back at "
                         f"{back - stream.t0:.1f}s{b.bridge_log()}")
    assert len(stream.acked) > 400, f"only {len(stream.acked)} messages published in ~29 s"
    assert "down" in during, f"$SYS state during the outage: {sorted(during)}, no \"down\"{b.bridge_log()}"
    sys.wait("state", "up")


@pytest.mark.timeout(120)
def test_sigkill_of_braid_while_kafka_is_down_loses_no_acknowledged_message(own_kafka, bridged, connect):
    """Kafka is stopped; 300 QoS 1 messages are published into the outbox (all of them must be
    acknowledged: PUBACK does not wait for Kafka); Braid is killed with SIGKILL, started again on
    the same data directory, then Kafka: every acknowledged message reaches Kafka, in publish
    order per key (duplicates printed); the bridge goes on."""
    k = own_kafka()
    uid = unique("kill")
    ktopic = f"kill.{uid}"
    b = bridged(dict(name=uid, brokers=k.bootstrap, out=[dict(filter=f"{uid}/#", topic=ktopic)]))
    pub = connect(b, protocol=MQTTv5)
    pub.publish(f"{uid}/dev0", b"before", qos=1)
    _consume(k, ktopic, 1, braid=b)          # the bridge works and the topic exists

    k.stop()
    infos = []
    for i in range(300):
        topic, payload = f"{uid}/dev{i % 3}", f"{i:06d}".encode()
        infos.append((topic, payload, pub.publish(topic, payload, qos=1, wait=False)))
    try:
        wait_until(lambda: all(info.is_published() for _, _, info in infos), timeout=8)
    except AssertionError:
        pass                                 # asserted at the end: first, what was acknowledged
    acked = [(f"{uid}/dev0", b"before")] + [(t, p) for t, p, info in infos if info.is_published()]
    time.sleep(1)
    b.kill()
    b.start()
    k.start()
    sys = BridgeSys(connect, b, uid)
    _settle(sys, len(acked) - 1, timeout=60)         # "before" was sent by the killed process
    connect(b, protocol=MQTTv5).publish(f"{uid}/dev0", b"after", qos=1)
    acked.append((f"{uid}/dev0", b"after"))
    _settle(sys, len(acked) - 1, timeout=30)
    _check_all_arrived(k, ktopic, acked, b, "Braid killed while Kafka was down")
    assert len(acked) == 302, (
        f"with Kafka down, only {len(acked) - 2} of 300 QoS 1 publishes were acknowledged within "
        f"8 s (PUBACK must not wait for Kafka){b.bridge_log()}")


# --------------------------------------------------------------------------------------------------
# 7-9. Kafka away at start, bad configurations, reserved client ids
# --------------------------------------------------------------------------------------------------

def test_unreachable_kafka_at_start_braid_serves_mqtt_and_reports_down(bridged, connect):
    """Brokers on a closed port: Braid starts anyway, MQTT publish/subscribe works (bridged topics
    too: PUBACK from the outbox), $SYS state is "down", a warning is logged, nothing crashes."""
    uid = unique("away")
    closed = f"127.0.0.1:{free_port()}"
    b = bridged(dict(name=uid, brokers=closed, out=[dict(filter=f"{uid}/out/#", topic=f"away.{uid}")],
                     **{"in": [dict(topic=f"away-in.{uid}", mqtt_topic=f"{uid}/in/" + "${key}")]}))
    sys = BridgeSys(connect, b, uid)
    sub = connect(b, protocol=MQTTv311)
    sub.subscribe(f"{uid}/#", 1)
    pub = connect(b, protocol=MQTTv5)
    assert pub.publish(f"{uid}/plain", b"hello", qos=1) == 0
    assert pub.publish(f"{uid}/out/x", b"to the outbox", qos=1) == 0
    got = sorted((m.topic, m.payload) for m in sub.wait_messages(2))
    assert got == [(f"{uid}/out/x", b"to the outbox"), (f"{uid}/plain", b"hello")]
    time.sleep(3)
    assert sys.wait("state", "down") == "down"
    assert set(sys.values("state")) == {"down"}, f"states seen: {sys.values('state')}"
    assert sys.latest("out/sent") == "0"
    assert b.proc.poll() is None, f"braid exited ({b.proc.returncode}){b.bridge_log()}"
    warnings = [line for line in b.log_text().splitlines() if "WARN" in line and uid in line]
    assert warnings, f"no warning about the bridge {uid} and its unreachable Kafka{b.bridge_log()}"
    # Still serving after a while of the bridge retrying.
    mosquitto_pub(b, f"{uid}/plain", "again", qos=1)
    assert sub.get_message().payload == b"again"


BAD_CONFIGS = {
    "unknown placeholder": (
        dict(name="b", brokers="127.0.0.1:9092", out=[dict(filter="a/#", topic="x.${nope}")]),
        "bridges.kafka[0].out[0].topic"),
    "no brokers": (
        dict(name="b", out=[dict(filter="a/#", topic="x")]),
        "bridges.kafka[0].brokers"),
    "bad compression": (
        dict(name="b", brokers="127.0.0.1:9092", compression="brotli", out=[dict(filter="a/#", topic="x")]),
        "bridges.kafka[0].compression"),
    "level placeholder in an in template": (
        dict(name="b", brokers="127.0.0.1:9092", **{"in": [dict(topic="t", mqtt_topic="a/${1}")]}),
        "bridges.kafka[0].in[0].mqtt_topic"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS) + ["duplicate names"])
def test_bad_bridge_configuration_is_refused_naming_the_key(tmp_path, case):
    """`braid serve` exits with status 2 before listening, the message naming the key."""
    if case == "duplicate names":
        bridge = dict(name="same", brokers="127.0.0.1:9092", out=[dict(filter="a/#", topic="x")])
        text, key = bridge_toml(bridge, bridge), "bridges.kafka[1].name"
    else:
        bridge, key = BAD_CONFIGS[case]
        text = bridge_toml(bridge)
    assert_refused(tmp_path, text, key)


def test_internal_client_ids_are_refused_to_network_clients(kafka, bridged, connect):
    """CONNECT with a client id under `$internal/` (even the bridge outbox's own) is refused:
    CONNACK 0x85 for v5, 0x02 (identifier rejected) for 3.1.1; the bridge keeps working."""
    uid, ktopic, b = _one_route(kafka, bridged, "intl")
    outbox = f"$internal/bridge/kafka/{uid}/out"
    for client_id in (outbox, "$internal/anything"):
        for level, expected in ((5, CLIENT_ID_NOT_VALID), (4, IDENTIFIER_REJECTED)):
            raw = RawClient(b)
            try:
                code = connack_return_code(raw.connect(client_id=client_id, level=level, clean=level == 5))
                assert code == expected, (f"CONNECT {client_id!r} (protocol level {level}): "
                                          f"CONNACK code {code:#04x}, not {expected:#04x}")
                assert raw.is_closed(2), f"connection of {client_id!r} still open after the refusal"
            finally:
                raw.close()
    connect(b, protocol=MQTTv5).publish(f"{uid}/x", b"still bridged", qos=1)
    [r] = _consume(kafka, ktopic, 1, braid=b)
    assert r.value == b"still bridged"


# --------------------------------------------------------------------------------------------------
# 10. SASL and TLS towards Kafka
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory):
    """One Kafka with SASL (PLAIN, SCRAM) and TLS listeners besides its PLAINTEXT one."""
    k = KafkaServer(tmp_path_factory.mktemp("kafka-secure"), sasl=True, tls=True)
    yield k
    k.stop()


def _secure_settings(k, kind):
    """The bridge's bootstrap and security settings for listener `kind` of KafkaServer `k`."""
    sasl = dict(sasl_username=k.sasl_user, sasl_password=k.sasl_password)
    return {
        "sasl-scram-sha-256": dict(brokers=k.sasl_bootstrap, security_protocol="sasl_plaintext",
                                   sasl_mechanism="SCRAM-SHA-256", **sasl),
        "sasl-plain": dict(brokers=k.sasl_bootstrap, security_protocol="sasl_plaintext",
                           sasl_mechanism="PLAIN", **sasl),
        "ssl": dict(brokers=k.ssl_bootstrap, security_protocol="ssl", ca_file=k.ca),
        "ssl-client-cert": dict(brokers=k.ssl_bootstrap, security_protocol="ssl", ca_file=k.ca,
                                cert_file=k.client_cert, key_file=k.client_key),
        "sasl-ssl-scram": dict(brokers=k.sasl_ssl_bootstrap, security_protocol="sasl_ssl",
                               sasl_mechanism="SCRAM-SHA-256", ca_file=k.ca, **sasl),
    }[kind]


@pytest.mark.parametrize("kind", ["sasl-scram-sha-256", "sasl-plain", "ssl", "ssl-client-cert",
                                  "sasl-ssl-scram"])
def test_secure_kafka_one_message_each_way(secure_kafka, bridged, connect, kind):
    """Over a SASL and/or TLS listener (CA from ca_file): an MQTT message reaches Kafka and a
    Kafka record reaches an MQTT subscriber."""
    k = secure_kafka
    uid = unique("sec")
    out_topic, in_topic = f"secout.{uid}", f"secin.{uid}"
    k.create_topic(in_topic)
    b = bridged(dict(name=uid, **_secure_settings(k, kind),
                     out=[dict(filter=f"{uid}/up/#", topic=out_topic)],
                     **{"in": [dict(topic=in_topic, mqtt_topic=f"{uid}/down/" + "${key}")]}))
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe(f"{uid}/down/#", 1)
    connect(b, protocol=MQTTv5).publish(f"{uid}/up/x", b"to kafka", qos=1)
    k.produce(in_topic, [("dev", "to mqtt")])
    [r] = _consume(k, out_topic, 1, braid=b)
    assert (r.key, r.value) == (f"{uid}/up/x".encode(), b"to kafka")
    [m] = sub.wait_messages(1, timeout=KAFKA_WAIT)
    assert (m.topic, m.payload) == (f"{uid}/down/dev", b"to mqtt")


# --------------------------------------------------------------------------------------------------
# 11. ack = "kafka": the publisher's acknowledgement waits for Kafka
# --------------------------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_ack_kafka_puback_waits_for_kafka_and_comes_once_it_has_the_message(own_kafka, bridged, connect):
    """With ack = "kafka", a QoS 1 PUBACK comes once Kafka has the record: while Kafka is stopped
    none comes, for QoS 1 nor QoS 2 (PUBREC) publishes, v5 and 3.1.1 alike; once Kafka is started
    again every waiting publish is acknowledged, and each message is in Kafka once, in publish
    order."""
    k = own_kafka()
    uid = unique("ackk")
    ktopic = f"ackk.{uid}"
    b = bridged(dict(name=uid, brokers=k.bootstrap, ack="kafka",
                     out=[dict(filter=f"{uid}/#", topic=ktopic, key="")]))
    v5 = connect(b, protocol=MQTTv5)
    v3 = connect(b, protocol=MQTTv311)
    assert v5.publish(f"{uid}/a", b"m0", qos=1, timeout=KAFKA_WAIT) == 0
    assert [r.value for r in _consume(k, ktopic, 1, braid=b)] == [b"m0"], "acknowledged before Kafka had it"

    k.stop()
    waiting = [(f"m{i}".encode(), c.publish(f"{uid}/a", f"m{i}".encode(), qos=q, wait=False))
               for i, (c, q) in enumerate([(v5, 1), (v3, 1), (v5, 2), (v3, 2)], start=1)]
    time.sleep(4)
    early = [p for p, info in waiting if info.is_published()]
    assert not early, f"acknowledged while Kafka was stopped: {early}{b.bridge_log()}"
    k.start()
    wait_until(lambda: all(info.is_published() for _, info in waiting), timeout=KAFKA_WAIT,
               message="every publish acknowledged once Kafka is back")
    values = [r.value for r in _consume(k, ktopic, 5, braid=b)]
    assert sorted(values) == [b"m0", b"m1", b"m2", b"m3", b"m4"], f"records in Kafka: {values}"
    time.sleep(2)
    assert len(k.consume(ktopic, 10, timeout=5)) == 5, "a record reached Kafka twice"


def test_ack_kafka_puback_says_when_kafka_can_never_take_the_message(kafka, bridged, connect):
    """With ack = "kafka", a message over max_record_bytes is not bridged: a v5 publisher's PUBACK
    says 0x80 (Unspecified error), a 3.1.1 publisher gets its plain PUBACK; it is counted in
    out/dropped; a message after it is bridged and acknowledged with success."""
    uid = unique("ackbig")
    ktopic = f"ackbig.{uid}"
    b = bridged(dict(name=uid, brokers=kafka.bootstrap, ack="kafka", max_record_bytes=2000,
                     out=[dict(filter=f"{uid}/#", topic=ktopic)]))
    sys = BridgeSys(connect, b, uid)
    v5 = connect(b, protocol=MQTTv5)
    v3 = connect(b, protocol=MQTTv311)
    assert v5.publish(f"{uid}/big", b"x" * 5000, qos=1, timeout=KAFKA_WAIT) == 0x80
    assert v3.publish(f"{uid}/big", b"y" * 5000, qos=1, timeout=KAFKA_WAIT) == 0
    assert v5.publish(f"{uid}/ok", b"fine", qos=1, timeout=KAFKA_WAIT) == 0
    assert [r.value for r in _consume(kafka, ktopic, 1, braid=b)] == [b"fine"]
    sys.wait("out/dropped", "2", context=b.bridge_log())


@pytest.mark.timeout(120)
def test_a_missing_kafka_topic_is_logged_and_counted_and_later_messages_flow(own_kafka, bridged, connect):
    """A Kafka that does not create topics (auto.create.topics.enable=false): a message for a
    topic Kafka does not have is acknowledged, dropped after the producer gives up on the topic
    (topic.metadata.propagation.max.ms, 2 s here), logged and counted in out/dropped; a message
    for a topic that exists is bridged as usual."""
    k = own_kafka()
    k.stop()
    with open(os.path.join(k.dir, "server.properties"), "a") as f:
        f.write("\nauto.create.topics.enable=false\n")
    k.start()
    uid = unique("nokt")
    k.create_topic(f"there.{uid}")
    b = bridged(dict(name=uid, brokers=k.bootstrap, properties={"topic.metadata.propagation.max.ms": "2000"},
                     out=[dict(filter=f"{uid}/+", topic="${2}." + uid)]))
    sys = BridgeSys(connect, b, uid)
    pub = connect(b, protocol=MQTTv5)
    assert pub.publish(f"{uid}/missing", b"nowhere", qos=1) == 0
    sys.wait("out/dropped", "1", timeout=20, context=b.bridge_log())
    assert pub.publish(f"{uid}/there", b"here", qos=1) == 0
    assert [r.value for r in _consume(k, f"there.{uid}", 1, braid=b)] == [b"here"]
    assert f"missing.{uid}" not in k.topics(), "Kafka created the topic after all"
    assert any("message dropped" in line and "missing" in line for line in b.log_text().splitlines()), \
        "no log line for the dropped message" + b.bridge_log()


def test_a_rule_sends_its_outputs_to_kafka_through_a_kafka_sink(kafka, make_broker, connect):
    """A `kafka` sink: one record per output of the rule, to the topic its template makes, keyed
    by the client id, the value the output as JSON; read with Kafka's console consumer."""
    uid = unique("sink")
    rule = {"name": "hot", "actions": ["k"],
            "sql": f'SELECT clientid, payload.temp AS temp FROM "{uid}/+/temp" WHERE payload.temp > 30'}
    sink = {"name": "k", "type": "kafka", "url": f"kafka://{kafka.bootstrap}", "topic": f"{uid}.${{clientid}}",
            "key": "${clientid}"}
    b = make_broker(braid={"rules": [rule], "sinks": [sink]})
    kafka.create_topic(f"{uid}.dev1")
    pub = connect(b, client_id="dev1")
    for temp in (31, 5, 32):
        assert pub.publish(f"{uid}/dev1/temp", json.dumps({"temp": temp}), qos=1) == 0
    pub.close()
    mosquitto_pub(b, f"{uid}/dev1/temp", json.dumps({"temp": 33}), qos=1, extra=["-i", "dev1"])
    got = kafka.consume(f"{uid}.dev1", 3)
    assert [(r.key, json.loads(r.value)) for r in got] == [
        (b"dev1", {"clientid": "dev1", "temp": t}) for t in (31, 32, 33)], got
