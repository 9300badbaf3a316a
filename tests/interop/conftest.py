"""Fixtures for the interop suite: a broker on a free loopback port, driven by independent clients.

The broker under test is Braid (`target/debug/braid serve`) unless BRAID_TEST_BROKER=mosquitto,
which runs the same tests against Debian's Mosquitto to check that the tests themselves are right.
"""
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

import pytest
from ports import free_port  # noqa: F401  (re-exported for the test modules)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BRAID_BIN = os.environ.get("BRAID_BIN", os.path.join(ROOT, "target", "debug", "braid"))
TARGET = os.environ.get("BRAID_TEST_BROKER", "braid")
# Every broker these tests start also listens for MQTT over QUIC (on by default): on a free
# loopback UDP port, so that brokers never compete for the default 14567.
os.environ.setdefault("BRAID_LISTENERS_QUIC", "127.0.0.1:0")
# The same for the HTTP admin listener (on by default at 127.0.0.1:18083).
os.environ.setdefault("BRAID_LISTENERS_HTTP", "127.0.0.1:0")


def wait_for_port(port, proc, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited early with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"broker did not listen on {port} within {timeout}s")


class Broker:
    """A running broker process; `host`/`port` to connect, `stop()` to end it."""

    def __init__(self, settings=None, data_dir=None):
        self.host = "127.0.0.1"
        self.port = free_port()
        self.settings = settings or {}
        # Braid's disk store (the default) in a directory of its own; pass one to restart on it.
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="braid-data-")
        self.log = tempfile.NamedTemporaryFile(prefix="broker-", suffix=".log", delete=False)
        self.start()

    def start(self):
        """Starts the broker process (again, on the same port and data directory)."""
        if TARGET == "mosquitto":
            conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
            conf.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
            conf.write("sys_interval 1\n")
            for line in self.settings.get("mosquitto", []):
                conf.write(line + "\n")
            conf.close()
            cmd = ["mosquitto", "-c", conf.name]
        else:
            cmd = [BRAID_BIN, "serve", "--listen", f"{self.host}:{self.port}",
                   "--set", f"store.data_dir={toml_value(self.data_dir)}"]
            for key, value in self.settings.get("braid", {}).items():
                cmd += ["--set", f"{key}={toml_value(value)}"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.proc)

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def admin_url(self, timeout=10.0):
        """http://HOST:PORT of the HTTP admin listener, from the log line that announces it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(r"listening for HTTP .*addr=(\S+)", self.log_text())
            if m:
                return f"http://{m.group(1)}"
            time.sleep(0.05)
        raise AssertionError(f"no HTTP admin listener in the log {self.log.name}")

    def admin_get(self, path):
        """GET `path` on the admin listener: the JSON reply (or text for /metrics)."""
        with urllib.request.urlopen(self.admin_url() + path, timeout=10) as r:
            text = r.read().decode()
        return text if path == "/metrics" else json.loads(text)

    def kill(self):
        """SIGKILL: the broker gets no chance to write anything more."""
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def toml_value(v):
    """A Python value as a TOML value (strings with JSON's escapes, which TOML shares)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))


def serve_refused(data_dir, **settings):
    """Runs `braid serve` with `--set key=value` for each of `settings` (Python values, as TOML),
    expecting it to refuse the configuration (exit status 2); returns its stderr, which names
    the problem."""
    cmd = [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
           "--set", f"store.data_dir={toml_value(str(data_dir))}"]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={toml_value(value)}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    assert r.returncode == 2, r.stderr
    return r.stderr


@pytest.fixture
def broker():
    """A broker with default settings (plus a 1 s $SYS interval)."""
    b = Broker({"braid": {"sys.interval_secs": 1}})
    yield b
    b.stop()


@pytest.fixture
def make_broker():
    """Factory: make_broker(braid={key: value}, mosquitto=[conf lines]) for non-default settings."""
    started = []

    def make(braid=None, mosquitto=None):
        settings = {"braid": {"sys.interval_secs": 1, **(braid or {})}, "mosquitto": mosquitto or []}
        b = Broker(settings)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def client_id():
    """A fresh unique client id per test."""
    return "t-" + uuid.uuid4().hex[:12]


# --------------------------------------------------------------------------------------------------
# Markers and client fixtures (clients are closed / killed at the end of each test).
# --------------------------------------------------------------------------------------------------

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "braid_only: behaviour Braid promises but Mosquitto cannot be configured for; "
                   "skipped when BRAID_TEST_BROKER=mosquitto")


def pytest_collection_modifyitems(config, items):
    if TARGET != "mosquitto":
        return
    skip = pytest.mark.skip(reason="braid_only: Mosquitto cannot be configured for this")
    for item in items:
        if "braid_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def connect():
    """Factory: connect(broker, **kw) -> helpers.MqttClient, connected (see helpers.connect_client)."""
    import helpers
    made = []

    def make(broker, **kw):
        c = helpers.connect_client(broker, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def mosquitto_sub():
    """Factory: mosquitto_sub(broker, topics, qos=0, version="mqttv311", ...) -> helpers.MosquittoSub,
    already subscribed (see helpers.start_mosquitto_sub)."""
    import helpers
    made = []

    def make(broker, topics, **kw):
        s = helpers.start_mosquitto_sub(broker, topics, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def raw_client():
    """Factory: raw_client(broker) -> helpers.RawClient, a plain TCP socket for hand-written bytes."""
    import helpers
    made = []

    def make(broker, **kw):
        r = helpers.RawClient(broker, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


# --------------------------------------------------------------------------------------------------
# Clustering on Redis: a redis-server per test, and Braid nodes sharing one (tests/interop/redisproc.py).
# --------------------------------------------------------------------------------------------------

def _skip_unless_braid():
    if TARGET == "mosquitto":
        pytest.skip("clustering on Redis is Braid's: skipped when BRAID_TEST_BROKER=mosquitto")


class ClusterNode(Broker):
    """A Braid cluster node (a Broker): `node` is its cluster.node name. A start that fails says
    why, with the end of the node's log, and leaves no process behind."""

    def __init__(self, node, settings, data_dir=None):
        self.node = node
        super().__init__(settings, data_dir)

    def start(self):
        try:
            super().start()
        except RuntimeError as e:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise RuntimeError(f"cluster node {self.node}: {e}\n---- {self.log.name} ----\n"
                               f"{self.log_text()[-3000:]}") from None


class BraidCluster(list):
    """The nodes braid_cluster() started (ClusterNode objects, n1 first); `redis` is the
    RedisServer or RedisCluster they share."""

    def __init__(self, nodes, redis):
        super().__init__(nodes)
        self.redis = redis


@pytest.fixture
def redis():
    """A RedisServer (appendonly, no auth) on a free loopback port, stopped after the test."""
    _skip_unless_braid()
    from redisproc import RedisServer
    r = RedisServer()
    yield r
    r.stop()


CLUSTER_SECRET = "interop-cluster-secret"
"""The cluster.secret braid_cluster() gives every node."""


@pytest.fixture
def braid_cluster():
    """Factory: braid_cluster(n=3, redis=None, settings=None, first=1) -> BraidCluster, a list of
    n running Braid nodes n<first>..., each with its own data directory, all on one Redis:
      redis    a RedisServer or RedisCluster (url / urls), a URL string or a list of seed URLs;
               None starts a RedisServer of its own (reach it as the result's .redis);
      settings more --set keys for every node, over the cluster defaults (cluster.lease_ms 3000);
      first    number of the first node, to add nodes to a running cluster:
               braid_cluster(1, redis=nodes.redis, first=4) starts n4.
    Every node and Redis started through it is stopped after the test (nodes first)."""
    _skip_unless_braid()
    from redisproc import RedisServer
    nodes, servers = [], []

    def make(n=3, redis=None, settings=None, first=1):
        if redis is None:
            redis = RedisServer()
            servers.append(redis)
        if isinstance(redis, (str, list, tuple)):
            url = redis
        else:
            url = redis.urls if hasattr(redis, "urls") else redis.url
        made = []
        for i in range(first, first + n):
            node = f"n{i}"
            braid = {"cluster.enabled": True, "cluster.node": node, "cluster.redis": url,
                     "cluster.lease_ms": 3000, "cluster.listen": "127.0.0.1:0",
                     "cluster.secret": CLUSTER_SECRET, **(settings or {})}
            made.append(ClusterNode(node, {"braid": braid}))
            nodes.append(made[-1])
        return BraidCluster(made, redis)

    yield make
    # SIGTERM to all nodes at once, then wait for each; Redis last, so nodes can still use it.
    for b in nodes:
        if b.proc.poll() is None:
            b.proc.terminate()
    for b in nodes:
        b.stop()
    for r in servers:
        r.stop()
