"""Will messages: abnormal close, normal DISCONNECT, keep-alive timeout, retained will."""
import time

import pytest

from helpers import V3_PROTOCOLS, connack_return_code, disconnect_packet, mosquitto_target, proto_id, unique


def will(topic, payload=b"gone", qos=1, retain=False):
    return {"topic": topic, "payload": payload, "qos": qos, "retain": retain}


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_will_published_on_abnormal_close(broker, connect, protocol, qos):
    topic = unique("will")
    watcher = connect(broker, protocol=protocol)
    watcher.subscribe(topic, 2)
    dying = connect(broker, protocol=protocol, will=will(topic, b"\x00lost\xff", qos=qos))
    dying.kill()
    [m] = watcher.wait_messages(1, timeout=3)
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"\x00lost\xff", qos, False)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_will_not_published_on_normal_disconnect(broker, connect, protocol):
    topic = unique("will")
    watcher = connect(broker, protocol=protocol)
    watcher.subscribe(topic, 1)
    leaving = connect(broker, protocol=protocol, will=will(topic))
    leaving.disconnect()
    watcher.expect_no_message(1.0)


def test_will_not_published_on_raw_disconnect_then_close(broker, connect, raw_client):
    topic = unique("will")
    watcher = connect(broker)
    watcher.subscribe(topic, 1)
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("raw"), will=(topic, b"no", 1, False))) == 0
    raw.send(disconnect_packet())
    raw.expect_closed(2)
    watcher.expect_no_message(1.0)


@pytest.mark.parametrize("level", [3, 4], ids=["v3.1", "v3.1.1"])
def test_will_published_on_keep_alive_timeout(broker, connect, raw_client, level):
    """A client with keep alive 1 s that goes silent is dropped after 1.5 x keep alive, and its
    will is published. Braid must do it within 1.5 s + 1.5 s slack; Mosquitto 2.0.11 checks keep
    alives only every few seconds (measured: ~5 s for keep alive 1), so it gets a looser bound."""
    limit = 7.0 if mosquitto_target() else 3.0
    topic = unique("will")
    watcher = connect(broker)
    watcher.subscribe(topic, 1)
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("silent"), keepalive=1, level=level,
                                           will=(topic, b"timed out", 1, False))) == 0
    start = time.monotonic()
    [m] = watcher.wait_messages(1, timeout=limit)
    elapsed = time.monotonic() - start
    assert m.payload == b"timed out"
    assert elapsed >= 1.0, f"dropped after {elapsed:.2f}s, before the keep alive even expired"
    assert raw.is_closed(1.0)


def test_keep_alive_zero_is_not_timed_out(broker, connect, raw_client):
    topic = unique("will")
    watcher = connect(broker)
    watcher.subscribe(topic, 1)
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("idle"), keepalive=0, will=(topic, b"x", 1, False))) == 0
    watcher.expect_no_message(2.5)
    assert not raw.is_closed(0.1)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_retained_will(broker, connect, protocol):
    topic = unique("will")
    dying = connect(broker, protocol=protocol, will=will(topic, b"offline", qos=1, retain=True))
    watcher = connect(broker, protocol=protocol)
    watcher.subscribe(topic, 1)
    dying.kill()
    [m] = watcher.wait_messages(1, timeout=3)
    assert (m.payload, m.retain) == (b"offline", False)  # live delivery: no RETAIN flag in 3.1.1
    late = connect(broker, protocol=protocol)
    late.subscribe(topic, 1)
    [m] = late.wait_messages(1)
    assert (m.payload, m.retain) == (b"offline", True)


def test_will_delivered_to_mosquitto_sub(broker, connect, mosquitto_sub):
    topic = unique("will")
    sub = mosquitto_sub(broker, topic, qos=1)
    dying = connect(broker, will=will(topic, b"status: dead"))
    dying.kill()
    [m] = sub.wait_messages(1, timeout=3)
    assert m.payload == b"status: dead"


def test_will_published_when_client_is_taken_over(broker, connect):
    """Session takeover closes the old connection without a DISCONNECT from it, so its will fires.
    MQTT 5 (3.1.4) requires this; 3.1.1 does not list takeover among the will triggers explicitly,
    but Mosquitto and Braid treat it like any other close without DISCONNECT."""
    topic = unique("will")
    cid = unique("cid")
    watcher = connect(broker)
    watcher.subscribe(topic, 1)
    connect(broker, client_id=cid, will=will(topic, b"taken over"))
    connect(broker, client_id=cid)
    [m] = watcher.wait_messages(1, timeout=3)
    assert m.payload == b"taken over"
