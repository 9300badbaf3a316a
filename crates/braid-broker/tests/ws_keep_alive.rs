//! Keep alive over WebSocket and WSS: bytes of a large PUBLISH still arriving inside one
//! WebSocket frame count as liveness, as they do on TCP (keep_alive.rs). The client here is
//! hand-made (HTTP upgrade by hand, frames by tungstenite's frame codec) so that the test decides
//! how the bytes are framed and paced.

mod common;

use std::io::Cursor;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use braid_proto::tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};
use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A broker with WS and WSS listeners on a self-signed certificate for `localhost`, and that
/// certificate (DER) for clients to trust.
async fn ws_broker(dir: &tempfile::TempDir) -> (TestBroker, Vec<u8>) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert_path, key_path) = (dir.path().join("server.pem"), dir.path().join("server.key"));
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    let mut config = Config::embedded();
    config.listeners.ws = Some("127.0.0.1:0".parse().unwrap());
    config.listeners.wss = Some("127.0.0.1:0".parse().unwrap());
    config.tls.cert = Some(cert_path);
    config.tls.key = Some(key_path);
    (start(config).await, cert.cert.der().to_vec())
}

/// An MQTT client over a WebSocket it frames itself.
struct WsClient {
    io: Box<dyn Io>,
    /// Bytes read and not yet taken as frames.
    rbuf: Vec<u8>,
    /// Payload of binary frames not yet decoded as MQTT packets.
    mqtt: BytesMut,
}

impl WsClient {
    /// WebSocket to the broker's `ws` listener, or its `wss` one trusting `cert`.
    async fn open(b: &TestBroker, tls_cert: Option<&[u8]>) -> WsClient {
        let io: Box<dyn Io> = match tls_cert {
            None => Box::new(TcpStream::connect(b.addrs.ws.unwrap()).await.unwrap()),
            Some(der) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(der.to_vec().into()).unwrap();
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                let tcp = TcpStream::connect(b.addrs.wss.unwrap()).await.unwrap();
                let name = "localhost".try_into().unwrap();
                Box::new(tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap())
            }
        };
        let mut c = WsClient { io, rbuf: Vec::new(), mqtt: BytesMut::new() };
        let request =
            "GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                       Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                       Sec-WebSocket-Protocol: mqtt\r\n\r\n";
        c.io.write_all(request.as_bytes()).await.unwrap();
        while !c.rbuf.ends_with(b"\r\n\r\n") {
            let byte =
                tokio::time::timeout(WAIT, c.io.read_u8()).await.expect("handshake timed out").unwrap();
            c.rbuf.push(byte);
        }
        assert!(c.rbuf.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&c.rbuf));
        c.rbuf.clear();
        c
    }

    /// `packet` (v5) in one masked binary frame.
    fn frame(packet: &Packet) -> Vec<u8> {
        let mut frame = Frame::message(encode_packet(packet, V5).freeze(), OpCode::Data(Data::Binary), true);
        frame.header_mut().mask = Some(rand::random());
        let mut out = Vec::new();
        frame.format(&mut out).unwrap();
        out
    }

    async fn send(&mut self, packet: &Packet) {
        self.io.write_all(&Self::frame(packet)).await.unwrap();
    }

    /// The next MQTT packet from the broker's binary frames; `None` once it closed.
    async fn recv(&mut self) -> Option<Packet> {
        loop {
            if let Some(p) = decode(&mut self.mqtt, V5, u32::MAX).unwrap() {
                return Some(p);
            }
            let mut cursor = Cursor::new(&self.rbuf[..]);
            if let Some((header, len)) = FrameHeader::parse(&mut cursor).unwrap() {
                let start = cursor.position() as usize;
                let end = start + len as usize;
                if self.rbuf.len() >= end {
                    assert_eq!(header.mask, None, "the broker does not mask");
                    match header.opcode {
                        OpCode::Data(Data::Binary | Data::Continue) => {
                            self.mqtt.extend_from_slice(&self.rbuf[start..end])
                        }
                        OpCode::Control(_) => {}
                        other => panic!("unexpected {other:?} frame"),
                    }
                    self.rbuf.drain(..end);
                    continue;
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let n =
                tokio::time::timeout(WAIT, self.io.read(&mut chunk)).await.expect("read timed out").ok()?;
            if n == 0 {
                return None;
            }
            self.rbuf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A 300 KB PUBLISH in one WebSocket frame, trickled over about 4 s by a client with keep alive
/// 1 s: the client stays connected and the message is delivered.
async fn slow_upload_in_one_frame(tls: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (b, cert) = ws_broker(&dir).await;
    let (mut sub, _) = TestClient::connect_ok(b.addr, V5, connect_packet("ws-big-sub", true)).await;
    sub.subscribe("big/ws", QoS::AtLeastOnce).await;

    let mut c = WsClient::open(&b, tls.then_some(&cert[..])).await;
    let connect = Connect { keep_alive: 1, ..connect_packet(if tls { "wss-big" } else { "ws-big" }, true) };
    c.send(&Packet::Connect(Box::new(connect))).await;
    match c.recv().await {
        Some(Packet::ConnAck(ack)) => assert_eq!(ack.reason, ReasonCode::Success),
        other => panic!("expected CONNACK, got {other:?}"),
    }

    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let p = Publish { packet_id: 42, ..publish("big/ws", QoS::AtLeastOnce, payload.clone()) };
    let frame = WsClient::frame(&Packet::Publish(p));
    const CHUNKS: usize = 40;
    let t0 = Instant::now();
    for (i, piece) in frame.chunks(frame.len().div_ceil(CHUNKS)).enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.io.write_all(piece).await.expect("the broker closed the connection during the upload");
    }
    assert!(
        t0.elapsed() > Duration::from_secs(3),
        "the frame took longer than twice the keep alive to arrive"
    );
    match c.recv().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.packet_id, 42),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let got = sub.expect_publish().await;
    assert!(got.payload[..] == payload[..], "payload arrived intact");
    c.send(&Packet::PingReq).await;
    assert!(matches!(c.recv().await, Some(Packet::PingResp)), "still connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowly_arriving_large_frame_keeps_a_websocket_client_alive() {
    slow_upload_in_one_frame(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowly_arriving_large_frame_keeps_a_wss_client_alive() {
    slow_upload_in_one_frame(true).await;
}
