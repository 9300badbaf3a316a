"""Presence (`sys.presence`, docs/mqtt.md): `$SYS/brokers/{node}/clients/{clientid}/connected`
and `.../disconnected` with EMQX's JSON fields, off by default, ACL-checked like every `$SYS`
topic. The watcher is mosquitto_sub and paho, the clients paho and mosquitto_pub."""
import json
import subprocess

import pytest
from paho.mqtt.client import MQTTv5

from helpers import wait_until
from test_admin_api import Api, admin_broker

pytestmark = pytest.mark.braid_only

CONNECTED = {"username", "ts", "sockport", "proto_ver", "proto_name", "keepalive", "ipaddress",
             "expiry_interval", "connected_at", "connack", "clientid", "clean_start"}
DISCONNECTED = {"username", "ts", "sockport", "reason", "proto_ver", "proto_name", "ipaddress",
                "disconnected_at", "clientid"}


def test_clients_coming_and_going_are_announced_with_emqx_fields(make_broker, connect, mosquitto_sub):
    b = make_broker(braid={"sys.presence": True})
    watcher = mosquitto_sub(b, ["$SYS/brokers/+/clients/#"], qos=0)
    dev = connect(b, client_id="dev1", protocol=MQTTv5, username="alice", password="-")
    [m] = watcher.wait_messages(1)
    assert m.topic == "$SYS/brokers/braid/clients/dev1/connected"
    body = json.loads(m.payload)
    assert set(body) == CONNECTED, body
    assert (body["clientid"], body["username"], body["proto_ver"], body["proto_name"]) == ("dev1", "alice", 5, "MQTT")
    assert (body["ipaddress"], body["sockport"], body["connack"], body["clean_start"]) == ("127.0.0.1", b.port, 0, True)
    dev.disconnect()
    [m] = watcher.wait_messages(1)
    assert m.topic == "$SYS/brokers/braid/clients/dev1/disconnected"
    body = json.loads(m.payload)
    assert set(body) == DISCONNECTED, body
    assert (body["clientid"], body["reason"]) == ("dev1", "normal")
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(b.port), "-i", "pub3", "-V", "mqttv311",
                    "-t", "x", "-m", "y"], check=True, timeout=10)
    got = [(m.topic, json.loads(m.payload)["proto_ver"]) for m in watcher.wait_messages(2)]
    assert got == [("$SYS/brokers/braid/clients/pub3/connected", 4),
                   ("$SYS/brokers/braid/clients/pub3/disconnected", 4)]


def test_presence_is_off_by_default(make_broker, connect, mosquitto_sub):
    b = make_broker()
    watcher = mosquitto_sub(b, ["$SYS/brokers/+/clients/#"], qos=0)
    connect(b, client_id="quiet").disconnect()
    watcher.expect_no_message(0.5)


def test_the_acl_decides_who_sees_presence(make_broker, connect, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text("allow user:ops subscribe $SYS/#\nallow all both t/#\n")
    b = make_broker(braid={"sys.presence": True, "acl.file": str(acl)})
    ops = connect(b, protocol=MQTTv5, username="ops", password="-")
    assert ops.subscribe("$SYS/brokers/+/clients/+/connected", 0) == [0]
    nosy = connect(b, client_id="nosy", protocol=MQTTv5, username="nosy", password="-")
    assert nosy.subscribe("$SYS/brokers/+/clients/+/connected", 0) == [0x87]
    connect(b, client_id="dev2", protocol=MQTTv5)
    got = [m.topic for m in ops.wait_messages(2)]
    assert got == ["$SYS/brokers/braid/clients/nosy/connected", "$SYS/brokers/braid/clients/dev2/connected"]
    nosy.expect_no_message(0.3)


def test_in_process_clients_are_not_announced(make_broker, connect, mosquitto_sub):
    b, port = admin_broker(make_broker, **{"sys.presence": True})
    # `#`, not `+`: an in-process client id (`$internal/sink/hook`) has levels of its own.
    watcher = mosquitto_sub(b, ["$SYS/brokers/+/clients/#"], qos=0)
    api = Api(port)
    # A sink made now connects its outbox's in-process client while the watcher listens.
    sink = {"name": "hook", "type": "http", "url": "http://127.0.0.1:9/in"}
    assert api.call("POST", "/api/v1/sinks", sink)[0] in (200, 201)
    wait_until(lambda: any(c["client_id"].startswith("$internal/sink/hook")
                           for c in api.get("/api/v1/clients?prefix=$internal/&state=connected")[1]["data"]),
               message="the sink's outbox client connected")
    connect(b, client_id="after", protocol=MQTTv5)
    got = [m.topic for m in watcher.wait_messages(1)]
    assert got == ["$SYS/brokers/braid/clients/after/connected"], "the outbox client was not announced"
    watcher.expect_no_message(0.3)
