"""Topic filters: `+`, `#`, parent matching, `$`-topics, overlapping subscriptions."""
import pytest

from helpers import SUBACK, V3_PROTOCOLS, connack_return_code, proto_id, subscribe_packet, unique


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_single_level_wildcard(broker, connect, protocol):
    base = unique("w")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(f"{base}/+/temp", 1)
    pub = connect(broker, protocol=protocol)
    matching = [f"{base}/kitchen/temp", f"{base}//temp"]
    other = [f"{base}/temp", f"{base}/a/b/temp", f"{base}/kitchen/temp/x", f"{base}/kitchen/humidity"]
    for t in other + matching:
        pub.publish(t, t.encode(), qos=1)
    got = sub.wait_messages(2)
    assert sorted(m.topic for m in got) == sorted(matching)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_multi_level_wildcard_matches_parent_and_children(broker, connect, protocol):
    base = unique("sport")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(f"{base}/#", 1)
    pub = connect(broker, protocol=protocol)
    matching = [base, f"{base}/tennis", f"{base}/tennis/player1/score", f"{base}/"]
    for t in [f"{base}x", f"{base}x/tennis"] + matching:
        pub.publish(t, b"x", qos=1)
    got = sub.wait_messages(len(matching))
    assert sorted(m.topic for m in got) == sorted(matching)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_plus_matches_single_level_topic_and_hash_alone_matches_everything(broker, connect, protocol):
    base = unique("lvl")
    plus = connect(broker, protocol=protocol)
    plus.subscribe("+", 1)
    everything = connect(broker, protocol=protocol)
    everything.subscribe("#", 1)
    pub = connect(broker, protocol=protocol)
    pub.publish(base, b"1", qos=1)
    pub.publish(f"{base}/child", b"2", qos=1)
    assert [m.topic for m in plus.wait_messages(1)] == [base]
    plus.expect_no_message(0.3)
    assert sorted(m.topic for m in everything.wait_messages(2)) == sorted([base, f"{base}/child"])


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_dollar_topics_not_matched_by_leading_wildcards(broker, connect, protocol):
    name = unique("dollar")
    wild = connect(broker, protocol=protocol)
    wild.subscribe("#", 0)
    wild.subscribe("+/" + name, 0)
    wild.subscribe("+/+", 0)
    explicit = connect(broker, protocol=protocol)
    explicit.subscribe(f"$app/{name}", 0)
    explicit.subscribe("$SYS/#", 0)
    pub = connect(broker, protocol=protocol)
    pub.publish(f"$app/{name}", b"dollar", qos=1)
    got = explicit.wait_messages(1)
    # explicit subscription gets it (possibly after some $SYS messages)
    while got[-1].topic != f"$app/{name}":
        got += explicit.wait_messages(1)
    # give the broker's $SYS publisher (1 s interval) a chance to leak into `#` too
    leaked = [m.topic for m in wild.collect(1.3) if m.topic.startswith("$")]
    assert leaked == []


OVERLAP_QOS = [(0, 2), (2, 1), (1, 0)]


def publish_to_overlapping(broker, connect, protocol, qos_a, qos_b):
    base = unique("ovl")
    sub = connect(broker, protocol=protocol)
    sub.subscribe(f"{base}/#", qos_a)
    sub.subscribe(f"{base}/+/c", qos_b)
    sub.subscribe(f"{base}/b/c", 0)
    pub = connect(broker, protocol=protocol)
    pub.publish(f"{base}/b/c", b"once", qos=2)
    return sub.wait_messages(1) + sub.collect(0.5)


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_overlapping_subscriptions_deliver_the_message(broker, connect, protocol):
    """Portable part: the message arrives, at most one copy per matching subscription."""
    got = publish_to_overlapping(broker, connect, protocol, 2, 1)
    assert 1 <= len(got) <= 3
    assert all(m.payload == b"once" for m in got)


@pytest.mark.braid_only
@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
@pytest.mark.parametrize("qos_a,qos_b", OVERLAP_QOS)
def test_overlapping_subscriptions_deliver_one_copy_at_max_qos(broker, connect, protocol, qos_a, qos_b):
    """Braid sends a single copy at the highest QoS of all matching subscriptions (MQTT-3.3.5-1).
    Mosquitto 2.0.11 sends one copy at the QoS of whichever subscription its tree walk meets last
    (QoS 0 here), violating MQTT-3.3.5-1 (eclipse-mosquitto/mosquitto#3319), hence braid_only."""
    got = publish_to_overlapping(broker, connect, protocol, qos_a, qos_b)
    assert [(m.payload, m.qos) for m in got] == [(b"once", max(qos_a, qos_b))]


@pytest.mark.parametrize("protocol", V3_PROTOCOLS, ids=proto_id)
def test_resubscribe_replaces_qos(broker, connect, protocol):
    topic = unique("resub")
    sub = connect(broker, protocol=protocol)
    assert sub.subscribe(topic, 2) == [2]
    assert sub.subscribe(topic, 0) == [0]
    pub = connect(broker, protocol=protocol)
    pub.publish(topic, b"x", qos=2)
    [m] = sub.wait_messages(1)
    assert m.qos == 0
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("level", [3, 4], ids=["v3.1", "v3.1.1"])
@pytest.mark.parametrize("bad_filter", ["a/#/b", "a#", "a/b+", ""])
def test_invalid_filter_is_refused_or_connection_closed(broker, raw_client, level, bad_filter):
    """An invalid filter gets SUBACK failure 0x80 (3.1.1) or the connection is closed; a valid
    filter in the same SUBSCRIBE still works when the broker answers."""
    raw = raw_client(broker)
    assert connack_return_code(raw.connect(unique("bad"), level=level)) == 0
    raw.send(subscribe_packet(9, [(bad_filter, 0), (unique("ok"), 1)]))
    p = raw.recv_packet(3)
    if p is None:
        return  # connection closed: allowed (and the only option in 3.1)
    assert p.type == SUBACK
    assert p.body[:2] == b"\x00\x09"
    if level == 4:
        assert p.body[2:] == b"\x80\x01"
