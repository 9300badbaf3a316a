"""MQTT 5 subscription options and reason codes: Retain Handling, Retain As Published, No Local,
Subscription Identifiers, UNSUBACK reason codes."""
import pytest

from helpers import SubscribeOptions, unique
from v5util import sub_ids, subscribe_props, v5  # noqa: F401  (fixtures)


def _opts(qos=1, **kw):
    return SubscribeOptions(qos=qos, **kw)


@pytest.mark.parametrize("handling, first, again", [(0, True, True), (1, True, False), (2, False, False)],
                         ids=["rh0-always", "rh1-new-only", "rh2-never"])
def test_retain_handling(broker, v5, handling, first, again):
    topic = unique("rh")
    v5(broker).publish(topic, b"retained", qos=1, retain=True)
    sub = v5(broker)
    opts = _opts(retainHandling=handling)
    sub.subscribe(topic, opts)
    if first:
        m = sub.get_message(timeout=3)
        assert (m.payload, m.retain) == (b"retained", True)
    sub.expect_no_message(0.3)
    sub.subscribe(topic, opts)  # the same subscription again: it now exists
    if again:
        m = sub.get_message(timeout=3)
        assert (m.payload, m.retain) == (b"retained", True)
    else:
        sub.expect_no_message(0.4)


def test_retain_as_published_on_live_messages(broker, v5):
    topic = unique("rap")
    keep, clear = v5(broker), v5(broker)
    keep.subscribe(topic, _opts(retainAsPublished=True))
    clear.subscribe(topic, _opts(retainAsPublished=False))
    pub = v5(broker)
    pub.publish(topic, b"live retained", qos=1, retain=True)
    pub.publish(topic, b"live plain", qos=1, retain=False)
    k = keep.wait_messages(2)
    c = clear.wait_messages(2)
    assert [(m.payload, m.retain) for m in k] == [(b"live retained", True), (b"live plain", False)]
    assert [(m.payload, m.retain) for m in c] == [(b"live retained", False), (b"live plain", False)]
    # A new subscription still gets the stored retained message with RETAIN set, whatever RAP says.
    late = v5(broker)
    late.subscribe(topic, _opts(retainAsPublished=False))
    m = late.get_message(timeout=3)
    assert (m.payload, m.retain) == (b"live retained", True)
    v5(broker).publish(topic, b"", qos=1, retain=True)  # clear it


def test_no_local(broker, v5):
    topic = unique("nolocal")
    me, other = v5(broker), v5(broker)
    me.subscribe(topic, _opts(noLocal=True))
    other.subscribe(topic, _opts())
    me.publish(topic, b"from me", qos=1)
    assert other.get_message(timeout=3).payload == b"from me"
    other.publish(topic, b"from other", qos=1)
    assert me.get_message(timeout=3).payload == b"from other"  # others' messages still arrive
    assert other.get_message(timeout=3).payload == b"from other"
    me.expect_no_message(0.3)


def test_subscription_identifiers_on_overlapping_subscriptions(broker, v5):
    base = unique("subid")
    sub = v5(broker)
    sub.subscribe(f"{base}/#", _opts(), properties=subscribe_props(SubscriptionIdentifier=1))
    sub.subscribe(f"{base}/a/+", _opts(), properties=subscribe_props(SubscriptionIdentifier=2))
    sub.subscribe(f"{base}/other", _opts(), properties=subscribe_props(SubscriptionIdentifier=3))
    sub.subscribe(f"{base}/plain", _opts())  # no identifier
    pub = v5(broker)
    pub.publish(f"{base}/a/b", b"both", qos=1)
    got = sub.collect(0.7)
    # One copy per matching subscription (each with its own id) or one copy carrying both ids.
    assert 1 <= len(got) <= 2, got
    assert all(m.payload == b"both" and m.topic == f"{base}/a/b" for m in got)
    ids = [sub_ids(m) for m in got]
    assert all(i and set(i) <= {1, 2} for i in ids), ids
    assert sorted(x for i in ids for x in i) == [1, 2], ids
    # Only the first subscription matches this one: exactly id 1, once.
    pub.publish(f"{base}/x", b"one", qos=1)
    [m] = sub.collect(0.5)
    assert sub_ids(m) == [1]
    # A subscription without an identifier adds none.
    pub.publish(f"{base}/plain", b"plain", qos=1)
    got = sub.collect(0.5)
    assert sorted(x for m in got for x in sub_ids(m)) == [1], [sub_ids(m) for m in got]


def test_unsubscribe_reason_codes(broker, v5):
    topic = unique("unsub")
    c = v5(broker)
    c.subscribe(topic, _opts())
    assert c.unsubscribe([topic, unique("never-subscribed")]) == [0x00, 0x11]
    assert c.unsubscribe(topic) == [0x11]  # gone now
