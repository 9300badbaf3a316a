"""`braid pub` and `braid sub` (the mosquitto_pub / mosquitto_sub look-alikes) against the fixture
broker, cross-checked with independent clients: mosquitto_pub, mosquitto_sub and paho-mqtt.

These tests exercise the CLI and the braid-client library, so they also run against Mosquitto
(BRAID_TEST_BROKER=mosquitto); only what depends on Braid the broker is marked ``braid_only``.
"""
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import BRAID_BIN, free_port
from helpers import MQTTv5, TIMEOUT, MessageCollector, Msg, mosquitto_pub, unique

VERSIONS = ["mqttv31", "mqttv311", "mqttv5"]


def braid(*args, input=None, timeout=TIMEOUT * 2):
    """Run ``braid <args>`` to completion; returns the CompletedProcess (bytes)."""
    return subprocess.run([BRAID_BIN, *map(str, args)], input=input, capture_output=True, timeout=timeout)


def braid_pub(broker, topic, *args, input=None, check=True):
    """``braid pub -h host -p port -t topic <args>``; with ``check`` asserts exit status 0."""
    proc = braid("pub", "-h", broker.host, "-p", broker.port, "-t", topic, *args, input=input)
    if check:
        assert proc.returncode == 0, f"braid pub failed ({proc.returncode}): {proc.stderr!r}"
    return proc


class BraidSub(MessageCollector):
    """``braid sub -d -v`` in the background: stdout lines ``topic payload`` become :class:`Msg`
    records (payload as bytes, qos unknown = -1); stderr is kept; ``subscribed`` is set once the
    SUBACK arrived (from the ``-d`` log). Call ``wait()`` for the exit status, ``stop()`` to end it."""

    def __init__(self, broker, topics, *extra, verbose=True):
        super().__init__()
        if isinstance(topics, str):
            topics = [topics]
        self.cmd = [BRAID_BIN, "sub", "-h", broker.host, "-p", str(broker.port), "-d"]
        if verbose:
            self.cmd.append("-v")
        for t in topics:
            self.cmd += ["-t", t]
        self.cmd += [str(a) for a in extra]
        self.verbose = verbose
        self.lines = queue.Queue()
        self.stdout = []
        self.stderr = []
        self.subscribed = threading.Event()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL)
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out.start()
        self._err.start()

    def _read_stdout(self):
        for raw in self.proc.stdout:
            line = raw.rstrip(b"\n")
            self.stdout.append(line)
            self.lines.put(line)
            if self.verbose and not line.startswith(b"  "):
                topic, _, payload = line.partition(b" ")
                self._put(Msg(topic=topic.decode(), payload=payload, qos=-1, retain=False,
                              received_at=time.monotonic()))

    def _read_stderr(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.stderr.append(line)
            if "subscribed to" in line:
                self.subscribed.set()
            if "denied" in line or "refused" in line or "cannot connect" in line:
                self.subscribed.set()

    def wait_subscribed(self, timeout=TIMEOUT):
        if not self.subscribed.wait(timeout):
            raise AssertionError(f"braid sub not subscribed within {timeout}s; stderr: {self.stderr}")

    def wait(self, timeout=TIMEOUT):
        """Exit status; fails if the process is still running after ``timeout`` s."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"braid sub still running after {timeout}s; stderr: {self.stderr}") from None
        self._out.join(2)
        self._err.join(2)
        return rc

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(3)
        self._out.join(2)
        self._err.join(2)


@pytest.fixture
def braid_sub():
    """Factory: braid_sub(broker, topics, *extra_args, wait=True) -> BraidSub (subscribed unless
    ``wait=False``); killed at the end of the test."""
    made = []

    def make(broker, topics, *extra, wait=True, verbose=True):
        s = BraidSub(broker, topics, *extra, verbose=verbose)
        made.append(s)
        if wait:
            s.wait_subscribed()
        return s

    yield make
    for s in made:
        s.stop()


# --------------------------------------------------------------------------------------------------
# Round trips with independent tools
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", VERSIONS)
def test_braid_pub_to_mosquitto_sub(broker, mosquitto_sub, version, qos):
    topic = unique("bp") + "/t"
    sub = mosquitto_sub(broker, topic, qos=2, version=version)
    braid_pub(broker, topic, "-V", version, "-q", qos, "-m", "hello from braid")
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload, m.qos, m.retain) == (topic, b"hello from braid", qos, False)
    sub.expect_no_message(0.3)


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("version", VERSIONS)
def test_mosquitto_pub_to_braid_sub(broker, braid_sub, version, qos):
    topic = unique("bs") + "/t"
    sub = braid_sub(broker, topic, "-V", version, "-q", qos, "-C", 1)
    mosquitto_pub(broker, topic, "hello from mosquitto", qos=qos, version=version)
    assert sub.wait() == 0, sub.stderr
    assert sub.stdout == [f"{topic} hello from mosquitto".encode()]


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_braid_pub_to_braid_sub_every_qos(broker, braid_sub, version):
    topic = unique("bb")
    sub = braid_sub(broker, topic + "/#", "-V", version, "-q", 2, "-C", 3)
    for qos in (0, 1, 2):
        braid_pub(broker, f"{topic}/{qos}", "-V", version, "-q", qos, "-m", f"q{qos}")
    assert sub.wait() == 0, sub.stderr
    assert sub.stdout == [f"{topic}/{q} q{q}".encode() for q in (0, 1, 2)]


def test_paho_receives_v5_properties_from_braid_pub(broker, connect):
    topic = unique("props")
    c = connect(broker, protocol=MQTTv5)
    c.subscribe(topic, qos=1)
    braid_pub(broker, topic, "-V", "5", "-q", 1, "-m", "with props", "--user-property", "k=v",
              "-D", "publish", "user-property", "a", "b", "-D", "publish", "content-type", "text/plain",
              "-D", "publish", "message-expiry-interval", 60, "-D", "publish", "response-topic", "reply/here")
    [m] = c.wait_messages(1)
    assert m.payload == b"with props"
    p = m.properties
    assert sorted(p.UserProperty) == [("a", "b"), ("k", "v")]
    assert p.ContentType == "text/plain"
    assert p.ResponseTopic == "reply/here"
    assert 0 < p.MessageExpiryInterval <= 60


def test_user_properties_switch_to_v5_like_mosquitto(broker, connect):
    # -D without -V selects MQTT v5, as in mosquitto_pub.
    topic = unique("autov5")
    c = connect(broker, protocol=MQTTv5)
    c.subscribe(topic, qos=0)
    braid_pub(broker, topic, "-m", "x", "-D", "publish", "user-property", "auto", "v5")
    [m] = c.wait_messages(1)
    assert m.properties.UserProperty == [("auto", "v5")]


def test_braid_sub_verbose_properties(broker, braid_sub):
    topic = unique("vp")
    sub = braid_sub(broker, topic, "-V", "5", "-C", 1, "--verbose-properties")
    mosquitto_pub(broker, topic, "p", version="mqttv5",
                  extra=["-D", "publish", "user-property", "colour", "blue",
                         "-D", "publish", "content-type", "text/x"])
    assert sub.wait() == 0, sub.stderr
    assert sub.stdout[0] == f"{topic} p".encode()
    assert b"  content-type: text/x" in sub.stdout[1:]
    assert b"  user-property: colour=blue" in sub.stdout[1:]


# --------------------------------------------------------------------------------------------------
# Payload sources and output formats
# --------------------------------------------------------------------------------------------------

def test_file_stdin_and_null_payloads_are_exact(broker, mosquitto_sub):
    topic = unique("payload")
    sub = mosquitto_sub(broker, topic, qos=1)
    blob = bytes(range(256)) * 40 + b"\n\x00end"
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(blob)
    try:
        braid_pub(broker, topic, "-q", 1, "-f", f.name)
    finally:
        os.unlink(f.name)
    braid_pub(broker, topic, "-q", 1, "-s", input=b"from stdin\nwith two lines\n")
    braid_pub(broker, topic, "-q", 1, "-n")
    got = [m.payload for m in sub.wait_messages(3)]
    assert got == [blob, b"from stdin\nwith two lines\n", b""]


def test_stdin_lines_are_one_message_each_in_order(broker, mosquitto_sub):
    topic = unique("lines")
    sub = mosquitto_sub(broker, topic, qos=1)
    lines = [f"line {i}" for i in range(200)]
    text = "\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:])  # an empty line in between, no final newline
    braid_pub(broker, topic, "-q", 1, "-l", input=text.encode())
    got = [m.payload.decode() for m in sub.wait_messages(201)]
    assert got == lines[:100] + [""] + lines[100:]


def test_repeat_publishes_n_times(broker, mosquitto_sub):
    topic = unique("repeat")
    sub = mosquitto_sub(broker, topic, qos=1)
    braid_pub(broker, topic, "-q", 1, "-m", "again", "--repeat", 3, "--repeat-delay", "0.05")
    assert [m.payload for m in sub.wait_messages(3)] == [b"again"] * 3
    sub.expect_no_message(0.3)


def test_braid_sub_output_formats(broker, braid_sub):
    topic = unique("fmt")
    plain = braid_sub(broker, [topic + "/a", topic + "/b"], "-C", 2, verbose=False)
    no_eol = braid_sub(broker, topic + "/a", "-C", 2, "-N", verbose=False)
    mosquitto_pub(broker, topic + "/a", "one")
    mosquitto_pub(broker, topic + "/b", "two")
    mosquitto_pub(broker, topic + "/a", "three")
    assert plain.wait() == 0
    assert plain.stdout == [b"one", b"two"]
    assert no_eol.wait() == 0
    assert no_eol.stdout == [b"onethree"]


@pytest.mark.parametrize("spelling", ["31", "mqttv31", "311", "mqttv311", "5", "mqttv5"])
def test_protocol_version_spellings(broker, mosquitto_sub, spelling):
    topic = unique("ver")
    sub = mosquitto_sub(broker, topic)
    braid_pub(broker, topic, "-V", spelling, "-m", spelling)
    [m] = sub.wait_messages(1)
    assert m.payload == spelling.encode()


# --------------------------------------------------------------------------------------------------
# Retained messages and subscription options
# --------------------------------------------------------------------------------------------------

def test_retained_message_and_dash_r(broker, mosquitto_sub, braid_sub):
    topic = unique("ret")
    braid_pub(broker, topic, "-q", 1, "-r", "-m", "kept")
    later = mosquitto_sub(broker, topic, qos=1)
    [m] = later.wait_messages(1)
    assert (m.payload, m.retain) == (b"kept", True)

    sub = braid_sub(broker, topic, "-C", 1)
    assert sub.wait() == 0
    assert sub.stdout == [f"{topic} kept".encode()]

    # -R: stale (retained) messages are not printed.
    stale = braid_sub(broker, topic, "-R", "-W", 1)
    assert stale.wait(5) == 27
    assert stale.stdout == []
    assert "Timed out" in stale.stderr

    # An empty retained message clears it.
    braid_pub(broker, topic, "-q", 1, "-r", "-n")
    empty = braid_sub(broker, topic, "-W", 1)
    assert empty.wait(5) == 27
    assert empty.stdout == []


def test_retain_handling_and_no_local_flags(broker, braid_sub):
    topic = unique("rh")
    braid_pub(broker, topic, "-V", "5", "-q", 1, "-r", "-m", "kept")
    never = braid_sub(broker, topic, "-V", "5", "--retain-handling", 2, "-W", 1)
    assert never.wait(5) == 27 and never.stdout == []
    always = braid_sub(broker, topic, "-V", "5", "--retain-handling", 0, "-C", 1)
    assert always.wait() == 0 and always.stdout == [f"{topic} kept".encode()]
    # No Local only suppresses this client's own messages: others still arrive.
    nl = braid_sub(broker, topic, "-V", "5", "--no-local", "--retain-handling", "never",
                   "--retain-as-published", "-C", 1)
    mosquitto_pub(broker, topic, "live", version="mqttv5")
    assert nl.wait() == 0 and nl.stdout == [f"{topic} live".encode()]
    # The v5 options need v5.
    proc = braid("sub", "-h", broker.host, "-p", broker.port, "-t", topic, "--no-local")
    assert proc.returncode == 1 and b"MQTT v5" in proc.stderr


# --------------------------------------------------------------------------------------------------
# Sessions and wills
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_persistent_session_with_dash_c(broker, braid_sub, version):
    topic = unique("persist")
    cid = unique("bsub")
    # Subscribe, then exit (-E) leaving the session behind.
    first = braid_sub(broker, topic, "-V", version, "-q", 1, "-c", "-i", cid, "-E", wait=False)
    assert first.wait() == 0, first.stderr
    for i in range(2):
        mosquitto_pub(broker, topic, f"queued {i}", qos=1, version=version)
    again = braid_sub(broker, topic, "-V", version, "-q", 1, "-c", "-i", cid, "-C", 2, wait=False)
    assert again.wait() == 0, again.stderr
    assert again.stdout == [f"{topic} queued 0".encode(), f"{topic} queued 1".encode()]


def test_session_expiry_zero_ends_the_session_at_disconnect(broker, braid_sub):
    topic = unique("expiry")
    cid = unique("bsub")
    first = braid_sub(broker, topic, "-V", "5", "-q", 1, "-c", "-x", 0, "-i", cid, "-E", wait=False)
    assert first.wait() == 0, first.stderr
    mosquitto_pub(broker, topic, "lost", qos=1, version="mqttv5")
    again = braid_sub(broker, topic, "-V", "5", "-q", 1, "-c", "-i", cid, "-W", 1, wait=False)
    assert again.wait(5) == 27
    assert again.stdout == []


def test_will_is_published_when_braid_sub_dies(broker, mosquitto_sub, braid_sub):
    will_topic = unique("will")
    watcher = mosquitto_sub(broker, will_topic, qos=1)
    victim = braid_sub(broker, unique("x"), "--will-topic", will_topic, "--will-payload", "gone",
                       "--will-qos", 1)
    victim.proc.kill()  # no DISCONNECT
    victim.wait()
    [m] = watcher.wait_messages(1)
    assert m.payload == b"gone"


def test_sigterm_disconnects_normally_without_will(broker, mosquitto_sub, braid_sub):
    will_topic = unique("will")
    watcher = mosquitto_sub(broker, will_topic, qos=1)
    sub = braid_sub(broker, unique("x"), "-V", "5", "--will-topic", will_topic, "--will-payload", "gone")
    sub.proc.send_signal(signal.SIGTERM)
    assert sub.wait() == 0
    watcher.expect_no_message(0.5)


@pytest.mark.braid_only  # Mosquitto 2.0.11 closes the taken-over v5 connection without DISCONNECT 0x8E
def test_braid_sub_exits_when_its_session_is_taken_over(broker, braid_sub, connect):
    cid = unique("taken")
    sub = braid_sub(broker, unique("x"), "-V", "5", "-i", cid)
    connect(broker, client_id=cid, protocol=MQTTv5)
    assert sub.wait() == 1
    assert any("Session taken over" in line for line in sub.stderr), sub.stderr


# --------------------------------------------------------------------------------------------------
# Errors and exit codes
# --------------------------------------------------------------------------------------------------

def test_unreachable_broker_exits_1_with_a_clear_message():
    port = free_port()
    pub = braid("pub", "-h", "127.0.0.1", "-p", port, "-t", "t", "-m", "x")
    assert pub.returncode == 1
    assert b"cannot connect to 127.0.0.1:" in pub.stderr
    sub = braid("sub", "-h", "127.0.0.1", "-p", port, "-t", "t")
    assert sub.returncode == 1
    assert b"cannot connect" in sub.stderr


def test_refused_connection_exits_1(broker):
    # An empty client id with a persistent 3.1.1 session must be refused (MQTT-3.1.3-8).
    proc = braid_pub(broker, "t", "-i", "", "-c", "-m", "x", check=False)
    assert proc.returncode == 1
    assert b"connection refused" in proc.stderr
    assert b"Client Identifier not valid" in proc.stderr


def test_usage_errors(broker):
    assert braid_pub(broker, "t", "-c", "-m", "x", check=False).returncode == 1  # -c needs -i
    assert braid_pub(broker, "t", "-V", "311", "-x", 10, "-m", "x", check=False).returncode == 1
    assert braid_pub(broker, "t", check=False).returncode == 2  # no payload option: clap usage error
    assert braid_pub(broker, "t", "-m", "x", "-n", check=False).returncode == 2  # two payload options
    help_out = braid("pub", "--help")
    assert help_out.returncode == 0 and b"-h, --host" in help_out.stdout


def test_invalid_topic_filters_are_refused_before_connecting(broker):
    # Mosquitto closes the connection on an invalid filter; like mosquitto_sub, check first.
    proc = braid("sub", "-h", broker.host, "-p", broker.port, "-t", "good/#", "-t", "bad/#/filter")
    assert proc.returncode == 1
    assert b"invalid topic filter" in proc.stderr


@pytest.mark.braid_only  # Mosquitto refuses the SUBSCRIBE by closing the connection
def test_broker_refused_subscription_exits_1(broker):
    # Braid refuses a shared subscription with an empty group name in the SUBACK.
    proc = braid("sub", "-h", broker.host, "-p", broker.port, "-V", "5", "-t", "$share//t")
    assert proc.returncode == 1
    assert b"refused" in proc.stderr and b"all subscription requests were denied" in proc.stderr


@pytest.mark.braid_only
def test_rejected_publish_exits_1(broker):
    proc = braid_pub(broker, "$SYS/mine", "-V", "5", "-q", 1, "-m", "x", check=False)
    assert proc.returncode == 1
    assert b"Not authorized" in proc.stderr


def test_user_properties_on_subscribe(broker, braid_sub):
    # --user-property on braid sub goes on the SUBSCRIBE; the subscription still works.
    topic = unique("subprops")
    sub = braid_sub(broker, topic, "--user-property", "who=test", "-C", 1)
    mosquitto_pub(broker, topic, "ok")
    assert sub.wait() == 0 and sub.stdout == [f"{topic} ok".encode()]
