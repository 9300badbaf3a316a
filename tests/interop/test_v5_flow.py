"""MQTT 5 flow control and size limits: Receive Maximum both ways, Maximum Packet Size both ways,
QoS 0 pacing."""
import time

import pytest

import raw_v5 as r
from helpers import unique
from v5util import connect_props, raw5, rc, v5  # noqa: F401  (fixtures)


def test_receive_maximum_limits_unacked_qos1_to_subscriber(broker, raw5, v5):
    topic = unique("rmax")
    sub = raw5(broker)
    sub.connect5(unique("s"), props=[(r.RECEIVE_MAXIMUM, 2)])
    sub.subscribe5([(topic, 1)])
    pub = v5(broker)
    for i in range(9):
        pub.publish(topic, f"m{i}".encode(), qos=1, wait=False)
    pub.publish(topic, b"m9", qos=1)  # all accepted by the broker (PUBACK) before we read
    window = sub.publishes(3.0, auto_ack=False, n=2)
    assert len(window) == 2
    assert sub.publishes(0.7, auto_ack=False) == [], "more than Receive Maximum unacked QoS 1 messages"
    payloads = [p.payload for p in window]
    unacked = [p.pid for p in window]
    deadline = time.monotonic() + 5
    while len(payloads) < 10 and time.monotonic() < deadline:
        sub.send(r.ack(r.PUBACK, unacked.pop(0)))  # free one slot: exactly one more may come
        more = sub.publishes(0.5, auto_ack=False, n=1)
        for p in more:
            payloads.append(p.payload)
            unacked.append(p.pid)
        assert len(unacked) <= 2, f"{len(unacked)} unacked QoS 1 messages in flight"
        if not more and not unacked:
            break
    assert payloads == [f"m{i}".encode() for i in range(10)]


@pytest.mark.braid_only  # Mosquitto answers PUBREC 0x97 (Quota exceeded) and keeps the connection
def test_exceeding_server_receive_maximum_disconnects_with_0x93(make_broker, raw5, v5):
    b = make_broker(braid={"mqtt.receive_maximum": 2}, mosquitto=["max_inflight_messages 2"])
    bystander = v5(b)
    c, _ = exceed_receive_maximum(b, raw5)
    seen = c.closed_after(3)
    disconnects = [p for p in seen if p.type == r.DISCONNECT]
    assert [p.reason for p in disconnects] == [0x93], seen
    assert bystander.is_connected()


def exceed_receive_maximum(b, raw5):
    """A raw v5 client of ``b`` (Receive Maximum 2) that has just sent a third unreleased QoS 2
    PUBLISH; returns it and its topic."""
    c = raw5(b)
    ack = c.connect5(unique("rm"))
    assert ack.prop(r.RECEIVE_MAXIMUM) == 2
    topic = unique("rmin")
    for pid in (1, 2, 3):  # QoS 2, never released: 3 in flight against a maximum of 2
        c.send(r.publish(topic, b"x", qos=2, pid=pid))
    return c, topic


@pytest.mark.braid_only  # Mosquitto answers PUBREC 0x97 (Quota exceeded) and keeps the connection
def test_0x93_reaches_a_client_that_writes_on_after_it(make_broker, raw5):
    """A client pipelines more PUBLISHes after the one that exceeds Receive Maximum and reads only
    then: it gets the DISCONNECT 0x93 and an orderly end of stream, and no reset on the way (every
    write succeeds: a write failing on the reset is where a client such as paho drops the
    connection without reading what it was sent). The broker reads and drops what still arrives
    after its DISCONNECT instead of closing a socket with unread bytes."""
    b = make_broker(braid={"mqtt.receive_maximum": 2})
    c, topic = exceed_receive_maximum(b, raw5)
    written = []
    for pid in range(4, 40):
        time.sleep(0.01)
        written.append(c.send(r.publish(topic, b"x" * 100, qos=2, pid=pid)))
    assert all(written), f"writes failed (connection reset) from packet id {written.index(False) + 4} on"
    seen = c.closed_after(3)
    assert [p.reason for p in seen if p.type == r.DISCONNECT] == [0x93], seen


@pytest.mark.braid_only
def test_a_client_that_never_stops_writing_is_cut_off_after_the_disconnect(make_broker, raw5):
    """Reading on after its DISCONNECT is bounded: a client that keeps sending (one PINGREQ every
    50 ms, reading as it goes) reads the DISCONNECT 0x93 and finds the socket closed (a write
    fails) within about a second."""
    b = make_broker(braid={"mqtt.receive_maximum": 2})
    c, _ = exceed_receive_maximum(b, raw5)
    start = time.monotonic()
    seen = []
    while time.monotonic() - start < 5 and c.send(r.packet(r.PINGREQ, 0, b"")):
        try:
            p = c.recv(0.05)
        except AssertionError:  # nothing within 50 ms
            continue
        if p is None:
            time.sleep(0.05)  # the broker's end of stream; it may still read
        else:
            seen.append(p)
    elapsed = time.monotonic() - start
    assert [p.reason for p in seen if p.type == r.DISCONNECT] == [0x93], seen
    assert elapsed < 3, f"the broker kept reading for {elapsed:.1f}s"


def test_subscriber_maximum_packet_size_skips_larger_messages(broker, v5):
    topic = unique("mps")
    sub = v5(broker, properties=connect_props(MaximumPacketSize=100))
    sub.subscribe(topic, qos=1)
    pub = v5(broker)
    pub.publish(topic, b"B" * 1000, qos=1)
    pub.publish(topic, b"small msg!", qos=1)
    assert [m.payload for m in sub.collect(0.7)] == [b"small msg!"]
    assert sub.is_connected()


def test_publisher_exceeding_broker_maximum_packet_size_is_disconnected(make_broker, v5):
    b = make_broker(braid={"mqtt.max_packet_size": 1000}, mosquitto=["max_packet_size 1000"])
    topic = unique("mps-in")
    bystander = v5(b)
    bystander.subscribe(topic, qos=1)
    pub = v5(b)
    assert pub.connack.properties.MaximumPacketSize == 1000
    pub.publish(topic, b"fits", qos=1)
    # Straight to paho: the broker may close the connection as soon as it has read the fixed
    # header, before paho's write returns, which paho then reports as "not connected".
    pub.client.publish(topic, b"X" * 1200, qos=0)
    assert rc(pub.wait_disconnected()) == 0x95  # Packet too large
    assert bystander.get_message().payload == b"fits"
    bystander.expect_no_message(0.3)
    v5(b).publish(topic, b"still works", qos=1)
    assert bystander.get_message().payload == b"still works"
    assert bystander.is_connected()


@pytest.mark.braid_only  # Mosquitto has no QoS 0 pacing: with max_queued_messages 20 it drops most of them
def test_qos0_flood_through_a_subscriber_stall_loses_nothing(make_broker, raw5, v5):
    """A paho publisher floods 200 QoS 0 messages of 64 KiB (more than the socket buffers hold) at a
    subscriber that reads nothing for 300 ms, with a session queue of 20: Braid paces the publisher
    (reads nothing more from it) until the subscriber catches up, so every message arrives, in order."""
    b = make_broker(braid={"session.max_queued_messages": 20}, mosquitto=["max_queued_messages 20"])
    topic = unique("pace")
    sub = raw5(b)
    sub.connect5(unique("s"))
    sub.subscribe5([(topic, 0)])
    pub = v5(b)
    for i in range(200):
        pub.publish(topic, f"{i:08}".encode().ljust(64 * 1024, b"."), qos=0, wait=False)
    time.sleep(0.3)
    got = sub.publishes(10.0, n=200)
    assert [int(p.payload[:8]) for p in got] == list(range(200))
