"""QoS 2 exactly-once on the broker's inbound side, driven by a raw-socket publisher."""
import struct

import pytest

from helpers import (PUBACK, PUBCOMP, PUBREC, V3_PROTOCOLS, MQTTv31, connack_return_code, proto_id, publish_packet,
                     pubrel_packet, unique)


def raw_publisher(broker, raw_client, level=4):
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("rawpub"), level=level)) == 0
    return raw


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_duplicate_qos2_publish_before_pubrel_delivered_once(broker, connect, raw_client, protocol):
    topic = unique("eo")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 2)
    raw = raw_publisher(broker, raw_client, level=3 if protocol == MQTTv31 else 4)

    raw.send(publish_packet(topic, b"exactly once", qos=2, packet_id=7))
    assert raw.expect_packet(PUBREC).body == struct.pack("!H", 7)
    raw.send(publish_packet(topic, b"exactly once", qos=2, packet_id=7, dup=True))
    assert raw.expect_packet(PUBREC).body == struct.pack("!H", 7)  # re-acknowledged, not re-delivered
    raw.send(pubrel_packet(7))
    assert raw.expect_packet(PUBCOMP).body == struct.pack("!H", 7)

    [m] = sub.wait_messages(1)
    assert (m.payload, m.qos) == (b"exactly once", 2)
    sub.expect_no_message(0.7)


def test_duplicate_pubrel_gets_pubcomp_without_redelivery(broker, connect, raw_client):
    topic = unique("eo")
    sub = connect(broker)
    sub.subscribe(topic, 2)
    raw = raw_publisher(broker, raw_client)
    raw.send(publish_packet(topic, b"once", qos=2, packet_id=7))
    raw.expect_packet(PUBREC)
    raw.send(pubrel_packet(7))
    raw.expect_packet(PUBCOMP)
    raw.send(pubrel_packet(7))  # e.g. the PUBCOMP got lost: MUST answer PUBCOMP again (3.1.1 4.3.3)
    assert raw.expect_packet(PUBCOMP).body == struct.pack("!H", 7)
    [m] = sub.wait_messages(1)
    assert m.payload == b"once"
    sub.expect_no_message(0.5)


def test_packet_id_reusable_after_pubcomp(broker, connect, raw_client):
    """Once the QoS 2 flow is complete, a new PUBLISH with the same id is a new message."""
    topic = unique("eo")
    sub = connect(broker)
    sub.subscribe(topic, 2)
    raw = raw_publisher(broker, raw_client)
    for payload in (b"first", b"second"):
        raw.send(publish_packet(topic, payload, qos=2, packet_id=7))
        raw.expect_packet(PUBREC)
        raw.send(pubrel_packet(7))
        raw.expect_packet(PUBCOMP)
    got = sub.wait_messages(2)
    assert [m.payload for m in got] == [b"first", b"second"]


def test_interleaved_qos2_flows_with_different_ids(broker, connect, raw_client):
    topic = unique("eo")
    sub = connect(broker)
    sub.subscribe(topic, 2)
    raw = raw_publisher(broker, raw_client)
    for pid in (1, 2, 3):
        raw.send(publish_packet(topic, f"m{pid}".encode(), qos=2, packet_id=pid))
    assert sorted(raw.expect_packet(PUBREC).body for _ in range(3)) == [struct.pack("!H", i) for i in (1, 2, 3)]
    raw.send(publish_packet(topic, b"m2", qos=2, packet_id=2, dup=True))
    raw.expect_packet(PUBREC)
    for pid in (3, 1, 2):
        raw.send(pubrel_packet(pid))
        assert raw.expect_packet(PUBCOMP).body == struct.pack("!H", pid)
    got = sub.wait_messages(3)
    assert sorted(m.payload for m in got) == [b"m1", b"m2", b"m3"]
    sub.expect_no_message(0.5)


def test_qos1_publish_gets_puback_with_same_id(broker, connect, raw_client):
    topic = unique("q1")
    sub = connect(broker)
    sub.subscribe(topic, 1)
    raw = raw_publisher(broker, raw_client)
    raw.send(publish_packet(topic, b"ack me", qos=1, packet_id=513))
    assert raw.expect_packet(PUBACK).body == struct.pack("!H", 513)
    assert sub.wait_messages(1)[0].payload == b"ack me"
