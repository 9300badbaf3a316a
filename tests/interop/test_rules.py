"""Rules (`[[rules]]`, docs/rules.md): a rule selects what clients publish with EMQX's SQL and
republishes its output; the API lists the rules with their counters and tests a rule on a sample;
a rule that does not compile keeps the broker from starting, naming the key and the position.
Publishers are mosquitto_pub and paho, the subscriber paho."""
import json
import subprocess
import time

import pytest

import helpers
from conftest import serve_refused
from test_admin_api import Api, admin_broker, metric

pytestmark = pytest.mark.braid_only

HOT = {
    "name": "hot",
    "sql": 'SELECT clientid, payload.temp AS temp, topic FROM "sensors/+/temp" WHERE payload.temp > 30',
    "actions": ["republish:alerts/${clientid}"],
}


def test_a_rule_republishes_what_its_where_selects(make_broker, connect):
    broker, port = admin_broker(make_broker, rules=[HOT])
    watcher = connect(broker)
    watcher.subscribe("alerts/#", qos=1)
    for temp in (31.5, 20):
        subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", "dev1", "-q", "1",
                        "-t", "sensors/dev1/temp", "-m", json.dumps({"temp": temp, "hum": 40})],
                       check=True, timeout=10)
    publisher = connect(broker, client_id="dev2")
    publisher.publish("sensors/dev2/temp", b"not json", qos=1)  # a string payload: no temp, no match
    publisher.publish("sensors/dev2/hum", json.dumps({"temp": 99}).encode(), qos=1)  # FROM does not match
    [m] = watcher.wait_messages(1)
    assert m.topic == "alerts/dev1"
    assert json.loads(m.payload) == {"clientid": "dev1", "temp": 31.5, "topic": "sensors/dev1/temp"}
    watcher.expect_no_message(0.5)
    status, body = Api(port).get("/api/v1/rules")
    assert status == 200
    [rule] = body["data"]
    assert (rule["name"], rule["matched"], rule["passed"], rule["failed"]) == ("hot", 1, 1, 0)
    status, text = Api(port).get("/metrics", raw=True)
    assert metric(text, "braid_rule_matched_total", rule="hot") == 1


def test_the_rule_tester_answers_the_output_or_names_the_problem(make_broker):
    _, port = admin_broker(make_broker)
    api = Api(port)
    status, body = api.call("POST", "/api/v1/rules/test", {
        "sql": 'SELECT payload.temp AS t, upper(clientid) AS who FROM "s/#" WHERE payload.temp > 3',
        "context": {"topic": "s/a", "payload": "{\"temp\": 5}", "clientid": "c1"},
    })
    assert (status, body) == (200, {"matched": True, "output": {"t": 5, "who": "C1"}})
    status, body = api.call("POST", "/api/v1/rules/test", {
        "sql": 'SELECT payload.temp FROM "s/#" WHERE payload.temp > 3',
        "context": {"topic": "s/a", "payload": "{\"temp\": 1}"},
    })
    assert (status, body) == (200, {"matched": False})
    status, body = api.call("POST", "/api/v1/rules/test", {
        "sql": 'SELECT clientid, keepalive FROM "$events/client_connected" WHERE keepalive < 60',
        "context": {"event": "client.connected", "clientid": "c1", "keepalive": 30},
    })
    assert (status, body) == (200, {"matched": True, "output": {"clientid": "c1", "keepalive": 30}})
    status, body = api.call("POST", "/api/v1/rules/test", {
        "sql": 'SELECT clientid FROM "$events/client_connected"', "context": {"event": "client.connectd"}})
    assert status == 400 and "client.connectd" in body["error"], body
    status, body = api.call("POST", "/api/v1/rules/test", {"sql": 'SELECT lenght(topic) FROM "s/#"'})
    assert status == 400 and "lenght" in body["error"] and "line 1, column" in body["error"], body
    status, body = api.call("POST", "/api/v1/rules/test", {"sql": "SELECT"})
    assert status == 400, body


@pytest.mark.parametrize("rule, key, words", [
    ({**HOT, "sql": 'SELECT paylod.temp FROM "s/#"'}, "rules[0].sql", "paylod"),
    ({**HOT, "sql": 'SELECT * FROM "s/#" GROUP BY topic'}, "rules[0].sql", "GROUP BY"),
    ({**HOT, "actions": ["pg_hot"]}, "rules[0].actions[0]", "no [[sinks]] has this name"),
    ({**HOT, "actions": ["republish:a/#"]}, "rules[0].actions[0]", "+ or #"),
    ({**HOT, "actions": []}, "rules[0].actions", "at least one action"),
])
def test_a_rule_that_does_not_compile_stops_the_start_naming_key_and_problem(rule, key, words, tmp_path):
    stderr = serve_refused(tmp_path, rules=[rule])
    assert key in stderr and words in stderr, stderr


def test_client_events_are_rule_sources(make_broker, connect):
    rules = [{"name": "seen", "actions": ["republish:events/${event}/${clientid}"],
              "sql": 'SELECT event, clientid, username, proto_ver, reason FROM '
                     '"$events/client_connected", "$events/client_disconnected"'}]
    broker, _ = admin_broker(make_broker, rules=rules)
    watcher = connect(broker)
    watcher.subscribe("events/#", qos=1)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", "dev9", "-u", "alice",
                    "-V", "mqttv5", "-t", "x", "-m", "y"], check=True, timeout=10)
    got = sorted((m.topic, json.loads(m.payload)) for m in watcher.wait_messages(2))
    assert got == [
        ("events/client.connected/dev9",  # a field the source lacks is null
         {"event": "client.connected", "clientid": "dev9", "username": "alice", "proto_ver": 5, "reason": None}),
        ("events/client.disconnected/dev9",
         {"event": "client.disconnected", "clientid": "dev9", "username": "alice", "proto_ver": 5,
          "reason": "normal"}),
    ], got


def test_message_events_are_rule_sources(make_broker, connect):
    rules = [{"name": "trail", "actions": ["republish:trail/${event}/${clientid}"],
              "sql": 'SELECT event, clientid, from_clientid, topic, qos, payload, reason FROM '
                     '"$events/message_delivered", "$events/message_acked", "$events/message_dropped"'}]
    broker, _ = admin_broker(make_broker, rules=rules)
    watcher = connect(broker, client_id="watcher")
    watcher.subscribe("trail/#", qos=0)
    subscriber = connect(broker, client_id="reader")
    subscriber.subscribe("orders/#", qos=1)
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", "shop", "-q", "1",
                    "-t", "orders/1", "-m", "two apples"], check=True, timeout=10)
    assert subscriber.wait_messages(1)[0].payload == b"two apples"
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", "shop", "-q", "1",
                    "-t", "nobody/here", "-m", "lost"], check=True, timeout=10)
    got = {m.topic: json.loads(m.payload) for m in watcher.wait_messages(3)}
    assert got["trail/message.delivered/reader"] == {
        "event": "message.delivered", "clientid": "reader", "from_clientid": "shop", "topic": "orders/1",
        "qos": 1, "payload": "two apples", "reason": None}, got
    assert got["trail/message.acked/reader"]["from_clientid"] == "shop", got
    assert got["trail/message.dropped/shop"]["reason"] == "no_subscribers", got
    watcher.expect_no_message(0.5)


def test_a_republish_sink_templates_payload_qos_retain_and_user_properties(make_broker, connect):
    from paho.mqtt.client import MQTTv5
    rule = {"name": "hot", "actions": ["again"],
            "sql": 'SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30'}
    sink = {"name": "again", "type": "republish", "topic": "alerts/${clientid}", "body": "${temp} C", "qos": 1,
            "retain": True, "user_properties": {"device": "${clientid}"}}
    broker, _ = admin_broker(make_broker, rules=[rule], sinks=[sink])
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", "dev7", "-q", "1",
                    "-t", "sensors/dev7/temp", "-m", json.dumps({"temp": 35})], check=True, timeout=10)
    late = connect(broker, client_id="late", protocol=MQTTv5)
    late.subscribe("alerts/#", qos=1)
    [m] = late.wait_messages(1)
    assert (m.topic, m.payload, m.qos, m.retain) == ("alerts/dev7", b"35 C", 1, True), m
    assert m.properties.UserProperty == [("device", "dev7")], m.properties


def test_a_republish_sink_with_a_url_is_refused(tmp_path):
    sink = {"name": "again", "type": "republish", "topic": "a", "url": "mqtt://h"}
    stderr = serve_refused(tmp_path, sinks=[sink])
    assert "sinks[0].url" in stderr and "no url" in stderr, stderr
