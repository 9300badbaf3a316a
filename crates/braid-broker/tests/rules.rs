//! `[[rules]]` on the broker core, driven packet by packet on the virtual clock: a rule's
//! `republish:` action publishes its output; what it does not select, or what it republishes,
//! goes no further; its counters say what it did.

mod common;

use braid_broker::config::{OverflowPolicy, RuleConfig, SinkConfig};
use braid_broker::harness::Harness;
use braid_broker::Broker;
use common::*;

fn broker_with(sql: &str, action: &str) -> std::sync::Arc<Broker> {
    let mut config = Config::embedded();
    config.rules = vec![RuleConfig { name: "r".into(), sql: sql.into(), actions: vec![action.into()] }];
    Broker::new(config)
}

#[test]
fn a_rule_republishes_its_output_as_json_with_the_publish_time() {
    let b = broker_with(
        r#"SELECT clientid, payload.temp AS temp, timestamp FROM "sensors/+/temp" WHERE payload.temp > 30"#,
        "republish:alerts/${clientid}",
    );
    let mut h = Harness::new(&b);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("#", QoS::AtMostOnce)));
    h.received(w);
    let (p, _) = h.connect(connect_packet("dev1", true));
    for temp in ["31.5", "20"] {
        let body = format!(r#"{{"temp": {temp}}}"#);
        h.send(p, Packet::Publish(publish("sensors/dev1/temp", QoS::AtMostOnce, body)));
    }
    let got: Vec<(String, String)> = h
        .received(w)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => {
                Some((p.topic.to_string(), String::from_utf8_lossy(&p.payload).into_owned()))
            }
            _ => None,
        })
        .collect();
    let alerts: Vec<_> = got.iter().filter(|(t, _)| t.starts_with("alerts/")).collect();
    assert_eq!(alerts.len(), 1, "only 31.5 passes the WHERE: {got:?}");
    let out: serde_json::Value = serde_json::from_str(&alerts[0].1).unwrap();
    assert_eq!(alerts[0].0, "alerts/dev1");
    assert_eq!((out["clientid"].as_str(), out["temp"].as_f64()), (Some("dev1"), Some(31.5)));
    let expected = b.unix_clock().unix_ms(h.now()) as i64;
    assert_eq!(out["timestamp"].as_i64(), Some(expected), "the publish's time, on the broker's clock");
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!((report.matched, report.passed, report.failed), (1, 1, 0));
}

#[test]
fn a_republished_message_does_not_run_the_rules_again_and_a_bad_topic_is_counted() {
    let b = broker_with(r##"SELECT topic FROM "#""##, "republish:again/${topic}");
    let mut h = Harness::new(&b);
    let (p, _) = h.connect(connect_packet("p", true));
    h.send(p, Packet::Publish(publish("a", QoS::AtMostOnce, "x")));
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!(report.matched, 1, "again/a, which the rule republished, is not run on: no loop");
    let b = broker_with(r#"SELECT payload.t AS t FROM "s""#, "republish:out/${t}");
    let mut h = Harness::new(&b);
    let (p, _) = h.connect(connect_packet("p", true));
    h.send(p, Packet::Publish(publish("s", QoS::AtMostOnce, r#"{"t": "a/#"}"#)));
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!((report.matched, report.passed, report.failed), (1, 0, 1));
    assert!(report.last_error.as_deref().is_some_and(|e| e.contains("out/a/#")), "{:?}", report.last_error);
}

/// The payloads a client subscribed to `events/#` got, as JSON.
fn events(h: &mut Harness<'_>, w: braid_broker::harness::ClientKey) -> Vec<serde_json::Value> {
    h.received(w)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) if p.topic.starts_with("events/") => serde_json::from_slice(&p.payload).ok(),
            _ => None,
        })
        .collect()
}

#[test]
fn client_events_reach_rules_with_emqx_fields() {
    let mut config = Config::embedded();
    let rule = |name: &str, sql: &str| RuleConfig {
        name: name.into(),
        sql: sql.into(),
        actions: vec!["republish:events/${event}/${clientid}".into()],
    };
    config.rules = vec![
        rule(
            "conn",
            r#"SELECT event, clientid, proto_ver, keepalive, clean_start FROM "$events/client_connected""#,
        ),
        rule("gone", r#"SELECT event, clientid, reason FROM "$events/client_disconnected""#),
        rule(
            "subs",
            r#"SELECT event, clientid, topic, qos FROM "$events/session_subscribed", "$events/session_unsubscribed""#,
        ),
    ];
    let b = Broker::new(config);
    let mut h = Harness::new(&b);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("events/#", QoS::AtMostOnce)));
    h.received(w);
    let c = Connect { keep_alive: 10, ..connect_packet("dev", true) };
    let (d, _) = h.connect(c);
    h.send(d, Packet::Subscribe(subscribe("cmd/dev", QoS::AtLeastOnce)));
    let filters = vec!["cmd/dev".into()];
    h.send(
        d,
        Packet::Unsubscribe(braid_proto::Unsubscribe {
            packet_id: 2,
            properties: Properties::default(),
            filters,
        }),
    );
    let got = events(&mut h, w);
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0]["event"], "client.connected");
    assert_eq!(
        (&got[0]["clientid"], &got[0]["proto_ver"], &got[0]["keepalive"]),
        (&"dev".into(), &5.into(), &10.into())
    );
    assert_eq!(got[0]["clean_start"], true);
    assert_eq!(
        (&got[1]["event"], &got[1]["topic"], &got[1]["qos"]),
        (&"session.subscribed".into(), &"cmd/dev".into(), &1.into())
    );
    assert_eq!((&got[2]["event"], &got[2]["topic"]), (&"session.unsubscribed".into(), &"cmd/dev".into()));
    // Silent past 1.5 times its keep alive: closed, and the rule says why.
    h.advance(std::time::Duration::from_secs(16));
    let got = events(&mut h, w);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0]["event"], &got[0]["reason"]),
        (&"client.disconnected".into(), &"keepalive_timeout".into())
    );
    let (e, _) = h.connect(connect_packet("polite", true));
    h.received(w);
    h.send(
        e,
        Packet::Disconnect(Disconnect { reason: ReasonCode::Success, properties: Properties::default() }),
    );
    let got = events(&mut h, w);
    assert_eq!(
        got.iter().map(|g| (g["clientid"].as_str(), g["reason"].as_str())).collect::<Vec<_>>(),
        [(Some("polite"), Some("normal"))]
    );
}

#[test]
fn a_taken_over_connection_is_disconnected_with_reason_takenover() {
    let b = broker_with(
        r#"SELECT clientid, reason FROM "$events/client_disconnected""#,
        "republish:events/${clientid}",
    );
    let mut h = Harness::new(&b);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("events/#", QoS::AtMostOnce)));
    h.received(w);
    h.connect(connect_packet("dev", false));
    h.connect(connect_packet("dev", false));
    let got = events(&mut h, w);
    assert_eq!(got, [serde_json::json!({"clientid": "dev", "reason": "takenover"})]);
}

#[test]
fn message_events_follow_a_message_to_its_subscribers_their_acks_and_nowhere() {
    let mut config = Config::embedded();
    config.rules = vec![RuleConfig {
        name: "m".into(),
        sql: r#"SELECT event, clientid, from_clientid, topic, qos, payload, reason
                FROM "$events/message_delivered", "$events/message_acked", "$events/message_dropped""#
            .into(),
        actions: vec!["republish:events/${event}/${clientid}".into()],
    }];
    let b = Broker::new(config);
    let mut h = Harness::new(&b);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("events/#", QoS::AtMostOnce)));
    h.received(w);
    let (s, _) = h.connect(connect_packet("sub", true));
    h.send(s, Packet::Subscribe(subscribe("t/#", QoS::AtLeastOnce)));
    h.received(s);
    let (p, _) = h.connect(connect_packet("pub", true));
    h.send(p, Packet::Publish(publish("t/1", QoS::AtLeastOnce, "hello")));
    let delivered = events(&mut h, w);
    assert_eq!(
        delivered,
        [serde_json::json!({"event": "message.delivered", "clientid": "sub", "from_clientid": "pub",
                            "topic": "t/1", "qos": 1, "payload": "hello", "reason": null})],
        "the watcher's own QoS 0 copies of the events are not events again"
    );
    let id = h
        .received(s)
        .into_iter()
        .find_map(|p| match p {
            Packet::Publish(p) => Some(p.packet_id),
            _ => None,
        })
        .expect("the subscriber got the message");
    h.send(s, Packet::PubAck(braid_proto::Ack::new(id)));
    let acked = events(&mut h, w);
    assert_eq!(acked.len(), 1, "{acked:?}");
    assert_eq!((&acked[0]["event"], &acked[0]["clientid"]), (&"message.acked".into(), &"sub".into()));
    h.send(s, Packet::PubAck(braid_proto::Ack::new(id)));
    assert_eq!(events(&mut h, w), Vec::<serde_json::Value>::new(), "an unknown id acknowledges nothing");
    h.send(p, Packet::Publish(publish("nobody/listens", QoS::AtMostOnce, "x")));
    let dropped = events(&mut h, w);
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert_eq!(
        (&dropped[0]["event"], &dropped[0]["clientid"], &dropped[0]["reason"]),
        (&"message.dropped".into(), &"pub".into(), &"no_subscribers".into())
    );
}

#[test]
fn a_republish_sink_sets_topic_payload_qos_retain_and_user_properties_from_templates() {
    let mut config = Config::embedded();
    config.rules = vec![RuleConfig {
        name: "r".into(),
        sql: r#"SELECT clientid, payload.temp AS temp FROM "s/#""#.into(),
        actions: vec!["again".into()],
    }];
    config.sinks = vec![SinkConfig {
        name: "again".into(),
        kind: braid_broker::config::SinkKind::Republish,
        topic: "alerts/${clientid}".into(),
        body: "${temp} C".into(),
        qos: 1,
        retain: true,
        user_properties: [("from".to_string(), "${clientid}".to_string())].into(),
        ..Default::default()
    }];
    let b = Broker::new(config);
    let mut h = Harness::new(&b);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("alerts/#", QoS::AtLeastOnce)));
    h.received(w);
    let (p, _) = h.connect(connect_packet("dev1", true));
    h.send(p, Packet::Publish(publish("s/a", QoS::AtMostOnce, r#"{"temp": 31}"#)));
    let got: Vec<_> = h
        .received(w)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p),
            _ => None,
        })
        .collect();
    let [p] = &got[..] else { panic!("one message: {got:?}") };
    assert_eq!((p.topic.as_ref(), &p.payload[..], p.qos), ("alerts/dev1", &b"31 C"[..], QoS::AtLeastOnce));
    let props: Vec<(&str, &str)> = p.properties.user_properties.iter().map(|(k, v)| (&**k, &**v)).collect();
    assert_eq!(props, [("from", "dev1")]);
    assert_eq!(b.operators().retained_matching("alerts/dev1", h.now()).len(), 1, "kept as retained");
    assert!(b.rules().outboxes().is_empty(), "a republish sink has no outbox");
}

/// A broker whose rule `r` sends its outputs to sink `s`; the harness's sessions (the outbox's
/// among them: the sink's worker, which would give it the sink's limits, does not run here)
/// queue up to `queue.0` messages and then do as `queue.1` says.
fn broker_with_sink(sql: &str, queue: (usize, OverflowPolicy)) -> std::sync::Arc<Broker> {
    let mut config = Config::embedded();
    config.rules = vec![RuleConfig { name: "r".into(), sql: sql.into(), actions: vec!["s".into()] }];
    config.sinks =
        vec![SinkConfig { name: "s".into(), url: "http://127.0.0.1:9/".into(), ..Default::default() }];
    (config.session.max_queued_messages, config.session.queue_overflow) = queue;
    Broker::new(config)
}

/// The rule outputs queued in sink `s`'s outbox, as the sink's worker takes them.
fn outbox_outputs(h: &mut Harness<'_>) -> Vec<serde_json::Value> {
    let (o, _) = h.connect(connect_with_expiry("$internal/sink/s", false, u32::MAX));
    h.received(o)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => {
                assert_eq!((p.topic.as_ref(), p.qos), ("$sink/s", QoS::AtLeastOnce));
                serde_json::from_slice(&p.payload).ok()
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_rule_puts_its_outputs_for_a_sink_in_the_sinks_outbox_and_nowhere_else() {
    let b = broker_with_sink(
        r#"SELECT id, clientid, payload.temp AS temp FROM "s/#" WHERE payload.temp > 30"#,
        (100, OverflowPolicy::DropOldest),
    );
    let mut h = Harness::new(&b);
    let (o, _) = h.connect(connect_with_expiry("$internal/sink/s", false, u32::MAX));
    h.drop_connection(o);
    let (w, _) = h.connect(connect_packet("watcher", true));
    h.send(w, Packet::Subscribe(subscribe("#", QoS::AtLeastOnce)));
    h.send(w, Packet::Subscribe(subscribe("$sink/#", QoS::AtLeastOnce)));
    h.received(w);
    let (p, _) = h.connect(connect_packet("dev1", true));
    for temp in [31, 5, 32] {
        h.send(p, Packet::Publish(publish("s/a", QoS::AtLeastOnce, format!(r#"{{"temp": {temp}}}"#))));
    }
    let outputs = outbox_outputs(&mut h);
    let temps: Vec<_> = outputs.iter().map(|o| o["temp"].as_i64()).collect();
    assert_eq!(temps, [Some(31), Some(32)], "{outputs:?}");
    assert_ne!(outputs[0]["id"], outputs[1]["id"], "each message has an id of its own");
    let seen: Vec<String> = h
        .received(w)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.topic.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(seen, ["s/a", "s/a", "s/a"], "no subscriber gets what goes to a sink");
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!((report.matched, report.passed, report.failed), (2, 2, 0));
}

#[test]
fn an_output_with_no_room_in_the_outbox_is_counted_against_the_rule_and_the_sink() {
    let b = broker_with_sink(r#"SELECT payload.n AS n FROM "s/#""#, (2, OverflowPolicy::DropNewest));
    let mut h = Harness::new(&b);
    let (p, _) = h.connect(connect_packet("dev1", true));
    h.send(p, Packet::Publish(publish("s/a", QoS::AtLeastOnce, r#"{"n": 0}"#)));
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!(report.failed, 1, "no outbox yet (the sink never started)");
    assert!(report.last_error.as_deref().is_some_and(|e| e.contains("not open")), "{:?}", report.last_error);
    let (o, _) = h.connect(connect_with_expiry("$internal/sink/s", false, u32::MAX));
    h.drop_connection(o);
    for n in 1..=3 {
        h.send(p, Packet::Publish(publish("s/a", QoS::AtLeastOnce, format!(r#"{{"n": {n}}}"#))));
    }
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!((report.matched, report.passed, report.failed), (4, 2, 2));
    assert!(report.last_error.as_deref().is_some_and(|e| e.contains("full")), "{:?}", report.last_error);
    assert_eq!(b.rules().outboxes()[0].dropped(), 2);
    let ns: Vec<_> = outbox_outputs(&mut h).iter().map(|o| o["n"].as_i64()).collect();
    assert_eq!(ns, [Some(1), Some(2)]);
}

#[test]
fn an_output_dropped_to_make_room_counts_against_the_sink_not_the_rule() {
    let b = broker_with_sink(r#"SELECT payload.n AS n FROM "s/#""#, (2, OverflowPolicy::DropOldest));
    let mut h = Harness::new(&b);
    let (o, _) = h.connect(connect_with_expiry("$internal/sink/s", false, u32::MAX));
    h.drop_connection(o);
    let (p, _) = h.connect(connect_packet("dev1", true));
    for n in 1..=3 {
        h.send(p, Packet::Publish(publish("s/a", QoS::AtLeastOnce, format!(r#"{{"n": {n}}}"#))));
    }
    let [report] = &b.rules().reports()[..] else { panic!("one rule") };
    assert_eq!((report.matched, report.passed, report.failed), (3, 3, 0), "every output went in");
    assert_eq!(b.rules().outboxes()[0].dropped(), 1, "the oldest made room");
    let ns: Vec<_> = outbox_outputs(&mut h).iter().map(|o| o["n"].as_i64()).collect();
    assert_eq!(ns, [Some(2), Some(3)]);
}
