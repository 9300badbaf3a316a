"""Helpers shared by the cluster tests."""
import time

# A QoS 0 message tests send until a subscription is seen to work across nodes; they drop it.
PROBE = b"probe"


def wait_routed(pub, sub, topic, timeout=5.0):
    """Publishes QoS 0 probes on ``topic`` through ``pub`` (on another node) until ``sub``
    receives one: its subscription has reached the publisher's node. Then drops the probes."""
    deadline = time.monotonic() + timeout
    while True:
        pub.publish(topic, PROBE, qos=0)
        try:
            if sub.get_message(timeout=0.1).payload == PROBE:
                break
        except AssertionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"a subscription to {topic!r} did not reach the publisher's node "
                                 f"within {timeout}s")
    time.sleep(0.2)
    sub.drain()
