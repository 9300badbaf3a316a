"""Shared subscriptions ($share/{group}/{filter}), usable by MQTT 3.1.1 clients too."""
import pytest

from helpers import MQTTv311, MQTTv5, proto_id, unique, wait_total


def publish_n(pub, topic, n, start=0, qos=1):
    """Publish m{start}..m{start+n-1}; returns the sorted list of payloads sent."""
    for i in range(start, start + n):
        pub.publish(topic, f"m{i}".encode(), qos=qos)
    return sorted(f"m{i}".encode() for i in range(start, start + n))


def shared_members(broker, connect, filt, n=2, protocol=MQTTv311, group="g"):
    members = [connect(broker, protocol=protocol) for _ in range(n)]
    for m in members:
        assert m.subscribe(f"$share/{group}/{filt}", 1) == [1]
    return members


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_shared_subscription_splits_messages_between_members(broker, connect, protocol):
    topic = unique("jobs") + "/work"
    members = shared_members(broker, connect, topic, protocol=protocol)
    sent = publish_n(connect(broker, protocol=protocol), topic, 10)
    got = wait_total(members, 10)
    assert sorted(m.payload for m in got) == sent, "each message exactly once in total"
    counts = [len(m.received) for m in members]
    assert all(c > 0 for c in counts), f"not split across members: {counts}"


def test_shared_subscription_member_leaving_remaining_member_gets_everything(broker, connect):
    topic = unique("jobs")
    a, b = shared_members(broker, connect, topic)
    pub = connect(broker)
    publish_n(pub, topic, 4)
    wait_total([a, b], 4, settle=0)
    b.disconnect()
    a.drain()
    sent = publish_n(pub, topic, 10, start=100)
    assert sorted(m.payload for m in a.wait_messages(10)) == sent
    a.expect_no_message(0.3)


def test_shared_subscription_member_killed_remaining_member_gets_everything(broker, connect):
    topic = unique("jobs")
    gone = unique("gone")
    watcher = connect(broker)
    watcher.subscribe(gone, 1)
    a = connect(broker)
    b = connect(broker, will={"topic": gone, "payload": b"b died", "qos": 1})
    for m in (a, b):
        m.subscribe(f"$share/g/{topic}", 1)
    b.kill()
    watcher.wait_messages(1)  # the will proves the broker has noticed b is gone
    pub = connect(broker)
    sent = publish_n(pub, topic, 10)
    assert sorted(m.payload for m in a.wait_messages(10)) == sent


def test_shared_and_normal_subscriptions_both_receive(broker, connect):
    """A normal subscription still gets every message; each group gets one copy of each."""
    topic = unique("fan")
    normal = connect(broker)
    normal.subscribe(topic, 1)
    groups = {g: shared_members(broker, connect, topic, group=g) for g in ("g1", "g2")}
    sent = publish_n(connect(broker), topic, 6)
    assert sorted(m.payload for m in normal.wait_messages(6)) == sent
    for g, members in groups.items():
        assert sorted(m.payload for m in wait_total(members, 6)) == sent, g


def test_shared_subscription_with_wildcard_filter(broker, connect):
    base = unique("sw")
    members = shared_members(broker, connect, f"{base}/+/temp")
    pub = connect(broker)
    for room in ("kitchen", "hall", "attic", "cellar"):
        pub.publish(f"{base}/{room}/temp", room.encode(), qos=1)
    pub.publish(f"{base}/kitchen/humidity", b"no", qos=1)
    got = wait_total(members, 4)
    assert sorted(m.payload for m in got) == [b"attic", b"cellar", b"hall", b"kitchen"]


def test_unsubscribe_from_shared_subscription(broker, connect):
    topic = unique("jobs")
    a, b = shared_members(broker, connect, topic)
    b.unsubscribe(f"$share/g/{topic}")
    sent = publish_n(connect(broker), topic, 5)
    assert sorted(m.payload for m in a.wait_messages(5)) == sent
    b.expect_no_message(0.3)


def test_mosquitto_sub_can_join_a_shared_group(broker, connect, mosquitto_sub):
    topic = unique("jobs")
    paho_member = shared_members(broker, connect, topic, n=1)[0]
    cli_member = mosquitto_sub(broker, f"$share/g/{topic}", qos=1)
    sent = publish_n(connect(broker), topic, 10)
    got = wait_total([paho_member, cli_member], 10)
    assert sorted(m.payload for m in got) == sent
    assert paho_member.received and cli_member.received


@pytest.mark.braid_only
def test_legacy_queue_prefix_shares_messages(broker, connect):
    """`$queue/{filter}` is Braid's legacy alias of one shared group (Mosquitto lacks it)."""
    topic = unique("q")
    a = connect(broker)
    b = connect(broker)
    a.subscribe(f"$queue/{topic}", 1)
    b.subscribe(f"$queue/{topic}", 1)
    sent = publish_n(connect(broker), topic, 10)
    assert sorted(m.payload for m in wait_total([a, b], 10)) == sent
