//! Authentication: anonymous on/off, the password file (and its reload), JWT (HS256, RS256,
//! ES256, `exp`, ACL claim), the HTTP hook (allow, deny, errors, timeout) and an identity the
//! transport verified. Refusals use CONNACK 0x86/0x87 (v5) and 4/5 (3.1.1).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use jsonwebtoken::{encode as jwt_encode, Algorithm, EncodingKey, Header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use braid_broker::auth::password::PasswordFile;
use ReasonCode::{BadUserNameOrPassword, NotAuthorized};

fn keys() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys")
}

fn with_credentials(client_id: &str, user: Option<&str>, password: Option<&[u8]>) -> Connect {
    let mut c = connect_packet(client_id, true);
    c.username = user.map(Into::into);
    c.password = password.map(Bytes::copy_from_slice);
    c
}

/// Connects and returns the CONNACK reason (the connection is closed on refusal).
async fn connack(addr: std::net::SocketAddr, version: ProtocolVersion, c: Connect) -> ReasonCode {
    let (mut client, ack) = TestClient::connect(addr, version, c).await;
    if ack.reason != ReasonCode::Success {
        assert_eq!(client.expect_closed().await, None, "a refused client is closed");
    }
    ack.reason
}

fn password_file(dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let mut f = PasswordFile::default();
    for (u, p) in users {
        f.set(u, p.as_bytes()).unwrap();
    }
    let path = dir.join("passwd");
    f.save(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_off_refuses_clients_without_credentials() {
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    let b = start(config).await;
    assert_eq!(connack(b.addr, V5, connect_packet("anon5", true)).await, NotAuthorized);
    assert_eq!(
        connack(b.addr, V311, connect_packet("anon3", true)).await,
        NotAuthorized,
        "3.1.1 return code 5"
    );
    // The default lets them in.
    let b = start_default().await;
    assert_eq!(connack(b.addr, V5, connect_packet("anon", true)).await, ReasonCode::Success);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_file_checks_users_and_reloads_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = password_file(dir.path(), &[("alice", "wonderland")]);
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    config.auth.password_file = Some(path.clone());
    config.auth.reload_interval_secs = 1;
    let b = start(config).await;
    let ok = with_credentials("a1", Some("alice"), Some(b"wonderland"));
    assert_eq!(connack(b.addr, V5, ok.clone()).await, ReasonCode::Success);
    assert_eq!(connack(b.addr, V311, ok).await, ReasonCode::Success);
    let wrong = with_credentials("a2", Some("alice"), Some(b"looking-glass"));
    assert_eq!(connack(b.addr, V5, wrong.clone()).await, BadUserNameOrPassword);
    assert_eq!(connack(b.addr, V311, wrong).await, BadUserNameOrPassword, "3.1.1 return code 4");
    let unknown = with_credentials("a3", Some("mallory"), Some(b"x"));
    assert_eq!(connack(b.addr, V5, unknown).await, BadUserNameOrPassword);

    // Add bob and change alice's password: picked up without a restart.
    let reads = b.broker.security().file_reads();
    password_file(dir.path(), &[("alice", "new-pass"), ("bob", "builder")]);
    read_again(&b, reads).await;
    let bob = with_credentials("b1", Some("bob"), Some(b"builder"));
    assert_eq!(connack(b.addr, V5, bob.clone()).await, ReasonCode::Success);
    let old = with_credentials("a4", Some("alice"), Some(b"wonderland"));
    assert_eq!(connack(b.addr, V5, old).await, BadUserNameOrPassword);
    // A file that no longer parses (replaced whole, as `password_file` does) keeps the previous
    // users: checked once the broker has read it, not after a guess at how long that takes.
    let reads = b.broker.security().file_reads();
    let bad = dir.path().join("passwd.new");
    std::fs::write(&bad, "bob\n").unwrap();
    std::fs::rename(&bad, &path).unwrap();
    read_again(&b, reads).await;
    assert_eq!(connack(b.addr, V5, bob).await, ReasonCode::Success);
}

/// Waits until the broker has read its password file again since it had read it `reads` times
/// (`auth.reload_interval_secs` after the change).
async fn read_again(b: &TestBroker, reads: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while b.broker.security().file_reads() == reads {
        assert!(tokio::time::Instant::now() < deadline, "password file not read again within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_password_checks_do_not_block_other_clients() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::embedded();
    config.auth.password_file = Some(password_file(dir.path(), &[("alice", "wonderland")]));
    let b = start(config).await;
    let mut canary = Canary::new(b.addr, "hash").await;
    // Many wrong passwords at once: each costs an Argon2 hash, run off the async workers.
    let mut attempts = Vec::new();
    for i in 0..16 {
        let c = with_credentials(&format!("w{i}"), Some("alice"), Some(b"wrong"));
        attempts.push(tokio::spawn(async move { connack(b.addr, V5, c).await }));
    }
    let started = std::time::Instant::now();
    canary.check().await;
    let canary_time = started.elapsed();
    for a in attempts {
        assert_eq!(a.await.unwrap(), BadUserNameOrPassword);
    }
    println!("QoS 1 round trip during 16 password checks: {canary_time:?}");
    assert!(canary_time < WAIT);
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn token(alg: Algorithm, claims: serde_json::Value) -> Vec<u8> {
    let key = match alg {
        Algorithm::HS256 => EncodingKey::from_secret(b"test-only-hs256-secret"),
        Algorithm::RS256 => {
            EncodingKey::from_rsa_pem(&std::fs::read(keys().join("rsa-private.pem")).unwrap()).unwrap()
        }
        Algorithm::ES256 => {
            EncodingKey::from_ec_pem(&std::fs::read(keys().join("ec-private.pem")).unwrap()).unwrap()
        }
        other => panic!("{other:?}"),
    };
    jwt_encode(&Header::new(alg), &claims, &key).unwrap().into_bytes()
}

async fn jwt_broker(alg: &str, key: &str) -> TestBroker {
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    config.auth.jwt_algorithm = alg.into();
    config.auth.jwt_key_file = Some(keys().join(key));
    start(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_in_the_password_field() {
    for (alg, name, key) in [
        (Algorithm::HS256, "HS256", "hs256.secret"),
        (Algorithm::RS256, "RS256", "rsa-public.pem"),
        (Algorithm::ES256, "ES256", "ec-public.pem"),
    ] {
        let b = jwt_broker(name, key).await;
        let good = token(alg, serde_json::json!({"sub": "dev1", "exp": now() + 60}));
        for version in [V5, V311] {
            let c = with_credentials("j1", Some("dev1"), Some(&good));
            assert_eq!(connack(b.addr, version, c).await, ReasonCode::Success, "{name} {version:?}");
        }
        // v5 allows a password without a user name: the subject is the user.
        assert_eq!(connack(b.addr, V5, with_credentials("j2", None, Some(&good))).await, ReasonCode::Success);
        let expired = token(alg, serde_json::json!({"sub": "dev1", "exp": now() - 5}));
        let c = with_credentials("j3", Some("dev1"), Some(&expired));
        assert_eq!(connack(b.addr, V5, c).await, BadUserNameOrPassword, "{name}: expired");
        let no_exp = token(alg, serde_json::json!({"sub": "dev1"}));
        let c = with_credentials("j4", Some("dev1"), Some(&no_exp));
        assert_eq!(connack(b.addr, V311, c).await, BadUserNameOrPassword, "{name}: exp is required");
        let c = with_credentials("j5", Some("dev2"), Some(&good));
        assert_eq!(
            connack(b.addr, V5, c).await,
            BadUserNameOrPassword,
            "{name}: user name is not the subject"
        );
        let mut tampered = good.clone();
        let n = tampered.len();
        tampered[n - 3] = if tampered[n - 3] == b'A' { b'B' } else { b'A' };
        let c = with_credentials("j6", Some("dev1"), Some(&tampered));
        assert_eq!(connack(b.addr, V5, c).await, BadUserNameOrPassword, "{name}: bad signature");
    }
    // A token signed with another algorithm's key is refused.
    let b = jwt_broker("RS256", "rsa-public.pem").await;
    let hs = token(Algorithm::HS256, serde_json::json!({"sub": "dev1", "exp": now() + 60}));
    assert_eq!(
        connack(b.addr, V5, with_credentials("j7", Some("dev1"), Some(&hs))).await,
        BadUserNameOrPassword
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_acl_claim_limits_the_client() {
    let b = jwt_broker("ES256", "ec-public.pem").await;
    let claims = serde_json::json!({
        "sub": "dev1", "exp": now() + 60,
        "acl": {"publish": ["devices/%u/up"], "subscribe": ["devices/%u/down/#"]}
    });
    let c = with_credentials("dev1-c", Some("dev1"), Some(&token(Algorithm::ES256, claims)));
    let (mut dev, _) = TestClient::connect_ok(b.addr, V5, c).await;
    dev.send(Packet::Subscribe(subscribe("devices/dev1/down/#", QoS::AtLeastOnce))).await;
    assert!(matches!(dev.expect_packet().await, Packet::SubAck(a) if a.reasons == [ReasonCode::GrantedQoS1]));
    let mut other = subscribe("devices/dev2/down/#", QoS::AtLeastOnce);
    other.packet_id = 2;
    dev.send(Packet::Subscribe(other)).await;
    assert!(matches!(dev.expect_packet().await, Packet::SubAck(a) if a.reasons == [NotAuthorized]));
    dev.publish_and_ack("devices/dev1/up", QoS::AtLeastOnce, b"ok", 3).await;
    dev.send(Packet::Publish(Publish { packet_id: 4, ..publish("devices/dev2/up", QoS::AtLeastOnce, "x") }))
        .await;
    match dev.expect_packet().await {
        Packet::PubAck(a) => assert_eq!((a.packet_id, a.reason), (4, NotAuthorized)),
        other => panic!("expected PUBACK 0x87, got {other:?}"),
    }
}

/// A one-route HTTP server on loopback: answers every POST with `reply(body)` after `delay`,
/// and records the request bodies.
async fn hook_server(
    reply: fn(&serde_json::Value) -> String,
    delay: Duration,
) -> (String, std::sync::Arc<parking_lot::Mutex<Vec<serde_json::Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mqtt/auth", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    assert!(head.starts_with("post /mqtt/auth http/1.1"), "{head}");
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break serde_json::from_slice::<serde_json::Value>(&buf[end + 4..end + 4 + len])
                            .unwrap();
                    }
                };
                log.lock().push(body.clone());
                tokio::time::sleep(delay).await;
                let _ = s.write_all(reply(&body).as_bytes()).await;
            });
        }
    });
    (url, seen)
}

fn http_ok(json: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
        json.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_hook_allows_denies_and_fails_closed() {
    let (url, seen) = hook_server(
        |req| match req["username"].as_str() {
            Some("good") if req["password"] == "pw" => {
                http_ok(r#"{"result":"allow","acl":{"publish":["in/%c"],"subscribe":["out/#"]}}"#)
            }
            Some("broken") => "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n".into(),
            Some("garbled") => http_ok("{not json"),
            _ => http_ok(r#"{"result":"deny"}"#),
        },
        Duration::ZERO,
    )
    .await;
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    config.auth.http_url = Some(url);
    let b = start(config).await;
    let (mut c, _) =
        TestClient::connect_ok(b.addr, V5, with_credentials("h1", Some("good"), Some(b"pw"))).await;
    let req = seen.lock()[0].clone();
    assert_eq!(req, serde_json::json!({"clientid": "h1", "username": "good", "password": "pw"}));
    // The hook's ACL applies.
    c.publish_and_ack("in/h1", QoS::AtLeastOnce, b"x", 1).await;
    c.send(Packet::Publish(Publish { packet_id: 2, ..publish("in/h2", QoS::AtLeastOnce, "x") })).await;
    assert!(matches!(c.expect_packet().await, Packet::PubAck(a) if a.reason == NotAuthorized));

    let bad = with_credentials("h2", Some("good"), Some(b"nope"));
    assert_eq!(connack(b.addr, V5, bad.clone()).await, BadUserNameOrPassword);
    assert_eq!(connack(b.addr, V311, bad).await, BadUserNameOrPassword);
    for user in ["broken", "garbled"] {
        let c = with_credentials("h3", Some(user), Some(b"pw"));
        assert_eq!(connack(b.addr, V5, c.clone()).await, NotAuthorized, "{user}");
        assert_eq!(connack(b.addr, V311, c).await, NotAuthorized, "{user}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_hook_timeout_and_unreachable_deny() {
    let (url, _) = hook_server(|_| http_ok(r#"{"result":"allow"}"#), Duration::from_secs(5)).await;
    let mut config = Config::embedded();
    config.auth.http_url = Some(url);
    config.auth.http_timeout_ms = 300;
    let b = start(config).await;
    let started = std::time::Instant::now();
    assert_eq!(connack(b.addr, V5, with_credentials("t1", Some("u"), Some(b"p"))).await, NotAuthorized);
    assert!(started.elapsed() < Duration::from_secs(3), "refused after the timeout, not the reply");
    // Anonymous clients do not ask the hook.
    assert_eq!(connack(b.addr, V5, connect_packet("t2", true)).await, ReasonCode::Success);

    // Nothing listening on the hook's port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut config = Config::embedded();
    config.auth.http_url = Some(format!("http://127.0.0.1:{port}/auth"));
    let b = start(config).await;
    assert_eq!(connack(b.addr, V311, with_credentials("t3", Some("u"), Some(b"p"))).await, NotAuthorized);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_transport_identity_is_the_user_name() {
    // A transport that verified the client (TLS client certificate) hands its name over;
    // credentials in CONNECT are not needed. Here a plain listener stands in for TLS.
    let mut config = Config::embedded();
    config.auth.allow_anonymous = false;
    let acl_dir = tempfile::tempdir().unwrap();
    let acl = acl_dir.path().join("acl");
    std::fs::write(&acl, "allow all publish users/%u/#\n").unwrap();
    config.acl.file = Some(acl);
    let b = start(config).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let broker = b.broker.clone();
    tokio::spawn(async move {
        while let Ok((s, peer)) = listener.accept().await {
            let (rd, wr) = s.into_split();
            let broker = broker.clone();
            tokio::spawn(braid_broker::connection::serve_verified(
                broker,
                rd,
                wr,
                peer,
                braid_broker::transport::Transport::Tls,
                Some("cert-cn".into()),
            ));
        }
    });
    let (mut c, _) = TestClient::connect_ok(addr, V5, connect_packet("tls1", true)).await;
    c.publish_and_ack("users/cert-cn/x", QoS::AtLeastOnce, b"x", 1).await;
    c.send(Packet::Publish(Publish { packet_id: 2, ..publish("users/other/x", QoS::AtLeastOnce, "x") }))
        .await;
    assert!(matches!(c.expect_packet().await, Packet::PubAck(a) if a.reason == NotAuthorized));
    // The plain listener still refuses anonymous clients.
    assert_eq!(connack(b.addr, V5, connect_packet("plain", true)).await, NotAuthorized);
}
