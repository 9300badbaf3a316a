//! One client connection over any byte stream: read CONNECT, attach the session, then run a
//! reader (decode and handle inbound packets) and a writer (encode what the session has ready)
//! side by side until either ends.

mod inbound;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info};

use braid_proto::{
    decode, encode, BytesMut, ConnAck, Connect, DecodeError, Packet, Properties, ProtocolVersion,
    ReasonCode,
};

use crate::broker::{Accepted, Broker, Ending};
use inbound::{Flow, Inbound};

/// Read buffer kept by an idle connection; larger buffers are released once drained.
const IDLE_READ_CAPACITY: usize = 1024;
/// Bytes read per syscall at most when the buffer must grow.
const READ_CHUNK: usize = 16 * 1024;

/// Serves one client on `rd`/`wr` until it disconnects, misbehaves, is taken over or the
/// broker shuts down.
pub async fn serve<R, W>(broker: Arc<Broker>, mut rd: R, mut wr: W, peer: SocketAddr)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut rbuf = BytesMut::with_capacity(IDLE_READ_CAPACITY);
    let timeout = Duration::from_secs(broker.config.mqtt.connect_timeout_secs);
    let max = broker.config.mqtt.max_packet_size;
    let connect =
        match tokio::time::timeout(timeout, read_connect(&mut rd, &mut rbuf, max, &broker)).await {
            Err(_) => {
                info!(%peer, "closing connection: no CONNECT within {}s", timeout.as_secs());
                return;
            }
            Ok(Err(FirstPacket::Eof)) => return,
            Ok(Err(FirstPacket::Refuse(version, reason, why))) => {
                info!(%peer, "refusing connection: {why}");
                refuse(&mut wr, version, reason).await;
                return;
            }
            Ok(Err(FirstPacket::Close(why))) => {
                info!(%peer, "closing connection: {why}");
                return;
            }
            Ok(Ok(c)) => c,
        };
    let version = connect.protocol;
    let accepted = match broker.connect(&connect) {
        Ok(a) => a,
        Err(reason) => {
            info!(%peer, client_id = %connect.client_id, "refusing CONNECT: {}", reason.description());
            refuse(&mut wr, version, reason).await;
            return;
        }
    };
    let client_id = accepted.session.client_id.clone();
    debug!(%peer, %client_id, ?version, "client connected");
    let writer = tokio::spawn(writer::run(
        broker.clone(),
        accepted.session.clone(),
        accepted.generation,
        accepted.ctl.clone(),
        version,
        wr,
    ));
    let ending = read_loop(&broker, &accepted, version, rd, rbuf, peer).await;
    let _ = writer.await;
    debug!(%peer, %client_id, ?ending, "client disconnected");
    broker.disconnected(&accepted.session, accepted.generation, ending);
}

enum FirstPacket {
    Eof,
    Close(String),
    Refuse(ProtocolVersion, ReasonCode, String),
}

async fn read_connect<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    max: u32,
    broker: &Broker,
) -> Result<Box<Connect>, FirstPacket> {
    loop {
        match decode(rbuf, ProtocolVersion::V3_1_1, max) {
            Ok(Some(Packet::Connect(c))) => return Ok(c),
            Ok(Some(p)) => {
                return Err(FirstPacket::Close(format!(
                    "first packet was {}, not CONNECT",
                    p.name()
                )))
            }
            Ok(None) => {}
            Err(DecodeError::UnsupportedProtocol) => {
                return Err(FirstPacket::Refuse(
                    ProtocolVersion::V3_1_1,
                    ReasonCode::UnsupportedProtocolVersion,
                    "unsupported protocol name or level".into(),
                ))
            }
            Err(e) => return Err(FirstPacket::Close(format!("bad CONNECT: {e}"))),
        }
        rbuf.reserve(IDLE_READ_CAPACITY);
        match rd.read_buf(rbuf).await {
            Ok(0) | Err(_) => return Err(FirstPacket::Eof),
            Ok(n) => crate::metrics::Metrics::add(&broker.metrics.bytes_received, n as u64),
        }
    }
}

/// Writes a refusing CONNACK and closes.
async fn refuse<W: AsyncWrite + Unpin>(wr: &mut W, version: ProtocolVersion, reason: ReasonCode) {
    let mut buf = BytesMut::new();
    let ack = ConnAck {
        session_present: false,
        reason,
        properties: Properties::default(),
    };
    if encode(&Packet::ConnAck(ack), version, &mut buf).is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(1), wr.write_all(&buf)).await;
    }
    let _ = wr.shutdown().await;
}

/// Reads and handles packets until the connection ends; returns how it ended.
async fn read_loop<R: AsyncRead + Unpin>(
    broker: &Arc<Broker>,
    a: &Accepted,
    version: ProtocolVersion,
    mut rd: R,
    mut rbuf: BytesMut,
    peer: SocketAddr,
) -> Ending {
    let mut inbound = Inbound::new(broker, &a.session, version);
    let max = broker.config.mqtt.max_packet_size;
    // Keep alive counts every byte that arrives, so a large packet still arriving over a slow
    // link keeps the client alive (the spec only requires 1.5x the interval without a packet).
    let grace = (a.keep_alive > 0).then(|| Duration::from_millis(u64::from(a.keep_alive) * 1500));
    let mut last_activity = Instant::now();
    let far = Duration::from_secs(86_400 * 365);
    let check = tokio::time::sleep(grace.unwrap_or(far));
    tokio::pin!(check);
    loop {
        // Handle everything already buffered (the CONNECT read may have brought more).
        let flow = loop {
            match decode(&mut rbuf, version, max) {
                Ok(Some(p)) => match inbound.handle(p) {
                    Flow::Continue => continue,
                    other => break other,
                },
                Ok(None) => break Flow::Continue,
                Err(e) => {
                    info!(%peer, client_id = %a.session.client_id, "closing connection: {e}");
                    break Flow::Close(e.reason_code());
                }
            }
        };
        inbound.flush();
        match flow {
            Flow::Continue => {}
            Flow::End(ending) => {
                a.ctl.close(ReasonCode::Success);
                return ending;
            }
            Flow::Close(reason) => {
                if reason != ReasonCode::MalformedPacket {
                    info!(%peer, client_id = %a.session.client_id, "closing connection: {}", reason.description());
                }
                a.ctl.close(reason);
                return Ending::WithWill;
            }
        }
        if rbuf.is_empty() && rbuf.capacity() > READ_CHUNK {
            rbuf = BytesMut::with_capacity(IDLE_READ_CAPACITY);
        }
        if rbuf.capacity() - rbuf.len() < IDLE_READ_CAPACITY / 2 {
            rbuf.reserve(READ_CHUNK.min(rbuf.len().max(IDLE_READ_CAPACITY)));
        }
        tokio::select! {
            r = rd.read_buf(&mut rbuf) => match r {
                Ok(0) | Err(_) => {
                    a.ctl.close(ReasonCode::Success);
                    return Ending::WithWill;
                }
                Ok(n) => {
                    last_activity = Instant::now();
                    crate::metrics::Metrics::add(&broker.metrics.bytes_received, n as u64);
                }
            },
            _ = &mut check => {
                let grace = grace.unwrap_or(far);
                let deadline = last_activity + grace;
                if Instant::now() >= deadline {
                    info!(%peer, client_id = %a.session.client_id, "closing connection: keep alive timeout");
                    a.ctl.close(ReasonCode::KeepAliveTimeout);
                    return Ending::WithWill;
                }
                check.as_mut().reset(tokio::time::Instant::from_std(deadline));
            }
            _ = a.ctl.closed() => {
                return match a.ctl.reason() {
                    ReasonCode::SessionTakenOver | ReasonCode::ServerShuttingDown => Ending::Silent,
                    _ => Ending::WithWill,
                };
            }
        }
    }
}
