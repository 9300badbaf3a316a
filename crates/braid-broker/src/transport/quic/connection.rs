//! One MQTT over QUIC connection: the control stream's CONNECT, data streams opened before
//! CONNACK held until the session is attached, then one task per stream reading and one
//! writing, while this task encodes the session's deliveries into the queue of the stream each
//! subscription was made on.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use tracing::{debug, info};

use braid_proto::{
    encode, BytesMut, Disconnect, Packet, Properties, ProtocolVersion, ReadBuffer, ReasonCode,
};

use super::pacer::Pacer;
use super::stream::{self, StreamContext, StreamEnd, StreamOut};
use crate::auth::AclSeed;
use crate::broker::{Accepted, Broker, Ending};
use crate::connection::{self, FirstPacket, Via};
use crate::message::StreamTag;
use crate::session::Outbox;
use crate::transport::Transport;

/// The broker's side of the control stream goes first: CONNACK, PINGRESP and DISCONNECT must
/// never wait behind deliveries.
const CONTROL_PRIORITY: i32 = i32::MAX;

/// A client stream: its sending and receiving halves.
type BiStream = (quinn::SendStream, quinn::RecvStream);

/// Serves one QUIC connection until it closes.
pub(crate) async fn serve(broker: Arc<Broker>, incoming: quinn::Incoming, pacer: Arc<Pacer>) {
    let peer = incoming.remote_address();
    // The client's address stays paced as long as this connection is served.
    let (connecting, _paced) = match pacer.accept(incoming) {
        Ok(c) => c,
        Err(e) => {
            debug!(%peer, "QUIC handshake refused: {e}");
            return;
        }
    };
    // A resuming client's 0-RTT data (its CONNECT, even) is accepted at once.
    let conn = match connecting.into_0rtt() {
        Ok((conn, _)) => conn,
        Err(connecting) => match connecting.await {
            Ok(conn) => conn,
            Err(e) => {
                debug!(%peer, "QUIC handshake failed: {e}");
                return;
            }
        },
    };
    let timeout = Duration::from_secs(broker.config().mqtt.connect_timeout_secs);
    let mut early = Vec::new();
    let first = tokio::select! {
        first = tokio::time::timeout(timeout, read_control(&conn, &broker, &mut early)) => first,
        _ = broker.shutdown().cancelled() => Ok(Err(FirstPacket::Close("shutting down".into()))),
    };
    let (control, mut connect) = match first {
        Err(_) => {
            info!(%peer, "closing QUIC connection: no CONNECT within {}s", timeout.as_secs());
            return conn.close(0u32.into(), b"no CONNECT");
        }
        Ok(Err(FirstPacket::Eof)) => return,
        Ok(Err(FirstPacket::Refuse(why))) => {
            info!(%peer, "refusing QUIC connection: {why}");
            let (mut send, _) = early_control(&mut early);
            let unsupported = ReasonCode::UnsupportedProtocolVersion;
            connection::refuse(&mut send, ProtocolVersion::V3_1_1, unsupported, None).await;
            return close_after(&conn, &send, ReasonCode::UnsupportedProtocolVersion, "").await;
        }
        Ok(Err(FirstPacket::Close(why))) => {
            info!(%peer, "closing QUIC connection: {why}");
            return conn.close(u32::from(ReasonCode::ProtocolError as u8).into(), why.as_bytes());
        }
        Ok(Ok(c)) => c,
    };
    // Streams are not ordered with each other, so an alias defined on one could be used on
    // another before it arrives: no server topic aliases over QUIC.
    if connect.properties.topic_alias_maximum.is_some() {
        connect.properties.topic_alias_maximum = None;
    }
    let version = connect.protocol;
    let (accepted, connack, acl) = match connection::admit(
        &broker,
        &connect,
        &Via::Listener { transport: Transport::Quic, verified_username: None },
        peer,
    )
    .await
    {
        Ok(a) => a,
        Err(reason) => {
            let Control { mut send, .. } = control;
            connection::refuse(&mut send, version, reason, connection::elsewhere(&broker, reason)).await;
            return close_after(&conn, &send, reason, reason.description()).await;
        }
    };
    drop(connect);
    let client_id = accepted.session.client_id.clone();
    let mut out = BytesMut::new();
    let _ = encode(&Packet::ConnAck(connack), version, &mut out);
    let ending = Streams::run(&broker, &accepted, version, &conn, control, early, out, acl).await;
    debug!(%peer, %client_id, ?ending, "QUIC client disconnected");
    broker.disconnected(&accepted.session, accepted.generation, ending, Instant::now());
}

/// The control stream and what was read from it: the CONNECT, and any bytes after it.
struct Control {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    rbuf: ReadBuffer,
}

/// Accepts the control stream and reads its CONNECT; data streams opened meanwhile are kept in
/// `early`. On failure the control stream is left first in `early`, for a refusing CONNACK.
async fn read_control(
    conn: &quinn::Connection,
    broker: &Broker,
    early: &mut Vec<BiStream>,
) -> Result<(Control, Box<braid_proto::Connect>), FirstPacket> {
    let (send, mut recv) = conn.accept_bi().await.map_err(|_| FirstPacket::Eof)?;
    let mut rbuf = ReadBuffer::default();
    let result = loop {
        tokio::select! {
            connect = connection::read_connect(&mut recv, &mut rbuf, broker) => break connect,
            stream = conn.accept_bi() => match stream {
                Ok(s) => early.push(s),
                Err(_) => break Err(FirstPacket::Eof),
            },
        }
    };
    match result {
        Ok(connect) => Ok((Control { send, recv, rbuf }, connect)),
        Err(e) => {
            early.insert(0, (send, recv));
            Err(e)
        }
    }
}

/// The control stream kept by a failed [`read_control`].
fn early_control(early: &mut Vec<BiStream>) -> BiStream {
    early.remove(0)
}

/// Closes the connection once the peer has what was written on `send` (at most one second).
async fn close_after(conn: &quinn::Connection, send: &quinn::SendStream, reason: ReasonCode, detail: &str) {
    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
    conn.close(u32::from(reason as u8).into(), detail.as_bytes());
}

/// The streams of an accepted connection.
struct Streams {
    cx: StreamContext,
    /// Outbound queue of every open stream, by stream index.
    outs: HashMap<u64, Arc<StreamOut>>,
    control: u64,
    readers: JoinSet<(u64, StreamEnd)>,
    writers: JoinSet<()>,
}

impl Streams {
    /// Runs the connection until it ends; returns how.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        broker: &Arc<Broker>,
        a: &Accepted,
        version: ProtocolVersion,
        conn: &quinn::Connection,
        control: Control,
        early: Vec<BiStream>,
        connack: BytesMut,
        acl: Option<Box<AclSeed>>,
    ) -> Ending {
        let cx = StreamContext {
            broker: broker.clone(),
            session: a.session.clone(),
            ctl: a.ctl.clone(),
            generation: a.generation,
            version,
            held: Arc::new(AtomicUsize::new(0)),
            window: Arc::new(AtomicUsize::new(0)),
            acl,
        };
        let control_index = control.recv.id().index();
        let mut s = Streams {
            cx,
            outs: HashMap::new(),
            control: control_index,
            readers: JoinSet::new(),
            writers: JoinSet::new(),
        };
        let control_out = Arc::new(StreamOut::new(CONTROL_PRIORITY));
        control_out.push(connack.freeze());
        let control_writer = tokio::spawn(stream::write(control.send, control_out.clone(), s.cx.clone()));
        s.outs.insert(control_index, control_out.clone());
        s.readers.spawn(stream::read(
            s.cx.clone(),
            control_index,
            true,
            control.recv,
            control.rbuf,
            control_out.clone(),
        ));
        for (send, recv) in early {
            s.open(send, recv);
        }
        let ending = s.serve(conn).await;
        s.readers.abort_all();
        let (reason, detail) = a.ctl.reason_with_detail();
        if reason.is_error() {
            if version.is_v5() {
                let properties = Properties::from(braid_proto::PropertyValues {
                    reason_string: Some(detail.as_ref().into()),
                    server_reference: a.ctl.server_reference(),
                    ..Default::default()
                });
                let mut buf = BytesMut::new();
                let _ = encode(&Packet::Disconnect(Disconnect { reason, properties }), version, &mut buf);
                control_out.push(buf.freeze());
            }
            // The writer finishes the stream and waits (boundedly) for the peer to have it.
            control_out.finish();
            let _ = tokio::time::timeout(Duration::from_secs(2), control_writer).await;
        } else {
            control_writer.abort();
        }
        s.writers.abort_all();
        conn.close(u32::from(reason as u8).into(), detail.as_bytes());
        ending
    }

    /// Starts the reader and writer of a data stream.
    fn open(&mut self, send: quinn::SendStream, recv: quinn::RecvStream) {
        let index = recv.id().index();
        let out = Arc::new(StreamOut::new(0));
        self.outs.insert(index, out.clone());
        let cx = &self.cx;
        self.writers.spawn(stream::write(send, out.clone(), cx.clone()));
        self.readers.spawn(stream::read(cx.clone(), index, false, recv, ReadBuffer::default(), out));
    }

    /// Accepts streams, ends streams and transmits deliveries until the connection ends.
    async fn serve(&mut self, conn: &quinn::Connection) -> Ending {
        let ctl = self.cx.ctl.clone();
        // Deliveries may be waiting already (a resumed session).
        let mut transmit = true;
        loop {
            if transmit {
                // When a stream is full, its writer wakes this task once it has room again.
                self.transmit();
                transmit = false;
            }
            tokio::select! {
                biased;
                _ = ctl.woken() => {
                    if ctl.is_closed() {
                        let reason = ctl.reason();
                        if reason == ReasonCode::KeepAliveTimeout {
                            info!(client_id = %self.cx.session.client_id, "closing QUIC connection: keep alive timeout");
                        }
                        return connection::ending_for(reason);
                    }
                    if ctl.handover_asked() {
                        // Its streams are read by tasks of their own: nothing to wait for here.
                        crate::connection::handover::answer(&self.cx.broker, &ctl);
                    }
                    transmit = true;
                }
                Some(done) = self.readers.join_next() => {
                    let (index, end) = match done {
                        Ok(done) => done,
                        Err(_) => {
                            ctl.close(ReasonCode::ImplementationSpecificError);
                            return Ending::WithWill;
                        }
                    };
                    let fatal = matches!(&end, StreamEnd::Failed(r, _) if stream::ends_connection(*r));
                    if index == self.control || fatal {
                        return match end {
                            StreamEnd::Ended(ending) => {
                                ctl.close(ReasonCode::Success);
                                ending
                            }
                            StreamEnd::Closed => {
                                ctl.close(ReasonCode::Success);
                                Ending::WithWill
                            }
                            StreamEnd::Failed(reason, detail) => {
                                info!(client_id = %self.cx.session.client_id, "closing QUIC connection: {detail} ({})", reason.description());
                                ctl.close_because(reason, detail);
                                Ending::WithWill
                            }
                        };
                    }
                    // A data stream ended: its subscriptions deliver on the control stream now.
                    if let Some(out) = self.outs.remove(&index) {
                        out.finish();
                    }
                    transmit = true;
                }
                stream = conn.accept_bi() => match stream {
                    Ok((send, recv)) => self.open(send, recv),
                    Err(e) => {
                        debug!(client_id = %self.cx.session.client_id, "QUIC connection lost: {e}");
                        ctl.close(ReasonCode::Success);
                        return Ending::WithWill;
                    }
                },
            }
        }
    }

    /// Encodes what the session has ready into the queue of each delivery's stream.
    fn transmit(&mut self) {
        let mut outbox = StreamOutbox {
            outs: &self.outs,
            control: self.control,
            generation: self.cx.generation,
            encoded: Vec::new(),
        };
        connection::transmit(&self.cx.broker, &self.cx.session, self.cx.generation, |st| {
            st.poll_transmit_to(Instant::now(), &mut outbox)
        });
        for (index, buf) in outbox.encoded {
            if let Some(out) = self.outs.get(&index) {
                out.push(buf.freeze());
            }
        }
    }
}

/// The session's view of the streams while it encodes: a delivery goes to the stream its
/// subscription was made on while that stream is open on this connection, else to the control
/// stream. Bytes are collected here and queued on the streams after the session is unlocked.
struct StreamOutbox<'a> {
    outs: &'a HashMap<u64, Arc<StreamOut>>,
    control: u64,
    generation: u64,
    encoded: Vec<(u64, BytesMut)>,
}

impl StreamOutbox<'_> {
    fn resolve(&self, tag: StreamTag) -> u64 {
        let open = |i: &u64| self.outs.get(i).is_some_and(|o| o.is_open());
        if tag.generation == self.generation && open(&tag.stream) {
            tag.stream
        } else {
            self.control
        }
    }

    fn encoded_len(&self, index: u64) -> usize {
        self.encoded.iter().find(|(i, _)| *i == index).map_or(0, |(_, b)| b.len())
    }

    fn room(&self, index: u64) -> bool {
        self.outs.get(&index).is_some_and(|o| o.has_room(self.encoded_len(index)))
    }
}

impl Outbox for StreamOutbox<'_> {
    fn has_room(&self, stream: StreamTag) -> bool {
        self.room(self.resolve(stream))
    }

    fn buffer(&mut self, stream: StreamTag) -> &mut BytesMut {
        let index = self.resolve(stream);
        let at = match self.encoded.iter().position(|(i, _)| *i == index) {
            Some(at) => at,
            None => {
                self.encoded.push((index, BytesMut::new()));
                self.encoded.len() - 1
            }
        };
        &mut self.encoded[at].1
    }

    fn is_full(&self) -> bool {
        !self.outs.keys().any(|i| self.room(*i))
    }
}
