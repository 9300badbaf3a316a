//! `[[rules]]` on the broker core, driven packet by packet on the virtual clock: a rule's
//! `republish:` action publishes its output; what it does not select, or what it republishes,
//! goes no further; its counters say what it did.

mod common;

use braid_broker::config::RuleConfig;
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
