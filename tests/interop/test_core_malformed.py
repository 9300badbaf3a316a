"""Malformed input closes only the offending connection; everyone else carries on."""
import pytest

from helpers import (MQTTv311, connack_return_code, mqtt_bytes, packet, publish_packet, subscribe_packet,
                     unique)

# Packets sent AFTER a successful CONNECT; each must make the broker close that connection.
AFTER_CONNECT = {
    "garbage": b"\xff\xfe\xfd\xfc" * 16,
    "reserved-packet-type-0": b"\x00\x00",
    "publish-wildcard-plus": publish_packet("bad/+/topic", b"x"),
    "publish-wildcard-hash": publish_packet("bad/#", b"x", qos=1, packet_id=3),
    "publish-invalid-utf8-topic": publish_packet(b"bad/\xff\xfe/topic", b"x"),
    "publish-overlong-utf8-topic": publish_packet(b"bad/\xc0\xaf", b"x"),
    "publish-utf16-surrogate-topic": publish_packet(b"bad/\xed\xa0\x80", b"x"),
    "publish-nul-in-topic": publish_packet(b"bad/\x00/topic", b"x"),
    "publish-empty-topic": publish_packet(b"", b"x"),
    "publish-qos-3": packet(3, 0x06, mqtt_bytes("bad/qos3") + b"\x00\x01x"),
    "remaining-length-shorter-than-topic": b"\x30\x03\x00\x0abad",
    "remaining-length-shorter-than-packet-id": b"\x32\x05\x00\x03bad",
    "remaining-length-five-bytes": b"\x30\xff\xff\xff\xff\x7f",
    "subscribe-bad-fixed-header-flags": packet(8, 0x00, b"\x00\x01" + mqtt_bytes("ok/topic") + b"\x00"),
    "subscribe-no-filters": packet(8, 0x02, b"\x00\x01"),
    "subscribe-qos-3": subscribe_packet(1, [("ok/topic", 3)]),
    "subscribe-packet-id-0": subscribe_packet(0, [("ok/topic", 1)]),
    "publish-qos1-packet-id-0": publish_packet("bad/pid0", b"x", qos=1, packet_id=0),
    "server-only-packet-connack": b"\x20\x02\x00\x00",
}

# Sent as the very first bytes on the connection, instead of CONNECT.
BEFORE_CONNECT = {
    "http-request": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "tls-client-hello-start": bytes.fromhex("160301012c010001280303") + b"\x00" * 32,
    "connect-remaining-length-lies": b"\x10\x05\x00\x04MQTT\x04\x02\x00\x3c",
    "connect-truncated-client-id": b"\x10\x0e\x00\x04MQTT\x04\x02\x00\x3c\x00\x09abc",
}


@pytest.fixture
def good_pair(broker, connect):
    """A well-behaved subscriber on '#' and a well-behaved publisher, connected before the attack."""
    sub = connect(broker, protocol=MQTTv311)
    sub.subscribe("#", 1)
    pub = connect(broker, protocol=MQTTv311)
    return sub, pub


def assert_good_clients_unaffected(good_pair):
    sub, pub = good_pair
    assert sub.is_connected() and pub.is_connected()
    topic = unique("still") + "/ok"
    pub.publish(topic, b"still alive", qos=1)
    got = sub.wait_messages(1)
    assert [(m.topic, m.payload) for m in got] == [(topic, b"still alive")], "bad packet was delivered?"
    sub.expect_no_message(0.2)


@pytest.mark.parametrize("name", list(AFTER_CONNECT))
def test_malformed_packet_after_connect_closes_only_that_connection(broker, raw_client, good_pair, name):
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("evil"))) == 0
    raw.send(AFTER_CONNECT[name])
    seen = raw.expect_closed(3)
    assert not any(p.type == 3 for p in seen)  # nothing delivered back to the offender either
    assert_good_clients_unaffected(good_pair)


@pytest.mark.parametrize("name", list(BEFORE_CONNECT))
def test_malformed_first_bytes_close_only_that_connection(broker, raw_client, good_pair, name):
    raw = raw_client(broker)
    raw.send(BEFORE_CONNECT[name])
    seen = raw.expect_closed(3)
    assert all(p.type == 2 and connack_return_code(p) != 0 for p in seen)
    assert_good_clients_unaffected(good_pair)


def test_many_bad_connections_in_a_row_do_not_hurt_the_broker(broker, raw_client, good_pair):
    for i, data in enumerate(list(AFTER_CONNECT.values())[:8]):
        raw = raw_client(broker)
        assert connack_return_code(raw.connect(unique("evil"))) == 0
        raw.send(data)
        raw.expect_closed(3)
    assert_good_clients_unaffected(good_pair)


def test_abrupt_close_mid_packet_does_not_hurt_the_broker(broker, raw_client, good_pair):
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("cut"))) == 0
    raw.send(publish_packet("cut/topic", b"y" * 1000)[:300])
    raw.close()
    assert_good_clients_unaffected(good_pair)
