"""Retained messages: set, replace, clear, wildcard delivery, RETAIN flag semantics (3.1.1)."""
import pytest

from helpers import V3_PROTOCOLS, proto_id, unique


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_retained_message_delivered_to_later_subscriber_with_retain_flag(broker, connect, protocol, qos):
    topic = unique("ret")
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"state-1", qos=qos, retain=True)
    pub.disconnect()
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 2)
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload, m.retain, m.qos) == (topic, b"state-1", True, qos)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_retained_message_replaced(broker, connect, protocol):
    topic = unique("ret")
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"old", qos=1, retain=True)
    pub.publish(topic, b"new", qos=1, retain=True)
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    [m] = sub.wait_messages(1)
    assert (m.payload, m.retain) == (b"new", True)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_empty_retained_payload_clears(broker, connect, protocol):
    topic = unique("ret")
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"gone soon", qos=1, retain=True)
    pub.publish(topic, b"", qos=1, retain=True)
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    sub.expect_no_message(0.5)
    # and a fresh retained message can be set again afterwards
    pub.publish(topic, b"back", qos=1, retain=True)
    assert sub.wait_messages(1)[0].payload == b"back"
    late = connect(broker, protocol=protocol)
    late.subscribe(topic, 1)
    assert late.wait_messages(1)[0].payload == b"back"


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_wildcard_subscription_receives_every_matching_retained_message(broker, connect, protocol):
    base = unique("home")
    pub = connect(broker, protocol=protocol)
    retained = {f"{base}/kitchen/temp": b"21", f"{base}/hall/temp": b"19",
                f"{base}/hall/humidity": b"40", f"{base}/garage/door/state": b"open", base: b"root"}
    for t, p in retained.items():
        pub.publish(t, p, qos=1, retain=True)
    pub.publish(f"{base}/kitchen/live", b"not retained", qos=1)

    everything = connect(broker, protocol=protocol)
    everything.subscribe(f"{base}/#", 1)
    got = everything.wait_messages(len(retained))
    assert {m.topic: m.payload for m in got} == retained
    assert all(m.retain for m in got)
    everything.expect_no_message(0.3)

    temps = connect(broker, protocol=protocol)
    temps.subscribe(f"{base}/+/temp", 1)
    got = temps.wait_messages(2)
    assert sorted(m.topic for m in got) == sorted([f"{base}/kitchen/temp", f"{base}/hall/temp"])
    temps.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_live_delivery_of_retained_publish_has_no_retain_flag(broker, connect, protocol):
    """3.1.1: a message forwarded to an already-established subscription has RETAIN=0,
    even if it was published with RETAIN=1; a new subscription gets it with RETAIN=1."""
    topic = unique("ret")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"live", qos=1, retain=True)
    [m] = sub.wait_messages(1)
    assert (m.payload, m.retain) == (b"live", False)
    # subscribing again (same filter) re-sends the retained message with the flag set
    sub.subscribe(topic, 1)
    [m] = sub.wait_messages(1)
    assert (m.payload, m.retain) == (b"live", True)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_retained_delivery_qos_downgraded_to_subscription(broker, connect, protocol):
    topic = unique("ret")
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"q2", qos=2, retain=True)
    sub = connect(broker, protocol=protocol)
    sub.subscribe(topic, 1)
    [m] = sub.wait_messages(1)
    assert (m.qos, m.retain) == (1, True)


def test_retained_message_survives_publisher_disconnect_and_is_independent_of_sessions(broker, connect):
    topic = unique("ret")
    pub = connect(broker, clean_session=False)
    pub.publish(topic, b"persisted", qos=1, retain=True)
    pub.kill()
    for _ in range(2):
        sub = connect(broker)
        sub.subscribe(topic, 0)
        assert sub.wait_messages(1)[0].payload == b"persisted"
        sub.disconnect()
