"""Free loopback TCP and UDP ports for the brokers and services the tests start.

A port the kernel hands out for `bind(0)` comes from its ephemeral range, the same range it
draws the source ports of outgoing connections from: a port picked that way and bound a moment
later by a broker can meanwhile have become the source port of some client's or node's
connection ("Address already in use"). These ports come from outside that range, so only
another listener can take them, and one process never hands out the same port twice.
"""

import random
import socket

_given = set()


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = f.read().split()
            return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _candidates():
    low, high = _ephemeral_range()
    below = range(10000, low) if low > 10000 else range(0)
    above = range(high + 1, 65536) if high < 65535 else range(0)
    return below if len(below) >= len(above) else above


def free_port(host="127.0.0.1", kind=socket.SOCK_STREAM):
    """A port on `host` (TCP, or UDP with `kind=socket.SOCK_DGRAM`) that nothing is bound to now
    and that this process has not given out."""
    candidates = _candidates()
    for _ in range(1000):
        port = random.choice(candidates) if candidates else 0
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _given.add(port)
        return port
    raise RuntimeError("no free loopback port outside the ephemeral range after 1000 tries")
