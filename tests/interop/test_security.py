"""Security with independent clients: anonymous access, `braid passwd` and the password file
(reloaded on SIGHUP), JWT in the password field, the HTTP hook, ACL rules and limits, driven by
paho-mqtt and mosquitto_pub. Braid only (the files and keys are Braid's)."""
import base64
import hashlib
import hmac
import http.server
import json
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import BRAID_BIN
from helpers import MQTTv311, MQTTv5, connect_client, mosquitto_pub, unique, wait_until

pytestmark = pytest.mark.braid_only

BAD_CREDENTIALS, NOT_AUTHORIZED = 134, 135  # paho maps 3.1.1 return codes 4/5 to these


def passwd(path, user, password=None, delete=False):
    cmd = [BRAID_BIN, "passwd", str(path), user]
    if delete:
        cmd.insert(2, "-D")
    return subprocess.run(cmd, input=(password + "\n").encode() if password else None,
                          capture_output=True, timeout=30)


def refused(broker, protocol, **kw):
    c = connect_client(broker, protocol=protocol, expect_success=False, **kw)
    try:
        return c.connack.reason_code
    finally:
        c.close()


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=["v3.1.1", "v5"])
def test_anonymous_refused_when_off_and_logged(make_broker, protocol):
    b = make_broker(braid={"auth.allow_anonymous": False})
    assert refused(b, protocol) == NOT_AUTHORIZED
    assert "anonymous clients are refused" in b.log_text()
    b2 = make_broker()
    assert "anonymous clients may connect" in b2.log_text()


def test_braid_passwd_file_and_sighup_reload(make_broker, tmp_path, connect):
    path = tmp_path / "passwd"
    r = passwd(path, "alice", "wonderland")
    assert r.returncode == 0, r.stderr
    assert b"added" in r.stderr
    text = path.read_text()
    assert text.count("alice:$argon2id$") == 1 and "wonderland" not in text
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    b = make_broker(braid={"auth.allow_anonymous": False, "auth.password_file": str(path),
                           "auth.reload_interval_secs": 0})
    connect(b, protocol=MQTTv5, username="alice", password="wonderland")
    assert refused(b, MQTTv5, username="alice", password="nope") == BAD_CREDENTIALS
    assert refused(b, MQTTv311, username="alice", password="nope") == BAD_CREDENTIALS
    mosquitto_pub(b, "t", "x", extra=["-u", "alice", "-P", "wonderland"])
    assert mosquitto_pub(b, "t", "x", extra=["-u", "alice", "-P", "bad"], check=False).returncode != 0

    # Change and add users; with polling off, SIGHUP reloads.
    r = passwd(path, "alice", "new")
    assert r.returncode == 0 and b"changed password" in r.stderr
    assert b"added" in passwd(path, "bob", "builder").stderr
    b.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP" in b.log_text())
    wait_until(lambda: refused(b, MQTTv5, username="bob", password="builder") == 0, timeout=5)
    assert refused(b, MQTTv5, username="alice", password="wonderland") == BAD_CREDENTIALS
    assert passwd(path, "bob", delete=True).returncode == 0
    assert passwd(path, "nobody", delete=True).returncode == 1
    b.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: refused(b, MQTTv5, username="bob", password="builder") == BAD_CREDENTIALS, timeout=5)


def test_braid_passwd_delete_from_a_missing_file_says_so(tmp_path):
    """`-D` on a file that does not exist: the file is named as missing (not the user), nothing
    is created, and the exit status says it failed."""
    path = tmp_path / "nofile"
    r = passwd(path, "x", delete=True)
    assert r.returncode != 0, r.stderr
    assert r.stderr.decode().strip() == f"braid passwd: {path}: no such file", r.stderr
    assert not path.exists()


def hs256(claims, secret=b"interop-secret"):
    def b64(data):
        return base64.urlsafe_b64encode(data).rstrip(b"=")
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = b64(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + sig).decode()


def test_jwt_with_acl_claim(make_broker, tmp_path, connect):
    key = tmp_path / "secret"
    key.write_text("interop-secret\n")
    b = make_broker(braid={"auth.allow_anonymous": False, "auth.jwt_key_file": str(key),
                           "auth.jwt_algorithm": "HS256"})
    token = hs256({"sub": "dev1", "exp": int(time.time()) + 60,
                   "acl": {"publish": ["up/%u"], "subscribe": ["down/%u"]}})
    c = connect(b, protocol=MQTTv5, username="dev1", password=token)
    assert c.subscribe([("down/dev1", 1), ("down/dev2", 1)]) == [1, NOT_AUTHORIZED]
    assert c.publish("up/dev1", b"x", qos=1) == 0
    assert c.publish("up/dev2", b"x", qos=1) == NOT_AUTHORIZED
    expired = hs256({"sub": "dev1", "exp": int(time.time()) - 10})
    assert refused(b, MQTTv311, username="dev1", password=expired) == BAD_CREDENTIALS
    forged = hs256({"sub": "dev1", "exp": int(time.time()) + 60}, secret=b"other")
    assert refused(b, MQTTv5, username="dev1", password=forged) == BAD_CREDENTIALS


class Hook(http.server.BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Hook.requests.append(body)
        if body["username"] == "slow":
            time.sleep(2)
        ok = body["password"] == "letmein"
        reply = {"result": "allow" if ok else "deny", "acl": {"publish": ["hook/#"], "subscribe": ["hook/#"]}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # the slow request's reply meets a socket Braid already closed: expected


def test_http_hook(make_broker, connect):
    server = QuietServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/auth"
        b = make_broker(braid={"auth.allow_anonymous": False, "auth.http_url": url,
                               "auth.http_timeout_ms": 500})
        cid = unique("hook")
        c = connect(b, client_id=cid, protocol=MQTTv5, username="u", password="letmein")
        assert {"clientid": cid, "username": "u", "password": "letmein"} in Hook.requests
        assert c.subscribe("hook/a", 1) == [1]
        assert c.subscribe("other", 1) == [NOT_AUTHORIZED]
        assert refused(b, MQTTv311, username="u", password="wrong") == BAD_CREDENTIALS
        assert refused(b, MQTTv5, username="slow", password="letmein") == NOT_AUTHORIZED
        assert "HTTP auth hook failed, denying" in b.log_text()
    finally:
        server.shutdown()


RULES = """
allow all            both       users/%u/#
allow user:admin     subscribe  $SYS/#
deny  all            subscribe  secret/#
allow all            subscribe  $share/+/jobs/#
allow all            both       jobs/#
"""


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=["v3.1.1", "v5"])
def test_acl_rules(make_broker, tmp_path, connect, protocol):
    rules = tmp_path / "acl"
    rules.write_text(RULES)
    b = make_broker(braid={"acl.file": str(rules)})
    failure = 128 if protocol == MQTTv311 else NOT_AUTHORIZED
    bob = connect(b, protocol=protocol, username="bob", password="-")
    assert bob.subscribe([("users/bob/#", 1), ("users/eve/#", 1), ("secret/x", 1), ("$SYS/#", 0),
                          ("$share/g/jobs/#", 1)]) == [1, failure, failure, failure, 1]
    admin = connect(b, protocol=protocol, username="admin", password="-")
    assert admin.subscribe("$SYS/broker/uptime", 0) == [0]
    sub = connect(b, protocol=MQTTv5, username="bob", password="-")
    sub.subscribe("users/bob/#", 1)
    if protocol == MQTTv5:
        assert bob.publish("users/eve/x", b"no", qos=1) == NOT_AUTHORIZED
    else:
        assert bob.publish("users/eve/x", b"no", qos=1) == 0  # acknowledged, dropped
    bob.publish("users/eve/x", b"no", qos=0)
    assert bob.publish("users/bob/x", b"yes", qos=1) == 0
    [m] = sub.wait_messages(1)
    assert m.payload == b"yes"
    sub.expect_no_message(0.3)


def test_topic_and_subscription_limits(make_broker, connect):
    b = make_broker(braid={"limits.max_topic_levels": 4, "limits.max_subscriptions": 2})
    c = connect(b, protocol=MQTTv5)
    assert c.subscribe([("a", 0), ("a/b/c/d/e", 0), ("b", 0), ("c", 0)]) == [0, 143, 0, 151]
    c.publish("a/b/c/d/e", b"x", qos=0)
    c.disconnected.wait(5)
    assert c.disconnected.is_set()
    assert int(c.disconnect_reason.value) == 0x90
