//! The application's handle: [`Client`] and [`PublishHandle`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot, Mutex, Semaphore};

use braid_proto::topic::valid_topic_name;
use braid_proto::{
    encoded_len, Packet, Properties, ProtocolVersion, Publish, QoS, ReasonCode, Subscribe, Unsubscribe,
};

use crate::connect::{self, Link};
use crate::transport::{ReadHalf, WriteHalf};
use braid_proto::{ByteString, ConnAck, ReadBuffer};

/// SUBSCRIBE user property telling the broker the priority of the stream it arrives on.
const STREAM_PRIORITY: &str = "stream-priority";
use crate::connection::{Command, Connection, Incoming, Shared, COMMAND_CAPACITY, EVENT_CAPACITY};
use crate::inbound::Taken;
use crate::{ClientOptions, Connected, Error, Event, Message, SubscriptionOptions};

/// Handle to a connection; cheap to clone, usable from many tasks.
///
/// The connection itself runs in one tokio task spawned by [`Client::connect`]. When the last
/// handle is dropped, that task sends DISCONNECT (normal) and ends.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    opts: ClientOptions,
    /// On a QUIC data stream: its index and the priority announced on SUBSCRIBE.
    stream: Option<(u64, i32)>,
    commands: mpsc::Sender<Command>,
    acks: mpsc::UnboundedSender<Taken>,
    events: Mutex<mpsc::Receiver<Incoming>>,
    shared: Arc<Shared>,
    version: ProtocolVersion,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("version", &self.inner.version).finish_non_exhaustive()
    }
}

impl Client {
    /// Connects and waits for CONNACK, then runs the connection in a new tokio task.
    ///
    /// Fails with [`Error::Refused`] if the server refuses, [`Error::Timeout`] if there is no
    /// CONNACK within [`ClientOptions::connect_timeout`], [`Error::Io`] if the server cannot
    /// be reached. The first connection is not retried, even with
    /// [`ClientOptions::reconnect`] set; that applies to connections lost later.
    pub async fn connect(opts: ClientOptions) -> Result<(Client, Connected), Error> {
        let handshake = connect::handshake(&opts, &opts.client_id, opts.clean_start);
        let (link, ack) =
            tokio::time::timeout(opts.connect_timeout, handshake).await.map_err(|_| Error::Timeout)??;
        Ok(Client::start(opts, &ack, link, None))
    }

    /// Runs the connection task for `link`, which has received `ack`; a data stream (its
    /// index, priority, and its connection's window) or the connection's own client.
    fn start(
        opts: ClientOptions,
        ack: &ConnAck,
        link: Link,
        stream: Option<(u64, i32, Arc<Semaphore>)>,
    ) -> (Client, Connected) {
        let (commands_tx, commands_rx) = mpsc::channel(COMMAND_CAPACITY);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::channel(EVENT_CAPACITY);
        let version = opts.version;
        let (stream, window) = match stream {
            Some((index, priority, window)) => (Some((index, priority)), Some(window)),
            None => (None, None),
        };
        let (conn, shared, connected) =
            Connection::new(opts.clone(), ack, commands_rx, acks_rx, events_tx, window);
        if stream.is_none() {
            *shared.quic.lock().unwrap_or_else(|e| e.into_inner()) = link.quic.clone();
        }
        tokio::spawn(conn.run(link));
        let events = Mutex::new(events_rx);
        let inner = Inner { opts, stream, commands: commands_tx, acks: acks_tx, events, shared, version };
        (Client { inner: Arc::new(inner) }, connected)
    }

    /// MQTT over QUIC: opens a data stream and returns a client bound to it. Its `publish`,
    /// `subscribe` and `unsubscribe` go out on that stream with packet ids of its own, their
    /// acknowledgements come back on it, and its `recv` yields the deliveries of the
    /// subscriptions made on it (the broker sends them on this stream). What this side sends
    /// on the stream goes at `priority` (higher first, among the streams of the connection);
    /// v5 SUBSCRIBEs on it carry the user property `stream-priority` so the broker sends its
    /// deliveries at the same priority. Its QoS 1/2 publishes take slots of the connection's
    /// in-flight window (the server's Receive Maximum counts the whole connection, not a
    /// stream). `disconnect` (or dropping every handle) finishes the
    /// stream only. The stream lives as long as the QUIC connection: after a reconnect, open
    /// new ones.
    ///
    /// [`Error::Protocol`] on a TCP client or a data stream; [`Error::Closed`] while offline.
    pub async fn open_stream(&self, priority: i32) -> Result<Client, Error> {
        if self.inner.stream.is_some() {
            return Err(Error::Protocol(
                "open data streams from the connection's client, not a stream".into(),
            ));
        }
        let shared = &self.inner.shared;
        let quic = shared.quic.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let quic = quic.ok_or_else(|| Error::Protocol("data streams need a QUIC connection".into()))?;
        let ack = shared.connack.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(Error::Closed)?;
        let (send, recv) = quic.open_bi().await.map_err(|_| Error::Closed)?;
        let _ = send.set_priority(priority);
        let index = send.id().index();
        let mut opts = self.inner.opts.clone();
        opts.keep_alive = 0;
        opts.reconnect = None;
        let link = Link {
            rd: ReadHalf::Quic(recv),
            wr: WriteHalf::Quic(send),
            rbuf: ReadBuffer::default(),
            quic: None,
        };
        Ok(Client::start(opts, &ack, link, Some((index, priority, shared.window.clone()))).0)
    }

    /// Statistics of the QUIC connection: packets sent and lost, congestion window, RTT, PTOs
    /// ([`quinn::ConnectionStats`]). `None` over TCP, while offline, and on a data-stream
    /// client (ask the connection's client).
    pub fn quic_stats(&self) -> Option<quinn::ConnectionStats> {
        let quic = self.inner.shared.quic.lock().unwrap_or_else(|e| e.into_inner());
        quic.as_ref().map(|c| c.stats())
    }

    /// The QUIC stream index of a data-stream client ([`Client::open_stream`]); `None` for the
    /// connection's own client (the control stream, or TCP).
    pub fn stream_id(&self) -> Option<u64> {
        self.inner.stream.map(|(index, _)| index)
    }

    /// Publishes a message.
    ///
    /// QoS 0 returns once the connection task has accepted the message (its queue is
    /// bounded, so a slow socket makes this wait); it goes out with the next write. QoS 1/2
    /// first wait for a free slot in the in-flight window (backpressure), then return a
    /// [`PublishHandle`] that resolves when PUBACK / PUBCOMP arrives. Awaiting the handle is
    /// optional (pipelining).
    ///
    /// Checked here, against the limits the server announced in CONNACK: a valid topic name
    /// ([`Error::Rejected`] with Topic Name invalid), Maximum QoS, Retain Available and
    /// Maximum Packet Size.
    pub async fn publish(&self, msg: Message) -> Result<PublishHandle, Error> {
        let Message { topic, payload, qos, retain, properties } = msg;
        let shared = &self.inner.shared;
        let v5 = self.inner.version.is_v5();
        let aliased = v5 && topic.is_empty() && properties.topic_alias.is_some();
        if !(valid_topic_name(&topic) || aliased) || topic.len() > usize::from(u16::MAX) {
            return Err(Error::Rejected(ReasonCode::TopicNameInvalid));
        }
        if qos as u8 > shared.max_qos.load(Ordering::Relaxed) {
            return Err(Error::Rejected(ReasonCode::QoSNotSupported));
        }
        if retain && !shared.retain_available.load(Ordering::Relaxed) {
            return Err(Error::Rejected(ReasonCode::RetainNotSupported));
        }
        let p = Publish { dup: false, qos, retain, topic: topic.into(), packet_id: 0, properties, payload };
        let packet = Box::new(Packet::Publish(p));
        let max = shared.max_packet_size.load(Ordering::Relaxed);
        if encoded_len(&packet, self.inner.version) > max as usize {
            return Err(Error::Rejected(ReasonCode::PacketTooLarge));
        }
        if qos == QoS::AtMostOnce {
            self.inner.commands.send(Command::Publish(packet, None)).await.map_err(|_| Error::Closed)?;
            return Ok(PublishHandle { rx: None });
        }
        // Slot first, then room in the queue; the slot is handed over only when the command is
        // queued, so a cancelled call gives it back.
        let slot = shared.window.acquire().await.map_err(|_| Error::Closed)?;
        let queued = self.inner.commands.reserve().await.map_err(|_| Error::Closed)?;
        slot.forget();
        let (tx, rx) = oneshot::channel();
        queued.send(Command::Publish(packet, Some(tx)));
        Ok(PublishHandle { rx: Some(rx) })
    }

    /// Subscribes; returns one reason code per filter (the granted QoS as
    /// [`ReasonCode::Success`], [`ReasonCode::GrantedQoS1`] or [`ReasonCode::GrantedQoS2`],
    /// or a failure code). `properties` are v5 SUBSCRIBE properties (Subscription Identifier,
    /// user properties).
    ///
    /// Granted subscriptions are remembered: if a reconnect finds that the server lost the
    /// session, they are made again.
    pub async fn subscribe(
        &self,
        filters: Vec<(String, SubscriptionOptions)>,
        properties: Properties,
    ) -> Result<Vec<ReasonCode>, Error> {
        if filters.is_empty() {
            return Err(Error::Protocol("SUBSCRIBE needs at least one topic filter".into()));
        }
        let filters = filters.into_iter().map(|(f, o)| (f.into(), o)).collect();
        let mut properties = properties;
        if let (Some((_, priority)), true) = (self.inner.stream, self.inner.version.is_v5()) {
            let key = ByteString::from_static(STREAM_PRIORITY);
            if !properties.user_properties.iter().any(|(k, _)| *k == key) {
                properties.user_properties.push((key, priority.to_string().into()));
            }
        }
        let p = Packet::Subscribe(Subscribe { packet_id: 0, properties, filters });
        self.request(p).await
    }

    /// Unsubscribes; returns one reason code per filter (3.1.x has none on the wire, so every
    /// filter reports [`ReasonCode::Success`]).
    pub async fn unsubscribe(
        &self,
        filters: Vec<String>,
        properties: Properties,
    ) -> Result<Vec<ReasonCode>, Error> {
        if filters.is_empty() {
            return Err(Error::Protocol("UNSUBSCRIBE needs at least one topic filter".into()));
        }
        let filters = filters.into_iter().map(Into::into).collect();
        self.request(Packet::Unsubscribe(Unsubscribe { packet_id: 0, properties, filters })).await
    }

    async fn request(&self, p: Packet) -> Result<Vec<ReasonCode>, Error> {
        let (tx, rx) = oneshot::channel();
        self.inner.commands.send(Command::Request(Box::new(p), tx)).await.map_err(|_| Error::Closed)?;
        rx.await.unwrap_or(Err(Error::Closed))
    }

    /// The next event; `None` once the client is closed (after [`Client::disconnect`], or when
    /// the connection is lost without reconnect) and every queued event was taken.
    ///
    /// Taking a QoS 1/2 [`Event::Message`] here is what acknowledges it. With several tasks
    /// calling `recv`, each event goes to one of them.
    pub async fn recv(&self) -> Option<Event> {
        let (event, received) = self.recv_unacked().await?;
        if let Some(r) = received {
            self.ack(r);
        }
        Some(event)
    }

    /// The next event, as [`Client::recv`], but a QoS 1/2 message is not acknowledged yet:
    /// the application sends its PUBACK (QoS 2: PUBREC) with [`Client::ack`] once it is done
    /// with it, e.g. when it has stored it elsewhere. The server sends no more than the
    /// Receive Maximum of messages not acknowledged. MQTT asks a client to acknowledge in the
    /// order it received; some servers (Braid among them) take acknowledgements in any order.
    pub async fn recv_unacked(&self) -> Option<(Event, Option<Received>)> {
        let incoming = self.inner.events.lock().await.recv().await?;
        Some(match incoming {
            Incoming::Message(p, epoch) => {
                let received = (p.qos != QoS::AtMostOnce).then_some(Received(Taken {
                    epoch,
                    packet_id: p.packet_id,
                    qos: p.qos,
                }));
                (Event::Message(*p), received)
            }
            Incoming::Connected(c) => (Event::Connected(*c), None),
            Incoming::Disconnected(r) => (Event::Disconnected(r), None),
        })
    }

    /// Acknowledges a message taken with [`Client::recv_unacked`]. An acknowledgement for a
    /// connection that has ended since is dropped: the server sends the message again when
    /// the session resumes.
    pub fn ack(&self, received: Received) {
        let _ = self.inner.acks.send(received.0);
    }

    /// Sends DISCONNECT (with `reason` for v5, e.g. [`ReasonCode::DisconnectWithWill`]; 3.1.x
    /// DISCONNECT has no reason) after everything already queued, and closes. Publishes still
    /// awaiting their acks fail with [`Error::Closed`]. While the client is waiting to
    /// reconnect, it just stops. [`Error::Closed`] if it was closed already.
    pub async fn disconnect(&self, reason: ReasonCode) -> Result<(), Error> {
        let shared = &self.inner.shared;
        if self.inner.commands.is_closed() {
            return Err(Error::Closed);
        }
        shared.closing.store(true, Ordering::Release);
        shared.close_notify.notify_one();
        let (tx, rx) = oneshot::channel();
        if self.inner.commands.send(Command::Disconnect(reason, tx)).await.is_ok() {
            let _ = rx.await;
        }
        Ok(())
    }
}

/// A QoS 1/2 message handed out by [`Client::recv_unacked`], to acknowledge with
/// [`Client::ack`].
#[derive(Debug)]
pub struct Received(Taken);

/// Completion of one publish: resolves with the PUBACK / PUBREC reason (QoS 1 / 2) when the
/// exchange is complete, or at once with [`ReasonCode::Success`] for QoS 0. A failure reason
/// is [`Error::Rejected`]; [`Error::Closed`] if the client closed first.
///
/// It is also a future itself: `client.publish(m).await?.await?`.
#[derive(Debug)]
pub struct PublishHandle {
    rx: Option<oneshot::Receiver<Result<ReasonCode, Error>>>,
}

impl PublishHandle {
    /// Waits for the acknowledgement.
    pub async fn acked(self) -> Result<ReasonCode, Error> {
        self.await
    }
}

impl Future for PublishHandle {
    type Output = Result<ReasonCode, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().rx {
            None => Poll::Ready(Ok(ReasonCode::Success)),
            Some(rx) => Pin::new(rx).poll(cx).map(|r| r.unwrap_or(Err(Error::Closed))),
        }
    }
}
