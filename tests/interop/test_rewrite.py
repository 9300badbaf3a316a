"""Topic rewrite (`[[rewrite]]`, docs/mqtt.md), with EMQX's rule names and semantics: the last
rule whose source_topic matches decides, its regular expression's groups fill dest_topic, and
the ACL is checked on the topic the client sent. Publishers are mosquitto_pub and paho,
subscribers mosquitto_sub and paho."""
import subprocess

import pytest
from paho.mqtt.client import MQTTv5

from conftest import serve_refused

pytestmark = pytest.mark.braid_only

# EMQX's documented example (its order: the later rule wins where both filters match).
EMQX_EXAMPLE = [
    {"action": "subscribe", "source_topic": "y/+/z/#", "re": "^y/(.+)/z/(.+)$", "dest_topic": "y/z/$2"},
    {"action": "all", "source_topic": "x/#", "re": "^x/y/(.+)$", "dest_topic": "z/y/x/$1"},
    {"action": "all", "source_topic": "x/y/+", "re": "^x/y/(\\d+)$", "dest_topic": "z/y/$1"},
]


def pub(broker, topic, payload, *extra):
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-q", "1", "-t", topic,
                    "-m", payload, *extra], check=True, timeout=10)


def test_a_published_topic_is_rewritten_with_the_expression_groups(make_broker, connect, mosquitto_sub):
    b = make_broker(braid={"rewrite": EMQX_EXAMPLE})
    everything = mosquitto_sub(b, ["#"], qos=1)
    pub(b, "x/y/a/b", "groups")   # x/# decides: z/y/x/$1
    pub(b, "x/y/7", "digits")     # x/y/+ (the later rule) decides: z/y/$1
    pub(b, "x/y/z", "kept")       # x/y/+ decides and its \d+ does not match: unchanged, x/# not tried
    pub(b, "y/a/z/b", "sub-only")  # a subscribe rule: PUBLISH unchanged
    got = [(m.topic, m.payload) for m in everything.wait_messages(4)]
    assert got == [("z/y/x/a/b", b"groups"), ("z/y/7", b"digits"), ("x/y/z", b"kept"), ("y/a/z/b", b"sub-only")]
    paho = connect(b, protocol=MQTTv5)
    assert paho.publish("x/y/c/d", b"paho", qos=1) == 0
    [m] = everything.wait_messages(1)
    assert (m.topic, m.payload) == ("z/y/x/c/d", b"paho")
    # A retained message is kept under the topic it was rewritten to.
    pub(b, "x/y/r/1", "kept", "-r")
    everything.wait_messages(1)
    late = connect(b, protocol=MQTTv5)
    late.subscribe("#", 1)
    [m] = late.wait_messages(1)
    assert (m.topic, m.payload, m.retain) == ("z/y/x/r/1", b"kept", True)


def test_subscribe_and_unsubscribe_filters_are_rewritten_shared_ones_after_their_group(make_broker, connect):
    b = make_broker(braid={"rewrite": EMQX_EXAMPLE})
    device = connect(b, protocol=MQTTv5)
    assert device.subscribe([("y/a/z/b", 1), ("$share/g/x/y/2", 1)]) == [1, 1]
    sender = connect(b, protocol=MQTTv5)
    for topic in ("y/a/z/b", "y/z/b", "z/y/2"):
        sender.publish(topic, topic.encode(), qos=1)
    got = sorted(m.topic for m in device.wait_messages(2))
    assert got == ["y/z/b", "z/y/2"], "the subscriptions are the rewritten filters"
    device.expect_no_message(0.3)
    # UNSUBSCRIBE of what the device subscribed to finds the rewritten subscription.
    assert device.unsubscribe(["y/a/z/b", "$share/g/x/y/2"]) == [0, 0]
    sender.publish("y/z/b", b"after", qos=1)
    sender.publish("z/y/2", b"after", qos=1)
    device.expect_no_message(0.5)


def test_subscribing_again_at_the_quota_replaces_the_rewritten_subscription(make_broker, connect):
    b = make_broker(braid={"rewrite": EMQX_EXAMPLE, "limits.max_subscriptions": 1})
    c = connect(b, protocol=MQTTv5)
    assert c.subscribe("y/a/z/b", 1) == [1]
    assert c.subscribe("y/a/z/b", 0) == [0], "the same (rewritten) subscription, not a second one"
    assert c.subscribe("other", 0) == [0x97]


def test_the_client_id_and_user_name_fill_the_destination(make_broker, mosquitto_sub):
    rule = {"action": "publish", "source_topic": "up/#", "re": "^up/(.*)$",
            "dest_topic": "tenants/${username}/${clientid}/$1"}
    b = make_broker(braid={"rewrite": [rule]})
    tenants = mosquitto_sub(b, ["tenants/#"], qos=1)
    pub(b, "up/temp", "21", "-i", "dev9", "-u", "alice")
    [m] = tenants.wait_messages(1)
    assert (m.topic, m.payload) == ("tenants/alice/dev9/temp", b"21")


def test_the_acl_sees_the_topic_the_client_sent(make_broker, connect, tmp_path):
    acl = tmp_path / "acl"
    # Devices may publish under legacy/ and read z/; only the operator reads the new tree.
    acl.write_text("allow all both legacy/#\nallow user:ops subscribe new/#\n")
    rule = {"action": "publish", "source_topic": "legacy/#", "re": "^legacy/(.*)$", "dest_topic": "new/$1"}
    b = make_broker(braid={"rewrite": [rule], "acl.file": str(acl)})
    ops = connect(b, protocol=MQTTv5, username="ops", password="-")
    assert ops.subscribe("new/#", 1) == [1]
    device = connect(b, protocol=MQTTv5, username="dev", password="-")
    assert device.publish("legacy/t", b"allowed as sent", qos=1) == 0
    [m] = ops.wait_messages(1)
    assert (m.topic, m.payload) == ("new/t", b"allowed as sent")
    assert device.publish("new/t", b"denied as sent", qos=1) == 0x87
    ops.expect_no_message(0.3)


@pytest.mark.parametrize("rule, key, words", [
    ({"source_topic": "a/#/b", "re": "^a$", "dest_topic": "b"}, "rewrite[0].source_topic", "not a topic filter"),
    ({"source_topic": "a/#", "re": "^a/(", "dest_topic": "b"}, "rewrite[0].re", "unclosed group"),
    ({"source_topic": "a/#", "re": "^a/(.*)$", "dest_topic": "b/$2"}, "rewrite[0].dest_topic", "has 1 group"),
    ({"source_topic": "a/#", "re": "^a$", "dest_topic": "b", "action": "both"}, "rewrite", "both"),
])
def test_a_bad_rule_stops_the_start_naming_key_and_problem(rule, key, words, tmp_path):
    stderr = serve_refused(tmp_path, rewrite=[rule])
    assert key in stderr and words in stderr, stderr
