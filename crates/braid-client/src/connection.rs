//! The connection task: one tokio task per client that reads, handles and writes in one select
//! loop, like the broker's connection. Commands from the [`crate::Client`] handles arrive on a
//! bounded channel and are encoded straight into one write buffer, so many packets go out per
//! write; received messages go to the application on a bounded channel, and when that is full
//! the task stops reading the socket (backpressure) but keeps writing. After a lost connection
//! it reconnects with backoff if asked to, resuming the session.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::error::{TryRecvError, TrySendError};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use braid_proto::{
    decode, encode, Ack, ByteString, BytesMut, ConnAck, Disconnect, Packet, Properties, ProtocolVersion,
    Publish, ReasonCode, Subscribe, SubscriptionOptions, UnsubAck,
};

use crate::connect::{self, Announced, Link};
use crate::inbound::{Action, Inbound, Taken};
use crate::inflight::{Completion, Done, Inflight, Transmission};
use crate::{Backoff, ClientOptions, Connected, Error};
use braid_proto::ReadBuffer;

/// Commands the handles may queue before `publish` and friends wait.
pub(crate) const COMMAND_CAPACITY: usize = 256;
/// Events (mostly messages) queued for the application before the task stops reading.
pub(crate) const EVENT_CAPACITY: usize = 1024;
/// Commands taken off the channel while reconnecting, to be sent once connected.
const BACKLOG_MAX: usize = COMMAND_CAPACITY;
/// Bytes encoded before writing; more commands wait in their channel until the write completes.
const WRITE_BUDGET: usize = 64 * 1024;
/// A write buffer that grew beyond this is released once written.
const KEEP_WRITE_CAPACITY: usize = 16 * 1024;
/// "Never" for the keep-alive timer when keep alive is off.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365);

/// Answers a SUBSCRIBE or UNSUBSCRIBE.
pub(crate) type RequestDone = oneshot::Sender<Result<Vec<ReasonCode>, Error>>;

/// What a handle asks the task to do.
pub(crate) enum Command {
    /// A PUBLISH; QoS 1/2 carry a window slot (a forgotten semaphore permit) and their
    /// completion.
    Publish(Box<Packet>, Option<Done>),
    /// A SUBSCRIBE or UNSUBSCRIBE (packet id assigned by the task).
    Request(Box<Packet>, RequestDone),
    /// Send DISCONNECT with this reason and close; answer when done.
    Disconnect(ReasonCode, oneshot::Sender<()>),
}

/// What the task hands to [`crate::Client::recv`].
pub(crate) enum Incoming {
    /// A message, with the session epoch its ack belongs to.
    Message(Box<Publish>, u32),
    Connected(Box<Connected>),
    Disconnected(Option<ReasonCode>),
}

/// State shared by the handles and the task.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Free slots of the outbound QoS 1/2 window; the data streams of a QUIC connection share
    /// its window (the server's Receive Maximum counts the connection, not a stream).
    pub window: Arc<Semaphore>,
    /// `disconnect` was called: do not reconnect.
    pub closing: AtomicBool,
    /// Wakes the task while it is offline (waiting to reconnect) when `closing` is set.
    pub close_notify: Notify,
    /// The server's Maximum Packet Size.
    pub max_packet_size: AtomicU32,
    /// The server's Maximum QoS.
    pub max_qos: AtomicU8,
    /// The server's Retain Available.
    pub retain_available: AtomicBool,
    /// The current QUIC connection, for opening data streams.
    pub quic: std::sync::Mutex<Option<quinn::Connection>>,
    /// The CONNACK of the current connection (data streams take its limits).
    pub connack: std::sync::Mutex<Option<ConnAck>>,
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The application closed the client (DISCONNECT sent) or dropped every handle.
    Closed,
    /// The connection was lost; the server's DISCONNECT reason if it sent one.
    Lost(Option<ReasonCode>),
}

/// Why the serve loop stops, and whether to write out what is buffered first.
#[derive(Debug)]
struct Stop {
    ending: Ending,
    flush: bool,
}

impl Stop {
    fn lost(reason: Option<ReasonCode>) -> Stop {
        Stop { ending: Ending::Lost(reason), flush: false }
    }
}

/// A SUBSCRIBE or UNSUBSCRIBE awaiting its ack; kept for resending after a reconnect.
struct Request {
    packet: Box<Packet>,
    done: Option<RequestDone>,
}

/// A subscription the server granted, re-established if the server loses the session.
struct Remembered {
    filter: ByteString,
    options: SubscriptionOptions,
    properties: Properties,
}

/// The command channel plus what was taken off it while offline.
struct Inbox {
    rx: mpsc::Receiver<Command>,
    backlog: VecDeque<Command>,
    /// False once every handle is gone.
    open: bool,
}

impl Inbox {
    fn try_next(&mut self) -> Option<Command> {
        if let Some(c) = self.backlog.pop_front() {
            return Some(c);
        }
        if !self.open {
            return None;
        }
        match self.rx.try_recv() {
            Ok(c) => Some(c),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.open = false;
                None
            }
        }
    }
}

/// The task's state.
pub(crate) struct Connection {
    opts: ClientOptions,
    /// The client id for reconnects (the assigned one, if the server assigned it).
    client_id: String,
    version: ProtocolVersion,
    announced: Announced,
    shared: Arc<Shared>,
    inbox: Inbox,
    acks: mpsc::UnboundedReceiver<Taken>,
    acks_open: bool,
    events: mpsc::Sender<Incoming>,
    inflight: Inflight,
    inbound: Inbound,
    requests: HashMap<u16, Request>,
    subscriptions: Vec<Remembered>,
    /// min(max_inflight, server Receive Maximum).
    window: usize,
    /// Slots to withhold when they free up, after the window shrank.
    debt: usize,
    keep_alive: Duration,
    /// Encoded, not yet written.
    out: BytesMut,
    /// An event waiting for room in the event channel; reading pauses meanwhile.
    stalled: Option<Incoming>,
    ping_sent: Option<Instant>,
    last_sent: Instant,
    /// Answers the `disconnect` call that ended the client.
    close_done: Option<oneshot::Sender<()>>,
    /// A QUIC data stream: no keep alive, no CONNECT or DISCONNECT of its own; closing it
    /// finishes the stream.
    data_stream: bool,
}

impl Connection {
    /// The task for a connection that just received `ack`, and the shared state for the
    /// handles. A QUIC data stream is given its connection's window (`stream_of`) and takes
    /// its publishes' slots from it.
    pub(crate) fn new(
        opts: ClientOptions,
        ack: &ConnAck,
        commands: mpsc::Receiver<Command>,
        acks: mpsc::UnboundedReceiver<Taken>,
        events: mpsc::Sender<Incoming>,
        stream_of: Option<Arc<Semaphore>>,
    ) -> (Connection, Arc<Shared>, Connected) {
        let window = window_for(&opts, ack);
        let data_stream = stream_of.is_some();
        let shared = Arc::new(Shared {
            window: stream_of.unwrap_or_else(|| Arc::new(Semaphore::new(window))),
            closing: AtomicBool::new(false),
            close_notify: Notify::new(),
            max_packet_size: AtomicU32::new(u32::MAX),
            max_qos: AtomicU8::new(2),
            retain_available: AtomicBool::new(true),
            quic: std::sync::Mutex::new(None),
            connack: std::sync::Mutex::new(None),
        });
        let announced = connect::announced(&opts);
        let mut conn = Connection {
            client_id: opts.client_id.clone(),
            version: opts.version,
            announced,
            shared: shared.clone(),
            inbox: Inbox { rx: commands, backlog: VecDeque::new(), open: true },
            acks,
            acks_open: true,
            events,
            inflight: Inflight::default(),
            inbound: Inbound::new(announced.topic_alias_maximum),
            requests: HashMap::new(),
            subscriptions: Vec::new(),
            window,
            debt: 0,
            keep_alive: Duration::ZERO,
            out: BytesMut::new(),
            stalled: None,
            ping_sent: None,
            last_sent: Instant::now(),
            close_done: None,
            data_stream,
            opts,
        };
        let connected = conn.on_connack(ack);
        (conn, shared, connected)
    }

    /// Serves `first`, then (if configured) reconnects until the client is closed.
    pub(crate) async fn run(mut self, first: Link) {
        let mut next = Some(first);
        while let Some(mut link) = next.take() {
            let ending = self.serve(&mut link).await;
            drop(link);
            let Ending::Lost(reason) = ending else { break };
            self.out.clear();
            if self.shared.closing.load(Ordering::Acquire) {
                break;
            }
            if !self.flush_stalled().await {
                break;
            }
            self.notify(Incoming::Disconnected(reason));
            if self.opts.reconnect.is_none() {
                break;
            }
            next = self.reconnect().await;
        }
        self.finish();
    }

    /// Runs one connection until it ends.
    async fn serve(&mut self, link: &mut Link) -> Ending {
        let Link { rd, wr, rbuf, quic } = link;
        if !self.data_stream {
            *self.shared.quic.lock().unwrap_or_else(|e| e.into_inner()) = quic.clone();
        }
        self.last_sent = Instant::now();
        self.ping_sent = None;
        let timer = tokio::time::sleep(self.keep_alive_or_never());
        tokio::pin!(timer);
        let stop = loop {
            if let Some(stop) = self.step(rbuf) {
                break stop;
            }
            // Room for a stalled event; an owned permit, so no borrow of `self` is held.
            let stalled = self.stalled.is_some();
            let room = stalled.then(|| self.events.clone().reserve_owned());
            tokio::select! {
                written = wr.write(&self.out), if !self.out.is_empty() => match written {
                    Ok(n) if n > 0 => {
                        let _ = self.out.split_to(n);
                        self.last_sent = Instant::now();
                        if self.out.is_empty() && self.out.capacity() > KEEP_WRITE_CAPACITY {
                            self.out = BytesMut::new();
                        }
                    }
                    Ok(_) => break Stop::lost(None),
                    Err(e) => {
                        debug!("write failed: {e}");
                        break Stop::lost(None);
                    }
                },
                read = rbuf.read_from(rd), if self.stalled.is_none() => match read {
                    Ok(0) => {
                        debug!("server closed the connection");
                        break Stop::lost(None);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        debug!("read failed: {e}");
                        break Stop::lost(None);
                    }
                },
                cmd = self.inbox.rx.recv(), if self.inbox.open && self.out.len() < WRITE_BUDGET => match cmd {
                    Some(cmd) => {
                        if let Some(stop) = self.on_command(cmd) {
                            break stop;
                        }
                    }
                    None => self.inbox.open = false,
                },
                taken = self.acks.recv(), if self.acks_open => match taken {
                    Some(t) => self.on_taken(t),
                    None => self.acks_open = false,
                },
                permit = async { room.expect("only polled when stalled").await }, if stalled => match permit {
                    Ok(permit) => {
                        if let Some(ev) = self.stalled.take() {
                            permit.send(ev);
                        }
                        // The answer to a ping could not be read while stalled: wait anew.
                        if self.ping_sent.is_some() {
                            self.ping_sent = Some(Instant::now());
                        }
                    }
                    Err(_) => break self.disconnect(ReasonCode::Success),
                },
                () = &mut timer => match self.keep_alive_check() {
                    Ok(next) => timer.as_mut().reset(next),
                    Err(stop) => break stop,
                },
            }
        };
        if stop.flush {
            let out = &self.out;
            let _ = tokio::time::timeout(self.opts.connect_timeout, async {
                if !out.is_empty() {
                    wr.write_all(out).await?;
                }
                wr.shutdown().await
            })
            .await;
        }
        self.out.clear();
        stop.ending
    }

    /// Everything that needs no waiting: decode and handle what was read, send acks for
    /// messages the application took, encode queued commands and in-flight (re)sends.
    fn step(&mut self, rbuf: &mut ReadBuffer) -> Option<Stop> {
        while self.stalled.is_none() {
            match decode(rbuf.bytes(), self.version, self.announced.max_packet_size) {
                Ok(Some(p)) => {
                    if let Some(stop) = self.on_packet(p) {
                        return Some(stop);
                    }
                }
                Ok(None) => break,
                Err(e) => return Some(self.protocol_error(e.reason_code(), &e.to_string())),
            }
        }
        while self.acks_open {
            match self.acks.try_recv() {
                Ok(t) => self.on_taken(t),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => self.acks_open = false,
            }
        }
        while self.out.len() < WRITE_BUDGET {
            let Some(cmd) = self.inbox.try_next() else { break };
            if let Some(stop) = self.on_command(cmd) {
                return Some(stop);
            }
        }
        if !self.inbox.open && self.inbox.backlog.is_empty() {
            // Every handle was dropped: nobody is left to use the connection.
            return Some(self.disconnect(ReasonCode::Success));
        }
        self.transmit();
        None
    }

    /// Encodes in-flight publishes (and PUBRELs) the window lets out.
    fn transmit(&mut self) {
        while self.out.len() < WRITE_BUDGET {
            let Some(t) = self.inflight.poll_transmit(self.window) else { break };
            let (id, written) = match t {
                Transmission::Publish(p) => (packet_id(p), encode(p, self.version, &mut self.out)),
                Transmission::PubRel(id) => {
                    (id, encode(&Packet::PubRel(Ack::new(id)), self.version, &mut self.out))
                }
            };
            if let Err(e) = written {
                if let Some(c) =
                    self.inflight.fail(id, Error::Protocol(format!("cannot encode PUBLISH: {e}")))
                {
                    self.complete(c);
                }
            }
        }
    }

    fn send(&mut self, p: &Packet) {
        if let Err(e) = encode(p, self.version, &mut self.out) {
            warn!("cannot encode {}: {e}", p.name());
        }
    }

    fn on_command(&mut self, cmd: Command) -> Option<Stop> {
        match cmd {
            Command::Publish(mut packet, done) => {
                let Packet::Publish(p) = &mut *packet else { return None };
                if p.qos == braid_proto::QoS::AtMostOnce {
                    self.send(&packet);
                    return None;
                }
                let requests = &self.requests;
                match self.inflight.allocate_id(|id| requests.contains_key(&id)) {
                    Some(id) => {
                        p.packet_id = id;
                        self.inflight.push(id, packet, done);
                        // Now, so that the wire keeps the order of publish calls across QoS.
                        self.transmit();
                    }
                    None => {
                        let result = Err(Error::Protocol("no free packet identifier".into()));
                        self.complete(Completion { done, result });
                    }
                }
            }
            Command::Request(packet, done) => self.request(packet, Some(done)),
            Command::Disconnect(reason, done) => {
                self.close_done = Some(done);
                return Some(self.disconnect(reason));
            }
        }
        None
    }

    /// Sends a SUBSCRIBE or UNSUBSCRIBE under a fresh packet id.
    fn request(&mut self, mut packet: Box<Packet>, done: Option<RequestDone>) {
        let requests = &self.requests;
        let Some(id) = self.inflight.allocate_id(|id| requests.contains_key(&id)) else {
            if let Some(done) = done {
                let _ = done.send(Err(Error::Protocol("no free packet identifier".into())));
            }
            return;
        };
        match &mut *packet {
            Packet::Subscribe(s) => s.packet_id = id,
            Packet::Unsubscribe(u) => u.packet_id = id,
            _ => return,
        }
        if let Err(e) = encode(&packet, self.version, &mut self.out) {
            if let Some(done) = done {
                let _ = done.send(Err(Error::Protocol(format!("cannot encode {}: {e}", packet.name()))));
            }
            return;
        }
        self.requests.insert(id, Request { packet, done });
    }

    fn disconnect(&mut self, reason: ReasonCode) -> Stop {
        if !self.data_stream {
            let d = Disconnect { reason, properties: Properties::default() };
            self.send(&Packet::Disconnect(d));
        }
        Stop { ending: Ending::Closed, flush: true }
    }

    /// We close because the server broke the protocol (v5: DISCONNECT with `reason`).
    fn protocol_error(&mut self, reason: ReasonCode, detail: &str) -> Stop {
        warn!(client_id = %self.client_id, "closing connection: {detail} ({})", reason.description());
        if self.version.is_v5() && !self.data_stream {
            let properties = Properties::from(braid_proto::PropertyValues {
                reason_string: Some(detail.into()),
                ..Default::default()
            });
            self.send(&Packet::Disconnect(Disconnect { reason, properties }));
        }
        Stop { ending: Ending::Lost(None), flush: true }
    }

    fn on_packet(&mut self, p: Packet) -> Option<Stop> {
        match p {
            Packet::Publish(p) => match self.inbound.on_publish(p) {
                Action::Deliver(p) => {
                    let epoch = self.inbound.epoch();
                    return self.deliver(Incoming::Message(Box::new(p), epoch));
                }
                Action::Reply(r) => self.send(&r),
                Action::Ignore => {}
                Action::Close(reason, detail) => return Some(self.protocol_error(reason, detail)),
            },
            Packet::PubAck(a) => {
                if let Some(c) = self.inflight.on_puback(&a) {
                    self.complete(c);
                }
            }
            Packet::PubRec(a) => {
                let (rel, c) = self.inflight.on_pubrec(&a);
                if let Some(rel) = rel {
                    self.send(&Packet::PubRel(rel));
                }
                if let Some(c) = c {
                    self.complete(c);
                }
            }
            Packet::PubComp(a) => {
                if let Some(c) = self.inflight.on_pubcomp(&a) {
                    self.complete(c);
                }
            }
            Packet::PubRel(a) => {
                let comp = self.inbound.on_pubrel(a.packet_id);
                self.send(&comp);
            }
            Packet::SubAck(s) => self.on_suback(s.packet_id, s.reasons),
            Packet::UnsubAck(u) => self.on_unsuback(u),
            Packet::PingResp => self.ping_sent = None,
            Packet::Disconnect(d) => {
                let why = d.properties.reason_string.as_deref().unwrap_or("");
                info!(client_id = %self.client_id, "server sent DISCONNECT: {} {why}", d.reason.description());
                return Some(Stop::lost(Some(d.reason)));
            }
            other => {
                let detail = format!("unexpected {} from the server", other.name());
                return Some(self.protocol_error(ReasonCode::ProtocolError, &detail));
            }
        }
        None
    }

    /// Queues an event for the application, or stalls reading until there is room.
    fn deliver(&mut self, ev: Incoming) -> Option<Stop> {
        let closed = match self.events.try_reserve() {
            Ok(permit) => {
                permit.send(ev);
                false
            }
            Err(TrySendError::Full(())) => {
                self.stalled = Some(ev);
                false
            }
            Err(TrySendError::Closed(())) => true,
        };
        closed.then(|| self.disconnect(ReasonCode::Success))
    }

    fn on_taken(&mut self, t: Taken) {
        if let Some(ack) = self.inbound.on_taken(t) {
            self.send(&ack);
        }
    }

    fn on_suback(&mut self, id: u16, reasons: Vec<ReasonCode>) {
        let Some(req) = self.requests.remove(&id) else {
            debug!("SUBACK for unknown packet id {id}");
            return;
        };
        if let Packet::Subscribe(s) = &*req.packet {
            for ((filter, options), reason) in s.filters.iter().zip(&reasons) {
                if reason.is_error() {
                    continue;
                }
                let r = Remembered {
                    filter: filter.clone(),
                    options: *options,
                    properties: s.properties.clone(),
                };
                match self.subscriptions.iter_mut().find(|m| m.filter == *filter) {
                    Some(m) => *m = r,
                    None => self.subscriptions.push(r),
                }
            }
        }
        if let Some(done) = req.done {
            let _ = done.send(Ok(reasons));
        }
    }

    fn on_unsuback(&mut self, u: UnsubAck) {
        let Some(req) = self.requests.remove(&u.packet_id) else {
            debug!("UNSUBACK for unknown packet id {}", u.packet_id);
            return;
        };
        let mut reasons = u.reasons;
        if let Packet::Unsubscribe(un) = &*req.packet {
            self.subscriptions.retain(|m| !un.filters.contains(&m.filter));
            if reasons.is_empty() {
                // 3.1.x UNSUBACK carries no reason codes.
                reasons = vec![ReasonCode::Success; un.filters.len()];
            }
        }
        if let Some(done) = req.done {
            let _ = done.send(Ok(reasons));
        }
    }

    /// Resolves a publish and frees its window slot.
    fn complete(&mut self, c: Completion) {
        c.resolve();
        if self.debt > 0 {
            self.debt -= 1;
        } else {
            self.shared.window.add_permits(1);
        }
    }

    fn keep_alive_or_never(&self) -> Duration {
        if self.keep_alive.is_zero() {
            FAR_FUTURE
        } else {
            self.keep_alive
        }
    }

    /// The keep-alive timer fired: send PINGREQ if nothing was sent for a keep-alive period,
    /// give up if the PINGRESP is a keep-alive period late. Returns the next check time.
    fn keep_alive_check(&mut self) -> Result<Instant, Stop> {
        let now = Instant::now();
        let ka = self.keep_alive;
        if ka.is_zero() {
            return Ok(now + FAR_FUTURE);
        }
        if let Some(sent) = self.ping_sent {
            if self.stalled.is_some() {
                // Not reading: the answer may be waiting unread.
                self.ping_sent = Some(now);
                return Ok(now + ka);
            }
            if now >= sent + ka {
                warn!(client_id = %self.client_id, "no PINGRESP within {} s: connection lost", ka.as_secs());
                return Err(Stop::lost(None));
            }
            return Ok(sent + ka);
        }
        if now >= self.last_sent + ka {
            self.send(&Packet::PingReq);
            self.ping_sent = Some(now);
            return Ok(now + ka);
        }
        Ok(self.last_sent + ka)
    }

    /// Applies a successful CONNACK: client id, window, keep alive, server limits.
    fn on_connack(&mut self, ack: &ConnAck) -> Connected {
        let props = &ack.properties;
        if let Some(id) = &props.assigned_client_identifier {
            self.client_id = id.to_string();
        }
        self.set_window(window_for(&self.opts, ack));
        let keep_alive = match self.data_stream {
            true => 0,
            false => props.server_keep_alive.unwrap_or(self.opts.keep_alive),
        };
        self.keep_alive = Duration::from_secs(u64::from(keep_alive));
        let s = &self.shared;
        s.max_packet_size.store(props.maximum_packet_size.unwrap_or(u32::MAX), Ordering::Relaxed);
        s.max_qos.store(props.maximum_qos.unwrap_or(2), Ordering::Relaxed);
        s.retain_available.store(props.retain_available.unwrap_or(1) != 0, Ordering::Relaxed);
        *s.connack.lock().unwrap_or_else(|e| e.into_inner()) = Some(ack.clone());
        Connected {
            session_present: ack.session_present,
            client_id: self.client_id.clone(),
            properties: ack.properties.clone(),
        }
    }

    /// Resizes the window; a shrink takes free slots now and owes the rest.
    fn set_window(&mut self, new: usize) {
        if new > self.window {
            let grow = new - self.window;
            let paid = grow.min(self.debt);
            self.debt -= paid;
            if grow > paid {
                self.shared.window.add_permits(grow - paid);
            }
        } else if new < self.window {
            let shrink = self.window - new;
            let taken = self.shared.window.forget_permits(shrink);
            self.debt += shrink - taken;
        }
        self.window = new;
    }

    /// While offline, waits for room for a stalled message (data is never dropped); false if
    /// the client is closed meanwhile.
    async fn flush_stalled(&mut self) -> bool {
        let Some(ev) = self.stalled.take() else { return true };
        match wait_offline(&mut self.inbox, &self.shared, self.events.reserve()).await {
            Some(Ok(permit)) => {
                permit.send(ev);
                true
            }
            _ => false,
        }
    }

    /// Queues a Connected / Disconnected event if there is room. An application that never
    /// calls `recv` (a publisher) must not stall reconnects, so these are dropped when the
    /// queue is full.
    fn notify(&mut self, ev: Incoming) {
        if self.stalled.is_some() || self.events.try_send(ev).is_err() {
            debug!(client_id = %self.client_id, "event queue full: connection event dropped");
        }
    }

    /// Reconnects with backoff; `None` if the client was closed meanwhile.
    async fn reconnect(&mut self) -> Option<Link> {
        let policy = self.opts.reconnect.clone()?;
        let mut backoff = Backoff::new(policy.initial_delay, policy.max_delay).jittered();
        // Only v5 can resume a session the first connect asked to be clean: a 3.1.x clean
        // session ends with its connection, and Clean Session 0 would make a new one persist.
        let clean_start = !self.version.is_v5() && self.opts.clean_start;
        loop {
            wait_offline(&mut self.inbox, &self.shared, tokio::time::sleep(backoff.pause())).await?;
            let attempt = tokio::time::timeout(
                self.opts.connect_timeout,
                connect::handshake(&self.opts, &self.client_id, clean_start),
            );
            match wait_offline(&mut self.inbox, &self.shared, attempt).await? {
                Ok(Ok((link, ack))) => {
                    let connected = self.on_connack(&ack);
                    info!(client_id = %self.client_id, session_present = ack.session_present, "reconnected");
                    self.resume(ack.session_present);
                    self.notify(Incoming::Connected(Box::new(connected)));
                    return Some(link);
                }
                Ok(Err(e)) => debug!(client_id = %self.client_id, "reconnect failed: {e}"),
                Err(_) => debug!(client_id = %self.client_id, "reconnect timed out"),
            }
        }
    }

    /// After a reconnect: resend what the server has not acknowledged, or start over if it
    /// no longer has the session.
    fn resume(&mut self, session_present: bool) {
        self.inbound.on_connect(session_present);
        let mut done = Vec::new();
        self.inflight.on_reconnect(session_present, &mut done);
        for c in done {
            self.complete(c);
        }
        let mut ids: Vec<u16> = self.requests.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(r) = self.requests.get(&id) {
                let _ = encode(&r.packet, self.version, &mut self.out);
            }
        }
        if !session_present {
            let again: Vec<Packet> = self
                .subscriptions
                .iter()
                .map(|m| {
                    Packet::Subscribe(Subscribe {
                        packet_id: 0,
                        properties: m.properties.clone(),
                        filters: vec![(m.filter.clone(), m.options)],
                    })
                })
                .collect();
            if !again.is_empty() {
                debug!(client_id = %self.client_id, "session not resumed: subscribing to {} filters again", again.len());
            }
            for p in again {
                self.request(Box::new(p), None);
            }
        }
    }

    /// The client is gone for good: fail whatever still waits.
    fn finish(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        if self.data_stream {
            // The connection's window goes on: give back this stream's slots.
            let open: Vec<Completion> = self.inflight.close().collect();
            for c in open {
                self.complete(c);
            }
        } else {
            self.shared.window.close();
            for c in self.inflight.close() {
                c.resolve();
            }
        }
        for (_, r) in self.requests.drain() {
            if let Some(done) = r.done {
                let _ = done.send(Err(Error::Closed));
            }
        }
        self.inbox.backlog.clear();
        self.inbox.rx.close();
        if let Some(done) = self.close_done.take() {
            let _ = done.send(());
        }
    }
}

/// min(max_inflight, the server's Receive Maximum), at least 1.
fn window_for(opts: &ClientOptions, ack: &ConnAck) -> usize {
    let server = ack.properties.receive_maximum.unwrap_or(u16::MAX);
    usize::from(opts.max_inflight.min(server).max(1))
}

fn packet_id(p: &Packet) -> u16 {
    match p {
        Packet::Publish(p) => p.packet_id,
        _ => 0,
    }
}

/// Waits for `fut` while offline, taking commands into the backlog; `None` if the client is
/// closed meanwhile (`disconnect`, or every handle dropped).
async fn wait_offline<F: Future>(inbox: &mut Inbox, shared: &Shared, fut: F) -> Option<F::Output> {
    tokio::pin!(fut);
    loop {
        if shared.closing.load(Ordering::Acquire) || !inbox.open {
            return None;
        }
        tokio::select! {
            out = &mut fut => return Some(out),
            () = shared.close_notify.notified() => {}
            cmd = inbox.rx.recv(), if inbox.backlog.len() < BACKLOG_MAX => match cmd {
                Some(Command::Disconnect(_, done)) => {
                    let _ = done.send(());
                    return None;
                }
                Some(cmd) => inbox.backlog.push_back(cmd),
                None => {
                    inbox.open = false;
                    return None;
                }
            },
        }
    }
}
