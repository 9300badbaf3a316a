//! One client connection over any byte stream: read CONNECT, attach the session, then one task
//! reads and handles inbound packets and writes replies and deliveries, so a client's PUBACK
//! goes out with the deliveries of the same turn and nothing waits for a second task.

pub(crate) mod handover;
pub mod in_process;
pub(crate) mod inbound;
mod receive_window;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use braid_proto::{
    decode, encode, ByteString, BytesMut, ConnAck, Connect, DecodeError, Disconnect, Packet, Properties,
    ProtocolVersion, QoS, ReasonCode,
};

use crate::auth::{AclSeed, ConnectionAcl, Identity};
use crate::broker::{Accepted, Broker, Ending};
use crate::control::ConnControl;
use crate::metrics::Metrics;
use crate::session::{Origin, QueueLimits, Session, SessionState, Transmit};
use crate::trace::Direction;
use crate::transport_kind::Transport;
use braid_proto::ReadBuffer;
use inbound::{Flow, Inbound};

/// Bytes of deliveries encoded before writing; more stays queued until the write completes.
const WRITE_BUDGET: usize = 64 * 1024;
/// A write buffer that grew beyond this is released once written.
const KEEP_WRITE_CAPACITY: usize = 16 * 1024;
/// How long a closed connection goes on reading what its client still sends (see [`linger`]).
const LINGER: Duration = Duration::from_secs(1);
/// The most it reads of that, in bytes.
const LINGER_BYTES: u64 = 64 * 1024;

/// Serves one client of `transport`'s listener on `rd`/`wr` until it disconnects, misbehaves,
/// is taken over or the broker shuts down (plain TCP goes through
/// [`crate::transport::tcp::serve`], which can also park). `verified_username` is a name the
/// transport has already established (a verified TLS client certificate's): authentication
/// accepts it without looking at the CONNECT's credentials.
pub async fn serve_verified<R, W>(
    broker: Arc<Broker>,
    rd: R,
    wr: W,
    peer: SocketAddr,
    transport: Transport,
    verified_username: Option<String>,
) where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let via = Via::Listener { transport, verified_username };
    serve(broker, rd, wr, peer, via).await;
}

/// How a client reached the broker.
#[derive(Debug)]
pub(crate) enum Via {
    /// Through `transport`'s listener; `verified_username`: a name the transport established.
    Listener { transport: Transport, verified_username: Option<String> },
    /// In process (a part of Braid such as a bridge, see [`in_process`]): not authenticated,
    /// not restricted by the ACL, its session's queue under `limits`.
    InProcess { name: String, limits: Arc<QueueLimits> },
}

/// Serves one client on `rd`/`wr`, however it came.
async fn serve<R, W>(broker: Arc<Broker>, mut rd: R, mut wr: W, peer: SocketAddr, via: Via)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let Some(start) = handshake(&broker, &mut rd, &mut wr, peer, via).await else {
        return;
    };
    let mut conn = Connection::new(&broker, &start.accepted, start.version, peer, start.out);
    let acl = broker.security().resume_acl(start.acl, &start.accepted.session.client_id);
    // What the stream layer (TLS, WebSocket) holds unread cannot be seen from here.
    let ending = match conn.run(&mut rd, &mut wr, start.rbuf, HashMap::new(), acl, |_| false).await {
        Stop::End(ending) => ending,
        // Parking is only ever asked of connections whose transport allowed it.
        Stop::Park(..) => Ending::WithWill,
    };
    conn.finish(&mut rd, &mut wr, ending).await;
}

/// An accepted client, its CONNACK encoded and not yet written.
pub(crate) struct Start {
    pub(crate) accepted: Accepted,
    pub(crate) version: ProtocolVersion,
    pub(crate) out: BytesMut,
    pub(crate) rbuf: ReadBuffer,
    /// Who the client is, for its topic authorization.
    pub(crate) acl: Option<Box<AclSeed>>,
}

/// Reads CONNECT (within the connect timeout), authenticates the client and attaches the
/// session; None if the client was refused or went away, in which case the connection is
/// already closed.
pub(crate) async fn handshake<R, W>(
    broker: &Arc<Broker>,
    rd: &mut R,
    wr: &mut W,
    peer: SocketAddr,
    via: Via,
) -> Option<Start>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut rbuf = ReadBuffer::default();
    let timeout = Duration::from_secs(broker.config().mqtt.connect_timeout_secs);
    // Boxed: the connect phase is short, and its timers should not stay in every task.
    let first = Box::pin(async {
        tokio::select! {
            first = tokio::time::timeout(timeout, read_connect(rd, &mut rbuf, broker)) => first,
            _ = broker.shutdown().cancelled() => Ok(Err(FirstPacket::Close("shutting down".into()))),
        }
    })
    .await;
    let connect = match first {
        Err(_) => {
            info!(%peer, "closing connection: no CONNECT within {}s", timeout.as_secs());
            return None;
        }
        Ok(Err(FirstPacket::Eof)) => return None,
        Ok(Err(FirstPacket::Refuse(why))) => {
            info!(%peer, "refusing connection: {why}");
            let version = ProtocolVersion::V3_1_1;
            Box::pin(refuse_lingering(rd, wr, version, ReasonCode::UnsupportedProtocolVersion, None)).await;
            return None;
        }
        Ok(Err(FirstPacket::Close(why))) => {
            info!(%peer, "closing connection: {why}");
            return None;
        }
        Ok(Ok(c)) => c,
    };
    let version = connect.protocol;
    let (accepted, connack, acl) = match admit(broker, &connect, &via, peer).await {
        Ok(a) => a,
        Err(reason) => {
            Box::pin(refuse_lingering(rd, wr, version, reason, elsewhere(broker, reason))).await;
            return None;
        }
    };
    drop(connect);
    let mut out = BytesMut::new();
    let _ = encode(&Packet::ConnAck(connack), version, &mut out);
    Some(Start { accepted, version, out, rbuf, acl })
}

/// Authenticates a CONNECT that came `via` a listener or in process, checks its will topic
/// against the ACL and attaches the session (under the queue policies of the listener, or
/// those of the in-process client), with a persistent session's deliveries read back from
/// disk. Returns the attachment, its CONNACK and the client's authorization, or the reason to
/// refuse with (logged and counted here). Every transport's handshake goes through this.
pub(crate) async fn admit(
    broker: &Arc<Broker>,
    connect: &Connect,
    via: &Via,
    peer: SocketAddr,
) -> Result<(Accepted, ConnAck, Option<Box<AclSeed>>), ReasonCode> {
    let admitted = admit_counted(broker, connect, via, peer).await;
    if let Err(reason) = &admitted {
        broker.metrics().connects_refused.count(*reason);
    }
    admitted
}

async fn admit_counted(
    broker: &Arc<Broker>,
    connect: &Connect,
    via: &Via,
    peer: SocketAddr,
) -> Result<(Accepted, ConnAck, Option<Box<AclSeed>>), ReasonCode> {
    let client_id = &connect.client_id;
    let (identity, limits) = match via {
        Via::Listener { .. } if client_id.starts_with(crate::session::IN_PROCESS) => {
            info!(%peer, %client_id, "refusing CONNECT: client ids under {:?} are Braid's own", crate::session::IN_PROCESS);
            return Err(ReasonCode::ClientIdentifierNotValid);
        }
        Via::Listener { transport, verified_username } => {
            match broker.security().authenticate(connect, verified_username.as_deref()).await {
                Ok(identity) => (identity, broker.listener_limits(*transport)),
                Err(r) => {
                    info!(%peer, %client_id, "refusing CONNECT: {} ({})", r.detail, r.reason.description());
                    return Err(r.reason);
                }
            }
        }
        Via::InProcess { name, limits } => (Identity::unrestricted(name), limits.clone()),
    };
    let origin = Origin {
        transport: match via {
            Via::Listener { transport, .. } => Some(*transport),
            Via::InProcess { .. } => None,
        },
        peer,
        username: identity.username.as_deref().map(Box::from),
        ..Origin::default()
    };
    let acl = broker.security().seed(identity, client_id);
    if let Some(will) = &connect.will {
        if !broker.security().resume_acl(acl.clone(), client_id).may_publish(&will.topic) {
            info!(%peer, %client_id, topic = %will.topic, "refusing CONNECT: the ACL denies the will topic");
            return Err(ReasonCode::NotAuthorized);
        }
    }
    if let Some(directory) = broker.directory() {
        directory.claim(client_id, connect.clean_start).await.inspect_err(|reason| {
            info!(%peer, %client_id, "refusing CONNECT: {}", reason.description());
        })?;
    }
    // A connection that holds this client's session first handles what it was already sent.
    crate::connection::handover::wait(broker, client_id).await;
    let (accepted, connack, restore) =
        broker.connect(connect, limits, origin.clone(), Instant::now()).inspect_err(|reason| {
            info!(%peer, %client_id, "refusing CONNECT: {}", reason.description());
        })?;
    if let (Some(directory), false) = (broker.directory(), client_id.is_empty()) {
        directory.attached(client_id);
    }
    if let Some(restore) = restore {
        // A persistent session's deliveries waiting on disk come back before anything is sent.
        match restore.await {
            Ok(Ok(stored)) => accepted.session.lock().restore(accepted.generation, stored),
            Ok(Err(e)) => tracing::error!(%client_id, "cannot read queued deliveries back: {e}"),
            Err(_) => {}
        }
    }
    if matches!(via, Via::Listener { .. }) {
        let session = &accepted.session;
        let username = origin.username.as_deref();
        let refused = broker.auto_subscribe(session, connect.protocol, username, peer, Instant::now());
        if !refused.is_empty() {
            info!(%peer, %client_id, ?refused, "auto-subscribe: subscriptions refused (a limit reached)");
        }
    }
    debug!(%peer, %client_id, version = ?connect.protocol, user = ?origin.username, "client connected");
    Ok((accepted, connack, acl))
}

/// Why [`Connection::run`] returned.
pub(crate) enum Stop {
    /// The connection is over.
    End(Ending),
    /// The connection is idle and was asked to park; these are its client's topic aliases and
    /// what it keeps of its authorization.
    Park(HashMap<u16, ByteString>, Option<Box<AclSeed>>),
}

/// What woke a connection.
enum Event {
    /// Its control block: deliveries are ready, or it must close.
    Woken,
    /// A write completed (0 bytes or an error ends the connection).
    Wrote(std::io::Result<usize>),
    /// The held acknowledgement may go out (once its store ticket is on disk).
    Released(inbound::Released),
    /// The group commit moved on: acknowledgements waiting for it may go out.
    Synced,
    /// A read completed (0 bytes is end of stream).
    Read(std::io::Result<usize>),
}

/// Waits while there is nothing to write and nothing held: for bytes or a wake-up.
async fn wait_idle<R: AsyncRead + Unpin>(ctl: &ConnControl, rbuf: &mut ReadBuffer, rd: &mut R) -> Event {
    tokio::select! {
        biased;
        _ = ctl.woken() => Event::Woken,
        read = rbuf.read_from(rd) => Event::Read(read),
    }
}

/// Waits for a wake-up, write progress, the held acknowledgement, or (when not held) bytes.
/// While held, nothing is read from the client: that is the backpressure.
async fn wait_busy<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    ctl: &ConnControl,
    wr: &mut W,
    pending: &[u8],
    held: bool,
    inbound: &mut Inbound<'_>,
    rbuf: &mut ReadBuffer,
    rd: &mut R,
) -> Event {
    tokio::select! {
        biased;
        _ = ctl.woken() => Event::Woken,
        written = wr.write(pending), if !pending.is_empty() => Event::Wrote(written),
        ack = inbound.next_ack() => match ack {
            Some(ack) => Event::Released(ack),
            None => Event::Synced,
        },
        read = rbuf.read_from(rd), if !held => Event::Read(read),
    }
}

/// Why no CONNECT came first.
pub(crate) enum FirstPacket {
    Eof,
    Close(String),
    Refuse(String),
}

/// Reads until the first packet, which must be a CONNECT.
pub(crate) async fn read_connect<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut ReadBuffer,
    broker: &Broker,
) -> Result<Box<Connect>, FirstPacket> {
    let max = broker.config().mqtt.max_packet_size;
    loop {
        match decode(rbuf.bytes(), ProtocolVersion::V3_1_1, max) {
            Ok(Some(Packet::Connect(c))) => return Ok(c),
            Ok(Some(p)) => {
                return Err(FirstPacket::Close(format!("first packet was {}, not CONNECT", p.name())))
            }
            Ok(None) => {}
            Err(DecodeError::UnsupportedProtocol) => {
                return Err(FirstPacket::Refuse("unsupported protocol name or level".into()))
            }
            Err(e) => return Err(FirstPacket::Close(format!("bad CONNECT: {e}"))),
        }
        match rbuf.read_from(rd).await {
            Ok(0) | Err(_) => return Err(FirstPacket::Eof),
            Ok(n) => Metrics::add(&broker.metrics().bytes_received, n as u64),
        }
    }
}

/// Writes a refusing CONNACK and shuts the stream down; true if it was (QUIC's close then waits
/// for the peer, byte streams go through [`refuse_lingering`]).
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(
    wr: &mut W,
    version: ProtocolVersion,
    reason: ReasonCode,
    server_reference: Option<ByteString>,
) -> bool {
    let mut buf = BytesMut::new();
    let properties = Properties::from(braid_proto::PropertyValues {
        reason_string: Some(reason.description().into()),
        server_reference,
        ..Default::default()
    });
    let ack = ConnAck { session_present: false, reason, properties };
    let _ = encode(&Packet::ConnAck(ack), version, &mut buf);
    write_and_close(wr, &buf).await
}

/// [`refuse`] on a byte stream, then [`linger`].
async fn refuse_lingering<R, W>(
    rd: &mut R,
    wr: &mut W,
    version: ProtocolVersion,
    reason: ReasonCode,
    server_reference: Option<ByteString>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if refuse(wr, version, reason, server_reference).await {
        linger(rd).await;
    }
}

/// Where a client refused with `reason` should connect instead (a v5 CONNACK's Server
/// Reference): for 0x9C (Use another server), the node the cluster suggests, if it knows one.
pub(crate) fn elsewhere(broker: &Broker, reason: ReasonCode) -> Option<ByteString> {
    match reason {
        ReasonCode::UseAnotherServer => broker.directory()?.server_reference(),
        _ => None,
    }
}

/// Writes the last bytes of a connection and shuts it down, giving up after one second (a
/// client that does not read must not keep the task alive); true if it was shut down.
async fn write_and_close<W: AsyncWrite + Unpin>(wr: &mut W, last: &[u8]) -> bool {
    let closed = tokio::time::timeout(Duration::from_secs(1), async {
        if !last.is_empty() {
            wr.write_all(last).await?;
        }
        wr.shutdown().await
    })
    .await;
    matches!(closed, Ok(Ok(())))
}

/// After the broker shut its side of a byte stream down: reads and drops what the client still
/// sends until its end of stream, for at most [`LINGER`] and [`LINGER_BYTES`]. A socket closed
/// with unread bytes is reset, and a client still writing would lose the DISCONNECT or CONNACK
/// it was sent before it read it.
async fn linger<R: AsyncRead + Unpin>(rd: &mut R) {
    let drain = async { tokio::io::copy(&mut rd.take(LINGER_BYTES), &mut tokio::io::sink()).await };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// How a connection the broker closes with `reason` ends, for will and session handling.
pub(crate) fn ending_for(reason: ReasonCode) -> Ending {
    match reason {
        ReasonCode::SessionTakenOver | ReasonCode::ServerShuttingDown => Ending::Silent,
        _ => Ending::WithWill,
    }
}

/// Lets the session attached as `generation` encode what it has ready (`poll`), counts what
/// was sent and dropped, and lets publishers go on once its queue has drained. True if more is
/// ready than fitted.
pub(crate) fn transmit(
    broker: &Broker,
    session: &Session,
    generation: u64,
    poll: impl FnOnce(&mut SessionState) -> Transmit,
) -> bool {
    let (t, drained) = {
        let mut st = session.lock();
        if !st.is_attached(generation) {
            return false;
        }
        let t = poll(&mut st);
        (t, st.take_drained())
    };
    session.release_publishers(drained);
    for (qos, n) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().zip(t.published) {
        broker.metrics().messages_sent.add(qos, n);
    }
    Metrics::add(&broker.metrics().dropped_expired, t.expired);
    Metrics::add(&broker.metrics().dropped_too_large, t.too_large);
    t.more
}

/// An accepted connection.
pub(crate) struct Connection<'a> {
    broker: &'a Arc<Broker>,
    a: &'a Accepted,
    version: ProtocolVersion,
    peer: SocketAddr,
    /// Encoded bytes; those before `written` are on the wire already.
    out: BytesMut,
    written: usize,
}

impl<'a> Connection<'a> {
    pub(crate) fn new(
        broker: &'a Arc<Broker>,
        a: &'a Accepted,
        version: ProtocolVersion,
        peer: SocketAddr,
        out: BytesMut,
    ) -> Self {
        Connection { broker, a, version, peer, out, written: 0 }
    }

    /// Reads, handles and writes until the connection ends or parks. `unread` says whether
    /// bytes from the client wait below `rd`, not yet read (see [`crate::connection::handover`]).
    pub(crate) async fn run<R, W>(
        &mut self,
        rd: &mut R,
        wr: &mut W,
        mut rbuf: ReadBuffer,
        aliases: HashMap<u16, ByteString>,
        acl: ConnectionAcl<'_>,
        unread: impl Fn(&R) -> bool,
    ) -> Stop
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (broker, a) = (self.broker, self.a);
        // The clock is read once per turn of the loop: packets handled in a turn arrived by then.
        let mut now = Instant::now();
        let mut inbound = Inbound::new(broker, &a.session, self.version, aliases, acl, now);
        // Deliveries may be waiting already (a resumed session): look before the first wait.
        let mut transmit = true;
        let mut was_held = false;
        // A takeover waits until what the client had sent is handled.
        let mut handing_over = false;
        loop {
            match inbound.handle_buffered(&mut rbuf, now, &mut self.out, |_| None) {
                Flow::Continue => {}
                Flow::End(ending) => {
                    a.ctl.close(ReasonCode::Success);
                    return Stop::End(ending);
                }
                Flow::Close(reason, detail) => {
                    info!(peer = %self.peer, client_id = %a.session.client_id, "closing connection: {detail} ({})", reason.description());
                    a.ctl.close_because(reason, detail);
                    return Stop::End(Ending::WithWill);
                }
            }
            transmit |= inbound.take_transmit();
            if transmit && self.out.len() < WRITE_BUDGET {
                transmit = self.poll_transmit(now);
            }
            // While an acknowledgement is held by full subscriber queues, nothing more is read
            // from this client (backpressure), and its silence is not a keep-alive failure.
            // Keep alive itself is watched by the broker's sweeper (`Broker::sweep_connections`),
            // which counts every byte that arrives: a large packet still arriving over a slow
            // link keeps its client alive.
            let held = inbound.is_held();
            if held != was_held {
                a.ctl.set_held(held, broker.clock_ms(now));
                was_held = held;
            }
            // Most connections are idle most of the time: they wait on a small future. The full
            // wait (writing, held acknowledgements) lives in a box only while it is needed, so
            // an idle connection's task stays small.
            // Complete packets are handled: once nothing more waits on the socket (or nothing
            // can be read, while held), the takeover may go on.
            if handing_over && (held || !unread(rd)) {
                handing_over = false;
                crate::connection::handover::answer(broker, &a.ctl);
            }
            let idle = !held && self.out.is_empty() && !inbound.awaits_sync();
            if idle
                && !transmit
                && !handing_over
                && rbuf.bytes().is_empty()
                && a.ctl.take_park_request()
                && !unread(rd)
            {
                // Nothing to read, write or send since the last wake: give up the task, and
                // the room the deliveries since took in the session's queue. (The sweep may ask
                // a connection the lot has just resumed for its client's bytes, which are not
                // read yet: parking again would serve them after bytes that arrived later.)
                a.session.lock().release_idle_memory();
                let (aliases, acl) = inbound.into_kept();
                return Stop::Park(aliases, acl.into_seed());
            }
            let event = if idle {
                wait_idle(&a.ctl, &mut rbuf, rd).await
            } else {
                Box::pin(wait_busy(&a.ctl, wr, &self.out[self.written..], held, &mut inbound, &mut rbuf, rd))
                    .await
            };
            now = Instant::now();
            match event {
                Event::Woken if a.ctl.is_closed() => {
                    let reason = a.ctl.reason();
                    if reason == ReasonCode::KeepAliveTimeout {
                        info!(peer = %self.peer, client_id = %a.session.client_id, "closing connection: keep alive timeout");
                    }
                    return Stop::End(ending_for(reason));
                }
                Event::Woken => {
                    // Cleared before the session is looked at, so a later wake unparks.
                    a.ctl.clear_woken();
                    transmit = true;
                    handing_over |= a.ctl.handover_asked();
                }
                Event::Wrote(Ok(n)) if n > 0 => {
                    a.ctl.wrote(broker.clock_ms(now));
                    Metrics::add(&broker.metrics().bytes_sent, n as u64);
                    self.written += n;
                    if self.written == self.out.len() {
                        if broker.tracer().is_active() {
                            broker.tracer().record_bytes(
                                &a.session.client_id,
                                Direction::Out,
                                &self.out,
                                self.version,
                            );
                        }
                        self.written = 0;
                        self.out.clear();
                        if self.out.capacity() > KEEP_WRITE_CAPACITY {
                            self.out = BytesMut::new();
                        }
                    }
                }
                Event::Released(r) => inbound.ack_released(r, &mut self.out),
                Event::Synced => inbound.flush_synced(&mut self.out),
                Event::Read(Ok(n)) if n > 0 => {
                    a.ctl.touch(broker.clock_ms(now));
                    Metrics::add(&broker.metrics().bytes_received, n as u64);
                }
                Event::Wrote(_) | Event::Read(_) => {
                    a.ctl.close(ReasonCode::Success);
                    return Stop::End(Ending::WithWill);
                }
            }
        }
    }

    /// Encodes what the session has ready at `now`; true if more is ready than fitted.
    fn poll_transmit(&mut self, now: Instant) -> bool {
        let out = &mut self.out;
        transmit(self.broker, &self.a.session, self.a.generation, |st| {
            st.poll_transmit(now, out, WRITE_BUDGET)
        })
    }

    /// Closes the connection, tells the broker how it ended, then lingers on `rd` (not holding
    /// up the will or the session's end).
    pub(crate) async fn finish<R, W>(mut self, rd: &mut R, wr: &mut W, ending: Ending)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        // Boxed like the connect phase: only the closing moment needs its timers.
        let closed = Box::pin(self.close(wr)).await;
        debug!(peer = %self.peer, client_id = %self.a.session.client_id, ?ending, "client disconnected");
        self.broker.disconnected(&self.a.session, self.a.generation, ending, Instant::now());
        if closed {
            Box::pin(linger(rd)).await;
        }
    }

    /// Sends the closing DISCONNECT (v5, when the broker closes with an error reason) after
    /// whatever was already encoded, then shuts the stream down; bounded to one second. True if
    /// it was shut down.
    async fn close<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) -> bool {
        match closing_disconnect(&self.a.ctl, self.version) {
            Closing::Discard => {
                self.out.clear();
                self.written = 0;
            }
            Closing::Send(p) => {
                let _ = encode(&p, self.version, &mut self.out);
            }
            Closing::Flush => {}
        }
        write_and_close(wr, &self.out[self.written..]).await
    }
}

/// What a connection closing at the broker's request does with its unwritten bytes.
#[derive(Debug)]
pub(crate) enum Closing {
    /// A normal close (the client's DISCONNECT): nothing more is written.
    Discard,
    /// Writes what was encoded, then this DISCONNECT (v5) with the reason and its detail.
    Send(Packet),
    /// Writes what was encoded (a 3.1.x client has no DISCONNECT from the server).
    Flush,
}

/// How a connection whose control `ctl` asked it to close ends its output, for a client of
/// `version`.
pub(crate) fn closing_disconnect(ctl: &ConnControl, version: ProtocolVersion) -> Closing {
    let (reason, detail) = ctl.reason_with_detail();
    if !reason.is_error() {
        return Closing::Discard;
    }
    if !version.is_v5() {
        return Closing::Flush;
    }
    let properties = Properties::from(braid_proto::PropertyValues {
        reason_string: Some(detail.as_ref().into()),
        server_reference: ctl.server_reference(),
        ..Default::default()
    });
    Closing::Send(Packet::Disconnect(Disconnect { reason, properties }))
}
