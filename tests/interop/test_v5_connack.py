"""MQTT 5 CONNACK: advertised limits and features, assigned client id, Server Keep Alive, AUTH."""
import raw_v5 as r
from helpers import unique
from v5util import MOSQUITTO, connect_props, prop, raw5, v5  # noqa: F401  (fixtures)


def test_connack_reports_default_limits_and_features(broker, raw5):
    c = raw5(broker)
    ack = c.connect5(unique("ca"))
    assert ack.reason == 0
    p = ack.prop
    # An absent property means the spec's default; either way the effective value must be right.
    assert p(r.RETAIN_AVAILABLE, 1) == 1
    assert p(r.MAXIMUM_QOS, 2) == 2
    assert p(r.WILDCARD_SUBSCRIPTION_AVAILABLE, 1) == 1
    assert p(r.SUBSCRIPTION_IDENTIFIER_AVAILABLE, 1) == 1
    assert p(r.SHARED_SUBSCRIPTION_AVAILABLE, 1) == 1
    if MOSQUITTO:  # Mosquitto: Receive Maximum 20, Topic Alias Maximum 10, no packet size limit
        assert p(r.RECEIVE_MAXIMUM, 65535) >= 1
        assert p(r.TOPIC_ALIAS_MAXIMUM, 0) >= 1
    else:  # Braid's contract defaults
        assert p(r.RECEIVE_MAXIMUM) == 1024
        assert p(r.TOPIC_ALIAS_MAXIMUM) == 64
        assert p(r.MAXIMUM_PACKET_SIZE, 268435455) == 268435455
    assert p(r.ASSIGNED_CLIENT_IDENTIFIER) is None  # the client chose its id


def test_connack_reports_configured_limits(make_broker, raw5):
    b = make_broker(
        braid={"mqtt.max_packet_size": 1000, "mqtt.receive_maximum": 2, "mqtt.topic_alias_maximum": 5,
               "mqtt.retain_available": False, "mqtt.max_qos": 1},
        mosquitto=["max_packet_size 1000", "max_inflight_messages 2", "max_topic_alias 5",
                   "retain_available false", "max_qos 1"])
    ack = raw5(b).connect5(unique("cb"))
    assert ack.reason == 0
    assert ack.prop(r.MAXIMUM_PACKET_SIZE) == 1000
    assert ack.prop(r.RECEIVE_MAXIMUM) == 2
    assert ack.prop(r.TOPIC_ALIAS_MAXIMUM) == 5
    assert ack.prop(r.RETAIN_AVAILABLE) == 0
    assert ack.prop(r.MAXIMUM_QOS) == 1


def test_empty_client_id_gets_assigned_identifier_that_is_usable(broker, v5):
    c = v5(broker, client_id="", properties=connect_props(SessionExpiryInterval=300))
    assigned = prop(c.connack, "AssignedClientIdentifier")
    assert assigned, f"no Assigned Client Identifier in {c.connack.properties}"
    topic = unique("assigned")
    assert c.subscribe(topic, qos=1) == [1]
    c.publish(topic, b"self", qos=1)
    assert c.get_message().payload == b"self"
    c.disconnect()
    # The assigned id names a real session: resuming it finds the session and its subscription.
    again = v5(broker, client_id=assigned, clean_start=False,
               properties=connect_props(SessionExpiryInterval=300))
    assert again.connack.session_present is True
    assert prop(again.connack, "AssignedClientIdentifier") is None
    again.publish(topic, b"resumed", qos=1)
    assert again.get_message().payload == b"resumed"


def test_server_keep_alive_caps_client_keep_alive(make_broker, v5):
    b = make_broker(braid={"mqtt.max_keep_alive": 10}, mosquitto=["max_keepalive 10"])
    c = v5(b, keepalive=60)
    assert prop(c.connack, "ServerKeepAlive") == 10
    small = v5(b, keepalive=5)
    assert prop(small.connack, "ServerKeepAlive", 5) == 5


def test_unsupported_authentication_method_is_refused(broker, v5):
    c = v5(broker, properties=connect_props(AuthenticationMethod="SCRAM-SHA-1"), expect_success=False)
    assert c.connack.reason_code == 0x8C  # Bad authentication method
    assert c.wait_disconnected() is not None
