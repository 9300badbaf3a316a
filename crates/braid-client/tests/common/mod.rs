//! Shared harness for the client's integration tests: a real Braid broker in-process on an
//! ephemeral port, and a scripted fake server (braid-proto over a TcpListener) for what a real
//! broker does not let a test control, such as withholding acks or dropping a connection.
//!
//! Every wait is bounded: a test that would hang fails after a few seconds instead.
#![allow(dead_code, unused_imports)]

pub(crate) mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use braid_broker::server::Running;
pub(crate) use braid_broker::{Config, Server};
pub(crate) use braid_client::{
    Bytes, Client, ClientOptions, Connected, Error, Event, Message, Properties, ProtocolVersion, Publish,
    QoS, ReasonCode, Reconnect, RetainHandling, SubscriptionOptions, Will,
};
pub(crate) use braid_proto::{decode, encode, Ack, BytesMut, ConnAck, Connect, Packet, SubAck};

/// How long a test waits for anything that should happen promptly.
pub(crate) const WAIT: Duration = Duration::from_secs(5);
/// How long a test watches for something that must not happen.
pub(crate) const QUIET: Duration = Duration::from_millis(300);

pub(crate) const V31: ProtocolVersion = ProtocolVersion::V3_1;
pub(crate) const V311: ProtocolVersion = ProtocolVersion::V3_1_1;
pub(crate) const V5: ProtocolVersion = ProtocolVersion::V5;

/// A broker running on the test's runtime; shut down when dropped.
pub(crate) type TestBroker = Running;

/// Binds `config` and runs the server in a task.
pub(crate) async fn start(config: Config) -> TestBroker {
    Server::spawn(config).await.expect("bind test broker")
}

/// [`start`] with [`Config::embedded`].
pub(crate) async fn start_default() -> TestBroker {
    start(Config::embedded()).await
}

/// What the client tests ask of their broker.
pub(crate) trait TestBrokerExt {
    /// PUBLISH packets the broker has sent to clients so far.
    fn messages_sent(&self) -> u64;
    /// Client options for this broker.
    fn options(&self, version: ProtocolVersion, client_id: &str) -> ClientOptions;
    /// Connects a client with [`TestBrokerExt::options`].
    async fn client(&self, version: ProtocolVersion, client_id: &str) -> Client;
}

impl TestBrokerExt for TestBroker {
    fn messages_sent(&self) -> u64 {
        self.broker.metrics().messages_sent.total()
    }

    fn options(&self, version: ProtocolVersion, client_id: &str) -> ClientOptions {
        let mut o = ClientOptions::new(self.addr.ip().to_string(), self.addr.port());
        o.version = version;
        o.client_id = client_id.into();
        o
    }

    async fn client(&self, version: ProtocolVersion, client_id: &str) -> Client {
        connect(self.options(version, client_id)).await.0
    }
}

/// Connects, panicking on failure or after [`WAIT`].
pub(crate) async fn connect(opts: ClientOptions) -> (Client, Connected) {
    tokio::time::timeout(WAIT, Client::connect(opts)).await.expect("connect timed out").expect("connect")
}

/// Subscribes to one filter at `qos` and asserts it was granted.
pub(crate) async fn subscribe(c: &Client, filter: &str, qos: QoS) {
    subscribe_with(c, filter, SubscriptionOptions { qos, ..Default::default() }).await;
}

/// Subscribes to one filter with `options` and asserts the SUBACK is a success.
pub(crate) async fn subscribe_with(c: &Client, filter: &str, options: SubscriptionOptions) {
    let reasons =
        within(c.subscribe(vec![(filter.into(), options)], Properties::default())).await.expect("subscribe");
    assert_eq!(reasons.len(), 1);
    assert!(!reasons[0].is_error(), "SUBACK refused {filter}: {reasons:?}");
}

/// Awaits `f`, panicking after [`WAIT`].
pub(crate) async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f).await.expect("timed out")
}

/// The next event, panicking on `None` or after [`WAIT`].
pub(crate) async fn next_event(c: &Client) -> Event {
    within(c.recv()).await.expect("client closed while an event was expected")
}

/// The next event, which must be a message.
pub(crate) async fn next_message(c: &Client) -> Publish {
    match next_event(c).await {
        Event::Message(p) => p,
        other => panic!("expected a message, got {other:?}"),
    }
}

/// Asserts no event arrives for [`QUIET`].
pub(crate) async fn expect_no_event(c: &Client) {
    if let Ok(ev) = tokio::time::timeout(QUIET, c.recv()).await {
        panic!("expected no event, got {ev:?}");
    }
}

/// Publishes and waits for the acknowledgement.
pub(crate) async fn publish_acked(c: &Client, topic: &str, payload: &'static str, qos: QoS) -> ReasonCode {
    let handle = within(c.publish(Message::new(topic, payload, qos))).await.expect("publish");
    within(handle.acked()).await.expect("publish acknowledged")
}

/// Polls `f` until it is true, panicking after [`WAIT`].
pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ------------------------------------------------------------------------------------------------
// Fake server
// ------------------------------------------------------------------------------------------------

/// A listener that accepts clients and lets the test script the server side packet by packet.
/// A client connected to a [`FakeServer`], and the server's side of it.
pub(crate) struct FakeSession {
    pub client: Client,
    pub connected: Connected,
    /// The server, for the client's next connection.
    pub server: FakeServer,
    pub conn: FakeConn,
    /// The CONNECT the client sent.
    pub connect: Connect,
}

pub(crate) struct FakeServer {
    listener: TcpListener,
    pub addr: SocketAddr,
}

impl FakeServer {
    pub(crate) async fn new() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        FakeServer { listener, addr }
    }

    /// Client options pointing at this server (reconnect off, keep alive off).
    pub(crate) fn options(&self, version: ProtocolVersion) -> ClientOptions {
        let mut o = ClientOptions::new("127.0.0.1", self.addr.port());
        o.version = version;
        o.client_id = "fake-client".into();
        o.keep_alive = 0;
        o
    }

    /// Accepts a connection and reads its CONNECT.
    pub(crate) async fn accept(&self) -> (FakeConn, Connect) {
        let (stream, _) = within(self.listener.accept()).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut conn = FakeConn { stream, rbuf: BytesMut::new(), version: V5 };
        match conn.recv().await {
            Some(Packet::Connect(c)) => {
                conn.version = c.protocol;
                (conn, *c)
            }
            other => panic!("expected CONNECT, got {other:?}"),
        }
    }

    /// Accepts a connection and answers its CONNECT with a successful CONNACK.
    /// Connects a client with `opts`; the server answers its CONNACK with `properties`.
    pub(crate) async fn connect_client(self, opts: ClientOptions, properties: Properties) -> FakeSession {
        let accept = tokio::spawn(async move {
            let (conn, connect) = self.accept_ok(false, properties).await;
            (self, conn, connect)
        });
        let (client, connected) = connect(opts).await;
        let (server, conn, connect) = within(accept).await.unwrap();
        FakeSession { client, connected, server, conn, connect }
    }

    pub(crate) async fn accept_ok(
        &self,
        session_present: bool,
        properties: Properties,
    ) -> (FakeConn, Connect) {
        let (mut conn, connect) = self.accept().await;
        conn.send(Packet::ConnAck(ConnAck { session_present, reason: ReasonCode::Success, properties }))
            .await;
        (conn, connect)
    }
}

/// One accepted connection on a [`FakeServer`].
pub(crate) struct FakeConn {
    stream: TcpStream,
    rbuf: BytesMut,
    pub version: ProtocolVersion,
}

impl FakeConn {
    pub(crate) async fn send(&mut self, p: Packet) {
        let mut buf = BytesMut::new();
        encode(&p, self.version, &mut buf).unwrap();
        within(self.stream.write_all(&buf)).await.unwrap();
    }

    /// The next packet within `d`: `Ok(Some)`, `Ok(None)` when the client closed, `Err` on
    /// timeout.
    pub(crate) async fn recv_within(&mut self, d: Duration) -> Result<Option<Packet>, ()> {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            if let Some(p) = decode(&mut self.rbuf, self.version, u32::MAX).expect("client sent bad bytes") {
                return Ok(Some(p));
            }
            self.rbuf.reserve(4096);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Err(()),
                Ok(Ok(0)) | Ok(Err(_)) => return Ok(None),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next packet, `None` once the client closed; panics after [`WAIT`].
    pub(crate) async fn recv(&mut self) -> Option<Packet> {
        self.recv_within(WAIT).await.expect("nothing received from the client")
    }

    /// The next packet; panics on close or timeout.
    pub(crate) async fn expect(&mut self) -> Packet {
        self.recv().await.expect("client closed the connection")
    }

    /// The next packet must be a PUBLISH.
    pub(crate) async fn expect_publish(&mut self) -> Publish {
        match self.expect().await {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Asserts the client sends nothing for [`QUIET`].
    pub(crate) async fn expect_nothing(&mut self) {
        if let Ok(p) = self.recv_within(QUIET).await {
            panic!("expected silence, got {p:?}");
        }
    }
}
