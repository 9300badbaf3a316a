"""Cluster on the Redis deployments Braid supports besides one plain Redis
(crates/braid-cluster, docs/cluster.md): a Redis Cluster of three masters, Redis over TLS
(``rediss://`` with ``cluster.ca_file``), and a Redis restarted without persistence, which the
nodes must notice (their leases are gone) and join again.

What is checked is what independent clients (paho-mqtt) see on the nodes, plus a few cheap looks
into Redis with redis-cli: a session's keys share one hash slot, the nodes' leases are there.
"""
import re
import subprocess
import tempfile
import time

import pytest

from conftest import BRAID_BIN, CLUSTER_SECRET, free_port
from clusterutil import PROBE, wait_routed
from helpers import MQTTv311, MQTTv5, connect_client, unique, wait_until
from pki import Pki
from redisproc import RedisCluster, RedisServer
from v5util import connect_props, rc

pytestmark = pytest.mark.braid_only

SESSION_TAKEN_OVER = 0x8E
LEASE_S = 3.0  # cluster.lease_ms in conftest's braid_cluster


# --------------------------------------------------------------------------------------------------
# Helpers and fixtures
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_cluster():
    """One Redis Cluster (3 masters) for the module; each test's nodes use a key prefix of their
    own (``_prefixed``), so the tests never see each other's keys."""
    c = RedisCluster(3, appendonly=False)
    yield c
    c.stop()


def _prefixed():
    """Settings for braid_cluster: a cluster.key_prefix of its own. Returns (prefix, settings)."""
    prefix = unique("bt")
    return prefix, {"cluster.key_prefix": prefix}


def _data(msgs):
    """The messages that are not wait_routed's probes."""
    return [m for m in msgs if m.payload != PROBE]


def _settled(client, n, timeout):
    """The data messages `client` got once it has `n` of them (or `timeout` passed) and a
    moment later: what the assertions then compare, extra deliveries included."""
    try:
        wait_until(lambda: len(_data(client.received)) >= n, timeout=timeout, message=f"{n} messages")
    except AssertionError:
        pass
    time.sleep(0.3)
    return _data(client.received)


def _persistent(connect, node, cid, fresh):
    """A v5 connection with a Session Expiry Interval of 300 s."""
    return connect(node, client_id=cid, protocol=MQTTv5, clean_start=fresh,
                   properties=connect_props(SessionExpiryInterval=300))


def _difference(seen, expected):
    """What is wrong with the received list ``seen`` against ``expected``, in a few words."""
    first = next((k for k, (a, b) in enumerate(zip(seen, expected)) if a != b), min(len(seen), len(expected)))
    return (f"{len(seen)} received, {len(seen) - len(set(seen))} duplicates, "
            f"{len(set(expected) - set(seen))} missing, first difference at #{first}: "
            f"{seen[first:first + 3]} instead of {expected[first:first + 3]}")


def _topic_inversions(seen):
    """How many times a message came after a later one of the same topic (an Ordered Topic's
    order broken): ``seen`` is [(topic, payload, qos)] with payloads that sort in publish order."""
    last, count = {}, 0
    for topic, payload, _ in seen:
        if topic in last and payload < last[topic]:
            count += 1
        last[topic] = max(payload, last.get(topic, payload))
    return count


def _cluster_log(nodes, last=25):
    """The nodes' log lines about the cluster, for failure messages."""
    out = []
    for n in nodes:
        lines = [line for line in n.log_text().splitlines()
                 if "cluster" in line or "WARN" in line or "ERROR" in line]
        out += [f"{n.node}: {line}" for line in lines[-last:]]
    return "\n".join(out) or "(no log line about the cluster)"


# --------------------------------------------------------------------------------------------------
# 1. A Redis Cluster of three masters serves as well as one Redis
# --------------------------------------------------------------------------------------------------

def test_redis_cluster_qos1_and_qos2_across_nodes_with_wildcards(redis_cluster, braid_cluster, connect):
    _, settings = _prefixed()
    n1, n2, n3 = braid_cluster(3, redis=redis_cluster, settings=settings)
    base = unique("rc/flow")
    sub2 = connect(n2, protocol=MQTTv5)
    assert sub2.subscribe(f"{base}/+/dev/+", 2) == [2]
    sub3 = connect(n3, protocol=MQTTv311)
    assert sub3.subscribe(f"{base}/#", 2) == [2]
    pub = connect(n1, protocol=MQTTv5)
    probe = f"{base}/probe/dev/x"
    wait_routed(pub, sub2, probe)
    wait_routed(pub, sub3, probe)

    count = 200
    expected = {1: [], 2: []}
    infos = []
    for i in range(count):
        for qos in (1, 2):
            topic, payload = f"{base}/q{qos}/dev/{i % 4}", f"q{qos}-{i:03d}".encode()
            infos.append(pub.publish(topic, payload, qos=qos, wait=False))
            expected[qos].append((topic, payload, qos))
    wait_until(lambda: all(i.is_published() for i in infos), timeout=30,
               message=f"PUBACK / PUBCOMP of all {2 * count} messages")

    for name, sub in (("n2 (v5, +/dev/+)", sub2), ("n3 (3.1.1, #)", sub3)):
        got = _settled(sub, 2 * count, timeout=20)
        for qos in (1, 2):
            seen = [(m.topic, m.payload, m.qos) for m in got if m.payload.startswith(b"q%d-" % qos)]
            assert seen == expected[qos], (
                f"subscriber on {name}: QoS {qos} messages not received exactly once in order: "
                f"{_difference(seen, expected[qos])}; {_topic_inversions(seen)} inversions within "
                f"one topic\n{_cluster_log((n1, n2, n3))}")
        assert len(got) == 2 * count, f"subscriber on {name}: {len(got)} messages, not {2 * count}"


def test_redis_cluster_retained_message_seen_on_another_node(redis_cluster, braid_cluster, connect):
    prefix, settings = _prefixed()
    n1, n2, n3 = braid_cluster(3, redis=redis_cluster, settings=settings)
    base = unique("rc/retained")
    topic = f"{base}/state"
    pub = connect(n1, protocol=MQTTv5)
    pub.publish(topic, b"on", qos=1, retain=True)    # PUBACK: the retained message is in Redis
    assert redis_cluster.cli("HEXISTS", f"{prefix}:retained:{{r}}", topic) == "1", \
        "the retained message is not in Redis's retained hash"

    sub = connect(n3, protocol=MQTTv5)
    assert sub.subscribe(f"{base}/+", 1) == [1]
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"on", 1, True)
    sub.expect_no_message(0.3)

    # Cleared on n2: a new subscriber on n3 gets nothing.
    connect(n2, protocol=MQTTv5).publish(topic, b"", qos=1, retain=True)
    late = connect(n3, protocol=MQTTv5)
    assert late.subscribe(f"{base}/+", 1) == [1]
    late.expect_no_message(0.5)


def test_redis_cluster_offline_session_resumes_on_another_node(redis_cluster, braid_cluster, connect):
    prefix, settings = _prefixed()
    n1, n2, n3 = braid_cluster(3, redis=redis_cluster, settings=settings)
    base = unique("rc/offline")
    cid = unique("roam")
    first = _persistent(connect, n1, cid, fresh=True)
    assert first.subscribe(f"{base}/#", 2) == [2]
    pub = connect(n2, protocol=MQTTv5)
    wait_routed(pub, first, f"{base}/probe")
    first.disconnect()

    expected = {1: [], 2: []}
    for i in range(40):
        qos = 1 + i % 2
        topic, payload = f"{base}/q{qos}/{i % 3}", f"q{qos}-{i:02d}".encode()
        pub.publish(topic, payload, qos=qos)          # waits for PUBACK / PUBCOMP
        expected[qos].append((topic, payload, qos))

    # The session's keys are hash-tagged with its client id: one slot of the Redis Cluster.
    meta, queue = f"{prefix}:s:{{{cid}}}", f"{prefix}:q:{{{cid}}}"
    wait_until(lambda: redis_cluster.cli("EXISTS", meta, queue) == "2", timeout=5,
               message=f"the session's keys {meta} and {queue} in Redis")
    slots = {k: redis_cluster.cli("CLUSTER", "KEYSLOT", k) for k in (meta, queue, cid)}
    assert slots[meta] == slots[queue] == slots[cid], f"the session's keys are on several slots: {slots}"

    back = _persistent(connect, n3, cid, fresh=False)
    assert back.connack.session_present is True, "the session was not found on n3"
    got = _settled(back, 40, timeout=10)
    for qos in (1, 2):
        seen = [(m.topic, m.payload, m.qos) for m in got if m.payload.startswith(b"q%d-" % qos)]
        assert seen == expected[qos], (
            f"queued QoS {qos} messages not delivered exactly once in order on n3: "
            f"{_difference(seen, expected[qos])}\n{_cluster_log((n1, n2, n3))}")
    assert len(got) == 40
    assert not any(m.dup for m in got), "never sent before: no DUP"

    # Its subscription came along: a message published now on n2 reaches it on n3.
    pub.publish(f"{base}/live", b"live", qos=1)
    wait_until(lambda: b"live" in [m.payload for m in back.received], timeout=5,
               message="a message published after the resume")


def test_redis_cluster_live_takeover_closes_the_first_connection(redis_cluster, braid_cluster, connect):
    _, settings = _prefixed()
    n1, n2, n3 = braid_cluster(3, redis=redis_cluster, settings=settings)
    topic = unique("rc/takeover")
    cid = unique("twin")
    first = _persistent(connect, n1, cid, fresh=True)
    assert first.subscribe(topic, 1) == [1]
    pub = connect(n3, protocol=MQTTv5)
    wait_routed(pub, first, topic)

    second = _persistent(connect, n2, cid, fresh=False)
    assert second.connack.session_present is True, "the session did not move to n2"
    first.wait_disconnected(5)
    assert rc(first.disconnect_reason) == SESSION_TAKEN_OVER, \
        f"first connection ended with {first.disconnect_reason!r}, not 0x8E Session taken over"
    assert second.is_connected()

    pub.publish(topic, b"after", qos=1)
    wait_until(lambda: b"after" in [m.payload for m in second.received], timeout=5,
               message="a message published after the takeover, on the new connection")
    assert b"after" not in [m.payload for m in first.received]


# --------------------------------------------------------------------------------------------------
# 2. Redis over TLS
# --------------------------------------------------------------------------------------------------

@pytest.fixture
def tls_redis(tmp_path):
    """A Redis on a TLS port only, its certificate signed by CA ``ca`` (``.pki.path("ca.pem")``);
    a second CA ``stranger`` signed nothing of it."""
    pki = Pki(tmp_path)
    pki.ca("ca")
    cert, key = pki.issue("redis", "redis test server", ca="ca")
    pki.ca("stranger")
    r = RedisServer(appendonly=False, tls=(cert, key, pki.path("ca.pem")))
    r.pki = pki
    yield r
    r.stop()


TLS_PROBLEM = re.compile(r"tls|ssl|certificate|issuer|handshake", re.I)


def test_redis_over_tls(tls_redis, braid_cluster, connect):
    assert tls_redis.url.startswith("rediss://")
    n1, n2 = braid_cluster(2, redis=tls_redis, settings={"cluster.ca_file": tls_redis.pki.path("ca.pem")})
    assert tls_redis.cli("EXISTS", "braid:lease:{n1}", "braid:lease:{n2}") == "2", \
        "the nodes' leases are not in the TLS Redis"

    topic = unique("tls/cross")
    sub = connect(n2, protocol=MQTTv5)
    assert sub.subscribe(topic, 1) == [1]
    pub = connect(n1, protocol=MQTTv5)
    wait_routed(pub, sub, topic)
    sent = [f"m{i:02d}".encode() for i in range(20)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    got = [m for m in sub.wait_messages(20, timeout=10)]
    assert [(m.payload, m.qos) for m in got] == [(p, 1) for p in sent]
    sub.expect_no_message(0.3)


def test_redis_over_tls_with_the_wrong_ca_refuses_to_start(tls_redis):
    bound = 15.0
    cmd = [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{free_port()}",
           "--set", f'store.data_dir="{tempfile.mkdtemp(prefix="braid-data-")}"',
           "--set", "cluster.enabled=true", "--set", 'cluster.node="stranger"',
           "--set", 'cluster.listen="127.0.0.1:0"', "--set", f'cluster.secret="{CLUSTER_SECRET}"',
           "--set", f'cluster.redis="{tls_redis.url}"', "--set", "cluster.lease_ms=3000",
           "--set", f'cluster.ca_file="{tls_redis.pki.path("stranger.pem")}"']
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"a node whose cluster.ca_file did not sign the Redis certificate neither refused nor "
            f"gave up within {bound} s (it hangs):\nstdout: {out[-1500:]}\nstderr: {err[-1500:]}")
    took = time.monotonic() - t0
    text = out + err
    assert proc.returncode == 2, f"exit status {proc.returncode}, not 2, after {took:.1f} s: {text[-1500:]}"
    assert "cluster.redis" in err, f"the message does not name cluster.redis: {err}"
    assert TLS_PROBLEM.search(err), f"the message does not say TLS / the certificate is the problem: {err}"
    assert "panicked" not in text
    print(f"wrong CA: refused after {took:.1f} s: {err.strip()}")


# --------------------------------------------------------------------------------------------------
# 3. Redis restarted without persistence: the nodes notice their leases are gone and join again
# --------------------------------------------------------------------------------------------------

@pytest.fixture
def volatile_redis():
    """A Redis without AOF: a restart comes back empty."""
    r = RedisServer(appendonly=False)
    yield r
    r.stop()


def test_redis_restarted_without_persistence_nodes_join_again(volatile_redis, braid_cluster):
    nodes = braid_cluster(2, redis=volatile_redis)
    n1, n2 = nodes
    clients = []
    state = {"last": "no attempt"}

    def attempt(tag):
        """A fresh subscriber on n2 and publisher on n1; True once a QoS 1 message gets across."""
        topic = unique(f"rr/{tag}")
        try:
            sub = connect_client(n2, protocol=MQTTv5, timeout=3)
            clients.append(sub)
            granted = sub.subscribe(topic, 1, timeout=4)
            if granted != [1]:
                state["last"] = f"SUBACK {granted}"
                return False
            pub = connect_client(n1, protocol=MQTTv5, timeout=3)
            clients.append(pub)
            pub.publish(topic, b"across", qos=1, timeout=3)
            m = sub.get_message(timeout=2)
            if (m.topic, m.payload) != (topic, b"across"):
                state["last"] = f"got {m.topic} {m.payload!r}"
                return False
            state["pair"] = (pub, sub, topic)
            return True
        except (AssertionError, OSError) as e:
            state["last"] = f"{type(e).__name__}: {e}"
            return False

    try:
        assert attempt("before"), f"cross-node QoS 1 before the restart: {state['last']}"
        volatile_redis.cli("SET", "test:marker", "before the restart")
        volatile_redis.stop()
        volatile_redis.start()
        up = time.monotonic()
        assert volatile_redis.cli("EXISTS", "test:marker") == "0", "Redis did not come back empty"
        # The nodes notice their leases are gone at their next renewal and take them again
        # (which also closes their connections: the clients of the test come after).
        leases = ("braid:lease:{n1}", "braid:lease:{n2}")
        try:
            wait_until(lambda: volatile_redis.cli("EXISTS", *leases, check=False) == "2", timeout=15,
                       interval=0.1, message="both nodes' leases back in the restarted Redis")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_cluster_log(nodes)}") from None
        leased = time.monotonic() - up
        try:
            wait_until(lambda: attempt("after"), timeout=15, interval=0.2,
                       message="cross-node QoS 1 after Redis came back empty")
        except AssertionError as e:
            raise AssertionError(f"{e}; last attempt: {state['last']}\n{_cluster_log(nodes)}") from None
        took = time.monotonic() - up
        print(f"Redis restarted empty: leases back after {leased:.1f} s, cross-node QoS 1 works "
              f"again after {took:.1f} s")

        # And it keeps working: 20 more, in order.
        pub, sub, topic = state["pair"]
        sent = [f"m{i:02d}".encode() for i in range(20)]
        for p in sent:
            pub.publish(topic, p, qos=1)
        assert [m.payload for m in sub.wait_messages(20, timeout=10)] == sent
        assert pub.is_connected() and sub.is_connected()
    finally:
        for c in clients:
            c.close()
