//! One client connection over any byte stream: read CONNECT, attach the session, then one task
//! reads and handles inbound packets and writes replies and deliveries, so a client's PUBACK
//! goes out with the deliveries of the same turn and nothing waits for a second task.

pub(crate) mod inbound;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use braid_proto::{
    decode, encode, BytesMut, ConnAck, Connect, DecodeError, Disconnect, Packet, Properties, ProtocolVersion,
    ReasonCode,
};

use crate::broker::{Accepted, Broker, Ending};
use crate::control::ConnControl;
use crate::metrics::Metrics;
use crate::session::{Session, SessionState, Transmit};
use braid_proto::ReadBuffer;
use inbound::{Flow, Inbound};

/// Bytes of deliveries encoded before writing; more stays queued until the write completes.
const WRITE_BUDGET: usize = 64 * 1024;
/// A write buffer that grew beyond this is released once written.
const KEEP_WRITE_CAPACITY: usize = 16 * 1024;

/// Serves one client on `rd`/`wr` until it disconnects, misbehaves, is taken over or the
/// broker shuts down.
pub async fn serve<R, W>(broker: Arc<Broker>, mut rd: R, mut wr: W, peer: SocketAddr)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let mut rbuf = ReadBuffer::default();
    let timeout = Duration::from_secs(broker.config.mqtt.connect_timeout_secs);
    // Boxed: the connect phase is short, and its timers should not stay in every task.
    let first = Box::pin(async {
        tokio::select! {
            first = tokio::time::timeout(timeout, read_connect(&mut rd, &mut rbuf, &broker)) => first,
            _ = broker.shutdown.cancelled() => Ok(Err(FirstPacket::Close("shutting down".into()))),
        }
    })
    .await;
    let connect = match first {
        Err(_) => {
            info!(%peer, "closing connection: no CONNECT within {}s", timeout.as_secs());
            return;
        }
        Ok(Err(FirstPacket::Eof)) => return,
        Ok(Err(FirstPacket::Refuse(why))) => {
            info!(%peer, "refusing connection: {why}");
            Box::pin(refuse(&mut wr, ProtocolVersion::V3_1_1, ReasonCode::UnsupportedProtocolVersion)).await;
            return;
        }
        Ok(Err(FirstPacket::Close(why))) => {
            info!(%peer, "closing connection: {why}");
            return;
        }
        Ok(Ok(c)) => c,
    };
    let version = connect.protocol;
    let (accepted, connack) = match broker.connect(&connect) {
        Ok(a) => a,
        Err(reason) => {
            info!(%peer, client_id = %connect.client_id, "refusing CONNECT: {}", reason.description());
            Box::pin(refuse(&mut wr, version, reason)).await;
            return;
        }
    };
    drop(connect);
    let client_id = &accepted.session.client_id;
    debug!(%peer, %client_id, ?version, "client connected");
    let mut out = BytesMut::new();
    let _ = encode(&Packet::ConnAck(connack), version, &mut out);
    let mut conn = Connection { broker: &broker, a: &accepted, version, peer, out, written: 0 };
    let ending = conn.run(&mut rd, &mut wr, rbuf).await;
    // Boxed like the connect phase: only the closing moment needs its timer.
    Box::pin(conn.close(&mut wr)).await;
    debug!(%peer, %client_id, ?ending, "client disconnected");
    broker.disconnected(&accepted.session, accepted.generation, ending);
}

/// What woke a connection.
enum Event {
    /// Its control block: deliveries are ready, or it must close.
    Woken,
    /// A write completed (0 bytes or an error ends the connection).
    Wrote(std::io::Result<usize>),
    /// The held acknowledgement may go out.
    Released(Packet),
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
        ack = release_if_held(held, inbound) => Event::Released(ack),
        read = rbuf.read_from(rd), if !held => Event::Read(read),
    }
}

/// Waits for the held acknowledgement when there is one.
async fn release_if_held(held: bool, inbound: &mut Inbound<'_>) -> Packet {
    if held {
        inbound.release_held().await
    } else {
        std::future::pending().await
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
    let max = broker.config.mqtt.max_packet_size;
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
            Ok(n) => Metrics::add(&broker.metrics.bytes_received, n as u64),
        }
    }
}

/// Writes a refusing CONNACK and closes.
pub(crate) async fn refuse<W: AsyncWrite + Unpin>(wr: &mut W, version: ProtocolVersion, reason: ReasonCode) {
    let mut buf = BytesMut::new();
    let properties = Properties::from(braid_proto::PropertyValues {
        reason_string: Some(reason.description().into()),
        ..Default::default()
    });
    let ack = ConnAck { session_present: false, reason, properties };
    let _ = encode(&Packet::ConnAck(ack), version, &mut buf);
    write_and_close(wr, &buf).await;
}

/// Writes the last bytes of a connection and shuts it down, giving up after one second (a
/// client that does not read must not keep the task alive).
async fn write_and_close<W: AsyncWrite + Unpin>(wr: &mut W, last: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        if !last.is_empty() {
            wr.write_all(last).await?;
        }
        wr.shutdown().await
    })
    .await;
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
    if drained {
        session.release_publishers();
    }
    Metrics::add(&broker.metrics.messages_sent, t.published);
    Metrics::add(&broker.metrics.messages_dropped, t.dropped);
    t.more
}

/// An accepted connection.
struct Connection<'a> {
    broker: &'a Arc<Broker>,
    a: &'a Accepted,
    version: ProtocolVersion,
    peer: SocketAddr,
    /// Encoded bytes; those before `written` are on the wire already.
    out: BytesMut,
    written: usize,
}

impl Connection<'_> {
    /// Reads, handles and writes until the connection ends; returns how it ended.
    async fn run<R, W>(&mut self, rd: &mut R, wr: &mut W, mut rbuf: ReadBuffer) -> Ending
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let (broker, a) = (self.broker, self.a);
        let mut inbound = Inbound::new(broker, &a.session, self.version);
        let max = broker.config.mqtt.max_packet_size;
        // Deliveries may be waiting already (a resumed session): look before the first wait.
        let mut transmit = true;
        let mut was_held = false;
        loop {
            let flow = loop {
                if inbound.is_held() {
                    break Flow::Continue;
                }
                match decode(rbuf.bytes(), self.version, max) {
                    Ok(Some(p)) => match inbound.handle(p, &mut self.out) {
                        Flow::Continue => continue,
                        other => break other,
                    },
                    Ok(None) => break Flow::Continue,
                    Err(e) => break Flow::Close(e.reason_code(), e.to_string().into()),
                }
            };
            match flow {
                Flow::Continue => {}
                Flow::End(ending) => {
                    a.ctl.close(ReasonCode::Success);
                    return ending;
                }
                Flow::Close(reason, detail) => {
                    info!(peer = %self.peer, client_id = %a.session.client_id, "closing connection: {detail} ({})", reason.description());
                    a.ctl.close_because(reason, detail);
                    return Ending::WithWill;
                }
            }
            transmit |= inbound.take_transmit();
            if transmit && self.out.len() < WRITE_BUDGET {
                transmit = self.poll_transmit();
            }
            // While an acknowledgement is held by full subscriber queues, nothing more is read
            // from this client (backpressure), and its silence is not a keep-alive failure.
            // Keep alive itself is watched by the broker's sweeper (`Broker::expire_silent`),
            // which counts every byte that arrives: a large packet still arriving over a slow
            // link keeps its client alive.
            let held = inbound.is_held();
            if held != was_held {
                a.ctl.set_held(held, broker.now_ms());
                was_held = held;
            }
            // Most connections are idle most of the time: they wait on a small future. The full
            // wait (writing, held acknowledgements) lives in a box only while it is needed, so
            // an idle connection's task stays small.
            let event = if !held && self.out.is_empty() {
                wait_idle(&a.ctl, &mut rbuf, rd).await
            } else {
                Box::pin(wait_busy(&a.ctl, wr, &self.out[self.written..], held, &mut inbound, &mut rbuf, rd))
                    .await
            };
            match event {
                Event::Woken if a.ctl.is_closed() => {
                    let reason = a.ctl.reason();
                    if reason == ReasonCode::KeepAliveTimeout {
                        info!(peer = %self.peer, client_id = %a.session.client_id, "closing connection: keep alive timeout");
                    }
                    return ending_for(reason);
                }
                Event::Woken => transmit = true,
                Event::Wrote(Ok(n)) if n > 0 => {
                    Metrics::add(&broker.metrics.bytes_sent, n as u64);
                    self.written += n;
                    if self.written == self.out.len() {
                        self.written = 0;
                        self.out.clear();
                        if self.out.capacity() > KEEP_WRITE_CAPACITY {
                            self.out = BytesMut::new();
                        }
                    }
                }
                Event::Released(ack) => inbound.reply(&ack, &mut self.out),
                Event::Read(Ok(n)) if n > 0 => {
                    a.ctl.touch(broker.now_ms());
                    Metrics::add(&broker.metrics.bytes_received, n as u64);
                }
                Event::Wrote(_) | Event::Read(_) => {
                    a.ctl.close(ReasonCode::Success);
                    return Ending::WithWill;
                }
            }
        }
    }

    /// Encodes what the session has ready; true if more is ready than fitted.
    fn poll_transmit(&mut self) -> bool {
        let out = &mut self.out;
        transmit(self.broker, &self.a.session, self.a.generation, |st| {
            st.poll_transmit(Instant::now(), out, WRITE_BUDGET)
        })
    }

    /// Sends the closing DISCONNECT (v5, when the broker closes with an error reason) after
    /// whatever was already encoded, then shuts the stream down; bounded to one second.
    async fn close<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) {
        let (reason, detail) = self.a.ctl.reason_with_detail();
        if !reason.is_error() {
            self.out.clear();
            self.written = 0;
        } else if self.version.is_v5() {
            let properties = Properties::from(braid_proto::PropertyValues {
                reason_string: Some(detail.as_ref().into()),
                ..Default::default()
            });
            let d = Disconnect { reason, properties };
            let _ = encode(&Packet::Disconnect(d), self.version, &mut self.out);
        }
        write_and_close(wr, &self.out[self.written..]).await;
    }
}
