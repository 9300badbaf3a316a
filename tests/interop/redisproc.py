"""Redis processes for the cluster tests: a standalone `RedisServer` and a 3-master `RedisCluster`,
each on free loopback ports in temporary directories of their own.

Needs `redis-server` and `redis-cli` on PATH (Debian `redis-server` and `redis-tools`, installed
by scripts/install-test-deps). Usable outside pytest too:

    with RedisServer() as r:
        r.cli("SET", "k", "v")
        r.kill()          # SIGKILL
        r.start()         # same port and directory: the AOF brings "k" back
"""
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from urllib.parse import quote

from ports import free_port
from serviceproc import ServiceProcess

HOST = "127.0.0.1"


def _need(binary):
    if shutil.which(binary) is None:
        raise RuntimeError(f"{binary} not found on PATH: run scripts/install-test-deps "
                           "(Debian packages redis-server and redis-tools)")


def _resp(sock, *args):
    """Sends one command in RESP and returns the first reply line (without CRLF), e.g. '+PONG'."""
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    sock.sendall(b"".join(out))
    buf = b""
    while not buf.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("connection closed")
        buf += chunk
    return buf.split(b"\r\n", 1)[0].decode(errors="replace")


class RedisServer(ServiceProcess):
    """A redis-server process: `url` to hand to Braid, `cli(...)` to look inside, and
    `stop()` (SIGTERM) / `kill()` (SIGKILL) / `start()` (again, same port and directory).

    appendonly: AOF with `appendfsync everysec` (a kill loses at most about the last second).
    password:   `requirepass` for the default user; url is redis://:PASSWORD@host:port.
    acl_user:   (user, password): an ACL user with full access while the default user is off;
                url is redis://USER:PASSWORD@host:port.
    extra_args: more redis-server arguments, e.g. ("--maxmemory", "10mb").
    tls:        (cert_file, key_file, ca_file): TLS only (no plain TCP port), clients not asked
                for certificates; `port` is the TLS port and url is rediss://host:port.
    """

    # On SIGTERM Redis fsyncs its AOF and exits.
    stop_timeout = 10.0

    def __init__(self, appendonly=True, password=None, acl_user=None, port=None, extra_args=(),
                 start=True, tls=None):
        _need("redis-server")
        _need("redis-cli")
        self.host = HOST
        self.port = port or free_port()
        self.appendonly = appendonly
        self.password = password
        self.acl_user = acl_user
        self.extra_args = list(extra_args)
        self.tls = tuple(tls) if tls else None
        self.dir = tempfile.mkdtemp(prefix="redis-data-")
        self.log = tempfile.NamedTemporaryFile(prefix="redis-", suffix=".log", delete=False)
        self.proc = None
        if start:
            self.start()

    # ---- addresses ----------------------------------------------------------------------------

    @property
    def url(self):
        scheme = "rediss" if self.tls else "redis"
        if self.acl_user:
            user, pw = self.acl_user
            return f"{scheme}://{quote(user, safe='')}:{quote(pw, safe='')}@{self.host}:{self.port}"
        if self.password:
            return f"{scheme}://:{quote(self.password, safe='')}@{self.host}:{self.port}"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def addr(self):
        return f"{self.host}:{self.port}"

    def where(self):
        return self.addr

    # ---- process ------------------------------------------------------------------------------

    def command(self):
        if self.tls:
            cert, key, ca = self.tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert,
                     "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"]
        else:
            ports = ["--port", str(self.port)]
        cmd = ["redis-server",
               "--bind", self.host, *ports, "--dir", self.dir,
               "--save", "", "--appendonly", "yes" if self.appendonly else "no",
               "--appendfsync", "everysec", "--protected-mode", "no", "--daemonize", "no"]
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.acl_user:
            user, pw = self.acl_user
            cmd += ["--user", "default", "off", "resetpass", "nocommands",
                    "--user", user, "on", ">" + pw, "~*", "&*", "+@all"]
        return cmd + self.extra_args

    def start(self, timeout=10.0):
        """Starts redis-server (again: same port, same directory, so AOF data is loaded)."""
        if self.running():
            raise RuntimeError(f"redis-server on {self.addr} is already running (pid {self.pid})")
        self.log.write(f"---- start: {' '.join(self.command())}\n".encode())
        self.log.flush()
        self.proc = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout=10.0):
        """Waits until PING answers PONG (authenticating first if needed; loading the AOF counts
        as not ready)."""
        deadline = time.time() + timeout
        last = "no answer"
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on {self.addr} exited with code "
                                   f"{self.proc.returncode}:\n{self.log_text()[-3000:]}")
            try:
                with self._socket(timeout=0.5) as s:
                    if self.acl_user:
                        last = _resp(s, "AUTH", *self.acl_user)
                    elif self.password:
                        last = _resp(s, "AUTH", self.password)
                    if not last.startswith("-"):
                        last = _resp(s, "PING")
                        if last == "+PONG":
                            return
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.addr} not ready within {timeout}s ({last})")

    def _socket(self, timeout):
        """A connection to the server: plain TCP, or TLS checked against the tls CA."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        if not self.tls:
            return s
        try:
            return ssl.create_default_context(cafile=self.tls[2]).wrap_socket(
                s, server_hostname=self.host)
        except BaseException:
            s.close()
            raise


    # ---- inspection ---------------------------------------------------------------------------

    def cli_args(self):
        args = ["redis-cli", "-h", self.host, "-p", str(self.port), "--no-auth-warning"]
        if self.tls:
            args += ["--tls", "--cacert", self.tls[2]]
        if self.acl_user:
            args += ["--user", self.acl_user[0], "--pass", self.acl_user[1]]
        elif self.password:
            args += ["-a", self.password]
        return args

    def cli(self, *args, check=True, timeout=10):
        """Runs redis-cli against this server; returns its stdout without the final newline.
        With check, a non-zero exit (e.g. connection refused) raises CalledProcessError."""
        r = subprocess.run(self.cli_args() + [str(a) for a in args], capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
        return r.stdout.rstrip("\n")

    def log_text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()


class RedisCluster:
    """A Redis Cluster of `n` masters (no replicas) on free loopback ports: `urls` (seed URLs for
    cluster.redis), `nodes` (RedisServer objects: kill/stop/start one), `cli(...)` (redis-cli -c
    on the first node), `stop()`."""

    def __init__(self, n=3, appendonly=True, node_timeout_ms=2000, timeout=30.0):
        if n < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.nodes = []
        try:
            for _ in range(n):
                bus = free_port()
                self.nodes.append(RedisServer(
                    appendonly=appendonly,
                    extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                "--cluster-node-timeout", str(node_timeout_ms),
                                # The bus port explicitly: the default port+10000 may be > 65535.
                                "--cluster-port", str(bus)]))
            create = ["redis-cli", "--cluster", "create", *[s.addr for s in self.nodes],
                      "--cluster-replicas", "0", "--cluster-yes"]
            r = subprocess.run(create, capture_output=True, text=True, timeout=timeout)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(create)} failed ({r.returncode}):\n"
                                   f"{r.stdout}\n{r.stderr}")
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self):
        return [s.url for s in self.nodes]

    def wait_ok(self, timeout=30.0):
        """Waits until CLUSTER INFO says cluster_state:ok on every running node."""
        deadline = time.time() + timeout
        states = {}
        while time.time() < deadline:
            states = {}
            for s in self.nodes:
                if not s.running():
                    continue
                info = s.cli("CLUSTER", "INFO", check=False)
                states[s.addr] = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                                       if line.startswith("cluster_state:")), "?")
            if states and all(v == "ok" for v in states.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"Redis Cluster not ok within {timeout}s: {states}")

    def cli(self, *args, check=True):
        """redis-cli -c (follows MOVED redirections) against the first running node."""
        node = next(s for s in self.nodes if s.running())
        r = subprocess.run(node.cli_args() + ["-c"] + [str(a) for a in args],
                           capture_output=True, text=True, timeout=10)
        if check and r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
        return r.stdout.rstrip("\n")

    def stop(self):
        for s in self.nodes:
            if s.running():
                s.proc.send_signal(signal.SIGTERM)
        for s in self.nodes:
            s.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
