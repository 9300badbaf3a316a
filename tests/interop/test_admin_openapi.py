"""docs/openapi.json (the admin API's OpenAPI description) kept true to the running API.

- The router and the spec list the same operations: the `.route("...", ...)` calls of
  crates/braid-admin/src/api.rs (under lib.rs's `.nest("/api/v1", ...)`) and lib.rs (/metrics)
  are read with regular expressions, so a route added without documenting it fails here.
- Every operation of the spec is called on a running broker with harmless requests (unknown
  client ids, topics without a retained message, empty bodies): none gets the API's "no such
  endpoint" 404 or a 405; every status it answers is one the spec lists, and every JSON reply
  fits the schema documented for that status. Without an API key, the operations the spec marks
  as secured answer 401 and the public one does not.
- Every GET, called with ids and topics that exist, answers 200 with a reply that fits its
  schema, and list replies have exactly the documented top-level keys. Objects are checked
  strictly: a key the schema does not name fails (unless it has `additionalProperties`), so a
  field added to a reply must be documented too.
- Every `example` in the spec fits its schema.

When PyYAML is importable a docs/openapi.yaml is read instead of docs/openapi.json.
"""
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
from paho.mqtt.client import MQTTv5

import helpers
from conftest import BRAID_BIN, ROOT, Broker

pytestmark = pytest.mark.braid_only

ADMIN_SRC = os.path.join(ROOT, "crates", "braid-admin", "src")
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
SECURED_SCHEMES = {"bearer": ("http", "bearer"), "basic": ("http", "basic")}

# Harmless stand-ins for path parameters (nothing exists under these names) and, for the GETs
# of test_every_get_answers_200_with_its_documented_shape, names that exist on the test broker.
ABSENT = {"id": "openapi-no-such-client", "topic": "openapi/no/such/topic"}
PRESENT = {"id": "openapi-sub", "topic": "openapi/retained", "name": "openapi-trace", "rule": "openapi", "sink": "openapi"}


def load_spec():
    yaml_path = os.path.join(ROOT, "docs", "openapi.yaml")
    if os.path.exists(yaml_path):
        import yaml  # PyYAML: in tests/interop/requirements.txt once the spec is YAML
        with open(yaml_path) as f:
            return yaml.safe_load(f)
    with open(os.path.join(ROOT, "docs", "openapi.json")) as f:
        return json.load(f)


SPEC = load_spec()


def operations(spec):
    """(METHOD, path, operation, path item) of every operation in the spec."""
    return [(m.upper(), path, item[m], item)
            for path, item in spec["paths"].items() for m in METHODS if m in item]


OPERATIONS = operations(SPEC)


def resolve(node, spec=SPEC):
    """`node` with its `$ref` (a local #/... pointer) followed, repeatedly."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), f"only local $refs are read: {ref}"
        node = spec
        for part in ref[2:].split("/"):
            assert part in node, f"$ref {ref} does not resolve"
            node = node[part]
    return node


# --------------------------------------------------------------------------------------------------
# A small checker of values against the OpenAPI 3.0 schemas this spec uses.
# --------------------------------------------------------------------------------------------------

TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def check(value, schema, where="reply"):
    """The problems of `value` against `schema`, as a list of strings (empty: it fits)."""
    schema = resolve(schema)
    for unread in ("allOf", "anyOf", "oneOf", "not"):
        assert unread not in schema, f"{where}: this checker does not read {unread}; extend it"
    if value is None:
        return [] if schema.get("nullable") else [f"{where}: null, but the schema is not nullable"]
    problems = []
    kind = schema.get("type")
    if kind:
        if not isinstance(value, TYPES[kind]) or (kind in ("integer", "number") and isinstance(value, bool)):
            return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", False)
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{where}: the documented key {key!r} is missing")
        for key, v in value.items():
            if key in props:
                problems += check(v, props[key], f"{where}.{key}")
            elif extra is False:
                problems.append(f"{where}: key {key!r} is not documented")
            elif isinstance(extra, dict):
                problems += check(v, extra, f"{where}.{key}")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, v in enumerate(value):
                problems += check(v, schema["items"], f"{where}[{i}]")
    return problems


# --------------------------------------------------------------------------------------------------
# The router, read from the source.
# --------------------------------------------------------------------------------------------------

def _source(name):
    with open(os.path.join(ADMIN_SRC, name)) as f:
        text = f.read()
    return re.sub(r"//[^\n]*", "", text)  # comments (no route path holds "//")


def _call_args(text, open_paren):
    """The text between the parenthesis at `open_paren` and its match (strings skipped)."""
    depth, i, in_str = 0, open_paren, False
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return text[open_paren + 1:i]
        i += 1
    raise AssertionError("unbalanced parentheses in the router's source")


def _top_level_calls(expr):
    """The names called at the top level of a Rust expression: `get(a).post(b)` -> get, post."""
    names, depth = [], 0
    for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_]*\s*\(|[()\[\]{}]", expr):
        token = m.group(0)
        if token in "([{":
            depth += 1
        elif token in ")]}":
            depth -= 1
        else:
            if depth == 0:
                names.append(token.rstrip("( \t\n"))
            depth += 1
    return names


def _routes_in(text, prefix=""):
    """{(METHOD, path)} of the `.route("PATH", METHOD_ROUTER)` calls in `text`."""
    found = set()
    for m in re.finditer(r"\.route\s*\(", text):
        args = _call_args(text, m.end() - 1)
        literal = re.match(r'\s*"([^"]*)"\s*,(.*)\Z', args, re.S)
        assert literal, f"a route whose path is not a string literal: .route({args.strip()[:80]}...)"
        path, handler = literal.groups()
        path = re.sub(r"\{\*?([^}]+)\}", r"{\1}", path)  # axum's {*rest} is one OpenAPI {rest}
        names = _top_level_calls(handler)
        methods = [n for n in names if n in METHODS]
        unread = [n for n in names if n not in METHODS and n not in ("layer", "route_layer", "with_state")]
        assert methods and not unread, \
            f"cannot tell the methods of route {path} from `{handler.strip()}`: extend this test"
        found |= {(meth.upper(), prefix + path) for meth in methods}
    return found


def router_operations():
    lib, api = _source("lib.rs"), _source("api.rs")
    nests = re.findall(r'\.nest\s*\(\s*"([^"]+)"\s*,\s*([\w:]+)\s*\(', lib)
    assert nests == [("/api/v1", "api::routes")], f"lib.rs nests {nests}: extend this test"
    assert re.findall(r"\.merge\s*\(\s*([\w:]+)", lib) == ["dashboard::routes"], \
        "lib.rs merges another router than the dashboard's: extend this test"
    for other in (r"\.nest\s*\(", r"\.merge\s*\(", r"\.route_service\s*\(", r"\.nest_service\s*\("):
        assert not re.search(other, api), f"api.rs has {other}: extend this test"
    return _routes_in(lib) | _routes_in(api, prefix="/api/v1")


# --------------------------------------------------------------------------------------------------
# Static checks.
# --------------------------------------------------------------------------------------------------

def test_every_route_of_the_router_is_in_the_spec_and_no_other():
    in_router = router_operations()
    in_spec = {(m, p) for m, p, _, _ in OPERATIONS}
    assert len(in_router) >= 18, f"the router was not read right: {sorted(in_router)}"
    assert not in_router - in_spec, f"routes missing from docs/openapi: {sorted(in_router - in_spec)}"
    assert not in_spec - in_router, f"operations in docs/openapi the router lacks: {sorted(in_spec - in_router)}"


def test_the_spec_is_well_formed():
    assert SPEC["openapi"] == "3.0.3"
    schemes = SPEC["components"]["securitySchemes"]
    assert {k: (v["type"], v["scheme"]) for k, v in schemes.items()} == SECURED_SCHEMES
    assert SPEC["security"] == [{"bearer": []}, {"basic": []}]
    ids = [op["operationId"] for _, _, op, _ in OPERATIONS]
    assert len(ids) == len(set(ids)), f"operationIds repeat: {ids}"
    for method, path, op, item in OPERATIONS:
        params = [resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]
        in_path = {p["name"] for p in params if p["in"] == "path"}
        assert in_path == set(re.findall(r"\{(\w+)\}", path)), f"{method} {path}: path parameters"
        assert all(p.get("required") for p in params if p["in"] == "path")
        assert op.get("responses"), f"{method} {path}: no responses"
        for status, response in op["responses"].items():
            response = resolve(response)
            assert response.get("description"), f"{method} {path} {status}: no description"
            if status.startswith("4") or (status.startswith("5") and path != "/api/v1/health"):
                schema = response["content"]["application/json"]["schema"]
                assert resolve(schema) is SPEC["components"]["schemas"]["Error"], \
                    f"{method} {path} {status}: an error reply is an Error"
        if op.get("security", SPEC["security"]):
            assert "401" in op["responses"], f"{method} {path}: secured, but 401 is not listed"


def _nulls(node, where="spec"):
    """Where a null stands outside an `enum` or an `example` (a slip of the pen, in YAML)."""
    if node is None:
        yield where
    elif isinstance(node, dict):
        for k, v in node.items():
            if k not in ("enum", "example"):
                yield from _nulls(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _nulls(v, f"{where}[{i}]")


def test_the_spec_has_no_stray_nulls():
    assert not list(_nulls(SPEC)), list(_nulls(SPEC))


def _examples(node, where="spec"):
    """(where, example, schema) of every media type example in the spec."""
    if isinstance(node, dict):
        if "example" in node and "schema" in node:
            yield where, node["example"], node["schema"]
        for k, v in node.items():
            yield from _examples(v, f"{where}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _examples(v, f"{where}[{i}]")


def test_every_example_fits_its_schema():
    examples = list(_examples(SPEC))
    assert examples
    for where, example, schema in examples:
        assert not check(example, schema, where), check(example, schema, where)


# --------------------------------------------------------------------------------------------------
# Against a running broker.
# --------------------------------------------------------------------------------------------------

class Admin:
    """The test broker's admin listener, its API key, and what exists on it."""

    def __init__(self, url, key):
        self.url, self.key = url, key

    def call(self, method, path, body=None, key=True):
        """(status, headers, body text) of one request."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()


@pytest.fixture(scope="module")
def admin(tmp_path_factory):
    """A broker with API keys, a bridge (to a port where nothing listens, so it stays down), a
    connected v5 client with a persistent session and a subscription, a retained message with
    properties, a packet trace of that client, and a rule sending to a sink (whose target is
    away)."""
    keys = tmp_path_factory.mktemp("openapi") / "keys"
    made = subprocess.run([BRAID_BIN, "apikey", "add", str(keys), "openapi"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    bridge = {"name": "openapi", "address": "127.0.0.1:1", "topic": ["openapi/bridged/# out 0"]}
    rule = {"name": "openapi", "sql": 'SELECT topic FROM "openapi/rules/#"',
            "actions": ["republish:openapi/out", "openapi"]}
    sink = {"name": "openapi", "type": "http", "url": "http://127.0.0.1:1/"}
    b = Broker({"braid": {"sys.interval_secs": 1, "admin.api_keys_file": str(keys), "bridges.mqtt": [bridge],
                          "rules": [rule], "sinks": [sink]}})
    client = None
    try:
        client = helpers.connect_client(b, client_id=PRESENT["id"], protocol=MQTTv5, properties=helpers.v5_properties(
            helpers.PacketTypes.CONNECT, SessionExpiryInterval=300))
        client.subscribe("openapi/#", qos=1)
        helpers.mosquitto_pub(b, PRESENT["topic"], "kept", qos=1, version="mqttv5", retain=True, extra=[
            "-D", "publish", "content-type", "text/plain", "-D", "publish", "user-property", "k", "v"])
        admin = Admin(b.admin_url(), made.stdout.strip())
        trace = {"name": PRESENT["name"], "client_id": PRESENT["id"], "duration_secs": 600}
        status, _, text = admin.call("POST", "/api/v1/traces", trace)
        assert status == 201, text
        yield admin
    finally:
        if client:
            client.close()
        b.stop()


def _url(path, op, item, values):
    """`path` with its parameters filled from `values`, and required query parameters added."""
    params = [resolve(p) for p in item.get("parameters", []) + op.get("parameters", [])]
    for p in params:
        if p["in"] == "path":
            value = values.get(p["name"], f"openapi-no-such-{p['name']}")
            safe = "/" if p["name"] == "topic" else ""
            path = path.replace("{%s}" % p["name"], urllib.parse.quote(value, safe=safe))
    query = {p["name"]: "openapi/no/such/filter" for p in params if p["in"] == "query" and p.get("required")}
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def _response_problems(op, status, headers, text, where):
    """Why a reply does not fit the operation's documented responses (empty list: it does)."""
    documented = op["responses"].get(str(status)) or op["responses"].get("default")
    if documented is None:
        return [f"{where}: status {status} is not documented ({text[:200]})"]
    content = resolve(documented).get("content")
    if not content:
        return [f"{where}: {status} is documented without a body, got {text[:200]!r}"] if text else []
    kind = (headers.get("Content-Type") or "").split(";")[0].strip()
    if kind not in content:
        return [f"{where}: content type {kind!r}, documented {sorted(content)}"]
    if kind != "application/json":
        return []
    return check(json.loads(text), content[kind]["schema"], where)


@pytest.mark.parametrize("method,path,op,item", OPERATIONS, ids=[f"{m} {p}" for m, p, _, _ in OPERATIONS])
def test_every_documented_operation_exists_and_answers_as_documented(admin, method, path, op, item):
    url = _url(path, op, item, ABSENT)
    body = {} if "requestBody" in op else None  # a body missing its required fields: 422, harmless
    where = f"{method} {url}"

    status, headers, text = admin.call(method, url, body, key=False)
    if op.get("security", SPEC["security"]):
        assert status == 401, f"{where} without a key: {status} {text[:200]}"
        assert "Bearer" in (headers.get("WWW-Authenticate") or "")
        assert not _response_problems(op, status, headers, text, where + " (no key)")
    else:
        assert status != 401, f"{where} is documented as public: {text[:200]}"

    status, headers, text = admin.call(method, url, body)
    assert status != 405, f"{where}: 405, the router has no {method} there"
    assert not (status == 404 and "no such endpoint" in text), f"{where}: the API has no such endpoint"
    problems = _response_problems(op, status, headers, text, where)
    assert not problems, "\n".join(problems)


GETS = [(p, op, item) for m, p, op, item in OPERATIONS if m == "GET"]


@pytest.mark.parametrize("path,op,item", GETS, ids=[p for p, _, _ in GETS])
def test_every_get_answers_200_with_its_documented_shape(admin, path, op, item):
    url = _url(path, op, item, PRESENT)
    status, headers, text = admin.call("GET", url)
    assert status == 200, f"GET {url}: {status} {text[:300]}"
    problems = _response_problems(op, status, headers, text, f"GET {url}")
    assert not problems, "\n".join(problems)
    content = resolve(op["responses"]["200"])["content"]
    if "application/json" not in content:
        return
    schema = resolve(content["application/json"]["schema"])
    reply = json.loads(text)
    data = resolve(schema.get("properties", {}).get("data", {}))
    if data.get("type") == "array":
        # A list: exactly the documented top-level keys, and items to check (the fixture made
        # a client, a subscription, a retained message and a bridge; there is always a node and
        # a listener).
        assert set(reply) == set(schema["properties"]), f"GET {url}: top-level keys {sorted(reply)}"
        assert reply["data"], f"GET {url}: no items to check the documented item schema against"
        if "meta" in schema["properties"]:
            assert reply["meta"]["count"] >= len(reply["data"])
