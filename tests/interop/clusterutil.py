"""Helpers shared by the cluster tests."""
import threading
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


def in_threads(*calls):
    """Runs the callables at once; returns their results (re-raising the first failure)."""
    results, errors = [None] * len(calls), []

    def run(i, f):
        try:
            results[i] = f()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results
