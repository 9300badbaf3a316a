//! Shared harness for the broker's integration tests: an in-process broker on an ephemeral
//! port and a raw MQTT client built on braid-proto that shows exactly what is on the wire.
//!
//! Every wait is bounded: a test that would hang fails after a few seconds instead.
#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use braid_broker::server::Running;
pub(crate) use braid_broker::{Config, Server};
pub(crate) use braid_proto::{
    decode, encode, Ack, ByteString, Bytes, BytesMut, ConnAck, Connect, Disconnect, LastWill, Packet,
    Properties, ProtocolVersion, Publish, QoS, ReasonCode, SubAck, Subscribe, SubscriptionOptions,
};

/// How long a test waits for anything the broker should do promptly.
pub(crate) const WAIT: Duration = Duration::from_secs(3);
/// How long a test watches for something that must not happen.
pub(crate) const QUIET: Duration = Duration::from_millis(300);

pub(crate) const V311: ProtocolVersion = ProtocolVersion::V3_1_1;
pub(crate) const V5: ProtocolVersion = ProtocolVersion::V5;

/// A broker running on the test's runtime (shut down when dropped).
pub(crate) type TestBroker = Running;

/// Binds `config` (its listener should be `127.0.0.1:0`) and runs the server in a task.
pub(crate) async fn start(config: Config) -> TestBroker {
    Server::spawn(config).await.expect("bind test broker")
}

/// [`start`] with [`Config::embedded`].
pub(crate) async fn start_default() -> TestBroker {
    start(Config::embedded()).await
}

/// Counters the tests read.
pub(crate) trait Counters {
    /// The `messages_dropped` counter.
    fn dropped(&self) -> u64;
}

impl Counters for TestBroker {
    fn dropped(&self) -> u64 {
        self.broker.metrics().messages_dropped()
    }
}

/// A CONNECT with keep alive 0 and no will; `protocol` is set by [`TestClient::connect`].
/// A QoS 0, not retained will on `topic` carrying `payload`, for [`Connect::will`].
pub(crate) fn will(topic: &str, payload: &'static [u8]) -> Option<LastWill> {
    Some(LastWill {
        topic: topic.into(),
        payload: Bytes::from_static(payload),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Properties::default(),
    })
}

pub(crate) fn connect_packet(client_id: &str, clean: bool) -> Connect {
    Connect {
        protocol: V5,
        clean_start: clean,
        keep_alive: 0,
        properties: Properties::default(),
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
    }
}

/// [`connect_packet`] with a v5 Session Expiry Interval.
pub(crate) fn connect_with_expiry(client_id: &str, clean: bool, expiry_secs: u32) -> Connect {
    let mut c = connect_packet(client_id, clean);
    c.properties.session_expiry_interval = Some(expiry_secs);
    c
}

/// A PUBLISH; QoS 1 and 2 get packet id 1 (override with struct update syntax).
pub(crate) fn publish(topic: &str, qos: QoS, payload: impl Into<Bytes>) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: u16::from(qos != QoS::AtMostOnce),
        properties: Properties::default(),
        payload: payload.into(),
    }
}

/// A SUBSCRIBE (packet id 1) to one filter.
pub(crate) fn subscribe(filter: &str, qos: QoS) -> Subscribe {
    Subscribe {
        packet_id: 1,
        properties: Properties::default(),
        filters: vec![(filter.into(), SubscriptionOptions { qos, ..Default::default() })],
    }
}

/// Encodes `p` for `version`.
pub(crate) fn encode_packet(p: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    encode(p, version, &mut buf).expect("encode test packet");
    buf
}

/// What a bounded read produced.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Recv {
    Packet(Packet),
    Closed,
    TimedOut,
}

/// A raw MQTT client: one TCP stream, a read buffer and the negotiated version.
pub(crate) struct TestClient {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Version used to encode and decode.
    pub version: ProtocolVersion,
    /// A label for panic messages.
    pub name: String,
}

impl TestClient {
    /// Opens a TCP connection without sending anything (decoding as `version`).
    pub(crate) async fn open(addr: SocketAddr, version: ProtocolVersion) -> TestClient {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("TCP connect timed out")
            .expect("TCP connect");
        stream.set_nodelay(true).unwrap();
        TestClient {
            stream,
            rbuf: BytesMut::with_capacity(4096),
            wbuf: BytesMut::new(),
            version,
            name: String::from("client"),
        }
    }

    /// Connects with `connect` (its protocol set to `version`) and returns the CONNACK,
    /// whatever its reason code.
    pub(crate) async fn connect(
        addr: SocketAddr,
        version: ProtocolVersion,
        mut connect: Connect,
    ) -> (TestClient, ConnAck) {
        connect.protocol = version;
        let mut c = TestClient::open(addr, version).await;
        c.name = format!("{}({:?})", connect.client_id, version);
        c.send(Packet::Connect(Box::new(connect))).await;
        match c.recv().await {
            Some(Packet::ConnAck(ack)) => (c, ack),
            other => panic!("{}: expected CONNACK, got {other:?}", c.name),
        }
    }

    /// Connects and asserts the CONNACK is a success.
    pub(crate) async fn connect_ok(
        addr: SocketAddr,
        version: ProtocolVersion,
        connect: Connect,
    ) -> (TestClient, ConnAck) {
        let (c, ack) = TestClient::connect(addr, version, connect).await;
        assert_eq!(ack.reason, ReasonCode::Success, "{}: CONNACK {ack:?}", c.name);
        (c, ack)
    }

    /// Sends one packet.
    pub(crate) async fn send(&mut self, p: Packet) {
        let buf = encode_packet(&p, self.version);
        self.send_raw(&buf).await;
    }

    /// Sends raw bytes.
    pub(crate) async fn send_raw(&mut self, bytes: &[u8]) {
        tokio::time::timeout(WAIT, self.stream.write_all(bytes))
            .await
            .unwrap_or_else(|_| panic!("{}: write timed out", self.name))
            .unwrap_or_else(|e| panic!("{}: write failed: {e}", self.name));
    }

    /// Sends raw bytes, returning false if the broker already closed the socket.
    pub(crate) async fn try_send_raw(&mut self, bytes: &[u8]) -> bool {
        matches!(tokio::time::timeout(WAIT, self.stream.write_all(bytes)).await, Ok(Ok(())))
    }

    /// Encodes a packet into the write buffer; [`TestClient::flush`] sends the buffer.
    pub(crate) fn queue(&mut self, p: Packet) {
        encode(&p, self.version, &mut self.wbuf).expect("encode test packet");
    }

    /// Sends everything queued.
    pub(crate) async fn flush(&mut self) {
        if !self.wbuf.is_empty() {
            let buf = self.wbuf.split();
            self.send_raw(&buf).await;
        }
    }

    /// True if a complete packet is already buffered (no read needed).
    pub(crate) fn has_buffered_packet(&self) -> bool {
        let mut copy = self.rbuf.clone();
        matches!(decode(&mut copy, self.version, u32::MAX), Ok(Some(_)))
    }

    /// The next packet, or `Closed`, or `TimedOut` after `within`.
    pub(crate) async fn recv_within(&mut self, within: Duration) -> Recv {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match decode(&mut self.rbuf, self.version, u32::MAX) {
                Ok(Some(p)) => return Recv::Packet(p),
                Ok(None) => {}
                Err(e) => panic!("{}: undecodable bytes from the broker: {e}", self.name),
            }
            self.rbuf.reserve(64 * 1024);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Recv::TimedOut,
                Ok(Ok(0)) | Ok(Err(_)) => {
                    assert!(self.rbuf.is_empty(), "{}: connection closed inside a packet", self.name);
                    return Recv::Closed;
                }
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next packet, `None` once the broker closed the connection; panics after [`WAIT`].
    pub(crate) async fn recv(&mut self) -> Option<Packet> {
        match self.recv_within(WAIT).await {
            Recv::Packet(p) => Some(p),
            Recv::Closed => None,
            Recv::TimedOut => panic!("{}: nothing received within {WAIT:?}", self.name),
        }
    }

    /// The next packet; panics on close or timeout.
    pub(crate) async fn expect_packet(&mut self) -> Packet {
        match self.recv().await {
            Some(p) => p,
            None => panic!("{}: connection closed while a packet was expected", self.name),
        }
    }

    /// The next packet, which must be a PUBLISH.
    pub(crate) async fn expect_publish(&mut self) -> Publish {
        match self.expect_packet().await {
            Packet::Publish(p) => p,
            other => panic!("{}: expected PUBLISH, got {other:?}", self.name),
        }
    }

    /// Asserts nothing arrives (and the connection stays open) for `within`.
    pub(crate) async fn expect_nothing(&mut self, within: Duration) {
        match self.recv_within(within).await {
            Recv::TimedOut => {}
            other => panic!("{}: expected silence, got {other:?}", self.name),
        }
    }

    /// Expects the broker to close the connection, after at most one DISCONNECT; returns its
    /// reason. Any other packet, or no close within [`WAIT`], fails the test.
    pub(crate) async fn expect_closed(&mut self) -> Option<ReasonCode> {
        self.expect_closed_with().await.map(|d| d.reason)
    }

    /// Like [`TestClient::expect_closed`], returning the whole DISCONNECT.
    pub(crate) async fn expect_closed_with(&mut self) -> Option<Disconnect> {
        let mut disconnect = None;
        loop {
            match self.recv_within(WAIT).await {
                Recv::Closed => return disconnect,
                Recv::Packet(Packet::Disconnect(d)) if disconnect.is_none() => disconnect = Some(d),
                Recv::Packet(p) => panic!("{}: expected close, got {p:?}", self.name),
                Recv::TimedOut => {
                    panic!("{}: connection still open after {WAIT:?} (DISCONNECT: {disconnect:?})", self.name)
                }
            }
        }
    }

    /// Expects a v5 DISCONNECT with `reason` and a Reason String saying why, then the close.
    pub(crate) async fn expect_disconnect(&mut self, reason: ReasonCode) {
        let got = self.expect_closed_with().await;
        assert_eq!(got.as_ref().map(|d| d.reason), Some(reason), "{}: DISCONNECT reason", self.name);
        let why = got.and_then(|d| d.properties.reason_string.clone());
        assert!(why.is_some_and(|w| !w.is_empty()), "{}: DISCONNECT carries a Reason String", self.name);
    }

    /// Subscribes to one filter (packet id 1) and asserts the SUBACK grants `qos`.
    pub(crate) async fn subscribe(&mut self, filter: &str, qos: QoS) {
        self.subscribe_with(subscribe(filter, qos), qos).await;
    }

    /// Sends `sub` and asserts its SUBACK grants `granted` for every filter.
    pub(crate) async fn subscribe_with(&mut self, sub: Subscribe, granted: QoS) {
        let id = sub.packet_id;
        let n = sub.filters.len();
        self.send(Packet::Subscribe(sub)).await;
        let want = match granted {
            QoS::AtMostOnce => ReasonCode::Success,
            QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
            QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
        };
        match self.expect_packet().await {
            Packet::SubAck(a) => {
                assert_eq!(a.packet_id, id);
                assert_eq!(a.reasons, vec![want; n], "{}: SUBACK", self.name);
            }
            other => panic!("{}: expected SUBACK, got {other:?}", self.name),
        }
    }

    /// Publishes at QoS 0, or at QoS 1 / 2 with `id` and completes the handshake.
    pub(crate) async fn publish_and_ack(&mut self, topic: &str, qos: QoS, payload: &[u8], id: u16) {
        let p = Publish {
            packet_id: if qos == QoS::AtMostOnce { 0 } else { id },
            ..publish(topic, qos, Bytes::copy_from_slice(payload))
        };
        self.send(Packet::Publish(p)).await;
        match qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => match self.expect_packet().await {
                Packet::PubAck(a) if a.packet_id == id => {}
                other => panic!("{}: expected PUBACK {id}, got {other:?}", self.name),
            },
            QoS::ExactlyOnce => {
                match self.expect_packet().await {
                    Packet::PubRec(a) if a.packet_id == id => {}
                    other => panic!("{}: expected PUBREC {id}, got {other:?}", self.name),
                }
                self.send(Packet::PubRel(Ack::new(id))).await;
                match self.expect_packet().await {
                    Packet::PubComp(a) if a.packet_id == id => {}
                    other => panic!("{}: expected PUBCOMP {id}, got {other:?}", self.name),
                }
            }
        }
    }

    /// PINGREQ, then waits for PINGRESP (any PUBLISH before it fails the test): proves the
    /// connection is alive and the broker has handled everything sent before.
    pub(crate) async fn ping(&mut self) {
        self.send(Packet::PingReq).await;
        match self.expect_packet().await {
            Packet::PingResp => {}
            other => panic!("{}: expected PINGRESP, got {other:?}", self.name),
        }
    }

    /// Sends DISCONNECT (reason Success) and waits for the broker to close the socket.
    pub(crate) async fn disconnect(mut self) {
        self.send(Packet::Disconnect(Disconnect {
            reason: ReasonCode::Success,
            properties: Properties::default(),
        }))
        .await;
        assert_eq!(self.expect_closed().await, None);
    }

    /// Drops the socket without DISCONNECT (a network failure, as the broker sees it).
    pub(crate) fn drop_socket(self) {
        drop(self);
    }
}

/// A publisher and a subscriber on `topic` that prove the broker still routes: used by tests
/// that break other connections.
pub(crate) struct Canary {
    publisher: TestClient,
    subscriber: TestClient,
    topic: String,
    round: u32,
}

impl Canary {
    /// Connects both clients (v5) and subscribes.
    pub(crate) async fn new(addr: SocketAddr, name: &str) -> Canary {
        let (publisher, _) =
            TestClient::connect_ok(addr, V5, connect_packet(&format!("{name}-pub"), true)).await;
        let (mut subscriber, _) =
            TestClient::connect_ok(addr, V5, connect_packet(&format!("{name}-sub"), true)).await;
        let topic = format!("canary/{name}");
        subscriber.subscribe(&topic, QoS::AtLeastOnce).await;
        Canary { publisher, subscriber, topic, round: 0 }
    }

    /// One QoS 1 round trip from publisher to subscriber.
    pub(crate) async fn check(&mut self) {
        self.round += 1;
        let payload = format!("round {}", self.round);
        self.publisher.publish_and_ack(&self.topic, QoS::AtLeastOnce, payload.as_bytes(), 1).await;
        let p = self.subscriber.expect_publish().await;
        assert_eq!(&p.payload[..], payload.as_bytes());
        self.subscriber.send(Packet::PubAck(Ack::new(p.packet_id))).await;
    }
}
