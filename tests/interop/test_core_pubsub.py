"""paho publisher -> paho subscriber: QoS 0/1/2 on MQTT 3.1, 3.1.1 and 5, payload integrity."""
import os

import pytest

from helpers import ALL_PROTOCOLS, proto_id, unique


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_publish_subscribe_each_qos(broker, connect, protocol, qos):
    topic = unique("ps") + "/a"
    sub = connect(broker, protocol=protocol)
    assert sub.subscribe(topic, qos) == [qos]
    pub = connect(broker, protocol=protocol)
    for i in range(5):
        pub.publish(topic, f"msg-{i}".encode(), qos=qos)
    got = sub.wait_messages(5)
    assert [m.payload for m in got] == [f"msg-{i}".encode() for i in range(5)]  # order kept
    assert all(m.topic == topic and m.qos == qos and not m.retain for m in got)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("sub_qos,pub_qos", [(0, 2), (1, 2), (2, 0), (2, 1), (1, 0)])
def test_delivered_qos_is_min_of_publish_and_subscription(broker, connect, protocol, sub_qos, pub_qos):
    topic = unique("ps")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, sub_qos)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"x", qos=pub_qos)
    [m] = sub.wait_messages(1)
    assert m.qos == min(sub_qos, pub_qos)


PAYLOADS = {
    "text": b"hello",
    "utf8": "grüße, 世界 🚀".encode("utf-8"),
    "binary-all-bytes": bytes(range(256)) * 4,
    "nul-and-newlines": b"\x00\r\n\x00\xff\xfe\n",
    "empty": b"",
}


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_payload_integrity(broker, connect, protocol, name):
    payload = PAYLOADS[name]
    topic = unique("payload")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, payload, qos=1)
    [m] = sub.wait_messages(1)
    assert m.payload == payload


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("qos", [0, 2])
def test_one_mebibyte_payload(broker, connect, protocol, qos):
    payload = os.urandom(1024 * 1024)
    topic = unique("big")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, qos)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, payload, qos=qos, timeout=10)
    [m] = sub.wait_messages(1, timeout=10)
    assert len(m.payload) == len(payload)
    assert m.payload == payload


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
def test_mixed_protocol_versions_interoperate(broker, connect, protocol):
    """A publisher on one protocol version reaches subscribers on every version."""
    topic = unique("mix")
    subs = {p: connect(broker, protocol=p) for p in ALL_PROTOCOLS}
    for s in subs.values():
        s.subscribe(topic, 2)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"\x01\x02three", qos=2)
    for p, s in subs.items():
        [m] = s.wait_messages(1)
        assert (m.payload, m.qos) == (b"\x01\x02three", 2), proto_id(p)


@pytest.mark.parametrize("protocol", ALL_PROTOCOLS, ids=proto_id)
def test_unsubscribe_stops_delivery(broker, connect, protocol):
    topic = unique("unsub")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"before", qos=1)
    assert sub.wait_messages(1)[0].payload == b"before"
    sub.unsubscribe(topic)
    pub.publish(topic, b"after", qos=1)
    sub.expect_no_message(0.5)


def test_publisher_receives_own_message_when_subscribed(broker, connect):
    """MQTT 3.1.1 has no No Local: a client subscribed to its own topic gets its own publish."""
    topic = unique("self")
    c = connect(broker)
    c.subscribe(topic, 1)
    c.publish(topic, b"echo", qos=1)
    assert c.wait_messages(1)[0].payload == b"echo"
