"""Overlapping subscriptions of one MQTT 5 client (docs/mqtt.md): by default one copy at the
highest QoS carrying every matching Subscription Identifier; with
`mqtt.overlapping = "per_subscription"` one copy per subscription, as Mosquitto sends."""
import pytest

from helpers import unique
from v5util import connect_props, sub_ids, subscribe_props, v5  # noqa: F401  (fixture)


def _subscribe_overlapping(v5, broker, base, **kw):
    """A v5 client subscribed to `base/+` (id 1, QoS 0) and `base/#` (id 2, QoS 1)."""
    sub = v5(broker, **kw)
    sub.subscribe(f"{base}/+", 0, properties=subscribe_props(SubscriptionIdentifier=1))
    sub.subscribe(f"{base}/#", 1, properties=subscribe_props(SubscriptionIdentifier=2))
    return sub


def _received(sub, n):
    """The first `n` messages and any more arriving within half a second: payload, QoS, ids."""
    got = sub.wait_messages(n) + sub.collect(0.5)
    return sorted((m.payload, m.qos, sorted(sub_ids(m))) for m in got)


@pytest.mark.braid_only
def test_one_copy_at_the_highest_qos_with_every_identifier(broker, v5):
    """Mosquitto sends v5 clients one copy per subscription, hence braid_only."""
    base = unique("ovl5")
    sub = _subscribe_overlapping(v5, broker, base)
    v5(broker).publish(f"{base}/b", b"once", qos=1)
    assert _received(sub, 1) == [(b"once", 1, [1, 2])]


def test_per_subscription_mode_sends_a_copy_each(make_broker, v5):
    broker = make_broker(braid={"mqtt.overlapping": "per_subscription"})
    base = unique("ovl5")
    sub = _subscribe_overlapping(v5, broker, base)
    v5(broker).publish(f"{base}/b", b"twice", qos=1)
    assert _received(sub, 2) == [(b"twice", 0, [1]), (b"twice", 1, [2])]


def test_a_shared_subscription_gets_its_own_copy(broker, v5):
    """A shared subscription's delivery is never merged with the client's other ones."""
    base = unique("ovl5")
    sub = v5(broker)
    sub.subscribe(f"{base}/+", 1, properties=subscribe_props(SubscriptionIdentifier=1))
    sub.subscribe(f"$share/g/{base}/#", 1, properties=subscribe_props(SubscriptionIdentifier=2))
    v5(broker).publish(f"{base}/b", b"two", qos=1)
    assert _received(sub, 2) == [(b"two", 1, [1]), (b"two", 1, [2])]


@pytest.mark.braid_only
def test_one_copy_across_a_restart(make_broker, v5, client_id):
    """Queued before the restart (both ids stored with it) and routed after it by the
    subscriptions reloaded from the store: one copy each time."""
    broker = make_broker()
    base = unique("ovl5")
    props = connect_props(SessionExpiryInterval=3600)
    _subscribe_overlapping(v5, broker, base, client_id=client_id, properties=props).disconnect()
    v5(broker).publish(f"{base}/b", b"before", qos=1)
    broker.stop()
    broker.start()
    v5(broker).publish(f"{base}/b", b"after", qos=1)
    again = v5(broker, client_id=client_id, clean_start=False, properties=props)
    assert again.connack.session_present is True
    assert _received(again, 2) == [(b"after", 1, [1, 2]), (b"before", 1, [1, 2])]
