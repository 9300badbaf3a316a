"""One client subscribes and, 0.1 ms later, another publishes to that topic: the message arrives.

MQTT orders nothing across connections, but request/response clients and test suites do exactly
this (subscribe, then publish the request on another connection), expecting the broker to serve
bytes in the order they arrived. Both packets usually become readable in one wake-up of the
broker; Braid used to serve the PUBLISH first (its runtime ran the task it woke last first).
"""
import time

from helpers import PUBACK, PUBLISH, decode_publish, mosquitto_target, publish_packet, subscribe_packet, unique

TRIES = 30
GAP = 0.0001  # seconds from the SUBSCRIBE to the PUBLISH


def spin(seconds):
    """Busy-waits (sleep cannot wait 0.1 ms)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def delivered(sub, pub, pid):
    """`sub` subscribes to a fresh topic, `pub` publishes to it (QoS 1) 0.1 ms later; True if
    `sub` gets the message."""
    topic = unique("order")
    sub.send(subscribe_packet(pid, [(topic, 0)]))
    spin(GAP)
    pub.send(publish_packet(topic, b"x", qos=1, packet_id=pid))
    pub.expect_packet(PUBACK)
    # Routed at all, the message was queued for `sub` before the PUBACK went out.
    while True:
        try:
            p = sub.recv_packet(0.5)
        except AssertionError:
            return False
        if p is not None and p.type == PUBLISH and decode_publish(p).topic == topic:
            return True


def pair(broker, raw_client):
    sub, pub = raw_client(broker), raw_client(broker)
    sub.connect(unique("sub"))
    pub.connect(unique("pub"))
    return sub, pub


def test_publish_right_after_another_clients_subscribe_is_delivered(broker, raw_client):
    sub, pub = pair(broker, raw_client)
    missed = []
    for i in range(TRIES):
        time.sleep(0.02)  # both connections idle: the broker waits for bytes
        if not delivered(sub, pub, i + 1):
            missed.append(i)
    assert not missed, f"{len(missed)} of {TRIES} messages published 0.1 ms after the SUBSCRIBE were lost"


def wait_parked(broker, connect, n):
    """Returns once `$SYS` counts `n` parked connections (against Mosquitto: after 2 s)."""
    if mosquitto_target():
        time.sleep(2)
        return
    watcher = connect(broker)
    watcher.subscribe("$SYS/broker/clients/parked")
    deadline = time.monotonic() + 10
    while True:
        [m] = watcher.wait_messages(1, timeout=max(deadline - time.monotonic(), 0.01))
        if int(m.payload) >= n:
            return


def test_publish_right_after_another_clients_subscribe_is_delivered_when_both_were_parked(
        make_broker, raw_client, connect):
    """The same with both connections parked: their bytes wake the parking lot's thread, which
    gives each connection a new task."""
    broker = make_broker(braid={"listeners.park_after_secs": 1})
    pairs = [pair(broker, raw_client) for _ in range(TRIES)]
    wait_parked(broker, connect, 2 * TRIES)
    missed = [i for i, (sub, pub) in enumerate(pairs) if not delivered(sub, pub, 1)]
    assert not missed, f"{len(missed)} of {TRIES} messages published 0.1 ms after the SUBSCRIBE were lost"
