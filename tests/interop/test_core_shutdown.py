"""Graceful shutdown on SIGTERM / SIGINT: connected clients are told (v5: DISCONNECT 0x8B Server
shutting down; 3.1.1: the connection is closed, with no DISCONNECT, which 3.1.1 servers must not
send) and the process exits with status 0 within a few seconds.

These tests start (and signal) their own broker process instead of using the shared fixture.
"""
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import BRAID_BIN, TARGET, free_port, wait_for_port
from helpers import DISCONNECT, MQTTv311, MQTTv5, unique

EXIT_WITHIN = 3.0
"""After the signal, the process must be gone within this many seconds."""

SERVER_SHUTTING_DOWN = 0x8B

SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGINT, id="SIGINT")]


class OwnBroker:
    """A broker process of our own (Braid, or Mosquitto when BRAID_TEST_BROKER=mosquitto), with
    conftest's ``host``/``port`` attributes so the client fixtures work with it."""

    def __init__(self):
        self.host = "127.0.0.1"
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="broker-shutdown-", suffix=".log", delete=False)
        if TARGET == "mosquitto":
            conf = tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False)
            conf.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
            conf.close()
            cmd = ["mosquitto", "-c", conf.name]
        else:
            cmd = [BRAID_BIN, "serve", "--listen", f"{self.host}:{self.port}",
                   "--set", f'store.data_dir="{tempfile.mkdtemp(prefix="braid-data-")}"']
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, self.proc, timeout=5.0)

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def signal_and_wait(self, sig, within=EXIT_WITHIN):
        """Send ``sig``; returns the exit status, failing if the process outlives ``within`` s."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"broker still running {within}s after {sig.name}; "
                                 f"log: {self.log_text()[-2000:]!r}") from None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def own_broker():
    b = OwnBroker()
    yield b
    b.stop()


@pytest.mark.braid_only  # Mosquitto 2.0 closes v5 connections without a DISCONNECT
@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_sends_server_shutting_down_to_v5_client(own_broker, connect, sig):
    c = connect(own_broker, protocol=MQTTv5)
    c.subscribe(unique("shutdown") + "/#", qos=1)
    status = own_broker.signal_and_wait(sig)
    assert status == 0, f"exit status {status} after {sig.name}; log: {own_broker.log_text()[-2000:]!r}"
    reason = c.wait_disconnected(timeout=1)
    assert reason is not None and int(reason.value) == SERVER_SHUTTING_DOWN, (
        f"v5 client saw disconnect reason {reason!r}, expected 0x8B Server shutting down")


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_closes_v311_connections_and_exits_0(own_broker, connect, raw_client, sig):
    paho311 = connect(own_broker, protocol=MQTTv311)
    raw = raw_client(own_broker)
    connack = raw.connect(unique("raw"), level=4)
    assert connack.body[1] == 0
    started = time.monotonic()
    status = own_broker.signal_and_wait(sig)
    assert status == 0, f"exit status {status} after {sig.name}; log: {own_broker.log_text()[-2000:]!r}"
    paho311.wait_disconnected(timeout=max(EXIT_WITHIN - (time.monotonic() - started), 0.5))
    seen = raw.expect_closed(timeout=1)
    assert not [p for p in seen if p.type == DISCONNECT], "a 3.1.1 client was sent a DISCONNECT packet"


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_with_no_clients_exits_0_and_stops_listening(own_broker, sig):
    status = own_broker.signal_and_wait(sig)
    assert status == 0
    with pytest.raises(OSError):
        socket.create_connection((own_broker.host, own_broker.port), timeout=0.5).close()


@pytest.mark.parametrize("sig", SIGNALS)
def test_signal_closes_socket_that_never_sent_connect(own_broker, raw_client, sig):
    """A TCP connection still waiting for CONNECT must not hold the shutdown up."""
    raw = raw_client(own_broker)
    status = own_broker.signal_and_wait(sig)
    assert status == 0
    assert raw.is_closed(timeout=1)
