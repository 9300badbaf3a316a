"""What the bridge tests share: Braid run from a configuration file, and the lines of its log
about a bridge for a failure's message."""
import json
import os
import subprocess

from conftest import BRAID_BIN, Broker, free_port, wait_for_port


class BridgedBraid(Broker):
    """`braid serve -c FILE` (a conftest Broker: host, port, data_dir, kill(), start(), stop(),
    log_text()): `config` is the file's text; start() again runs on the same data directory.
    `about` is what the bridge's log lines say (e.g. "kafka", "mqtt bridge")."""

    def __init__(self, config, directory, about, data_dir=None):
        os.makedirs(directory, exist_ok=True)
        self.about = about
        self.config_file = os.path.join(directory, "braid.toml")
        with open(self.config_file, "w") as f:
            f.write(config)
        data_dir = data_dir or os.path.join(directory, "data")
        os.makedirs(data_dir, exist_ok=True)
        super().__init__({}, data_dir)

    def start(self):
        cmd = [BRAID_BIN, "serve", "-c", self.config_file, "--listen", f"{self.host}:{self.port}",
               "--set", f"store.data_dir={json.dumps(self.data_dir)}"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(self.port, self.proc)
        except RuntimeError as e:
            self.stop()
            raise AssertionError(f"{e}\n---- {self.log.name} ----\n{self.log_text()[-3000:]}") from None

    def bridge_log(self, last=30):
        """The log lines about the bridge (and every WARN/ERROR), for failure messages."""
        lines = [line for line in self.log_text().splitlines()
                 if self.about in line or "WARN" in line or "ERROR" in line]
        return f"\n---- braid log ({self.log.name}), bridge lines ----\n" + "\n".join(lines[-last:])


def assert_refused(tmp_path, text, key):
    """`braid serve -c` with configuration `text` exits with status 2 before listening, with a
    message naming `key`."""
    conf = tmp_path / "braid.toml"
    conf.write_text(text)
    proc = subprocess.run([BRAID_BIN, "serve", "-c", str(conf), "--listen", f"127.0.0.1:{free_port()}",
                           "--set", f"store.data_dir={json.dumps(str(tmp_path / 'data'))}"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 2, f"exit status {proc.returncode}; stderr: {proc.stderr}\n{text}"
    assert f"braid: invalid configuration: {key}" in proc.stderr, \
        f"stderr does not name {key}: {proc.stderr!r}\n{text}"
