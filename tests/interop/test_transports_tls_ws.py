"""MQTT over TLS, WebSocket and WebSocket over TLS, driven by independent clients: paho-mqtt (TLS
1.2 and 1.3, client certificates, websockets transport), mosquitto_pub/_sub with --cafile,
MQTT.js from Node and from a page in headless Chromium, `braid pub/sub`, a hand-made
WebSocket client that splits and coalesces MQTT packets across frames, and websocket-client
uploading one large frame slowly.

Certificates are made at test time (see pki.py). These listeners are Braid's configuration, so
the module is ``braid_only``.
"""
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time
import types

import pytest
import websocket

import helpers
import raw_v5
from conftest import BRAID_BIN, free_port, wait_for_port
from helpers import MQTTv311, MQTTv5, TIMEOUT, MqttClient, mosquitto_pub, start_mosquitto_sub, unique, wait_until
from pki import Pki

pytestmark = pytest.mark.braid_only

JS_DIR = os.path.join(os.path.dirname(__file__), "js")


@pytest.fixture
def pki(tmp_path):
    """A CA ``ca`` with a server certificate ``server`` (localhost, 127.0.0.1), and a second CA
    ``clients`` with a client certificate for CN ``alice``."""
    p = Pki(tmp_path)
    p.ca("ca")
    p.issue("server", "braid test server", ca="ca")
    p.ca("clients")
    p.issue("alice", "alice", ca="clients", sans=())
    return p


@pytest.fixture
def tls_broker(make_broker, pki):
    """Factory: a broker with TLS, WebSocket and WSS listeners (``tls_port``, ``ws_port``,
    ``wss_port``) on the fixture certificates; keyword arguments are extra ``--set`` settings."""

    def make(**settings):
        ports = {kind: free_port() for kind in ("tls", "ws", "wss")}
        braid = {f"listeners.{kind}": f"127.0.0.1:{port}" for kind, port in ports.items()}
        braid.update({"tls.cert": pki.path("server.pem"), "tls.key": pki.path("server.key")})
        braid.update({k.replace("__", "."): v for k, v in settings.items()})
        b = make_broker(braid=braid)
        for port in ports.values():
            wait_for_port(port, b.proc)
        b.tls_port, b.ws_port, b.wss_port = ports["tls"], ports["ws"], ports["wss"]
        return b

    return make


def at(port, host="127.0.0.1"):
    """An endpoint object for helpers that take a broker (they read ``host`` and ``port``)."""
    return types.SimpleNamespace(host=host, port=port)


def paho(port, protocol=MQTTv311, transport="tcp", ca=None, cert=None, key=None, context=None,
         connect=True, timeout=TIMEOUT):
    """A paho client on ``port``: TLS when ``ca`` or ``context`` is given, websockets transport on
    ``/mqtt`` when asked. Connected (CONNACK 0) unless ``connect`` is false. The caller closes it."""
    c = MqttClient(at(port), protocol=protocol, transport=transport)
    if transport == "websockets":
        c.client.ws_set_options(path="/mqtt")
    if context is not None:
        c.client.tls_set_context(context)
    elif ca is not None:
        c.client.tls_set(ca_certs=ca, certfile=cert, keyfile=key)
    if connect:
        try:
            c.connect(timeout=timeout)
        except BaseException:
            c.close()
            raise
    return c


def paho_accepted(port, **kw):
    """Whether a paho client gets a successful CONNACK (any TLS or connection error is a no)."""
    c = paho(port, connect=False, **kw)
    try:
        c.connect(timeout=3)
        return True
    except (AssertionError, OSError, ssl.SSLError):
        return False
    finally:
        c.close()


def round_trip(sub, pub, topic):
    sub.subscribe(topic, qos=1)
    pub.publish(topic, b"over the wire", qos=1)
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload) == (topic, b"over the wire")


# ---- TLS --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3], ids=["tls1.2", "tls1.3"])
def test_paho_over_tls_each_version(tls_broker, pki, version):
    b = tls_broker()
    ctx = ssl.create_default_context(cafile=pki.path("ca.pem"))
    ctx.minimum_version = ctx.maximum_version = version
    sub = paho(b.tls_port, context=ctx, protocol=MQTTv5)
    pub = helpers.connect_client(b)  # plain TCP
    try:
        assert sub.client.socket().version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                                                  ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
        round_trip(sub, pub, unique("tls"))
    finally:
        sub.close()
        pub.close()


def test_min_version_1_3_refuses_tls_1_2(tls_broker, pki):
    b = tls_broker(tls__min_version="1.3")
    ctx = ssl.create_default_context(cafile=pki.path("ca.pem"))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    assert not paho_accepted(b.tls_port, context=ctx)
    assert paho_accepted(b.tls_port, ca=pki.path("ca.pem"))


def test_client_certificate_required(tls_broker, pki):
    b = tls_broker(tls__client_auth="require", tls__client_ca=pki.path("clients.pem"),
                   tls__use_cn_as_username=True)
    ca = pki.path("ca.pem")
    assert not paho_accepted(b.tls_port, ca=ca), "accepted without a client certificate"
    pki.issue("mallory", "mallory", ca="ca", sans=())  # signed by the wrong CA
    assert not paho_accepted(b.tls_port, ca=ca, cert=pki.path("mallory.pem"), key=pki.path("mallory.key"))
    assert "username=mallory" not in b.log_text()
    c = paho(b.tls_port, ca=ca, cert=pki.path("alice.pem"), key=pki.path("alice.key"))
    try:
        round_trip(c, c, unique("cert"))
    finally:
        c.close()
    # The certificate's CN became the session's user name.
    wait_until(lambda: "username=alice" in b.log_text(), message="the CN in the broker log")


def test_client_certificate_name_is_the_identity_for_authentication_and_acl(tls_broker, pki, tmp_path):
    """With anonymous access off, a client whose certificate says CN=alice is alice: accepted
    without credentials, and the ACL rules for user alice apply to it."""
    rules = tmp_path / "acl"
    rules.write_text("allow user:alice both alice/#\n")
    b = tls_broker(tls__client_auth="require", tls__client_ca=pki.path("clients.pem"),
                   tls__use_cn_as_username=True, auth__allow_anonymous=False, **{"acl__file": str(rules)})
    # Plain TCP without credentials is refused: anonymous access is off.
    with pytest.raises(AssertionError):
        helpers.connect_client(b)
    c = paho(b.tls_port, ca=pki.path("ca.pem"), cert=pki.path("alice.pem"), key=pki.path("alice.key"))
    try:
        assert c.subscribe([("alice/#", 1), ("bob/#", 1)]) == [1, 128]
        round_trip(c, c, "alice/" + unique("t"))
    finally:
        c.close()


def test_client_certificate_optional_and_san_as_username(tls_broker, pki):
    b = tls_broker(tls__client_auth="optional", tls__client_ca=pki.path("clients.pem"),
                   tls__use_cn_as_username=True)
    ca = pki.path("ca.pem")
    assert paho_accepted(b.tls_port, ca=ca), "optional: refused without a client certificate"
    pki.issue("device", None, ca="clients", sans=("DNS:device-7.example",))
    assert paho_accepted(b.tls_port, ca=ca, cert=pki.path("device.pem"), key=pki.path("device.key"))
    wait_until(lambda: "username=device-7.example" in b.log_text(), message="the SAN in the broker log")
    pki.issue("mallory", "mallory", ca="ca", sans=())
    assert not paho_accepted(b.tls_port, ca=ca, cert=pki.path("mallory.pem"), key=pki.path("mallory.key"))


def test_sighup_reloads_the_certificate(tls_broker, pki):
    b = tls_broker(tls__reload_interval_secs=0)  # SIGHUP only
    old = paho(b.tls_port, ca=pki.path("ca.pem"))
    try:
        pki.ca("next")
        new_cert, new_key = pki.issue("next-server", "braid test server", ca="next")
        shutil.copy(new_cert, pki.path("server.pem"))
        shutil.copy(new_key, pki.path("server.key"))
        assert not paho_accepted(b.tls_port, ca=pki.path("next.pem")), "reloaded without SIGHUP"
        os.kill(b.proc.pid, signal.SIGHUP)
        wait_until(lambda: paho_accepted(b.tls_port, ca=pki.path("next.pem")), message="the new certificate")
        assert not paho_accepted(b.tls_port, ca=pki.path("ca.pem"))
        assert "TLS certificates reloaded (SIGHUP)" in b.log_text()
        # The connection opened with the old certificate goes on.
        round_trip(old, old, unique("after-reload"))
    finally:
        old.close()


def test_bad_certificate_path_stops_the_broker(tmp_path):
    proc = subprocess.run(
        [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
         "--set", f'listeners.tls="127.0.0.1:{free_port()}"',
         "--set", f'tls.cert="{tmp_path}/missing.pem"', "--set", f'tls.key="{tmp_path}/missing.key"'],
        capture_output=True, timeout=TIMEOUT, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "tls.cert" in proc.stderr and f"{tmp_path}/missing.pem" in proc.stderr, proc.stderr


def test_mosquitto_clients_over_tls(tls_broker, pki):
    b = tls_broker(tls__client_auth="optional", tls__client_ca=pki.path("clients.pem"))
    topic = unique("mosq-tls")
    ca = ["--cafile", pki.path("ca.pem")]
    sub = start_mosquitto_sub(at(b.tls_port), topic, qos=1, extra=ca)
    try:
        mosquitto_pub(at(b.tls_port), topic, "plain TLS", qos=1, extra=ca)
        mosquitto_pub(at(b.tls_port), topic, "with a client certificate", qos=1,
                      extra=ca + ["--cert", pki.path("alice.pem"), "--key", pki.path("alice.key")])
        assert [m.payload for m in sub.wait_messages(2)] == [b"plain TLS", b"with a client certificate"]
    finally:
        sub.stop()


# ---- WebSocket ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=helpers.proto_id)
def test_paho_over_websocket_and_wss(tls_broker, pki, protocol):
    b = tls_broker()
    ws = paho(b.ws_port, protocol=protocol, transport="websockets")
    wss = paho(b.wss_port, protocol=protocol, transport="websockets", ca=pki.path("ca.pem"))
    tcp = helpers.connect_client(b, protocol=protocol)
    try:
        topic = unique("ws")
        for c in (ws, wss, tcp):
            c.subscribe(topic + "/#", qos=1)
        big = os.urandom(300_000)
        ws.publish(topic + "/a", big, qos=1)
        wss.publish(topic + "/b", b"from wss", qos=2)
        for c in (ws, wss, tcp):
            got = sorted((m.topic, m.payload) for m in c.wait_messages(2))
            assert got == [(topic + "/a", big), (topic + "/b", b"from wss")]
    finally:
        for c in (ws, wss, tcp):
            c.close()


class RawWs:
    """A hand-made WebSocket client: the test decides how MQTT bytes are cut into frames."""

    def __init__(self, port, path="/mqtt", protocols=("mqtt",)):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        if protocols:
            lines.append("Sec-WebSocket-Protocol: " + ", ".join(protocols))
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                break
            head += chunk
        status, *headers = head.decode("latin-1").split("\r\n")
        self.status = int(status.split()[1]) if status else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in headers if h)}
        self.buf = b""
        self.mqtt = b""

    def send_frame(self, opcode, payload, fin=True):
        mask = os.urandom(4)
        head = bytes([(0x80 if fin else 0) | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed by the broker")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self):
        """(opcode, payload) of the next frame from the broker (which never masks)."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", self._read(8))[0]
        return b0 & 0x0F, self._read(n)

    def recv_packet(self):
        """The next MQTT packet type from the binary frames, however they were cut."""
        while True:
            if len(self.mqtt) >= 2:
                length, mult, i = 0, 1, 1
                while i < len(self.mqtt) and i <= 4:
                    length += (self.mqtt[i] & 0x7F) * mult
                    mult *= 128
                    if not self.mqtt[i] & 0x80:
                        break
                    i += 1
                end = i + 1 + length
                if i < len(self.mqtt) and len(self.mqtt) >= end:
                    packet, self.mqtt = self.mqtt[:end], self.mqtt[end:]
                    return packet[0] >> 4
            opcode, payload = self.recv_frame()
            assert opcode in (0x0, 0x2), f"expected a binary frame, got opcode {opcode}"
            self.mqtt += payload

    def close(self):
        self.sock.close()


def test_websocket_handshake_path_and_subprotocols(tls_broker):
    b = tls_broker()
    for offered, echoed in [(("mqtt",), "mqtt"), (("mqttv3.1",), "mqttv3.1"),
                            (("chat", "mqtt"), "mqtt"), ((), None)]:
        ws = RawWs(b.ws_port, protocols=offered)
        assert ws.status == 101, offered
        assert ws.headers.get("sec-websocket-protocol") == echoed, offered
        ws.close()
    for kw, status in [({"protocols": ("chat",)}, 400), ({"path": "/other"}, 404)]:
        ws = RawWs(b.ws_port, **kw)
        assert ws.status == status, kw
        ws.close()


def test_websocket_packets_split_across_frames_and_several_per_frame(tls_broker):
    b = tls_broker()
    ws = RawWs(b.ws_port)
    try:
        connect = helpers.connect_packet(unique("raw-ws"))
        # CONNECT over two messages, the second one fragmented into two frames.
        ws.send_frame(0x2, connect[:3])
        ws.send_frame(0x2, connect[3:10], fin=False)
        ws.send_frame(0x0, connect[10:])
        assert ws.recv_packet() == helpers.CONNACK
        # A ping between messages is answered with the same payload.
        ws.send_frame(0x9, b"are you there")
        assert ws.recv_frame() == (0xA, b"are you there")
        # SUBSCRIBE, PUBLISH (QoS 1) and PINGREQ in one frame.
        topic = unique("raw")
        ws.send_frame(0x2, helpers.subscribe_packet(1, [(topic, 1)])
                      + helpers.publish_packet(topic, b"one frame", qos=1, packet_id=2)
                      + helpers.pingreq_packet())
        got = sorted(ws.recv_packet() for _ in range(4))
        assert got == sorted([helpers.SUBACK, helpers.PUBACK, helpers.PUBLISH, helpers.PINGRESP])
        # A close frame is answered with a close frame.
        ws.send_frame(0x8, struct.pack("!H", 1000))
        opcode, _ = ws.recv_frame()
        assert opcode == 0x8
    finally:
        ws.close()


def test_websocket_text_frame_closes_the_connection(tls_broker):
    b = tls_broker()
    ws = RawWs(b.ws_port)
    try:
        ws.send_frame(0x2, helpers.connect_packet(unique("text")))
        assert ws.recv_packet() == helpers.CONNACK
        ws.send_frame(0x1, b"\xc0\x00")  # PINGREQ, but as text
        with pytest.raises((ConnectionError, OSError)):
            while True:
                opcode, _ = ws.recv_frame()
                assert opcode in (0x8, 0x2), opcode
                if opcode == 0x8:
                    raise ConnectionError("closed")
    finally:
        ws.close()


def test_slow_upload_in_one_frame_keeps_a_websocket_client_alive(tls_broker, connect):
    """websocket-client sends one 300 KB PUBLISH in a single binary frame, trickled over about
    5 s, with keep alive 2: every byte that arrives counts as liveness, as on TCP, so the client
    is not dropped after 3 s and the message is delivered."""
    b = tls_broker()
    topic = unique("ws-slow")
    watcher = connect(b, protocol=MQTTv311)
    watcher.subscribe(topic, qos=1)
    ws = websocket.create_connection(f"ws://127.0.0.1:{b.ws_port}/mqtt", subprotocols=["mqtt"],
                                     timeout=TIMEOUT)
    try:
        ws.send_binary(helpers.connect_packet(unique("ws-slow-pub"), keepalive=2))
        assert ws.recv()[0] >> 4 == helpers.CONNACK
        payload = bytes(i * 7 % 251 for i in range(300_000))
        packet = helpers.publish_packet(topic, payload, qos=1, packet_id=7)
        frame = websocket.ABNF.create_frame(packet, websocket.ABNF.OPCODE_BINARY).format()
        step = -(-len(frame) // 50)
        started = time.monotonic()
        for i in range(0, len(frame), step):
            if i:
                time.sleep(0.1)
            ws.sock.sendall(frame[i:i + step])
        assert time.monotonic() - started > 4, "the frame took longer than 1.5 x keep alive"
        assert ws.recv()[0] >> 4 == helpers.PUBACK
        [m] = watcher.wait_messages(1)
        assert m.payload == payload
        ws.send_binary(helpers.pingreq_packet())
        assert ws.recv()[0] >> 4 == 13, "PINGRESP: still connected"
    finally:
        ws.close()


# ---- MQTT.js (Node and Chromium) and braid pub/sub --------------------------------------------------

def mqttjs(mode, url, topic, ca=None):
    cmd = ["node", os.path.join(JS_DIR, "mqttjs.js"), mode, url, topic] + ([ca] if ca else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=JS_DIR)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"mqtt.js failed: {proc.stdout}{proc.stderr}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("mode", ["node", "browser"])
@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_mqttjs_over_websocket(tls_broker, pki, connect, mode, scheme):
    b = tls_broker()
    topic = unique(f"js-{mode}-{scheme}")
    watcher = connect(b, protocol=MQTTv5)
    watcher.subscribe(topic + "/out", qos=1)
    port = b.ws_port if scheme == "ws" else b.wss_port
    ca = pki.path("ca.pem") if scheme == "wss" and mode == "node" else None
    result = mqttjs(mode, f"{scheme}://localhost:{port}/mqtt", topic, ca)
    assert sorted(result["received"]) == [[topic + "/echo", 5], [topic + "/echo", 200 * 1024]], result
    [m] = watcher.wait_messages(1)
    assert (m.topic, m.payload) == (topic + "/out", b"from mqtt.js")


@pytest.mark.parametrize("flags", [["--tls"], ["--ws"], ["--ws", "-S"]], ids=["tls", "ws", "wss"])
def test_braid_pub_sub_cli_over_each_transport(tls_broker, pki, flags):
    b = tls_broker()
    port = {"--tls": b.tls_port, "--ws": b.ws_port}[flags[0]] if flags != ["--ws", "-S"] else b.wss_port
    tls = ["--cafile", pki.path("ca.pem")] if flags != ["--ws"] else []
    topic = unique("cli")
    common = ["-h", "localhost", "-p", str(port), *flags, *tls, "-t", topic, "-q", "1"]
    sub = subprocess.Popen([BRAID_BIN, "sub", *common, "-C", "1", "-d"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Published once the subscription is in place (retained, so the order does not matter).
        pub = subprocess.run([BRAID_BIN, "pub", *common, "-r", "-m", "over " + " ".join(flags)],
                             capture_output=True, text=True, timeout=TIMEOUT)
        assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=TIMEOUT)
        assert sub.returncode == 0, err
        assert out.strip() == "over " + " ".join(flags)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()


def test_a_listener_queue_policy_applies_to_its_own_clients(tls_broker, connect):
    """``[session.listeners.ws]`` turns QoS 0 pacing off for WebSocket clients only. A paho
    publisher floods 200 QoS 0 messages of 64 KiB at a subscriber that reads nothing for 300 ms,
    with session queues of 20: a plain TCP subscriber paces the publisher and gets every
    message; a WebSocket one does not, so its queue overflows."""
    b = tls_broker(session__max_queued_messages=20, session__listeners__ws__qos0_pacing_ms=0)
    pub = connect(b)

    def flood(topic):
        for i in range(200):
            pub.publish(topic, f"{i:08}".encode().ljust(64 * 1024, b"."), qos=0, wait=False)
        time.sleep(0.3)

    ws, ws_topic = RawWs(b.ws_port), unique("lp-ws")
    ws.send_frame(0x2, helpers.connect_packet(unique("ws-sub")))
    assert ws.recv_packet() == helpers.CONNACK
    ws.send_frame(0x2, helpers.subscribe_packet(1, [(ws_topic, 0)]))
    assert ws.recv_packet() == helpers.SUBACK
    flood(ws_topic)
    ws.sock.settimeout(1.0)
    over_ws = 0
    try:
        while ws.recv_packet() == helpers.PUBLISH:
            over_ws += 1
    except socket.timeout:
        pass
    ws.close()
    assert 0 < over_ws < 200

    tcp, tcp_topic = raw_v5.Raw5(b), unique("lp-tcp")
    tcp.connect5(unique("tcp-sub"))
    tcp.subscribe5([(tcp_topic, 0)])
    flood(tcp_topic)
    assert [int(p.payload[:8]) for p in tcp.publishes(10.0, n=200)] == list(range(200))
    tcp.close()
