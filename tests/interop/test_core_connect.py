"""CONNECT edge cases and PINGREQ, with hand-written bytes on a raw socket (MQTT 3.1 / 3.1.1)."""
import time

import pytest

from helpers import (CONNACK, PINGRESP, V3_PROTOCOLS, MQTTv311, connack_return_code, connack_session_present,
                     connect_packet, packet, pingreq_packet, proto_id, publish_packet, unique)


def test_empty_client_id_with_clean_session_is_accepted(broker, raw_client):
    raw = raw_client(broker)
    ack = raw.connect("", clean=True)
    assert len(ack.body) == 2
    assert connack_return_code(ack) == 0
    assert not connack_session_present(ack)
    raw.send(pingreq_packet())
    assert raw.expect_packet(PINGRESP).body == b""


def test_empty_client_id_with_persistent_session_is_rejected(broker, raw_client):
    """MQTT-3.1.3-8: CONNACK return code 0x02 (identifier rejected), then the connection closes."""
    raw = raw_client(broker)
    ack = raw.connect("", clean=False)
    assert ack.body == b"\x00\x02"
    raw.expect_closed(2)


@pytest.mark.parametrize("level,name", [(3, "MQIsdp"), (4, "MQTT")], ids=["v3.1", "v3.1.1"])
def test_raw_connect_accepted(broker, raw_client, level, name):
    raw = raw_client(broker)
    ack = raw.connect(unique("raw"), level=level, protocol_name=name)
    assert connack_return_code(ack) == 0


@pytest.mark.parametrize("level", [2, 6, 0x7f])
def test_unknown_protocol_level_gets_connack_1_and_close(broker, raw_client, level):
    """MQTT-3.1.2-2: unacceptable protocol level -> CONNACK 0x01 and disconnect (closing without a
    CONNACK is tolerated; a successful CONNACK is not)."""
    raw = raw_client(broker)
    raw.send(connect_packet(unique("lvl"), level=level))
    seen = raw.expect_closed(3)
    assert all(p.type == CONNACK for p in seen)
    if seen:
        assert seen[0].body[-1] == 0x01


@pytest.mark.parametrize("name", ["MQTX", "mqtt", "MQIsdp", ""])
def test_bad_protocol_name_is_refused(broker, raw_client, name):
    """A protocol name that does not match the level: connection refused/closed, never accepted."""
    raw = raw_client(broker)
    raw.send(connect_packet(unique("name"), level=4, protocol_name=name))
    seen = raw.expect_closed(3)
    assert all(p.type == CONNACK and connack_return_code(p) != 0 for p in seen)


def assert_closed_without_session(raw):
    """The broker closes the connection and never accepts it (a CONNACK refusal is tolerated)."""
    seen = raw.expect_closed(3)
    assert all(p.type == CONNACK and connack_return_code(p) != 0 for p in seen), seen


def test_reserved_connect_flag_closes_connection(broker, raw_client):
    """MQTT-3.1.2-3: the reserved flag in CONNECT must be 0, otherwise disconnect."""
    raw = raw_client(broker)
    raw.send(connect_packet(unique("rsv"), reserved=True))
    assert_closed_without_session(raw)


@pytest.mark.parametrize("flags", [0x02 | 0x18, 0x02 | 0x08, 0x02 | 0x20, 0x02 | 0x40],
                         ids=["will-qos-3", "will-qos-without-will", "will-retain-without-will",
                              "password-without-username"])
def test_inconsistent_connect_flags_close_connection(broker, raw_client, flags):
    """MQTT-3.1.2-11/-13/-15 (will QoS/retain need the will flag, QoS 3 invalid) and MQTT-3.1.2-22
    (password flag needs username flag)."""
    raw = raw_client(broker)
    pkt = connect_packet(unique("flags"), flags=flags)
    body = pkt[2:] + (b"\x00\x02pw" if flags & 0x40 else b"")  # the password the flags promise
    raw.send(packet(1, 0, body))
    assert_closed_without_session(raw)


def test_nonzero_fixed_header_flags_on_connect_close_connection(broker, raw_client):
    pkt = bytearray(connect_packet(unique("fh")))
    pkt[0] |= 0x01
    raw = raw_client(broker)
    raw.send(bytes(pkt))
    assert_closed_without_session(raw)


def test_second_connect_closes_connection(broker, raw_client):
    """MQTT-3.1.0-2: a second CONNECT is a protocol violation -> disconnect."""
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("twice"))) == 0
    raw.send(connect_packet(unique("twice")))
    seen = raw.expect_closed(3)
    assert all(p.type != CONNACK for p in seen)


def test_packet_before_connect_closes_connection(broker, raw_client):
    """MQTT-3.1.0-1: the first packet must be CONNECT."""
    raw = raw_client(broker)
    raw.send(publish_packet("early/bird", b"x"))
    assert raw.expect_closed(3) == []


@pytest.mark.braid_only
def test_socket_without_connect_is_closed_after_connect_timeout(make_broker, raw_client):
    """mqtt.connect_timeout_secs=1: a socket that never sends CONNECT is closed after ~1 s.
    (Mosquitto has no such setting.)"""
    broker = make_broker(braid={"mqtt.connect_timeout_secs": 1})
    raw = raw_client(broker)
    start = time.monotonic()
    assert raw.expect_closed(4) == []
    assert 0.8 <= time.monotonic() - start <= 4


@pytest.mark.braid_only
def test_partial_connect_is_closed_after_connect_timeout(make_broker, raw_client):
    broker = make_broker(braid={"mqtt.connect_timeout_secs": 1})
    raw = raw_client(broker)
    raw.send(connect_packet(unique("slow"))[:5])
    assert raw.expect_closed(4) == []


def test_pingreq_gets_pingresp(broker, raw_client):
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("ping"))) == 0
    for _ in range(3):
        raw.send(pingreq_packet())
        p = raw.expect_packet(PINGRESP, timeout=2)
        assert p.flags == 0 and p.body == b""


def test_pings_keep_a_short_keep_alive_connection_open(broker, raw_client):
    """A keep alive 1 s client that pings every 0.5 s stays connected well past 1.5 s."""
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("pinger"), keepalive=1)) == 0
    end = time.monotonic() + 3.2
    while time.monotonic() < end:
        raw.send(pingreq_packet())
        raw.expect_packet(PINGRESP, timeout=1)
        time.sleep(0.5)


def test_paho_v311_connects_with_empty_client_id(broker, connect):
    c = connect(broker, client_id="", protocol=MQTTv311)
    assert c.connack.reason_code == 0


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_paho_connects_with_23_character_client_id(broker, connect, protocol):
    """23 characters is the longest id every 3.x server must accept (MQTT-3.1.3-5)."""
    c = connect(broker, client_id="x" * 23, protocol=protocol)
    assert c.connack.reason_code == 0
