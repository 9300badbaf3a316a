//! Topic authorization from an ACL rules file: publish and subscribe rules, `%u`/`%c`, shared
//! subscriptions' inner filters, `$SYS`, the reason codes for each protocol version, the
//! counters, the 3.1.x disconnect option and reloading the file.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use braid_broker::auth::Security;
use braid_broker::config::ConfigError;
use common::*;
use ReasonCode::NotAuthorized;

const RULES: &str = "
deny  client:blocked    both       #
allow user:admin        subscribe  $SYS/#
allow all               both       users/%u/#
allow all               publish    clients/%c/up
allow all               subscribe  public/#
deny  all               subscribe  secret/#
allow all               subscribe  +/status
allow user:admin        both       #
";

fn acl_config(dir: &tempfile::TempDir, rules: &str) -> (Config, PathBuf) {
    let path = dir.path().join("acl");
    std::fs::write(&path, rules).unwrap();
    let mut config = Config::embedded();
    config.acl.file = Some(path.clone());
    config.auth.reload_interval_secs = 1;
    (config, path)
}

fn user(client_id: &str, name: &str) -> Connect {
    let mut c = connect_packet(client_id, true);
    c.username = Some(name.into());
    c.password = Some(Bytes::from_static(b"-"));
    c
}

fn denied(b: &TestBroker) -> u64 {
    braid_broker::metrics::Metrics::get(&b.broker.metrics().publishes_denied)
}

async fn suback(c: &mut TestClient, filters: &[&str]) -> Vec<ReasonCode> {
    let sub = Subscribe {
        packet_id: 9,
        properties: Properties::default(),
        filters: filters
            .iter()
            .map(|f| ((*f).into(), SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() }))
            .collect(),
    };
    c.send(Packet::Subscribe(sub)).await;
    match c.expect_packet().await {
        Packet::SubAck(a) => a.reasons,
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_rules_v5_and_v311() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(acl_config(&dir, RULES).0).await;
    let (mut bob, _) = TestClient::connect_ok(b.addr, V5, user("bob-c", "bob")).await;
    let got = suback(
        &mut bob,
        &[
            "users/bob/#",
            "users/alice/#",
            "public/news",
            "secret/x",
            "#",
            "$share/g/users/bob/x",
            "$share/g/secret/#",
            "$SYS/#",
            "a/status",
            "+/status",
        ],
    )
    .await;
    use ReasonCode::GrantedQoS1 as G;
    assert_eq!(
        got,
        [
            G,
            NotAuthorized,
            G,
            NotAuthorized,
            NotAuthorized,
            G,
            NotAuthorized,
            NotAuthorized,
            G,
            NotAuthorized
        ]
    );

    let (mut admin, _) = TestClient::connect_ok(b.addr, V311, user("admin-c", "admin")).await;
    let got = suback(&mut admin, &["$SYS/#", "anything/#", "secret/x"]).await;
    // 3.1.1 has one failure code, 0x80 (it decodes as Unspecified error).
    assert_eq!(got, [G, G, ReasonCode::UnspecifiedError], "deny secret/# comes first");
    let (mut anon, _) = TestClient::connect_ok(b.addr, V311, connect_packet("anon", true)).await;
    assert_eq!(suback(&mut anon, &["users/x/#", "public/#"]).await, [ReasonCode::UnspecifiedError, G]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_publish_v5_gets_0x87_and_qos0_is_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let b = start(acl_config(&dir, RULES).0).await;
    let (mut admin, _) = TestClient::connect_ok(b.addr, V5, user("admin-c", "admin")).await;
    // (`#` would overlap `deny all subscribe secret/#`.)
    admin.subscribe("users/#", QoS::AtLeastOnce).await;
    admin.subscribe("clients/#", QoS::AtLeastOnce).await;
    let (mut bob, _) = TestClient::connect_ok(b.addr, V5, user("bob-c", "bob")).await;

    bob.publish_and_ack("users/bob/a", QoS::AtLeastOnce, b"ok", 1).await;
    bob.publish_and_ack("clients/bob-c/up", QoS::AtLeastOnce, b"ok", 2).await;
    bob.send(Packet::Publish(Publish { packet_id: 3, ..publish("users/alice/a", QoS::AtLeastOnce, "no") }))
        .await;
    assert!(
        matches!(bob.expect_packet().await, Packet::PubAck(a) if (a.packet_id, a.reason) == (3, NotAuthorized))
    );
    bob.send(Packet::Publish(Publish {
        packet_id: 4,
        ..publish("clients/other/up", QoS::ExactlyOnce, "no")
    }))
    .await;
    assert!(
        matches!(bob.expect_packet().await, Packet::PubRec(a) if (a.packet_id, a.reason) == (4, NotAuthorized))
    );
    bob.send(Packet::Publish(publish("users/alice/b", QoS::AtMostOnce, "no"))).await;
    bob.ping().await;
    assert_eq!(denied(&b), 3);
    for _ in 0..2 {
        let p = admin.expect_publish().await;
        assert_eq!(&p.payload[..], b"ok");
        admin.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
    admin.expect_nothing(QUIET).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_publish_v311_is_dropped_or_disconnects() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = acl_config(&dir, RULES);
    let b = start(config.clone()).await;
    let (mut admin, _) = TestClient::connect_ok(b.addr, V5, user("admin-c", "admin")).await;
    // (`#` would overlap `deny all subscribe secret/#`.)
    admin.subscribe("users/#", QoS::AtLeastOnce).await;
    admin.subscribe("clients/#", QoS::AtLeastOnce).await;
    let (mut bob, _) = TestClient::connect_ok(b.addr, V311, user("bob-c", "bob")).await;
    // Acknowledged as usual (3.1.1 has no reason codes), not delivered, counted.
    bob.publish_and_ack("users/alice/a", QoS::AtLeastOnce, b"no", 1).await;
    bob.send(Packet::Publish(publish("users/alice/a", QoS::AtMostOnce, "no"))).await;
    bob.ping().await;
    assert_eq!(denied(&b), 2);
    admin.expect_nothing(QUIET).await;

    let mut config = config;
    config.acl.v3_denied_publish = braid_broker::config::DeniedPublish::Disconnect;
    let b = start(config).await;
    let (mut bob, _) = TestClient::connect_ok(b.addr, V311, user("bob-c", "bob")).await;
    bob.publish_and_ack("users/bob/a", QoS::AtLeastOnce, b"ok", 1).await;
    bob.send(Packet::Publish(publish("users/alice/a", QoS::AtMostOnce, "no"))).await;
    assert_eq!(bob.expect_closed().await, None);
    // v5 clients still get 0x87 and stay.
    let (mut bob5, _) = TestClient::connect_ok(b.addr, V5, user("bob-5", "bob")).await;
    bob5.send(Packet::Publish(Publish { packet_id: 2, ..publish("users/alice/a", QoS::AtLeastOnce, "no") }))
        .await;
    assert!(matches!(bob5.expect_packet().await, Packet::PubAck(a) if a.reason == NotAuthorized));
    bob5.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sys_topics_need_a_rule_and_will_topics_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, _) = acl_config(&dir, RULES);
    config.sys.interval_secs = 1;
    let b = start(config).await;
    let (mut admin, _) = TestClient::connect_ok(b.addr, V5, user("admin-c", "admin")).await;
    admin.subscribe("$SYS/broker/uptime", QoS::AtMostOnce).await;
    let p = admin.expect_publish().await;
    assert_eq!(&p.topic[..], "$SYS/broker/uptime");
    // Nobody publishes under $SYS, admin included.
    admin.send(Packet::Publish(Publish { packet_id: 2, ..publish("$SYS/x", QoS::AtLeastOnce, "x") })).await;
    loop {
        match admin.expect_packet().await {
            Packet::PubAck(a) => break assert_eq!(a.reason, NotAuthorized),
            Packet::Publish(_) => continue,
            other => panic!("{other:?}"),
        }
    }
    // A will the ACL would not let the client publish refuses the CONNECT.
    let mut c = user("bob-w", "bob");
    c.will = will("users/alice/will", b"x");
    let (_, ack) = TestClient::connect(b.addr, V5, c.clone()).await;
    assert_eq!(ack.reason, NotAuthorized);
    c.will.as_mut().unwrap().topic = "users/bob/will".into();
    TestClient::connect_ok(b.addr, V5, c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_reload_applies_to_connected_clients() {
    let dir = tempfile::tempdir().unwrap();
    let (config, path) = acl_config(&dir, "allow all publish a/#\n");
    let b = start(config).await;
    let (mut c, _) = TestClient::connect_ok(b.addr, V5, connect_packet("r1", true)).await;
    c.publish_and_ack("a/1", QoS::AtLeastOnce, b"x", 1).await;
    std::fs::write(&path, "# now b only\nallow all publish b/#\n").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        c.send(Packet::Publish(Publish { packet_id: 2, ..publish("a/1", QoS::AtLeastOnce, "x") })).await;
        match c.expect_packet().await {
            Packet::PubAck(a) if a.reason == NotAuthorized => break,
            Packet::PubAck(_) => {}
            other => panic!("{other:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "ACL not reloaded within 5 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.publish_and_ack("b/1", QoS::AtLeastOnce, b"x", 3).await;
}

#[tokio::test]
async fn a_bad_rules_or_password_file_stops_the_broker_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (config, _) = acl_config(&dir, "allow all both a\nallow everyone both b\n");
    let err = Security::check(&config).unwrap_err();
    assert_eq!(err.key(), Some("acl.file"), "{err}");
    assert!(err.to_string().contains("line 2"), "{err}");
    let refused = |e: std::io::Error| {
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        let inner = e.get_ref().and_then(|e| e.downcast_ref::<ConfigError>()).expect("a ConfigError");
        inner.key().map(str::to_string)
    };
    let err = Server::bind(config).await.err().expect("the broker must not start");
    assert_eq!(refused(err).as_deref(), Some("acl.file"));
    let mut config = Config::embedded();
    config.auth.password_file = Some("/nonexistent/passwd".into());
    let err = Server::bind(config).await.err().expect("the broker must not start");
    assert_eq!(refused(err).as_deref(), Some("auth.password_file"));
    let err = Config::load(None, &["auth.jwt_algorithm=\"none\"".into()]).unwrap_err();
    assert_eq!(err.key(), Some("auth.jwt_algorithm"), "{err}");
}
