"""`braid serve` configuration from the command line: a TOML file (`-c` / `BRAID_CONFIG`),
`BRAID_<SECTION>_<KEY>` environment variables, `--set section.key=value` and `--listen`, layered in
that order (docs/configuration.md).

A bad configuration must stop the broker before it listens, with exit status 2 and a message naming
the key; a good one must be observable from a client (v5 CONNACK properties). These tests start
their own `braid` processes with a controlled environment (every inherited `BRAID_*` variable
removed), so they are Braid-only.
"""
import os
import socket
import subprocess
import tempfile

import pytest

from conftest import BRAID_BIN, free_port, wait_for_port
from helpers import MQTTv5, mosquitto_pub, unique, wait_until

pytestmark = pytest.mark.braid_only

EXIT_TIMEOUT = 5.0
"""A rejected configuration must make `braid serve` exit within this many seconds."""


def clean_env(**extra):
    """The current environment without any `BRAID_*` variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    env.update(extra)
    return env


def write_toml(tmp_path, text, name="braid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def port_is_listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def isolated():
    """Flags that keep the broker off shared resources: the disk store in a fresh directory
    instead of ./braid-data, and MQTT over QUIC on a free loopback port instead of 14567 (which
    a `braid serve` running beside the tests may hold)."""
    return ["--set", f'store.data_dir="{tempfile.mkdtemp(prefix="braid-data-")}"',
            "--set", 'listeners.quic="127.0.0.1:0"']


def run_rejected(args, env=None, cwd=None):
    """Run `braid serve ARGS --listen 127.0.0.1:PORT`, which must exit on its own within
    EXIT_TIMEOUT s; returns (returncode, stderr text, port)."""
    port = free_port()
    cmd = [BRAID_BIN, "serve", *args, "--listen", f"127.0.0.1:{port}", *isolated()]
    try:
        proc = subprocess.run(cmd, env=env if env is not None else clean_env(), cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed it
        raise AssertionError(f"{cmd} still running after {EXIT_TIMEOUT}s; stderr: {e.stderr!r}") from None
    assert not port_is_listening(port), f"something listens on {port} after a rejected configuration"
    return proc.returncode, proc.stderr.decode("utf-8", "replace"), port


class BraidProcess:
    """`braid serve` started with explicit arguments and environment; ``host``/``port`` like
    conftest's Broker, so the ``connect`` fixture and helpers.mosquitto_pub work with it."""

    def __init__(self, args=(), env=None, cwd=None):
        self.host = "127.0.0.1"
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="braid-config-", suffix=".log", delete=False)
        self.cmd = [BRAID_BIN, "serve", *args, "--listen", f"{self.host}:{self.port}", *isolated()]
        self.proc = subprocess.Popen(self.cmd, env=env if env is not None else clean_env(), cwd=cwd,
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, self.proc, timeout=5.0)
        except RuntimeError as e:
            self.stop()
            raise AssertionError(f"{e}; command {self.cmd}; output: {self.log_text()!r}") from None

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start_braid():
    """Factory: start_braid(args=[...], env={...}, cwd=...) -> BraidProcess (stopped at the end)."""
    started = []

    def start(args=(), env=None, cwd=None):
        b = BraidProcess(args, env=env, cwd=cwd)
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


# --------------------------------------------------------------------------------------------------
# Rejected configurations: exit 2 before listening, the message names the key
# --------------------------------------------------------------------------------------------------

def test_out_of_range_value_in_file_is_rejected(tmp_path):
    conf = write_toml(tmp_path, "[mqtt]\nmax_qos = 7\n")
    code, err, _ = run_rejected(["-c", conf])
    assert code == 2, err
    assert "mqtt.max_qos" in err


def test_unknown_key_in_file_is_rejected(tmp_path):
    conf = write_toml(tmp_path, "[mqtt]\nmax_infligt = 100\n")
    code, err, _ = run_rejected(["-c", conf])
    assert code == 2, err
    assert "max_infligt" in err


def test_unknown_section_in_file_is_rejected(tmp_path):
    conf = write_toml(tmp_path, "[mqt]\nmax_inflight = 100\n")
    code, err, _ = run_rejected(["-c", conf])
    assert code == 2, err
    assert "mqt" in err


def test_file_that_is_not_toml_is_rejected(tmp_path):
    conf = write_toml(tmp_path, "[mqtt\nmax_inflight = \n")
    code, err, _ = run_rejected(["-c", conf])
    assert code == 2, err
    assert "line 1" in err, err  # points at the syntax error


def test_wrong_type_via_set_is_rejected():
    code, err, _ = run_rejected(["--set", 'mqtt.max_inflight="many"'])
    assert code == 2, err
    assert "mqtt.max_inflight" in err


def test_out_of_range_value_via_set_is_rejected():
    code, err, _ = run_rejected(["--set", "mqtt.max_packet_size=8"])
    assert code == 2, err
    assert "mqtt.max_packet_size" in err


def test_set_without_equals_is_rejected():
    code, err, _ = run_rejected(["--set", "mqtt.max_inflight"])
    assert code == 2, err
    assert "mqtt.max_inflight" in err


def test_missing_config_file_is_reported_with_its_path(tmp_path):
    missing = str(tmp_path / "no-such-dir" / "braid.toml")
    code, err, _ = run_rejected(["-c", missing])
    assert code != 0
    assert missing in err


def test_missing_config_file_via_braid_config_env(tmp_path):
    missing = str(tmp_path / "absent.toml")
    code, err, _ = run_rejected([], env=clean_env(BRAID_CONFIG=missing))
    assert code != 0
    assert missing in err


def test_bad_enum_via_env_is_rejected():
    code, err, _ = run_rejected([], env=clean_env(BRAID_SHARED_STRATEGY="fastest"))
    assert code == 2, err
    assert "shared.strategy" in err


def test_wrong_type_via_env_is_rejected():
    code, err, _ = run_rejected([], env=clean_env(BRAID_MQTT_MAX_PACKET_SIZE="big"))
    assert code == 2, err
    assert "mqtt.max_packet_size" in err


@pytest.mark.parametrize("key", ["auth.password_file", "acl.file", "auth.jwt_key_file"])
def test_auth_file_that_does_not_load_is_rejected(tmp_path, key):
    code, err, _ = run_rejected(["--set", f'{key}="{tmp_path / "absent"}"'])
    assert code == 2, err
    assert f"invalid configuration: {key}:" in err, err


def test_bad_value_in_file_is_rejected_even_when_env_is_fine(tmp_path):
    """Validation runs on the merged result, but a bad file value that a later layer does not
    override must still be caught."""
    conf = write_toml(tmp_path, '[session]\nqueue_overflow = "drop_everything"\n')
    code, err, _ = run_rejected(["-c", conf], env=clean_env(BRAID_MQTT_MAX_INFLIGHT="10"))
    assert code == 2, err
    assert "session.queue_overflow" in err


def test_unknown_key_gets_the_nearest_known_one(tmp_path):
    conf = write_toml(tmp_path, "[mqtt]\nmax_inflights = 100\n")
    code, err, _ = run_rejected(["-c", conf])
    assert code == 2, err
    assert "mqtt.max_inflights: unknown key; did you mean mqtt.max_inflight? (from TOML file " in err, err
    assert "`" not in err, err


def test_unknown_env_key_names_the_variable():
    code, err, _ = run_rejected([], env=clean_env(BRAID_MQTT_MAX_INFLIGHTS="100"))
    assert code == 2, err
    assert ("mqtt.max_inflights: unknown key; did you mean mqtt.max_inflight? "
            "(from environment variable BRAID_MQTT_MAX_INFLIGHTS)") in err, err


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
def test_range_error_says_where_the_value_came_from(tmp_path, layer):
    args, env, source = [], clean_env(), None
    if layer == "file":
        conf = write_toml(tmp_path, "[mqtt]\nmax_qos = 3\n")
        args, source = ["-c", conf], "TOML file "
    elif layer == "env":
        env, source = clean_env(BRAID_MQTT_MAX_QOS="3"), "environment variable BRAID_MQTT_MAX_QOS"
    else:
        args, source = ["--set", "mqtt.max_qos=3"], "--set/--listen flag"
    code, err, _ = run_rejected(args, env=env)
    assert code == 2, err
    assert f"invalid configuration: mqtt.max_qos: must be 0, 1 or 2 (from {source}" in err, err
    if layer == "file":
        assert "braid.toml)" in err, err


def test_listen_and_set_listeners_tcp_together_are_refused():
    """`--listen` (added by run_rejected) and `--set listeners.tcp=...` both set listeners.tcp:
    refused, naming both, rather than one silently winning and hiding a bad value in the other."""
    code, err, _ = run_rejected(["--set", "listeners.tcp=not-an-address"])
    assert code == 2, err
    assert "--listen 127.0.0.1:" in err and "--set listeners.tcp=not-an-address" in err, err
    assert "both set listeners.tcp" in err, err


@pytest.mark.parametrize("layer", ["flag", "env", "file"])
def test_quic_pacing_as_a_bare_number(tmp_path, start_braid, connect, layer):
    args, env = [], clean_env()
    if layer == "flag":
        args = ["--set", "quic.pacing=25"]
    elif layer == "env":
        env = clean_env(BRAID_QUIC_PACING="25")
    else:
        args = ["-c", write_toml(tmp_path, "[quic]\npacing = 25\n")]
    b = start_braid(args, env=env)
    assert connect(b, protocol=MQTTv5).connack.reason_code == 0


def test_quic_pacing_zero_is_rejected():
    code, err, _ = run_rejected([], env=clean_env(BRAID_QUIC_PACING="0"))
    assert code == 2, err
    assert "quic.pacing" in err and "packets per second" in err, err


def test_listening_lines_show_plain_addresses(start_braid):
    """`listening for MQTT ... addr=127.0.0.1:PORT` for every transport, never `addr=Some(...)`."""
    b = start_braid([])
    wait_until(lambda: 'transport="quic"' in b.log_text(), timeout=5, message="the QUIC listening line")
    lines = [line for line in b.log_text().splitlines() if "listening for MQTT" in line]
    assert any('transport="tcp"' in line and f"addr=127.0.0.1:{b.port}" in line for line in lines), lines
    [quic] = [line for line in lines if 'transport="quic"' in line]
    assert "addr=127.0.0.1:" in quic, quic
    assert "Some(" not in b.log_text()


# --------------------------------------------------------------------------------------------------
# Layering, observed from a v5 client
# --------------------------------------------------------------------------------------------------

def connack_property(connect, broker, name):
    c = connect(broker, protocol=MQTTv5)
    assert c.connack.properties is not None, "v5 CONNACK without properties"
    return getattr(c.connack.properties, name, None)


@pytest.mark.parametrize("use_file,env_value,set_value,expected", [
    (True, None, None, 5000),
    (True, "6000", None, 6000),
    (True, "6000", "7000", 7000),
    (True, None, "7000", 7000),
    (False, "6000", None, 6000),
], ids=["file", "file+env", "file+env+set", "file+set", "env"])
def test_max_packet_size_layering(tmp_path, start_braid, connect, use_file, env_value, set_value, expected):
    args, extra = [], {}
    if use_file:
        args += ["-c", write_toml(tmp_path, "[mqtt]\nmax_packet_size = 5000\n")]
    if env_value is not None:
        extra["BRAID_MQTT_MAX_PACKET_SIZE"] = env_value
    if set_value is not None:
        args += ["--set", f"mqtt.max_packet_size={set_value}"]
    b = start_braid(args, env=clean_env(**extra))
    assert connack_property(connect, b, "MaximumPacketSize") == expected


def test_config_file_via_braid_config_env(tmp_path, start_braid, connect):
    conf = write_toml(tmp_path, "[mqtt]\nmax_packet_size = 5000\ntopic_alias_maximum = 5\n")
    b = start_braid([], env=clean_env(BRAID_CONFIG=conf))
    c = connect(b, protocol=MQTTv5)
    assert c.connack.properties.MaximumPacketSize == 5000
    assert c.connack.properties.TopicAliasMaximum == 5


def test_topic_alias_maximum_from_env(start_braid, connect):
    b = start_braid([], env=clean_env(BRAID_MQTT_TOPIC_ALIAS_MAXIMUM="3"))
    assert connack_property(connect, b, "TopicAliasMaximum") == 3


def test_env_and_set_change_different_keys_together(tmp_path, start_braid, connect):
    """Each layer overrides only the keys it names: file, env and --set each set a different key."""
    conf = write_toml(tmp_path, "[mqtt]\nmax_packet_size = 5000\n")
    b = start_braid(["-c", conf, "--set", "mqtt.receive_maximum=9"],
                    env=clean_env(BRAID_MQTT_TOPIC_ALIAS_MAXIMUM="3"))
    props = connect(b, protocol=MQTTv5).connack.properties
    assert props.MaximumPacketSize == 5000
    assert props.TopicAliasMaximum == 3
    assert props.ReceiveMaximum == 9


def test_listen_flag_overrides_listeners_tcp_from_file(tmp_path, start_braid, connect):
    """The file names another port; `--listen` (added by BraidProcess) wins."""
    other = free_port()
    conf = write_toml(tmp_path, f'[listeners]\ntcp = "127.0.0.1:{other}"\n')
    b = start_braid(["-c", conf])
    connect(b)
    assert not port_is_listening(other)


# --------------------------------------------------------------------------------------------------
# Environment hygiene and embedded defaults
# --------------------------------------------------------------------------------------------------

def test_unrelated_braid_env_vars_do_not_break_startup(start_braid, connect):
    env = clean_env(
        BRAID_BIN=BRAID_BIN,
        BRAID_TEST_BROKER="braid",
        BRAID_HOME="/nonexistent",
        BRAID_MQTT="1",            # a section name alone, no key
        BRAID_MQTTX_HOST="x",      # starts like a section, but is not one
        BRAID_SYSTEM_NAME="x",
        BRAID_LOGFILE="/tmp/x.log",
    )
    b = start_braid([], env=env)
    c = connect(b, protocol=MQTTv5)
    assert c.connack.reason_code == 0


def test_no_config_at_all_uses_embedded_defaults(tmp_path, start_braid, connect, mosquitto_sub):
    """Only `--listen`, no file, no BRAID_* variables, run from an empty directory."""
    b = start_braid([], env=clean_env(), cwd=str(tmp_path))
    topic = unique("defaults")
    sub = mosquitto_sub(b, topic, qos=1)
    mosquitto_pub(b, topic, "hello defaults", qos=1)
    [m] = sub.wait_messages(1)
    assert (m.topic, m.payload, m.qos) == (topic, b"hello defaults", 1)

    # The documented defaults, as a v5 client sees them.
    props = connect(b, protocol=MQTTv5).connack.properties
    assert getattr(props, "MaximumPacketSize", 268435455) == 268435455
    assert getattr(props, "TopicAliasMaximum", None) == 64
    assert getattr(props, "ReceiveMaximum", 65535) == 1024
    assert getattr(props, "MaximumQoS", 2) == 2
    assert getattr(props, "RetainAvailable", 1) == 1
