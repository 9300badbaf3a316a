"""A real PostgreSQL for the tests: a cluster of its own in a temporary directory, on a free
loopback port, looked into with the real `psql` client.

Needs the Debian `postgresql` package (initdb, postgres and psql under /usr/lib/postgresql/VER/bin;
scripts/install-test-deps installs it). As root the server runs as the `postgres` OS user, since
PostgreSQL refuses to run as root. Usable outside pytest too:

    with Postgres() as pg:
        pg.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
        pg.stop(); time.sleep(20); pg.start()   # same port, same data
        pg.psql("SELECT v FROM t")              # '1'
"""
import atexit
import glob
import os
import pwd
import signal
import subprocess
import tempfile
import time

from ports import free_port
from serviceproc import ServiceProcess

HOST = "127.0.0.1"
USER = "braid"
DATABASE = "iot"


def need_postgres():
    """The bin directory of the newest PostgreSQL under /usr/lib/postgresql; raises if none."""
    found = [os.path.dirname(p) for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")
             if os.access(os.path.join(os.path.dirname(p), "postgres"), os.X_OK)]
    if not found:
        raise RuntimeError("PostgreSQL not found (no /usr/lib/postgresql/*/bin/initdb): run "
                           "scripts/install-test-deps (Debian package postgresql)")
    return max(found, key=lambda d: [int(x) if x.isdigit() else 0
                                     for x in d.split("/")[-2].split(".")])


class Postgres(ServiceProcess):
    """A postgres server: `url` (postgres://braid@127.0.0.1:PORT/iot; trust auth, braid is a
    superuser owning database iot), `psql(sql)`, and `stop()` (fast shutdown) / `kill()`
    (SIGKILL to the server and its backends) / `start()` (again, same port and directory)."""

    # Fast shutdown: rolls back open transactions, checkpoints.
    stop_signal = signal.SIGINT

    def __init__(self, port=None, start=True):
        self.bin = need_postgres()
        self.host = HOST
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="postgres-")
        self.data = os.path.join(self.dir, "data")
        self.log = open(os.path.join(self.dir, "postgres.log"), "ab")
        self.proc = None
        # PostgreSQL refuses root: run it as the postgres user, which must own the directory.
        self.run_as = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self.run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        atexit.register(self.stop)
        try:
            self._server_cmd("initdb", "-D", self.data, "-U", USER, "-A", "trust", "-E", "UTF8",
                             "--no-locale", "--no-sync")
            if start:
                self.start()
                self.psql(f"CREATE DATABASE {DATABASE} OWNER {USER}", db="postgres")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self):
        return f"postgres://{USER}@{self.host}:{self.port}/{DATABASE}"


    def _server_cmd(self, name, *args):
        """Runs a server-side tool (initdb) as the server's user; raises with its output."""
        r = subprocess.run([os.path.join(self.bin, name), *args], cwd=self.dir,
                           capture_output=True, text=True, timeout=60, **self.run_as)
        if r.returncode != 0:
            raise RuntimeError(f"{name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")

    def start(self, timeout=15.0):
        """Starts postgres (again: same port, same directory) and waits until it accepts
        connections. In a session of its own, so kill() can take its backends too."""
        if self.running():
            raise RuntimeError(f"{self!r} is already running (pid {self.pid})")
        cmd = [os.path.join(self.bin, "postgres"), "-D", self.data, "-p", str(self.port),
               "-k", self.dir, "-c", f"listen_addresses={self.host}", "-c", "fsync=off"]
        self.log.write(f"---- start: {' '.join(cmd)}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(cmd, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     **self.run_as)
        deadline = time.time() + timeout
        while True:
            if not self.running():
                raise RuntimeError(f"postgres on port {self.port} exited with code "
                                   f"{self.proc.returncode}:\n{self.log_text()[-3000:]}")
            ready = subprocess.run(
                [os.path.join(self.bin, "pg_isready"), "-q", "-h", self.host, "-p", str(self.port),
                 "-U", USER, "-d", "postgres", "-t", "1"], timeout=10)
            if ready.returncode == 0:
                return self
            if time.time() > deadline:
                raise RuntimeError(f"postgres on port {self.port} not ready within {timeout}s:\n"
                                   f"{self.log_text()[-3000:]}")
            time.sleep(0.05)

    def kill(self):
        """SIGKILL to the postmaster and its backends, as if the machine had died; start() then
        recovers from the WAL."""
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def psql(self, sql, db=DATABASE, timeout=30):
        """Runs `sql` with the real psql client (-At: unaligned, tuples only); returns its stdout
        without the final newline. Raises with psql's stderr on failure."""
        cmd = [os.path.join(self.bin, "psql"), "-h", self.host, "-p", str(self.port), "-U", USER,
               "-d", db, "-X", "-At", "-c", sql]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PGCONNECT_TIMEOUT": "5"})
        if r.returncode != 0:
            raise RuntimeError(f"psql failed ({r.returncode}) on {sql!r}:\n{r.stderr}")
        return r.stdout.rstrip("\n")

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()
