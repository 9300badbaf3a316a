"""Small MQTT 5 additions to helpers.py for the test_v5_*.py files (fixtures and checks)."""
import pytest

import helpers
from helpers import MQTTv5, PacketTypes, v5_properties
from raw_v5 import Raw5

MOSQUITTO = helpers.mosquitto_target()
"""Running against Mosquitto (reference run): a few checks are relaxed where it deviates."""


def rc(code):
    """int of a paho ReasonCode (or None)."""
    if code is None:
        return None
    return int(code.value) if hasattr(code, "value") else int(code)


def connect_props(**values):
    return v5_properties(PacketTypes.CONNECT, **values)


def publish_props(**values):
    return v5_properties(PacketTypes.PUBLISH, **values)


def subscribe_props(**values):
    return v5_properties(PacketTypes.SUBSCRIBE, **values)


def disconnect_props(**values):
    return v5_properties(PacketTypes.DISCONNECT, **values)


def prop(obj, name, default=None):
    """A v5 property from paho Properties (or a Msg / ConnAck carrying them), default if absent."""
    props = getattr(obj, "properties", obj)
    if props is None:
        return default
    return getattr(props, name, default)


def user_props(msg):
    return list(prop(msg, "UserProperty", []) or [])


def sub_ids(msg):
    """Subscription Identifiers of a received message as a list of ints (paho gives int or list)."""
    v = prop(msg, "SubscriptionIdentifier", [])
    return list(v) if isinstance(v, (list, tuple)) else [v]


def resolve_aliases(msgs):
    """Topics of messages received in order, resolving broker->client Topic Aliases the way a v5
    client must (paho 2.x does not: it reports an empty topic for an aliased PUBLISH)."""
    aliases, out = {}, []
    for m in msgs:
        alias = prop(m, "TopicAlias")
        topic = m.topic
        if alias is not None:
            if topic:
                aliases[alias] = topic
            else:
                assert alias in aliases, f"Topic Alias {alias} used before it was set"
                topic = aliases[alias]
        out.append(topic)
    return out


@pytest.fixture
def v5(connect):
    """Factory: ``v5(broker, **connect_client kwargs)`` -> a connected paho MQTTv5 MqttClient
    (conftest's ``connect`` with protocol=MQTTv5; closed at the end of the test)."""
    def make(broker, **kw):
        return connect(broker, protocol=MQTTv5, **kw)

    return make


@pytest.fixture
def raw5():
    """Factory: ``raw5(broker)`` -> a :class:`raw_v5.Raw5` socket (not yet MQTT-connected);
    all are closed at the end of the test."""
    made = []

    def make(broker):
        c = Raw5(broker)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
