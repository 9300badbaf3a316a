"""$SYS topics (the fixtures set the $SYS interval to 1 s)."""
import re
import time

import pytest

from helpers import unique

NUMBER = re.compile(rb"^\d+$")
UPTIME = re.compile(rb"^(\d+)( seconds)?$")


def latest_sys_values(client, wanted, timeout=4.0):
    """Collect $SYS messages until every topic in ``wanted`` has a value; returns {topic: payload}."""
    values = {}
    deadline = time.monotonic() + timeout
    while not wanted <= values.keys():
        left = deadline - time.monotonic()
        assert left > 0, f"missing $SYS topics: {sorted(wanted - values.keys())}"
        m = client.get_message(left)
        values[m.topic] = m.payload
    return values


def test_sys_basic_topics_arrive(broker, connect):
    sub = connect(broker)
    sub.subscribe("$SYS/#", 0)
    wanted = {"$SYS/broker/version", "$SYS/broker/uptime", "$SYS/broker/clients/connected"}
    v = latest_sys_values(sub, wanted)
    assert v["$SYS/broker/version"].strip(), "empty version"
    assert UPTIME.match(v["$SYS/broker/uptime"]), v["$SYS/broker/uptime"]
    assert NUMBER.match(v["$SYS/broker/clients/connected"]), v["$SYS/broker/clients/connected"]


def test_sys_values_are_retained_for_new_subscribers(broker, connect):
    first = connect(broker)
    first.subscribe("$SYS/broker/version", 0)
    first.wait_messages(1, timeout=3)  # published at least once by now
    late = connect(broker)
    late.subscribe("$SYS/broker/version", 0)
    [m] = late.wait_messages(1, timeout=1.5)
    assert m.retain is True


def test_sys_clients_connected_counts_clients(broker, connect):
    others = [connect(broker) for _ in range(3)]
    sub = connect(broker)
    sub.subscribe("$SYS/broker/clients/connected", 0)
    deadline = time.monotonic() + 4
    seen = []
    while True:
        m = sub.get_message(max(deadline - time.monotonic(), 0.01))
        seen.append(int(m.payload))
        if seen[-1] >= len(others) + 1:
            break
        assert time.monotonic() < deadline, seen
    for c in others:
        c.disconnect()
    # the count goes down again once they left
    deadline = time.monotonic() + 4
    while True:
        m = sub.get_message(max(deadline - time.monotonic(), 0.01))
        seen.append(int(m.payload))
        if seen[-1] <= 1:
            break
        assert time.monotonic() < deadline, seen


def test_sys_uptime_advances(broker, connect):
    sub = connect(broker)
    sub.subscribe("$SYS/broker/uptime", 0)
    first = int(UPTIME.match(sub.wait_messages(1, timeout=3)[0].payload).group(1))
    deadline = time.monotonic() + 4
    while True:
        m = sub.get_message(max(deadline - time.monotonic(), 0.01))
        now = int(UPTIME.match(m.payload).group(1))
        if now > first:
            break
        assert time.monotonic() < deadline


@pytest.mark.braid_only  # Mosquitto has no memory/rss (its heap figures are $SYS/broker/heap/...)
def test_sys_memory_rss_is_the_resident_set_size(broker, connect):
    """Published without a memory watermark configured (the fixture sets none)."""
    sub = connect(broker)
    sub.subscribe("$SYS/broker/memory/rss", 0)
    [m] = sub.wait_messages(1, timeout=3)
    assert NUMBER.match(m.payload), m.payload
    assert 1 << 20 < int(m.payload) < 10 << 30, f"{int(m.payload)} bytes"


def test_clients_cannot_publish_to_sys(broker, connect):
    """A client's PUBLISH to $SYS/... is not delivered as if it came from the broker: the broker
    drops it or disconnects the publisher (MQTT 4.7.2: the server SHOULD prevent such use)."""
    topic = "$SYS/broker/" + unique("fake")
    sub = connect(broker)
    sub.subscribe(topic, 0)
    pub = connect(broker)
    try:
        pub.publish(topic, b"spoofed", qos=1, timeout=2)
    except AssertionError:
        pass  # disconnected instead of acknowledged: also fine
    sub.expect_no_message(0.7)
