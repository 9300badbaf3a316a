//! One QUIC stream of a connection: a writer task that sends what is queued for the stream
//! (so a stream whose peer or flow control is slow never holds back another one), and a reader
//! that decodes and handles the packets arriving on it, replying on the same stream.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tracing::info;

use braid_proto::{Bytes, BytesMut, Packet, Properties, ProtocolVersion, ReadBuffer, ReasonCode};

use crate::auth::AclSeed;
use crate::broker::{Broker, Ending};
use crate::connection::inbound::{Flow, Inbound};
use crate::control::ConnControl;
use crate::message::StreamTag;
use crate::metrics::Metrics;
use crate::session::Session;
use crate::trace::Direction;

/// Bytes queued on one stream beyond which no more deliveries are encoded for it until the
/// writer catches up (replies still go out).
pub(crate) const STREAM_BUDGET: usize = 64 * 1024;

/// SUBSCRIBE user property that sets the priority of the broker's side of the stream the
/// SUBSCRIBE arrives on (QUIC carries no priorities on the wire).
pub(super) const PRIORITY_PROPERTY: &str = "stream-priority";

/// "No reset asked for" in [`StreamOut::reset`].
const NO_RESET: u32 = u32::MAX;

/// What waits to be written on one stream, shared by the connection task (deliveries), the
/// stream's reader (replies) and its writer.
#[derive(Debug)]
pub(crate) struct StreamOut {
    chunks: Mutex<VecDeque<Bytes>>,
    /// Bytes queued and not yet handed to QUIC.
    pending: AtomicUsize,
    ready: Notify,
    priority: AtomicI32,
    priority_changed: AtomicBool,
    /// Finish the stream once everything queued is written.
    finishing: AtomicBool,
    /// Reset the stream with this code (an MQTT reason code), dropping what is queued.
    reset: AtomicU32,
    /// Nothing can be written any more: deliveries go elsewhere.
    closed: AtomicBool,
}

impl StreamOut {
    /// An empty stream whose broker side sends at `priority`.
    pub(crate) fn new(priority: i32) -> StreamOut {
        StreamOut {
            chunks: Mutex::new(VecDeque::new()),
            pending: AtomicUsize::new(0),
            ready: Notify::new(),
            priority: AtomicI32::new(priority),
            priority_changed: AtomicBool::new(priority != 0),
            finishing: AtomicBool::new(false),
            reset: AtomicU32::new(NO_RESET),
            closed: AtomicBool::new(false),
        }
    }

    /// Queues encoded packets.
    pub(crate) fn push(&self, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.pending.fetch_add(bytes.len(), Ordering::AcqRel);
        self.chunks.lock().push_back(bytes);
        self.ready.notify_one();
    }

    /// True while the stream is writable and holds fewer than [`STREAM_BUDGET`] bytes, counting
    /// `extra` bytes about to be queued.
    pub(crate) fn has_room(&self, extra: usize) -> bool {
        self.is_open() && self.pending.load(Ordering::Acquire) + extra < STREAM_BUDGET
    }

    /// True until the stream is finished, reset or failed.
    pub(crate) fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.finishing.load(Ordering::Acquire)
    }

    /// Sends on this stream at `priority` from now on.
    pub(crate) fn set_priority(&self, priority: i32) {
        self.priority.store(priority, Ordering::Relaxed);
        self.priority_changed.store(true, Ordering::Release);
    }

    /// Finishes the stream after what is queued.
    pub(crate) fn finish(&self) {
        self.finishing.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    /// Resets the stream with `reason` as the QUIC error code, dropping what is queued.
    pub(crate) fn reset(&self, reason: ReasonCode) {
        self.reset.store(u32::from(reason as u8), Ordering::Release);
        self.closed.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    fn pop(&self) -> Option<Bytes> {
        self.chunks.lock().pop_front()
    }
}

/// Writes what is queued on `out` to `send` until the stream is finished, reset or fails. When
/// the queue drops below [`STREAM_BUDGET`] the connection task is woken to encode more.
pub(crate) async fn write(mut send: quinn::SendStream, out: Arc<StreamOut>, cx: StreamContext) {
    let (ctl, broker) = (&cx.ctl, &cx.broker);
    loop {
        let code = out.reset.load(Ordering::Acquire);
        if code != NO_RESET {
            let _ = send.reset(code.into());
            return;
        }
        if out.priority_changed.swap(false, Ordering::AcqRel) {
            let _ = send.set_priority(out.priority.load(Ordering::Relaxed));
        }
        let Some(chunk) = out.pop() else {
            if out.finishing.load(Ordering::Acquire) {
                let _ = send.finish();
                // Let the peer acknowledge what was written before the stream goes away.
                let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                return;
            }
            out.ready.notified().await;
            continue;
        };
        let len = chunk.len();
        if broker.tracer().is_active() {
            broker.tracer().record_bytes(&cx.session.client_id, Direction::Out, &chunk, cx.version);
        }
        if send.write_chunk(chunk).await.is_err() {
            out.closed.store(true, Ordering::Release);
            ctl.wake();
            return;
        }
        Metrics::add(&broker.metrics().bytes_sent, len as u64);
        let before = out.pending.fetch_sub(len, Ordering::AcqRel);
        if before >= STREAM_BUDGET && before - len < STREAM_BUDGET {
            ctl.wake();
        }
    }
}

/// How the reading side of a stream ended.
#[derive(Debug)]
pub(crate) enum StreamEnd {
    /// The client finished or reset the stream, or the connection was lost.
    Closed,
    /// DISCONNECT (control stream only).
    Ended(Ending),
    /// A malformed or forbidden packet: the reason and its explanation.
    Failed(ReasonCode, Cow<'static, str>),
}

/// What every stream of one connection shares.
#[derive(Debug, Clone)]
pub(crate) struct StreamContext {
    pub broker: Arc<Broker>,
    pub session: Arc<Session>,
    pub ctl: Arc<ConnControl>,
    pub generation: u64,
    pub version: ProtocolVersion,
    /// Streams whose publisher acknowledgement is held by backpressure.
    pub held: Arc<AtomicUsize>,
    /// The connection's QoS 1/2 publishes counted against Receive Maximum, over all streams.
    pub window: Arc<AtomicUsize>,
    /// Who the client is, for each stream's topic authorization.
    pub acl: Option<Box<AclSeed>>,
}

/// Reads and handles the packets of stream `index` (`control`: the control stream) until it
/// ends; replies go on `out`. On a data stream, a malformed packet or one that belongs on the
/// control stream resets this stream only.
pub(crate) async fn read(
    cx: StreamContext,
    index: u64,
    control: bool,
    mut recv: quinn::RecvStream,
    mut rbuf: ReadBuffer,
    out: Arc<StreamOut>,
) -> (u64, StreamEnd) {
    let (broker, version) = (&cx.broker, cx.version);
    let acl = broker.security().resume_acl(cx.acl.clone(), &cx.session.client_id);
    let mut now = Instant::now();
    let inbound = if control {
        Inbound::new(broker, &cx.session, version, HashMap::new(), acl, now)
    } else {
        let tag = StreamTag { generation: cx.generation, stream: index };
        Inbound::for_stream(broker, &cx.session, version, tag, acl, now)
    };
    let mut inbound = inbound.counting_in(cx.window.clone());
    let mut replies = BytesMut::new();
    let mut was_held = false;
    let end = loop {
        let flow = inbound.handle_buffered(&mut rbuf, now, &mut replies, |p| {
            if !control && matches!(p, Packet::Connect(_) | Packet::Disconnect(_) | Packet::Auth(_)) {
                let detail = format!("{} is only allowed on the control stream", p.name());
                return Some(Flow::Close(ReasonCode::ProtocolError, detail.into()));
            }
            if let Packet::Subscribe(s) = p {
                if let Some(priority) = stream_priority(&s.properties) {
                    out.set_priority(priority);
                }
            }
            None
        });
        out.push(replies.split().freeze());
        if inbound.take_transmit() {
            cx.ctl.wake();
        }
        match flow {
            Flow::Continue => {}
            Flow::End(ending) => break StreamEnd::Ended(ending),
            Flow::Close(reason, detail) => break StreamEnd::Failed(reason, detail),
        }
        let held = inbound.is_held();
        if held != was_held {
            // The connection counts as held (not silent) while any of its streams is.
            let now_held = if held {
                cx.held.fetch_add(1, Ordering::AcqRel) + 1
            } else {
                cx.held.fetch_sub(1, Ordering::AcqRel) - 1
            };
            cx.ctl.set_held(now_held > 0, broker.clock_ms(now));
            was_held = held;
        }
        let ack = tokio::select! {
            // A held acknowledgement released, a pause over, or the group commit moved on.
            ack = inbound.next_ack() => {
                inbound.flush_synced(&mut replies);
                ack
            }
            read = rbuf.read_from(&mut recv), if !held => match read {
                Ok(n) if n > 0 => {
                    // Any progress on any stream is liveness, even inside a packet.
                    cx.ctl.touch(broker.clock_ms(Instant::now()));
                    Metrics::add(&broker.metrics().bytes_received, n as u64);
                    None
                }
                _ => break StreamEnd::Closed,
            },
        };
        now = Instant::now();
        if let Some(r) = ack {
            inbound.ack_released(r, &mut replies);
        }
    };
    if was_held {
        let now_held = cx.held.fetch_sub(1, Ordering::AcqRel) - 1;
        cx.ctl.set_held(now_held > 0, broker.clock_ms(Instant::now()));
    }
    // (An error that ends the connection is the connection task's to report.)
    let stream_only = !control && matches!(&end, StreamEnd::Failed(r, _) if !ends_connection(*r));
    if let (true, StreamEnd::Failed(reason, detail)) = (stream_only, &end) {
        info!(client_id = %cx.session.client_id, stream = index, "resetting stream: {detail} ({})", reason.description());
        let _ = recv.stop(u32::from(*reason as u8).into());
        out.reset(*reason);
    }
    (index, end)
}

/// True for an error on a data stream that closes the whole connection rather than resetting
/// the stream: Receive Maximum counts the connection, not a stream.
pub(crate) fn ends_connection(reason: ReasonCode) -> bool {
    reason == ReasonCode::ReceiveMaximumExceeded
}

/// The `stream-priority` user property of a SUBSCRIBE, if it holds an integer.
fn stream_priority(p: &Properties) -> Option<i32> {
    p.user_properties.iter().find(|(k, _)| &**k == PRIORITY_PROPERTY).and_then(|(_, v)| v.trim().parse().ok())
}
