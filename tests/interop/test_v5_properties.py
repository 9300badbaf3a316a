"""MQTT 5 PUBLISH properties reach subscribers unchanged; Message Expiry Interval counts down."""
import threading
import time

from helpers import unique
from v5util import connect_props, prop, publish_props, user_props, v5  # noqa: F401  (fixtures)


def test_user_properties_keep_order_and_repeats(broker, v5):
    topic = unique("up")
    sub = v5(broker)
    sub.subscribe(topic, qos=1)
    pairs = [("b", "2"), ("a", "1"), ("b", "2"), ("a", "3"), ("ünï", "çødé ✓"), ("empty", "")]
    v5(broker).publish(topic, b"x", qos=1, properties=publish_props(UserProperty=pairs))
    assert user_props(sub.get_message()) == pairs


def test_request_response_with_correlation_data(broker, v5):
    requests, replies = unique("req"), unique("reply")
    responder = v5(broker)
    responder.subscribe(requests, qos=1)
    requester = v5(broker)
    requester.subscribe(replies, qos=1)

    def serve(n):
        for _ in range(n):
            m = responder.get_message(timeout=5)
            responder.publish(prop(m, "ResponseTopic"), b"re: " + m.payload, qos=1,
                              properties=publish_props(CorrelationData=prop(m, "CorrelationData")))

    t = threading.Thread(target=serve, args=(2,), daemon=True)
    t.start()
    for corr in (b"\x00\x01id-1", b"id-2\xff"):
        requester.publish(requests, b"ask " + corr[-1:], qos=1,
                          properties=publish_props(ResponseTopic=replies, CorrelationData=corr))
    got = requester.wait_messages(2)
    t.join(5)
    assert {prop(m, "CorrelationData"): m.payload for m in got} == {
        b"\x00\x01id-1": b"re: ask 1", b"id-2\xff": b"re: ask \xff"}
    assert all(m.topic == replies for m in got)


def test_payload_format_and_content_type(broker, v5):
    topic = unique("pfi")
    sub = v5(broker)
    sub.subscribe(topic, qos=1)
    pub = v5(broker)
    pub.publish(topic, '{"t": "ü"}'.encode(), qos=1,
                properties=publish_props(PayloadFormatIndicator=1, ContentType="application/json; charset=utf-8"))
    pub.publish(topic, b"\x00\xff\xfe", qos=1,
                properties=publish_props(PayloadFormatIndicator=0, ContentType="application/octet-stream"))
    a, b = sub.wait_messages(2)
    assert (a.payload, prop(a, "PayloadFormatIndicator"), prop(a, "ContentType")) == (
        '{"t": "ü"}'.encode(), 1, "application/json; charset=utf-8")
    assert (b.payload, prop(b, "PayloadFormatIndicator", 0), prop(b, "ContentType")) == (
        b"\x00\xff\xfe", 0, "application/octet-stream")


def test_message_expiry_counts_down_for_queued_messages(broker, v5):
    """The wall-clock smoke test of message expiry; the rules (retained and queued messages, what
    is left forwarded) are tested on the virtual clock (crates/braid-broker/tests/virtual_clock.rs)."""
    topic = unique("mei")
    persistent = connect_props(SessionExpiryInterval=300)
    early_id, late_id = unique("early"), unique("late")
    for cid in (early_id, late_id):
        c = v5(broker, client_id=cid, properties=persistent)
        c.subscribe(topic, qos=1)
        c.disconnect()
    pub = v5(broker)
    pub.publish(topic, b"short-lived", qos=1, properties=publish_props(MessageExpiryInterval=2))
    pub.publish(topic, b"durable", qos=1)
    time.sleep(1.0)
    early = v5(broker, client_id=early_id, clean_start=False, properties=persistent)
    a, b = early.wait_messages(2)
    assert (a.payload, b.payload) == (b"short-lived", b"durable")
    assert prop(a, "MessageExpiryInterval") is not None and prop(a, "MessageExpiryInterval") <= 1
    assert prop(b, "MessageExpiryInterval") is None
    time.sleep(2.0)  # 3 s after publishing: the 2 s message has expired for the other session
    late = v5(broker, client_id=late_id, clean_start=False, properties=persistent)
    assert late.connack.session_present is True
    assert [m.payload for m in late.collect(0.5)] == [b"durable"]
