"""The `http` sink (`[[sinks]]`, docs/rules.md): a rule's outputs go through the sink's durable
outbox to an HTTP service, a real server these tests run (Python's http.server), with the URL,
headers and body filled from the output. 2xx is success; 4xx is counted as failed and not sent
again; 5xx, timeouts and a stopped server are sent again until the server takes them, while
nothing acknowledged is lost, subscribers are not slowed, and a kill -9 of Braid loses nothing
that waited in the outbox. Publishers are mosquitto_pub and paho. A malformed sink is refused
at start, naming the key and the problem."""
import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import BRAID_BIN, free_port
from test_admin_api import Api, admin_broker, metric

pytestmark = pytest.mark.braid_only


class Target:
    """A real HTTP server on a free loopback port that records what it is sent; `answer(body)`
    gives the status for a request (and may sleep first), 200 by default."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.requests = []  # (method, path, headers in lower case, body) of every request
        self.taken = []  # bodies of the requests answered 2xx
        self.answer = lambda body: 200
        self.lock = threading.Lock()
        self.connections = set()  # kept-alive connections, cut by stop()
        self.server = None
        self.start()

    def start(self):
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with target.lock:
                    target.connections.add(self.connection)

            def handle_any(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
                with target.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    target.requests.append((self.command, self.path, headers, body))
                status = target.answer(body)
                if 200 <= status < 300:
                    with target.lock:
                        target.taken.append(body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            do_POST = do_PUT = handle_any

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        """Stops listening and cuts every connection: the server is away."""
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for c in self.connections:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.connections.clear()

    def wait_taken(self, n, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if len(self.taken) >= n:
                    return list(self.taken)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.taken)} of {n} outputs taken within {timeout}s: {self.taken[-5:]}")


@pytest.fixture
def target():
    t = Target()
    yield t
    t.stop()


def sink_broker(make_broker, target, sink=None, rule=None, **settings):
    """A broker with rule `hot` (temp > 30 on sensors/+/temp) sending to the http sink `hook`."""
    rule = {"name": "hot", "actions": ["hook"],
            "sql": 'SELECT id, clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30',
            **(rule or {})}
    sink = {"name": "hook", "type": "http", "url": f"http://127.0.0.1:{target.port}/ingest", **(sink or {})}
    return admin_broker(make_broker, rules=[rule], sinks=[sink], **settings)


def pub(broker, client_id, temp, qos=1):
    subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(broker.port), "-i", client_id, "-q", str(qos),
                    "-t", f"sensors/{client_id}/temp", "-m", json.dumps({"temp": temp})], check=True, timeout=10)


def sink_counts(port):
    status, body = Api(port).get("/api/v1/sinks")
    assert status == 200, body
    [sink] = body["data"]
    return sink


def wait_for(what, check, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_outputs_arrive_with_url_headers_and_body_from_templates(make_broker, connect, target):
    broker, port = sink_broker(make_broker, target, sink={
        "method": "PUT", "url": f"http://127.0.0.1:{target.port}/ingest/${{clientid}}",
        "headers": {"x-device": "${clientid}", "content-type": "application/x-braid"},
        "body": '{"device": "${clientid}", "t": ${temp}}'})
    pub(broker, "dev1", 31.5)
    pub(broker, "dev1", 12)  # WHERE does not hold: not sent
    paho = connect(broker, client_id="dev2")
    assert paho.publish("sensors/dev2/temp", json.dumps({"temp": 40}), qos=1) == 0
    taken = target.wait_taken(2)
    assert sorted((json.loads(b) for b in taken), key=lambda o: o["device"]) == \
        [{"device": "dev1", "t": 31.5}, {"device": "dev2", "t": 40}]
    by_path = {r[1]: r for r in target.requests}
    method, _, headers, _ = by_path["/ingest/dev1"]
    assert method == "PUT"
    assert headers["x-device"] == "dev1" and headers["content-type"] == "application/x-braid"
    sink = wait_for("sent counted", lambda: (s := sink_counts(port))["sent"] == 2 and s)
    assert (sink["name"], sink["kind"], sink["state"], sink["failed"], sink["queued"]) == \
        ("hook", "http", "up", 0, 0)
    _, text = Api(port).get("/metrics", raw=True)
    assert metric(text, "braid_sink_sent_total", kind="http", sink="hook") == 2
    assert metric(text, "braid_sink_up", kind="http", sink="hook") == 1
    assert metric(text, "braid_sink_write_seconds_count", kind="http", sink="hook") >= 1
    assert metric(text, "braid_sink_write_seconds_bucket", kind="http", sink="hook", le="+Inf") >= 1
    # The same counters under $SYS, every sys.interval_secs (1 s here).
    sys_watcher = connect(broker, client_id="sys-watcher")
    sys_watcher.subscribe("$SYS/sinks/http/hook/#", qos=0)
    wait_for("$SYS says sent 2 and state up", lambda: {
        (m.topic, m.payload) for m in sys_watcher.received} >= {
        ("$SYS/sinks/http/hook/sent", b"2"), ("$SYS/sinks/http/hook/state", b"up")}, timeout=10)


def test_the_default_body_is_the_output_as_json_with_a_unique_id(make_broker, target):
    broker, _ = sink_broker(make_broker, target)
    for temp in (31, 32, 33):
        pub(broker, "dev1", temp)
    outputs = [json.loads(b) for b in target.wait_taken(3)]
    assert sorted(o["temp"] for o in outputs) == [31, 32, 33]
    assert all(o["clientid"] == "dev1" for o in outputs)
    assert len({o["id"] for o in outputs}) == 3, outputs
    assert target.requests[0][2]["content-type"] == "application/json"


def test_5xx_and_timeouts_are_sent_again_and_4xx_is_counted_once(make_broker, target):
    answers = {"n": 0}

    def answer(body):
        temp = json.loads(body)["temp"]
        if temp == 66:
            return 400  # refused for good
        answers["n"] += 1
        if answers["n"] <= 2:
            return 503
        if answers["n"] == 3:
            time.sleep(1.5)  # past timeout_ms: sent again
        return 200

    target.answer = answer
    broker, port = sink_broker(make_broker, target, sink={"timeout_ms": 1000, "batch_size": 1})
    for temp in (31, 66, 32, 33):
        pub(broker, "dev1", temp)
    taken = wait_for("31, 32 and 33 taken", lambda: sorted({json.loads(b)["temp"] for b in target.taken})
                     == [31, 32, 33] and target.taken)
    assert 66 not in [json.loads(b)["temp"] for b in taken]
    sink = wait_for("counters settled", lambda: (s := sink_counts(port))["queued"] == 0 and s["sent"] >= 3 and s)
    assert sink["failed"] == 1, sink
    assert sink["retried"] >= 3, sink  # two 503s and a timeout
    refused = [r for r in target.requests if json.loads(r[3])["temp"] == 66]
    assert len(refused) == 1, "a 4xx is not sent again"
    status, body = Api(port).get("/api/v1/rules")
    [rule] = body["data"]
    assert rule["matched"] == 4 and rule["failed"] == 0, rule  # the rule did its part: into the outbox
    assert "400 Bad Request" in broker.log_text()


def test_a_stopped_target_loses_nothing_acknowledged_and_slows_no_subscriber(make_broker, connect, target):
    broker, port = sink_broker(make_broker, target)
    watcher = connect(broker, client_id="watcher")
    watcher.subscribe("sensors/#", qos=1)
    publisher = connect(broker, client_id="dev1")
    acked = []
    stop_at, restart_at, total = 100, 300, 400
    for i in range(total):
        if i == stop_at:
            target.stop()
            stopped = time.time()
        if i == restart_at:
            # The target stays away 20 s; subscribers get every message meanwhile.
            assert watcher.wait_messages(restart_at, timeout=20)
            time.sleep(max(0.0, 20 - (time.time() - stopped)))
            queued = sink_counts(port)["queued"]
            assert queued >= restart_at - stop_at - 5, queued
            assert sink_counts(port)["state"] == "down"
            target.start()
        assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": 100 + i}), qos=1) == 0
        acked.append(100 + i)
    taken = wait_for("every acknowledged output taken",
                     lambda: {json.loads(b)["temp"] for b in target.taken} >= set(acked) and target.taken, 30)
    duplicates = len(taken) - len({json.loads(b)["id"] for b in taken})
    assert duplicates <= 100, duplicates  # at least once: at most a batch written twice
    sink = sink_counts(port)
    assert sink["retried"] > 0 and sink["failed"] == 0 and sink["dropped"] == 0, sink


def test_outputs_waiting_in_the_outbox_survive_kill_9(make_broker, connect):
    port = free_port()
    target = Target(port)
    target.stop()  # away: outputs wait in the outbox
    broker, api_port = sink_broker(make_broker, target)
    publisher = connect(broker, client_id="dev1")
    infos = [publisher.publish("sensors/dev1/temp", json.dumps({"temp": 1000 + i}), qos=1, wait=False)
             for i in range(1000)]
    for info in infos:
        info.wait_for_publish(20)
        assert info.is_published()
    wait_for("1000 queued", lambda: sink_counts(api_port)["queued"] == 1000)
    publisher.close()
    broker.kill()
    target.start()
    broker.start()
    taken = target.wait_taken(1000, timeout=60)
    assert {json.loads(b)["temp"] for b in taken} == set(range(1000, 2000))
    target.stop()


@pytest.mark.parametrize("sink, key, words", [
    ({"name": "hook", "type": "http", "url": "ftp://x"}, "sinks[0].url", "http:// or https://"),
    ({"name": "hook", "type": "smtp", "url": "http://x"}, "sinks[0].type", "smtp"),
    ({"name": "hook", "type": "http", "url": "http://x", "method": "BREW"}, "sinks[0].method", "GET, POST"),
    ({"name": "hook", "type": "http", "url": "http://x", "body": "${temp"}, "sinks[0].body", "unclosed"),
    ({"name": "hook", "type": "http", "url": "http://x", "headers": {"x": "${a..b}"}}, "sinks[0].headers.x",
     "expected a name"),
    ({"name": "hook", "type": "http", "url": "http://x", "batch_size": 0}, "sinks[0].batch_size", "1 to 10000"),
    ({"name": "hook", "type": "http", "url": "http://x", "timeout_ms": 0}, "sinks[0].timeout_ms", "at least 1"),
    ({"name": "hook", "type": "http", "url": "http://x", "colour": "red"}, "sinks[0]", "colour"),
    ({"name": "hook sink", "type": "http", "url": "http://x"}, "sinks[0].name", "letters, digits"),
    ({"name": "hook", "type": "postgres", "url": "postgres://u@h/db"}, "sinks[0].sql", "required"),
    ({"name": "hook", "type": "postgres", "url": "mysql://u@h/db", "sql": "SELECT 1"}, "sinks[0].url",
     "postgres://"),
    ({"name": "hook", "type": "redis", "url": "redis://h"}, "sinks[0].command", "required"),
    ({"name": "hook", "type": "influxdb", "url": "http://h", "line": "m v=${t}"}, "sinks[0].database",
     "org and bucket"),
    ({"name": "hook", "type": "influxdb", "url": "http://h", "line": "m v=1", "database": "d", "precision": "h"},
     "sinks[0].precision", "ns, us, ms or s"),
    ({"name": "hook", "type": "http", "url": "http://x", "queue_overflow": "explode"}, "sinks[0].queue_overflow",
     "explode"),
    ({"name": "hook", "type": "mqtt", "url": "mqtt://h:1883"}, "sinks[0].topic", "required"),
    ({"name": "hook", "type": "mqtt", "url": "mqtt://h", "topic": "a", "qos": 3}, "sinks[0].qos", "0, 1 or 2"),
    ({"name": "hook", "type": "kafka", "url": "h:9092", "topic": "t"}, "sinks[0].url", "kafka://"),
])
def test_a_malformed_sink_stops_the_start_naming_key_and_problem(sink, key, words, tmp_path):
    from conftest import toml_value
    rule = {"name": "hot", "sql": 'SELECT * FROM "t/#"', "actions": ["hook"]}
    r = subprocess.run([BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                        "--set", f"store.data_dir={json.dumps(str(tmp_path))}",
                        "--set", f"sinks={toml_value([sink])}", "--set", f"rules={toml_value([rule])}"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode != 0
    assert key in r.stderr and words in r.stderr, r.stderr


def test_two_sinks_of_one_name_and_a_rule_naming_no_sink_are_refused(tmp_path):
    from conftest import toml_value
    hook = {"name": "hook", "type": "http", "url": "http://x"}
    for sinks, actions, key, words in [
        ([hook, hook], ["hook"], "sinks[1].name", "names another sink"),
        ([hook], ["hooks"], "rules[0].actions[0]", "no [[sinks]] has this name"),
    ]:
        rule = {"name": "hot", "sql": 'SELECT * FROM "t/#"', "actions": actions}
        r = subprocess.run([BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                            "--set", f"store.data_dir={json.dumps(str(tmp_path))}",
                            "--set", f"sinks={toml_value(sinks)}", "--set", f"rules={toml_value([rule])}"],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode != 0 and key in r.stderr and words in r.stderr, r.stderr


def test_in_a_cluster_each_message_reaches_the_sink_once_from_the_node_it_was_published_on(
        braid_cluster, connect, target):
    rule = {"name": "hot", "actions": ["hook"],
            "sql": 'SELECT id, clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30'}
    sink = {"name": "hook", "type": "http", "url": f"http://127.0.0.1:{target.port}/in"}
    nodes = braid_cluster(3, settings={"rules": [rule], "sinks": [sink]})
    # A subscriber on every node: the messages cross nodes, the sink gets each once.
    for node in nodes:
        connect(node, client_id=f"watch-{node.node}").subscribe("sensors/#", qos=1)
    for i, node in enumerate(nodes):
        publisher = connect(node, client_id=f"dev{i}")
        for n in range(20):
            assert publisher.publish(f"sensors/dev{i}/temp", json.dumps({"temp": 100 * (i + 1) + n}), qos=1) == 0
    taken = target.wait_taken(60)
    time.sleep(1)  # nothing more comes
    temps = sorted(json.loads(b)["temp"] for b in target.taken)
    assert temps == sorted(100 * (i + 1) + n for i in range(3) for n in range(20)), temps
    assert len({json.loads(b)["id"] for b in taken}) == 60, "ids are unique across the nodes"


def test_with_ack_target_the_puback_waits_for_the_target_and_says_when_it_refused(make_broker, connect):
    from paho.mqtt.client import MQTTv5
    target = Target()
    target.stop()  # away: no PUBACK yet
    broker, port = sink_broker(make_broker, target, sink={"ack": "target", "queue_overflow": "backpressure"})
    publisher = connect(broker, client_id="dev1", protocol=MQTTv5)
    info = publisher.publish("sensors/dev1/temp", json.dumps({"temp": 31}), qos=1, wait=False)
    time.sleep(1.5)
    assert not info.is_published(), "the PUBACK waits while the target is away"
    assert sink_counts(port)["queued"] + sink_counts(port)["inflight"] >= 1
    target.answer = lambda body: 400 if json.loads(body)["temp"] == 66 else 200
    target.start()
    info.wait_for_publish(20)
    assert info.is_published() and target.wait_taken(1)
    assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": 32}), qos=1) == 0
    assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": 66}), qos=1) == 0x80, \
        "a v5 publisher learns that the target refused its message"
    assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": 5}), qos=1) == 0, "no rule output: at once"
    target.stop()


def test_ack_target_with_drop_oldest_is_refused(tmp_path):
    from conftest import toml_value
    sink = {"name": "hook", "type": "http", "url": "http://x", "ack": "target"}
    r = subprocess.run([BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
                        "--set", f"store.data_dir={json.dumps(str(tmp_path))}", "--set", f"sinks={toml_value([sink])}"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "sinks[0].queue_overflow" in r.stderr and "ack" in r.stderr, r.stderr


def test_refusals_are_all_counted_and_logged_at_most_once_a_second(make_broker, connect, target):
    target.answer = lambda body: 422
    broker, port = sink_broker(make_broker, target, sink={"batch_size": 10})
    publisher = connect(broker, client_id="dev1")
    started = time.time()
    for i in range(50):
        assert publisher.publish("sensors/dev1/temp", json.dumps({"temp": 100 + i}), qos=1) == 0
    wait_for("50 refusals counted", lambda: sink_counts(port)["failed"] == 50)
    lines = [line for line in broker.log_text().splitlines() if "the target refused an output" in line]
    assert 1 <= len(lines) <= 1 + int(time.time() - started + 1), lines
    assert "422 Unprocessable Entity" in lines[0], lines[0]
