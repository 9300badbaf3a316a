//! Every transport end to end through a real broker: MQTT over TLS (server and client
//! certificates, certificate reload), WebSocket and WebSocket over TLS, with messages crossing
//! from one transport to another. Certificates are made at test time with rcgen.

mod common;

use std::path::{Path, PathBuf};

use braid_client::{TlsOptions, Transport};
use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A test CA and the files of the certificates it signed, in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    name: String,
    ca: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let ca_key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join(format!("{name}.pem")), ca.pem()).unwrap();
        Pki { dir, name: name.to_string(), ca: Issuer::new(params, ca_key) }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Signs a certificate for `cn` with `sans` and writes `<file>.pem` and `<file>.key`.
    fn issue(&self, file: &str, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let (cert_path, key_path) = (self.path(&format!("{file}.pem")), self.path(&format!("{file}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    fn ca_file(&self) -> PathBuf {
        self.path(&format!("{}.pem", self.name))
    }
}

/// A broker with TLS, WebSocket and WSS listeners using `server.pem`/`server.key` of `pki`.
async fn tls_broker(pki: &Pki, edit: impl FnOnce(&mut Config)) -> TestBroker {
    let (cert, key) = pki.issue("server", "braid test server", &["localhost"]);
    let mut config = Config::embedded();
    let any = Some("127.0.0.1:0".parse().unwrap());
    config.listeners.tls = any;
    config.listeners.ws = any;
    config.listeners.wss = any;
    config.tls.cert = Some(cert);
    config.tls.key = Some(key);
    edit(&mut config);
    start(config).await
}

fn trusting(ca: &Path) -> TlsOptions {
    TlsOptions { ca_file: Some(ca.into()), ..Default::default() }
}

fn options(port: u16, transport: Transport, client_id: &str) -> ClientOptions {
    let mut o = ClientOptions::new("localhost", port);
    o.transport = transport;
    o.client_id = client_id.into();
    o
}

fn ws(tls: Option<TlsOptions>) -> Transport {
    Transport::WebSocket { path: "/mqtt".into(), tls }
}

#[tokio::test]
async fn messages_cross_every_transport() {
    let pki = Pki::new("ca");
    let b = tls_broker(&pki, |_| {}).await;
    let tls = trusting(&pki.ca_file());
    let clients = [
        ("tcp", b.addr.port(), Transport::Tcp),
        ("tls", b.addrs.tls.unwrap().port(), Transport::Tls(tls.clone())),
        ("ws", b.addrs.ws.unwrap().port(), ws(None)),
        ("wss", b.addrs.wss.unwrap().port(), ws(Some(tls))),
    ];
    for version in [V31, V311, V5] {
        let mut connected = Vec::new();
        for (name, port, transport) in &clients {
            let mut o = options(*port, transport.clone(), &format!("{name}-{}", version as u8));
            o.version = version;
            let (c, _) = connect(o).await;
            subscribe(&c, "x/#", QoS::ExactlyOnce).await;
            connected.push((*name, c));
        }
        // 300 KB: more than one write buffer, so one packet spans several WebSocket messages.
        let big = Bytes::from(vec![7u8; 300_000]);
        for (from, c) in &connected {
            for payload in [Bytes::from(*from), big.clone()] {
                let handle = within(c.publish(Message::new(format!("x/{from}"), payload, QoS::AtLeastOnce)))
                    .await
                    .unwrap();
                within(handle.acked()).await.unwrap();
            }
        }
        for (to, c) in &connected {
            for (from, _) in &connected {
                let small = next_message(c).await;
                assert_eq!(
                    (&*small.topic, &small.payload[..]),
                    (&*format!("x/{from}"), from.as_bytes()),
                    "at {to}"
                );
                let large = next_message(c).await;
                assert_eq!(large.payload, big, "large message from {from} at {to}");
            }
        }
    }
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_refused_unless_insecure() {
    let pki = Pki::new("ca");
    let b = tls_broker(&pki, |_| {}).await;
    let other = Pki::new("other-ca");
    let port = b.addrs.tls.unwrap().port();
    let err = Client::connect(options(port, Transport::Tls(trusting(&other.ca_file())), "untrusted"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    let insecure = TlsOptions { insecure: true, ..Default::default() };
    connect(options(port, Transport::Tls(insecure.clone()), "insecure")).await;
    // An address the certificate does not name: refused, unless told the name to check.
    let mut o = options(port, Transport::Tls(trusting(&pki.ca_file())), "by-ip");
    o.host = "127.0.0.1".into();
    let err = Client::connect(o.clone()).await.unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    o.transport =
        Transport::Tls(TlsOptions { server_name: Some("localhost".into()), ..trusting(&pki.ca_file()) });
    connect(o).await;
}

#[tokio::test]
async fn client_certificates_required_or_optional() {
    let pki = Pki::new("ca");
    let clients = Pki::new("client-ca");
    let (cert, key) = clients.issue("alice", "alice", &[]);
    let (stranger_cert, stranger_key) = pki.issue("mallory", "mallory", &[]);
    let with_cert = |cert: &Path, key: &Path| TlsOptions {
        cert: Some(cert.into()),
        key: Some(key.into()),
        ..trusting(&pki.ca_file())
    };
    for mode in [braid_broker::config::ClientAuth::Require, braid_broker::config::ClientAuth::Optional] {
        let b = tls_broker(&pki, |c| {
            c.tls.client_auth = mode;
            c.tls.client_ca = Some(clients.ca_file());
            c.tls.use_cn_as_username = true;
        })
        .await;
        for port in [b.addrs.tls.unwrap().port(), b.addrs.wss.unwrap().port()] {
            let transport = |t: TlsOptions| match Some(port) == b.addrs.tls.map(|a| a.port()) {
                true => Transport::Tls(t),
                false => ws(Some(t)),
            };
            connect(options(port, transport(with_cert(&cert, &key)), "alice")).await;
            let stranger = options(port, transport(with_cert(&stranger_cert, &stranger_key)), "mallory");
            assert!(Client::connect(stranger).await.is_err(), "{mode:?}: certificate of another CA accepted");
            let none = Client::connect(options(port, transport(trusting(&pki.ca_file())), "anonymous")).await;
            match mode {
                braid_broker::config::ClientAuth::Require => {
                    assert!(none.is_err(), "no certificate accepted")
                }
                _ => drop(none.expect("optional: no certificate is fine")),
            }
        }
    }
}

#[tokio::test]
async fn new_certificate_files_are_used_for_new_connections() {
    let pki = Pki::new("ca");
    let b = tls_broker(&pki, |c| c.tls.reload_interval_secs = 1).await;
    let port = b.addrs.tls.unwrap().port();
    let old = connect(options(port, Transport::Tls(trusting(&pki.ca_file())), "old")).await.0;
    // The files are replaced by a certificate from another CA (same paths).
    let next = Pki::new("next-ca");
    let (cert, key) = next.issue("server", "braid test server", &["localhost"]);
    std::fs::copy(&cert, pki.path("server.pem")).unwrap();
    std::fs::copy(&key, pki.path("server.key")).unwrap();
    let mut reloaded = false;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if Client::connect(options(port, Transport::Tls(trusting(&next.ca_file())), "new")).await.is_ok() {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the new certificate was not picked up within 4 s");
    assert!(Client::connect(options(port, Transport::Tls(trusting(&pki.ca_file())), "stale")).await.is_err());
    // The connection made with the old certificate goes on.
    assert_eq!(publish_acked(&old, "still/here", "yes", QoS::AtLeastOnce).await, ReasonCode::Success);
}

#[tokio::test]
async fn bad_certificate_files_name_the_key_and_the_file() {
    let pki = Pki::new("ca");
    let (cert, key) = pki.issue("server", "s", &["localhost"]);
    let garbage = pki.path("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let missing = pki.path("missing.pem");
    let (other_cert, _) = pki.issue("other", "o", &["localhost"]);
    let cases: [(PathBuf, PathBuf, &str); 4] = [
        (missing.clone(), key.clone(), "tls.cert"),
        (garbage.clone(), key.clone(), "tls.cert"),
        (cert.clone(), garbage.clone(), "tls.key"),
        (other_cert, key.clone(), "tls.cert/tls.key"),
    ];
    for (cert, key, named) in cases {
        let mut config = Config::embedded();
        config.listeners.tls = Some("127.0.0.1:0".parse().unwrap());
        config.tls.cert = Some(cert.clone());
        config.tls.key = Some(key.clone());
        let err = Server::bind(config).await.err().expect("bad TLS files accepted");
        let msg = err.to_string();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{msg}");
        assert!(msg.starts_with(named), "{msg} should name {named}");
        assert!(msg.contains("garbage") || msg.contains("missing") || msg.contains(".pem"), "{msg}");
    }
}

#[tokio::test]
async fn websocket_at_another_path_is_refused() {
    let b = start({
        let mut c = Config::embedded();
        c.listeners.ws = Some("127.0.0.1:0".parse().unwrap());
        c.listeners.ws_path = "/broker".into();
        c
    })
    .await;
    let port = b.addrs.ws.unwrap().port();
    let err = Client::connect(options(port, ws(None), "lost")).await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    let at = Transport::WebSocket { path: "/broker".into(), tls: None };
    connect(options(port, at, "found")).await;
}
