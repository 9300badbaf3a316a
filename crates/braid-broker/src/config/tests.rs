//! The configuration as users write it: files, environment, flags, and the errors they get.

use super::error::{closest, origin};
use super::*;
use crate::transport_kind::Transport;
use std::io::Write;

#[test]
fn workers_leave_a_core_unless_told() {
    let auto = RuntimeConfig::default();
    assert_eq!((auto.workers(1), auto.workers(2), auto.workers(16)), (1, 1, 15));
    assert_eq!(RuntimeConfig { worker_threads: 4 }.workers(2), 4);
    let c = Config::load(None, &["runtime.worker_threads=3".into()]).unwrap();
    assert_eq!(c.runtime.worker_threads, 3);
}

#[test]
fn defaults_load_without_a_file() {
    let c = Config::load(None, &[]).unwrap();
    assert_eq!(c.listeners.tcp.port(), 1883);
    assert_eq!(c.session.max_queued_messages, 1000);
}

#[test]
fn file_and_overrides_merge_in_order() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[mqtt]\nmax_inflight = 7\n[shared]\nstrategy = \"hash_topic\"").unwrap();
    let c = Config::load(Some(f.path()), &["mqtt.max_inflight=9".into()]).unwrap();
    assert_eq!(c.mqtt.max_inflight, 9);
    assert_eq!(c.shared.strategy, SharedStrategy::HashTopic);
}

#[test]
fn unknown_key_is_named() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[mqtt]\nmax_infligt = 7").unwrap();
    let err = Config::load(Some(f.path()), &[]).unwrap_err();
    assert_eq!(err.key(), Some("mqtt.max_infligt"), "{err}");
    assert!(err.to_string().contains(&*f.path().to_string_lossy()), "{err}");
}

#[test]
fn wrong_type_names_the_key() {
    let err = Config::load(None, &["mqtt.max_inflight=\"many\"".into()]).unwrap_err().to_string();
    assert!(err.contains("mqtt.max_inflight"), "{err}");
}

#[test]
fn out_of_range_value_names_the_key() {
    let err = Config::load(None, &["mqtt.max_qos=3".into()]).unwrap_err().to_string();
    assert!(err.starts_with("mqtt.max_qos"), "{err}");
}

/// The error `Config::load` returns for `overrides`.
fn rejected(overrides: &[&str]) -> ConfigError {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Config::load(None, &overrides).unwrap_err()
}

#[test]
fn each_queue_limit_is_reported_under_its_own_key() {
    let err = rejected(&["session.max_queued_bytes=0"]);
    assert_eq!(err.key(), Some("session.max_queued_bytes"), "{err}");
    assert!(err.to_string().starts_with("session.max_queued_bytes: "), "{err}");
    let err = rejected(&["session.max_queued_messages=0"]);
    assert_eq!(err.key(), Some("session.max_queued_messages"), "{err}");
}

#[test]
fn bad_values_name_their_own_key() {
    let cases: &[(&[&str], &str)] = &[
        (&["mqtt.max_packet_size=8"], "mqtt.max_packet_size"),
        (&["mqtt.max_inflight=0"], "mqtt.max_inflight"),
        (&["mqtt.max_inflight=\"many\""], "mqtt.max_inflight"),
        (&["mqtt.max_infligt=7"], "mqtt.max_infligt"),
        (&["quic.pacing=\"fast\""], "quic.pacing"),
        (&["quic.cert_file=\"cert.pem\""], "quic.key_file"),
        (&["quic.key_file=\"key.pem\""], "quic.cert_file"),
        (&["listeners.wss=\"0.0.0.0:8084\"", "tls.cert=\"cert.pem\""], "tls.key"),
        (&["listeners.ws_path=\"mqtt\""], "listeners.ws_path"),
        (&["auth.jwt_algorithm=\"none\""], "auth.jwt_algorithm"),
        (&["store.data_dir=\"\""], "store.data_dir"),
        (&["session.listeners.ws.max_queued_messages=5"], "session.listeners.ws.max_queued_messages"),
    ];
    for (overrides, key) in cases {
        let err = rejected(overrides);
        assert_eq!(err.key(), Some(*key), "{overrides:?}: {err}");
    }
}

#[test]
fn a_missing_file_is_named_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.toml");
    match Config::load(Some(&path), &[]) {
        Err(err @ ConfigError::File { .. }) => {
            assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
            assert!(std::error::Error::source(&err).is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_input_without_a_key() {
    let err = rejected(&["mqtt.max_inflight"]);
    assert!(matches!(&err, ConfigError::SetSyntax { item } if item == "mqtt.max_inflight"), "{err:?}");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[mqtt\nmax_inflight = ").unwrap();
    let err = Config::load(Some(f.path()), &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }) && err.key().is_none(), "{err:?}");
    assert!(err.to_string().contains("line 1"), "{err}");
    assert!(err.to_string().contains(&*f.path().to_string_lossy()), "{err}");
}

#[test]
fn tls_listeners_are_off_by_default_and_need_a_certificate() {
    let c = Config::load(None, &[]).unwrap();
    assert!(c.listeners.tls.is_none() && c.listeners.ws.is_none() && c.listeners.wss.is_none());
    let c = Config::load(None, &["listeners.ws=127.0.0.1:8080".into()]).unwrap();
    assert_eq!(c.listeners.ws, Some(SocketAddr::from(([127, 0, 0, 1], 8080))));
    let err = Config::load(None, &["listeners.tls=0.0.0.0:8883".into()]).unwrap_err().to_string();
    assert!(err.starts_with("tls.cert") && err.contains("listeners.tls"), "{err}");
    let err = Config::load(None, &["tls.client_auth=require".into()]).unwrap_err().to_string();
    assert!(err.starts_with("tls.client_ca"), "{err}");
    let err = Config::load(None, &["tls.min_version=1.1".into()]).unwrap_err().to_string();
    assert!(err.contains("tls.min_version"), "{err}");
    let c = Config::load(None, &["tls.min_version=1.3".into()]).unwrap();
    assert_eq!(c.tls.min_version, TlsVersion::Tls13);
}

#[test]
fn listener_queue_policies_override_the_session_ones_and_are_checked() {
    let set = ["session.listeners.ws.queue_overflow=\"drop_oldest\"".into()];
    let c = Config::load(None, &set).unwrap();
    assert_eq!(c.session.listeners.get(Transport::Ws).queue_overflow, Some(OverflowPolicy::DropOldest));
    assert_eq!(c.session.listeners.get(Transport::Tcp), &QueuePolicy::default());
    let set = ["session.listeners.quic.queue_overflow_qos0=\"backpressure\"".into()];
    let err = Config::load(None, &set).unwrap_err().to_string();
    assert!(err.contains("session.listeners.quic.queue_overflow_qos0"), "{err}");
    let err = Config::load(None, &["session.listeners.ws.max_queued_messages=5".into()]).unwrap_err();
    assert!(err.to_string().contains("max_queued_messages"), "{err}");
}

#[test]
fn unknown_keys_and_values_get_the_nearest_known_one() {
    let err = rejected(&["mqtt.max_inflights=3"]).to_string();
    assert_eq!(
        err,
        "mqtt.max_inflights: unknown key; did you mean mqtt.max_inflight? (from --set/--listen flag)"
    );
    let err = rejected(&["mqt.max_inflight=3"]).to_string();
    assert!(err.starts_with("mqt: unknown section; did you mean mqtt? "), "{err}");
    let err = rejected(&["session.listener.ws.qos0_pacing_ms=3"]).to_string();
    assert!(err.starts_with("session.listener: unknown key; did you mean session.listeners? "), "{err}");
    let err = rejected(&["shared.strategy=hash_topics"]).to_string();
    assert!(
        err.starts_with(r#"shared.strategy: unknown value "hash_topics"; did you mean hash_topic? "#),
        "{err}"
    );
    // Nothing near: the known ones.
    let err = rejected(&["session.listeners.ws.max_queued_messages=5"]).to_string();
    let keys = "the keys of session.listeners.ws are queue_overflow, queue_overflow_qos0 and qos0_pacing_ms";
    assert!(err.contains(&format!("unknown key; {keys}")), "{err}");
    let err = rejected(&["shared.strategy=fastest"]).to_string();
    assert!(err.contains("expected round_robin, random, hash_clientid, hash_topic or sticky"), "{err}");
    let err = rejected(&["nosuch.key=1"]).to_string();
    assert!(err.starts_with("nosuch: unknown section; the sections are listeners, mqtt, "), "{err}");
    // From a file, in one clean message.
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[mqtt]\nmax_infligt = 7").unwrap();
    let err = Config::load(Some(f.path()), &[]).unwrap_err().to_string();
    let start = "mqtt.max_infligt: unknown key; did you mean mqtt.max_inflight? (from TOML file ";
    assert!(err.starts_with(start), "{err}");
    assert!(!err.contains('`'), "{err}");
}

#[test]
fn a_typo_is_within_a_third_of_the_word() {
    assert_eq!(closest("mqt", &["sys", "mqtt"]), Some("mqtt"));
    assert_eq!(closest("max_infligt", &["max_inflight"]), Some("max_inflight"));
    // Three edits: near enough for a word of nine letters or more, not for a shorter one.
    assert_eq!(closest("max_inflite", &["max_qos", "max_inflight"]), Some("max_inflight"));
    assert_eq!(closest("kitten", &["sitting"]), None);
    assert_eq!(closest("kittens", &["sittings"]), None);
    assert_eq!(closest("the_kitten", &["the_sitting"]), Some("the_sitting"));
    assert_eq!(closest("tcp", &["tls", "ws"]), None);
    assert_eq!(closest("max_inflite", &["max_qos", "max_inflight"]), Some("max_inflight"));
}

#[test]
fn range_errors_say_where_the_value_came_from() {
    let err = rejected(&["mqtt.max_qos=3"]).to_string();
    assert_eq!(err, "mqtt.max_qos: must be 0, 1 or 2 (from --set/--listen flag)");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[mqtt]\nmax_qos = 3\n[cluster]\nenabled = true\nnode = \"a\"\nlease_ms = 10").unwrap();
    let err = Config::load(Some(f.path()), &[]).unwrap_err();
    assert_eq!(err.key(), Some("mqtt.max_qos"));
    let file = f.path().file_name().unwrap().to_string_lossy();
    assert!(err.to_string().contains("(from TOML file ") && err.to_string().contains(&*file), "{err}");
    // The layer that set the value is named, not the first one.
    let err = Config::load(Some(f.path()), &["mqtt.max_qos=1".into()]).unwrap_err();
    assert!(err.to_string().starts_with("cluster.lease_ms: must be at least 1000 (from TOML file "), "{err}");
    let set = ["mqtt.max_qos=1".into(), "cluster.lease_ms=5".into()];
    let err = Config::load(Some(f.path()), &set).unwrap_err();
    assert_eq!(err.to_string(), "cluster.lease_ms: must be at least 1000 (from --set/--listen flag)");
    // The environment: the variable's name.
    let env = origin(&env_metadata(), &["mqtt", "max_qos"]);
    assert_eq!(env.as_deref(), Some("environment variable BRAID_MQTT_MAX_QOS"));
    // A key at its default has no source to name.
    let err = rejected(&["quic.cert_file=\"cert.pem\""]);
    assert_eq!(err.key(), Some("quic.key_file"));
    assert!(!err.to_string().contains("(from"), "{err}");
}

#[test]
fn quic_pacing_is_a_string_or_a_number() {
    for set in ["quic.pacing=25", "quic.pacing=\"25\""] {
        assert_eq!(Config::load(None, &[set.into()]).unwrap().quic.pacing, "25", "{set}");
    }
    assert_eq!(Config::load(None, &["quic.pacing=off".into()]).unwrap().quic.pacing, "off");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[quic]\npacing = 40").unwrap();
    assert_eq!(Config::load(Some(f.path()), &[]).unwrap().quic.pacing, "40");
    for bad in ["quic.pacing=0", "quic.pacing=-3", "quic.pacing=2.5", "quic.pacing=true"] {
        let err = rejected(&[bad]);
        assert_eq!(err.key(), Some("quic.pacing"), "{bad}: {err}");
        assert!(err.to_string().contains("packets per second"), "{bad}: {err}");
    }
}

#[test]
fn bad_enum_value_names_the_key() {
    let err = Config::load(None, &["shared.strategy=fastest".into()]).unwrap_err().to_string();
    assert!(err.contains("shared.strategy"), "{err}");
    let err = Config::load(None, &["quic.pacing=\"fast\"".into()]).unwrap_err().to_string();
    assert!(err.contains("quic.pacing") && err.contains("packets per second"), "{err}");
    assert!(Config::load(None, &["quic.pacing=\"25\"".into()]).is_ok());
}
