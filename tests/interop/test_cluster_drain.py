"""Drain and rebalance (crates/braid-cluster: balance.rs, drain.rs, rebalance.rs; docs/cluster.md,
"Drain and rebalance"): moving a cluster's clients between nodes, seen by independent clients.

1. Drain: a node holding DRAIN_CLIENTS persistent v5 clients (and a 3.1.1 one) is drained through
   another node's admin API. Every v5 client gets DISCONNECT 0x9C (Use another server) with a
   Server Reference naming a live node that is not draining, reconnects there with clean start 0
   and gets its session back (session present); a tenth of them wait offline while QoS 1
   messages are published to them, and get every one after reconnecting. The 3.1.1 client is
   closed. The drained node ends with no connection, state "drained", refuses new CONNECTs
   (v5: CONNACK 0x9C with a Server Reference; 3.1.1: CONNACK 3) and accepts them again once the
   drain is cancelled; its metrics and `$SYS/cluster/drain` say so.
2. Rebalance: REBALANCE_CLIENTS clients all on n1 of three nodes; a rebalance sends n1's excess
   away with Server References (n1 alone: no client moves twice); the clients that follow them
   are served there, the nodes end within 15% of each other, and the rebalance ends by itself.
3. The API's errors: an unknown node is a 404 naming it, a bad rate a 400 naming the field, a
   drain that would leave no node to take the clients a 409; and `braid ctl drain` / `--cancel`.

Clients are raw sockets on asyncio (one thread for all of them), so a thousand fit a 2-core
machine within the suite's 60 s per test.
"""
import asyncio
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import helpers
import raw_v5
from conftest import BRAID_BIN
from helpers import unique, wait_until
from raw_v5 import CONNACK, DISCONNECT, PUBACK, PUBLISH, SESSION_EXPIRY_INTERVAL, SUBACK

pytestmark = pytest.mark.braid_only

USE_ANOTHER_SERVER = 0x9C
SERVER_REFERENCE = 0x1C
DRAIN_CLIENTS = int(os.environ.get("BRAID_TEST_DRAIN_CLIENTS", "1000"))
REBALANCE_CLIENTS = 300
TIMEOUT = 20.0


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------

def api(node, method, path, body=None):
    """(status, JSON body) of one admin API request to ``node``."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(node.admin_url() + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def nodes_of(node):
    """``node``'s /api/v1/nodes entries, by name."""
    status, body = api(node, "GET", "/api/v1/nodes")
    assert status == 200, body
    return {n["name"]: n for n in body["data"]}


class Conn:
    """One raw MQTT connection on asyncio: bytes out, parsed raw_v5.Packet objects in."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port):
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, data):
        self.writer.write(data)

    async def recv(self, timeout=TIMEOUT):
        """The next packet, or None once the broker closed the connection."""
        async def read():
            try:
                first = (await self.reader.readexactly(1))[0]
                length, shift = 0, 0
                while True:
                    b = (await self.reader.readexactly(1))[0]
                    length |= (b & 0x7F) << shift
                    shift += 7
                    if not b & 0x80:
                        break
                body = await self.reader.readexactly(length)
            except (asyncio.IncompleteReadError, ConnectionError):
                return None
            return raw_v5.Packet(first >> 4, first & 0x0F, body)
        return await asyncio.wait_for(read(), timeout)

    async def expect(self, ptype, timeout=TIMEOUT):
        p = await self.recv(timeout)
        assert p is not None and p.type == ptype, f"expected packet type {ptype}, got {p!r}"
        return p

    def close(self):
        self.writer.close()


async def connect5(port, cid, clean=True, expiry=300):
    """A v5 connection of ``cid`` to ``port`` and its CONNACK."""
    c = await Conn.open(port)
    props = [(SESSION_EXPIRY_INTERVAL, expiry)] if expiry else []
    c.send(raw_v5.connect(cid, clean_start=clean, props=props))
    return c, await c.expect(CONNACK)


def port_of(reference):
    """The port of a Server Reference (host:port), checking that it is on loopback."""
    host, port = reference.rsplit(":", 1)
    assert host == "127.0.0.1", f"Server Reference {reference!r}"
    return int(port)


async def gather_limited(coros, limit=100):
    """Runs ``coros`` at most ``limit`` at a time; their results, in order."""
    gate = asyncio.Semaphore(limit)

    async def run(c):
        async with gate:
            return await c
    return await asyncio.gather(*(run(c) for c in coros))


# --------------------------------------------------------------------------------------------------
# 1. Drain
# --------------------------------------------------------------------------------------------------

class Roamer:
    """A persistent v5 client subscribed to its own topic at QoS 1, which follows the Server
    Reference of the DISCONNECT 0x9C a drain sends it (``delayed``: only once ``released``)."""

    def __init__(self, prefix, i, delayed):
        self.cid = f"{prefix}-{i}"
        self.topic = f"{prefix}/t/{i}"
        self.delayed = delayed
        self.reference = None
        self.present = None
        self.got = []

    async def start(self, port):
        self.conn, ack = await connect5(port, self.cid)
        assert ack.reason == 0, f"{self.cid}: CONNACK {ack!r}"
        self.conn.send(raw_v5.subscribe(1, [(self.topic, 1)]))
        assert (await self.conn.expect(SUBACK)).reasons == [1]

    async def follow(self, released, done):
        """Waits for the drain's DISCONNECT, reconnects by its Server Reference and collects
        what it is sent until ``done``."""
        p = await self.conn.recv(60)
        assert p is not None and p.type == DISCONNECT, f"{self.cid}: {p!r} instead of DISCONNECT"
        assert p.reason == USE_ANOTHER_SERVER, f"{self.cid}: DISCONNECT {p!r}"
        self.reference = p.prop(SERVER_REFERENCE)
        assert self.reference, f"{self.cid}: DISCONNECT 0x9C without a Server Reference: {p!r}"
        assert await self.conn.recv(5) is None, f"{self.cid}: not closed after DISCONNECT"
        self.conn.close()
        if self.delayed:
            await released.wait()
        self.conn, ack = await connect5(port_of(self.reference), self.cid, clean=False)
        assert ack.reason == 0, f"{self.cid}: CONNACK {ack!r} at {self.reference}"
        self.present = ack.session_present
        while not done.is_set():
            try:
                p = await self.conn.recv(0.2)
            except asyncio.TimeoutError:
                continue
            assert p is not None, f"{self.cid}: closed at {self.reference}"
            if p.type == PUBLISH:
                self.got.append(p.payload)
                if p.qos == 1:
                    self.conn.send(raw_v5.ack(PUBACK, p.pid))
        self.conn.close()


def test_drain_moves_every_client_to_a_live_node_with_its_session_and_queued_messages(braid_cluster):
    n1, n2, n3 = braid_cluster(3)
    others = {n2.port: n2, n3.port: n3}
    prefix = unique("drain")
    roamers = [Roamer(prefix, i, delayed=i % 10 == 0) for i in range(DRAIN_CLIENTS)]
    queued = {r.cid: [f"{r.cid} m{k}".encode() for k in range(3)] for r in roamers if r.delayed}
    pub = helpers.connect_client(n3, client_id=unique("drain-pub"), protocol=helpers.MQTTv5)

    async def scenario():
        t0 = time.monotonic()
        await gather_limited([r.start(n1.port) for r in roamers])
        old = await Conn.open(n1.port)
        old.send(helpers.connect_packet(unique("drain-311"), clean=False, level=4))
        assert (await old.expect(CONNACK)).body[1] == 0
        connected = time.monotonic()
        wait_until(lambda: nodes_of(n1)["n1"]["connections"] == DRAIN_CLIENTS + 1, 5,
                   message="n1 counts its connections")

        asked = time.monotonic()
        status, body = api(n2, "POST", "/api/v1/nodes/n1/drain", {"rate": 500})
        assert status == 202, body
        assert body == {"node": "n1", "draining": True, "rate": 500}
        released, done = asyncio.Event(), asyncio.Event()
        following = [asyncio.ensure_future(r.follow(released, done)) for r in roamers]
        assert await old.recv(30) is None, "the 3.1.1 client is closed, without DISCONNECT"
        old.close()
        moved = [r for r in roamers if not r.delayed]
        deadline = time.monotonic() + 40
        while any(r.present is None for r in moved) or any(r.reference is None for r in roamers):
            failed = [f for f in following if f.done() and f.exception()]
            if failed:
                raise failed[0].exception()
            assert time.monotonic() < deadline, \
                f"{sum(r.reference is None for r in roamers)} clients not sent away, " \
                f"{sum(r.present is None for r in moved)} not reconnected after 40 s"
            await asyncio.sleep(0.1)
        drained = time.monotonic()

        # Every v5 client was sent to a live node that does not drain.
        assert {port_of(r.reference) for r in roamers} <= set(others), \
            {r.reference for r in roamers} - {f"127.0.0.1:{p}" for p in others}
        assert not [r.cid for r in moved if not r.present], "session present after the move"
        # The drained node: no connection, refusing new ones, its state drained.
        wait_until(lambda: nodes_of(n1)["n1"]["state"] == "drained", 5, message="n1 drained")
        entry = nodes_of(n1)["n1"]
        assert entry["connections"] == 0 and entry["draining"] is True, entry
        assert entry["drain"]["moved"] == DRAIN_CLIENTS + 1, entry
        wait_until(lambda: nodes_of(n2)["n1"]["state"] == "drained", 5, message="n2 sees n1 drained")
        c, ack = await connect5(n1.port, unique("late"))
        assert ack.reason == USE_ANOTHER_SERVER, ack
        assert port_of(ack.prop(SERVER_REFERENCE)) in others, ack
        c.close()
        c = await Conn.open(n1.port)
        c.send(helpers.connect_packet(unique("late-311"), level=4))
        assert (await c.expect(CONNACK)).body[1] == 3, "3.1.1: CONNACK 3 (server unavailable)"
        c.close()
        assert n1.admin_get("/api/v1/retained/$SYS/cluster/drain")["payload"] == "drained"
        metrics = n1.admin_get("/metrics")
        assert "braid_cluster_draining 1" in metrics
        assert f"braid_cluster_drained_connections_total {DRAIN_CLIENTS + 1}" in metrics

        # Queued for the delayed ones while they are offline, then delivered where they went.
        delayed = [r for r in roamers if r.delayed]

        def publish_queued():
            for r in delayed:
                for payload in queued[r.cid]:
                    pub.publish(r.topic, payload, qos=1)
        await asyncio.to_thread(publish_queued)
        released.set()
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and any(len(r.got) < 3 for r in delayed):
            await asyncio.sleep(0.1)
        done.set()
        await asyncio.gather(*following)
        lost = {r.cid: (queued[r.cid], r.got) for r in delayed if sorted(r.got) != queued[r.cid]}
        assert not lost, f"{len(lost)} of {len(delayed)} did not get their queued messages: " \
                         f"{list(lost.items())[:3]}"
        assert all(r.present for r in delayed), "session present after the move"
        assert not [r.cid for r in moved if r.got], "nothing was queued for the others"
        print(f"{DRAIN_CLIENTS} clients: connected in {connected - t0:.1f}s, "
              f"all sent away and reconnected {drained - asked:.1f}s after the drain request")

        # Cancelled: n1 accepts connections again.
        status, body = api(n3, "DELETE", "/api/v1/nodes/n1/drain")
        assert (status, body) == (200, {"node": "n1", "draining": False, "was_draining": True})
        wait_until(lambda: nodes_of(n1)["n1"]["state"] == "up", 5, message="n1 serves again")
        c, ack = await connect5(n1.port, unique("again"))
        assert ack.reason == 0, ack
        c.close()
        assert n1.admin_get("/api/v1/retained/$SYS/cluster/drain")["payload"] == "up"

    try:
        asyncio.run(scenario())
    finally:
        pub.close()


# --------------------------------------------------------------------------------------------------
# 2. Rebalance
# --------------------------------------------------------------------------------------------------

def test_rebalance_evens_out_connections_after_nodes_join(braid_cluster):
    cluster = braid_cluster(3)
    n1, n2, n3 = cluster
    ports = {n.port: n.node for n in (n1, n2, n3)}
    prefix = unique("rebalance")
    where, moves = {}, []

    async def client(i, started, done):
        """Connects to n1; whenever sent away (DISCONNECT 0x9C), reconnects by the Server
        Reference and checks it is served there (PINGREQ answered)."""
        cid = f"{prefix}-{i}"
        c, ack = await connect5(n1.port, cid, expiry=0)
        assert ack.reason == 0, ack
        where[cid] = n1.port
        started.append(cid)
        while not done.is_set():
            try:
                p = await c.recv(0.2)
            except asyncio.TimeoutError:
                continue
            assert p is not None, f"{cid}: closed without DISCONNECT"
            if p.type == raw_v5.PINGRESP:
                continue
            assert p.type == DISCONNECT and p.reason == USE_ANOTHER_SERVER, f"{cid}: {p!r}"
            reference = p.prop(SERVER_REFERENCE)
            port = port_of(reference)
            assert port in ports and port != where[cid], f"{cid}: sent from {where[cid]} to {reference}"
            c.close()
            c, ack = await connect5(port, cid, expiry=0)
            assert ack.reason == 0, f"{cid}: not served at {reference}: {ack!r}"
            c.send(raw_v5.packet(raw_v5.PINGREQ, 0, b""))
            where[cid] = port
            moves.append(cid)
        c.close()

    async def scenario():
        started, done = [], asyncio.Event()
        clients = [asyncio.ensure_future(client(i, started, done)) for i in range(REBALANCE_CLIENTS)]
        while len(started) < REBALANCE_CLIENTS:
            failed = [f for f in clients if f.done() and f.exception()]
            if failed:
                raise failed[0].exception()
            await asyncio.sleep(0.05)
        wait_until(lambda: nodes_of(n3)["n1"]["connections"] == REBALANCE_CLIENTS, 5,
                   message="n3 sees n1's connections")

        begun = time.monotonic()
        status, body = api(n3, "POST", "/api/v1/cluster/rebalance", {})
        assert status == 202, body
        assert body["connections"] == {"n1": REBALANCE_CLIENTS, "n2": 0, "n3": 0}, body
        assert not body["balanced"] and body["senders"] == ["n1"], body
        assert body["rate"] == 100 and body["timeout_secs"] == 300, body

        def counts():
            return [list(where.values()).count(p) for p in ports]
        while max(counts()) > 1.15 * min(counts()) and time.monotonic() < begun + 30:
            failed = [f for f in clients if f.done() and f.exception()]
            if failed:
                raise failed[0].exception()
            await asyncio.sleep(0.1)
        took = time.monotonic() - begun
        assert max(counts()) <= 1.15 * min(counts()), f"clients per node after 30 s: {counts()}"
        print(f"{REBALANCE_CLIENTS} clients: balanced {counts()} in {took:.1f}s, {len(moves)} moves")
        assert len(moves) == len(set(moves)), "a client was moved twice: only n1 sends"

        # The nodes see it too, and the rebalance ended by itself.
        def even():
            seen = [n["connections"] for n in nodes_of(n2).values()]
            return max(seen) <= 1.15 * min(seen)
        wait_until(even, 5, message="the nodes' counts within 15%")
        wait_until(lambda: cluster.redis.cli("EXISTS", "braid:rebalance") == "0", 10,
                   message="the rebalance ended")
        await asyncio.sleep(2)
        assert max(counts()) <= 1.15 * min(counts()), f"moved on after the end: {counts()}"
        done.set()
        await asyncio.gather(*clients)

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------------
# 3. The API's errors, and braid ctl
# --------------------------------------------------------------------------------------------------

def test_drain_and_rebalance_requests_that_cannot_be_served_say_why(braid_cluster):
    n1, n2 = braid_cluster(2)
    status, body = api(n2, "POST", "/api/v1/nodes/nosuch/drain")
    assert status == 404 and '"nosuch"' in body["error"], body
    status, body = api(n2, "DELETE", "/api/v1/nodes/nosuch/drain")
    assert status == 404 and '"nosuch"' in body["error"], body
    for bad in ({"rate": 0}, {"rate": "fast"}, {"rate": -5}, {"rate": 1.5}):
        status, body = api(n2, "POST", "/api/v1/nodes/n1/drain", bad)
        assert status == 400 and body["error"].startswith("rate:"), (bad, body)
    status, body = api(n2, "POST", "/api/v1/nodes/n1/drain", {"speed": 5})
    assert status == 400 and '"speed"' in body["error"], body
    status, body = api(n2, "POST", "/api/v1/cluster/rebalance", {"timeout_secs": 0})
    assert status == 400 and body["error"].startswith("timeout_secs:"), body

    url = ["--url", n1.admin_url()]
    ctl = subprocess.run([BRAID_BIN, "ctl", *url, "drain", "nosuch"], capture_output=True, text=True,
                         timeout=10)
    assert ctl.returncode == 1 and "404" in ctl.stderr and '"nosuch"' in ctl.stderr, ctl
    ctl = subprocess.run([BRAID_BIN, "ctl", *url, "drain", "n2", "--rate", "50"], capture_output=True,
                         text=True, timeout=10)
    assert ctl.returncode == 0 and "draining: true" in ctl.stdout and "rate: 50" in ctl.stdout, ctl
    # The last node that does not drain cannot be drained too: nobody could take its clients.
    status, body = api(n1, "POST", "/api/v1/nodes/n1/drain")
    assert status == 409, body
    status, body = api(n2, "POST", "/api/v1/cluster/rebalance")
    assert status == 409, body
    wait_until(lambda: nodes_of(n1).get("n2", {}).get("draining"), 5, message="n1 sees n2 draining")
    ctl = subprocess.run([BRAID_BIN, "ctl", *url, "drain", "n2", "--cancel"], capture_output=True, text=True,
                         timeout=10)
    assert ctl.returncode == 0 and "was_draining: true" in ctl.stdout, ctl
    wait_until(lambda: not nodes_of(n1)["n2"]["draining"], 5, message="n2's drain cancelled")
