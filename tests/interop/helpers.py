"""Shared client helpers for the interop suite (imported by every test_*.py file).

Three kinds of independent clients drive the broker:

* ``connect_client(broker, ...)`` -> :class:`MqttClient`: a paho-mqtt 2.x client whose network loop
  runs in a background thread, already connected (CONNACK received) when returned. Received
  PUBLISHes are collected as :class:`Msg` records in a queue; ``wait_messages(n)`` /
  ``expect_no_message()`` read them with timeouts. Never auto-reconnects.
* ``start_mosquitto_sub(broker, topics, ...)`` -> :class:`MosquittoSub` and ``mosquitto_pub(...)``:
  Debian's command-line clients, run as subprocesses.
* :class:`RawClient` plus the ``*_packet()`` builders: a plain TCP socket on which a test writes
  MQTT bytes by hand (malformed input, exact CONNECT flags, a client that goes silent, ...).

Every wait takes a ``timeout`` (seconds, default ``TIMEOUT`` = 5) and fails the test instead of
hanging. Prefer the conftest fixtures ``connect`` / ``mosquitto_sub`` / ``raw_client``, which also
close the clients at the end of the test.

Example::

    def test_hello(broker, connect):
        sub = connect(broker)                       # MQTT 3.1.1, clean session, random id
        sub.subscribe("a/#", qos=1)
        pub = connect(broker, protocol=MQTTv5)
        pub.publish("a/b", b"hi", qos=1)           # waits for PUBACK
        [m] = sub.wait_messages(1)
        assert (m.topic, m.payload, m.qos) == ("a/b", b"hi", 1)
"""
from __future__ import annotations

import binascii
import dataclasses
import os
import queue
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import paho.mqtt.client as paho
from paho.mqtt.client import MQTTv31, MQTTv311, MQTTv5  # noqa: F401  (re-exported)
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties  # noqa: F401  (re-exported)
from paho.mqtt.packettypes import PacketTypes  # noqa: F401  (re-exported)
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: F401  (re-exported)

TIMEOUT = 5.0
"""Default upper bound, in seconds, for any single wait."""

PROTOCOL_NAMES = {MQTTv31: "v3.1", MQTTv311: "v3.1.1", MQTTv5: "v5"}
V3_PROTOCOLS = [MQTTv31, MQTTv311]
ALL_PROTOCOLS = [MQTTv31, MQTTv311, MQTTv5]


def proto_id(protocol) -> str:
    """pytest id for a paho protocol constant: ``proto_id(MQTTv311) == "v3.1.1"``."""
    return PROTOCOL_NAMES.get(protocol, str(protocol))


def unique(prefix: str = "t") -> str:
    """A unique name (for topics / client ids) so tests never see each other's traffic."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(predicate, timeout: float = TIMEOUT, interval: float = 0.02, message: str = "condition"):
    """Poll ``predicate()`` until it returns a truthy value (returned) or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------------
# Received messages
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Msg:
    """One received PUBLISH, as seen by a client.

    ``topic`` is the decoded topic (str), ``payload`` bytes, ``qos`` the delivered QoS, ``retain`` the
    RETAIN flag on delivery, ``dup`` the DUP flag, ``properties`` the paho v5 Properties (or None),
    ``mid`` the packet id (0 for QoS 0), ``received_at`` a time.monotonic() stamp.
    """
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool = False
    properties: Any = None
    mid: int = 0
    received_at: float = 0.0


class MessageCollector:
    """A thread-safe queue of :class:`Msg` with timed reads (base of MqttClient and MosquittoSub)."""

    def __init__(self):
        self.messages: "queue.Queue[Msg]" = queue.Queue()
        self.received: List[Msg] = []  # everything ever received, in order (never drained)

    def _put(self, msg: Msg):
        self.received.append(msg)
        self.messages.put(msg)

    def get_message(self, timeout: float = TIMEOUT) -> Msg:
        """Next received message; fails the test if none arrives within ``timeout`` s."""
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message received within {timeout}s") from None

    def wait_messages(self, n: int, timeout: float = TIMEOUT) -> List[Msg]:
        """The next ``n`` messages, in arrival order; fails if fewer arrive within ``timeout`` s total."""
        deadline = time.monotonic() + timeout
        got: List[Msg] = []
        while len(got) < n:
            left = deadline - time.monotonic()
            try:
                got.append(self.messages.get(timeout=max(left, 0.001)))
            except queue.Empty:
                raise AssertionError(
                    f"expected {n} messages within {timeout}s, got {len(got)}: "
                    f"{[(m.topic, m.payload[:40]) for m in got]}") from None
        return got

    def collect(self, duration: float) -> List[Msg]:
        """Every message that arrives during the next ``duration`` s (plus any already queued)."""
        deadline = time.monotonic() + duration
        got: List[Msg] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                got.append(self.messages.get(timeout=left))
            except queue.Empty:
                break
        return got + self.drain()

    def expect_no_message(self, within: float = 0.5) -> None:
        """Fail if any message is (or gets) queued during the next ``within`` s."""
        try:
            m = self.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message on {m.topic!r}: {m.payload[:60]!r} (qos {m.qos}, retain {m.retain})")

    def drain(self) -> List[Msg]:
        """Remove and return whatever is queued right now, without waiting."""
        out = []
        while True:
            try:
                out.append(self.messages.get_nowait())
            except queue.Empty:
                return out


def wait_total(collectors: Sequence[MessageCollector], n: int, timeout: float = TIMEOUT,
               settle: float = 0.3) -> List[Msg]:
    """Wait until ``collectors`` (clients / mosquitto_subs) have together received at least ``n``
    messages (counted in their ``received`` lists), then ``settle`` s more for stragglers; returns
    all their received messages (not removed from their queues). For shared subscriptions."""
    deadline = time.monotonic() + timeout
    while sum(len(c.received) for c in collectors) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {n} messages in total within {timeout}s, got "
                                 f"{[len(c.received) for c in collectors]}")
        time.sleep(0.01)
    if settle:
        time.sleep(settle)
    return [m for c in collectors for m in c.received]


# --------------------------------------------------------------------------------------------------
# paho-mqtt client
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ConnAck:
    """What the broker answered to CONNECT: ``reason_code`` int (3.x return code mapped by paho to
    its v5 reason code: 0 = success), ``session_present`` bool, ``properties`` (v5) or None."""
    reason_code: int
    session_present: bool
    properties: Any = None


class MqttClient(MessageCollector):
    """A paho-mqtt 2.x client with its network loop in a background thread.

    Attributes: ``client`` (the paho.mqtt.client.Client, for anything not wrapped here),
    ``client_id``, ``protocol``, ``connack`` (:class:`ConnAck`, after connect), ``disconnected``
    (threading.Event set when the connection ends), ``disconnect_reason`` (paho ReasonCode or None),
    ``disconnect_properties`` (v5 DISCONNECT properties from the server, or None).

    With ``manual_ack=True`` received QoS 1 messages are not acknowledged until ``ack(msg)``
    (a client that holds messages unacknowledged). QoS 2 is not held: paho sends PUBREC at once
    and only withholds PUBCOMP; use raw_v5.Raw5 to hold a QoS 2 PUBLISH unacknowledged.
    """

    def __init__(self, broker, client_id: Optional[str] = None, protocol=MQTTv311,
                 clean_session: Optional[bool] = True, userdata=None, transport: str = "tcp",
                 manual_ack: bool = False):
        super().__init__()
        self.broker = broker
        self.protocol = protocol
        self.client_id = unique("paho") if client_id is None else client_id
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=None if protocol == MQTTv5 else clean_session,
            userdata=userdata,
            protocol=protocol,
            transport=transport,
            reconnect_on_failure=False,
            manual_ack=manual_ack,
        )
        self.client.max_inflight_messages_set(65535)
        self.client.max_queued_messages_set(0)
        self.connack: Optional[ConnAck] = None
        self.connected = threading.Event()
        self.connack_received = threading.Event()
        self.disconnected = threading.Event()
        self.disconnect_reason = None
        self.disconnect_properties = None
        self._lock = threading.Lock()
        self._acks = {}  # mid -> (Event, result)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_publish = self._on_publish

    # ---- callbacks (paho network thread) ----
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        rc = int(reason_code.value) if hasattr(reason_code, "value") else int(reason_code)
        self.connack = ConnAck(rc, bool(flags.session_present), properties)
        if rc == 0:
            self.connected.set()
        self.connack_received.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.disconnect_reason = reason_code
        self.disconnect_properties = properties
        self.connected.clear()
        self.disconnected.set()

    def _on_message(self, client, userdata, message):
        self._put(Msg(topic=message.topic, payload=bytes(message.payload), qos=message.qos,
                      retain=bool(message.retain), dup=bool(message.dup),
                      properties=getattr(message, "properties", None), mid=message.mid,
                      received_at=time.monotonic()))

    def _ack(self, mid, result):
        with self._lock:
            ev = self._acks.setdefault(mid, [threading.Event(), None])
            ev[1] = result
            ev[0].set()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties):
        self._ack(mid, [int(rc.value) if hasattr(rc, "value") else int(rc) for rc in reason_codes])

    def _on_unsubscribe(self, client, userdata, mid, reason_codes, properties):
        self._ack(mid, [int(rc.value) if hasattr(rc, "value") else int(rc) for rc in (reason_codes or [])])

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        self._ack(mid, int(reason_code.value) if hasattr(reason_code, "value") else int(reason_code))

    def _wait_ack(self, mid, what, timeout):
        with self._lock:
            ev = self._acks.setdefault(mid, [threading.Event(), None])
        if not ev[0].wait(timeout):
            raise AssertionError(f"no {what} for mid {mid} within {timeout}s")
        with self._lock:
            self._acks.pop(mid, None)
        return ev[1]

    # ---- operations ----
    def connect(self, keepalive: int = 60, clean_start=True, properties=None, will=None,
                username=None, password=None, timeout: float = TIMEOUT, expect_success: bool = True) -> ConnAck:
        """Open the TCP connection, send CONNECT, start the loop and wait for CONNACK.

        ``will`` is a dict of paho ``will_set`` kwargs (topic, payload, qos, retain, properties).
        ``clean_start`` is used for v5 only (v3 uses the constructor's clean_session).
        If ``expect_success``, fails unless the CONNACK reason code is 0; returns the :class:`ConnAck`.
        """
        if will:
            self.client.will_set(**will)
        if username is not None:
            self.client.username_pw_set(username, password)
        kw = {}
        if self.protocol == MQTTv5:
            kw["clean_start"] = clean_start
            kw["properties"] = properties
        self.client.connect(self.broker.host, self.broker.port, keepalive=keepalive, **kw)
        self.client.loop_start()
        deadline = time.monotonic() + timeout
        while not self.connack_received.is_set():
            if self.disconnected.is_set() or time.monotonic() > deadline:
                raise AssertionError(f"no CONNACK for {self.client_id!r} within {timeout}s"
                                     f" (disconnect reason {self.disconnect_reason})")
            self.connack_received.wait(0.02)
        if expect_success:
            assert self.connack.reason_code == 0, f"CONNACK refused: {self.connack}"
        return self.connack

    def subscribe(self, topic: Union[str, Sequence[Tuple[str, Any]]], qos: Union[int, Any] = 0,
                  properties=None, timeout: float = TIMEOUT) -> List[int]:
        """SUBSCRIBE and wait for SUBACK; returns the granted QoS / reason codes as ints.

        ``topic`` is a filter string (with ``qos`` an int or a paho SubscribeOptions for v5), or a
        list of (filter, qos_or_SubscribeOptions) pairs.
        """
        if isinstance(topic, str):
            if isinstance(qos, SubscribeOptions):
                rc, mid = self.client.subscribe(topic, options=qos, properties=properties)
            else:
                rc, mid = self.client.subscribe(topic, qos, properties=properties)
        else:
            rc, mid = self.client.subscribe(list(topic), properties=properties)
        assert rc == paho.MQTT_ERR_SUCCESS, f"subscribe failed locally: {rc}"
        return self._wait_ack(mid, "SUBACK", timeout)

    def unsubscribe(self, topic: Union[str, List[str]], properties=None, timeout: float = TIMEOUT) -> List[int]:
        """UNSUBSCRIBE and wait for UNSUBACK; returns v5 reason codes (empty list for 3.x)."""
        rc, mid = self.client.unsubscribe(topic, properties=properties)
        assert rc == paho.MQTT_ERR_SUCCESS, f"unsubscribe failed locally: {rc}"
        return self._wait_ack(mid, "UNSUBACK", timeout)

    def publish(self, topic: str, payload: Union[bytes, str, None] = b"", qos: int = 0, retain: bool = False,
                properties=None, wait: bool = True, timeout: float = TIMEOUT):
        """PUBLISH. With ``wait`` (default), block until the QoS flow completes (QoS 0: written to
        the socket; QoS 1: PUBACK; QoS 2: PUBCOMP) and return the reason code as int (v5 PUBACK /
        PUBREC reason, 0 otherwise). Without ``wait``, return the paho MQTTMessageInfo at once."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            raise AssertionError(f"publish to {topic!r} failed locally: {paho.error_string(info.rc)}")
        if not wait:
            return info
        if qos == 0:
            deadline = time.monotonic() + timeout
            while not info.is_published():
                if time.monotonic() > deadline:
                    raise AssertionError(f"QoS 0 publish to {topic!r} not written within {timeout}s")
                time.sleep(0.005)
            return 0
        return self._wait_ack(info.mid, "PUBACK/PUBCOMP", timeout)

    def ack(self, msg: Msg) -> None:
        """With ``manual_ack=True``: acknowledge the received QoS 1 ``msg`` now (PUBACK)."""
        rc = self.client.ack(msg.mid, msg.qos)
        assert rc == paho.MQTT_ERR_SUCCESS, f"ack of mid {msg.mid} failed locally: {rc}"

    def disconnect(self, reasoncode=None, properties=None, timeout: float = TIMEOUT) -> None:
        """Normal close: send DISCONNECT, wait for the connection to end, stop the loop thread."""
        if self.connected.is_set():
            self.client.disconnect(reasoncode=reasoncode, properties=properties)
            self.disconnected.wait(timeout)
        self.client.loop_stop()

    def kill(self) -> None:
        """Abnormal close: drop the TCP connection without sending DISCONNECT (the will fires)."""
        sock = self.client.socket()
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.disconnected.wait(2)
        self.client.loop_stop()

    def wait_disconnected(self, timeout: float = TIMEOUT):
        """Wait until the broker (or anything) ends this connection; returns the paho reason code."""
        if not self.disconnected.wait(timeout):
            raise AssertionError(f"client {self.client_id!r} still connected after {timeout}s")
        return self.disconnect_reason

    def is_connected(self) -> bool:
        return self.connected.is_set() and not self.disconnected.is_set()

    def close(self) -> None:
        """Idempotent cleanup: disconnect normally if still connected, stop the thread."""
        try:
            if self.is_connected():
                self.disconnect(timeout=1)
            else:
                self.client.loop_stop()
        except Exception:
            pass


def connect_client(broker, client_id: Optional[str] = None, protocol=MQTTv311, clean_session: bool = True,
                   clean_start: bool = True, keepalive: int = 60, will: Optional[dict] = None,
                   properties=None, username=None, password=None, timeout: float = TIMEOUT,
                   expect_success: bool = True, manual_ack: bool = False) -> MqttClient:
    """Create an :class:`MqttClient` for ``broker`` and connect it (waits for CONNACK).

    ``protocol``: MQTTv31 / MQTTv311 / MQTTv5. ``clean_session`` applies to 3.x, ``clean_start`` and
    ``properties`` (CONNECT properties, e.g. SessionExpiryInterval) to v5. ``client_id=None`` picks a
    unique id; pass ``""`` for an empty one. ``will``: dict of paho ``will_set`` kwargs. The caller
    must ``close()`` it (the ``connect`` fixture does so automatically). ``manual_ack``: QoS 1
    messages are acknowledged only by ``MqttClient.ack(msg)``.
    """
    c = MqttClient(broker, client_id=client_id, protocol=protocol, clean_session=clean_session,
                   manual_ack=manual_ack)
    try:
        c.connect(keepalive=keepalive, clean_start=clean_start, properties=properties, will=will,
                  username=username, password=password, timeout=timeout, expect_success=expect_success)
    except BaseException:
        c.close()
        raise
    return c


def v5_properties(packet_type, **values):
    """Build paho v5 Properties: ``v5_properties(PacketTypes.CONNECT, SessionExpiryInterval=60)``."""
    props = Properties(packet_type)
    for k, v in values.items():
        setattr(props, k, v)
    return props


# --------------------------------------------------------------------------------------------------
# mosquitto_pub / mosquitto_sub
# --------------------------------------------------------------------------------------------------

_SUB_FORMAT = "MSG\t%q\t%r\t%t\t%x"


def _cli_version(version) -> str:
    """Accept "mqttv311"/"mqttv5"/"mqttv31" or a paho protocol constant."""
    return {MQTTv31: "mqttv31", MQTTv311: "mqttv311", MQTTv5: "mqttv5"}.get(version, version)


class MosquittoSub(MessageCollector):
    """``mosquitto_sub`` running in the background; received messages become :class:`Msg` records.

    ``output`` holds every stdout/stderr line (debug included) for diagnostics; ``subscribed`` is
    set once SUBACK arrived. Call ``stop()`` (idempotent) when done.
    """

    def __init__(self, broker, topics: Union[str, Iterable[str]], qos: int = 0, version="mqttv311",
                 client_id: Optional[str] = None, extra: Sequence[str] = ()):
        super().__init__()
        if isinstance(topics, str):
            topics = [topics]
        self.client_id = client_id or unique("msub")
        cmd = []
        if shutil.which("stdbuf"):
            cmd += ["stdbuf", "-oL"]
        cmd += ["mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-V", _cli_version(version),
                "-q", str(qos), "-i", self.client_id, "-d", "-F", _SUB_FORMAT]
        for t in topics:
            cmd += ["-t", t]
        cmd += list(extra)
        self.cmd = cmd
        self.output: List[str] = []
        self.subscribed = threading.Event()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.output.append(line)
            if line.startswith("MSG\t"):
                _, q, r, rest = line.split("\t", 3)
                topic, _, hexpayload = rest.rpartition("\t")
                self._put(Msg(topic=topic, payload=binascii.unhexlify(hexpayload), qos=int(q),
                              retain=r == "1", received_at=time.monotonic()))
            elif "received SUBACK" in line:
                self.subscribed.set()

    def wait_subscribed(self, timeout: float = TIMEOUT) -> None:
        """Wait until mosquitto_sub got its SUBACK (fails with its output otherwise)."""
        if not self.subscribed.wait(timeout):
            raise AssertionError(f"mosquitto_sub not subscribed within {timeout}s; output: {self.output}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(2)

    close = stop


def start_mosquitto_sub(broker, topics, qos: int = 0, version="mqttv311", client_id=None,
                        extra: Sequence[str] = (), timeout: float = TIMEOUT) -> MosquittoSub:
    """Start ``mosquitto_sub -V version -q qos -t topic...`` and wait until it is subscribed.

    ``extra`` adds raw command-line arguments (e.g. ``["-c"]`` for a persistent session).
    """
    s = MosquittoSub(broker, topics, qos=qos, version=version, client_id=client_id, extra=extra)
    try:
        s.wait_subscribed(timeout)
    except BaseException:
        s.stop()
        raise
    return s


def mosquitto_pub(broker, topic: str, message: Union[bytes, str, None] = None, qos: int = 0,
                  version="mqttv311", retain: bool = False, extra: Sequence[str] = (),
                  timeout: float = TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``mosquitto_pub`` once (payload via ``-s`` from stdin; ``None`` sends an empty ``-n``).

    Returns the CompletedProcess (stdout/stderr bytes); with ``check`` fails on non-zero exit.
    """
    cmd = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-V", _cli_version(version),
           "-q", str(qos), "-t", topic]
    stdin = None
    if message is None:
        cmd.append("-n")
    else:
        cmd.append("-s")
        stdin = message.encode() if isinstance(message, str) else message
    if retain:
        cmd.append("-r")
    cmd += list(extra)
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"mosquitto_pub failed ({proc.returncode}): {proc.stderr!r}"
    return proc


# --------------------------------------------------------------------------------------------------
# Raw MQTT bytes over a plain socket
# --------------------------------------------------------------------------------------------------

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15


def encode_varint(n: int) -> bytes:
    """MQTT Variable Byte Integer (used for the Remaining Length)."""
    out = bytearray()
    while True:
        b = n % 128
        n //= 128
        if n:
            b |= 0x80
        out.append(b)
        if not n:
            return bytes(out)


def mqtt_bytes(data: Union[bytes, str]) -> bytes:
    """Two-byte length prefix + data (an MQTT UTF-8 string or binary field); str is UTF-8 encoded."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return struct.pack("!H", len(data)) + data


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    """A full control packet: fixed header (type<<4 | flags, Remaining Length) + ``body``."""
    return bytes([(ptype << 4) | flags]) + encode_varint(len(body)) + body


def connect_packet(client_id: Union[bytes, str] = "", clean: bool = True, keepalive: int = 60,
                   protocol_name: Union[bytes, str] = "MQTT", level: int = 4,
                   will: Optional[Tuple[str, bytes, int, bool]] = None, username=None, password=None,
                   reserved: bool = False, properties: bytes = b"\x00", flags: Optional[int] = None) -> bytes:
    """CONNECT bytes. ``level`` 3 (with protocol_name "MQIsdp") = 3.1, 4 = 3.1.1, 5 = v5 (then
    ``properties`` is the raw encoded property block, default empty; the will gets an empty one).
    ``will`` = (topic, payload, qos, retain). ``reserved`` sets the reserved flag bit 0.
    ``flags`` overrides the computed connect-flags byte entirely."""
    f = 0x02 if clean else 0
    if reserved:
        f |= 0x01
    payload = mqtt_bytes(client_id)
    if will:
        wt, wp, wq, wr = will
        f |= 0x04 | (wq << 3) | (0x20 if wr else 0)
        if level == 5:
            payload += b"\x00"
        payload += mqtt_bytes(wt) + mqtt_bytes(wp)
    if username is not None:
        f |= 0x80
        payload += mqtt_bytes(username)
    if password is not None:
        f |= 0x40
        payload += mqtt_bytes(password)
    if flags is not None:
        f = flags
    var = mqtt_bytes(protocol_name) + bytes([level, f]) + struct.pack("!H", keepalive)
    if level == 5:
        var += properties
    return packet(CONNECT, 0, var + payload)


def publish_packet(topic: Union[bytes, str], payload: bytes = b"", qos: int = 0, packet_id: int = 1,
                   dup: bool = False, retain: bool = False, properties: Optional[bytes] = None) -> bytes:
    """PUBLISH bytes; ``topic`` may be raw bytes (e.g. invalid UTF-8). ``properties`` (raw encoded
    v5 property block, e.g. b"\\x00") must be given for a v5 connection and omitted for 3.x."""
    flags = (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    body = mqtt_bytes(topic)
    if qos:
        body += struct.pack("!H", packet_id)
    if properties is not None:
        body += properties
    return packet(PUBLISH, flags, body + payload)


def pubrel_packet(packet_id: int) -> bytes:
    return packet(PUBREL, 0x02, struct.pack("!H", packet_id))


def puback_packet(packet_id: int) -> bytes:
    return packet(PUBACK, 0, struct.pack("!H", packet_id))


def pubrec_packet(packet_id: int) -> bytes:
    return packet(PUBREC, 0, struct.pack("!H", packet_id))


def pubcomp_packet(packet_id: int) -> bytes:
    return packet(PUBCOMP, 0, struct.pack("!H", packet_id))


def subscribe_packet(packet_id: int, filters: Sequence[Tuple[str, int]], properties: Optional[bytes] = None) -> bytes:
    """SUBSCRIBE bytes; ``filters`` = [(filter, qos_or_v5_options_byte)]; ``properties`` for v5."""
    body = struct.pack("!H", packet_id) + (properties if properties is not None else b"")
    for f, q in filters:
        body += mqtt_bytes(f) + bytes([q])
    return packet(SUBSCRIBE, 0x02, body)


def pingreq_packet() -> bytes:
    return packet(PINGREQ, 0, b"")


def disconnect_packet() -> bytes:
    return packet(DISCONNECT, 0, b"")


@dataclasses.dataclass
class RawPacket:
    """A control packet read off a raw socket: ``type`` (1..15), ``flags`` (low nibble), ``body``."""
    type: int
    flags: int
    body: bytes


class RawClient:
    """A plain TCP connection to the broker for hand-written MQTT bytes.

    ``send(bytes)``; ``recv_packet(timeout)`` returns the next :class:`RawPacket` or None when the
    broker closed the connection; ``expect_closed(timeout)`` asserts the broker closes it (any
    packets received before the close are returned).
    """

    def __init__(self, broker, timeout: float = TIMEOUT):
        self.sock = socket.create_connection((broker.host, broker.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self.closed_by_peer = False

    def send(self, data: bytes) -> bool:
        """Write bytes; returns False (instead of raising) if the broker already closed the socket."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def _fill(self, deadline: float) -> bool:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError from None
        except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError):
            chunk = b""
        if not chunk:
            self.closed_by_peer = True
            return False
        self._buf += chunk
        return True

    def recv_packet(self, timeout: float = TIMEOUT) -> Optional[RawPacket]:
        """Next packet, or None if the connection was closed; fails on timeout."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if len(self._buf) >= 2:
                    mult, length, i = 1, 0, 1
                    complete = False
                    while i < len(self._buf) and i <= 4:
                        b = self._buf[i]
                        length += (b & 0x7F) * mult
                        mult *= 128
                        i += 1
                        if not b & 0x80:
                            complete = True
                            break
                    if complete and len(self._buf) >= i + length:
                        h = self._buf[0]
                        p = RawPacket(h >> 4, h & 0x0F, self._buf[i:i + length])
                        self._buf = self._buf[i + length:]
                        return p
                if self.closed_by_peer or not self._fill(deadline):
                    return None
        except TimeoutError:
            raise AssertionError(f"no packet from broker within {timeout}s") from None

    def expect_packet(self, ptype: int, timeout: float = TIMEOUT) -> RawPacket:
        """Next packet, asserting its type (e.g. ``expect_packet(CONNACK)``)."""
        p = self.recv_packet(timeout)
        assert p is not None, f"connection closed while waiting for packet type {ptype}"
        assert p.type == ptype, f"expected packet type {ptype}, got {p.type} ({p.body!r})"
        return p

    def connect(self, client_id: str = "", clean: bool = True, keepalive: int = 60, level: int = 4,
                timeout: float = TIMEOUT, **kw) -> RawPacket:
        """Send CONNECT (see :func:`connect_packet`) and return the CONNACK packet (asserts type)."""
        name = "MQIsdp" if level == 3 else "MQTT"
        self.send(connect_packet(client_id, clean=clean, keepalive=keepalive, level=level,
                                 protocol_name=kw.pop("protocol_name", name), **kw))
        return self.expect_packet(CONNACK, timeout)

    def is_closed(self, timeout: float = TIMEOUT) -> bool:
        """True if the broker closes the connection within ``timeout`` s (packets are discarded)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                if self.recv_packet(left) is None:
                    return True
            except AssertionError:
                return False

    def expect_closed(self, timeout: float = TIMEOUT) -> List[RawPacket]:
        """Assert the broker closes the connection within ``timeout`` s; returns packets seen first."""
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            left = deadline - time.monotonic()
            try:
                p = self.recv_packet(max(left, 0.001))
            except AssertionError:
                raise AssertionError(f"broker did not close the connection within {timeout}s "
                                     f"(packets seen: {[(x.type, x.body) for x in seen]})") from None
            if p is None:
                return seen
            seen.append(p)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def connack_return_code(p: RawPacket) -> int:
    """Return code (3.x) / reason code (v5) of a raw CONNACK packet."""
    return p.body[1]


def connack_session_present(p: RawPacket) -> bool:
    return bool(p.body[0] & 0x01)


def decode_publish(p: RawPacket, v5: bool = False) -> Msg:
    """Decode a raw PUBLISH :class:`RawPacket` into a :class:`Msg` (v5 properties kept raw, skipped)."""
    qos = (p.flags >> 1) & 3
    (tlen,) = struct.unpack("!H", p.body[:2])
    topic = p.body[2:2 + tlen].decode("utf-8", "replace")
    i = 2 + tlen
    mid = 0
    if qos:
        (mid,) = struct.unpack("!H", p.body[i:i + 2])
        i += 2
    if v5:
        mult, plen = 1, 0
        while True:
            b = p.body[i]
            i += 1
            plen += (b & 0x7F) * mult
            mult *= 128
            if not b & 0x80:
                break
        i += plen
    return Msg(topic=topic, payload=p.body[i:], qos=qos, retain=bool(p.flags & 1), dup=bool(p.flags & 8),
               mid=mid, received_at=time.monotonic())


def mosquitto_target() -> bool:
    """True when the suite runs against Mosquitto (BRAID_TEST_BROKER=mosquitto) instead of Braid."""
    return os.environ.get("BRAID_TEST_BROKER", "braid") == "mosquitto"
