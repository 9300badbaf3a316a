"""MQTT 5 shared subscriptions: $share/{group}/{filter}, distribution strategies, legacy $queue/."""
import collections
import time

import pytest

from helpers import unique
from v5util import connect_props, v5  # noqa: F401  (fixtures)


def _members(v5, broker, filt, n=2, qos=1, **kw):
    members = [v5(broker, **kw) for _ in range(n)]
    for m in members:
        assert m.subscribe(filt, qos=qos) == [qos]
    return members


def _collect(members, total, timeout=3.0):
    """Payload lists per member once ``total`` messages have arrived in all (plus 0.3 s for extras)."""
    deadline = time.monotonic() + timeout
    while sum(len(m.received) for m in members) < total and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    return [[x.payload for x in m.received] for m in members]


def _assert_each_once(got, sent):
    everything = [p for g in got for p in g]
    assert sorted(everything) == sorted(sent), f"each message exactly once in the group: {got}"


def test_shared_round_robin_splits_evenly(broker, v5):
    topic = unique("share")
    members = _members(v5, broker, f"$share/g/{topic}")
    plain = v5(broker)
    plain.subscribe(topic, qos=1)
    pub = v5(broker)
    sent = [f"m{i}".encode() for i in range(10)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    got = _collect(members, 10)
    _assert_each_once(got, sent)
    assert sorted(len(g) for g in got) == [5, 5], got
    assert [m.payload for m in plain.wait_messages(10)] == sent  # a normal subscriber gets all


def test_two_groups_each_get_every_message(broker, v5):
    topic = unique("share2")
    g1 = _members(v5, broker, f"$share/one/{topic}")
    g2 = _members(v5, broker, f"$share/two/{topic}")
    pub = v5(broker)
    sent = [f"m{i}".encode() for i in range(6)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    _assert_each_once(_collect(g1, 6), sent)
    _assert_each_once(_collect(g2, 6), sent)


@pytest.mark.braid_only  # Mosquitto has no configurable shared subscription strategy
@pytest.mark.parametrize("strategy", ["round_robin", "random", "hash_clientid", "hash_topic", "sticky"])
def test_shared_strategy_delivers_each_message_once(make_broker, v5, strategy):
    b = make_broker(braid={"shared.strategy": strategy})
    base = unique("strat")
    members = _members(v5, b, f"$share/g/{base}/+", n=3)
    pub = v5(b)
    by_topic = collections.defaultdict(list)
    for i in range(12):
        t = f"{base}/{'ab'[i % 2]}"
        payload = f"{t[-1]}{i}".encode()
        by_topic[t[-1]].append(payload)
        pub.publish(t, payload, qos=1)
    got = _collect(members, 12)
    _assert_each_once(got, [p for ps in by_topic.values() for p in ps])
    if strategy in ("hash_topic", "sticky"):
        for letter, payloads in by_topic.items():
            owners = {i for i, g in enumerate(got) for p in g if p in payloads}
            assert len(owners) == 1, f"{strategy}: topic {letter} spread over members {owners}: {got}"
    if strategy == "round_robin":
        assert sorted(len(g) for g in got) == [4, 4, 4], got


@pytest.mark.braid_only  # Mosquitto has no $queue/ prefix (it is a plain topic there)
def test_legacy_queue_prefix_works_like_a_group(broker, v5):
    topic = unique("queue")
    members = _members(v5, broker, f"$queue/{topic}")
    plain = v5(broker)
    plain.subscribe(topic, qos=1)
    pub = v5(broker)
    sent = [f"q{i}".encode() for i in range(10)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    got = _collect(members, 10)
    _assert_each_once(got, sent)
    assert sorted(len(g) for g in got) == [5, 5], got
    assert [m.payload for m in plain.wait_messages(10)] == sent


def test_shared_member_that_left_gets_nothing_more(broker, v5):
    topic = unique("share-left")
    leaving, staying = _members(v5, broker, f"$share/g/{topic}")
    leaving.disconnect()  # session expiry 0: its subscription is gone
    pub = v5(broker)
    sent = [f"m{i}".encode() for i in range(4)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    assert [m.payload for m in staying.wait_messages(4)] == sent
    staying.expect_no_message(0.2)


@pytest.mark.braid_only  # Mosquitto queues the share for the offline member's session (the spec allows it)
def test_shared_qos1_skips_offline_member(broker, v5):
    topic = unique("share-off")
    cid = unique("offline")
    persistent = connect_props(SessionExpiryInterval=300)
    offline = v5(broker, client_id=cid, properties=persistent)
    offline.subscribe(f"$share/g/{topic}", qos=1)
    online = v5(broker)
    online.subscribe(f"$share/g/{topic}", qos=1)
    offline.disconnect()  # its session and shared subscription stay
    pub = v5(broker)
    sent = [f"m{i}".encode() for i in range(4)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    assert [m.payload for m in online.wait_messages(4, timeout=3)] == sent
    back = v5(broker, client_id=cid, clean_start=False, properties=persistent)
    assert back.connack.session_present is True
    back.expect_no_message(0.5)  # nothing was parked for it: nothing delivered twice
