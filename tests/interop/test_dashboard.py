"""The web dashboard of the HTTP admin listener, in a real browser.

Headless Chromium (Debian's /usr/bin/chromium, driven by playwright-core from
tests/interop/js/dashboard.mjs, one JSON command per line) loads the pages the broker serves at
`/`, while independent clients (paho-mqtt, mosquitto_pub) change what the broker holds: the
live connection count on the overview, kicking a client from the clients page (the client gets
DISCONNECT 0x98, Administrative action), deleting a retained message from the retained page,
the API key prompt when admin.api_keys_file is set, draining a cluster node from the nodes page,
the rules page's counters and its rule tester.

Screenshots of each page are kept under $BRAID_TEST_ARTIFACTS/dashboard (default
/tmp/braid-test-artifacts/dashboard), named <test>-<page>.png; a command that fails adds a
screenshot of the moment to that directory and names it in the failure.
"""
import glob
import json
import os
import queue
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from paho.mqtt.client import MQTTv5
from paho.mqtt.packettypes import PacketTypes

from conftest import BRAID_BIN, free_port
from helpers import mosquitto_pub, unique, v5_properties

pytestmark = pytest.mark.braid_only  # Mosquitto has no dashboard

JS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js")
ARTIFACTS = os.path.join(os.environ.get("BRAID_TEST_ARTIFACTS", "/tmp/braid-test-artifacts"), "dashboard")
ADMINISTRATIVE_ACTION = 0x98


@pytest.fixture(scope="module", autouse=True)
def artifact_dir():
    """A fresh artifacts directory for this module's screenshots (old ones removed)."""
    os.makedirs(ARTIFACTS, exist_ok=True)
    for old in glob.glob(os.path.join(ARTIFACTS, "*.png")):
        os.remove(old)
    yield ARTIFACTS
    shots = sorted(glob.glob(os.path.join(ARTIFACTS, "*.png")))
    print(f"\ndashboard screenshots ({len(shots)}) in {ARTIFACTS}")


# ---- the broker's admin listener -----------------------------------------------------------------

@pytest.fixture
def admin_broker(make_broker):
    """Factory: admin_broker(**braid_settings) -> a Broker with `b.http`, the base URL of its HTTP
    admin listener (on a free port: conftest sets listeners.http to 127.0.0.1:0)."""

    def make(**settings):
        b = make_broker(braid=settings)
        b.http = b.admin_url()
        return b

    return make


def api(b, path, method="GET", key=None):
    """Calls the REST API: (status, JSON body or None)."""
    req = urllib.request.Request(b.http + path, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=5) as res:
            body = res.read()
            return res.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        body = e.read()
        return e.code, json.loads(body) if body else None


def make_api_key(path, name):
    """A new API key named `name` in the keys file `path`, made by `braid apikey add`."""
    proc = subprocess.run([BRAID_BIN, "apikey", "add", str(path), name], capture_output=True, text=True,
                          timeout=10)
    found = re.search(r"braid_[A-Za-z0-9_-]{43}", proc.stdout)
    assert proc.returncode == 0 and found, f"braid apikey add: {proc.stdout}{proc.stderr}"
    return found.group(0)


# ---- the browser -----------------------------------------------------------------------------------

class Dashboard:
    """Headless Chromium on the dashboard at `base_url`, driven by js/dashboard.mjs. `call(op,
    **args)` runs one command (see that script) and returns its value; a failed command raises
    AssertionError naming a screenshot of the page at that moment."""

    def __init__(self, base_url, name):
        self.name = name
        self.proc = subprocess.Popen(
            ["node", os.path.join(JS_DIR, "dashboard.mjs"), base_url, ARTIFACTS, name],
            cwd=JS_DIR, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        self.replies = queue.Queue()
        self.stderr = []
        self.failures = 0
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.replies.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()
        assert self._reply(60) == {"ok": True, "value": "ready"}

    @staticmethod
    def _pump(stream, put):
        for line in stream:
            put(line)

    def _reply(self, timeout):
        try:
            line = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"dashboard.mjs did not answer within {timeout}s; "
                                 f"stderr: {''.join(self.stderr)[-2000:]}") from None
        try:
            return json.loads(line)
        except ValueError:
            raise AssertionError(f"dashboard.mjs printed {line!r}") from None

    def call(self, op, timeout=5.0, **args):
        if self.proc.poll() is not None:
            raise AssertionError(f"dashboard.mjs exited ({self.proc.returncode}): {''.join(self.stderr)[-2000:]}")
        self.proc.stdin.write(json.dumps({"op": op, "timeout": int(timeout * 1000), **args}) + "\n")
        self.proc.stdin.flush()
        reply = self._reply(timeout + 30)
        if reply["ok"]:
            return reply["value"]
        self.failures += 1
        shot = self.screenshot(f"failure-{self.failures}", quiet=True)
        raise AssertionError(f"dashboard {op} {args}: {reply['error']} (screenshot: {shot})")

    def screenshot(self, name, quiet=False):
        try:
            path = self.call("screenshot", name=name, timeout=10)
        except AssertionError:
            if quiet:
                return None
            raise
        print(f"screenshot: {path}")
        return path

    def visible(self, testid, timeout=5.0):
        return self.call("wait_visible", testid=testid, timeout=timeout)

    def gone(self, testid, timeout=5.0):
        return self.call("wait_hidden", testid=testid, timeout=timeout)

    def text(self, testid, timeout=5.0, **fits):
        """The element's text once it fits (`equals=`, `not_=`, `matches=`, `number_above=`)."""
        if "not_" in fits:
            fits["not"] = fits.pop("not_")
        if "equals" in fits:
            fits["equals"] = str(fits["equals"])
        return self.call("wait_text", testid=testid, timeout=timeout, **fits)

    def page_errors(self):
        return self.call("errors")["page"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def dashboard(request):
    """Factory: dashboard(broker) -> Dashboard on that broker's admin listener. At the end the
    page must have thrown no uncaught JavaScript error."""
    made = []

    def make(b):
        d = Dashboard(b.http, request.node.name.replace("test_", "", 1))
        made.append(d)
        return d

    yield make
    errors = []
    for d in made:
        if d.proc.poll() is None:
            errors += d.page_errors()
        d.close()
    assert not errors, f"uncaught errors in the dashboard's JavaScript: {errors}"


def samples_at_least(testid, n):
    """A wait_js command: the chart `testid` has drawn at least n samples."""
    return dict(fn="([id, n]) => Number(document.querySelector(`[data-testid='${id}']`)?.dataset.samples) >= n",
                arg=[testid, n])


def persistent(seconds=300):
    return v5_properties(PacketTypes.CONNECT, SessionExpiryInterval=seconds)


# ---- the tests -------------------------------------------------------------------------------------

def test_overview_shows_the_live_connection_count_and_message_rates(admin_broker, dashboard, connect):
    b = admin_broker()
    d = dashboard(b)
    d.call("goto", path="/#/overview")
    before = int(d.text("connected-count", matches=r"^\d+$"))
    d.call("wait_js", timeout=5, **samples_at_least("chart-connections", 2))

    c = connect(b, protocol=MQTTv5)
    started = time.monotonic()
    d.text("connected-count", equals=before + 1, timeout=5)
    print(f"the page saw the connection after {time.monotonic() - started:.2f}s")
    d.text("legend-connected", equals=before + 1)

    # Messages in and out per second, from successive counters: a client echoing to itself.
    topic = unique("dash-rates")
    c.subscribe(topic, qos=0)
    stop = threading.Event()

    def publish():
        while not stop.is_set():
            for _ in range(10):
                c.publish(topic, b"x", qos=0, wait=False)
            time.sleep(0.1)

    pub = threading.Thread(target=publish, daemon=True)
    pub.start()
    try:
        d.text("rate-in", number_above=0, timeout=6)
        d.text("rate-out", number_above=0, timeout=6)
    finally:
        stop.set()
        pub.join()
    d.call("wait_js", timeout=5, **samples_at_least("chart-messages", 3))
    d.screenshot("overview")

    c.disconnect()
    d.text("connected-count", equals=before, timeout=5)
    assert d.text("uptime", matches=r"^\d+") and d.text("version", matches=r"^\d+\.\d+")


def test_kick_a_client_from_the_clients_page(admin_broker, dashboard, connect, client_id):
    b = admin_broker()
    victim = connect(b, client_id=client_id, protocol=MQTTv5, properties=persistent())
    victim.subscribe("dash/kick/#", qos=1)
    other = connect(b, client_id="other-" + client_id, protocol=MQTTv5)
    d = dashboard(b)
    d.call("goto", path="/#/clients")
    d.visible(f"client-row-{client_id}")
    d.visible(f"client-row-{other.client_id}")
    d.text(f"client-state-{client_id}", equals="connected")

    # Search by client id prefix, then the client's detail with its subscription.
    d.call("fill", testid="client-search", value=client_id)
    d.gone(f"client-row-{other.client_id}")
    d.visible(f"client-row-{client_id}")
    d.screenshot("clients")
    d.call("click", testid=f"client-link-{client_id}")
    d.visible("client-detail")
    d.visible("subscription-row-dash/kick/#")
    d.screenshot("client")

    # Kick from the list: the client gets DISCONNECT 0x98; its persistent session stays, offline.
    d.call("click", testid="back-to-clients")
    d.call("fill", testid="client-search", value=client_id)
    d.gone(f"client-row-{other.client_id}")
    d.call("click", testid=f"kick-{client_id}")
    reason = victim.wait_disconnected(5)
    assert reason is not None and int(reason.value) == ADMINISTRATIVE_ACTION, reason
    d.text(f"client-state-{client_id}", equals="offline", timeout=5)
    d.gone(f"kick-{client_id}")
    assert any(client_id in m for m in d.call("dialogs")), "the page asked before kicking"
    assert other.is_connected()
    status, body = api(b, f"/api/v1/clients/{urllib.parse.quote(client_id, safe='')}")
    assert status == 200 and body["connected"] is False, body
    d.screenshot("clients-after-kick")

    # Kick from the detail page: a clean session ends with its connection.
    d.call("route", hash=f"#/clients/{urllib.parse.quote(other.client_id, safe='')}")
    d.text(f"client-state-{other.client_id}", equals="connected")
    d.call("click", testid=f"kick-{other.client_id}")
    reason = other.wait_disconnected(5)
    assert reason is not None and int(reason.value) == ADMINISTRATIVE_ACTION, reason
    d.visible("client-gone")
    d.call("click", testid="back-to-clients")
    d.gone(f"client-row-{other.client_id}")


def test_retained_page_lists_and_deletes_a_retained_message(admin_broker, dashboard):
    b = admin_broker()
    root = unique("dash")
    topic, kept = f"{root}/temperature", f"{root}/keep"
    mosquitto_pub(b, topic, "21.5 °C", qos=1, retain=True)
    mosquitto_pub(b, kept, "stays", qos=1, retain=True)
    d = dashboard(b)
    d.call("goto", path="/#/retained")
    d.text(f"retained-payload-{topic}", equals="21.5 °C")
    d.text(f"retained-payload-{kept}", equals="stays")
    d.screenshot("retained")

    # The filter box narrows the list; a bad filter is the API's error, shown on the page.
    d.call("fill", testid="retained-filter", value=topic)
    d.gone(f"retained-row-{kept}")
    d.call("fill", testid="retained-filter", value=f"{root}/#/x")
    assert "not a valid topic filter" in d.text("error-banner")
    d.screenshot("retained-error")
    d.call("fill", testid="retained-filter", value=f"{root}/+")
    d.gone("error-banner")
    d.visible(f"retained-row-{kept}")

    d.call("click", testid=f"delete-retained-{topic}")
    d.gone(f"retained-row-{topic}")
    d.visible(f"retained-row-{kept}")
    status, body = api(b, "/api/v1/retained?filter=" + urllib.parse.quote(f"{root}/#"))
    assert status == 200 and [m["topic"] for m in body["data"]] == [kept], body
    status, body = api(b, f"/api/v1/retained/{topic}")
    assert status == 404, body


def test_drain_a_cluster_node_from_the_nodes_page(braid_cluster, dashboard):
    n1, n2 = braid_cluster(2)
    n1.http = n1.admin_url()
    d = dashboard(n1)
    d.call("goto", path="/#/nodes")
    d.visible("nodes-row-n2", timeout=10)
    d.call("click", testid="drain-n2")
    assert any('"n2"' in m for m in d.call("dialogs")), "the page asked before draining"
    d.text("nodes-row-n2", timeout=10, matches="drained")
    d.text("drain-n2", equals="Cancel drain")
    status, body = api(n1, "/api/v1/nodes")
    assert status == 200 and [n["state"] for n in body["data"]] == ["up", "drained"], body
    d.screenshot("nodes-drained")
    d.call("click", testid="drain-n2")
    d.text("drain-n2", timeout=10, equals="Drain")
    status, body = api(n1, "/api/v1/nodes")
    assert [n["draining"] for n in body["data"]] == [False, False], body


def test_api_key_prompt(admin_broker, dashboard, connect, tmp_path):
    keys = tmp_path / "apikeys"
    key = make_api_key(keys, "dashboard")
    b = admin_broker(**{"admin.api_keys_file": str(keys)})
    assert api(b, "/api/v1/stats")[0] == 401
    assert api(b, "/api/v1/stats", key=key)[0] == 200
    connect(b, protocol=MQTTv5)

    d = dashboard(b)
    d.call("goto", path="/#/overview")
    d.visible("key-dialog")
    assert d.text("connected-count") == "—", "no numbers without a key"
    d.screenshot("api-key-prompt")

    wrong = "braid_" + "A" * 43
    d.call("fill", testid="key-input", value=wrong)
    d.call("click", testid="key-submit")
    assert "not valid" in d.text("key-problem")
    d.visible("key-dialog")

    d.call("fill", testid="key-input", value=key)
    d.call("click", testid="key-submit")
    d.gone("key-dialog")
    d.text("connected-count", equals=1)
    d.call("wait_js", fn="(k) => sessionStorage.getItem('braid.apiKey') === k", arg=key)
    d.call("click", testid="nav-clients")
    d.visible("clients-table")
    d.text("pager-info", matches=r" of 1 ")
    assert d.call("attr", testid="key-dialog", name="hidden") is not None
    d.screenshot("clients-with-key")

    # Forgetting the key asks again.
    d.call("click", testid="key-forget")
    d.visible("key-dialog")


def test_rules_page_lists_rules_and_sinks_and_tests_a_rule(admin_broker, dashboard):
    # The sink points at a port where nothing listens: it sends nothing (its state follows).
    sql = 'SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30'
    b = admin_broker(rules=[{"name": "hot", "sql": sql, "actions": ["hook"]}],
                     sinks=[{"name": "hook", "type": "http", "url": f"http://127.0.0.1:{free_port()}/ingest"}])
    mosquitto_pub(b, "sensors/a1/temp", json.dumps({"temp": 35}), qos=1)  # selected
    mosquitto_pub(b, "sensors/a1/temp", json.dumps({"temp": 20}), qos=1)  # WHERE leaves it out
    d = dashboard(b)
    d.call("goto", path="/#/overview")
    d.call("click", testid="nav-rules")
    d.text("rule-matched-hot", equals=1, timeout=10)
    assert sql in d.text("rules-row-hot") and "hook" in d.text("rules-row-hot")
    status, body = api(b, "/api/v1/rules")
    assert status == 200 and [(r["name"], r["matched"]) for r in body["data"]] == [("hot", 1)], body
    [rule] = body["data"]
    d.text("rule-passed-hot", equals=rule["passed"])
    d.text("rule-failed-hot", equals=rule["failed"])
    d.visible("sinks-row-hook")
    assert "http" in d.text("sinks-row-hook")
    d.text("sink-state-hook", matches=r"^(up|down)$")
    d.text("sink-sent-hook", equals=0)
    status, body = api(b, "/api/v1/sinks")
    assert status == 200 and [(s["name"], s["kind"], s["sent"]) for s in body["data"]] == [("hook", "http", 0)], body

    # The tester, from the rule's Test button: a sample it selects gives its output.
    d.call("click", testid="test-rule-hot")
    d.call("wait_js", fn="(s) => document.querySelector(\"[data-testid='rule-test-sql']\").value === s", arg=sql)
    d.call("fill", testid="rule-test-topic", value="sensors/b2/temp")
    d.call("fill", testid="rule-test-clientid", value="b2")
    d.call("fill", testid="rule-test-payload", value='{"temp": 41.5}')
    d.call("click", testid="rule-test-run")
    output = d.text("rule-test-output")
    assert json.loads(output) == {"clientid": "b2", "temp": 41.5}, output
    assert "\n" in output, f"pretty-printed: {output!r}"
    assert "selects" in d.text("rule-test-verdict")
    d.screenshot("rules")

    # A sample it does not select.
    d.call("fill", testid="rule-test-payload", value='{"temp": 12}')
    d.call("click", testid="rule-test-run")
    d.text("rule-test-verdict", matches="does not select")
    d.gone("rule-test-output")

    # A misspelt function: the broker's 400, naming the position, in the tester (not the banner).
    d.call("fill", testid="rule-test-sql", value='SELECT lenght(topic) FROM "s/#"')
    d.call("fill", testid="rule-test-topic", value="s/x")
    d.call("click", testid="rule-test-run")
    error = d.text("rule-test-error")
    assert "line 1, column 8" in error and "lenght" in error, error
    d.gone("rule-test-output")
    assert d.call("attr", testid="error-banner", name="hidden") is not None, d.text("error-banner")
    d.screenshot("rules-test-error")

    # Testing moved no counter.
    status, body = api(b, "/api/v1/rules")
    assert [(r["name"], r["matched"]) for r in body["data"]] == [("hot", 1)], body
    d.text("rule-matched-hot", equals=1)


def test_every_page_renders(admin_broker, dashboard, connect):
    b = admin_broker()
    c = connect(b, protocol=MQTTv5, properties=persistent())
    c.subscribe("dash/pages/#", qos=1)
    c.publish("dash/pages/status", "online", qos=1, retain=True)
    d = dashboard(b)
    d.call("goto", path="/")
    d.text("connected-count", equals=1)
    d.call("wait_js", timeout=6, **samples_at_least("chart-connections", 4))
    d.screenshot("overview")

    pages = [
        ("clients", "nav-clients", f"client-row-{c.client_id}"),
        ("client", f"client-link-{c.client_id}", "subscription-row-dash/pages/#"),
        ("subscriptions", "nav-subscriptions", f"subscription-row-{c.client_id}-dash/pages/#"),
        ("retained", "nav-retained", "retained-row-dash/pages/status"),
        ("listeners", "nav-listeners", f"listeners-row-127.0.0.1:{b.port}"),
        ("nodes", "nav-nodes", "nodes-row-local"),
        ("bridges", "nav-bridges", "empty"),
        ("rules", "nav-rules", "rules-table"),
    ]
    for name, link, shows in pages:
        d.call("click", testid=link)
        d.visible(shows)
        assert d.call("attr", testid="error-banner", name="hidden") is not None, d.text("error-banner")
        d.screenshot(name)
    d.call("click", testid="nav-listeners")
    d.visible("listeners-row-" + b.http.removeprefix("http://"))
