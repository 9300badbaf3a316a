"""A tiny raw MQTT 5.0 packet builder/parser for what paho cannot express (or hides).

Only what the v5 interop tests need: CONNECT, PUBLISH, PUBACK/PUBREC/PUBREL/PUBCOMP,
SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT out; every packet type in, with properties.
"""
import struct
import time

import helpers

from helpers import (  # noqa: F401  (packet types, re-exported)
    AUTH, CONNACK, CONNECT, DISCONNECT, PINGREQ, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREC, PUBREL,
    SUBACK, SUBSCRIBE, UNSUBACK, UNSUBSCRIBE)

# Property identifiers
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
WILL_DELAY_INTERVAL = 0x18
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_KIND = {
    0x01: "byte", 0x02: "u32", 0x03: "str", 0x08: "str", 0x09: "bin", 0x0B: "varint",
    0x11: "u32", 0x12: "str", 0x13: "u16", 0x15: "str", 0x16: "bin", 0x17: "byte",
    0x18: "u32", 0x19: "byte", 0x1A: "str", 0x1C: "str", 0x1F: "str", 0x21: "u16",
    0x22: "u16", 0x23: "u16", 0x24: "byte", 0x25: "byte", 0x26: "pair", 0x27: "u32",
    0x28: "byte", 0x29: "byte", 0x2A: "byte",
}


varint = helpers.encode_varint
packet = helpers.packet


def read_varint(buf, pos):
    mult, value = 1, 0
    for _ in range(4):
        b = buf[pos]
        pos += 1
        value += (b & 0x7F) * mult
        if not b & 0x80:
            return value, pos
        mult *= 128
    raise ValueError("malformed variable byte integer")


def utf8(s):
    return helpers.mqtt_bytes(s if isinstance(s, str) else bytes(s))


binary = utf8


def encode_props(props):
    """props: list of (id, value) pairs (repeats allowed, order kept) -> length-prefixed block."""
    body = bytearray()
    for pid, value in props or []:
        kind = _KIND[pid]
        body += varint(pid)
        if kind == "byte":
            body += bytes([value])
        elif kind == "u16":
            body += struct.pack("!H", value)
        elif kind == "u32":
            body += struct.pack("!I", value)
        elif kind == "varint":
            body += varint(value)
        elif kind == "str":
            body += utf8(value)
        elif kind == "bin":
            body += binary(value)
        elif kind == "pair":
            body += utf8(value[0]) + utf8(value[1])
    return varint(len(body)) + bytes(body)


def decode_props(buf, pos):
    """-> (list of (id, value), new pos)."""
    length, pos = read_varint(buf, pos)
    end = pos + length
    props = []
    while pos < end:
        pid, pos = read_varint(buf, pos)
        kind = _KIND.get(pid)
        if kind == "byte":
            value = buf[pos]
            pos += 1
        elif kind == "u16":
            value = struct.unpack_from("!H", buf, pos)[0]
            pos += 2
        elif kind == "u32":
            value = struct.unpack_from("!I", buf, pos)[0]
            pos += 4
        elif kind == "varint":
            value, pos = read_varint(buf, pos)
        elif kind in ("str", "bin"):
            n = struct.unpack_from("!H", buf, pos)[0]
            value = bytes(buf[pos + 2:pos + 2 + n])
            pos += 2 + n
            if kind == "str":
                value = value.decode()
        elif kind == "pair":
            n = struct.unpack_from("!H", buf, pos)[0]
            k = bytes(buf[pos + 2:pos + 2 + n]).decode()
            pos += 2 + n
            n = struct.unpack_from("!H", buf, pos)[0]
            v = bytes(buf[pos + 2:pos + 2 + n]).decode()
            pos += 2 + n
            value = (k, v)
        else:
            raise ValueError(f"unknown property 0x{pid:02x}")
        props.append((pid, value))
    return props, end


def connect(client_id="", clean_start=True, keepalive=60, props=(), will=None,
            username=None, password=None):
    """will: dict(topic=, payload=, qos=0, retain=False, props=[...])."""
    flags = 0x02 if clean_start else 0
    payload = utf8(client_id)
    if will:
        flags |= 0x04 | (will.get("qos", 0) << 3) | (0x20 if will.get("retain") else 0)
        payload += encode_props(will.get("props", ())) + utf8(will["topic"]) + binary(will.get("payload", b""))
    if username is not None:
        flags |= 0x80
        payload += utf8(username)
    if password is not None:
        flags |= 0x40
        payload += binary(password)
    var = utf8("MQTT") + bytes([5, flags]) + struct.pack("!H", keepalive) + encode_props(props)
    return packet(CONNECT, 0, var + payload)


def publish(topic, payload=b"", qos=0, pid=None, retain=False, dup=False, props=(), raw_props=None):
    """raw_props: pre-encoded property block (length included), for malformed tests."""
    if isinstance(payload, str):
        payload = payload.encode()
    flags = (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    body = utf8(topic)
    if qos:
        body += struct.pack("!H", pid)
    body += raw_props if raw_props is not None else encode_props(props)
    return packet(PUBLISH, flags, body + payload)


def ack(ptype, pid, reason=0):
    flags = 2 if ptype == PUBREL else 0
    return packet(ptype, flags, struct.pack("!H", pid) + bytes([reason]) + encode_props(()))


def subscribe(pid, filters, props=()):
    """filters: list of (filter, options byte); options = qos | nl<<2 | rap<<3 | rh<<4."""
    body = struct.pack("!H", pid) + encode_props(props)
    for f, opts in filters:
        body += utf8(f) + bytes([opts])
    return packet(SUBSCRIBE, 2, body)


def unsubscribe(pid, filters):
    body = struct.pack("!H", pid) + encode_props(())
    for f in filters:
        body += utf8(f)
    return packet(UNSUBSCRIBE, 2, body)


def disconnect(reason=0, props=()):
    return packet(DISCONNECT, 0, bytes([reason]) + encode_props(props))


class Packet:
    """A parsed incoming packet. Fields depend on type: reason, props, session_present,
    topic, pid, qos, retain, dup, payload, reasons (SUBACK/UNSUBACK)."""

    def __init__(self, ptype, flags, body):
        self.type, self.flags, self.body = ptype, flags, body
        self.props = []
        self.reason = 0
        if ptype == CONNACK:
            self.session_present = bool(body[0] & 1)
            self.reason = body[1]
            if len(body) > 2:
                self.props, _ = decode_props(body, 2)
        elif ptype == PUBLISH:
            self.qos = (flags >> 1) & 3
            self.retain = bool(flags & 1)
            self.dup = bool(flags & 8)
            n = struct.unpack_from("!H", body, 0)[0]
            self.topic = bytes(body[2:2 + n]).decode()
            pos = 2 + n
            self.pid = None
            if self.qos:
                self.pid = struct.unpack_from("!H", body, pos)[0]
                pos += 2
            self.props, pos = decode_props(body, pos)
            self.payload = bytes(body[pos:])
        elif ptype in (PUBACK, PUBREC, PUBREL, PUBCOMP):
            self.pid = struct.unpack_from("!H", body, 0)[0]
            if len(body) > 2:
                self.reason = body[2]
            if len(body) > 3:
                self.props, _ = decode_props(body, 3)
        elif ptype in (SUBACK, UNSUBACK):
            self.pid = struct.unpack_from("!H", body, 0)[0]
            self.props, pos = decode_props(body, 2)
            self.reasons = list(body[pos:])
        elif ptype in (DISCONNECT, AUTH):
            if body:
                self.reason = body[0]
            if len(body) > 1:
                self.props, _ = decode_props(body, 1)

    def prop(self, pid, default=None):
        for k, v in self.props:
            if k == pid:
                return v
        return default

    def prop_all(self, pid):
        return [v for k, v in self.props if k == pid]

    def __repr__(self):
        return f"<Packet type={self.type} reason=0x{self.reason:02x} props={self.props}>"


def parse(raw):
    """A helpers.RawPacket (or None for a closed connection) -> Packet (or None)."""
    return None if raw is None else Packet(raw.type, raw.flags, bytes(raw.body))


class Raw5(helpers.RawClient):
    """helpers.RawClient speaking v5: ``recv()`` returns parsed :class:`Packet` objects."""

    def recv(self, timeout=helpers.TIMEOUT):
        """Next packet, None if the broker closed the connection; AssertionError on timeout."""
        return parse(self.recv_packet(timeout))

    def expect(self, ptype, timeout=helpers.TIMEOUT):
        """Next packet other than PINGRESP, asserting its type."""
        while True:
            p = self.recv(timeout)
            assert p is not None, f"connection closed while waiting for packet type {ptype}"
            if p.type == PINGRESP and ptype != PINGRESP:
                continue
            assert p.type == ptype, f"expected packet type {ptype}, got {p!r}"
            return p

    def connect5(self, client_id="", timeout=helpers.TIMEOUT, **kw):
        """Send a v5 CONNECT (see :func:`connect`) and return the parsed CONNACK."""
        self.send(connect(client_id, **kw))
        return self.expect(CONNACK, timeout)

    def subscribe5(self, filters):
        """Send a SUBSCRIBE (packet id 1) for ``[(filter, options)]`` and return the parsed SUBACK."""
        self.send(subscribe(1, filters))
        return self.expect(SUBACK)

    def publishes(self, duration, auto_ack=True, n=None):
        """Every PUBLISH arriving within ``duration`` s, or the first ``n`` if they come sooner
        (QoS 1/2 acknowledged when ``auto_ack``)."""
        got = []
        deadline = time.monotonic() + duration
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (n is not None and len(got) >= n):
                return got
            try:
                p = self.recv(left)
            except AssertionError:
                return got
            if p is None:
                return got
            if p.type == PUBLISH:
                got.append(p)
                if auto_ack and p.qos == 1:
                    self.send(ack(PUBACK, p.pid))
                elif auto_ack and p.qos == 2:
                    self.send(ack(PUBREC, p.pid))
            elif p.type == PUBREL and auto_ack:
                self.send(ack(PUBCOMP, p.pid))

    def closed_after(self, timeout=helpers.TIMEOUT):
        """Assert the broker closes the connection within ``timeout`` s; parsed packets seen before."""
        return [parse(r) for r in self.expect_closed(timeout)]
