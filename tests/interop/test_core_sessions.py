"""Sessions: persistent resume, clean session, takeover, offline queue limit (MQTT 3.1 / 3.1.1)."""
import pytest

from helpers import MQTTv311, V3_PROTOCOLS, proto_id, unique


def offline_subscriber(broker, connect, protocol, topic, qos=2):
    """Connect with clean_session=False, subscribe, disconnect normally; returns the client id."""
    cid = unique("persist")
    c = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    assert c.subscribe(topic, qos) == [qos]
    c.disconnect()
    return cid


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_persistent_session_receives_qos1_and_qos2_published_while_offline(broker, connect, protocol):
    topic = unique("offline")
    cid = offline_subscriber(broker, connect, protocol, topic)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"q0", qos=0)
    pub.publish(topic, b"q1", qos=1)
    pub.publish(topic, b"q2", qos=2)

    back = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    if protocol == MQTTv311:
        assert back.connack.session_present is True
    got = back.wait_messages(2)
    assert [(m.payload, m.qos) for m in got] == [(b"q1", 1), (b"q2", 2)]
    back.expect_no_message(0.5)  # QoS 0 is not queued for offline clients by default

    # the subscription itself survived: live messages flow without re-subscribing
    pub.publish(topic, b"live", qos=1)
    assert back.wait_messages(1)[0].payload == b"live"


def test_first_persistent_connect_has_no_session_present(broker, connect):
    c = connect(broker, client_id=unique("fresh"), clean_session=False)
    assert c.connack.session_present is False


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_clean_session_discards_previous_session(broker, connect, protocol):
    topic = unique("clean")
    cid = offline_subscriber(broker, connect, protocol, topic)
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"queued", qos=1)

    clean = connect(broker, client_id=cid, protocol=protocol, clean_session=True)
    assert clean.connack.session_present is False
    clean.expect_no_message(0.5)           # queued message discarded with the session
    pub.publish(topic, b"after", qos=1)
    clean.expect_no_message(0.3)           # and so was the subscription
    clean.disconnect()

    # a clean session also ends when it disconnects: nothing left to resume
    again = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    assert again.connack.session_present is False
    again.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_clean_session_subscriber_gets_nothing_published_while_offline(broker, connect, protocol):
    topic = unique("clean")
    cid = unique("cid")
    c = connect(broker, client_id=cid, protocol=protocol, clean_session=True)
    c.subscribe(topic, 1)
    c.disconnect()
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"missed", qos=1)
    back = connect(broker, client_id=cid, protocol=protocol, clean_session=True)
    back.subscribe(topic, 1)
    back.expect_no_message(0.5)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_takeover_closes_first_connection(broker, connect, protocol):
    cid = unique("twin")
    topic = unique("takeover")
    first = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    first.subscribe(topic, 1)
    second = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    first.wait_disconnected(3)
    if protocol == MQTTv311:
        assert second.connack.session_present is True
    # the session (and its subscription) now belongs to the second connection
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"to second", qos=1)
    assert second.wait_messages(1)[0].payload == b"to second"
    assert first.received == []
    assert second.is_connected()


def test_takeover_with_clean_session_starts_fresh(broker, connect):
    cid = unique("twin")
    topic = unique("takeover")
    first = connect(broker, client_id=cid, clean_session=False)
    first.subscribe(topic, 1)
    second = connect(broker, client_id=cid, clean_session=True)
    first.wait_disconnected(3)
    assert second.connack.session_present is False
    pub = connect(broker)
    pub.publish(topic, b"nobody", qos=1)
    second.expect_no_message(0.5)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_offline_queue_limit_keeps_first_messages(make_broker, connect, protocol):
    """max_queued_messages=5, 10 QoS 1 messages while offline: exactly 5 delivered on resume, the
    first 5 (Braid's default overflow policy drop_newest; Mosquitto also drops new ones)."""
    broker = make_broker(braid={"session.max_queued_messages": 5}, mosquitto=["max_queued_messages 5"])
    topic = unique("limit")
    cid = offline_subscriber(broker, connect, protocol, topic, qos=1)
    pub = connect(broker, protocol=protocol)
    for i in range(10):
        pub.publish(topic, f"m{i}".encode(), qos=1)
    back = connect(broker, client_id=cid, protocol=protocol, clean_session=False)
    got = back.wait_messages(5)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5)]
    back.expect_no_message(0.7)


@pytest.mark.braid_only
def test_offline_queue_overflow_drop_oldest_keeps_last_messages(make_broker, connect):
    broker = make_broker(braid={"session.max_queued_messages": 5, "session.queue_overflow": "drop_oldest"})
    topic = unique("limit")
    cid = offline_subscriber(broker, connect, MQTTv311, topic, qos=1)
    pub = connect(broker)
    for i in range(10):
        pub.publish(topic, f"m{i}".encode(), qos=1)
    back = connect(broker, client_id=cid, clean_session=False)
    got = back.wait_messages(5)
    assert [m.payload for m in got] == [f"m{i}".encode() for i in range(5, 10)]
    back.expect_no_message(0.7)


def test_queue_qos0_option_queues_qos0_for_offline_session(make_broker, connect):
    broker = make_broker(braid={"session.queue_qos0": True}, mosquitto=["queue_qos0_messages true"])
    topic = unique("q0")
    cid = offline_subscriber(broker, connect, MQTTv311, topic, qos=1)
    pub = connect(broker)
    pub.publish(topic, b"zero", qos=0)
    pub.publish(topic, b"one", qos=1)
    back = connect(broker, client_id=cid, clean_session=False)
    got = back.wait_messages(2)
    assert [(m.payload, m.qos) for m in got] == [(b"zero", 0), (b"one", 1)]


def test_persistent_session_via_mosquitto_sub(broker, connect, mosquitto_sub):
    """mosquitto_sub -c (persistent session) picks up what was published while it was away."""
    topic = unique("msubc")
    cid = unique("msub")
    first = mosquitto_sub(broker, topic, qos=1, client_id=cid, extra=["-c"])
    first.stop()
    pub = connect(broker)
    pub.publish(topic, b"while away", qos=1)
    again = mosquitto_sub(broker, topic, qos=1, client_id=cid, extra=["-c"])
    [m] = again.wait_messages(1)
    assert m.payload == b"while away"
