"""MQTT 5 Topic Aliases, client -> broker and broker -> client."""
import pytest

import raw_v5 as r
from helpers import unique
from v5util import (connect_props, prop, publish_props, raw5, rc, resolve_aliases,  # noqa: F401  (fixtures)
                    v5)


def test_client_topic_alias_is_resolved_for_subscribers(broker, v5):
    t1, t2 = unique("alias-a"), unique("alias-b")
    sub = v5(broker)
    sub.subscribe(t1, qos=1)
    sub.subscribe(t2, qos=1)
    pub = v5(broker)
    pub.publish(t1, b"set 1", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"use 1", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish(t2, b"rebind 1", qos=1, properties=publish_props(TopicAlias=1))
    pub.publish("", b"use 1 again", qos=1, properties=publish_props(TopicAlias=1))
    got = sub.wait_messages(4)
    assert [(m.topic, m.payload) for m in got] == [
        (t1, b"set 1"), (t1, b"use 1"), (t2, b"rebind 1"), (t2, b"use 1 again")]
    # Aliases are per connection, never forwarded: this subscriber did not ask for any.
    assert all(prop(m, "TopicAlias") is None for m in got)


def test_topic_alias_above_maximum_disconnects_with_0x94(broker, v5):
    bystander = v5(broker)
    topic = unique("alias-max")
    bystander.subscribe(topic, qos=1)
    pub = v5(broker)
    maximum = prop(pub.connack, "TopicAliasMaximum", 0)
    pub.publish(topic, b"too far", qos=0, properties=publish_props(TopicAlias=maximum + 1))
    assert rc(pub.wait_disconnected()) == 0x94  # Topic Alias invalid
    bystander.expect_no_message(0.3)
    v5(broker).publish(topic, b"others fine", qos=1)
    assert bystander.get_message().payload == b"others fine"


def test_subscriber_without_alias_maximum_gets_full_topics(broker, raw5):
    topic = unique("noalias")
    sub = raw5(broker)
    sub.connect5(unique("s"))
    sub.subscribe5([(topic, 1)])
    pub = raw5(broker)
    pub.connect5(unique("p"))
    for i in range(5):
        pub.send(r.publish(topic, f"m{i}", qos=0))
    got = sub.publishes(3.0, n=5)
    assert sub.publishes(0.2) == []
    assert [(p.topic, p.payload) for p in got] == [(topic, f"m{i}".encode()) for i in range(5)]
    assert all(p.prop(r.TOPIC_ALIAS) is None for p in got)


@pytest.mark.braid_only  # Mosquitto never assigns topic aliases towards clients
def test_broker_assigns_topic_aliases_to_subscriber_raw(broker, raw5):
    t1, t2 = unique("srv-a"), unique("srv-b")
    sub = raw5(broker)
    sub.connect5(unique("s"), props=[(r.TOPIC_ALIAS_MAXIMUM, 10)])
    sub.subscribe5([(t1, 1), (t2, 1)])
    pub = raw5(broker)
    pub.connect5(unique("p"))
    sent = [t1, t1, t2, t1, t2, t2]
    for i, t in enumerate(sent):
        pub.send(r.publish(t, f"m{i}", qos=1, pid=i + 1))
    got = sub.publishes(3.0, n=len(sent))
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(len(sent))]
    aliases, topics = {}, []
    for p in got:
        alias = p.prop(r.TOPIC_ALIAS)
        assert alias is None or 1 <= alias <= 10, p
        if p.topic:
            if alias is not None:
                aliases[alias] = p.topic
            topics.append(p.topic)
        else:
            assert alias in aliases, f"empty topic without a known alias: {p!r}"
            topics.append(aliases[alias])
    assert topics == sent
    assert any(p.topic == "" for p in got), "the broker never used a topic alias"


@pytest.mark.braid_only  # Mosquitto never assigns topic aliases towards clients
def test_broker_topic_aliases_resolvable_by_paho(broker, v5):
    topic = unique("srv-paho")
    sub = v5(broker, properties=connect_props(TopicAliasMaximum=10))
    sub.subscribe(topic, qos=1)
    pub = v5(broker)
    for i in range(4):
        pub.publish(topic, f"m{i}".encode(), qos=1)
    got = sub.wait_messages(4)
    assert [m.payload for m in got] == [b"m0", b"m1", b"m2", b"m3"]
    assert resolve_aliases(got) == [topic] * 4
    assert got[0].topic == topic  # the first carries the topic that sets the alias
    assert any(m.topic == "" for m in got[1:]), "later messages should use the alias"
