//! What a store is: the [`Store`] interface, the operations the broker submits to it and the
//! records it keeps and gives back.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use braid_proto::{ByteString, LastWill, SubscriptionOptions};

use super::record_error::RecordError;
use crate::message::{Delivery, Message, RemoteId};
use crate::metrics::HistogramSnapshot;

/// A subscription as a session remembers it (and the store keeps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionRecord {
    /// Options from SUBSCRIBE.
    pub options: SubscriptionOptions,
    /// v5 Subscription Identifier.
    pub sub_id: Option<u32>,
}

/// Position of a change in the store's order; a change is on disk once
/// [`Store::durable`] reaches its ticket.
pub type Ticket = u64;

/// Where a persisted outbound delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Queued, never sent.
    Queued,
    /// PUBLISH sent (its packet id is derived from its sequence number).
    Sent,
    /// PUBREL sent (QoS 2).
    Released,
}

/// What a session looks like on disk, apart from its deliveries.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    /// Store key of the session (also its session id while loaded).
    pub id: u64,
    /// Client identifier.
    pub client_id: ByteString,
    /// Session Expiry Interval, seconds.
    pub expiry_secs: u32,
    /// Will message of the last connection, if still pending.
    pub will: Option<LastWill>,
    /// Subscriptions by full filter.
    pub subscriptions: Vec<(ByteString, SubscriptionRecord)>,
    /// Unix seconds when the client went offline; None while connected.
    pub offline_since: Option<u64>,
}

/// One change to persisted state, applied in submission order.
#[derive(Debug)]
pub enum Op {
    /// A session's metadata, replacing the previous version.
    Session(SessionRecord),
    /// The session ended: forget it and everything queued for it.
    EndSession(u64),
    /// A delivery queued for a session under sequence number `seq`.
    Append {
        /// Session key.
        session: u64,
        /// Sequence number within the session.
        seq: u64,
        /// The delivery.
        delivery: Delivery,
    },
    /// A delivery moved to `stage`.
    Stage {
        /// Session key.
        session: u64,
        /// Sequence number.
        seq: u64,
        /// New stage.
        stage: Stage,
    },
    /// A delivery is finished (acknowledged, dropped or expired).
    Done {
        /// Session key.
        session: u64,
        /// Sequence number.
        seq: u64,
    },
    /// An inbound QoS 2 packet id was received (`pending`) or released.
    IncomingQos2 {
        /// Session key.
        session: u64,
        /// Packet identifier.
        packet_id: u16,
        /// True when received and awaiting PUBREL.
        pending: bool,
    },
    /// A retained message set; an empty payload clears the topic.
    Retain(Arc<Message>),
    /// Reads every delivery persisted for a session, oldest first.
    Load {
        /// Session key.
        session: u64,
        /// Where the deliveries go.
        reply: oneshot::Sender<Result<Vec<Stored>, StoreError>>,
    },
}

/// A persisted delivery read back.
#[derive(Debug)]
pub struct Stored {
    /// Sequence number within its session.
    pub seq: u64,
    /// Where it stands.
    pub stage: Stage,
    /// The delivery (its `seq` set).
    pub delivery: Delivery,
}

/// A session found at start.
#[derive(Debug)]
pub struct RecoveredSession {
    /// Its metadata.
    pub record: SessionRecord,
    /// Next delivery sequence number.
    pub next_seq: u64,
    /// Sequence numbers and sizes of its persisted deliveries, oldest first.
    pub queued: Vec<(u64, usize)>,
    /// Inbound QoS 2 packet ids awaiting PUBREL.
    pub incoming_qos2: Vec<u16>,
    /// The messages from other nodes among its deliveries (a cluster's store keeps this): the
    /// same ones offered again are not queued twice.
    pub held_remote: Vec<RemoteId>,
    /// Those of its deliveries that came through shared subscriptions, read back (a cluster's
    /// store fills this in when a node takes over a gone node's sessions: they may go to
    /// other members, see [`crate::broker::ClusterSide::adopt`]).
    pub shared: Vec<Stored>,
}

/// Everything found in the store at start.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Persistent sessions.
    pub sessions: Vec<RecoveredSession>,
    /// Unexpired retained messages.
    pub retained: Vec<Arc<Message>>,
    /// The lowest session key never used.
    pub next_session_id: u64,
}

/// The persistence interface the broker talks to.
pub trait Store: Send + Sync + fmt::Debug {
    /// True if this store persists: the broker then writes persistent sessions and retained
    /// messages through it and keeps offline queues out of memory.
    fn persistent(&self) -> bool;
    /// True if acknowledgements must wait until their changes are durable.
    fn sync(&self) -> bool;
    /// Submits a change; returns its ticket.
    fn submit(&self, op: Op) -> Ticket;
    /// The highest ticket whose change is on disk.
    fn durable(&self) -> watch::Receiver<Ticket>;
    /// What was found at start (once; later calls get nothing).
    fn take_recovered(&self) -> Recovered;
    /// Writes and syncs everything submitted, then stops the store.
    fn close(&self);
    /// What the store reports to operators (nothing, unless it keeps files).
    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }
}

/// What a store reports to operators.
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    /// Bytes of its files on disk.
    pub disk_bytes: Option<u64>,
    /// How long its disk syncs took.
    pub syncs: Option<HistogramSnapshot>,
}

/// A store that could not be opened, or a record that could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system operation on the data directory or a file in it failed.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What was being done, e.g. "cannot create the data directory".
        what: &'static str,
        /// The error of the operation.
        #[source]
        source: io::Error,
    },
    /// The store marker names a format this version does not read.
    #[error("{}: not a Braid store of a format this version reads", marker.display())]
    UnknownFormat {
        /// The marker file.
        marker: PathBuf,
    },
    /// The data directory holds files but no store marker: something else's directory.
    #[error(
        "{}: not a Braid data directory (no {} file, but it holds {found}): set store.data_dir to an \
         empty or new directory",
        dir.display(),
        marker
    )]
    Foreign {
        /// The data directory.
        dir: PathBuf,
        /// The name of the store marker file.
        marker: &'static str,
        /// One of the files it holds.
        found: String,
    },
    /// Another broker holds the data directory's lock.
    #[error("{}: the data directory is in use by another broker", dir.display())]
    InUse {
        /// The data directory.
        dir: PathBuf,
    },
    /// A file named like a segment whose name or header is not a segment's.
    #[error("{}: not a Braid segment ({problem})", path.display())]
    NotSegment {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A record in a segment that does not read back: cut short, failing its checksum, or
    /// not decoding.
    #[error("{}: damaged record at offset {offset}: {source}", segment.display())]
    Damaged {
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the record in the segment.
        offset: u64,
        /// What is wrong with it.
        #[source]
        source: RecordError,
    },
    /// The thread that writes the store could not be started.
    #[error("cannot start the writer thread: {0}")]
    Thread(#[source] io::Error),
}

/// Packet identifier of the persisted delivery with sequence number `seq`: derived, so that a
/// delivery resent after a restart carries the id the client saw (QoS 2 exactly-once).
pub fn packet_id_for(seq: u64) -> u16 {
    (seq % 65_535) as u16 + 1
}
