"""MQTT 5 Will: Will Delay Interval, cancellation by reconnect, DISCONNECT 0x04, will properties."""
import time

import pytest
from paho.mqtt.reasoncodes import ReasonCode

from helpers import unique
from helpers import PacketTypes, v5_properties
from v5util import connect_props, prop, user_props, v5  # noqa: F401  (fixtures)


def _will(topic, payload=b"gone", **props):
    return {"topic": topic, "payload": payload, "qos": 1, "properties": v5_properties(PacketTypes.WILLMESSAGE, **props) if props else None}


def _watcher(v5, broker, topic):
    w = v5(broker)
    w.subscribe(topic, qos=1)
    return w


def test_will_delay_postpones_will(broker, v5, client_id):
    topic = unique("will")
    watcher = _watcher(v5, broker, topic)
    c = v5(broker, client_id=client_id, properties=connect_props(SessionExpiryInterval=10),
           will=_will(topic, WillDelayInterval=2))
    start = time.monotonic()
    c.kill()
    watcher.expect_no_message(1.2)
    m = watcher.get_message(timeout=3)
    waited = time.monotonic() - start
    assert m.payload == b"gone"
    assert 1.5 <= waited <= 4.0, f"will published {waited:.2f}s after the abnormal close"


def test_reconnect_within_will_delay_cancels_will(broker, v5, client_id):
    topic = unique("will")
    watcher = _watcher(v5, broker, topic)
    c = v5(broker, client_id=client_id, properties=connect_props(SessionExpiryInterval=10),
           will=_will(topic, WillDelayInterval=2))
    c.kill()
    time.sleep(0.5)
    again = v5(broker, client_id=client_id, clean_start=False, properties=connect_props(SessionExpiryInterval=10))
    assert again.connack.session_present is True
    watcher.expect_no_message(2.5)


@pytest.mark.parametrize("reason, published", [(0x04, True), (0x00, False)], ids=["0x04-with-will", "0x00-normal"])
def test_disconnect_reason_decides_will(broker, v5, client_id, reason, published):
    topic = unique("will")
    watcher = _watcher(v5, broker, topic)
    c = v5(broker, client_id=client_id, will=_will(topic, b"disconnect-with-will"))
    c.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=reason))
    if published:
        assert watcher.get_message(timeout=3).payload == b"disconnect-with-will"
    else:
        watcher.expect_no_message(1.0)


def test_will_properties_arrive_with_will(broker, v5, client_id):
    topic = unique("will")
    watcher = _watcher(v5, broker, topic)
    c = v5(broker, client_id=client_id,
           will=_will(topic, b'{"state":"offline"}', ContentType="application/json", PayloadFormatIndicator=1,
                      ResponseTopic="replies/x", CorrelationData=b"\x00corr\xff",
                      UserProperty=[("k", "v1"), ("k", "v2"), ("other", "x")]))
    c.kill()
    m = watcher.get_message(timeout=3)
    assert m.payload == b'{"state":"offline"}'
    assert prop(m, "ContentType") == "application/json"
    assert prop(m, "PayloadFormatIndicator") == 1
    assert prop(m, "ResponseTopic") == "replies/x"
    assert prop(m, "CorrelationData") == b"\x00corr\xff"
    assert user_props(m) == [("k", "v1"), ("k", "v2"), ("other", "x")]
