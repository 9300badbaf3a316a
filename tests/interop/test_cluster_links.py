"""Cluster links (crates/braid-cluster/src/link/): what users of a Braid cluster see of the direct
node-to-node links (TCP with TLS 1.3) that carry live messages between nodes (conftest's
braid_cluster turns them on: cluster.listen on a free loopback TCP port, one cluster.secret).

Checked here:
  1. cross-node QoS 1 between clean sessions goes over the link and costs Redis no command per
     message (INFO commandstats over the run against an idle window of the same length), and
     /metrics counts it on path="link";
  2. a peer SIGKILLed with messages waiting on its link: the publisher's node sends them through
     the dead node's Redis inbox (path="redis"), the persistent subscriber, back on another node,
     loses no acknowledged message, and the restarted node is linked to again (a new link);
  3. a node with another cluster.secret (or one too short) is refused at start (exit status 2);
  4. a forged link (Python's ssl over a socket, as an outsider would): a hello with a wrong proof
     is answered with the refusal frame "\x00wrong secret", a hello that does not parse with
     "\x00malformed hello", each followed by the close; a hello never finished (and a connection
     that never even starts TLS) is closed after cluster.link_timeout_ms; the real links are
     untouched;
  5. a link cut (iptables DROP of TCP to or from the peer's link port, in a network namespace of
     the test's own) while both nodes still reach Redis: messages go through Redis meanwhile and
     back over the link after, with no acknowledged QoS 1/2 message lost and no QoS 2 message
     twice.

test_cluster_faults.py covers the rest of the fault matrix (SIGKILL of the subscribers' node with
QoS 1 and 2 and a reconnect elsewhere, Redis restarts, partitions), now with links on too.
"""
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BRAID_BIN, CLUSTER_SECRET, ClusterNode, free_port
from clusterutil import PROBE, wait_routed
from helpers import MQTTv5, connect_client, unique, wait_until
from test_cluster_faults import Stream, _cluster_log, _persistent, _reconnect
from v5util import connect_props

pytestmark = pytest.mark.braid_only

ALPN = "braid-cluster/1"
LEASE_S = 3.0              # cluster.lease_ms in conftest's braid_cluster


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def _link(node, peer):
    """``node``'s /metrics about its link to ``peer``: {"up", "link", "redis", "connects"}
    (zeros while it has none: no message for the peer yet)."""
    out = {"up": 0, "link": 0, "redis": 0, "connects": 0}
    for m in re.finditer(r"^braid_cluster_link_(\w+)\{([^}]*)\} (\S+)$", node.admin_get("/metrics"), re.M):
        name, labels, value = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))
        if labels.get("peer") != peer:
            continue
        key = {"up": "up", "connects_total": "connects"}.get(name) or labels.get("path")
        out[key] = int(value)
    return out


def _link_state(node, peer):
    """What ``node``'s /api/v1/nodes says of its link to ``peer`` ("up", "down", "idle")."""
    return next((e["link"] for e in node.admin_get("/api/v1/nodes")["data"] if e["name"] == peer), None)


def _wait_link_up(node, peer, timeout=5.0):
    """Waits until ``node`` has its link to ``peer`` up (made once a message is for the peer);
    returns its counts then."""
    return wait_until(lambda: (lambda c: c if c["up"] == 1 else None)(_link(node, peer)),
                      timeout=timeout, interval=0.05, message=f"{node.node}'s link to {peer} up")


def _commandstats(redis):
    """Calls per Redis command, from INFO commandstats (redis-cli)."""
    return {m.group(1): int(m.group(2)) for m in
            re.finditer(r"^cmdstat_([^:]+):calls=(\d+)", redis.cli("INFO", "commandstats"), re.M)}


def _window(redis, action=None, seconds=None):
    """Runs ``action`` (or nothing) in a window of ``seconds`` (or the whole leases it takes) and
    returns (Redis commands called in the window, by name; its length). The nodes' timers renew
    leases and read the live nodes every quarter lease: windows of whole quarters hold as many
    of them (give or take one per node, where a tick falls at a window's edge)."""
    before, start = _commandstats(redis), time.monotonic()
    if action:
        action()
    if seconds is None:
        seconds = LEASE_S * max(1, -(-(time.monotonic() - start) // LEASE_S))
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    after = _commandstats(redis)
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}, seconds


def _payloads(client):
    return [m.payload for m in client.received if m.payload != PROBE]


# --------------------------------------------------------------------------------------------------
# 1. Over the link, no Redis command per message
# --------------------------------------------------------------------------------------------------
# The nodes' timers (lease renewals and heartbeats, inbox and route log reads) use Redis at a
# steady rate: the window with the messages is compared with idle windows of the same length.

N = 500


def test_cross_node_qos1_goes_over_the_link_without_redis_commands_per_message(braid_cluster, connect,
                                                                               mosquitto_sub):
    nodes = braid_cluster(2)
    n1, n2 = nodes
    topic = unique("cl/bulk")
    sub = mosquitto_sub(n2, topic, qos=1)                   # 3.1.1, clean session
    pub = connect(n1, protocol=MQTTv5)
    wait_routed(pub, sub, topic)
    _wait_link_up(n1, "n2")
    wait_until(lambda: _link_state(n1, "n2") == "up", timeout=LEASE_S, interval=0.05,
               message="/api/v1/nodes on n1 saying its link to n2 is up")
    for i in range(10):                                     # warm: the link carries QoS 1 already
        pub.publish(topic, b"warm-%d" % i, qos=1)
    sub.wait_messages(10)
    before = _link(n1, "n2")

    sent = [f"m-{i:04d}".encode() for i in range(N)]
    got = []

    def publish_all():
        for p in sent:                                      # one at a time: one PUBACK each
            assert pub.publish(topic, p, qos=1) == 0
        got.extend(m.payload for m in sub.wait_messages(N, timeout=30))

    run, window = _window(nodes.redis, publish_all)
    idle = [_window(nodes.redis, seconds=window)[0] for _ in range(2)]
    after = _link(n1, "n2")

    # What the window with the messages used beyond the most either idle window used.
    grown = {k: v - max(i.get(k, 0) for i in idle) for k, v in run.items()}
    grown = {k: v for k, v in grown.items() if v > 0}
    report = (f"{N} QoS 1 messages n1 -> n2; Redis commands in a {window:.0f} s window with them "
              f"{dict(sorted(run.items()))}, in idle ones {[dict(sorted(i.items())) for i in idle]}, "
              f"more with the messages: {grown or 'none'}; n1's link to n2: {before} before, {after} after")
    print(report)
    assert got == sent, report
    assert sum(grown.values()) < 20, "Redis commands grow with the messages: " + report
    assert after["link"] - before["link"] >= N and after["redis"] == before["redis"], report
    assert after["up"] == 1 and after["connects"] == 1, report


# --------------------------------------------------------------------------------------------------
# 2. The peer killed with messages on its link; restarted, linked to again
# --------------------------------------------------------------------------------------------------
# test_cluster_faults.py's SIGKILL test already checks that a killed node's persistent
# subscribers, back on another node, lose no acknowledged QoS 1/2 message. Here the link's side
# of it: the publisher's node had messages waiting for the dead peer's acknowledgement; once the
# link fails (here at once: the dead process's kernel closes its TCP connection; a dead machine
# would take cluster.link_timeout_ms, 2 s, of silence) it sends them through the peer's Redis
# inbox, which the node that takes the peer over reads. Then the peer comes back and is linked
# to anew.

def test_peer_killed_messages_on_its_link_go_through_redis_then_it_is_linked_again(braid_cluster, connect,
                                                                                   mosquitto_sub):
    n1, n2, n3 = braid_cluster(3)
    topic, cid = unique("cl/kill"), unique("cl-kill")
    s = _persistent(connect, n2, cid, fresh=True)
    assert s.subscribe(topic, 1) == [1]
    pub = connect(n1, protocol=MQTTv5)
    wait_routed(pub, s, topic)
    _wait_link_up(n1, "n2")
    start = _link(n1, "n2")

    stream = Stream(pub, [(topic, 1)], interval=0.01)
    wait_until(lambda: len(stream.acked(topic)) >= 100, timeout=10, message="100 messages acknowledged")
    acked_live = len(stream.acked(topic))
    live = _link(n1, "n2")                # counts every message acknowledged so far
    n2.kill()
    s.wait_disconnected(5)
    _reconnect(s, n3)                    # n3 takes n2 over once its lease lapses
    time.sleep(1.0)
    stream.stop()
    stream.wait_all_acked(15)
    acked = stream.acked(topic)
    try:
        wait_until(lambda: set(acked) <= set(_payloads(s)), timeout=10, message="every acknowledged message")
    except AssertionError:
        pass                             # reported below
    dead = _link(n1, "n2")
    got = _payloads(s)
    lost = sorted(set(acked) - set(got))
    report = (f"n1's link to n2: {start} at first, {live} with {acked_live} acknowledged, {dead} after "
              f"the SIGKILL of n2; {len(stream.sent)} published, {len(acked)} acknowledged, "
              f"{len(set(got))} received ({len(got) - len(set(got))} twice), {len(lost)} lost {lost[:5]}; "
              f"back on n3 with session present {s.connack.session_present}")
    print(report)
    report += "\n" + _cluster_log(n1, n3)
    assert live["redis"] == start["redis"] and live["link"] - start["link"] >= acked_live, \
        "messages to n2 did not go over the link while it was up: " + report
    assert s.connack.session_present, report
    assert not lost, report
    assert dead["redis"] > live["redis"] and dead["up"] == 0, \
        "the messages waiting on the dead link did not go through Redis: " + report

    # n2 back (same name and data directory): n1 links to it again and uses the new link.
    n2.start()
    topic2 = unique("cl/back")
    sub = mosquitto_sub(n2, topic2, qos=1)
    wait_routed(pub, sub, topic2)
    back = _wait_link_up(n1, "n2", timeout=LEASE_S + 2)
    for i in range(20):
        pub.publish(topic2, b"back-%d" % i, qos=1)
    assert [m.payload for m in sub.wait_messages(20)] == [b"back-%d" % i for i in range(20)]
    again = _link(n1, "n2")
    report = f"n1's link to the restarted n2: {back} once up, {again} after 20 messages"
    assert again["connects"] == dead["connects"] + 1 and again["up"] == 1, report
    assert again["link"] - back["link"] >= 20, report


# --------------------------------------------------------------------------------------------------
# 3. A node without the cluster's secret is refused at start
# --------------------------------------------------------------------------------------------------

def _start_refused_node(redis, secret):
    """`braid serve` as node "intruder" with cluster.secret ``secret`` on ``redis``: returns
    (exit status, stdout + stderr, stderr) once it exits (within 20 s)."""
    cmd = [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
           "--set", f'store.data_dir="{tempfile.mkdtemp(prefix="braid-data-")}"',
           "--set", "cluster.enabled=true", "--set", 'cluster.node="intruder"',
           "--set", f'cluster.redis="{redis.url}"', "--set", "cluster.lease_ms=3000",
           "--set", 'cluster.listen="127.0.0.1:0"', "--set", f"cluster.secret={json.dumps(secret)}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"a node with cluster.secret {secret!r} did not refuse to start within 20 s") from e
    return out.returncode, out.stdout + out.stderr, out.stderr


def test_node_with_another_secret_is_refused_at_start(braid_cluster, connect):
    nodes = braid_cluster(1)
    fingerprint = nodes.redis.cli("GET", "braid:secret")
    other = "another-secret-of-the-intruder"
    status, text, err = _start_refused_node(nodes.redis, other)
    assert status == 2, f"exit status {status}, not 2: {text[-1500:]}"
    assert "cluster.secret" in err and "not the secret of the running nodes" in err and '"n1"' in err, err
    assert other not in text and CLUSTER_SECRET not in text, f"a secret is printed: {text}"
    assert "panicked" not in text

    short = "too-short"                                     # < 16 characters with cluster.listen set
    status, text, err = _start_refused_node(nodes.redis, short)
    assert status == 2, f"exit status {status}, not 2: {text[-1500:]}"
    assert "cluster.secret: required when cluster.listen is set" in err, err
    assert short not in text, f"the secret is printed: {text}"

    # n1 goes on serving, the only node, and the fingerprint of its secret is still in Redis.
    topic = unique("cl/still")
    c = connect(nodes[0])
    c.subscribe(topic, 1)
    c.publish(topic, b"still here", qos=1)
    assert c.get_message().payload == b"still here"
    assert nodes.redis.cli("HKEYS", "braid:nodes").split() == ["n1"]
    assert fingerprint and nodes.redis.cli("GET", "braid:secret") == fingerprint


# --------------------------------------------------------------------------------------------------
# 4. A forged link
# --------------------------------------------------------------------------------------------------

def _hello(node, incarnation, proof):
    """A link hello frame: version 1 and u32-LE-length fields."""
    return _frame(bytes([1]) + b"".join(len(f).to_bytes(4, "little") + f for f in (node, incarnation, proof)))


def _frame(body):
    """A link frame: 4-byte big-endian length, then ``body``."""
    return len(body).to_bytes(4, "big") + body


def _forge(addr, frame, timeout=5.0, tls=True):
    """Dials the link address ``addr`` over TCP, makes the TLS handshake with Python's ssl (ALPN
    braid-cluster/1, TLS 1.3, certificate not checked) and sends ``frame`` (``tls`` False: sends
    nothing at all, not even a ClientHello), then reads until the node closes the connection:
    returns (the bytes it sent, how it closed, seconds from the frame to the close)."""
    host, port = addr.rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols([ALPN])
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        conn = raw
        if tls:
            conn = ctx.wrap_socket(raw, server_hostname="n1")
            assert conn.version() == "TLSv1.3", f"link TLS version {conn.version()}"
            assert conn.selected_alpn_protocol() == ALPN, f"ALPN {conn.selected_alpn_protocol()!r}"
        start, got = time.monotonic(), b""
        conn.sendall(frame)
        while True:
            conn.settimeout(max(0.01, start + timeout - time.monotonic()))
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                raise AssertionError(f"the node did not close a forged link within {timeout} s "
                                     f"(it sent {got!r})") from None
            except (ssl.SSLEOFError, ConnectionResetError) as e:
                how = type(e).__name__            # no close_notify / a TCP reset
                break
            if not chunk:
                how = "EOF"
                break
            got += chunk
        return got, how, time.monotonic() - start


def test_forged_link_is_refused_and_real_links_go_on(braid_cluster, connect):
    nodes = braid_cluster(2)
    n1, n2 = nodes
    t12, t21 = unique("cl/12"), unique("cl/21")
    s1, s2 = connect(n1), connect(n2)
    s1.subscribe(t21, 1)
    s2.subscribe(t12, 1)
    p1, p2 = connect(n1, protocol=MQTTv5), connect(n2, protocol=MQTTv5)
    wait_routed(p1, s2, t12)
    wait_routed(p2, s1, t21)
    links = {"n1->n2": (n1, "n2"), "n2->n1": (n2, "n1")}
    before = {k: _wait_link_up(*v) for k, v in links.items()}

    def exchange(tag):
        for i in range(20):
            p1.publish(t12, f"{tag}-{i}".encode(), qos=1)
            p2.publish(t21, f"{tag}-{i}".encode(), qos=1)
        want = [f"{tag}-{i}".encode() for i in range(20)]
        assert [m.payload for m in s2.wait_messages(20)] == want
        assert [m.payload for m in s1.wait_messages(20)] == want

    exchange("before")
    addr = nodes.redis.cli("HGET", "braid:links", "n1")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", addr), f"braid:links n1 = {addr!r}"

    # An impostor saying it is n2, with a proof that is not one.
    wrong = _forge(addr, _hello(b"n2", b"n2@1", os.urandom(32)))
    # Bytes that are no hello at all.
    garbage = _forge(addr, _frame(b"hello"))
    # A hello begun and never finished (100 bytes announced, 4 sent): closed once
    # cluster.link_timeout_ms (2 s) is over, not held open.
    unfinished = _forge(addr, (100).to_bytes(4, "big") + b"\x01n2\x00\x00")
    # A TCP connection that never even starts TLS: the same.
    silent = _forge(addr, b"", tls=False)

    exchange("after")
    after = {k: _link(*v) for k, v in links.items()}
    log = n1.log_text()
    report = (f"wrong proof: {wrong[0]!r} then {wrong[1]} after {wrong[2]:.2f} s; garbage: {garbage[0]!r} "
              f"then {garbage[1]} after {garbage[2]:.2f} s; unfinished hello: {unfinished[0]!r} then "
              f"{unfinished[1]} after {unfinished[2]:.2f} s; no TLS: {silent[0]!r} then {silent[1]} after "
              f"{silent[2]:.2f} s; links {before} before, {after} after")
    print(report)
    # Each refusal is one frame, then the close (well before the link timeout).
    assert wrong[0] == _frame(b"\x00wrong secret") and wrong[2] < 1.5, report
    assert garbage[0] == _frame(b"\x00malformed hello") and garbage[2] < 1.5, report
    assert 'a peer saying it is node "n2" did not prove cluster.secret' in log, _cluster_log(n1)
    assert "a malformed hello" in log, _cluster_log(n1)
    # Nothing but the close for connections without a hello, after the link timeout.
    for r in (unfinished, silent):
        assert r[0] == b"" and 1.5 < r[2] < 4.0, report + "\n" + _cluster_log(n1)
    assert log.count("no hello in 2000 ms") == 2, report + "\n" + _cluster_log(n1)
    # The real links were not disturbed: never down, nothing through Redis.
    for k in links:
        assert after[k]["up"] == 1 and after[k]["connects"] == before[k]["connects"], report
        assert after[k]["redis"] == before[k]["redis"] and after[k]["link"] - before[k]["link"] >= 40, report


# --------------------------------------------------------------------------------------------------
# 5. A link cut while both nodes reach Redis
# --------------------------------------------------------------------------------------------------
# The scenario runs in a network namespace of its own (`unshare -n`, loopback only), where this
# file runs itself as a script (`link-cut`): Redis and two nodes (cluster.link_timeout_ms 1000),
# a persistent subscriber on n2 (QoS 1 and QoS 2 topics) and a publisher on n1 sending 50 msg/s
# on each. After 4 s, iptables drops the link's packets for 6 s, then lets them through again for
# 4 s more: "both-ways" drops every TCP segment to or from n2's link port (`-I INPUT -p tcp
# --dport PORT -j DROP`, and `--sport PORT`), "to-n2" only those to it (n1 still hears n2, which
# stops hearing n1), "from-n2" only those from it (n2 gets the messages and routes them, n1 never
# hears that it did, nor gets TCP's acknowledgements: it sends them again through Redis, and n2
# must drop those copies). n1 notices the cut by TCP_USER_TIMEOUT (what it sent stays
# unacknowledged) or by n2's counts stopping, both set to cluster.link_timeout_ms. The scenario
# prints its counts as one JSON line; the test judges them.

BEFORE_S, CUT_S, AFTER_S = 4.0, 6.0, 4.0
LINK_TIMEOUT_MS = 1000


def _link_cut_scenario(direction):
    from redisproc import RedisServer

    redis, nodes = RedisServer(), []
    clients = []
    try:
        for name in ("n1", "n2"):         # as conftest's braid_cluster, with a shorter link timeout
            nodes.append(ClusterNode(name, {"braid": {
                "cluster.enabled": True, "cluster.node": name, "cluster.redis": redis.url,
                "cluster.lease_ms": 3000, "cluster.listen": "127.0.0.1:0", "cluster.secret": CLUSTER_SECRET,
                "cluster.link_timeout_ms": LINK_TIMEOUT_MS}}))
        n1, n2 = nodes
        t1, t2 = unique("cl/cut/q1"), unique("cl/cut/q2")
        s = connect_client(n2, client_id=unique("cl-cut"), protocol=MQTTv5, clean_start=True,
                           properties=connect_props(SessionExpiryInterval=300))
        clients.append(s)
        assert s.subscribe(t1, 1) == [1] and s.subscribe(t2, 2) == [2]
        pub = connect_client(n1, protocol=MQTTv5)
        clients.append(pub)
        wait_routed(pub, s, t1)
        wait_routed(pub, s, t2)
        _wait_link_up(n1, "n2")
        port = redis.cli("HGET", "braid:links", "n2").rsplit(":", 1)[1]
        rules = [["INPUT", "-p", "tcp", f"--{p}", port, "-j", "DROP"]
                 for p in {"both-ways": ("dport", "sport"), "to-n2": ("dport",),
                           "from-n2": ("sport",)}[direction]]
        m = {"routed": _link(n1, "n2")}

        stream = Stream(pub, [(t1, 1), (t2, 2)], interval=0.01)
        time.sleep(BEFORE_S)
        m["start"] = _link(n1, "n2")
        for rule in rules:
            subprocess.run(["iptables", "-I", *rule], check=True)
        cut_at = time.monotonic()
        try:
            time.sleep(CUT_S)
            m["cut"], state_cut = _link(n1, "n2"), _link_state(n1, "n2")
        finally:
            for rule in rules:
                subprocess.run(["iptables", "-D", *rule], check=True)
        restored_at = time.monotonic()
        time.sleep(AFTER_S)
        m["restored"], state_end = _link(n1, "n2"), _link_state(n1, "n2")
        stream.stop()
        stream.wait_all_acked(15)
        acked1, acked2 = stream.acked(t1), stream.acked(t2)
        try:
            wait_until(lambda: set(acked1) <= set(_payloads(s)) and set(acked2) <= set(_payloads(s)),
                       timeout=10, message="every acknowledged message")
        except AssertionError:
            pass
        time.sleep(0.5)                   # a second copy would be here by now
        got1 = [x.payload for x in s.received if x.topic == t1 and x.payload != PROBE]
        got2 = [x.payload for x in s.received if x.topic == t2 and x.payload != PROBE]
        sent_at = {p: at for p, _, _, _, at in stream.sent}

        def phase(ps):                    # published before, during and after the cut
            return [sum(1 for p in ps if sent_at[p] < cut_at),
                    sum(1 for p in ps if cut_at <= sent_at[p] < restored_at),
                    sum(1 for p in ps if sent_at[p] >= restored_at)]

        # Published during the cut and received before n1 could have given up on the link
        # (cluster.link_timeout_ms without a word from n2): over the link.
        first = {}
        for x in s.received:
            first.setdefault(x.payload, x.received_at)
        over_link = [p for p, at in sent_at.items()
                     if at >= cut_at and first.get(p, restored_at) < cut_at + 0.8 * LINK_TIMEOUT_MS / 1000]
        return {
            "published": len(stream.sent), "acked": [len(acked1), len(acked2)],
            "acked_by_phase": phase(acked1 + acked2), "cut_over_link": len(over_link),
            "received": [len(set(got1)), len(set(got2))],
            "lost1": sorted(p.decode() for p in set(acked1) - set(got1)),
            "lost2": sorted(p.decode() for p in set(acked2) - set(got2)),
            "dup1": len(got1) - len(set(got1)),
            "dup2": sorted({p.decode() for p in got2 if got2.count(p) > 1}),
            "metrics": m, "state_cut": state_cut, "state_end": state_end,
            "subscriber_connected": s.is_connected(),
            "log": _cluster_log(n1, n2, last=12),
        }
    finally:
        for c in clients:
            c.close()
        for n in nodes:
            n.stop()
        redis.stop()


@pytest.mark.parametrize("direction", ["both-ways", "to-n2", "from-n2"])
def test_link_cut_traffic_goes_through_redis_and_back_without_loss(direction):
    if os.geteuid() != 0:
        pytest.skip("needs root: a network namespace (unshare -n) and iptables in it")
    for tool in ("unshare", "ip", "iptables"):
        assert shutil.which(tool), f"{tool} not found: run scripts/install-test-deps (Debian iptables)"
    cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$1" link-cut "$2"',
           sys.executable, os.path.abspath(__file__), direction]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the link-cut scenario did not end within 90 s:\n{out[-2000:]}\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"the scenario failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    r = json.loads(lines[-1][len("RESULT "):])
    m = r["metrics"]
    log = r.pop("log")
    report = json.dumps(r)
    print(report)
    report += "\n" + log
    assert r["subscriber_connected"], report
    assert all(r["acked_by_phase"]), "a phase without acknowledged messages: " + report
    assert not r["lost1"] and not r["lost2"], "acknowledged messages lost: " + report
    assert not r["dup2"], "QoS 2 messages delivered twice: " + report
    # Over the link before the cut, through Redis while cut (link down), over the link again after.
    assert m["start"]["redis"] == m["routed"]["redis"] and m["start"]["connects"] == 1, report
    assert m["start"]["link"] > m["routed"]["link"], report
    assert m["cut"]["redis"] > m["start"]["redis"] and m["cut"]["up"] == 0 and r["state_cut"] == "down", report
    assert m["restored"]["up"] == 1 and m["restored"]["connects"] >= 2 and r["state_end"] == "up", report
    assert m["restored"]["link"] > m["cut"]["link"], report
    if direction == "from-n2":
        # The arrangement: n2 got messages over the link during the cut, which n1, unanswered,
        # also sent through Redis (the copies n2 dropped).
        assert r["cut_over_link"] > 0, "no message reached n2 over the cut link: " + report


if __name__ == "__main__" and sys.argv[1:2] == ["link-cut"]:
    print("RESULT " + json.dumps(_link_cut_scenario(sys.argv[2])), flush=True)
