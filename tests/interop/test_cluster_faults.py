"""Cluster faults (crates/braid-cluster): what clients of a Braid cluster on Redis see when a node
is killed (SIGKILL) or stopped (SIGTERM) mid-stream, when Redis restarts, when a node is cut off
from Redis for longer than its lease (DISCONNECT / CONNACK 0x9C Use another server, unless
cluster.on_partition = "serve"), when a node stuck (SIGSTOP) past its lease rejoins, and when
Redis wants a password the node does not have.

The rule checked throughout: every message whose publisher got a PUBACK (QoS 1) or PUBCOMP (QoS 2)
reaches its persistent subscriber, QoS 1 at least once and QoS 2 exactly once, whichever node
it is served by. Nodes run on one Redis (conftest's braid_cluster, lease 3 s).
"""
import os
import re
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import BRAID_BIN, CLUSTER_SECRET, free_port
from helpers import (MQTTv311, MQTTv5, PacketTypes, connect_client, unique, v5_properties,
                     wait_until)
from redisproc import RedisServer
from clusterutil import PROBE, in_threads as _in_threads, wait_routed as _wait_routed
from test_core_shared import WINDOW, check_handed_over, hold, payloads, publish_n, settle
from v5util import connect_props, rc

pytestmark = pytest.mark.braid_only

USE_ANOTHER_SERVER = 0x9C
LEASE_S = 3.0  # cluster.lease_ms in conftest's braid_cluster


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def _persistent(connect, node, cid, fresh=False, timeout=5.0):
    """A v5 connection with a Session Expiry Interval of 300 s (clean_start=``fresh``)."""
    return connect(node, client_id=cid, protocol=MQTTv5, clean_start=fresh, timeout=timeout,
                   properties=connect_props(SessionExpiryInterval=300))


def _reconnect(c, node, timeout=15.0):
    """Reconnects the paho client ``c`` (a persistent v5 session) to ``node`` with clean_start=0:
    the same client object, so it keeps its half of unfinished QoS 2 exchanges, as a client that
    resumes a session must."""
    c.client.loop_stop()
    c.broker = node
    c.connack = None
    c.disconnect_reason = None
    for ev in (c.connack_received, c.connected, c.disconnected):
        ev.clear()
    c.connect(clean_start=False, properties=connect_props(SessionExpiryInterval=300), timeout=timeout)
    return c


def _payloads(*clients):
    return [m.payload for c in clients for m in c.received if m.payload != PROBE]


class Stream:
    """Publishes through ``pub`` every ``interval`` s, in a thread, until ``stop()``: payloads
    ``<tag>-00000``..., cycling over ``plan`` = [(topic, qos), ...]. ``sent`` holds
    (payload, topic, qos, paho info, monotonic time) of every PUBLISH."""

    def __init__(self, pub, plan, interval=0.02, tag="m"):
        self.pub, self.plan, self.interval, self.tag = pub, plan, interval, tag
        self.sent = []
        self.error = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        while not self._stop.is_set():
            topic, qos = self.plan[i % len(self.plan)]
            payload = f"{self.tag}-{i:05d}".encode()
            try:
                info = self.pub.publish(topic, payload, qos=qos, wait=False)
            except AssertionError as e:  # the publisher's connection is gone
                self.error = (f"publisher {self.pub.client_id} lost its connection after {i} "
                              f"messages ({self.pub.disconnect_reason!r}): {e}")
                return
            self.sent.append((payload, topic, qos, info, time.monotonic()))
            i += 1
            self._stop.wait(self.interval)

    def stop(self):
        """Stops publishing; fails if the publisher's connection broke meanwhile."""
        self._stop.set()
        self._thread.join(5)
        assert self.error is None, self.error

    def acked(self, topic):
        """Payloads on ``topic`` whose PUBACK / PUBCOMP (or, QoS 0, writing) is done."""
        return [p for p, t, _, info, _ in self.sent if t == topic and info.is_published()]

    def wait_all_acked(self, timeout):
        wait_until(lambda: all(s[3].is_published() for s in self.sent), timeout=timeout,
                   message=f"acknowledgements of all {len(self.sent)} messages")


def _cluster_log(*nodes, last=10):
    """The last lines the cluster layer and WARN / ERROR logged on each node, for a failure's
    message (the node list and start-up lines left out)."""
    out = []
    for n in nodes:
        lines = [line for line in n.log_text().splitlines()
                 if (" braid_cluster" in line or re.search(r" (WARN|ERROR) ", line))
                 and not re.search(r"quic|anonymous|nodes=|joined the cluster", line)]
        out += [f"{n.node}: {line}" for line in lines[-last:]]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------
# 1. SIGKILL of the subscribers' node mid-stream
# --------------------------------------------------------------------------------------------------

def test_sigkill_of_a_node_mid_stream_loses_no_acknowledged_message(braid_cluster, connect):
    n1, n2, n3 = braid_cluster(3)
    t1, t2 = unique("cf/kill/q1"), unique("cf/kill/q2")
    c1, c2 = unique("kill-q1"), unique("kill-q2")
    s1 = _persistent(connect, n1, c1, fresh=True)
    s2 = _persistent(connect, n1, c2, fresh=True)
    assert s1.subscribe(t1, 1) == [1]
    assert s2.subscribe(t2, 2) == [2]
    pub = connect(n2, protocol=MQTTv5)
    _wait_routed(pub, s1, t1)
    _wait_routed(pub, s2, t2)

    stream = Stream(pub, [(t1, 1), (t2, 2)], interval=0.01)
    wait_until(lambda: len(stream.acked(t1)) + len(stream.acked(t2)) >= 60, timeout=10,
               message="60 messages acknowledged before the kill")
    killed_at = time.monotonic()
    sent_before_kill = len(stream.sent)
    n1.kill()
    s1.wait_disconnected(5)
    s2.wait_disconnected(5)

    # Back at once, on n3, well within n1's lease (it has not lapsed yet): the same clients,
    # which keep their state of the session (unfinished QoS 2 exchanges).
    before1, before2 = _payloads(s1), _payloads(s2)
    reconnect_at = time.monotonic()
    r1, r2 = _in_threads(lambda: _reconnect(s1, n3), lambda: _reconnect(s2, n3))
    connack_after = time.monotonic() - killed_at
    served = {}

    def first_new(client, name):
        after = [m for m in client.received if m.received_at > reconnect_at]
        if after and name not in served:
            served[name] = after[0].received_at - killed_at
        return name in served

    try:
        wait_until(lambda: [first_new(r1, "q1"), first_new(r2, "q2")] == [True, True], timeout=6,
                   message="a message on each reconnected subscriber")
    except AssertionError:
        pass  # reported below, with the counts
    time.sleep(1.0)  # publishing goes on with the subscribers on n3
    stream.stop()
    stream.wait_all_acked(15)

    acked1, acked2 = stream.acked(t1), stream.acked(t2)

    def complete():
        return set(acked1) <= set(_payloads(r1)) and set(acked2) <= set(_payloads(r2))

    try:
        wait_until(complete, timeout=4, message="every acknowledged message")
    except AssertionError:
        pass
    time.sleep(0.5)
    got1, got2 = _payloads(r1), _payloads(r2)
    lost1 = sorted(set(acked1) - set(got1))
    lost2 = sorted(set(acked2) - set(got2))
    dup2 = sorted({p for p in got2 if got2.count(p) > 1})
    published = {p: at - killed_at for p, _, _, _, at in stream.sent}

    def when(payloads):
        if not payloads:
            return ""
        ts = [published[p] for p in payloads]
        return f" {payloads[:4]}{'...' if len(payloads) > 4 else ''} (published {min(ts):+.2f}..{max(ts):+.2f} s from the kill)"

    def state(r):
        if r.disconnected.is_set():
            return f"closed again ({r.disconnect_reason!r})"
        return "connected"

    report = (f"SIGKILL of n1 after {sent_before_kill} published. "
              f"QoS 1: {len(acked1)} acknowledged, {len(set(got1))} received "
              f"({len(before1)} before the kill, {len(got1) - len(before1)} on n3), {len(lost1)} lost"
              f"{when(lost1)}. "
              f"QoS 2: {len(acked2)} acknowledged, {len(set(got2))} received "
              f"({len(before2)} before, {len(got2) - len(before2)} on n3), {len(lost2)} lost{when(lost2)}, "
              f"{len(dup2)} more than once{when(dup2)}. "
              f"Reconnected on n3 {connack_after:.2f} s after the kill (session present "
              f"{r1.connack.session_present}/{r2.connack.session_present}, now {state(r1)}/{state(r2)}), "
              f"first message there {served.get('q1', float('nan')):.2f} s (QoS 1) / "
              f"{served.get('q2', float('nan')):.2f} s (QoS 2) after the kill")
    print(report)
    report += "\n" + _cluster_log(n2, n3)
    assert r1.connack.session_present and r2.connack.session_present, report
    assert not r1.disconnected.is_set() and not r2.disconnected.is_set(), \
        "a reconnected subscriber was disconnected again: " + report
    assert not lost1 and not lost2 and not dup2, report
    assert len(served) == 2, report


# --------------------------------------------------------------------------------------------------
# 1b. A claim waiting on a killed node does not hold back the claiming node's other messages
# --------------------------------------------------------------------------------------------------
# C, persistent on n1, reconnects to n2 right after n1's SIGKILL: n2's claim asks n1 (its lease
# is still held), which cannot answer, so the claim waits (until n1's lease lapses, at most
# cluster.takeover_timeout_ms per request) before n2 takes n1 over and C gets its CONNACK. Meanwhile S, on
# n2, must get what P publishes on n3 as promptly as ever: only messages relayed for sessions
# that move may wait for a claim, not every message of the claiming node's inbox.

MAX_DELAY_S = 1.0  # a message not held back takes milliseconds


def test_claim_waiting_on_a_killed_node_does_not_delay_other_clients_messages(braid_cluster, connect):
    n1, n2, n3 = braid_cluster(3)
    topic, c_topic, c_id = unique("cf/claimwait"), unique("cf/claimwait/c"), unique("claimer")
    s = connect(n2, protocol=MQTTv5)
    assert s.subscribe(topic, 1) == [1]
    pub = connect(n3, protocol=MQTTv5)
    _wait_routed(pub, s, topic)
    c = _persistent(connect, n1, c_id, fresh=True)
    assert c.subscribe(c_topic, 1) == [1]
    time.sleep(0.3)                               # C's session is in Redis, owned by n1

    n1.kill()
    killed_at = time.monotonic()
    c.wait_disconnected(5)

    # C back on n2, clean start 0, in a thread: its CONNACK comes only once n1 is taken over.
    outcome = {}

    def reconnect():
        outcome["sent"] = time.monotonic()
        try:
            _reconnect(c, n2, timeout=12)
        except AssertionError as e:
            outcome["error"] = e
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=reconnect, daemon=True)
    thread.start()
    time.sleep(0.3)                               # the CONNECT is on n2, its claim waiting on n1

    sent = []
    for i in range(10):
        payload = f"cw-{i:02d}".encode()
        at = time.monotonic()
        sent.append((payload, at, pub.publish(topic, payload, qos=1, wait=False)))
        time.sleep(max(0.0, at + 0.05 - time.monotonic()))
    all_payloads = {p for p, _, _ in sent}
    try:
        wait_until(lambda: all_payloads <= {m.payload for m in s.received}, timeout=6,
                   message="every message on S")
    except AssertionError:
        pass                                      # reported below
    thread.join(15)

    def rel(t):
        return f"{t - killed_at:+.2f}s"

    got = {}
    for m in s.received:
        got.setdefault(m.payload, m.received_at)
    delays = [(p, at, got.get(p)) for p, at, _ in sent]
    missing = [p.decode() for p, _, r in delays if r is None]
    late = [(p.decode(), round(r - at, 2)) for p, at, r in delays if r is not None and r - at > MAX_DELAY_S]
    worst = max((r - at for _, at, r in delays if r is not None), default=float("nan"))
    unacked = [p.decode() for p, _, info in sent if not info.is_published()]
    connack_at = outcome.get("at")
    pending = [p for p, _, r in delays if r is not None and (connack_at is None or r < connack_at)]

    if connack_at is None:
        answer = "no CONNACK yet; "
    elif "error" in outcome:
        answer = f"no CONNACK ({outcome['error']}); "
    else:
        answer = f"its CONNACK at {rel(connack_at)}, session present {c.connack.session_present}; "
    report = (
        f"times from the SIGKILL of n1: C's CONNECT sent to n2 at {rel(outcome['sent'])}, " + answer
        + f"published {rel(sent[0][1])}..{rel(sent[-1][1])}; per-message delays to S "
        + str([(p.decode()[-2:], round(r - at, 3) if r is not None else None) for p, at, r in delays])
        + f", worst {worst:.3f}s; {len(pending)} of 10 received before C's CONNACK"
        + (f"; not acknowledged to P: {unacked}" if unacked else ""))
    print(report)
    report += "\n" + _cluster_log(n2, n3)

    # The arrangement: the publishing happened while C's CONNECT waited on n2.
    assert connack_at is None or connack_at > sent[0][1], \
        "the arrangement failed: C got its CONNACK before the publishing began, so no claim was " \
        "waiting on n2 while S's messages came: " + report
    assert not missing, f"messages lost on their way to S: {missing}. " + report
    assert not late, (f"messages to S held up more than {MAX_DELAY_S}s while n2's claim for C "
                      f"waited on the killed n1: {late}. " + report)
    assert pending, "no message reached S while C's CONNECT was pending: " + report
    # The takeover itself works: C is served on n2 with its session.
    assert connack_at is not None and "error" not in outcome, "C did not get its CONNACK: " + report
    assert c.connack.session_present is True, report
    assert not unacked, report


# --------------------------------------------------------------------------------------------------
# 2. Redis restarted mid-stream
# --------------------------------------------------------------------------------------------------

def test_redis_restart_mid_stream(braid_cluster, connect):
    nodes = braid_cluster(2)
    n1, n2 = nodes
    redis = nodes.redis
    local_topic, cross_topic = unique("cf/local"), unique("cf/cross")
    local_sub = connect(n1)                      # 3.1.1, clean session, QoS 0
    local_sub.subscribe(local_topic, 0)
    local_pub = connect(n1)
    cross_sub = _persistent(connect, n2, unique("cross"), fresh=True)
    cross_sub.subscribe(cross_topic, 1)
    cross_pub = connect(n1, protocol=MQTTv5)
    _wait_routed(cross_pub, cross_sub, cross_topic)

    local = Stream(local_pub, [(local_topic, 0)], interval=0.02, tag="l")
    cross = Stream(cross_pub, [(cross_topic, 1)], interval=0.02, tag="x")
    time.sleep(0.5)
    redis.stop()                                  # SIGTERM: the AOF is written out
    down_at = time.monotonic()
    time.sleep(1.0)                               # less than the lease: the nodes keep serving
    up_begin = time.monotonic()
    redis.start()
    up_at = time.monotonic()
    time.sleep(1.5)
    local.stop()
    cross.stop()

    # Local QoS 0 traffic did not wait for Redis: what was published while it was down arrived
    # while it was down, promptly.
    local_got = {m.payload: m.received_at for m in local_sub.received}
    during = [(p, at) for p, _, _, _, at in local.sent if down_at <= at <= up_begin - 0.2]
    assert len(during) >= 20, f"only {len(during)} local messages published during the outage"
    missing = [p for p, _ in during if p not in local_got]
    late = [(p, round(local_got[p] - at, 2)) for p, at in during
            if p in local_got and local_got[p] - at > 0.5]
    assert not missing, f"local QoS 0 messages lost while Redis was down: {len(missing)} of {len(during)}"
    assert not late, f"local QoS 0 messages held up while Redis was down: {late[:5]}"

    # Cross-node QoS 1 resumes once Redis is back, and nothing acknowledged is lost.
    cross.wait_all_acked(15)
    acked = cross.acked(cross_topic)
    try:
        wait_until(lambda: set(acked) <= set(_payloads(cross_sub)), timeout=10,
                   message="every acknowledged cross-node message")
    except AssertionError:
        pass
    got = _payloads(cross_sub)
    lost = sorted(set(acked) - set(got))
    after = [p for p, _, _, _, at in cross.sent if at > up_at]
    resumed = [m.received_at - up_at for m in cross_sub.received if m.payload in set(after)]
    report = (f"Redis down {up_begin - down_at:.1f} s (+{up_at - up_begin:.1f} s to start): local QoS 0: "
              f"{len(during)} published during the outage, all delivered; cross-node QoS 1: "
              f"{len(acked)} acknowledged, {len(set(got))} received, {len(lost)} lost {lost[:6]}, "
              f"{len(got) - len(set(got))} duplicates; first message published after the restart "
              f"received {min(resumed) if resumed else float('nan'):.2f} s after it")
    print(report)
    assert after and set(after) <= set(got), report
    assert not lost, report


# --------------------------------------------------------------------------------------------------
# 3. A node cut off from Redis for longer than its lease
# --------------------------------------------------------------------------------------------------

OUTAGE_S = 5.0  # > LEASE_S


def test_node_cut_off_longer_than_lease_tells_clients_to_use_another_server(braid_cluster, connect):
    nodes = braid_cluster(2)
    n1 = nodes[0]
    redis = nodes.redis
    c1 = _persistent(connect, n1, unique("cut"), fresh=True)
    c2 = connect(n1, protocol=MQTTv5)
    old3 = connect(n1, protocol=MQTTv311)
    redis.stop()
    down_at = time.monotonic()

    # Connected clients are told to go elsewhere once the lease is over.
    reason = c1.wait_disconnected(LEASE_S + 2.5)
    told_after = time.monotonic() - down_at
    assert rc(reason) == USE_ANOTHER_SERVER, f"DISCONNECT {reason!r}, not 0x9C Use another server"
    assert rc(c2.wait_disconnected(1.0)) == USE_ANOTHER_SERVER
    old3.wait_disconnected(1.0)                       # 3.1.1: closed (no DISCONNECT in 3.1.1)
    # Not at the first failed renewal: at three quarters of the lease after the last one that
    # succeeded (renewals come every quarter lease, so at least half a lease into the outage).
    assert told_after > LEASE_S / 2, f"clients sent away {told_after:.1f} s into the outage"

    # New connections are refused with 0x9C while the node is cut off, with or without a
    # client id of their own.
    named = connect_client(n1, client_id=unique("late"), protocol=MQTTv5, expect_success=False)
    named.close()
    assert named.connack.reason_code == USE_ANOTHER_SERVER, f"CONNACK {named.connack}"
    anon = connect_client(n1, client_id="", protocol=MQTTv5, expect_success=False)
    anon.close()  # checked at the end, after the rest

    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    redis.start()
    up_at = time.monotonic()

    # Back: the node serves again.
    def served():
        c = connect_client(n1, client_id=unique("back"), protocol=MQTTv5, expect_success=False)
        ok = c.connack.reason_code == 0
        if ok:
            return c
        c.close()
        return None

    back = wait_until(served, timeout=10, interval=0.2, message="n1 serving again after Redis is back")
    serving_after = time.monotonic() - up_at
    try:
        topic = unique("cf/back")
        back.subscribe(topic, 1)
        connect(n1, protocol=MQTTv5).publish(topic, b"again", qos=1)
        assert back.get_message().payload == b"again"
    finally:
        back.close()
    print(f"cut off: clients sent away (0x9C) {told_after:.2f} s into a {OUTAGE_S:.0f} s outage "
          f"(lease {LEASE_S:.0f} s); serving again {serving_after:.2f} s after Redis came back; "
          f"a CONNECT with an empty client id while cut off got CONNACK {anon.connack.reason_code:#x}")
    assert anon.connack.reason_code == USE_ANOTHER_SERVER, \
        (f"CONNACK {anon.connack.reason_code:#x} (not 0x9C) for a CONNECT with an empty client id "
         f"while the node was cut off and refusing named clients")


def test_node_cut_off_with_on_partition_serve_keeps_its_clients(braid_cluster, connect):
    nodes = braid_cluster(2, settings={"cluster.on_partition": "serve"})
    n1 = nodes[0]
    redis = nodes.redis
    topic = unique("cf/serve")
    c1 = _persistent(connect, n1, unique("stay"), fresh=True)
    c1.subscribe(topic, 0)
    pub = connect(n1, protocol=MQTTv5)
    redis.stop()
    down_at = time.monotonic()
    while time.monotonic() - down_at < OUTAGE_S:
        pub.publish(topic, b"still here", qos=0)
        time.sleep(0.25)
    assert c1.is_connected(), f"disconnected with {c1.disconnect_reason!r} despite on_partition = serve"
    assert pub.is_connected(), f"disconnected with {pub.disconnect_reason!r} despite on_partition = serve"
    late = [m for m in c1.received if m.received_at > down_at + LEASE_S + 0.5]
    assert late, "local messages stopped flowing past the lease"
    redis.start()
    pub.publish(topic, b"after", qos=0)
    wait_until(lambda: any(m.payload == b"after" for m in c1.received), timeout=5,
               message="a message after Redis came back")
    assert c1.is_connected()


# --------------------------------------------------------------------------------------------------
# 4. SIGTERM: a node leaves gracefully
# --------------------------------------------------------------------------------------------------

def test_sigterm_node_sends_clients_elsewhere_and_sessions_follow(braid_cluster, connect):
    n1, n2, n3 = braid_cluster(3)
    topic = unique("cf/leave")
    away_id, online_id = unique("away"), unique("online")
    away = _persistent(connect, n1, away_id, fresh=True)
    online = _persistent(connect, n1, online_id, fresh=True)
    away.subscribe(topic, 1)
    online.subscribe(topic, 1)
    pub = connect(n3, protocol=MQTTv5)
    _wait_routed(pub, away, topic)
    online.drain()
    away.disconnect()

    before = [f"before {i}".encode() for i in range(3)]
    for p in before:
        pub.publish(topic, p, qos=1)              # queued for `away`, delivered to `online`
    assert [m.payload for m in online.wait_messages(3)] == before

    n1.stop()                                     # SIGTERM
    assert n1.proc.returncode == 0, f"exit status {n1.proc.returncode}"
    reason = online.wait_disconnected(3)
    assert rc(reason) == USE_ANOTHER_SERVER, f"DISCONNECT {reason!r}, not 0x9C Use another server"

    after = [f"after {i}".encode() for i in range(3)]
    for p in after:
        pub.publish(topic, p, qos=1)              # both offline, their node gone

    back_away = _persistent(connect, n2, away_id)
    back_online = _persistent(connect, n2, online_id)
    assert back_away.connack.session_present is True
    assert back_online.connack.session_present is True
    got_away = [m.payload for m in back_away.collect(1.5) if m.payload != PROBE]
    online_msgs = [m for m in back_online.collect(0.5) if m.payload != PROBE]
    got_online = [m.payload for m in online_msgs]
    report = (f"after n1 left: the session that was offline got {got_away} (expected before + after), "
              f"the one that was online got {[(m.payload, m.dup) for m in online_msgs]} (expected "
              f"after; a 'before' one again, with DUP, only if its PUBACK was still on the way)")
    print(report)
    assert got_away == before + after, report
    assert [p for p in got_online if p not in before] == after, report
    # The online client's PUBACK of the last message may have been cut off by the shutdown:
    # sending that one again is QoS 1's right, as a redelivery (DUP) of what it did not get
    # acknowledged, before the new messages.
    again = [m for m in online_msgs if m.payload in before]
    assert all(m.dup for m in again) and online_msgs[:len(again)] == again, report


# --------------------------------------------------------------------------------------------------
# 5. A shared-group member gone with messages unacknowledged: another member, on another node, gets them
# --------------------------------------------------------------------------------------------------
# Member A on n2 holds its acknowledgements (manual ack, Receive Maximum WINDOW); member B on n3
# acknowledges; the publisher is on n1. Of A's share, WINDOW are in flight to it unacknowledged
# (after it acknowledged one) and the rest wait in its queue. When A's connection ends, or n2
# dies and its sessions are taken over, what A had not acknowledged goes to B (see
# test_core_shared.py for the same on one node).

def _shared_pair(braid_cluster, connect, a_id=None, persistent=True):
    """n1..n3; A (``a_id``, Session Expiry 300 s if ``persistent``, manual ack) on n2 and B on n3
    in $share/g/<topic>, both routed from the publisher on n1; 10 QoS 1 messages published and A
    holding WINDOW of its share. Returns (nodes, topic, sent, a, acked, b, b_before)."""
    nodes = braid_cluster(3)
    n1, n2, n3 = nodes
    topic = unique("cf/share")
    a = connect(n2, client_id=a_id, protocol=MQTTv5, manual_ack=True, properties=connect_props(
        SessionExpiryInterval=300 if persistent else 0, ReceiveMaximum=WINDOW))
    b = connect(n3, protocol=MQTTv5)
    pub = connect(n1, protocol=MQTTv5)
    for m in (a, b):
        assert m.subscribe(f"$share/g/{topic}", 1) == [1]
        sync = unique("cf/sync")
        m.subscribe(sync, 0)           # after the shared one: routed from n1 once the probe arrives
        _wait_routed(pub, m, sync)
    sent = publish_n(pub, topic, 10)
    acked = hold(a, topic)
    settle(a, b)
    return nodes, topic, sent, a, acked, b, len(payloads(b, topic))


def test_shared_member_node_killed_its_unacked_messages_go_to_a_member_on_another_node(braid_cluster, connect):
    cid = unique("held")
    nodes, topic, sent, a, acked, b, b_before = _shared_pair(braid_cluster, connect, cid)
    n1, n2, n3 = nodes
    time.sleep(0.3)                    # n2 has written A's acknowledgement to Redis
    n2.kill()
    killed_at = time.monotonic()
    a.wait_disconnected(5)
    report = check_handed_over(topic, sent, a, acked, b, b_before, timeout=LEASE_S + 5)
    print(f"B complete {time.monotonic() - killed_at:.2f} s after the SIGKILL of n2")

    back = _persistent(connect, n1, cid, timeout=10)
    assert back.connack.session_present is True, f"{back.connack}\n" + _cluster_log(n1, n3)
    again = [(m.payload, m.dup) for m in back.collect(0.7) if m.topic == topic]
    assert not again, f"A got again, back on n1, what B had received: {again}. " + report


@pytest.mark.parametrize("session", ["clean", "persistent"])
def test_shared_member_connection_dropped_its_unacked_messages_go_to_a_member_on_another_node(
        braid_cluster, connect, session):
    cid = unique("held")
    nodes, topic, sent, a, acked, b, b_before = _shared_pair(
        braid_cluster, connect, cid, persistent=session == "persistent")
    a.kill()                           # its socket dies; n2 stays up
    report = check_handed_over(topic, sent, a, acked, b, b_before, timeout=4)
    if session == "persistent":
        back = _persistent(connect, nodes[1], cid)
        assert back.connack.session_present is True, back.connack
        again = [(m.payload, m.dup) for m in back.collect(0.7) if m.topic == topic]
        assert not again, f"A got again, back on n2, what B had received: {again}. " + report


# --------------------------------------------------------------------------------------------------
# 6. A node stuck past its lease rejoins: it lets go of its sessions and takes them back
# --------------------------------------------------------------------------------------------------
# One node (so no other takes its sessions over while it is stuck). SIGSTOP for longer than the
# lease, then SIGCONT: the node finds its lease lapsed, closes its connections, lets go of its
# sessions and joins again, adopting the sessions Redis still says are its own. W's delayed will
# must survive that: it goes to the persistent subscriber S once the delay is over, once; S back
# at once (the will comes live) or only after the delay (the will was queued for it offline).

STUCK_S = LEASE_S + 2.0
STUCK_WILL_DELAY_S = 2


@pytest.mark.parametrize("s_back", ["at-once", "after-will-delay"])
def test_node_stuck_past_its_lease_rejoins_and_sends_a_delayed_will_once(braid_cluster, connect, s_back):
    [n1] = braid_cluster(1)
    topic = unique("cf/stuck/will")
    w_id, s_id = unique("stuck-w"), unique("stuck-s")
    payload = f"{w_id} gone".encode()
    s = _persistent(connect, n1, s_id, fresh=True)
    assert s.subscribe(topic, 1) == [1]
    will = {"topic": topic, "payload": payload, "qos": 1, "retain": False,
            "properties": v5_properties(PacketTypes.WILLMESSAGE, WillDelayInterval=STUCK_WILL_DELAY_S)}
    w = connect(n1, client_id=w_id, protocol=MQTTv5, clean_start=True, will=will,
                properties=connect_props(SessionExpiryInterval=300))
    # Both sessions are in Redis before the node is stuck.
    time.sleep(0.5)

    os.kill(n1.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(STUCK_S)
    finally:
        os.kill(n1.proc.pid, signal.SIGCONT)
    cont_at = time.monotonic()

    # Rejoining, the node closes both connections (it lets go of their sessions).
    for c, name in ((w, "W"), (s, "S")):
        if not c.disconnected.wait(5):
            raise AssertionError(
                f"{name}'s connection not closed within 5 s of SIGCONT after {STUCK_S:.0f} s stopped "
                f"(lease {LEASE_S:.0f} s): did the node rejoin?\n" + _cluster_log(n1, last=20))
    closed = {name: c.disconnect_reason for c, name in ((w, "W"), (s, "S"))}
    # W stays away: it never reconnects, so its will is due once its delay is over.

    # S comes back (CONNACK 0x9C while the node is still joining: tried again) and resumes.
    if s_back == "after-will-delay":
        time.sleep(max(0.0, cont_at + STUCK_WILL_DELAY_S + 1.0 - time.monotonic()))

    def resumed():
        try:
            c = connect_client(n1, client_id=s_id, protocol=MQTTv5, clean_start=False,
                               properties=connect_props(SessionExpiryInterval=300), expect_success=False)
        except AssertionError:
            return None
        if c.connack.reason_code == 0:
            return c
        c.close()
        return None

    back = wait_until(resumed, timeout=10, interval=0.2, message="S connected again after the rejoin")
    try:
        back_at = time.monotonic()
        session_present = back.connack.session_present
        try:
            wait_until(lambda: any(m.payload == payload for m in back.received), timeout=6,
                       message="W's will")
        except AssertionError:
            pass
        got_at = next((m.received_at for m in back.received if m.payload == payload), None)
        time.sleep(2.0)                # a second copy would be here by now
        copies = [m for m in back.received if m.payload == payload]
        others = [(m.topic, m.payload) for m in back.received if m.payload != payload]
        report = (f"node stopped {STUCK_S:.0f} s (lease {LEASE_S:.0f} s); connections closed with "
                  f"{closed}; S back {back_at - cont_at:.2f} s after SIGCONT, session present "
                  f"{session_present}; W's will (delay {STUCK_WILL_DELAY_S} s) received "
                  f"{len(copies)} time(s)"
                  + (f", first {got_at - cont_at:.2f} s after SIGCONT" if got_at else "")
                  + f" {[(m.qos, m.dup) for m in copies]}; other messages: {others}")
        print(report)
        report += "\n" + _cluster_log(n1, last=20)
        assert session_present, "S's session was not taken back by the rejoined node: " + report
        assert copies, "W's delayed will was lost in the rejoin: " + report
        assert len(copies) == 1, "W's will was delivered more than once: " + report
    finally:
        back.close()


# --------------------------------------------------------------------------------------------------
# 7. Security: Redis credentials and the cluster.redis URL
# --------------------------------------------------------------------------------------------------

def _start_failing_node(url, secrets=()):
    """Runs `braid serve` as a cluster node on ``url`` that must refuse to start: returns its
    stderr after checking exit status 2, a message naming cluster.redis, and no secret in it."""
    cmd = [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
           "--set", f'store.data_dir="{tempfile.mkdtemp(prefix="braid-data-")}"',
           "--set", "cluster.enabled=true", "--set", 'cluster.node="intruder"',
           "--set", 'cluster.listen="127.0.0.1:0"', "--set", f'cluster.secret="{CLUSTER_SECRET}"',
           "--set", f'cluster.redis="{url}"', "--set", "cluster.lease_ms=3000"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"a node on {url} did not refuse to start within 20 s") from e
    text = out.stdout + out.stderr
    assert out.returncode == 2, f"exit status {out.returncode}, not 2: {text[-1500:]}"
    assert "cluster.redis" in out.stderr, f"the message does not name cluster.redis: {out.stderr}"
    assert "panicked" not in text
    for secret in secrets:
        assert secret not in text, f"the password {secret!r} is printed: {text}"
    return out.stderr


def _cross_node_works(connect, a, b):
    topic = unique("cf/auth")
    sub = connect(b, protocol=MQTTv5)
    sub.subscribe(topic, 1)
    pub = connect(a, protocol=MQTTv5)
    _wait_routed(pub, sub, topic)
    pub.publish(topic, b"through an authenticated Redis", qos=1)
    assert [m.payload for m in sub.wait_messages(1)] == [b"through an authenticated Redis"]


AUTH_PROBLEM = re.compile(r"WRONGPASS|NOAUTH|authentication", re.I)


@pytest.fixture
def redis_password():
    """A RedisServer with requirepass (stopped after the nodes: request it before braid_cluster)."""
    r = RedisServer(password="pw-Right-7f3a9")
    yield r
    r.stop()


@pytest.fixture
def redis_acl():
    """A RedisServer whose only user is an ACL user (the default user is off)."""
    r = RedisServer(acl_user=("braid-node", "acl-Right-88b1"))
    yield r
    r.stop()


def test_redis_password(redis_password, braid_cluster, connect):
    redis, password = redis_password, redis_password.password
    n1, n2 = braid_cluster(2, redis=redis)
    _cross_node_works(connect, n1, n2)
    assert password not in n1.log_text() + n2.log_text(), "the Redis password is logged"

    wrong = _start_failing_node(f"redis://:pw-Wrong-0c1d2@{redis.addr}",
                                secrets=("pw-Wrong-0c1d2", password))
    assert AUTH_PROBLEM.search(wrong), f"the message does not say the password was refused: {wrong}"
    none = _start_failing_node(f"redis://{redis.addr}", secrets=(password,))
    assert AUTH_PROBLEM.search(none), f"the message does not say Redis wants a password: {none}"


def test_redis_acl_user(redis_acl, braid_cluster, connect):
    redis, (user, password) = redis_acl, redis_acl.acl_user
    n1, n2 = braid_cluster(2, redis=redis)
    _cross_node_works(connect, n1, n2)
    assert password not in n1.log_text() + n2.log_text(), "the Redis password is logged"

    wrong = _start_failing_node(f"redis://{user}:acl-Wrong-4e5f@{redis.addr}",
                                secrets=("acl-Wrong-4e5f", password))
    assert AUTH_PROBLEM.search(wrong), f"the message does not say the password was refused: {wrong}"
    stranger = _start_failing_node(f"redis://stranger:{password}@{redis.addr}", secrets=(password,))
    assert AUTH_PROBLEM.search(stranger), f"the message does not say the user was refused: {stranger}"
    default = _start_failing_node(f"redis://{redis.addr}", secrets=(password,))
    assert AUTH_PROBLEM.search(default), f"the message does not say Redis wants credentials: {default}"


def test_unreachable_redis_refuses_to_start():
    err = _start_failing_node(f"redis://127.0.0.1:{free_port()}")
    assert re.search(r"refused|connect", err, re.I), f"the message does not say Redis is unreachable: {err}"


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "127.0.0.1:6379", "redis//127.0.0.1:6379"])
def test_cluster_redis_must_be_a_redis_url(url):
    err = _start_failing_node(url)
    assert url in err and "redis://" in err, f"the message does not say what is wrong: {err}"
