"""A real InfluxDB 1.x for the tests: an `influxd` in a temporary directory of its own, on free
loopback ports, looked into over its HTTP API and with the real `influx` CLI.

Needs the Debian `influxdb` and `influxdb-client` packages (scripts/install-test-deps installs
them). Usable outside pytest too:

    with Influx() as db:
        db.create_db("iot")
        db.query("iot", "SELECT * FROM m")      # [['2024-01-01T00:00:00Z', 1.5], ...]
        db.stop(); time.sleep(20); db.start()   # same ports, same data
"""
import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from ports import free_port
from serviceproc import ServiceProcess

HOST = "127.0.0.1"


def need_influx():
    """The path of influxd; raises if it is not on PATH."""
    path = shutil.which("influxd")
    if path is None:
        raise RuntimeError("influxd not found on PATH: run scripts/install-test-deps "
                           "(Debian packages influxdb and influxdb-client)")
    return path


class Influx(ServiceProcess):
    """An influxd process (no auth): `url` (http://127.0.0.1:PORT), `create_db`, `query`,
    `influx` (the CLI), and `stop()` (SIGTERM) / `kill()` (SIGKILL) / `start()` (again, same
    ports and directory)."""

    def __init__(self, port=None, start=True):
        self.influxd = need_influx()
        self.host = HOST
        self.port = port or free_port()
        self.rpc_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="influx-")
        self.config = os.path.join(self.dir, "influxdb.conf")
        self.log = open(os.path.join(self.dir, "influxd.log"), "ab")
        self.proc = None
        d = self.dir
        with open(self.config, "w") as f:
            # Upstream 1.x reads reporting-disabled, Debian's build reporting-enabled; both
            # ignore the other's key.
            f.write(f"""reporting-disabled = true
reporting-enabled = false
bind-address = "{HOST}:{self.rpc_port}"
[meta]
  dir = "{d}/meta"
[data]
  dir = "{d}/data"
  wal-dir = "{d}/wal"
[monitor]
  store-enabled = false
[http]
  bind-address = "{HOST}:{self.port}"
[ifql]
  enabled = false
""")
        atexit.register(self.stop)
        if start:
            self.start()

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    def where(self):
        return self.url

    def start(self, timeout=15.0):
        """Starts influxd (again: same ports, same directory) and waits until /ping answers 204."""
        if self.running():
            raise RuntimeError(f"{self!r} is already running (pid {self.pid})")
        cmd = [self.influxd, "-config", self.config]
        self.log.write(f"---- start: {' '.join(cmd)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(cmd, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        last = "no answer"
        while True:
            if not self.running():
                raise RuntimeError(f"influxd on port {self.port} exited with code "
                                   f"{self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=1) as r:
                    if r.status == 204:
                        return self
                    last = f"HTTP {r.status}"
            except OSError as e:
                last = str(e)
            if time.time() > deadline:
                self.kill()
                raise RuntimeError(f"influxd on port {self.port} not ready within {timeout}s "
                                   f"({last}):\n{self.log_text()[-3000:]}")
            time.sleep(0.05)

    def _query(self, q, db=None, timeout=10):
        """POSTs `q` to /query; returns the JSON answer's results, raising on any error in it."""
        form = {"q": q, **({"db": db} if db else {})}
        req = urllib.request.Request(f"{self.url}/query",
                                     data=urllib.parse.urlencode(form).encode())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                answer = json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"InfluxDB query {q!r}: HTTP {e.code}: {e.read().decode()}") from None
        errors = [answer.get("error")] + [res.get("error") for res in answer.get("results", [])]
        if any(errors):
            raise RuntimeError(f"InfluxDB query {q!r}: {'; '.join(filter(None, errors))}")
        return answer["results"]

    def create_db(self, name):
        self._query(f'CREATE DATABASE "{name}"')

    def query(self, db, q):
        """Runs InfluxQL `q` in `db` over HTTP; returns the rows (values) of all series, in order,
        times as RFC 3339 strings."""
        return [row for res in self._query(q, db) for s in res.get("series", [])
                for row in s["values"]]

    def influx(self, db, q, timeout=30):
        """Runs `q` with the real influx CLI (-format csv); returns its stdout without the final
        newline. Raises with its output on failure."""
        if shutil.which("influx") is None:
            raise RuntimeError("influx not found on PATH: run scripts/install-test-deps "
                               "(Debian package influxdb-client)")
        cmd = ["influx", "-host", self.host, "-port", str(self.port), "-database", db,
               "-execute", q, "-format", "csv"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"influx failed ({r.returncode}) on {q!r}:\n{r.stdout}{r.stderr}")
        return r.stdout.rstrip("\n")

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()
