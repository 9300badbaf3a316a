"""The PostgreSQL and InfluxDB helpers (pgproc.py, influxproc.py) against the real services."""
import urllib.request

from influxproc import Influx
from pgproc import Postgres


def test_postgres_keeps_a_row_across_a_restart():
    pg = Postgres()
    try:
        assert pg.url == f"postgres://braid@127.0.0.1:{pg.port}/iot"
        pg.psql("CREATE TABLE readings (sensor text, value double precision)")
        pg.psql("INSERT INTO readings VALUES ('t1', 21.5)")
        assert pg.psql("SELECT sensor, value FROM readings") == "t1|21.5"
        pg.stop()
        assert not pg.running()
        pg.stop()  # idempotent
        pg.start()
        assert pg.psql("SELECT sensor, value FROM readings") == "t1|21.5"
        assert pg.psql("SELECT current_user, current_database()") == "braid|iot"
    finally:
        pg.remove()


def test_influx_reads_back_a_written_point_over_http_and_the_cli():
    db = Influx()
    try:
        db.create_db("iot")
        req = urllib.request.Request(f"{db.url}/write?db=iot&precision=s",
                                     data=b"temp,sensor=t1 value=21.5 1700000000")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 204
        assert db.query("iot", "SELECT sensor, value FROM temp") == \
            [["2023-11-14T22:13:20Z", "t1", 21.5]]
        assert db.influx("iot", "SELECT sensor, value FROM temp").splitlines() == \
            ["name,time,sensor,value", "temp,1700000000000000000,t1,21.5"]
    finally:
        db.remove()
