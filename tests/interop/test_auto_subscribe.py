"""Auto-subscribe (`[[auto_subscribe]]`, docs/mqtt.md): every client that connects is subscribed
to the configured topics, ${clientid}, ${username}, ${host} and ${port} filled in, with their
QoS, No Local, Retain As Published and Retain Handling, as EMQX's auto-subscribe does. Clients
are paho and mosquitto_sub, publishers mosquitto_pub and paho."""
import subprocess

import pytest
from paho.mqtt.client import MQTTv5

from conftest import serve_refused
from v5util import connect_props

pytestmark = pytest.mark.braid_only

TOPICS = [
    {"topic": "cmd/${clientid}", "qos": 1},
    {"topic": "users/${username}/#", "qos": 2},
    {"topic": "hosts/${host}", "qos": 0, "rh": 2},
    {"topic": "chat", "qos": 1, "nl": True},
    {"topic": "keep/${clientid}", "qos": 1, "rap": True},
]


def pub(broker, topic, payload, *extra):
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-t", topic,
                    "-m", payload, *extra], check=True, timeout=10)


def test_a_client_gets_its_subscriptions_at_connect_with_their_options(make_broker, connect):
    b = make_broker(braid={"auto_subscribe": TOPICS})
    pub(b, "cmd/dev1", "waiting", "-r")
    pub(b, "hosts/127.0.0.1", "retained, not sent (rh 2)", "-r")
    dev = connect(b, client_id="dev1", protocol=MQTTv5, username="alice", password="-")
    [m] = dev.wait_messages(1)
    assert (m.topic, m.payload, m.retain, m.qos) == ("cmd/dev1", b"waiting", True, 1)
    for topic in ("cmd/dev1", "users/alice/lamp", "hosts/127.0.0.1", "cmd/other", "users/bob/x"):
        pub(b, topic, topic)
    got = sorted((m.topic, m.qos) for m in dev.wait_messages(3))
    assert got == [("cmd/dev1", 1), ("hosts/127.0.0.1", 0), ("users/alice/lamp", 1)]
    dev.expect_no_message(0.3)
    # No Local: its own message on chat does not come back; another client's does.
    dev.publish("chat", b"mine", qos=1)
    pub(b, "chat", "theirs")
    [m] = dev.wait_messages(1)
    assert (m.topic, m.payload) == ("chat", b"theirs")
    # Retain As Published on keep/..., not on cmd/...: a live retained message keeps RETAIN only there.
    pub(b, "keep/dev1", "kept", "-r")
    pub(b, "cmd/dev1", "plain", "-r")
    got = [(m.topic, m.retain) for m in dev.wait_messages(2)]
    assert got == [("keep/dev1", True), ("cmd/dev1", False)]


def test_a_persistent_session_keeps_its_auto_subscriptions_while_offline(make_broker, connect):
    b = make_broker(braid={"auto_subscribe": TOPICS})
    kept = connect_props(SessionExpiryInterval=300)
    dev = connect(b, client_id="dev3", protocol=MQTTv5, clean_start=False, properties=kept)
    dev.disconnect()
    pub(b, "cmd/dev3", "while you were away")
    back = connect(b, client_id="dev3", protocol=MQTTv5, clean_start=False, properties=kept)
    got = [(m.topic, m.payload) for m in back.wait_messages(1)]
    assert got == [("cmd/dev3", b"while you were away")]


def test_a_client_without_a_user_name_gets_the_topics_that_need_none(make_broker, mosquitto_sub):
    b = make_broker(braid={"auto_subscribe": TOPICS})
    # mosquitto_sub subscribes to an unrelated topic itself; the broker adds cmd/dev2.
    sub = mosquitto_sub(b, ["nothing/here"], qos=1, client_id="dev2")
    pub(b, "users//x", "no user name: not subscribed")
    pub(b, "cmd/dev2", "for dev2")
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload) == ("cmd/dev2", b"for dev2")
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("entry, key, words", [
    ({"topic": "a/${user}"}, "auto_subscribe[0].topic", "not a placeholder"),
    ({"topic": "a/#/b"}, "auto_subscribe[0].topic", "not a topic filter"),
    ({"topic": "a", "qos": 3}, "auto_subscribe[0].qos", "0, 1 or 2"),
])
def test_a_bad_entry_stops_the_start_naming_key_and_problem(entry, key, words, tmp_path):
    stderr = serve_refused(tmp_path, auto_subscribe=[entry])
    assert key in stderr and words in stderr, stderr
