"""A newcomer's first experience: mosquitto_pub -> mosquitto_sub through the broker."""
import pytest

from helpers import mosquitto_pub, unique


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mosquitto_pub_to_mosquitto_sub(broker, mosquitto_sub, version, qos):
    topic = unique("cli") + "/greeting"
    sub = mosquitto_sub(broker, topic, qos=qos, version=version)
    mosquitto_pub(broker, topic, "hello world", qos=qos, version=version)
    [m] = sub.wait_messages(1)
    assert m.topic == topic
    assert m.payload == b"hello world"
    assert m.qos == qos
    assert not m.retain
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_sub_downgrades_to_subscription_qos(broker, mosquitto_sub, version):
    topic = unique("cli")
    sub = mosquitto_sub(broker, topic, qos=1, version=version)
    mosquitto_pub(broker, topic, "q2", qos=2, version=version)
    [m] = sub.wait_messages(1)
    assert (m.payload, m.qos) == (b"q2", 1)


def test_mosquitto_pub_retained_seen_by_later_mosquitto_sub(broker, mosquitto_sub):
    topic = unique("cli")
    mosquitto_pub(broker, topic, "kept", qos=1, retain=True)
    sub = mosquitto_sub(broker, topic, qos=1)
    [m] = sub.wait_messages(1)
    assert (m.payload, m.retain) == (b"kept", True)
