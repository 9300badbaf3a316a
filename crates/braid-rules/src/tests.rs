//! Rules as a user sees them: compiled from SQL, applied to messages and events.

use braid_proto::ByteString;
use serde_json::{json, Map, Value};

use crate::{Context, Event, Rule, Template};

/// The example rule of docs/rules.md.
const HOT: &str = r#"SELECT clientid, topic, payload.temp AS temp, timestamp
         FROM "sensors/+/temp", "$events/client_connected"
         WHERE payload.temp > 30"#;

fn rule(sql: &str) -> Rule {
    Rule::compile("test", sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A publish of `payload` to `topic` by client `dev1`.
fn message<'a>(topic: &'a str, payload: &'a [u8]) -> Context<'a> {
    Context {
        id: Some("0005f3c1"),
        clientid: "dev1",
        username: Some("alice"),
        peerhost: Some("10.0.0.7"),
        topic,
        payload,
        qos: 1,
        timestamp: 1_650_018_960_123,
        ..Context::default()
    }
}

fn object(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

/// What `sql` outputs for `payload` published to `t/1`.
fn select(sql: &str, payload: &str) -> Option<Map<String, Value>> {
    rule(sql).apply(&message("t/1", payload.as_bytes()))
}

/// The value of the single output `x` of `SELECT <expr> AS x` on `payload`.
fn eval(expr: &str, payload: &str) -> Value {
    select(&format!(r#"SELECT {expr} AS x FROM "t/#""#), payload).unwrap()["x"].clone()
}

/// Whether `WHERE <condition>` holds for `payload` on `t/1`.
fn holds(condition: &str, payload: &str) -> bool {
    select(&format!(r#"SELECT clientid FROM "t/#" WHERE {condition}"#), payload).is_some()
}

#[test]
fn the_example_rule_selects_hot_readings() {
    let hot = rule(HOT);
    assert_eq!(hot.topic_filters(), ["sensors/+/temp"]);
    assert_eq!(hot.events(), [Event::ClientConnected]);
    assert!(hot.matches_topic("sensors/dev1/temp"));
    assert!(!hot.matches_topic("sensors/dev1/hum"));

    let out = hot.apply(&message("sensors/dev1/temp", br#"{"temp": 31.5, "hum": 40}"#));
    let expected = json!({"clientid": "dev1", "topic": "sensors/dev1/temp", "temp": 31.5, "timestamp": 1_650_018_960_123_i64});
    assert_eq!(out, Some(object(expected)));

    // Not hot enough, not a number, no temp, not JSON, another topic: no match.
    for (topic, payload) in [
        ("sensors/dev1/temp", &br#"{"temp": 30}"#[..]),
        ("sensors/dev1/temp", br#"{"temp": "warm"}"#),
        ("sensors/dev1/temp", br#"{"hum": 99}"#),
        ("sensors/dev1/temp", b"31.5 degrees"),
        ("sensors/dev1/temp", b""),
        ("sensors/dev1/hum", br#"{"temp": 50}"#),
        ("sensors/temp", br#"{"temp": 50}"#),
    ] {
        assert_eq!(hot.apply(&message(topic, payload)), None, "{topic} {payload:?}");
    }
    // A number sent as a string still compares as a number.
    let out = hot.apply(&message("sensors/dev2/temp", br#"{"temp": "35"}"#)).unwrap();
    assert_eq!(out["temp"], "35");

    // The event source has no payload, so WHERE does not hold.
    let connected = Context { event: Event::ClientConnected, clientid: "dev1", ..Context::default() };
    assert_eq!(hot.apply(&connected), None);
}

#[test]
fn apply_only_takes_the_rules_sources() {
    let r = rule(r#"SELECT clientid FROM "a/+""#);
    assert!(r.apply(&message("a/1", b"")).is_some());
    assert!(r.apply(&message("a/1/2", b"")).is_none());
    assert!(r.apply(&message("$SYS/a", b"")).is_none());
    let delivered = Context { event: Event::MessageDelivered, ..message("a/1", b"") };
    assert!(r.apply(&delivered).is_none());
    assert!(r.matches_event(Event::MessagePublish) && !r.matches_event(Event::MessageDelivered));
}

#[test]
fn select_star_writes_every_field_of_the_message() {
    let props = [(ByteString::from("site"), ByteString::from("north"))];
    let ctx = Context { user_properties: &props, retain: true, ..message("t/1", br#"{"temp": 20}"#) };
    let out = rule(r#"SELECT * FROM "t/#""#).apply(&ctx).unwrap();
    let expected = json!({
        "event": "message.publish",
        "id": "0005f3c1",
        "clientid": "dev1",
        "username": "alice",
        "peerhost": "10.0.0.7",
        "timestamp": 1_650_018_960_123_i64,
        "topic": "t/1",
        "payload": "{\"temp\": 20}",
        "qos": 1,
        "retain": true,
        "flags": {"retain": true},
        "pub_props": {"User-Property": {"site": "north"}},
    });
    assert_eq!(out, object(expected));
}

#[test]
fn outputs_are_named_and_nested() {
    let sql = r#"SELECT payload.a.b, payload.temp AS temp, clientid AS "meta.who", upper(clientid), *
                 FROM "t/#""#;
    let out = select(sql, r#"{"a": {"b": [1, 2]}, "temp": 7}"#).unwrap();
    assert_eq!(out["temp"], 7);
    assert_eq!(out["meta"], json!({"who": "dev1"}));
    assert_eq!(out["upper(clientid)"], "DEV1");
    // `*` comes last, so it writes the raw payload over the nested `payload.a.b`.
    assert_eq!(out["payload"], r#"{"a": {"b": [1, 2]}, "temp": 7}"#);
    let out = select(r#"SELECT payload.a.b, payload.a.c FROM "t/#""#, r#"{"a": {"b": 1, "c": 2}}"#).unwrap();
    assert_eq!(Value::Object(out), json!({"payload": {"a": {"b": 1, "c": 2}}}));
}

#[test]
fn json_paths_reach_into_objects_and_arrays() {
    let payload = r#"{"list": [10, 20, 30], "m": [[1, 2], [3, 4]], "o": {"k v": {"x": null}}, "s": "text"}"#;
    assert_eq!(eval("payload.list[1]", payload), 10);
    assert_eq!(eval("payload.list[-1]", payload), 30);
    assert_eq!(eval("payload.list[4]", payload), Value::Null);
    assert_eq!(eval("payload.m[2][1]", payload), 3);
    assert_eq!(eval("payload.o['k v']", payload), json!({"x": null}));
    assert_eq!(eval("payload.o.'k v'", payload), json!({"x": null}));
    assert_eq!(eval("payload.list", payload), json!([10, 20, 30]));
    assert_eq!(eval("payload.s.x", payload), Value::Null);
    assert_eq!(eval("payload.nope.deeper", payload), Value::Null);
    assert_eq!(eval("nth(2, payload.list)", payload), 20);
    assert_eq!(eval("payload[1]", "[5, 6]"), 5);
}

#[test]
fn a_payload_that_is_not_json_is_a_string() {
    assert_eq!(eval("payload", "on"), "on");
    assert_eq!(eval("payload.x", "on"), Value::Null);
    assert!(holds("payload = 'on'", "on"));
    assert!(holds("payload.x IS NULL", "{not json"));
    assert!(holds("upper(payload) = 'ON'", "on"));
    // Bytes that are not UTF-8 are replaced, not refused.
    let out = rule(r#"SELECT payload FROM "t/#""#).apply(&message("t/1", &[0x6f, 0xff, 0x6b])).unwrap();
    assert_eq!(out["payload"], "o\u{fffd}k");
    // A JSON payload is still text when read whole.
    assert_eq!(eval("payload", r#"{"a": 1}"#), r#"{"a": 1}"#);
}

#[test]
fn message_fields() {
    let props = [(ByteString::from("site"), ByteString::from("north"))];
    let ctx = Context { user_properties: &props, retain: true, ..message("sensors/dev1/temp", b"") };
    let sql = r#"SELECT id, clientid, username, peerhost, topic, qos, retain, flags.retain AS r, timestamp, event,
                        pub_props.'User-Property'.site AS site, pub_props.'User-Property'.none AS none,
                        nth(2, tokens(topic, '/')) AS device, split(topic, '/') AS levels
                 FROM "sensors/#""#;
    let out = rule(sql).apply(&ctx).unwrap();
    let expected = json!({
        "id": "0005f3c1", "clientid": "dev1", "username": "alice", "peerhost": "10.0.0.7",
        "topic": "sensors/dev1/temp", "qos": 1, "retain": true, "r": true, "timestamp": 1_650_018_960_123_i64,
        "event": "message.publish", "site": "north", "none": null, "device": "dev1",
        "levels": ["sensors", "dev1", "temp"],
    });
    assert_eq!(out, object(expected));
    let anonymous = Context { username: None, ..ctx };
    assert_eq!(rule(sql).apply(&anonymous).unwrap()["username"], Value::Null);
}

#[test]
fn where_compares_and_combines() {
    let p = r#"{"temp": 31.5, "n": 3, "name": "boiler", "on": true, "tags": ["a"]}"#;
    for condition in [
        "payload.temp > 30",
        "payload.temp >= 31.5",
        "payload.temp < 32",
        "payload.temp <= 31.5",
        "payload.n = 3",
        "payload.n = 3.0",
        "payload.n != 4",
        "payload.n <> 4",
        "payload.name = 'boiler'",
        "payload.name = \"boiler\"",
        "payload.name > 'a'",
        "payload.on",
        "payload.on = true",
        "payload.tags = json_decode('[\"a\"]')",
        "payload.n > 1 AND payload.temp > 30",
        "payload.n > 5 OR payload.temp > 30",
        "NOT payload.n > 5",
        "payload.n IN (1, 2, 3)",
        "payload.name IN ('boiler', 'pump')",
        "payload.n NOT IN (4, 5)",
        "payload.n * 2 + 1 = 7",
        "payload.n - 5 = -2",
        "payload.n / 2 = 1.5",
        "payload.n % 2 = 1",
        "-payload.n = -3",
        "(payload.n + 1) * 2 = 8",
        "payload.name || '-' || clientid = 'boiler-dev1'",
        "topic =~ 't/+'",
        "topic =~ '#'",
        "payload.missing IS NULL",
        "payload.n IS NOT NULL",
        "clientid = 'dev1' AND qos = 1",
    ] {
        assert!(holds(condition, p), "{condition} should hold");
    }
    for condition in [
        "payload.temp > 40",
        "payload.n = '3x'",
        "payload.name > 5",
        "payload.n IN (4, 5)",
        "topic =~ 'u/#'",
        "topic =~ 't'",
        "payload.n IS NULL",
        "payload.name",
        "payload.n / 0 = 1",
        // A missing field is null, and comparisons with null are false, whichever way round.
        "payload.missing = 1",
        "payload.missing != 1",
        "payload.missing < 1",
        "payload.missing > 1",
        "payload.missing = payload.missing",
        "payload.missing IN (1)",
        "payload.missing NOT IN (1)",
        "null = null",
    ] {
        assert!(!holds(condition, p), "{condition} should not hold");
    }
}

#[test]
fn where_may_use_select_aliases() {
    let r = rule(r#"SELECT payload.temp * 2 + 32 AS f FROM "t/#" WHERE f > 90"#);
    assert_eq!(r.apply(&message("t/1", br#"{"temp": 31}"#)).unwrap()["f"], 94);
    assert!(r.apply(&message("t/1", br#"{"temp": 29}"#)).is_none());
}

#[test]
fn arithmetic_never_fails() {
    assert_eq!(eval("payload.n + 1", r#"{"n": 9223372036854775807}"#), 9_223_372_036_854_775_808.0);
    assert_eq!(eval("payload.n / 0", r#"{"n": 1}"#), Value::Null);
    assert_eq!(eval("payload.n % 0", r#"{"n": 1}"#), Value::Null);
    assert_eq!(eval("payload.n + 1", r#"{"n": "x"}"#), Value::Null);
    assert_eq!(eval("-payload.n", r#"{"n": -9223372036854775808}"#), 9_223_372_036_854_775_808.0);
    assert_eq!(eval("7 / 2", "{}"), 3.5);
    assert_eq!(eval("2 * 3", "{}"), 6);
    assert_eq!(eval("sqrt(payload.x) + 1", r#"{"x": -4}"#), Value::Null);
}

#[test]
fn functions_in_rules() {
    let p = r#"{"name": " Boiler ", "t": 31.46, "raw": "aGk="}"#;
    assert_eq!(eval("lower(trim(payload.name))", p), "boiler");
    assert_eq!(eval("TRIM(payload.name)", p), "Boiler");
    assert_eq!(eval("substr(topic, 2)", p), "1");
    assert_eq!(eval("substring(topic, 0, 1)", p), "t");
    assert_eq!(eval("round(payload.t * 10) / 10", p), 31.5);
    assert_eq!(eval("ceil(payload.t)", p), 32);
    assert_eq!(eval("floor(payload.t)", p), 31);
    assert_eq!(eval("base64_decode(payload.raw)", p), "hi");
    assert_eq!(eval("concat(clientid, '@', peerhost)", p), "dev1@10.0.0.7");
    assert_eq!(eval("md5(clientid)", p), "cea099a8f5ac3e289e317d461beb9261");
    assert_eq!(eval("json_encode(payload.t)", p), "31.46");
    assert_eq!(
        eval("format_date('millisecond', 'Z', '%Y-%m-%dT%H:%M:%S.%3N', timestamp)", p),
        "2022-04-15T10:36:00.123"
    );
    assert_eq!(eval("unix_ts_to_rfc3339(timestamp, 'millisecond')", p), "2022-04-15T10:36:00.123Z");
    assert!(holds("regex_match(clientid, '^dev[0-9]+$')", p));
    assert!(eval("now_timestamp('millisecond')", p).as_i64().unwrap() > 1_650_018_960_123);
}

#[test]
fn client_events_have_their_own_fields() {
    let fields = [("keepalive", json!(60)), ("proto_ver", json!(5)), ("node", json!("braid@a"))];
    let connected = Context {
        event: Event::ClientConnected,
        clientid: "dev1",
        username: Some("alice"),
        peerhost: Some("10.0.0.7"),
        timestamp: 1000,
        topic: "ignored",
        payload: b"ignored",
        fields: &fields,
        ..Context::default()
    };
    let r = rule(r#"SELECT * FROM "$events/client_connected" WHERE keepalive >= 30"#);
    let expected = json!({
        "event": "client.connected", "clientid": "dev1", "username": "alice", "peerhost": "10.0.0.7",
        "timestamp": 1000, "node": "braid@a", "keepalive": 60, "proto_ver": 5,
    });
    assert_eq!(r.apply(&connected), Some(object(expected)));
    assert!(r.matches_event(Event::ClientConnected) && !r.matches_event(Event::MessagePublish));
    assert!(!r.matches_topic("$events/client_connected"));

    // A field the source does not have reads as null, even with the context's member set.
    let both = rule(r#"SELECT topic, payload, clean_start FROM "t/#", "$events/client_connected""#);
    assert_eq!(
        Value::Object(both.apply(&connected).unwrap()),
        json!({"topic": null, "payload": null, "clean_start": null})
    );
}

#[test]
fn subscription_and_delivery_events() {
    let sub_props = [("sub_props", json!({"User-Property": {"app": "x"}}))];
    let subscribed = Context {
        event: Event::SessionSubscribed,
        clientid: "app1",
        topic: "sensors/#",
        qos: 2,
        fields: &sub_props,
        ..Context::default()
    };
    let r = rule(
        r#"SELECT clientid, topic, qos, sub_props.'User-Property'.app AS app FROM "$events/session_subscribed" WHERE topic =~ 'sensors/#'"#,
    );
    assert_eq!(
        Value::Object(r.apply(&subscribed).unwrap()),
        json!({"clientid": "app1", "topic": "sensors/#", "qos": 2, "app": "x"})
    );

    let from = [("from_clientid", json!("dev1")), ("from_username", Value::Null)];
    let delivered = Context {
        event: Event::MessageDelivered,
        clientid: "app1",
        fields: &from,
        ..message("t/1", br#"{"v": 1}"#)
    };
    let r = rule(
        r#"SELECT from_clientid, clientid, payload.v AS v, event FROM "$events/message_delivered", "$events/message_acked""#,
    );
    assert_eq!(
        Value::Object(r.apply(&delivered).unwrap()),
        json!({"from_clientid": "dev1", "clientid": "app1", "v": 1, "event": "message.delivered"})
    );
    let acked = Context { event: Event::MessageAcked, ..delivered };
    assert_eq!(r.apply(&acked).unwrap()["event"], "message.acked");

    let reason = [("reason", json!("no_subscribers"))];
    let dropped = Context { event: Event::MessageDropped, fields: &reason, ..message("t/1", b"x") };
    let r = rule(r#"SELECT reason, topic FROM "$events/message_dropped" WHERE reason = 'no_subscribers'"#);
    assert_eq!(
        Value::Object(r.apply(&dropped).unwrap()),
        json!({"reason": "no_subscribers", "topic": "t/1"})
    );

    let gone = [("reason", json!("normal"))];
    let disconnected =
        Context { event: Event::ClientDisconnected, clientid: "dev1", fields: &gone, ..Context::default() };
    let r =
        rule(r#"SELECT clientid, reason FROM "$events/client_disconnected", "$events/session_unsubscribed""#);
    assert_eq!(
        Value::Object(r.apply(&disconnected).unwrap()),
        json!({"clientid": "dev1", "reason": "normal"})
    );
}

#[test]
fn malformed_rules_are_refused_with_the_problem_named() {
    let cases = [
        (
            r#"SELECT clientid, paylod.temp FROM "t/#""#,
            "line 1, column 18: unknown field `paylod.temp`; did you mean payload.temp?",
        ),
        (r#"SELECT lenght(clientid) FROM "t/#""#, "line 1, column 8: unknown function `lenght`"),
        (r#"SELECT lower(clientid, 1) FROM "t/#""#, "function `lower` takes 1 argument, got 2"),
        (
            r#"SELECT topic FROM "$events/client_connected""#,
            "unknown field `topic`; the sources have event, clientid,",
        ),
        (r#"SELECT clientd FROM "t/#""#, "unknown field `clientd`; did you mean clientid?"),
        (r#"SELECT * FROM "a/#" JOIN "b/#" ON true"#, "JOIN is not supported"),
        (r#"SELECT clientid FROM "t/#" GROUP BY clientid"#, "GROUP BY is not supported"),
        (r#"SELECT * FROM "t/#" ORDER BY timestamp"#, "ORDER BY is not supported"),
        (r#"SELECT * FROM "t/#" LIMIT 1"#, "LIMIT is not supported"),
        (r#"SELECT DISTINCT clientid FROM "t/#""#, "DISTINCT is not supported"),
        (r#"SELECT * FROM "a/#" UNION SELECT * FROM "b/#""#, "UNION is not supported"),
        (r#"SELECT * FROM "t/#" WHERE qos IN (SELECT 1)"#, "subqueries are not supported"),
        (r#"SELECT * FROM (SELECT * FROM "t/#")"#, "subqueries are not supported"),
        (r#"SELECT sum(payload.x) FROM "t/#""#, "aggregate function `sum` is not supported"),
        (r#"SELECT * FROM "a/#/b""#, "invalid topic filter `a/#/b`"),
        (
            r#"SELECT * FROM "$events/client_conected""#,
            "unknown event `$events/client_conected`; did you mean $events/client_connected?",
        ),
        (r#"SELECT * FROM sensors"#, "a source is a double-quoted topic filter or event"),
        (r#"SELECT clientid"#, "a rule needs FROM"),
        (
            r#"SELECT * FROM "t/#" WHERE payload.temp >"#,
            "line 1, column 41: expected an expression, found the end of the rule",
        ),
        (r#"SELECT * FROM "t/#" WHERE clientid = 'dev1"#, "line 1, column 38: Unterminated string literal"),
        (r#"DELETE FROM "t/#""#, "a rule is a SELECT statement, not DELETE"),
        (r#"SELECT * FROM "t/#"; SELECT * FROM "u/#""#, "a rule is a single SELECT statement"),
        ("", "the rule is empty"),
        (
            r#"SELECT * FROM "t/#" WHERE regex_match(clientid, '(')"#,
            "regex_match: invalid regular expression: unclosed group",
        ),
        (r#"SELECT * FROM "$share/g/t/#""#, "`$share/g/t/#` is a shared subscription"),
        (r#"FOREACH payload.list DO item FROM "t/#""#, "FOREACH is not supported"),
        (
            r#"SELECT * FROM "t/#" WHERE regex_match(clientid, payload.re)"#,
            "the pattern must be a string literal",
        ),
        (r#"SELECT * FROM "t/#" WHERE topic =~ 'a/#/b'"#, "invalid topic filter \"a/#/b\" after =~"),
        (r#"SELECT payload.list[0] FROM "t/#""#, "index 0: elements are counted from 1"),
        (r#"SELECT payload.list[payload.i] FROM "t/#""#, "an index is an integer literal"),
        (r#"SELECT * FROM "t/#" WHERE payload.x BETWEEN 1 AND 2"#, "BETWEEN is not supported"),
        (r#"SELECT * FROM "t/#" WHERE clientid LIKE 'a%'"#, "LIKE is not supported; use regex_match"),
        (r#"SELECT CASE WHEN qos = 1 THEN 'a' END FROM "t/#""#, "CASE is not supported"),
        (r#"SELECT CAST(qos AS int) FROM "t/#""#, "CAST is not supported; use int(x)"),
        (r#"SELECT format_date('second', 'Mars', '%Y') FROM "t/#""#, "format_date: invalid offset 'Mars'"),
        (r#"SELECT now_timestamp('hour') FROM "t/#""#, "now_timestamp: unknown time unit \"hour\""),
        (r#"SELECT * FROM "t/#" WHERE qos = ~1"#, "unsupported operator `~`"),
        (r#"SELECT clientid FROM "t/#" AS t"#, "unsupported source"),
        (r#"SELECT user FROM "t/#""#, "unknown field `user`; did you mean username?"),
    ];
    let mut wrong = Vec::new();
    for (sql, expected) in cases {
        match Rule::compile("bad", sql) {
            Ok(_) => wrong.push(format!("{sql}\n  compiled")),
            Err(e) if !e.to_string().contains(expected) => {
                wrong.push(format!("{sql}\n  gave: {e}\n  wanted: {expected}"))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn rules_and_templates_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Rule>();
    shared::<Template>();
}

#[test]
fn expressions_nest_to_a_limit() {
    let chain = |n: usize| vec!["qos = 1"; n].join(" OR ");
    assert!(rule(&format!(r#"SELECT * FROM "t/#" WHERE {}"#, chain(150)))
        .apply(&message("t/1", b""))
        .is_some());
    let err = Rule::compile("deep", &format!(r#"SELECT * FROM "t/#" WHERE {}"#, chain(300))).unwrap_err();
    assert!(err.to_string().contains("an expression nests more than 200 deep"), "{err}");
}

#[test]
fn errors_give_line_and_column_in_multi_line_rules() {
    let err = Rule::compile("hot", "SELECT clientid\nFROM \"t/#\"\nWHERE paylod.temp > 30").unwrap_err();
    let position = err.position().unwrap();
    assert_eq!((position.line, position.column), (3, 7));
    assert_eq!(err.message(), "unknown field `paylod.temp`; did you mean payload.temp?");
}

#[test]
fn templates_render_rule_outputs() {
    let out = rule(HOT).apply(&message("sensors/dev1/temp", br#"{"temp": 31.5}"#)).unwrap();
    let render = |t: &str| Template::parse(t).unwrap().render(&out);
    assert_eq!(render("alerts/${clientid}"), "alerts/dev1");
    assert_eq!(
        render("${clientid}: ${temp} at ${timestamp} on ${topic}"),
        "dev1: 31.5 at 1650018960123 on sensors/dev1/temp"
    );
    let all = rule(r#"SELECT * FROM "t/#""#).apply(&message("t/1", br#"{"temp": 22}"#)).unwrap();
    assert_eq!(Template::parse("${payload.temp}").unwrap().render(&all), "22");
    let halves = Template::parse("a/${clientid}/${nothing}").unwrap();
    assert_eq!(halves.render(&out), "a/dev1/", "a missing value is written as nothing");
    assert_eq!(halves.render_all(&out), None, "unless every value must be there");
    assert_eq!(Template::parse("a/${clientid}").unwrap().render_all(&out).as_deref(), Some("a/dev1"));
    assert_eq!(halves.names().collect::<Vec<_>>(), ["clientid", "nothing"]);
}

#[test]
fn rules_run_on_one_message_share_its_parsed_payload() {
    let hot = Rule::compile("hot", r#"SELECT payload.temp AS t FROM "s/#" WHERE payload.temp > 30"#).unwrap();
    let topic_only = Rule::compile("t", r#"SELECT topic FROM "s/#""#).unwrap();
    let ctx = Context { topic: "s/a", payload: br#"{"temp": 31}"#, ..Context::default() };
    let parsed = std::cell::OnceCell::new();
    assert!(topic_only.apply_sharing(&ctx, &parsed).is_some());
    assert!(parsed.get().is_none(), "a rule that reads no payload field parses nothing");
    assert_eq!(hot.apply_sharing(&ctx, &parsed).unwrap()["t"], 31);
    assert_eq!(
        parsed.get().map(|v| v["temp"].clone()),
        Some(31.into()),
        "parsed once, kept for the next rule"
    );
    assert_eq!(hot.apply_sharing(&ctx, &parsed).unwrap()["t"], 31);
}
