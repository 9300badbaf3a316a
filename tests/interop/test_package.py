"""The Debian package (`scripts/package`, packaging/, docs/package.md).

The package is built once for the module with `scripts/package --dev` (the debug build, no
release build) and looked at as dpkg sees it: its control fields, file list, conffiles and
maintainer scripts; its systemd unit through `systemd-analyze verify` (any diagnostic about the
unit fails, since verify itself exits 0 on an unknown or misspelt directive) and
`systemd-analyze security`; and its contents run: extracted with `dpkg -x` into a temp
directory, `<tmp>/usr/bin/braid serve -c <tmp>/etc/braid/braid.toml` serves independent
clients (mosquitto_pub/_sub), keeps a retained message across a restart and survives SIGHUP.
Only what a test that is not root must change is overridden with --set: the data directory and
the listeners' addresses (free loopback ports). The shipped braid.toml's commented-out keys are
checked against the broker itself by uncommenting them.
"""
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ROOT, free_port, toml_value, wait_for_port
from helpers import mosquitto_pub, start_mosquitto_sub, unique, wait_until

# The module's first test also builds the package (a `cargo build -p braid` when stale).
pytestmark = [pytest.mark.braid_only, pytest.mark.timeout(300)]

for tool in ("dpkg-deb", "systemd-analyze"):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed: not a Debian system (scripts/install-test-deps installs "
                    "systemd where it is)", allow_module_level=True)

UNIT = "usr/lib/systemd/system/braid.service"
CONFIG = "etc/braid/braid.toml"
# A commented-out key (`# key = value`), and a table header, commented out or not.
KEY_LINE = re.compile(r"^# ?([A-Za-z_][A-Za-z0-9_]*) = (.*)$")
HEADER_LINE = re.compile(r"^(# ?)?(\[\[?([A-Za-z0-9_.]+)\]\]?)\s*$")


@pytest.fixture(scope="module")
def deb():
    """Path of the .deb that `scripts/package --dev` builds."""
    proc = subprocess.run([os.path.join(ROOT, "scripts", "package"), "--dev"], capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, f"scripts/package --dev failed ({proc.returncode}):\n{proc.stderr}"
    path = proc.stdout.strip().splitlines()[-1]
    assert path.endswith(".deb") and os.path.isfile(path), f"not a package: {proc.stdout!r}"
    return path


@pytest.fixture(scope="module")
def root(deb, tmp_path_factory):
    """The package's files, extracted with `dpkg -x` into a temp directory."""
    d = tmp_path_factory.mktemp("braid-deb-root")
    subprocess.run(["dpkg-deb", "-x", deb, str(d)], check=True, timeout=60)
    return d


def dpkg_deb(*args):
    return subprocess.run(["dpkg-deb", *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def test_control_files_and_maintainer_scripts(deb):
    info = dpkg_deb("--info", deb)
    assert re.search(r"^ Package: braid$", info, re.M), info
    assert re.search(r"^ Section: net$", info, re.M), info
    depends = re.search(r"^ Depends: (.*)$", info, re.M).group(1)
    # adduser by hand, the shared libraries by $auto (dpkg-shlibdeps).
    assert "adduser" in depends and "libc6" in depends, depends
    assert re.search(r"^ Maintainer: .+<.+@.+>$", info, re.M), info

    modes = {line.split()[-1].lstrip("."): line.split()[0]
             for line in dpkg_deb("--contents", deb).splitlines()}
    for path in ("/usr/bin/braid", "/etc/braid/braid.toml", "/" + UNIT,
                 "/usr/share/doc/braid/README.md", "/usr/share/doc/braid/configuration.md"):
        assert path in modes, f"{path} not in the package: {sorted(modes)}"
    assert modes["/usr/bin/braid"] == "-rwxr-xr-x", modes

    assert dpkg_deb("--info", deb, "conffiles").split() == ["/etc/braid/braid.toml"]
    postinst = dpkg_deb("--info", deb, "postinst")
    assert "adduser --system --group" in postinst and "/var/lib/braid" in postinst, postinst
    assert "deb-systemd-helper enable braid.service" in postinst, postinst
    # Starting the service is only tried where systemd runs (not in a container without it).
    start = postinst.index("deb-systemd-invoke")
    assert "[ -d /run/systemd/system ]" in postinst[:start], postinst
    postrm = dpkg_deb("--info", deb, "postrm")
    purge = postrm.rindex('if [ "$1" = purge ]')
    assert "rm -rf /var/lib/braid" in postrm[purge:] and "deluser" in postrm[purge:], postrm
    assert "rm -rf" not in postrm[:purge], postrm
    assert "deb-systemd-invoke stop braid.service" in dpkg_deb("--info", deb, "prerm")
    for script in ("postinst", "postrm", "prerm"):
        subprocess.run(["sh", "-n"], input=dpkg_deb("--info", deb, script), text=True, check=True)


def verify_unit(root, tmp_path, text):
    """`systemd-analyze verify` on `text` as braid.service, its binary the extracted one; returns
    its diagnostics about the unit (verify exits 0 on an unknown directive, but says so)."""
    unit = tmp_path / "braid.service"
    unit.write_text(text.replace("/usr/bin/braid", f"{root}/usr/bin/braid"))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                          timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "braid.service" in line]
    if proc.returncode != 0:
        problems.append(f"exit status {proc.returncode}")
    return problems


def test_unit_passes_systemd_analyze_verify(root, tmp_path):
    text = (root / UNIT).read_text()
    assert verify_unit(root, tmp_path, text) == []
    for line in ("ExecStart=/usr/bin/braid serve -c /etc/braid/braid.toml",
                 "ExecReload=/bin/kill -HUP $MAINPID", "User=braid", "ProtectSystem=strict",
                 "ReadWritePaths=/var/lib/braid", "LimitNOFILE=1048576", "CapabilityBoundingSet="):
        assert line in text.splitlines(), f"{line!r} not in the unit"

    # The check is real: a misspelt directive, a bad value or a missing binary is reported.
    assert verify_unit(root, tmp_path, text.replace("ProtectSystem=", "ProtectSystm="))
    assert verify_unit(root, tmp_path, text.replace("ProtectSystem=strict", "ProtectSystem=strickt"))
    assert verify_unit(root, tmp_path, text.replace("/usr/bin/braid", "/usr/bin/braid-missing"))

    # The hardening as systemd rates it: 0 (locked down) to 10 (nothing); 1.4 when written.
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager",
                           str(tmp_path / "braid.service")], capture_output=True, text=True, timeout=60)
    exposure = re.search(r"Overall exposure level for braid\.service: ([0-9.]+)", proc.stdout)
    assert exposure, proc.stdout + proc.stderr
    assert float(exposure.group(1)) <= 2.0, proc.stdout


class ExtractedBroker:
    """The extracted package's broker, `serve -c` a config file, with --set only for what a test
    that is not root must change; ``host``/``port`` as conftest's Broker (for the helpers)."""

    def __init__(self, root, config, data_dir, log_path):
        self.host = "127.0.0.1"
        self.port = free_port()
        self.cmd = [str(root / "usr/bin/braid"), "serve", "-c", str(config),
                    "--set", f"store.data_dir={toml_value(str(data_dir))}",
                    "--set", f'listeners.tcp="127.0.0.1:{self.port}"',
                    "--set", 'listeners.quic="127.0.0.1:0"',
                    "--set", 'listeners.http="127.0.0.1:0"']
        self.log_path = log_path
        self.proc = None
        self.start()

    def start(self):
        # No inherited BRAID_* variable (conftest sets some): the shipped file and the flags only.
        env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, self.proc)
        except RuntimeError as e:
            raise AssertionError(f"{e}; log:\n{self.log()}") from None

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout=10):
        """SIGTERM; returns the exit status (SIGKILL after ``timeout`` s fails the test)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"no exit within {timeout}s of SIGTERM; log:\n{self.log()}")
        return self.proc.returncode


@pytest.fixture
def extracted(root, tmp_path):
    """Factory: extracted(config=shipped braid.toml) -> a running ExtractedBroker."""
    started = []

    def make(config=None):
        b = ExtractedBroker(root, config or root / CONFIG, tmp_path / f"data{len(started)}",
                            tmp_path / f"braid{len(started)}.log")
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def assert_passes_messages(broker, topic):
    sub = start_mosquitto_sub(broker, topic, qos=1)
    try:
        payload = unique("payload")
        mosquitto_pub(broker, topic, payload, qos=1)
        msg = sub.get_message()
        assert (msg.topic, msg.payload) == (topic, payload.encode())
    finally:
        sub.stop()


def test_extracted_package_serves_persists_and_reloads(extracted):
    broker = extracted()
    assert_passes_messages(broker, "pkg/live")
    mosquitto_pub(broker, "pkg/retained", "kept", qos=1, retain=True)

    # Reload (what `systemctl reload braid` sends): the broker goes on serving.
    broker.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP" in broker.log(), message="the broker logs the SIGHUP")
    time.sleep(0.3)
    assert broker.proc.poll() is None, f"SIGHUP ended the broker; log:\n{broker.log()}"
    assert_passes_messages(broker, "pkg/after-reload")

    # Stop (what `systemctl stop` sends) well within the unit's TimeoutStopSec, start again on the
    # same data directory: the retained message is still there.
    t0 = time.monotonic()
    assert broker.stop() == 0, broker.log()
    assert time.monotonic() - t0 < 5
    broker.start()
    sub = start_mosquitto_sub(broker, "pkg/retained", qos=1)
    try:
        msg = sub.get_message()
        assert (msg.payload, msg.retain) == (b"kept", True)
    finally:
        sub.stop()


def uncommented(text, examples):
    """The config with its `# key = value` lines uncommented: the defaults only, or with the
    examples too (lines marked "# example" and everything under a commented-out table header).
    Returns (text, {(table, key)} of the keys set in it)."""
    out, keys, table, in_example = [], set(), "", False
    for line in text.splitlines():
        header = HEADER_LINE.match(line)
        if header:
            in_example = bool(header.group(1))
            if not in_example or examples:
                table = header.group(3)
                line = header.group(2)
        else:
            key = KEY_LINE.match(line)
            if key and (examples or not (in_example or line.endswith("# example"))):
                line = line[line.index(key.group(1)):]
            key = re.match(r"^([A-Za-z_][A-Za-z0-9_]*) = ", line)
            if key:
                keys.add((table, key.group(1)))
        out.append(line)
    return "\n".join(out) + "\n", keys


def documented_keys(configuration_md):
    """{(table, key): default} of every key in docs/configuration.md's tables, bridges left out
    (the shipped file has an example of each bridge, not all their keys)."""
    keys, table = {}, None
    for line in configuration_md.splitlines():
        heading = re.match(r"^#+ `\[([a-z_.]+)\]`", line)
        if line.startswith("#"):
            table = heading.group(1) if heading and not heading.group(1).startswith("bridges") else None
        elif table and line.startswith("| `"):
            cells = [c.strip() for c in line.split("|")]
            keys.update(((table, k), cells[3]) for k in re.findall(r"`([a-z0-9_]+)`", cells[1]))
    return keys


def test_shipped_config_defaults_uncommented_are_accepted(root, tmp_path, extracted):
    shipped = (root / CONFIG).read_text()
    text, defaults = uncommented(shipped, examples=False)
    # Every key docs/configuration.md describes is in the shipped file: as its default when it
    # has one, as an example when it is off or unset by default.
    documented = documented_keys((root / "usr/share/doc/braid/configuration.md").read_text())
    missing = set(documented) - uncommented(shipped, examples=True)[1]
    assert not missing, f"keys of docs/configuration.md missing from braid.toml: {sorted(missing)}"
    missing = {k for k, default in documented.items() if default not in ("none", "off", "unset")} - defaults
    assert not missing, f"keys with a default that braid.toml does not show: {sorted(missing)}"
    # Every default, uncommented, is a key the broker knows with a value it accepts.
    config = tmp_path / "defaults.toml"
    config.write_text(text)
    broker = extracted(config)
    assert_passes_messages(broker, "pkg/defaults")


def test_shipped_config_examples_uncommented_are_real_keys(root, tmp_path):
    text, keys = uncommented((root / CONFIG).read_text(), examples=True)
    assert ("tls", "cert") in keys and ("bridges.mqtt", "address") in keys, sorted(keys)
    config = tmp_path / "everything.toml"
    config.write_text(text)
    cmd = [str(root / "usr/bin/braid"), "serve", "-c", str(config),
           "--set", f"store.data_dir={toml_value(str(tmp_path / 'data'))}"]
    for key in ("tcp", "tls", "ws", "wss", "quic", "http"):
        cmd += ["--set", f'listeners.{key}="127.0.0.1:0"']
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
    proc = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=20)
    # Every key parses and validates; the broker stops only at the first example file that
    # is not there (/etc/braid/passwd and the like), after the configuration was accepted.
    assert proc.returncode == 2, proc.stderr
    assert "unknown field" not in proc.stderr and "invalid type" not in proc.stderr, proc.stderr
    assert re.search(r"/etc/braid/\S+: No such file or directory", proc.stderr), proc.stderr
