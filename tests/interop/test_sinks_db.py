"""Rule sinks (`[[sinks]]`, docs/rules.md) writing to real databases: PostgreSQL (pgproc.py),
Redis (redisproc.py) and InfluxDB 1.x (influxproc.py), each run by the test, read back with the
database's own client (psql, redis-cli, the influx CLI). Publishers are paho and mosquitto_pub.

What is checked is what a user sees:

* postgres: a rule's outputs become rows, each value converted to its column's type (a float, a
  text, a jsonb of the whole payload, a timestamptz from `timestamp`); a row the database refuses
  (a CHECK, a NOT NULL, a value of the wrong type) is counted `failed` in /api/v1/sinks and
  /metrics, not written again, and the rows after it still arrive.
* The outbox: PostgreSQL stopped for 20 s mid-stream loses no acknowledged message (PUBACKs go
  on meanwhile, the sink reads `down` and `retried` grows), and no row is written twice; with
  1,000 outputs waiting in the outbox, a `kill -9` of Braid loses none of them.
* redis: HSET and XADD, one command per output; a command Redis refuses (WRONGTYPE) is counted
  failed and the rest flows.
* influxdb: points in line protocol; a malformed point (an unquoted string field value) is
  counted failed and the points after it arrive.
* A refused output inside a batch (the backlog after an outage) counts alone: the others arrive
  and count sent (InfluxDB answers "partial write" for the whole batch: the sink writes its
  points again one by one to tell which it refused).
"""
import json
import subprocess
import threading
import time

import pytest

from helpers import mosquitto_pub, wait_until
from influxproc import Influx
from pgproc import Postgres
from test_admin_api import Api, admin_broker, metric

pytestmark = pytest.mark.braid_only

SINK_WAIT = 15.0   # seconds an output gets to reach a target that is up


# --------------------------------------------------------------------------------------------------
# Services and the sink's counters
# --------------------------------------------------------------------------------------------------

@pytest.fixture
def pg():
    p = Postgres()
    yield p
    p.remove()


@pytest.fixture
def influx():
    db = Influx()
    db.create_db("iot")
    yield db
    db.remove()


def sink_stats(port, name):
    """The entry of sink `name` in GET /api/v1/sinks."""
    status, body = Api(port).get("/api/v1/sinks")
    assert status == 200, f"GET /api/v1/sinks: {status} {body}"
    found = [s for s in body["data"] if s["name"] == name]
    assert len(found) == 1, f"sink {name!r} not (once) in /api/v1/sinks: {body}"
    return found[0]


def sink_log(broker, last=25):
    """The broker's last `last` log lines about sinks, for failure messages."""
    lines = [line for line in broker.log_text().splitlines() if "sink" in line]
    return f"\n---- {broker.log.name} (sink lines) ----\n" + "\n".join(lines[-last:])


def wait_sink(broker, port, name, ok, timeout=SINK_WAIT, what="the expected counters"):
    """Polls /api/v1/sinks until `ok(entry)` holds for sink `name`; returns the entry. (An output
    counts `sent` a moment before it leaves the outbox's `queued`: wait for both.)"""
    deadline = time.monotonic() + timeout
    while True:
        entry = sink_stats(port, name)
        if ok(entry):
            return entry
        if time.monotonic() > deadline:
            raise AssertionError(f"sink {name}: not {what} within {timeout}s: {entry}{sink_log(broker)}")
        time.sleep(0.05)


def poll(read, ok, timeout, what, broker=None):
    """Polls `read()` until `ok(value)`; returns the value, or fails showing the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout}s"
                                 + (sink_log(broker) if broker else ""))
        time.sleep(0.1)


def count(pg, table, what="count(*)"):
    return int(pg.psql(f"SELECT {what} FROM {table}"))


def pub_cli(broker, client_id, topic, payload):
    """mosquitto_pub, QoS 1 (it exits 0 once PUBACK came)."""
    mosquitto_pub(broker, topic, json.dumps(payload), qos=1, extra=["-i", client_id], timeout=10)


# --------------------------------------------------------------------------------------------------
# 1. postgres: rows with typed values; refused rows counted, the rest flows
# --------------------------------------------------------------------------------------------------

READINGS = """CREATE TABLE readings (
    id       text PRIMARY KEY,
    clientid text NOT NULL,
    temp     double precision NOT NULL CHECK (temp < 1000),
    hum      real,
    unit     text NOT NULL,
    doc      jsonb NOT NULL,
    ts       timestamptz NOT NULL)"""


def test_postgres_rows_typed_and_refused_rows_counted_failed(make_broker, connect, pg):
    pg.psql(READINGS)
    rules = [{"name": "hot", "actions": ["pg_hot"],
              "sql": 'SELECT id, clientid, payload.temp AS temp, payload.hum AS hum, payload.unit AS unit, '
                     'json_decode(payload) AS doc, timestamp FROM "sensors/+/temp" WHERE payload.temp > 30'}]
    sinks = [{"name": "pg_hot", "type": "postgres", "url": pg.url,
              "sql": "INSERT INTO readings(id, clientid, temp, hum, unit, doc, ts) "
                     "VALUES (${id}, ${clientid}, ${temp}, ${hum}, ${unit}, ${doc}, ${timestamp})"}]
    b, port = admin_broker(make_broker, rules=rules, sinks=sinks)
    dev1 = connect(b, client_id="dev1")
    first = {"temp": 31.5, "hum": 40.25, "unit": "C", "tags": ["a", "b"], "loc": {"room": "lab"}}
    t0 = time.time()
    dev1.publish("sensors/dev1/temp", json.dumps(first), qos=1)
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 20, "unit": "C"})      # WHERE: no row
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 45, "unit": "C"})      # no hum: NULL
    t1 = time.time()
    poll(lambda: count(pg, "readings"), lambda n: n == 2, SINK_WAIT, "rows in readings", b)
    rows = pg.psql("SELECT clientid, temp, hum, unit, doc::text, extract(epoch FROM ts) * 1000, "
                   "pg_typeof(temp), pg_typeof(doc), pg_typeof(ts), id FROM readings ORDER BY temp")
    (c1, temp1, hum1, unit1, doc1, ms1, *types1, id1), (c2, temp2, hum2, unit2, doc2, ms2, *_, id2) = \
        [r.split("|") for r in rows.splitlines()]
    assert (c1, float(temp1), float(hum1), unit1) == ("dev1", 31.5, 40.25, "C"), rows
    assert (c2, float(temp2), hum2, unit2) == ("dev2", 45.0, "", "C"), rows
    assert json.loads(doc1) == first, rows
    assert json.loads(doc2) == {"temp": 45, "unit": "C"}, rows
    assert types1 == ["double precision", "jsonb", "timestamp with time zone"], rows
    for ms in (ms1, ms2):   # `timestamp` (ms since the epoch) as a timestamptz: the publish time
        assert t0 * 1000 - 1000 <= float(ms) <= t1 * 1000 + 1000, (rows, t0, t1)
    assert id1 != id2 and all(ch in "0123456789abcdef" for ch in id1 + id2), rows

    # Rows the database refuses for good: counted failed, not retried, the next ones arrive.
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 5000, "unit": "C"}), qos=1)   # CHECK
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 50})                             # NOT NULL unit
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 60, "hum": "wet", "unit": "C"}), qos=1)  # real
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 70.5, "unit": "F"}), qos=1)
    pub_cli(b, "dev3", "sensors/dev3/temp", {"temp": 99, "unit": "K"})
    s = wait_sink(b, port, "pg_hot", lambda s: s["sent"] + s["failed"] == 7 and s["queued"] == 0,
                   what="7 outputs done, none queued")
    assert (s["sent"], s["failed"], s["retried"], s["dropped"], s["queued"], s["kind"], s["state"]) == \
        (4, 3, 0, 0, 0, "postgres", "up"), f"{s}{sink_log(b)}"
    rows = pg.psql("SELECT clientid, temp, unit FROM readings ORDER BY temp")
    assert rows.splitlines() == ["dev1|31.5|C", "dev2|45|C", "dev1|70.5|F", "dev3|99|K"], f"{rows}{sink_log(b)}"
    status, text = Api(port).get("/metrics", raw=True)
    labels = {"kind": "postgres", "sink": "pg_hot"}
    assert metric(text, "braid_sink_failed_total", **labels) == 3
    assert metric(text, "braid_sink_sent_total", **labels) == 4
    assert metric(text, "braid_sink_up", **labels) == 1
    assert "readings_temp_check" in b.log_text(), sink_log(b)   # the first refusal is logged, with why
    status, body = Api(port).get("/api/v1/rules")
    [rule] = body["data"]
    assert (rule["matched"], rule["passed"], rule["failed"]) == (7, 7, 0), rule


# --------------------------------------------------------------------------------------------------
# 2. postgres stopped for 20 s mid-stream
# --------------------------------------------------------------------------------------------------

class Stream(threading.Thread):
    """Publishes {"seq": i} QoS 1 on `topic` at `rate` a second with paho, each waiting for its
    PUBACK (up to 10 s), until stop(). acked / unacked: the seqs; waits: PUBACK waits (s)."""

    def __init__(self, client, topic, rate):
        super().__init__(daemon=True)
        self.client, self.topic, self.rate = client, topic, rate
        self.acked, self.unacked, self.waits = [], [], []
        self._stop_ev = threading.Event()

    def run(self):
        t0, i = time.monotonic(), 0
        while not self._stop_ev.is_set():
            start = time.monotonic()
            info = self.client.publish(self.topic, json.dumps({"seq": i}), qos=1, wait=False)
            info.wait_for_publish(10)
            (self.acked if info.is_published() else self.unacked).append(i)
            self.waits.append(time.monotonic() - start)
            i += 1
            time.sleep(max(0.0, t0 + i / self.rate - time.monotonic()))

    def stop(self):
        self._stop_ev.set()
        self.join(15)


STREAM = "CREATE TABLE stream (id text PRIMARY KEY, seq int NOT NULL, clientid text NOT NULL)"
STREAM_RULE = {"name": "all", "actions": ["pg"],
               "sql": 'SELECT id, clientid, payload.seq AS seq FROM "stream/#"'}


def stream_sink(pg, **extra):
    return {"name": "pg", "type": "postgres", "url": pg.url,
            "sql": "INSERT INTO stream(id, seq, clientid) VALUES (${id}, ${seq}, ${clientid})", **extra}


@pytest.mark.timeout(90)
def test_postgres_away_20s_mid_stream_loses_no_acknowledged_row(make_broker, connect, pg):
    pg.psql(STREAM)
    b, port = admin_broker(make_broker, rules=[STREAM_RULE], sinks=[stream_sink(pg)])
    stream = Stream(connect(b, client_id="dev1"), "stream/dev1", rate=25)
    stream.start()
    try:
        poll(lambda: count(pg, "stream"), lambda n: n >= 10, SINK_WAIT, "rows before the outage", b)
        pg.stop()
        down_at = time.monotonic()
        wait_sink(b, port, "pg", lambda s: s["state"] == "down" and s["queued"] > 0, timeout=10,
                  what="down with a growing outbox")
        cli_seqs = []
        for k in range(5):       # mosquitto_pub gets its PUBACK too while the target is away
            cli_seqs.append(100_000 + k)
            pub_cli(b, "dev2", "stream/dev2", {"seq": cli_seqs[-1]})
        time.sleep(max(0.0, down_at + 20 - time.monotonic()))    # the outage itself: 20 s
        during = sink_stats(port, "pg")
        pg.start()
        up_at = time.monotonic()
        wait_sink(b, port, "pg", lambda s: s["state"] == "up", timeout=10, what="up again")
        time.sleep(max(0.0, up_at + 2 - time.monotonic()))       # the stream goes on after it
    finally:
        stream.stop()
    acked = set(stream.acked) | set(cli_seqs)
    assert not stream.unacked, f"no PUBACK within 10 s for seqs {stream.unacked[:20]}{sink_log(b)}"
    assert max(stream.waits) < 3, f"a PUBACK waited {max(stream.waits):.1f}s (it must not wait for the target)"
    assert during["queued"] > 100, f"the outbox during the outage: {during}"
    poll(lambda: count(pg, "stream", "count(DISTINCT seq)"), lambda n: n >= len(acked), 30,
         f"distinct seqs in the table (want {len(acked)})", b)
    seqs = {int(x) for x in pg.psql("SELECT seq FROM stream").split()}
    assert not (acked - seqs), f"acknowledged but no row: {sorted(acked - seqs)[:20]}{sink_log(b)}"
    assert seqs == acked, f"rows nobody published: {sorted(seqs - acked)[:20]}"
    rows, distinct_ids = count(pg, "stream"), count(pg, "stream", "count(DISTINCT id)")
    assert rows == distinct_ids == len(acked), (rows, distinct_ids, len(acked))
    s = wait_sink(b, port, "pg", lambda s: s["queued"] == 0 and s["inflight"] == 0, timeout=10,
                  what="an empty outbox")
    assert s["retried"] > 0 and s["state"] == "up", s
    assert s["sent"] + s["failed"] >= len(acked) and s["sent"] <= len(acked), s
    print(f"outage: {len(acked)} acknowledged, sink {s}, during the outage {during}, "
          f"longest PUBACK wait {max(stream.waits) * 1000:.0f} ms")


# --------------------------------------------------------------------------------------------------
# 3. kill -9 of Braid with 1,000 outputs in the outbox
# --------------------------------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_sigkill_with_1000_outputs_in_the_outbox_loses_none(make_broker, connect, pg):
    pg.psql(STREAM)
    b, port = admin_broker(make_broker, rules=[STREAM_RULE], sinks=[stream_sink(pg)])
    pub = connect(b, client_id="dev1")
    pub.publish("stream/dev1", json.dumps({"seq": -1}), qos=1)
    poll(lambda: count(pg, "stream"), lambda n: n == 1, SINK_WAIT, "the first row", b)

    pg.stop()
    infos = [pub.publish("stream/dev1", json.dumps({"seq": i}), qos=1, wait=False) for i in range(800)]
    lines = "".join(json.dumps({"seq": i}) + "\n" for i in range(800, 1000))
    cli = subprocess.run(["mosquitto_pub", "-h", b.host, "-p", str(b.port), "-i", "dev2", "-q", "1",
                          "-t", "stream/dev2", "-l"], input=lines.encode(), capture_output=True, timeout=30)
    assert cli.returncode == 0, cli.stderr      # -l: one message a line, each PUBACKed before it exits
    wait_until(lambda: all(i.is_published() for i in infos), timeout=20,
               message="PUBACKs for 800 paho publishes while PostgreSQL is stopped")
    wait_sink(b, port, "pg", lambda s: s["queued"] == 1000, timeout=10, what="1000 queued")
    b.kill()
    pg.start()
    b.start()
    poll(lambda: count(pg, "stream"), lambda n: n >= 1001, 30, "rows after the restart", b)
    connect(b, client_id="dev3").publish("stream/dev3", json.dumps({"seq": 5000}), qos=1)
    poll(lambda: count(pg, "stream"), lambda n: n >= 1002, SINK_WAIT, "the row published after the restart", b)
    seqs = sorted(int(x) for x in pg.psql("SELECT seq FROM stream").split())
    assert seqs == [-1, *range(1000), 5000], f"missing: {sorted(set(range(1000)) - set(seqs))[:20]}"
    s = wait_sink(b, port, "pg", lambda s: s["queued"] == 0, timeout=10, what="an empty outbox")
    assert s["state"] == "up" and s["sent"] >= 1001, s


# --------------------------------------------------------------------------------------------------
# 4. redis: HSET and XADD; WRONGTYPE counted failed
# --------------------------------------------------------------------------------------------------

def test_redis_hset_and_xadd_and_a_refused_command_counted_failed(make_broker, connect, redis):
    rules = [{"name": "to_redis", "actions": ["r_hash", "r_stream"],
              "sql": 'SELECT clientid, payload.temp AS temp, payload.seq AS seq FROM "sensors/+/temp"'}]
    sinks = [{"name": "r_hash", "type": "redis", "url": redis.url + "/0",
              "command": "HSET device:${clientid} temp ${temp} seq ${seq}"},
             {"name": "r_stream", "type": "redis", "url": redis.url + "/0",
              "command": "XADD readings * clientid ${clientid} temp ${temp}"}]
    redis.cli("SET", "device:dev9", "a-string")          # HSET on it: WRONGTYPE
    b, port = admin_broker(make_broker, rules=rules, sinks=sinks)
    dev1 = connect(b, client_id="dev1")
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 21.5, "seq": 1}), qos=1)
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 22, "seq": 2})
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 23.5, "seq": 3}), qos=1)
    poll(lambda: redis.cli("XLEN", "readings"), lambda n: n == "3", SINK_WAIT, "XLEN readings", b)
    wait_sink(b, port, "r_hash", lambda s: s["sent"] == 3, what="3 sent")
    assert redis.cli("HGETALL", "device:dev1").splitlines() == ["temp", "23.5", "seq", "3"]
    assert redis.cli("HGETALL", "device:dev2").splitlines() == ["temp", "22", "seq", "2"]

    pub_cli(b, "dev9", "sensors/dev9/temp", {"temp": 30, "seq": 4})          # WRONGTYPE for HSET
    wait_sink(b, port, "r_hash", lambda s: s["failed"] == 1, what="1 failed")
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 24, "seq": 5}), qos=1)
    h = wait_sink(b, port, "r_hash", lambda s: s["sent"] == 4 and s["queued"] == 0, what="4 sent")
    x = wait_sink(b, port, "r_stream", lambda s: s["sent"] == 5 and s["queued"] == 0, what="5 sent")
    assert (h["failed"], h["retried"], h["queued"], h["state"], h["kind"]) == (1, 0, 0, "up", "redis"), h
    assert (x["failed"], x["retried"], x["queued"], x["state"]) == (0, 0, 0, "up"), x
    assert redis.cli("HGETALL", "device:dev1").splitlines() == ["temp", "24", "seq", "5"]
    assert redis.cli("GET", "device:dev9") == "a-string"
    assert redis.cli("XLEN", "readings") == "5"
    flat = redis.cli("XRANGE", "readings", "-", "+").splitlines()    # id, 4 field/value lines each
    entries = [tuple(flat[i + 1:i + 5]) for i in range(0, len(flat), 5)]
    assert entries == [("clientid", "dev1", "temp", "21.5"), ("clientid", "dev2", "temp", "22"),
                       ("clientid", "dev1", "temp", "23.5"), ("clientid", "dev9", "temp", "30"),
                       ("clientid", "dev1", "temp", "24")], flat
    assert "WRONGTYPE" in b.log_text(), sink_log(b)


# --------------------------------------------------------------------------------------------------
# 5. influxdb: points; a malformed line counted failed
# --------------------------------------------------------------------------------------------------

def test_influxdb_points_and_a_malformed_line_counted_failed(make_broker, connect, influx):
    rules = [{"name": "to_influx", "actions": ["influx"],
              "sql": 'SELECT clientid, payload.temp AS temp, timestamp FROM "sensors/+/temp"'}]
    sinks = [{"name": "influx", "type": "influxdb", "url": influx.url, "database": "iot",
              "line": "temp,client=${clientid} value=${temp} ${timestamp}"}]
    b, port = admin_broker(make_broker, rules=rules, sinks=sinks)
    dev1 = connect(b, client_id="dev1")
    t0 = time.time()
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 21.5}), qos=1)
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 22.25})
    wait_sink(b, port, "influx", lambda s: s["sent"] == 2, what="2 sent")

    dev1.publish("sensors/dev1/temp", json.dumps({"temp": "hot"}), qos=1)   # value=hot: not a value
    wait_sink(b, port, "influx", lambda s: s["failed"] == 1, what="1 failed")
    pub_cli(b, "dev2", "sensors/dev2/temp", {"temp": 23})
    dev1.publish("sensors/dev1/temp", json.dumps({"temp": 24.5}), qos=1)
    t1 = time.time()
    s = wait_sink(b, port, "influx", lambda s: s["sent"] == 4 and s["queued"] == 0, what="4 sent")
    assert (s["failed"], s["retried"], s["queued"], s["state"], s["kind"]) == (1, 0, 0, "up", "influxdb"), s
    out = influx.influx("iot", "SELECT client, value FROM temp").splitlines()
    assert out[0] == "name,time,client,value", out
    points = [line.split(",") for line in out[1:]]
    assert [(c, float(v)) for _, _, c, v in points] == \
        [("dev1", 21.5), ("dev2", 22.25), ("dev2", 23.0), ("dev1", 24.5)], out
    for _, ns, _, _ in points:   # the point's time is `timestamp`, in ms (precision = "ms")
        assert t0 * 1e9 - 1e9 <= int(ns) <= t1 * 1e9 + 1e9, (out, t0, t1)
    assert "invalid" in b.log_text() and "refused" in b.log_text(), sink_log(b)


# --------------------------------------------------------------------------------------------------
# 6. A refused output inside a batch (the backlog after an outage) counts alone
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["postgres", "redis", "influxdb"])
def test_a_refused_output_in_a_backlog_batch_counts_alone(kind, make_broker, connect):
    """The target is away while 10 outputs queue up, the 6th one it will refuse; once it is back
    they go out in one batch (or two): 9 arrive and count sent, the refused one counts failed."""
    if kind == "postgres":
        target = Postgres()
        target.psql("CREATE TABLE b (id text PRIMARY KEY, key text NOT NULL, v double precision CHECK (v < 1000))")
        sink = {"sql": "INSERT INTO b(id, key, v) VALUES (${id}, ${key}, ${v})"}
        bad = {"key": "k5", "v": 5000}                                   # CHECK
        stored = lambda: count(target, "b")                              # noqa: E731
    elif kind == "redis":
        from redisproc import RedisServer
        target = RedisServer()
        target.cli("SET", "dev:k5", "a-string")
        sink = {"command": "HSET dev:${key} v ${v}"}
        bad = {"key": "k5", "v": 5}                                      # WRONGTYPE
        stored = lambda: len(target.cli("KEYS", "dev:k*").split()) - 1   # noqa: E731  (not dev:k5)
    else:
        target = Influx()
        target.create_db("iot")
        sink = {"database": "iot", "line": "m,key=${key} v=${v} ${timestamp}"}
        bad = {"key": "k5", "v": "bad"}                                  # value=bad: not a value
        stored = lambda: len(target.query("iot", "SELECT v FROM m"))     # noqa: E731
    try:
        rules = [{"name": "r", "actions": ["s"],
                  "sql": 'SELECT id, payload.key AS key, payload.v AS v, timestamp FROM "batch/#"'}]
        sinks = [{"name": "s", "type": kind, "url": target.url, **sink}]
        b, port = admin_broker(make_broker, rules=rules, sinks=sinks)
        target.stop()
        pub = connect(b, client_id="dev1")
        payloads = [bad if i == 5 else {"key": f"k{i}", "v": i * 1.5} for i in range(10)]
        infos = [pub.publish("batch/dev1", json.dumps(p), qos=1, wait=False) for p in payloads]
        wait_until(lambda: all(i.is_published() for i in infos), timeout=10, message="10 PUBACKs")
        wait_sink(b, port, "s", lambda s: s["queued"] == 10 and s["state"] == "down", what="10 queued, down")
        target.start()
        s = wait_sink(b, port, "s", lambda s: s["queued"] == 0 and s["sent"] + s["failed"] == 10,
                      what="all 10 done")
        n = poll(stored, lambda n: n >= 9, SINK_WAIT, f"outputs stored in {kind}", b)
        assert n == 9, n
        assert (s["sent"], s["failed"]) == (9, 1), f"{kind}: {s} while {n} outputs are stored{sink_log(b)}"
    finally:
        target.remove()
