"""More clients than the broker has file descriptors (a lowered `ulimit -n`): the excess is
closed at once instead of waiting for a CONNACK that never comes, the broker says so once (not a
log line every 50 ms), counts it, and takes clients again by itself once descriptors are free."""
import json
import resource
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import BRAID_BIN, free_port, wait_for_port
from helpers import connect_packet

pytestmark = pytest.mark.braid_only

LIMIT = 96


def lowered(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return apply


def open_client(port, i):
    """A raw MQTT 3.1.1 client that sent CONNECT: 'ok' once its CONNACK came, 'closed' if the
    broker closed it, 'waiting' if neither happened within 3 s."""
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    try:
        s.sendall(connect_packet(f"fd-{i}"))
        first = s.recv(4)
    except (socket.timeout, TimeoutError):
        return s, "waiting"
    except OSError:
        return s, "closed"
    return s, ("ok" if first[:1] == b"\x20" else "closed")


def test_clients_beyond_the_descriptor_limit_are_closed_at_once_and_it_recovers(tmp_path):
    port, http = free_port(), free_port()
    log = open(tmp_path / "braid.log", "w+")
    proc = subprocess.Popen(
        [BRAID_BIN, "serve", "--listen", f"127.0.0.1:{port}", "--set", f'store.data_dir="{tmp_path}/data"',
         "--set", f'listeners.http="127.0.0.1:{http}"', "--set", "quic.enabled=false",
         "--set", "listeners.park_after_secs=0"],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=lowered(LIMIT))
    clients = []
    try:
        wait_for_port(port, proc)
        started = time.monotonic()
        for i in range(LIMIT + 40):
            clients.append(open_client(port, i))
        states = [state for _, state in clients]
        assert states.count("ok") > LIMIT // 3, states
        assert states.count("closed") >= 30, states
        assert states.count("waiting") == 0, f"clients left waiting for a CONNACK: {states}"
        assert time.monotonic() - started < 60
        # Descriptors free up: new clients are served again, without a restart.
        for s, state in clients[:20]:
            if state == "ok":
                s.close()
        time.sleep(0.5)
        again = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            again.append(open_client(port, 1000 + len(again)))
            if again[-1][1] == "ok":
                break
        assert again[-1][1] == "ok", [state for _, state in again]
        clients += again
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/api/v1/stats", timeout=10) as r:
            stats = json.loads(r.read())
        assert stats["connections"]["refused"]["out_of_file_descriptors"] >= 30, stats
        log.seek(0)
        text = log.read()
        assert 1 <= text.count("out of file descriptors") <= 3, text[-3000:]
        assert "file descriptors free again" in text
        assert "accept failed" not in text
        assert proc.poll() is None
    finally:
        for s, _ in clients:
            s.close()
        proc.terminate()
        proc.wait(10)
        log.close()
