"""A real Apache Kafka for the Kafka bridge tests: one KRaft node (broker and controller in one JVM,
no ZooKeeper) that scripts/services runs on free loopback ports, looked into with Kafka's own
console producer and consumer, independent of any Rust client.

Needs Java 17 and Kafka's jars from Maven Central (scripts/install-test-deps fetches them with
`scripts/services kafka fetch`). Usable outside pytest too:

    with KafkaServer(tmp_path, sasl=True, tls=True) as k:
        k.create_topic("t", partitions=3)
        k.produce("t", ["just a value", ("key", "value"), ("key", "value", {"h": "v"})])
        k.consume("t", 3, timeout=10)    # [Record(key=b'key', value=b'value', ...), ...]
        k.group_offsets("g")             # what group g committed: {("t", 0): 3}
        k.stop(); time.sleep(20); k.start()   # same ports, same data

Clients (`client=`): "plain" (PLAINTEXT, always there), and with sasl=True "sasl" (SCRAM-SHA-256)
and "sasl-plain" (PLAIN), with tls=True "ssl", with both "sasl-ssl" (SCRAM-SHA-256 over TLS).
Records go through the console tools as lines of UTF-8 text: what `produce` sends may not contain
line breaks; what `consume` returns are bytes, line breaks and all (a header key must not contain
':', which the console consumer puts between a header's key and value).
"""
import atexit
import dataclasses
import os
import shlex
import signal
import subprocess
import tempfile

from serviceproc import ServiceProcess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "services")

# Separators for the console tools' line formats: a control character that no test data has,
# between two '~' (the tools trim their settings' whitespace and control characters away, and the
# producer reads headers.separator as a regular expression).
_KEY_SEP = "~\x1f~"      # producer: key | value; consumer: between all fields
_HEADERS_END = "~\x1e~"  # producer: headers | key
_HEADER_SEP = "~\x1d~"   # between headers
_HEADER_KV = "~\x1c~"    # producer: header key | header value (the consumer always prints ':')
_NULL = "~\x1a~"         # a null key, value or header value, and no headers at all
_LINE_END = "~\x1b~"     # consumer: after each record


@dataclasses.dataclass
class Record:
    """One record as Kafka's console consumer saw it. key and value are bytes or None; headers is a
    list of (key, bytes or None) in order."""
    key: bytes | None
    value: bytes | None
    headers: list
    partition: int
    offset: int
    timestamp: int | None


class KafkaError(RuntimeError):
    pass


def _text(x, what):
    if x is None:
        return _NULL
    s = x.decode() if isinstance(x, bytes) else str(x)
    if "\n" in s or "\r" in s:
        raise ValueError(f"{what} {s!r}: the console producer reads lines, no line breaks please")
    if any(c in s for c in "\x1a\x1b\x1c\x1d\x1e\x1f"):
        raise ValueError(f"{what} {s!r}: control characters \\x1a-\\x1f make the separators")
    return s


class KafkaServer(ServiceProcess):
    """A Kafka node in `<tmpdir>/kafka` (a temporary directory of its own without tmpdir).

    Addresses: bootstrap (PLAINTEXT), sasl_bootstrap, ssl_bootstrap, sasl_ssl_bootstrap (None when
    not asked for). Credentials: sasl_user, sasl_password (PLAIN, SCRAM-SHA-256 and -512 alike);
    ca (PEM file of the CA that signed the server's certificate, for 127.0.0.1 and localhost),
    client_cert / client_key (PEM, signed by that CA; the server asks for one but does not require
    it), truststore (PKCS12, password truststore_password). Also pid, dir, log.
    """

    def __init__(self, tmpdir=None, sasl=False, tls=False, start=True, timeout=90):
        self.dir = os.path.join(str(tmpdir), "kafka") if tmpdir else tempfile.mkdtemp(prefix="kafka-")
        os.makedirs(self.dir, exist_ok=True)
        self.sasl, self.tls = sasl, tls
        self.state = {}
        # The node runs in a session of its own: don't leave it behind if a test forgets stop().
        atexit.register(self._atexit)
        if start:
            self.up(timeout)

    # ---- the node -----------------------------------------------------------------------------

    def _script(self, *args, input=None, timeout=60, check=True):
        """Runs scripts/services kafka ARGS in a process group of its own (the JVM goes with it on a
        timeout); returns the CompletedProcess, with bytes stdout and stderr."""
        cmd = [SCRIPT, "kafka", *args]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise KafkaError(f"{shlex.join(cmd)} did not finish within {timeout}s\nstderr:\n"
                             f"{err.decode(errors='replace')[-3000:]}{self._log_tail()}")
        r = subprocess.CompletedProcess(cmd, p.returncode, out, err)
        if check and r.returncode != 0:
            raise KafkaError(f"{shlex.join(cmd)} failed ({r.returncode})\nstdout:\n"
                             f"{out.decode(errors='replace')[-2000:]}\nstderr:\n"
                             f"{err.decode(errors='replace')[-3000:]}{self._log_tail()}")
        return r

    def _load_state(self):
        path = os.path.join(self.dir, "state")
        if os.path.exists(path):
            with open(path) as f:
                self.state = dict(shlex.split(line)[0].split("=", 1) for line in f
                                  if line.strip() and not line.startswith("#"))

    def _launch(self, *args, timeout):
        """up or start; a node that started but did not answer in time is stopped again."""
        try:
            self._script(*args, "--dir", self.dir, timeout=timeout)
        except BaseException:
            self._load_state()
            self._atexit()
            raise
        finally:
            self._load_state()

    def up(self, timeout=90):
        """Formats and starts a new node (what was in the directory before goes)."""
        opts = ["--sasl"] * self.sasl + ["--tls"] * self.tls
        for attempt in range(3):
            try:
                self._launch("up", *opts, timeout=timeout)
                return self
            except KafkaError as e:
                # Another process took one of the free ports first: pick new ones.
                if attempt == 2 or "Address already in use" not in str(e):
                    raise

    def start(self, timeout=90):
        """Starts the node again after stop() or kill(): same ports, settings and data."""
        self._launch("start", timeout=timeout)
        return self

    def stop(self, timeout=60):
        """SIGTERM (a controlled shutdown) and waits; SIGKILL after 30 s. The data stays."""
        if os.path.exists(os.path.join(self.dir, "state")):
            self._script("down", "--dir", self.dir, timeout=timeout)
            self._load_state()

    def kill(self):
        """SIGKILL: what Kafka has not flushed yet may be lost (it writes to the page cache)."""
        self._script("kill", "--dir", self.dir)
        self._load_state()

    def _atexit(self):
        if self.state.get("PID"):
            try:
                self._script("down", "--dir", self.dir, check=False)
            except KafkaError:
                pass

    def running(self):
        return self._script("status", "--dir", self.dir, check=False).returncode == 0


    def __repr__(self):
        return f"<KafkaServer {self.bootstrap} pid={self.pid} dir={self.dir}>"

    def _get(self, key):
        return self.state.get(key) or None

    bootstrap = property(lambda self: self._get("BOOTSTRAP"))
    sasl_bootstrap = property(lambda self: self._get("SASL_BOOTSTRAP"))
    ssl_bootstrap = property(lambda self: self._get("SSL_BOOTSTRAP"))
    sasl_ssl_bootstrap = property(lambda self: self._get("SASL_SSL_BOOTSTRAP"))
    sasl_user = property(lambda self: self._get("SASL_USER"))
    sasl_password = property(lambda self: self._get("SASL_PASSWORD"))
    ca = property(lambda self: self._get("CA"))
    client_cert = property(lambda self: self._get("CLIENT_CERT"))
    client_key = property(lambda self: self._get("CLIENT_KEY"))
    truststore = property(lambda self: self._get("TRUSTSTORE"))
    truststore_password = property(lambda self: self._get("TRUSTSTORE_PASSWORD"))
    pid = property(lambda self: int(self.state["PID"]) if self.state.get("PID") else None)
    log = property(lambda self: os.path.join(self.dir, "kafka.log"))

    def log_text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def _log_tail(self, lines=40):
        tail = self.log_text().splitlines()[-lines:]
        return f"\nend of {self.log}:\n" + "\n".join(tail) if tail else ""

    # ---- Kafka's own tools --------------------------------------------------------------------

    def create_topic(self, name, partitions=1, config=None, client="plain", timeout=60):
        """Creates a topic (replication factor 1); config: topic settings, e.g.
        {"cleanup.policy": "compact"}."""
        args = ["--create", "--topic", name, "--partitions", str(partitions), "--replication-factor", "1"]
        for k, v in (config or {}).items():
            args += ["--config", f"{k}={v}"]
        self._script("topics", "--dir", self.dir, "--client", client, *args, timeout=timeout)

    def topics(self, client="plain", timeout=60):
        out = self._script("topics", "--dir", self.dir, "--client", client, "list", timeout=timeout).stdout
        return out.decode().split()

    def produce(self, topic, records, client="plain", timeout=60):
        """Sends records with the console producer (acks=all) and waits until they are written.
        Each record: a value, or (key, value), or (key, value, headers) with headers a dict or a list
        of (key, value) pairs; values and keys are str or bytes (UTF-8) or None (null)."""
        lines = []
        for r in records:
            key, value, headers = (None, r, None) if not isinstance(r, tuple) else (tuple(r) + (None,))[:3]
            if isinstance(headers, dict):
                headers = list(headers.items())
            h = _HEADER_SEP.join(_text(k, "header key") + _HEADER_KV + _text(v, "header value")
                                 for k, v in headers) if headers else _NULL
            lines.append(h + _HEADERS_END + _text(key, "key") + _KEY_SEP + _text(value, "value") + "\n")
        props = {"parse.key": "true", "key.separator": _KEY_SEP, "parse.headers": "true",
                 "headers.delimiter": _HEADERS_END, "headers.separator": _HEADER_SEP,
                 "headers.key.separator": _HEADER_KV, "null.marker": _NULL}
        args = [a for k, v in props.items() for a in ("--reader-property", f"{k}={v}")]
        r = self._script("produce", "--dir", self.dir, "--client", client, topic,
                         "--max-block-ms", str(int(timeout * 1000)), *args,
                         input="".join(lines).encode(), timeout=timeout + 30)
        if b"Error when sending message" in r.stderr:
            raise KafkaError(f"the console producer could not send to {topic}:\n"
                             f"{r.stderr.decode(errors='replace')[-3000:]}{self._log_tail()}")

    def consume(self, topic, n, timeout=30, from_beginning=True, client="plain", group=None):
        """Reads up to n records with the console consumer (its own new group unless `group`); stops
        after n, or when no record came for `timeout` seconds. Returns [Record] in the order read
        (per partition in offset order)."""
        props = {"print.timestamp": "true", "print.partition": "true", "print.offset": "true",
                 "print.headers": "true", "print.key": "true", "key.separator": _KEY_SEP,
                 "line.separator": _LINE_END, "headers.separator": _HEADER_SEP, "null.literal": _NULL}
        args = [topic, "--max-messages", str(n), "--timeout-ms", str(int(timeout * 1000))]
        args += [a for k, v in props.items() for a in ("--formatter-property", f"{k}={v}")]
        if from_beginning:
            args.append("--from-beginning")
        if group:
            args += ["--group", group]
        r = self._script("consume", "--dir", self.dir, "--client", client, *args,
                         timeout=timeout + 60, check=False)
        # Fewer than n records: ConsoleConsumer logs a TimeoutException (and exits with 0 in 4.4).
        if r.returncode != 0 and b"TimeoutException" not in r.stderr:
            raise KafkaError(f"the console consumer failed on {topic} ({r.returncode}):\n"
                             f"{r.stderr.decode(errors='replace')[-3000:]}{self._log_tail()}")
        return [self._parse(chunk) for chunk in r.stdout.split(_LINE_END.encode()) if chunk]

    def group_offsets(self, group, client="plain", timeout=60):
        """The offsets consumer group `group` has committed, as Kafka's kafka-consumer-groups tool
        (ConsumerGroupCommand --describe --offsets) shows them: {(topic, partition): offset}, the
        next offset the group reads; {} for a group Kafka does not know (yet). A partition the
        group has not committed for is left out."""
        props = os.path.join(self.dir, f"client-{client}.properties")
        with open(props) as f:
            bootstrap = next(line.split("=", 1)[1].strip() for line in f
                             if line.startswith("bootstrap.servers="))
        r = self._script("java", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                         "--bootstrap-server", bootstrap, "--command-config", props,
                         "--describe", "--offsets", "--group", group,
                         "--timeout", str(int(timeout * 1000)), timeout=timeout + 30, check=False)
        out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        if "GroupIdNotFoundException" in out + err:
            return {}
        # The tool reports its failures on stdout ("Error: ...") and may still exit with 0.
        if r.returncode != 0 or out.lstrip().startswith("Error"):
            raise KafkaError(f"kafka-consumer-groups --describe --group {group} failed "
                             f"({r.returncode}):\n{out[-2000:]}\n{err[-2000:]}{self._log_tail()}")
        offsets = {}
        for line in out.splitlines():
            cols = line.split()
            # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
            if len(cols) >= 4 and cols[0] == group and cols[2].isdigit() and cols[3].isdigit():
                offsets[(cols[1], int(cols[2]))] = int(cols[3])
        return offsets

    @staticmethod
    def _parse(chunk):
        null, sep = _NULL.encode(), _KEY_SEP.encode()
        ts, partition, offset, headers, key, value = chunk.split(sep, 5)
        hs = []
        if headers != b"NO_HEADERS":
            for h in headers.split(_HEADER_SEP.encode()):
                k, v = h.split(b":", 1)
                hs.append((k.decode(), None if v == null else v))
        ts = ts.rpartition(b":")[2]   # CreateTime:MS, LogAppendTime:MS or NO_TIMESTAMP
        return Record(key=None if key == null else key, value=None if value == null else value,
                      headers=hs, partition=int(partition.split(b":")[1]),
                      offset=int(offset.split(b":")[1]), timestamp=int(ts) if ts.isdigit() else None)
