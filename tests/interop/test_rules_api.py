"""Rules and sinks changed at run time (docs/rules.md, docs/api.md): made, changed and deleted
through `/api/v1/rules` and `/api/v1/sinks` (kept in the data directory across restarts), and
the configuration file's put in force again on SIGHUP; what is in force takes effect for the next
message, checked by what a real HTTP target receives from mosquitto_pub publishers."""
import json
import subprocess

import pytest

from bridgeutil import BridgedBraid
from conftest import BRAID_BIN, free_port
from test_admin_api import Api, ctl
from test_sinks_http import Target, pub, wait_for

pytestmark = pytest.mark.braid_only

HOT = 'SELECT clientid, payload.temp AS temp FROM "sensors/+/temp" WHERE payload.temp > 30'


@pytest.fixture
def target():
    t = Target()
    yield t
    t.stop()


def temps(target):
    return sorted(json.loads(b)["temp"] for b in target.taken)


@pytest.fixture
def started(tmp_path, monkeypatch):
    """Factory: started(config="") -> (broker from a file with `config`, its API), the API on a
    port of its own that a restart keeps; stopped after the test."""
    port = free_port()
    monkeypatch.setenv("BRAID_LISTENERS_HTTP", f"127.0.0.1:{port}")
    made = []

    def make(config=""):
        b = BridgedBraid("[sys]\ninterval_secs = 0\n" + config, str(tmp_path / "b"), "sink")
        made.append(b)
        b.admin_url()  # listening
        return b, Api(port)

    yield make
    for b in made:
        b.stop()


def test_rules_and_sinks_made_through_the_api_work_at_once_and_outlive_a_restart(started, target):
    b, api = started()
    sink = {"name": "hook", "type": "http", "url": f"http://127.0.0.1:{target.port}/in"}
    status, body = api.call("POST", "/api/v1/sinks", sink)
    assert status == 201 and body["source"] == "api" and body["kind"] == "http", body
    status, body = api.call("POST", "/api/v1/rules", {"name": "hot", "sql": HOT, "actions": ["hook"]})
    assert status == 201 and body["source"] == "api" and body["matched"] == 0, body
    pub(b, "dev1", 31)
    wait_for("31 sent", lambda: temps(target) == [31])
    # Changed: a lower bar, at once; the counters of a changed rule start again.
    status, body = api.call("PUT", "/api/v1/rules/hot", {"sql": HOT.replace("> 30", "> 10"), "actions": ["hook"]})
    assert status == 200 and "> 10" in body["sql"], body
    pub(b, "dev1", 15)
    wait_for("15 sent", lambda: temps(target) == [15, 31])
    status, body = api.call("GET", "/api/v1/rules/hot")
    assert status == 200 and body["matched"] == 1, body
    # Kept across a restart, and in force from the first message.
    b.stop()
    b.start()
    wait_for("the API back", lambda: b.log_text().count("listening for HTTP") == 2)
    status, body = api.call("GET", "/api/v1/rules")
    assert [(r["name"], r["source"]) for r in body["data"]] == [("hot", "api")], body
    pub(b, "dev1", 12)
    wait_for("12 sent after the restart", lambda: temps(target) == [12, 15, 31])
    # A sink a rule names is not deleted; the rule first, then the sink.
    status, body = api.call("DELETE", "/api/v1/sinks/hook")
    assert status == 409 and "hot" in body["error"], body
    assert api.call("DELETE", "/api/v1/rules/hot")[0] == 204
    assert api.call("DELETE", "/api/v1/sinks/hook")[0] == 204
    assert api.call("GET", "/api/v1/sinks")[1]["data"] == []
    pub(b, "dev1", 50)
    status, body = api.call("GET", "/api/v1/rules/hot")
    assert status == 404, body
    assert temps(target) == [12, 15, 31], "no rule: nothing sent"


def test_a_bad_change_through_the_api_is_refused_naming_the_problem_and_changes_nothing(started, target):
    config = (f'[[sinks]]\nname = "filed"\ntype = "http"\nurl = "http://127.0.0.1:{target.port}/f"\n'
              f'[[rules]]\nname = "fromfile"\nsql = \'SELECT * FROM "f/#"\'\nactions = ["filed"]\n')
    b, api = started(config)
    rule = {"name": "hot", "sql": HOT, "actions": ["filed"]}
    cases = [
        ("POST", "/api/v1/rules", {**rule, "sql": 'SELECT lenght(topic) FROM "s/#"'}, 400,
         ['rule "hot"', "sql", "line 1, column 8", "lenght"]),
        ("POST", "/api/v1/rules", {**rule, "actions": ["nosuch"]}, 400, ["nosuch", "no [[sinks]]"]),
        ("POST", "/api/v1/rules", {**rule, "name": "fromfile"}, 409, ["configuration file"]),
        ("PUT", "/api/v1/rules/fromfile", rule, 400, ["not \"fromfile\""]),
        ("PUT", "/api/v1/rules/fromfile", {**rule, "name": "fromfile"}, 409, ["configuration file"]),
        ("DELETE", "/api/v1/rules/fromfile", None, 409, ["configuration file"]),
        ("PUT", "/api/v1/rules/nosuch", {**rule, "name": "nosuch"}, 404, ["nosuch"]),
        ("POST", "/api/v1/rules", {**rule, "colour": "red"}, 422, ["colour"]),
        ("POST", "/api/v1/sinks", {"name": "s2", "type": "http", "url": "ftp://x"}, 400,
         ['sink "s2"', "url", "http://"]),
        ("POST", "/api/v1/sinks", {"name": "s2", "type": "postgres", "url": "postgres://h/db"}, 400,
         ["sql", "required"]),
        ("DELETE", "/api/v1/sinks/filed", None, 409, ["configuration file"]),
    ]
    for method, path, body, status, words in cases:
        got, answer = api.call(method, path, body)
        assert got == status, (method, path, body, got, answer)
        assert all(w in answer["error"] for w in words), (words, answer)
    status, body = api.call("GET", "/api/v1/rules")
    assert [(r["name"], r["source"]) for r in body["data"]] == [("fromfile", "file")], body
    status, body = api.call("GET", "/api/v1/sinks")
    assert [(s["name"], s["source"]) for s in body["data"]] == [("filed", "file")], body


def test_a_reload_puts_the_files_rules_and_sinks_in_force_beside_the_apis(started, target):
    def config(bar):
        return (f'[sys]\ninterval_secs = 0\n[[sinks]]\nname = "hook"\ntype = "http"\n'
                f'url = "http://127.0.0.1:{target.port}/in"\n'
                f'[[rules]]\nname = "hot"\nsql = \'{HOT.replace("> 30", f"> {bar}")}\'\nactions = ["hook"]\n')

    b, api = started(config(30)[len("[sys]\ninterval_secs = 0\n"):])
    status, body = api.call("POST", "/api/v1/rules", {"name": "cold", "sql": HOT.replace("> 30", "< 0"),
                                                       "actions": ["hook"]})
    assert status == 201, body
    pub(b, "dev1", 20)
    pub(b, "dev1", -5)
    wait_for("-5 sent by the API's rule", lambda: temps(target) == [-5])
    with open(b.config_file, "w") as f:
        f.write(config(10))
    status, body = api.call("POST", "/api/v1/reload")
    assert status == 200 and "rules" in body["changed"], body
    pub(b, "dev1", 20)
    wait_for("20 sent under the reloaded rule", lambda: temps(target) == [-5, 20])
    # A reload whose rules do not compile is refused whole: the rules in force stay.
    with open(b.config_file, "w") as f:
        f.write(config(10).replace("payload.temp AS", "paylod.temp AS"))
    status, body = api.call("POST", "/api/v1/reload")
    assert status == 400 and "paylod" in body["error"], body
    pub(b, "dev1", 21)
    wait_for("21 sent: the rules in force stayed", lambda: temps(target) == [-5, 20, 21])
    names = [(r["name"], r["source"]) for r in api.call("GET", "/api/v1/rules")[1]["data"]]
    assert names == [("hot", "file"), ("cold", "api")], names


def test_a_broken_rules_json_stops_the_start_naming_the_file(started):
    b, _ = started()
    b.stop()
    with open(f"{b.data_dir}/rules.json", "w") as f:
        f.write('{"rules": [{"name": "x", "sql": "SELECT", "actions": ["republish:a"]}]}')
    r = subprocess.run([BRAID_BIN, "serve", "-c", b.config_file, "--listen", f"127.0.0.1:{free_port()}",
                        "--set", f"store.data_dir={json.dumps(b.data_dir)}"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 2, r.stderr
    assert "rules.json" in r.stderr and 'rule "x"' in r.stderr, r.stderr


def test_braid_ctl_makes_lists_and_deletes_rules_and_sinks(started, target):
    b, api = started()
    port = int(api.base.rsplit(":", 1)[1])
    sink = json.dumps({"name": "hook", "type": "http", "url": f"http://127.0.0.1:{target.port}/in"})
    for args in (["sinks", "add", sink], ["rules", "add", "hot", HOT, "-a", "hook"]):
        r = ctl(port, *args)
        assert r.returncode == 0, r.stderr
    pub(b, "dev1", 40)
    wait_for("40 sent", lambda: temps(target) == [40])
    r = ctl(port, "rules")
    assert r.returncode == 0, r.stderr
    [header, row] = r.stdout.splitlines()
    assert header.split()[:5] == ["name", "source", "matched", "passed", "failed"], r.stdout
    assert row.split()[:5] == ["hot", "api", "1", "1", "0"], r.stdout
    r = ctl(port, "sinks")
    assert r.stdout.splitlines()[1].split()[:4] == ["hook", "http", "api", "up"], r.stdout
    r = ctl(port, "rules", "add", "bad", 'SELECT lenght(topic) FROM "s/#"', "-a", "hook")
    assert r.returncode == 1 and "400" in r.stderr and "lenght" in r.stderr, r.stderr
    r = ctl(port, "sinks", "add", "{not json")
    assert r.returncode != 0 and "not JSON" in r.stderr, r.stderr
    assert ctl(port, "rules", "delete", "hot").stdout == "deleted rule hot\n"
    assert ctl(port, "sinks", "delete", "hook").stdout == "deleted sink hook\n"
    assert ctl(port, "rules").stdout.splitlines()[1:] == []
