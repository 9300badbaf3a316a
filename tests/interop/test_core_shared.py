"""Shared subscriptions ($share/{group}/{filter}), usable by MQTT 3.1.1 clients too."""
import socket
import struct
import time

import pytest

from helpers import MQTTv311, MQTTv5, proto_id, unique, wait_total, wait_until
from raw_v5 import PUBCOMP, PUBLISH, PUBREC, PUBREL, RECEIVE_MAXIMUM, SESSION_EXPIRY_INTERVAL
from raw_v5 import ack as raw_ack
from v5util import connect_props, raw5  # noqa: F401  (fixture)


def publish_n(pub, topic, n, start=0, qos=1):
    """Publish m{start}..m{start+n-1}; returns the sorted list of payloads sent."""
    for i in range(start, start + n):
        pub.publish(topic, f"m{i}".encode(), qos=qos)
    return sorted(f"m{i}".encode() for i in range(start, start + n))


def shared_members(broker, connect, filt, n=2, protocol=MQTTv311, group="g"):
    members = [connect(broker, protocol=protocol) for _ in range(n)]
    for m in members:
        assert m.subscribe(f"$share/{group}/{filt}", 1) == [1]
    return members


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_shared_subscription_splits_messages_between_members(broker, connect, protocol):
    topic = unique("jobs") + "/work"
    members = shared_members(broker, connect, topic, protocol=protocol)
    sent = publish_n(connect(broker, protocol=protocol), topic, 10)
    got = wait_total(members, 10)
    assert sorted(m.payload for m in got) == sent, "each message exactly once in total"
    counts = [len(m.received) for m in members]
    assert all(c > 0 for c in counts), f"not split across members: {counts}"


def test_shared_subscription_member_leaving_remaining_member_gets_everything(broker, connect):
    topic = unique("jobs")
    a, b = shared_members(broker, connect, topic)
    pub = connect(broker)
    publish_n(pub, topic, 4)
    wait_total([a, b], 4, settle=0)
    b.disconnect()
    a.drain()
    sent = publish_n(pub, topic, 10, start=100)
    assert sorted(m.payload for m in a.wait_messages(10)) == sent
    a.expect_no_message(0.3)


def test_shared_subscription_member_killed_remaining_member_gets_everything(broker, connect):
    topic = unique("jobs")
    gone = unique("gone")
    watcher = connect(broker)
    watcher.subscribe(gone, 1)
    a = connect(broker)
    b = connect(broker, will={"topic": gone, "payload": b"b died", "qos": 1})
    for m in (a, b):
        m.subscribe(f"$share/g/{topic}", 1)
    b.kill()
    watcher.wait_messages(1)  # the will proves the broker has noticed b is gone
    pub = connect(broker)
    sent = publish_n(pub, topic, 10)
    assert sorted(m.payload for m in a.wait_messages(10)) == sent


def test_shared_and_normal_subscriptions_both_receive(broker, connect):
    """A normal subscription still gets every message; each group gets one copy of each."""
    topic = unique("fan")
    normal = connect(broker)
    normal.subscribe(topic, 1)
    groups = {g: shared_members(broker, connect, topic, group=g) for g in ("g1", "g2")}
    sent = publish_n(connect(broker), topic, 6)
    assert sorted(m.payload for m in normal.wait_messages(6)) == sent
    for g, members in groups.items():
        assert sorted(m.payload for m in wait_total(members, 6)) == sent, g


def test_shared_subscription_with_wildcard_filter(broker, connect):
    base = unique("sw")
    members = shared_members(broker, connect, f"{base}/+/temp")
    pub = connect(broker)
    for room in ("kitchen", "hall", "attic", "cellar"):
        pub.publish(f"{base}/{room}/temp", room.encode(), qos=1)
    pub.publish(f"{base}/kitchen/humidity", b"no", qos=1)
    got = wait_total(members, 4)
    assert sorted(m.payload for m in got) == [b"attic", b"cellar", b"hall", b"kitchen"]


def test_unsubscribe_from_shared_subscription(broker, connect):
    topic = unique("jobs")
    a, b = shared_members(broker, connect, topic)
    b.unsubscribe(f"$share/g/{topic}")
    sent = publish_n(connect(broker), topic, 5)
    assert sorted(m.payload for m in a.wait_messages(5)) == sent
    b.expect_no_message(0.3)


def test_mosquitto_sub_can_join_a_shared_group(broker, connect, mosquitto_sub):
    topic = unique("jobs")
    paho_member = shared_members(broker, connect, topic, n=1)[0]
    cli_member = mosquitto_sub(broker, f"$share/g/{topic}", qos=1)
    sent = publish_n(connect(broker), topic, 10)
    got = wait_total([paho_member, cli_member], 10)
    assert sorted(m.payload for m in got) == sent
    assert paho_member.received and cli_member.received


@pytest.mark.braid_only
def test_legacy_queue_prefix_shares_messages(broker, connect):
    """`$queue/{filter}` is Braid's legacy alias of one shared group (Mosquitto lacks it)."""
    topic = unique("q")
    a = connect(broker)
    b = connect(broker)
    a.subscribe(f"$queue/{topic}", 1)
    b.subscribe(f"$queue/{topic}", 1)
    sent = publish_n(connect(broker), topic, 10)
    assert sorted(m.payload for m in wait_total([a, b], 10)) == sent


# --------------------------------------------------------------------------------------------------
# A member that goes offline holding messages: what it had not acknowledged goes to another member
# --------------------------------------------------------------------------------------------------
# Member A holds its acknowledgements (manual ack) with at most WINDOW messages in flight (its v5
# Receive Maximum; for 3.1.1 the broker's mqtt.max_inflight), so of its share of the messages
# WINDOW are sent to it unacknowledged and the rest wait in its queue. It acknowledges the first
# one and holds the others; then its connection ends. Braid then gives another member of the
# group that is online what A had not acknowledged: its queued messages and its QoS 1 ones in
# flight (QoS 2 ones in flight stay with A). Mosquitto keeps them for A (or drops them).

WINDOW = 2
PERSISTENT_S = 300


def _member(connect, broker, protocol, client_id=None, persistent=False, fresh=True, manual_ack=False, **kw):
    """A member connection: v5 with Receive Maximum WINDOW (Session Expiry 300 s if
    ``persistent``, clean start ``fresh``), or 3.1.1 with clean session ``not persistent``."""
    if protocol == MQTTv5:
        props = connect_props(ReceiveMaximum=WINDOW, SessionExpiryInterval=PERSISTENT_S if persistent else 0)
        return connect(broker, client_id=client_id, protocol=MQTTv5, clean_start=fresh, properties=props,
                       manual_ack=manual_ack, **kw)
    return connect(broker, client_id=client_id, protocol=MQTTv311, clean_session=not persistent,
                   manual_ack=manual_ack, **kw)


def _window_broker(make_broker):
    """A broker that sends at most WINDOW messages in flight to each client (what limits a 3.1.1
    member's; a v5 member announces it as its Receive Maximum too)."""
    return make_broker(braid={"mqtt.max_inflight": WINDOW}, mosquitto=[f"max_inflight_messages {WINDOW}"])


def payloads(client, topic):
    """Payloads ``client`` received on ``topic``, in order (other topics, e.g. probes, left out)."""
    return [m.payload for m in client.received if m.topic == topic]


def settle(*clients, quiet=0.3, timeout=3.0):
    """Waits until none of ``clients`` has received anything for ``quiet`` s (at most ``timeout``)."""
    deadline = time.monotonic() + timeout
    counts, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = [len(c.received) for c in clients]
        if now != counts:
            counts, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.02)


def hold(a, topic, window=WINDOW, timeout=5.0):
    """Member ``a`` (manual_ack) gets ``window`` messages on ``topic``, acknowledges the first one
    and waits for the next (sent once its PUBACK freed the window: the broker has it); then it
    holds ``window`` unacknowledged. Returns the acknowledged payloads."""
    wait_until(lambda: len(payloads(a, topic)) >= window, timeout=timeout,
               message=f"{window} messages in flight to the member holding its acknowledgements")
    first = next(m for m in a.received if m.topic == topic)
    a.ack(first)
    wait_until(lambda: len(payloads(a, topic)) >= window + 1, timeout=timeout,
               message="the next message once the member acknowledged one")
    return [first.payload]


def check_handed_over(topic, sent, a, acked, b, b_before, timeout=3.0):
    """Member ``a`` has gone offline having received what ``a.received`` holds on ``topic`` and
    acknowledged ``acked``; ``b`` (online, same group) had received ``b_before`` of them then.
    Waits up to ``timeout`` s for ``b`` to get every message A had not acknowledged, then
    asserts: no message of ``sent`` is missing from A-acked ∪ B; none A acknowledged reached B;
    each one queued for A and never sent reached B exactly once. A's in-flight ones that B also
    got (QoS 1 duplicates across members, allowed) are counted in the report (printed, returned)."""
    a_got = payloads(a, topic)
    in_flight = [p for p in a_got if p not in acked]
    b_early = set(payloads(b, topic)[:b_before])
    queued = [p for p in sent if p not in a_got and p not in b_early]
    wanted = set(sent) - set(acked)
    try:
        wait_until(lambda: wanted <= set(payloads(b, topic)), timeout=timeout,
                   message="every message A had not acknowledged at B")
    except AssertionError:
        pass  # reported below
    time.sleep(0.3)  # stragglers (duplicates)
    b_all = payloads(b, topic)
    b_late = b_all[b_before:]
    lost = sorted(wanted - set(b_all))
    again = sorted(set(acked) & set(b_all))
    twice = sorted({p for p in queued if b_all.count(p) > 1})
    report = (f"{len(sent)} published to the group. A received {len(a_got)}, acknowledged "
              f"{acked}, held {len(in_flight)} in flight unacknowledged {in_flight}; "
              f"{len(queued)} were queued for A, never sent {queued}. B received {b_before} before "
              f"A went offline, {len(b_late)} after: {b_late}. "
              f"MISSING from A-acked + B: {len(lost)} {lost} (in flight to A: "
              f"{[p for p in lost if p in in_flight]}, queued for A: {[p for p in lost if p in queued]}). "
              f"A's in-flight ones B got too (QoS 1 duplicates across members): "
              f"{len([p for p in in_flight if p in b_all])}; acknowledged by A yet sent to B: {again}; "
              f"queued ones B got more than once: {twice}")
    print(report)
    assert in_flight and queued, "arrangement: A should have held messages in flight and queued: " + report
    assert not lost, report
    assert not again, report
    assert not twice, report
    return report


def _go(a, how):
    if how == "kill":
        a.kill()              # the socket just dies (no DISCONNECT)
    else:
        a.disconnect()        # DISCONNECT


def _gone_holding(connect, broker, protocol, how, client_id, persistent):
    """Members A (manual ack; ``client_id``, ``persistent``) and B share 10 QoS 1 messages; A
    holds its share unacknowledged and goes (``how``); checks that B gets what A had not
    acknowledged (see ``check_handed_over``) and returns the report."""
    topic = unique("jobs")
    a = _member(connect, broker, protocol, client_id=client_id, persistent=persistent, manual_ack=True)
    b = _member(connect, broker, protocol)
    for m in (a, b):
        assert m.subscribe(f"$share/g/{topic}", 1) == [1]
    sent = publish_n(connect(broker, protocol=protocol), topic, 10)
    acked = hold(a, topic)
    settle(a, b)
    b_before = len(payloads(b, topic))
    _go(a, how)
    return check_handed_over(topic, sent, a, acked, b, b_before)


@pytest.mark.braid_only
@pytest.mark.parametrize("how", ["kill", "disconnect"])
@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_shared_clean_member_gone_its_unacked_messages_go_to_another_member(
        make_broker, connect, protocol, how):
    """A clean session leaves (its session ends) holding QoS 1 messages in flight and queued:
    the online member B gets all of them, nothing lost, nothing A acknowledged again."""
    broker = _window_broker(make_broker)
    _gone_holding(connect, broker, protocol, how, client_id=None, persistent=False)


@pytest.mark.braid_only
@pytest.mark.parametrize("how", ["kill", "disconnect"])
@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_shared_persistent_member_gone_its_unacked_messages_go_to_another_member(
        make_broker, connect, protocol, how):
    """As above with A's session kept (v5 Session Expiry 300 s / 3.1.1 clean session 0): B gets
    what A had not acknowledged; A, back with its session, does not get those again."""
    broker = _window_broker(make_broker)
    cid = unique("held")
    report = _gone_holding(connect, broker, protocol, how, client_id=cid, persistent=True)

    back = _member(connect, broker, protocol, client_id=cid, persistent=True, fresh=False)
    assert back.connack.session_present is True, back.connack
    again = [(m.payload, m.dup) for m in back.collect(0.5)]
    assert not again, f"A got again, back with its session, what B had received: {again}. " + report


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=proto_id)
def test_shared_persistent_only_member_killed_keeps_its_unacked_messages(make_broker, connect, protocol):
    """No other member to give them to: A's unacknowledged messages stay with its session and
    reach it when it comes back, the ones that were in flight with DUP, the queued ones after;
    nothing it had acknowledged again, nothing lost."""
    broker = _window_broker(make_broker)
    topic, gone = unique("jobs"), unique("gone")
    cid = unique("held")
    watcher = connect(broker)
    watcher.subscribe(gone, 1)
    a = _member(connect, broker, protocol, client_id=cid, persistent=True, manual_ack=True,
                will={"topic": gone, "payload": b"a died", "qos": 1})
    assert a.subscribe(f"$share/g/{topic}", 1) == [1]
    sent = publish_n(connect(broker, protocol=protocol), topic, 5)
    acked = hold(a, topic)
    settle(a)
    a_got = payloads(a, topic)
    in_flight = [p for p in a_got if p not in acked]
    queued = [p for p in sent if p not in a_got]
    assert in_flight and queued, f"arrangement: A got {a_got} of {sent}"
    a.kill()
    watcher.wait_messages(1)  # the will: the broker has seen A go

    back = _member(connect, broker, protocol, client_id=cid, persistent=True, fresh=False)
    assert back.connack.session_present is True, back.connack
    got = back.wait_messages(len(in_flight) + len(queued), timeout=3) + back.collect(0.3)
    seen = [(m.payload, m.dup) for m in got]
    report = (f"A acknowledged {acked}, held {in_flight} in flight, {queued} queued; back with its "
              f"session it got (payload, dup): {seen}")
    print(report)
    assert seen == [(p, True) for p in in_flight] + [(p, False) for p in queued], report


@pytest.mark.braid_only
def test_shared_qos2_in_flight_stay_with_killed_member_queued_go_to_another(broker, connect, raw5):
    """QoS 2: A (persistent, Receive Maximum WINDOW, a raw v5 client that sends no PUBREC) holds
    WINDOW messages it was sent, after completing one; killed. B gets the ones queued for A and
    never sent, not the ones sent to A: A gets those again (DUP) when it comes back."""
    topic = unique("jobs2")
    cid = unique("held2")
    props = [(SESSION_EXPIRY_INTERVAL, PERSISTENT_S), (RECEIVE_MAXIMUM, WINDOW)]
    a = raw5(broker)
    assert a.connect5(cid, props=props).reason == 0
    assert a.subscribe5([(f"$share/g/{topic}", 2)]).reasons == [2]
    b = connect(broker, protocol=MQTTv5)
    assert b.subscribe(f"$share/g/{topic}", 2) == [2]
    sent = publish_n(connect(broker, protocol=MQTTv5), topic, 10, qos=2)

    got = a.publishes(3, auto_ack=False, n=WINDOW)
    assert len(got) == WINDOW, f"arrangement: A was sent {[p.payload for p in got]}"
    done = got[0]                                    # A completes this one's exchange
    a.send(raw_ack(PUBREC, done.pid))
    while True:
        p = a.recv()
        assert p is not None, "A's connection closed"
        if p.type == PUBREL:
            break
        assert p.type == PUBLISH, p
        got.append(p)
    a.send(raw_ack(PUBCOMP, done.pid))
    got += a.publishes(3, auto_ack=False, n=WINDOW + 1 - len(got))
    assert len(got) == WINDOW + 1, f"arrangement: A was sent {[p.payload for p in got]}"
    held = [p.payload for p in got[1:]]
    a_got = [p.payload for p in got]
    settle(b)
    time.sleep(0.2)                                   # A's PUBCOMP is in
    b_before = set(payloads(b, topic))
    queued = [p for p in sent if p not in a_got and p not in b_before]
    a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    a.close()                                         # killed: RST, no DISCONNECT

    try:
        wait_until(lambda: set(queued) <= set(payloads(b, topic)), timeout=3,
                   message="the messages queued for A at B")
    except AssertionError:
        pass  # reported below
    time.sleep(0.5)
    b_all = payloads(b, topic)
    b_late = b_all[len(b_before):]
    lost = sorted(set(sent) - set(a_got) - set(b_all))
    report = (f"10 QoS 2 published. A completed {[done.payload]}, held (no PUBREC) {held}; "
              f"{len(queued)} queued for A, never sent {queued}. B got {len(b_before)} before A was "
              f"killed, {len(b_late)} after: {b_late}. MISSING from A + B: {lost}; A's held ones at B "
              f"(must stay with A): {sorted(set(held) & set(b_all))}; B got more than once: "
              f"{sorted({p for p in b_all if b_all.count(p) > 1})}")
    print(report)
    assert queued, "arrangement: nothing was queued for A: " + report
    assert not lost, report
    assert not set(held) & set(b_all), report
    assert len(b_all) == len(set(b_all)), report

    back = raw5(broker)
    ack = back.connect5(cid, clean_start=False, props=[(SESSION_EXPIRY_INTERVAL, PERSISTENT_S)])
    assert ack.reason == 0 and ack.session_present, ack
    again = back.publishes(1.0, auto_ack=True)
    seen = [(p.payload, p.dup) for p in again]
    assert seen == [(p, True) for p in held], \
        f"A, back, got (payload, dup) {seen}; expected its held ones with DUP {held}. " + report
