"""Retained message limits (`[retained]`, docs/mqtt.md): a count and a payload size past which a
retained PUBLISH is refused (v5: Quota exceeded, nothing published; 3.1.1: published without
being retained, as EMQX does), an expiry cap and a default expiry; the API lists retained
messages by size and age. Publishers are paho (v5) and mosquitto_pub (3.1.1), subscribers paho
and mosquitto_sub."""
import subprocess
import time

import pytest
from paho.mqtt.client import MQTTv5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from test_admin_api import Api, admin_broker, metric

pytestmark = pytest.mark.braid_only

QUOTA_EXCEEDED = 0x97


def retained_now(b, connect, filter="r/#", expect=None):
    """The retained messages a new subscriber to `filter` gets (waiting for `expect` of them)."""
    c = connect(b, protocol=MQTTv5)
    c.subscribe(filter, 1)
    got = c.wait_messages(expect) if expect else []
    c.expect_no_message(0.3)
    return sorted((m.topic, m.payload) for m in got)


def test_past_max_messages_a_v5_publish_is_refused_and_a_v3_one_is_not_retained(make_broker, connect,
                                                                                 mosquitto_sub):
    b, port = admin_broker(make_broker, **{"retained.max_messages": 2})
    watcher = mosquitto_sub(b, ["r/#"], qos=1)
    pub = connect(b, protocol=MQTTv5)
    assert pub.publish("r/a", b"1", qos=1, retain=True) == 0
    assert pub.publish("r/b", b"2", qos=1, retain=True) == 0
    assert pub.publish("r/c", b"3", qos=1, retain=True) == QUOTA_EXCEEDED
    assert pub.publish("r/a", b"1b", qos=1, retain=True) == 0, "replacing a retained topic is no new one"
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(b.port), "-V", "mqttv311", "-q", "1", "-r",
                    "-t", "r/d", "-m", "4"], check=True, timeout=10)
    got = [(m.topic, m.payload) for m in watcher.wait_messages(4)]
    assert got == [("r/a", b"1"), ("r/b", b"2"), ("r/a", b"1b"), ("r/d", b"4")], "r/c refused whole"
    watcher.expect_no_message(0.3)
    assert retained_now(b, connect, expect=2) == [("r/a", b"1b"), ("r/b", b"2")], "r/d went out, not retained"
    assert pub.publish("r/b", b"", qos=1, retain=True) == 0, "clearing is never refused"
    assert pub.publish("r/c", b"3", qos=1, retain=True) == 0, "a place was freed"
    status, text = Api(port).get("/metrics", raw=True)
    assert status == 200 and metric(text, "braid_retained_refused_total") == 2


def test_a_retained_payload_over_the_limit_is_refused(make_broker, connect):
    b = make_broker(braid={"retained.max_payload_bytes": 4})
    pub = connect(b, protocol=MQTTv5)
    assert pub.publish("r/big", b"12345", qos=1, retain=True) == QUOTA_EXCEEDED
    assert pub.publish("r/ok", b"1234", qos=1, retain=True) == 0
    assert pub.publish("r/live", b"12345", qos=1) == 0, "only retained messages are limited"
    assert retained_now(b, connect, expect=1) == [("r/ok", b"1234")]


def test_the_default_expiry_and_the_cap_end_retained_messages(make_broker, connect):
    b = make_broker(braid={"retained.default_expiry_secs": 1, "retained.max_expiry_secs": 4})
    pub = connect(b, protocol=MQTTv5)
    pub.publish("r/none", b"no expiry", qos=1, retain=True)
    long = Properties(PacketTypes.PUBLISH)
    long.MessageExpiryInterval = 100
    pub.publish("r/long", b"100 s asked", qos=1, retain=True, properties=long)
    time.sleep(1.5)
    assert retained_now(b, connect, expect=1) == [("r/long", b"100 s asked")], "the default ended r/none"
    time.sleep(3.0)
    assert retained_now(b, connect) == [], "the cap ended r/long"


def test_the_api_lists_retained_messages_by_size_and_age(make_broker, connect):
    b, port = admin_broker(make_broker)
    pub = connect(b, protocol=MQTTv5)
    for topic, payload in (("r/old", b"xx"), ("r/big", b"x" * 100), ("r/new", b"x")):
        pub.publish(topic, payload, qos=1, retain=True)
        time.sleep(1.1)
    status, body = Api(port).get("/api/v1/retained?sort=size")
    assert status == 200
    assert [(m["topic"], m["payload_bytes"]) for m in body["data"]] == [("r/big", 100), ("r/old", 2), ("r/new", 1)]
    status, body = Api(port).get("/api/v1/retained?sort=age")
    ages = [(m["topic"], m["age_secs"]) for m in body["data"]]
    assert [t for t, _ in ages] == ["r/old", "r/big", "r/new"], ages
    assert ages[0][1] >= 3 and ages[2][1] <= 2 and ages[0][1] > ages[2][1], ages
    assert all(m["expires_in_secs"] is None for m in body["data"])
    status, body = Api(port).get("/api/v1/retained?sort=weight")
    assert status == 400 and "unknown variant `weight`" in str(body), body
