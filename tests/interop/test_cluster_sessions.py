"""Cluster sessions (crates/braid-cluster): one session per client id across the nodes of a
Braid cluster on Redis. A persistent client that goes offline on one node resumes on another with
its subscriptions and every message queued meanwhile; QoS 1 deliveries it had not acknowledged
come again with DUP; a second connection with the same client id on another node takes the
session over (the first gets DISCONNECT 0x8E) without losing messages; two CONNECTs of one client
id on two nodes at the same moment never leave two live connections; clean start on another node
discards the session; a delayed will (MQTT 5 Will Delay Interval) of a connection taken over from
another node is sent at once, once, when the new connection starts clean (the session ends), and
not at all when it resumes the session.

Every test runs three nodes (n1, n2, n3) on one Redis (conftest's braid_cluster, lease 3 s) and
checks what independent clients (paho-mqtt, raw v5 sockets) see.
"""
import threading
import time

import pytest

from helpers import (CONNACK, DISCONNECT, PINGRESP, PUBLISH, PUBREL, MQTTv311, MQTTv5, PacketTypes,
                     connack_return_code, connack_session_present, decode_publish, pingreq_packet,
                     proto_id, puback_packet, pubcomp_packet, pubrec_packet, unique, v5_properties,
                     wait_until)
from clusterutil import PROBE, wait_routed as _wait_routed
from raw_v5 import PUBACK, SESSION_EXPIRY_INTERVAL, Raw5, ack
from raw_v5 import connect as connect5
from v5util import connect_props, raw5, rc  # noqa: F401  (fixture)

pytestmark = pytest.mark.braid_only

SESSION_TAKEN_OVER = 0x8E


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def _persistent(connect, node, cid, protocol, fresh=False, expiry=300):
    """A persistent session's connection: 3.1.1 clean_session=False, v5 with a Session Expiry
    Interval and clean_start=``fresh`` (a new client id has no session to resume anyway)."""
    if protocol == MQTTv5:
        return connect(node, client_id=cid, protocol=MQTTv5, clean_start=fresh,
                       properties=connect_props(SessionExpiryInterval=expiry))
    return connect(node, client_id=cid, protocol=protocol, clean_session=False)


def _payloads(msgs):
    return [m.payload for m in msgs if m.payload != PROBE]


def _resume_raw(raw_client, raw5, node, cid, protocol):
    """A raw socket resuming ``cid``'s persistent session on ``node`` (3.1.1 clean_session=0, v5
    clean_start=0 with a Session Expiry Interval): (client, session_present)."""
    if protocol == MQTTv5:
        c = raw5(node)
        ca = c.connect5(cid, clean_start=False, props=[(SESSION_EXPIRY_INTERVAL, 300)])
        assert ca.reason == 0, f"CONNACK {ca!r}"
        return c, ca.session_present
    c = raw_client(node)
    ca = c.connect(cid, clean=False, level=4)
    assert connack_return_code(ca) == 0, f"CONNACK {ca.body!r}"
    return c, connack_session_present(ca)


def _receive_raw(c, v5, quiet=1.0, limit=15.0):
    """Every PUBLISH in the order it came on the wire until none for ``quiet`` s, completing the
    QoS 1 / QoS 2 flows as a client does (PUBACK; PUBREC, then PUBCOMP for the PUBREL)."""
    got = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            p = c.recv_packet(quiet)
        except AssertionError:
            return got
        if p is None:
            raise AssertionError(f"connection closed after {len(got)} messages")
        if p.type == PUBLISH:
            m = decode_publish(p, v5=v5)
            got.append(m)
            if m.qos == 1:
                c.send(puback_packet(m.mid))
            elif m.qos == 2:
                c.send(pubrec_packet(m.mid))
        elif p.type == PUBREL:
            c.send(pubcomp_packet(int.from_bytes(p.body[:2], "big")))
    return got


def _log_about(nodes, text, last=8):
    """The nodes' log lines that mention ``text`` (a client id), for a failure's message."""
    out = []
    for n in nodes:
        out += [f"{n.node}: {line}" for line in n.log_text().splitlines() if text in line][-last:]
    return "\n".join(out) or f"(no log line mentions {text})"


# --------------------------------------------------------------------------------------------------
# 1. Offline on one node, back on another: the session and its queued messages follow
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_offline_session_resumes_on_another_node_with_queued_messages(braid_cluster, connect,
                                                                      raw_client, raw5, protocol):
    n1, n2, n3 = braid_cluster(3)
    topic = unique("cs/offline")
    cid = unique("roam")
    sub = _persistent(connect, n1, cid, protocol, fresh=True)
    assert sub.subscribe(topic, 2) == [2]
    pub = connect(n2, protocol=protocol)
    _wait_routed(pub, sub, topic)
    sub.disconnect()

    sent = []
    for i in range(20):
        qos = 1 + i % 2
        payload = f"m{i:02d} q{qos}".encode()
        pub.publish(topic, payload, qos=qos)  # waits for PUBACK / PUBCOMP
        sent.append((payload, qos))

    # A raw socket, to see the order on the wire (paho hands a QoS 2 message over at PUBREL).
    back, present = _resume_raw(raw_client, raw5, n3, cid, protocol)
    assert present, "session not found on another node (session_present=0)"
    got = _receive_raw(back, protocol == MQTTv5, quiet=1.0)
    assert [(m.payload, m.qos) for m in got] == sent, \
        "queued messages not delivered exactly once, in order"
    assert not any(m.dup for m in got), "never sent before: no DUP"

    # The subscription came along: a message published now on n2 reaches n3.
    pub.publish(topic, b"live", qos=1)
    assert [m.payload for m in _receive_raw(back, protocol == MQTTv5, quiet=1.0)] == [b"live"]


# --------------------------------------------------------------------------------------------------
# 2. QoS 1 deliveries not acknowledged on node 1 come again, with DUP, on node 2
# --------------------------------------------------------------------------------------------------

def test_unacknowledged_qos1_redelivered_with_dup_on_another_node(braid_cluster, connect, raw5):
    n1, n2, n3 = braid_cluster(3)
    topic = unique("cs/inflight")
    cid = unique("inflight")
    first = raw5(n1)
    ca = first.connect5(cid, clean_start=True, props=[(SESSION_EXPIRY_INTERVAL, 300)])
    assert ca.reason == 0 and not ca.session_present
    assert first.subscribe5([(topic, 1)]).reasons == [1]

    pub = connect(n2, protocol=MQTTv5)
    # Routed? Probe with QoS 0 until the raw subscriber sees one (QoS 0: nothing to acknowledge).
    deadline = time.monotonic() + 5
    while not any(p.payload == PROBE for p in first.publishes(0.1, auto_ack=False)):
        assert time.monotonic() < deadline, "subscription did not reach n2"
        pub.publish(topic, PROBE, qos=0)
    first.publishes(0.3, auto_ack=False)

    for i in range(5):
        pub.publish(topic, f"m{i}".encode(), qos=1)
    got = [p for p in first.publishes(5, auto_ack=False, n=5) if p.payload != PROBE]
    assert [p.payload for p in got] == [f"m{i}".encode() for i in range(5)]
    assert all(p.qos == 1 and not p.dup for p in got)
    # Acknowledge the first two only, then lose the connection (no DISCONNECT) once n1 has read
    # the acknowledgements (QoS 1 would allow it to send an acknowledged message again if not).
    for p in got[:2]:
        first.send(ack(PUBACK, p.pid))
    time.sleep(0.3)
    first.close()

    second = raw5(n2)
    ca = second.connect5(cid, clean_start=False, props=[(SESSION_EXPIRY_INTERVAL, 300)])
    assert ca.reason == 0 and ca.session_present, f"session not resumed on n2: {ca!r}"
    again = second.publishes(5, auto_ack=False, n=3)
    again += second.publishes(0.5, auto_ack=False)  # and nothing more
    unacked = got[2:]
    assert [p.payload for p in again] == [p.payload for p in unacked], \
        f"redelivered {[p.payload for p in again]}, expected exactly the unacknowledged m2..m4"
    assert all(p.dup for p in again), f"DUP flags {[p.dup for p in again]}"
    assert all(p.qos == 1 for p in again)
    assert [p.pid for p in again] == [p.pid for p in unacked], \
        "redelivery must keep the original packet identifiers"
    for p in again:
        second.send(ack(PUBACK, p.pid))

    # Acknowledged now: the session on n2 serves new messages, once.
    pub.publish(topic, b"after", qos=1)
    fresh = second.publishes(5, auto_ack=True, n=1)
    fresh += second.publishes(0.5, auto_ack=True)
    assert [(p.payload, p.dup) for p in fresh] == [(b"after", False)], \
        f"published once on n2, delivered as {[(p.payload, p.pid, p.dup) for p in fresh]}"


# --------------------------------------------------------------------------------------------------
# 3. Live takeover across nodes while messages flow
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_live_takeover_across_nodes_loses_no_acknowledged_message(braid_cluster, connect, protocol):
    n1, n2, n3 = braid_cluster(3)
    topic = unique("cs/takeover")
    cid = unique("twin")
    first = _persistent(connect, n1, cid, protocol, fresh=True)
    assert first.subscribe(topic, 1) == [1]
    pub = connect(n3, protocol=MQTTv5)
    _wait_routed(pub, first, topic)

    total, interval = 200, 0.01
    infos = []

    def publish_all():
        for i in range(total):
            infos.append((f"m{i:03d}".encode(), pub.publish(topic, f"m{i:03d}", qos=1, wait=False)))
            time.sleep(interval)

    publisher = threading.Thread(target=publish_all, daemon=True)
    publisher.start()
    wait_until(lambda: len(infos) >= 60, timeout=10, message="60 messages published")
    t0 = time.monotonic()
    second = _persistent(connect, n2, cid, protocol)
    connack_after = time.monotonic() - t0
    published_at_takeover = len(infos)
    publisher.join(30)
    assert not publisher.is_alive()

    first.wait_disconnected(5)
    if protocol == MQTTv5:
        assert rc(first.disconnect_reason) == SESSION_TAKEN_OVER, \
            f"first connection ended with {first.disconnect_reason!r}, not Session taken over"
    assert second.connack.session_present is True

    wait_until(lambda: all(info.is_published() for _, info in infos), timeout=15,
               message="every PUBACK")
    acked = [p for p, _ in infos]

    def received():
        return _payloads(first.received) + _payloads(second.received)

    try:
        wait_until(lambda: set(acked) <= set(received()), timeout=5, message="every message")
    except AssertionError:
        pass
    time.sleep(0.3)
    got = received()
    lost = sorted(set(acked) - set(got))
    dups = len(got) - len(set(got))
    report = (f"takeover {proto_id(protocol)}: {len(acked)} acknowledged, {len(set(got))} received "
              f"({len(_payloads(first.received))} on n1, {len(_payloads(second.received))} on n2, "
              f"{dups} duplicates), {len(lost)} lost {lost[:10]}; takeover at m{published_at_takeover}, "
              f"CONNACK on n2 after {connack_after * 1000:.0f} ms")
    print(report)
    assert not lost, report + "\n" + _log_about((n1, n2, n3), cid)

    # The session and its subscription are n2's now.
    pub.publish(topic, b"final", qos=1)
    wait_until(lambda: b"final" in _payloads(second.received), timeout=5,
               message="a message published after the takeover, on the new connection")
    assert b"final" not in _payloads(first.received)


# --------------------------------------------------------------------------------------------------
# 4. The same client id on two nodes at the same moment: never two live connections
# --------------------------------------------------------------------------------------------------

def _try_connect(sock, cid, clean_start, props, out, key, barrier):
    """One side of a round: CONNECT at the barrier, note the CONNACK reason (or 'closed')."""
    try:
        barrier.wait(2)
        sock.send(connect5(cid, clean_start=clean_start, props=props))
        while True:
            p = sock.recv(5)
            if p is None:
                out[key] = "closed"
                return
            if p.type == CONNACK:
                out[key] = p.reason
                return
            if p.type == DISCONNECT:
                out[key] = f"disconnect 0x{p.reason:02x}"
                return
    except AssertionError:
        out[key] = "timeout"
    except Exception as e:  # noqa: BLE001  (a socket error is an outcome too)
        out[key] = f"error {e!r}"


def _alive(sock):
    """('live', None) if the connection answers PINGREQ; ('closed', DISCONNECT reason or None)."""
    reason = None
    if not sock.send(pingreq_packet()):
        return "closed", reason
    try:
        while True:
            p = sock.recv(3)
            if p is None:
                return "closed", reason
            if p.type == PINGRESP:
                return "live", None
            if p.type == DISCONNECT:
                reason = p.reason
    except AssertionError:
        return "silent", reason


@pytest.mark.parametrize("persistent", [False, True], ids=["clean-start", "session-expiry"])
def test_simultaneous_connect_on_two_nodes_leaves_one_connection(braid_cluster, persistent):
    n1, n2, _ = braid_cluster(3)
    rounds = 200
    props = [(SESSION_EXPIRY_INTERVAL, 300)] if persistent else []
    pairs = []
    t_start = time.monotonic()
    for r in range(rounds):
        cid = unique(f"race{r}")
        a, b = Raw5(n1), Raw5(n2)
        out = {}
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=_try_connect,
                                    args=(s, cid, not persistent, props, out, k, barrier))
                   for s, k in ((a, "n1"), (b, "n2"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        pairs.append((cid, a, b, out))
    connect_secs = time.monotonic() - t_start

    time.sleep(1.0)  # a connection that lost the race is closed by now
    outcomes = {}
    both_live, none_live = [], []
    try:
        for cid, a, b, out in pairs:
            (sa, ra), (sb, rb) = _alive(a), _alive(b)
            live = [k for k, s in (("n1", sa), ("n2", sb)) if s == "live"]

            def how(connack, state, reason):
                if connack != 0:
                    return f"CONNACK {connack if isinstance(connack, str) else hex(connack)}"
                if state == "live":
                    return "live"
                return f"{state} after DISCONNECT 0x{reason:02x}" if reason is not None else state

            key = (f"n1: {how(out.get('n1'), sa, ra)}", f"n2: {how(out.get('n2'), sb, rb)}")
            outcomes[key] = outcomes.get(key, 0) + 1
            if len(live) == 2:
                both_live.append(cid)
            elif not live:
                none_live.append(cid)
    finally:
        for _, a, b, _ in pairs:
            a.close()
            b.close()
    summary = "; ".join(f"{k[0]} / {k[1]}: {v}" for k, v in sorted(outcomes.items(), key=lambda x: -x[1]))
    report = (f"{rounds} rounds ({'session expiry 300' if persistent else 'clean start'}), "
              f"{connect_secs / rounds * 1000:.0f} ms per round: {summary}; "
              f"two live connections in {len(both_live)} rounds {both_live[:3]}, "
              f"none live in {len(none_live)} {none_live[:3]}")
    print(report)
    assert not both_live, report + "\n" + _log_about((n1, n2), both_live[0])
    assert not none_live, report + "\n" + _log_about((n1, n2), none_live[0])


# --------------------------------------------------------------------------------------------------
# 5. Clean start on another node discards the session
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_clean_start_on_another_node_discards_the_session(braid_cluster, connect, protocol):
    n1, n2, n3 = braid_cluster(3)
    topic = unique("cs/clean")
    cid = unique("clean")
    sub = _persistent(connect, n1, cid, protocol, fresh=True)
    sub.subscribe(topic, 1)
    pub = connect(n3, protocol=protocol)
    _wait_routed(pub, sub, topic)
    sub.disconnect()
    for i in range(3):
        pub.publish(topic, f"old {i}".encode(), qos=1)

    # Clean start on n2 (v5 without Session Expiry: the new session ends with its connection).
    if protocol == MQTTv5:
        fresh = connect(n2, client_id=cid, protocol=MQTTv5, clean_start=True)
    else:
        fresh = connect(n2, client_id=cid, protocol=protocol, clean_session=True)
    assert fresh.connack.session_present is False
    fresh.expect_no_message(1.0)           # the queued messages went with the old session
    pub.publish(topic, b"after", qos=1)
    fresh.expect_no_message(0.5)           # and so did its subscription
    fresh.disconnect()

    # Nothing is left anywhere: back on n1, where the session was, there is none to resume.
    again = _persistent(connect, n1, cid, protocol)
    assert again.connack.session_present is False
    again.expect_no_message(1.0)


# --------------------------------------------------------------------------------------------------
# 6. A delayed will, taken over from another node: sent now if the session ends, else never
# --------------------------------------------------------------------------------------------------
# W (v5, Session Expiry 300 s, a will with Will Delay Interval WILL_DELAY_S) is connected to n1; a
# new connection with W's client id comes to n2. With Clean Start = 1 the old session ends, and
# the will goes out with it, before the delay (MQTT 5.0 3.1.3.2.2: "until the Will Delay Interval
# has passed or the Session ends, whichever happens first"). With Clean Start = 0 it is a new
# connection to the session within the delay: the will is not sent (3.1.2.5). A watcher on n3,
# routed from n1 and n2 (whichever sends it), counts the copies for longer than the delay.

WILL_DELAY_S = 5


def _will_taken_over(braid_cluster, connect, clean_start):
    """n1..n3, W with its delayed will on n1, the watcher on n3, then W's client id connecting
    to n2 with ``clean_start``. Returns (nodes, watcher, topic, payload, w, new, connack_at)."""
    nodes = braid_cluster(3)
    n1, n2, n3 = nodes
    topic = unique("cs/will")
    cid = unique("willed")
    payload = f"{cid} gone".encode()
    watcher = connect(n3, protocol=MQTTv5)
    assert watcher.subscribe(topic, 1) == [1]
    for node in (n1, n2):
        _wait_routed(connect(node, protocol=MQTTv5), watcher, topic)
    will = {"topic": topic, "payload": payload, "qos": 1, "retain": False,
            "properties": v5_properties(PacketTypes.WILLMESSAGE, WillDelayInterval=WILL_DELAY_S)}
    w = connect(n1, client_id=cid, protocol=MQTTv5, clean_start=True, will=will,
                properties=connect_props(SessionExpiryInterval=300))
    time.sleep(0.3)                    # W's session (and its will) written to Redis by n1
    new = connect(n2, client_id=cid, protocol=MQTTv5, clean_start=clean_start,
                  properties=connect_props(SessionExpiryInterval=300))
    connack_at = time.monotonic()
    w.wait_disconnected(5)
    return nodes, watcher, topic, payload, w, new, connack_at


def test_clean_start_takeover_on_another_node_sends_delayed_will_now_once(braid_cluster, connect):
    nodes, watcher, topic, payload, w, new, connack_at = _will_taken_over(
        braid_cluster, connect, clean_start=True)
    cid = w.client_id
    assert new.connack.session_present is False, f"clean start on n2, yet session present: {new.connack}"
    try:
        first = watcher.get_message(timeout=3.0)
    except AssertionError:
        raise AssertionError(
            f"W's will (Will Delay {WILL_DELAY_S} s) not published within 3 s of the clean-start "
            f"connection on n2, which ended W's session (W's connection on n1 ended with "
            f"{w.disconnect_reason!r})\n" + _log_about(nodes, cid)) from None
    after = first.received_at - connack_at
    assert (first.topic, first.payload, first.qos) == (topic, payload, 1), \
        f"got {(first.topic, first.payload, first.qos)}, expected W's will {(topic, payload, 1)}"
    # Watch past the delay: the will must not come again (from n1's timer, or n2's copy of the
    # session record).
    more = [m for m in watcher.collect(WILL_DELAY_S + 2) if m.payload != PROBE]
    report = (f"will received {after:.2f} s after the CONNACK on n2 (delay {WILL_DELAY_S} s), then "
              f"{len(more)} more message(s) in the next {WILL_DELAY_S + 2} s: "
              f"{[(m.payload, m.dup, round(m.received_at - connack_at, 2)) for m in more]}; "
              f"W's connection ended with {w.disconnect_reason!r}")
    print(report)
    assert after < WILL_DELAY_S - 2, "will not sent at once when the session ended: " + report
    assert not more, "the will was published more than once: " + report + "\n" + _log_about(nodes, cid)


def test_resume_on_another_node_within_will_delay_cancels_the_will(braid_cluster, connect):
    nodes, watcher, topic, payload, w, new, connack_at = _will_taken_over(
        braid_cluster, connect, clean_start=False)
    cid = w.client_id
    assert new.connack.session_present is True, \
        f"W's session not resumed on n2: {new.connack}\n" + _log_about(nodes, cid)
    got = [m for m in watcher.collect(WILL_DELAY_S + 2) if m.payload != PROBE]
    assert not got, (
        f"W's will published although its session was resumed on n2 within the Will Delay "
        f"({WILL_DELAY_S} s): {[(m.payload, round(m.received_at - connack_at, 2)) for m in got]} "
        f"(s after the CONNACK on n2)\n" + _log_about(nodes, cid))
    # Not a deaf watcher: it still gets what is published to the will topic from n1.
    connect(nodes[0], protocol=MQTTv5).publish(topic, b"still listening", qos=1)
    assert watcher.get_message(timeout=3).payload == b"still listening"
