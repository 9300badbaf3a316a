"""The HTTP admin listener: Prometheus metrics (checked by Prometheus's own promtool), the REST
API under /api/v1 (driven with Python's urllib, an independent HTTP client), API keys made with
`braid apikey`, and `braid ctl` over the same API. MQTT traffic comes from paho-mqtt and
mosquitto_pub/mosquitto_sub."""
import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from paho.mqtt.client import MQTTv5

import helpers
from bridgeutil import BridgedBraid
from conftest import BRAID_BIN, free_port

pytestmark = pytest.mark.braid_only


class Api:
    """A JSON client of one broker's admin listener."""

    def __init__(self, port, key=None, scheme="http"):
        self.base = f"{scheme}://127.0.0.1:{port}"
        self.key = key

    def call(self, method, path, body=None, headers=None, raw=False):
        data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.key:
            req.add_header("Authorization", f"Bearer {self.key}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read().decode()
                return r.status, (text if raw else (json.loads(text) if text else None))
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            return e.code, (json.loads(text) if text.startswith("{") else text)

    def get(self, path, **kw):
        return self.call("GET", path, **kw)


def admin_broker(make_broker, **extra):
    port = free_port()
    b = make_broker(braid={"listeners.http": f"127.0.0.1:{port}", **extra})
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).read()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.05)
    return b, port


def ctl(port, *args, key=None):
    env = dict(os.environ, BRAID_CTL_URL=f"http://127.0.0.1:{port}")
    if key:
        env["BRAID_API_KEY"] = key
    return subprocess.run([BRAID_BIN, "ctl", *args], capture_output=True, text=True, timeout=30, env=env)


def metric(text, name, **labels):
    """The value of one sample in a Prometheus exposition."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{want}}}" if want else name):
            return float(value)
    raise AssertionError(f"no sample {name}{{{want}}} in:\n{text}")


def test_metrics_pass_promtool_and_move_with_traffic(make_broker, connect):
    if not shutil.which("promtool"):
        pytest.fail("promtool is missing: scripts/install-test-deps installs Debian's prometheus package")
    # No $SYS: its retained topics would be counted too.
    b, port = admin_broker(make_broker, **{"sys.interval_secs": 0})
    api = Api(port)
    status, before = api.get("/metrics", raw=True)
    assert status == 200
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe("m/#", qos=1)
    pub = connect(b)
    for i in range(5):
        pub.publish("m/x", f"{i}", qos=1)
    pub.publish("m/r", "kept", qos=0, retain=True)
    sub.wait_messages(6)
    status, after = api.get("/metrics", raw=True)
    assert status == 200
    check = subprocess.run(["promtool", "check", "metrics"], input=after, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert metric(after, "braid_messages_received_total", qos="1") - metric(before, "braid_messages_received_total", qos="1") == 5
    assert metric(after, "braid_messages_sent_total", qos="1") >= 5
    assert metric(after, "braid_clients_connected", transport="tcp") == 2
    assert metric(after, "braid_connections_accepted_total", transport="tcp") >= 2
    assert metric(after, "braid_retained_messages") == 1
    assert metric(after, "braid_subscriptions") >= 1
    assert metric(after, "braid_store_fsync_seconds_count") > 0, "the disk store synced and counted it"
    assert metric(after, "braid_store_disk_bytes") > 0
    # A refused CONNECT is counted by its reason.
    bad = helpers.MqttClient(b, client_id="$internal/nope", protocol=MQTTv5)
    try:
        bad.connect(expect_success=False)
    finally:
        bad.close()
    _, text = api.get("/metrics", raw=True)
    assert metric(text, "braid_connections_refused_total", reason="client_identifier_not_valid") == 1


def test_clients_detail_kick_and_subscriptions(make_broker, connect):
    b, port = admin_broker(make_broker)
    api = Api(port)
    c = connect(b, client_id="api-kick-me", protocol=MQTTv5, properties=helpers.v5_properties(
        helpers.PacketTypes.CONNECT, SessionExpiryInterval=300))
    c.subscribe("k/#", qos=1)
    other = connect(b, client_id="api-other")
    status, page = api.get("/api/v1/clients?prefix=api-&state=connected")
    assert status == 200
    assert [x["client_id"] for x in page["data"]] == ["api-kick-me", "api-other"]
    assert page["meta"]["count"] == 2
    status, second = api.get("/api/v1/clients?prefix=api-&limit=1&page=2")
    assert [x["client_id"] for x in second["data"]] == ["api-other"]
    assert second["meta"] == {"page": 2, "limit": 1, "count": 2}
    status, far = api.get("/api/v1/clients?page=18446744073709551615&limit=1000")
    assert (status, far["data"]) == (200, [])
    status, one = api.get("/api/v1/clients/api-kick-me")
    assert status == 200
    assert (one["connected"], one["transport"], one["protocol"], one["persistent"]) == (True, "tcp", 5, True)
    assert [s["filter"] for s in one["subscriptions"]] == ["k/#"]
    assert one["subscriptions"][0]["qos"] == 1
    # An operator adds a subscription; messages reach the client through it.
    status, r = api.call("POST", "/api/v1/clients/api-kick-me/subscriptions", {"filter": "extra/+", "qos": 1})
    assert status == 201, r
    helpers.mosquitto_pub(b, "extra/1", "via-admin", qos=1)
    [m] = c.wait_messages(1)
    assert (m.topic, m.payload) == ("extra/1", b"via-admin")
    status, subs = api.get("/api/v1/subscriptions?filter=extra%2F%2B")
    assert [(s["client_id"], s["filter"]) for s in subs["data"]] == [("api-kick-me", "extra/+")]
    assert api.call("DELETE", "/api/v1/clients/api-kick-me/subscriptions?filter=extra%2F%2B")[0] == 204
    assert api.call("DELETE", "/api/v1/clients/api-kick-me/subscriptions?filter=extra%2F%2B")[0] == 404
    # Kick: the v5 client gets DISCONNECT 0x98; its persistent session stays, offline.
    assert api.call("DELETE", "/api/v1/clients/api-kick-me")[0] == 204
    rc = c.wait_disconnected()
    assert int(getattr(rc, "value", rc)) == 0x98
    deadline = time.time() + 5
    while api.get("/api/v1/clients/api-kick-me")[1]["connected"] and time.time() < deadline:
        time.sleep(0.05)
    status, one = api.get("/api/v1/clients/api-kick-me")
    assert (status, one["connected"]) == (200, False)
    assert api.call("DELETE", "/api/v1/clients/api-kick-me")[0] == 409
    assert other.is_connected()


def test_retained_list_get_delete_and_publish(make_broker, connect):
    b, port = admin_broker(make_broker)
    api = Api(port)
    helpers.mosquitto_pub(b, "r/a", "one", qos=1, retain=True)
    helpers.mosquitto_pub(b, "r/b/c", bytes([0xff, 0x00]), qos=1, retain=True)
    status, page = api.get("/api/v1/retained?filter=r%2F%23")
    assert status == 200
    assert [(x["topic"], x["payload_encoding"]) for x in page["data"]] == [("r/a", "plain"), ("r/b/c", "base64")]
    assert base64.b64decode(page["data"][1]["payload"]) == b"\xff\x00"
    status, one = api.get("/api/v1/retained/r/a")
    assert (status, one["payload"]) == (200, "one")
    watcher = connect(b)
    watcher.subscribe("r/#", qos=1)
    watcher.drain()
    assert api.call("DELETE", "/api/v1/retained/r/a")[0] == 204
    assert api.get("/api/v1/retained/r/a")[0] == 404
    late = connect(b)
    late.subscribe("r/#", qos=1)
    assert [m.topic for m in late.wait_messages(1)] == ["r/b/c"]
    late.expect_no_message()
    # Publish through the API, with properties, to an MQTT 5 subscriber.
    v5 = connect(b, protocol=MQTTv5)
    v5.subscribe("p/#", qos=1)
    status, r = api.call("POST", "/api/v1/publish", {
        "topic": "p/1", "payload": "aGk=", "payload_encoding": "base64", "qos": 1,
        "properties": {"content_type": "text/plain", "user_properties": [["k", "v"]]}})
    assert (status, r["reason"]) == (200, "Success"), r
    [m] = v5.wait_messages(1)
    assert (m.topic, m.payload, m.qos) == ("p/1", b"hi", 1)
    assert m.properties.ContentType == "text/plain"
    assert ("k", "v") in m.properties.UserProperty


@pytest.mark.parametrize("method,path,body,status,words", [
    ("GET", "/api/v1/clients/nobody", None, 404, "no session"),
    ("POST", "/api/v1/publish", b"{not json", 400, "JSON"),
    ("POST", "/api/v1/publish", {"topic": "a/#"}, 400, "not a valid topic name"),
    ("POST", "/api/v1/publish", {"topic": "$SYS/x"}, 400, "$SYS"),
    ("POST", "/api/v1/publish", {"topic": "a", "qos": 3}, 400, "qos"),
    ("POST", "/api/v1/publish", {"topic": "a", "bogus": 1}, 422, "bogus"),
    ("POST", "/api/v1/publish", {"topic": "a", "payload": "!!", "payload_encoding": "base64"}, 400, "base64"),
    ("GET", "/api/v1/retained?filter=a%2F%23%2Fb", None, 400, "not a valid topic filter"),
    ("GET", "/api/v1/clients?page=0", None, 400, "page"),
    ("GET", "/api/v1/clients?state=sleeping", None, 400, "state"),
    ("GET", "/api/v1/clients?transport=pigeon", None, 400, "transport"),
    ("POST", "/api/v1/clients/nobody/subscriptions", {"filter": "a"}, 404, "no session"),
    ("GET", "/api/v1/nothing-here", None, 404, "no such endpoint"),
    ("GET", "/nothing-here", None, 404, "no such page"),
    ("PUT", "/api/v1/publish", {"topic": "a"}, 405, "not allowed"),
    ("DELETE", "/api/v1/retained/$SYS/broker/uptime", None, 403, "$SYS"),
    ("DELETE", "/api/v1/clients/$internal%2Fbridge%2Fx", None, 403, "in-process"),
    ("POST", "/api/v1/clients/$internal%2Fbridge%2Fx/subscriptions", {"filter": "a"}, 403, "in-process"),
])
def test_bad_requests_get_a_4xx_naming_the_problem(make_broker, method, path, body, status, words):
    b, port = admin_broker(make_broker)
    got, reply = Api(port).call(method, path, body)
    assert got == status, reply
    assert words in reply["error"], reply
    assert reply["code"]


def test_an_oversized_body_is_refused_with_413(make_broker):
    b, port = admin_broker(make_broker, **{"admin.max_body_bytes": 1000})
    got, reply = Api(port).call("POST", "/api/v1/publish", {"topic": "a", "payload": "x" * 5000})
    assert got == 413


def test_api_keys_from_braid_apikey_guard_everything_but_health(make_broker, tmp_path, connect):
    keys = tmp_path / "keys"
    made = subprocess.run([BRAID_BIN, "apikey", "add", str(keys), "ops"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("braid_") and key not in keys.read_text()
    assert oct(keys.stat().st_mode & 0o777) == "0o600"
    b, port = admin_broker(make_broker, **{"admin.api_keys_file": str(keys)})
    assert Api(port).get("/api/v1/health")[0] == 200
    status, reply = Api(port).get("/api/v1/clients")
    assert status == 401 and "API key" in reply["error"]
    assert Api(port, key="braid_wrong").get("/metrics", raw=True)[0] == 401
    assert Api(port, key=key).get("/api/v1/clients")[0] == 200
    basic = base64.b64encode(f"ops:{key}".encode()).decode()
    assert Api(port).get("/metrics", raw=True, headers={"Authorization": f"Basic {basic}"})[0] == 200
    wrong_name = base64.b64encode(f"dev:{key}".encode()).decode()
    assert Api(port).get("/metrics", raw=True, headers={"Authorization": f"Basic {wrong_name}"})[0] == 401
    # A second key, loaded on reload (POST /api/v1/reload = SIGHUP), without a restart.
    second = subprocess.run([BRAID_BIN, "apikey", "add", str(keys), "ci"], capture_output=True, text=True).stdout.strip()
    assert Api(port, key=second).get("/api/v1/stats")[0] == 401
    assert Api(port, key=key).call("POST", "/api/v1/reload")[0] == 200
    deadline = time.time() + 5
    while Api(port, key=second).get("/api/v1/stats")[0] != 200:
        assert time.time() < deadline, "the new key was not loaded on reload"
        time.sleep(0.1)
    listed = subprocess.run([BRAID_BIN, "apikey", "list", str(keys)], capture_output=True, text=True).stdout.split()
    assert listed == ["ci", "ops"]


def test_a_non_loopback_admin_listener_without_keys_is_refused_at_start(tmp_path):
    r = subprocess.run([BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                        "--set", f'store.data_dir="{tmp_path}"', "--set", 'listeners.http="0.0.0.0:0"'],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "listeners.http" in r.stderr and "admin.api_keys_file" in r.stderr, r.stderr


def test_a_second_broker_on_a_taken_address_says_what_to_do(make_broker, tmp_path):
    """A second `braid serve` on the same machine whose admin (or QUIC) address the first holds
    stops with status 1, naming the key and how to move it or turn it off."""
    _, port = admin_broker(make_broker)

    def second(*sets):
        return subprocess.run([BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                               "--set", f'store.data_dir="{tmp_path}"', *sets],
                              capture_output=True, text=True, timeout=30)

    r = second("--set", "quic.enabled=false", "--set", f'listeners.http="127.0.0.1:{port}"')
    assert r.returncode == 1, r.stderr
    assert f"listeners.http: cannot listen on 127.0.0.1:{port}" in r.stderr, r.stderr
    assert "another broker on this machine? Set listeners.http to another address" in r.stderr, r.stderr
    assert """--set 'listeners.http=\"\"'""" in r.stderr, r.stderr
    # The QUIC listener, on by default at 0.0.0.0:14567, is the other port two brokers share.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        quic = taken.getsockname()[1]
        r = second("--set", f'listeners.quic="127.0.0.1:{quic}"', "--set", 'listeners.http=""')
    assert r.returncode == 1, r.stderr
    assert f"listeners.quic: cannot listen on 127.0.0.1:{quic}" in r.stderr, r.stderr
    assert "Set listeners.quic to another address" in r.stderr and "quic.enabled=false" in r.stderr, r.stderr


def test_braid_ctl_lists_kicks_publishes_and_reports_errors(make_broker, connect):
    b, port = admin_broker(make_broker)
    c = connect(b, client_id="ctl-target", protocol=MQTTv5)
    c.subscribe("ctl/#", qos=1)
    r = ctl(port, "clients", "--prefix", "ctl-")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["client_id", "connected", "transport"]
    assert lines[1].split()[:3] == ["ctl-target", "true", "tcp"]
    r = ctl(port, "publish", "ctl/x", "from-ctl", "-q", "1")
    assert r.returncode == 0, r.stderr
    [m] = c.wait_messages(1)
    assert (m.topic, m.payload) == ("ctl/x", b"from-ctl")
    assert "ctl/#" in ctl(port, "subs", "--client", "ctl-target").stdout
    r = ctl(port, "kick", "ctl-target")
    assert (r.returncode, r.stdout.strip()) == (0, "kicked ctl-target")
    assert int(getattr(c.wait_disconnected(), "value", 0)) == 0x98
    r = ctl(port, "client", "nobody")
    assert r.returncode == 1 and "404" in r.stderr and "no session" in r.stderr
    status = ctl(port, "--json", "status")
    assert json.loads(status.stdout)["connections"]["accepted"]["tcp"] >= 1
    assert "braid_messages_received_total" in ctl(port, "metrics").stdout


def test_reload_applies_limits_live_names_restart_keys_and_refuses_a_bad_file(tmp_path, connect):
    """SIGHUP (here through POST /api/v1/reload) reads the file again: limits change without
    dropping anyone, a key that needs a restart is named, a bad file is refused whole."""
    conf = tmp_path / "braid.toml"

    def write(max_connections, extra=""):
        conf.write_text(f'[limits]\nmax_connections = {max_connections}\n[sys]\ninterval_secs = 0\n{extra}')

    write(2)
    b = BridgedBraid(conf.read_text(), str(tmp_path / "b"), "reload")
    try:
        api = Api(int(b.admin_url().rsplit(":", 1)[1]))
        first = [connect(b) for _ in range(2)]
        refused = helpers.MqttClient(b)
        with pytest.raises(Exception):
            refused.connect(timeout=2)
        refused.close()
        write(5, '[mqtt]\nmax_qos = 1\n')
        with open(b.config_file, "w") as f:
            f.write(conf.read_text())
        status, r = api.call("POST", "/api/v1/reload")
        assert status == 200, r
        assert r["changed"] == ["limits.max_connections"], r
        assert r["restart_needed"] == ["mqtt.max_qos"], r
        more = [connect(b) for _ in range(3)]
        assert all(c.is_connected() for c in first + more), "nobody was dropped by the reload"
        # A file that does not load is refused whole; the running configuration stays.
        with open(b.config_file, "w") as f:
            f.write(conf.read_text() + "\n[limits]\nmax_connections = -1\n")
        status, r = api.call("POST", "/api/v1/reload")
        assert status == 400 and "the running one stays" in r["error"], r
        assert all(c.is_connected() for c in first + more)
        assert "SIGHUP: the new configuration is refused" in b.log_text()
    finally:
        b.stop()


def test_packet_traces_of_a_client_and_a_topic(make_broker, connect):
    b, port = admin_broker(make_broker)
    api = Api(port)
    assert api.call("POST", "/api/v1/traces", {"name": "c", "client_id": "tr-1", "duration_secs": 60})[0] == 201
    status, t = api.call("POST", "/api/v1/traces", {"name": "t", "topic": "tr/#"})
    assert status == 201 and t["type"] == "topic" and t["remaining_secs"] >= 299, t
    assert api.call("POST", "/api/v1/traces", {"name": "t", "topic": "x"})[0] == 409
    assert api.call("POST", "/api/v1/traces", {"name": "x", "topic": "a", "client_id": "b"})[0] == 400
    assert api.call("POST", "/api/v1/traces", {"name": "x", "topic": "a/#/b"})[0] == 400
    sub = connect(b, client_id="tr-1", protocol=MQTTv5)
    sub.subscribe("tr/#", qos=1)
    pub = connect(b, client_id="tr-2")
    pub.publish("tr/x", "hello", qos=1)
    pub.publish("nottr/y", "no", qos=1)
    sub.wait_messages(1)
    time.sleep(0.3)
    status, listed = api.get("/api/v1/traces")
    assert sorted(x["name"] for x in listed["data"]) == ["c", "t"]
    status, client_log = api.get("/api/v1/traces/c/log", raw=True)
    assert status == 200
    assert 'client="tr-1" in Subscribe' in client_log, client_log
    assert 'client="tr-1" out PUBLISH topic="tr/x" qos=1' in client_log, client_log
    assert 'client="tr-1" in PubAck' in client_log, client_log
    assert "tr-2" not in client_log
    status, topic_log = api.get("/api/v1/traces/t/log", raw=True)
    assert 'client="tr-2" in PUBLISH topic="tr/x" qos=1 retain=false dup=false id=' in topic_log, topic_log
    assert 'payload="hello"' in topic_log and "nottr" not in topic_log, topic_log
    status, stopped = api.call("DELETE", "/api/v1/traces/c")
    assert status == 200 and stopped["packets"] >= 4, stopped
    assert api.call("DELETE", "/api/v1/traces/c")[0] == 404
    assert os.path.exists(stopped["path"]), "the file stays after the trace stops"
    # A trace ends by itself at its deadline.
    assert api.call("POST", "/api/v1/traces", {"name": "short", "client_id": "x", "duration_secs": 1})[0] == 201
    deadline = time.time() + 5
    while "short" in [x["name"] for x in api.get("/api/v1/traces")[1]["data"]]:
        assert time.time() < deadline, "the trace did not end at its deadline"
        time.sleep(0.1)
