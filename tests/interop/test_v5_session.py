"""MQTT 5 sessions: Session Expiry Interval (at CONNECT and DISCONNECT) and session takeover."""
import time

from helpers import unique
from v5util import MOSQUITTO, connect_props, disconnect_props, rc, v5  # noqa: F401  (fixtures)


def _session(v5, broker, cid, expiry, clean_start=False):
    return v5(broker, client_id=cid, clean_start=clean_start,
              properties=connect_props(SessionExpiryInterval=expiry) if expiry is not None else None)


def test_session_expiry_zero_ends_session_at_disconnect(broker, v5, client_id):
    topic = unique("se0")
    c = _session(v5, broker, client_id, None, clean_start=True)  # no property = expiry 0
    c.subscribe(topic, qos=1)
    c.disconnect()
    v5(broker).publish(topic, b"while away", qos=1)
    again = _session(v5, broker, client_id, None)
    assert again.connack.session_present is False
    again.expect_no_message(0.5)


def test_session_expiry_keeps_session_and_queues_qos1(broker, v5, client_id):
    topic = unique("se300")
    c = _session(v5, broker, client_id, 300, clean_start=True)
    c.subscribe(topic, qos=1)
    c.disconnect()
    pub = v5(broker)
    for i in range(3):
        pub.publish(topic, f"queued {i}".encode(), qos=1)
    again = _session(v5, broker, client_id, 300)
    assert again.connack.session_present is True
    got = again.wait_messages(3)
    assert [m.payload for m in got] == [b"queued 0", b"queued 1", b"queued 2"]
    assert all(m.qos == 1 for m in got)


def test_session_expiry_set_to_zero_at_disconnect_ends_session(broker, v5, client_id):
    topic = unique("sedisc")
    c = _session(v5, broker, client_id, 300, clean_start=True)
    c.subscribe(topic, qos=1)
    c.disconnect(properties=disconnect_props(SessionExpiryInterval=0))
    v5(broker).publish(topic, b"while away", qos=1)
    again = _session(v5, broker, client_id, 300)
    assert again.connack.session_present is False
    again.expect_no_message(0.5)


def test_session_expires_after_interval(broker, v5, client_id):
    topic = unique("se2")
    c = _session(v5, broker, client_id, 2, clean_start=True)
    c.subscribe(topic, qos=1)
    c.disconnect()
    time.sleep(3)
    v5(broker).publish(topic, b"after expiry", qos=1)
    again = _session(v5, broker, client_id, 2)
    assert again.connack.session_present is False
    again.expect_no_message(0.5)


def test_second_connection_takes_over_session(broker, v5, client_id):
    topic = unique("takeover")
    first = _session(v5, broker, client_id, 300, clean_start=True)
    first.subscribe(topic, qos=1)
    second = _session(v5, broker, client_id, 300)
    assert second.connack.session_present is True
    reason = first.wait_disconnected()
    if not MOSQUITTO:  # Mosquitto 2.0.11 just closes the socket, without DISCONNECT 0x8E
        assert rc(reason) == 0x8E, f"first connection ended with {reason!r}, not Session taken over"
    # The taken-over session (with its subscription) now serves the second connection.
    v5(broker).publish(topic, b"to the new owner", qos=1)
    assert second.get_message().payload == b"to the new owner"
    first.expect_no_message(0.3)
