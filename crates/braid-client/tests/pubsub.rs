//! Publish and subscribe through a real Braid broker: QoS 0/1/2 both ways in every protocol
//! version, unsubscribe, wills, subscription options, server topic aliases, CONNACK details.

mod common;

use common::*;

const ALL_QOS: [QoS; 3] = [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce];

async fn round_trip(version: ProtocolVersion) {
    let b = start_default().await;
    let sub = b.client(version, &format!("rt-sub-{}", version as u8)).await;
    let publisher = b.client(version, &format!("rt-pub-{}", version as u8)).await;
    subscribe(&sub, "rt/#", QoS::ExactlyOnce).await;
    for qos in ALL_QOS {
        let topic = format!("rt/{}", qos as u8);
        let handle =
            within(publisher.publish(Message::new(topic.as_str(), format!("hello {}", qos as u8), qos)))
                .await
                .expect("publish");
        assert_eq!(within(handle.acked()).await.expect("acked"), ReasonCode::Success);
        let p = next_message(&sub).await;
        assert_eq!(
            (&*p.topic, &p.payload[..], p.qos),
            (topic.as_str(), format!("hello {}", qos as u8).as_bytes(), qos)
        );
        assert!(!p.retain && !p.dup);
    }
    // The subscriber's acks were sent on take: a QoS 2 message to it completes its handshake,
    // so the broker can deliver the next one with the same window.
    for i in 0..20 {
        publish_acked(&publisher, "rt/again", "x", QoS::ExactlyOnce).await;
        let p = next_message(&sub).await;
        assert_eq!((&*p.topic, p.qos), ("rt/again", QoS::ExactlyOnce), "message {i}");
    }
    expect_no_event(&sub).await;
}

#[tokio::test]
async fn qos_0_1_2_round_trip_v311() {
    round_trip(V311).await;
}

#[tokio::test]
async fn qos_0_1_2_round_trip_v5() {
    round_trip(V5).await;
}

#[tokio::test]
async fn qos_0_1_2_round_trip_v31() {
    round_trip(V31).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_pipelined_publishes_arrive_in_order() {
    // A subscriber that falls behind (the test's threads starved on a loaded machine) must not
    // lose QoS 0 messages to a full queue (1,000 by default) or to pacing's end: what is tested
    // is the client's order, not the broker's QoS 0 overflow (a CI run once lost one here).
    let mut config = Config::embedded();
    config.session.qos0_pacing_ms = 600_000;
    config.session.max_queued_messages = 100_000;
    let b = start(config).await;
    let sub = b.client(V5, "pipe-sub").await;
    subscribe(&sub, "pipe/t", QoS::AtLeastOnce).await;
    let mut opts = b.options(V5, "pipe-pub");
    opts.max_inflight = 32;
    let (publisher, _) = connect(opts).await;
    const N: usize = 5_000;
    let p2 = publisher.clone();
    let producer = tokio::spawn(async move {
        let mut handles = Vec::with_capacity(N);
        for i in 0..N {
            let qos = if i % 2 == 0 { QoS::AtLeastOnce } else { QoS::AtMostOnce };
            handles.push(p2.publish(Message::new("pipe/t", i.to_string(), qos)).await.expect("publish"));
        }
        for h in handles {
            h.acked().await.expect("acked");
        }
    });
    for i in 0..N {
        let p = next_message(&sub).await;
        assert_eq!(&p.payload[..], i.to_string().as_bytes());
    }
    within(producer).await.unwrap();
}

#[tokio::test]
async fn unsubscribe_stops_delivery() {
    for version in [V311, V5] {
        let b = start_default().await;
        let c = b.client(version, "unsub").await;
        subscribe(&c, "u/1", QoS::AtLeastOnce).await;
        publish_acked(&c, "u/1", "before", QoS::AtLeastOnce).await;
        assert_eq!(&next_message(&c).await.payload[..], b"before");
        let reasons =
            within(c.unsubscribe(vec!["u/1".into(), "u/none".into()], Properties::default())).await.unwrap();
        let expected = if version.is_v5() {
            vec![ReasonCode::Success, ReasonCode::NoSubscriptionExisted]
        } else {
            vec![ReasonCode::Success, ReasonCode::Success]
        };
        assert_eq!(reasons, expected);
        publish_acked(&c, "u/1", "after", QoS::AtLeastOnce).await;
        expect_no_event(&c).await;
    }
}

#[tokio::test]
async fn subscribe_reports_granted_and_refused_filters() {
    let b = start_default().await;
    let c = b.client(V5, "suback").await;
    let opts = |qos| SubscriptionOptions { qos, ..Default::default() };
    let reasons = within(c.subscribe(
        vec![
            ("s/0".into(), opts(QoS::AtMostOnce)),
            ("s/1".into(), opts(QoS::AtLeastOnce)),
            ("s/2".into(), opts(QoS::ExactlyOnce)),
            ("s/#/bad".into(), opts(QoS::AtLeastOnce)),
        ],
        Properties::default(),
    ))
    .await
    .unwrap();
    assert_eq!(
        reasons,
        [
            ReasonCode::Success,
            ReasonCode::GrantedQoS1,
            ReasonCode::GrantedQoS2,
            ReasonCode::TopicFilterInvalid
        ]
    );
}

#[tokio::test]
async fn publishing_to_sys_is_rejected_with_the_servers_reason() {
    let b = start_default().await;
    let c = b.client(V5, "sys").await;
    for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let h = within(c.publish(Message::new("$SYS/x", "no", qos))).await.unwrap();
        assert!(matches!(within(h.acked()).await, Err(Error::Rejected(ReasonCode::NotAuthorized))));
    }
    // Invalid topics never reach the wire.
    for topic in ["a/+", "a/#", ""] {
        let r = c.publish(Message::new(topic, "x", QoS::AtMostOnce)).await;
        assert!(matches!(r, Err(Error::Rejected(ReasonCode::TopicNameInvalid))), "{topic:?}");
    }
    publish_acked(&c, "still/fine", "x", QoS::AtLeastOnce).await;
}

#[tokio::test]
async fn will_is_published_on_disconnect_with_will_but_not_on_normal_disconnect() {
    let b = start_default().await;
    let watcher = b.client(V5, "will-watch").await;
    subscribe(&watcher, "will/#", QoS::AtLeastOnce).await;
    let with_will = |id: &str, topic: &str| {
        let mut o = b.options(V5, id);
        o.will = Some(Will {
            topic: topic.into(),
            payload: Bytes::from_static(b"gone"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Properties::default(),
        });
        o
    };
    let (normal, _) = connect(with_will("will-normal", "will/normal")).await;
    within(normal.disconnect(ReasonCode::Success)).await.unwrap();
    let (abnormal, _) = connect(with_will("will-abnormal", "will/abnormal")).await;
    within(abnormal.disconnect(ReasonCode::DisconnectWithWill)).await.unwrap();
    let p = next_message(&watcher).await;
    assert_eq!((&*p.topic, &p.payload[..]), ("will/abnormal", &b"gone"[..]));
    expect_no_event(&watcher).await;
}

#[tokio::test]
async fn will_is_published_when_a_v311_connection_is_taken_over() {
    let b = start_default().await;
    let watcher = b.client(V311, "will-watch-311").await;
    subscribe(&watcher, "will311/#", QoS::AtLeastOnce).await;
    let mut o = b.options(V311, "will-311");
    o.will =
        Some(Will { topic: "will311/t".into(), payload: Bytes::from_static(b"bye"), ..Default::default() });
    let (victim, _) = connect(o).await;
    let _thief = b.client(V311, "will-311").await;
    let p = next_message(&watcher).await;
    assert_eq!((&*p.topic, &p.payload[..]), ("will311/t", &b"bye"[..]));
    // Without reconnect, the taken-over client ends: Disconnected (no reason in 3.1.1), then None.
    assert!(matches!(next_event(&victim).await, Event::Disconnected(None)));
    assert!(within(victim.recv()).await.is_none());
}

#[tokio::test]
async fn no_local_suppresses_own_messages_only() {
    let b = start_default().await;
    let c = b.client(V5, "nl").await;
    let other = b.client(V5, "nl-other").await;
    subscribe_with(
        &c,
        "nl/t",
        SubscriptionOptions { qos: QoS::AtLeastOnce, no_local: true, ..Default::default() },
    )
    .await;
    publish_acked(&c, "nl/t", "mine", QoS::AtLeastOnce).await;
    publish_acked(&other, "nl/t", "theirs", QoS::AtLeastOnce).await;
    assert_eq!(&next_message(&c).await.payload[..], b"theirs");
    expect_no_event(&c).await;
}

#[tokio::test]
async fn retain_handling_options() {
    let b = start_default().await;
    let publisher = b.client(V5, "rh-pub").await;
    let h =
        within(publisher.publish(Message::new("rh/t", "kept", QoS::AtLeastOnce).retain(true))).await.unwrap();
    within(h.acked()).await.unwrap();

    let opts = |rh| SubscriptionOptions { qos: QoS::AtLeastOnce, retain_handling: rh, ..Default::default() };
    let never = b.client(V5, "rh-never").await;
    subscribe_with(&never, "rh/#", opts(RetainHandling::DoNotSend)).await;
    expect_no_event(&never).await;

    let always = b.client(V5, "rh-always").await;
    for _ in 0..2 {
        subscribe_with(&always, "rh/#", opts(RetainHandling::SendAtSubscribe)).await;
        let p = next_message(&always).await;
        assert!(p.retain && &p.payload[..] == b"kept");
    }

    let if_new = b.client(V5, "rh-new").await;
    subscribe_with(&if_new, "rh/#", opts(RetainHandling::SendIfNew)).await;
    assert!(next_message(&if_new).await.retain);
    subscribe_with(&if_new, "rh/#", opts(RetainHandling::SendIfNew)).await;
    expect_no_event(&if_new).await;

    // Retain As Published keeps the flag on live messages; without it, live messages arrive
    // with retain 0.
    let rap = b.client(V5, "rh-rap").await;
    let live = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        retain_as_published: true,
        retain_handling: RetainHandling::DoNotSend,
        ..Default::default()
    };
    subscribe_with(&rap, "rh/#", live).await;
    let h =
        within(publisher.publish(Message::new("rh/t", "live", QoS::AtLeastOnce).retain(true))).await.unwrap();
    within(h.acked()).await.unwrap();
    assert!(next_message(&rap).await.retain);
    let p = next_message(&never).await;
    assert!(!p.retain && &p.payload[..] == b"live");
}

#[tokio::test]
async fn server_topic_aliases_are_resolved() {
    let b = start_default().await;
    let mut o = b.options(V5, "alias-sub");
    o.topic_alias_maximum = 4;
    let (sub, _) = connect(o).await;
    subscribe(&sub, "alias/#", QoS::AtLeastOnce).await;
    let publisher = b.client(V5, "alias-pub").await;
    for i in 0..3 {
        publish_acked(&publisher, "alias/long/topic/name", "x", QoS::AtLeastOnce).await;
        let p = next_message(&sub).await;
        assert_eq!(&*p.topic, "alias/long/topic/name", "message {i}");
        // The broker defines alias 1 with the first message and reuses it (empty topic on the
        // wire) afterwards; the client resolved it.
        assert_eq!(p.properties.topic_alias, Some(1));
    }
    publish_acked(&publisher, "alias/other", "y", QoS::AtLeastOnce).await;
    let p = next_message(&sub).await;
    assert_eq!((&*p.topic, p.properties.topic_alias), ("alias/other", Some(2)));

    // Without a Topic Alias Maximum the server sends none.
    let plain = b.client(V5, "alias-none").await;
    subscribe(&plain, "alias/#", QoS::AtLeastOnce).await;
    publish_acked(&publisher, "alias/other", "z", QoS::AtLeastOnce).await;
    assert_eq!(next_message(&plain).await.properties.topic_alias, None);
}

#[tokio::test]
async fn assigned_client_identifier_is_reported() {
    let b = start_default().await;
    let (c, connected) = connect(b.options(V5, "")).await;
    assert!(connected.client_id.starts_with("braid-"), "{connected:?}");
    assert_eq!(
        connected.properties.assigned_client_identifier.as_deref(),
        Some(connected.client_id.as_str())
    );
    assert!(!connected.session_present);
    publish_acked(&c, "x", "y", QoS::AtLeastOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_keep_alive_is_honoured() {
    let mut config = Config::embedded();
    config.mqtt.max_keep_alive = 1;
    let b = start(config).await;
    let mut o = b.options(V5, "ka");
    o.keep_alive = 60;
    let (c, connected) = connect(o).await;
    assert_eq!(connected.properties.server_keep_alive, Some(1));
    // Silent for 3 s: only our PINGREQs (every second) keep the broker from closing (1.5 s).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    expect_no_event(&c).await;
    subscribe(&c, "ka/t", QoS::AtLeastOnce).await;
    publish_acked(&c, "ka/t", "alive", QoS::AtLeastOnce).await;
    assert_eq!(&next_message(&c).await.payload[..], b"alive");
}

#[tokio::test]
async fn refused_and_unreachable() {
    let b = start_default().await;
    let mut o = b.options(V31, "a-client-id-longer-than-23-characters");
    let err = Client::connect(o.clone()).await.unwrap_err();
    assert!(matches!(err, Error::Refused(ReasonCode::ClientIdentifierNotValid)), "{err:?}");
    o.version = V311;
    o.client_id = String::new();
    o.clean_start = false;
    let err = Client::connect(o).await.unwrap_err();
    assert!(matches!(err, Error::Refused(ReasonCode::ClientIdentifierNotValid)), "{err:?}");

    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let err = Client::connect(ClientOptions::new("127.0.0.1", free.port())).await.unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err:?}");
}

#[tokio::test]
async fn after_disconnect_everything_reports_closed() {
    let b = start_default().await;
    let c = b.client(V5, "closer").await;
    let c2 = c.clone();
    within(c.disconnect(ReasonCode::Success)).await.unwrap();
    assert!(within(c2.recv()).await.is_none());
    assert!(matches!(c2.publish(Message::new("t", "x", QoS::AtMostOnce)).await, Err(Error::Closed)));
    assert!(matches!(c2.publish(Message::new("t", "x", QoS::AtLeastOnce)).await, Err(Error::Closed)));
    assert!(matches!(
        c2.subscribe(vec![("t".into(), Default::default())], Properties::default()).await,
        Err(Error::Closed)
    ));
    assert!(matches!(c2.disconnect(ReasonCode::Success).await, Err(Error::Closed)));
}

#[tokio::test]
async fn dropping_every_handle_disconnects_normally() {
    let b = start_default().await;
    let watcher = b.client(V5, "drop-watch").await;
    subscribe(&watcher, "drop/#", QoS::AtLeastOnce).await;
    let mut o = b.options(V5, "dropper");
    o.will =
        Some(Will { topic: "drop/will".into(), payload: Bytes::from_static(b"w"), ..Default::default() });
    let (c, _) = connect(o).await;
    publish_acked(&c, "drop/last", "bye", QoS::AtLeastOnce).await;
    drop(c);
    assert_eq!(&next_message(&watcher).await.payload[..], b"bye");
    // A normal DISCONNECT: no will.
    expect_no_event(&watcher).await;
    eventually("the broker to see the client go", || {
        braid_broker::metrics::Metrics::get(&b.broker.metrics().clients_connected) == 1
    })
    .await;
}
