//! Node links: live messages go from node to node directly, not through Redis.
//!
//! Each node listens on `cluster.listen` (TCP with TLS 1.3, see [`endpoint`]) and advertises its
//! address in Redis beside its lease. For every other node it sends to it keeps one outgoing
//! link ([`Link`], driven by [`outgoing`]): the two first prove the cluster's secret to each
//! other ([`handshake`]); then the dialer sends frames, each the messages the link had
//! waiting, packed as an inbox entry packs them ([`crate::wire`]), and the peer answers with a
//! running count of those it made safe. Acknowledgements travel the other way on the
//! connection, never behind bulk data.
//!
//! The peer ([`incoming`]) routes each message as its inbox reader would, and acknowledges it
//! once what it queued is as safe as a single node makes it (written to Redis for persistent
//! sessions, queued for clean ones). A QoS 1/2 publisher's acknowledgement waits for that. If
//! the link is down, or the peer stays silent for `cluster.link_timeout_ms` while messages
//! wait, those messages go to the peer's Redis inbox instead (the fallback), and the peer drops
//! what reaches it both ways by the sender's incarnation and number.

mod endpoint;
pub(crate) mod handshake;
mod incoming;
mod outgoing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use parking_lot::Mutex;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::Notify;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use braid_broker::broker::Broker;
use braid_broker::config::ClusterConfig;
use braid_broker::router::{Confirm, Forward, Watermark};
use braid_broker::store::Ticket;

use crate::{ClusterError, Shared};

pub(crate) use incoming::accept;

/// Largest frame a link accepts: a sender closes a frame at [`FRAME_BYTES`], but one message
/// may be larger (up to MQTT's largest packet).
const MAX_FRAME: usize = 300 << 20;

/// A sender closes a frame once it holds this many bytes. The receiver's messages keep their
/// payloads in the frame they came in (no copy), so a frame is as large as a client
/// connection's largest read: a message held long keeps no more than that alive.
const FRAME_BYTES: usize = 64 << 10;

/// The links of this node: its endpoint, the address it advertises and a link per peer.
#[derive(Debug)]
pub(crate) struct Links {
    endpoint: Arc<endpoint::Endpoint>,
    /// What other nodes dial.
    pub advertise: String,
    by_node: Mutex<HashMap<String, Arc<Link>>>,
}

impl Links {
    /// Binds `cluster.listen`, or None if it is empty (no links: everything through Redis).
    pub(crate) fn bind(config: &ClusterConfig) -> Result<Option<Links>, ClusterError> {
        if config.listen.is_empty() {
            return Ok(None);
        }
        let endpoint = Arc::new(endpoint::Endpoint::bind(config)?);
        let bound =
            endpoint.local_addr().map_err(|e| ClusterError::Config(format!("cluster.listen: {e}")))?;
        let advertise = endpoint::advertise(config, bound)?;
        Ok(Some(Links { endpoint, advertise, by_node: Mutex::new(HashMap::new()) }))
    }

    /// The link to `node`, made (and its task started) on first use.
    pub(crate) fn to(&self, shared: &Arc<Shared>, broker: &Broker, node: &str) -> Arc<Link> {
        self.by_node
            .lock()
            .entry(node.to_string())
            .or_insert_with(|| {
                let link = Arc::new(Link::new(node));
                tokio::spawn(outgoing::run(
                    shared.clone(),
                    broker.shutdown().clone(),
                    self.endpoint.clone(),
                    link.clone(),
                ));
                link
            })
            .clone()
    }

    /// Every link, for reports.
    pub(crate) fn all(&self) -> Vec<Arc<Link>> {
        let mut links: Vec<Arc<Link>> = self.by_node.lock().values().cloned().collect();
        links.sort_by(|a, b| a.node.cmp(&b.node));
        links
    }
}

/// A message for a link (encoded by the link's task, off the publisher's path), numbered in
/// the order the link was handed its messages.
#[derive(Debug)]
pub(crate) struct Outgoing {
    n: u64,
    fwd: Forward,
    /// A QoS 1/2 message: its publisher waits for [`Link::safe`] to pass `n`.
    confirmed: bool,
    /// Not sent before this store ticket is durable (see [`Link::send_confirmed`]).
    after: Ticket,
}

/// What the router handed a link and its task has not taken yet.
#[derive(Debug, Default)]
struct Queue {
    items: Vec<Outgoing>,
    /// The number the next message gets.
    next: u64,
    /// The task has ended: nothing more is taken.
    closed: bool,
}

/// The link to one peer, as the node's router uses it: whatever is sent goes over the link
/// while it is up, through the peer's Redis inbox while it is not.
#[derive(Debug)]
pub(crate) struct Link {
    /// The peer.
    pub node: String,
    queue: Mutex<Queue>,
    /// Wakes the link's task when its queue gets a message, through [`Link::waker`].
    ready: Arc<Ready>,
    waker: Waker,
    /// Every message numbered below it is safe: acknowledged by the peer, or durable in its
    /// Redis inbox. A QoS 1/2 publisher's confirmation waits for it to pass its message.
    safe: Arc<Watermark>,
    up: AtomicBool,
    /// Messages sent over the link, and sent through Redis instead.
    sent: AtomicU64,
    fell_back: AtomicU64,
    /// Times the link came up.
    connects: AtomicU64,
}

impl Link {
    fn new(node: &str) -> Link {
        let ready = Arc::new(Ready::default());
        Link {
            node: node.to_string(),
            queue: Mutex::new(Queue::default()),
            waker: Waker::from(ready.clone()),
            ready,
            safe: Arc::new(Watermark::default()),
            up: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
            connects: AtomicU64::new(0),
        }
    }

    /// Sends a QoS 0 message: no acknowledgement, at most once. Returns the link task's waker
    /// if it is to be woken for it (see [`Link::hand`]).
    pub(crate) fn send(&self, fwd: Forward) -> Option<Waker> {
        self.hand(fwd, false, 0).1
    }

    /// Sends a QoS 1/2 message, once store ticket `after` is durable (0: at once);
    /// the confirmation resolves once the peer acknowledged it or, when the link could not
    /// carry it, once it is in the peer's Redis inbox.
    ///
    /// `after` keeps exactly once across a publishing node's death: a QoS 2 message leaves only
    /// once its persistent publisher's packet id is in Redis, so a PUBLISH resent to another node
    /// is known there, as when the message went through the inbox in the same pipeline.
    pub(crate) fn send_confirmed(&self, fwd: Forward, after: Ticket) -> (Confirm, Option<Waker>) {
        let (n, wake) = self.hand(fwd, true, after);
        (Confirm::passing(self.safe.clone(), n), wake)
    }

    /// Queues a message for the link's task; returns its number, and the task's waker if the
    /// queue was empty: the publish path wakes it once its locks are released, for all the
    /// publisher's read brought (not under the router's lock, nor once per message).
    fn hand(&self, fwd: Forward, confirmed: bool, after: Ticket) -> (u64, Option<Waker>) {
        let mut q = self.queue.lock();
        let n = q.next;
        q.next += 1;
        // The task is gone (shutting down): the confirmation fails, as the watermark is
        // closed.
        if q.closed {
            return (n, None);
        }
        q.items.push(Outgoing { n, fwd, confirmed, after });
        (n, (q.items.len() == 1).then(|| self.waker.clone()))
    }

    /// Whatever the router handed the link since the last call, in order.
    fn take(&self, into: &mut Vec<Outgoing>) {
        std::mem::swap(&mut self.queue.lock().items, into);
    }

    /// True while the link is up.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// (sent over the link, sent through Redis instead, times it came up).
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&self.sent), get(&self.fell_back), get(&self.connects))
    }
}

/// What wakes a link's task: a [`Notify`] behind a [`Waker`].
#[derive(Debug, Default)]
struct Ready(Notify);

impl Wake for Ready {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// The frames a link's connection brings.
type Frames = FramedRead<ReadHalf<endpoint::LinkStream>, LengthDelimitedCodec>;

/// The frames it takes.
type FrameSink = FramedWrite<WriteHalf<endpoint::LinkStream>, LengthDelimitedCodec>;

/// Splits a link's connection into its two directions, framed alike: a 4-byte length, then the
/// frame.
fn framed(stream: endpoint::LinkStream) -> (Frames, FrameSink) {
    let codec = || LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec();
    let (read, write) = tokio::io::split(stream);
    (FramedRead::new(read, codec()), FramedWrite::new(write, codec()))
}
