//! Persistence of sessions, queued deliveries and retained messages behind one interface, so
//! the broker's hot path does not depend on where state lives. [`memory::MemoryStore`] keeps
//! nothing (the broker's own structures are the state); [`disk::DiskStore`] appends every
//! change to a log under `store.data_dir` with group commit and reloads it at start. See
//! `docs/persistence.md`.

mod backend;
pub mod disk;
pub mod memory;
mod record;
mod record_error;

pub use backend::{
    packet_id_for, Op, Recovered, RecoveredSession, SessionRecord, Stage, Store, StoreError, StoreStats,
    Stored, SubscriptionRecord, Ticket,
};
pub use record::UnixClock;
pub use record_error::RecordError;

use std::sync::Arc;

use crate::config::{StoreBackend, StoreConfig};

/// The store's record encodings, for a store that keeps its records elsewhere (a cluster's
/// Redis) and for messages passed between nodes. A message's expiry is kept in Unix time,
/// converted by the [`UnixClock`] the caller passes.
pub mod codec {
    use std::sync::Arc;

    use braid_proto::BytesMut;

    use super::{record, RecordError, SessionRecord, UnixClock};
    use crate::message::{Delivery, Message};

    /// A session's metadata.
    pub fn session(r: &SessionRecord) -> Vec<u8> {
        record::session(r)
    }

    /// Reads [`session`]'s output.
    pub fn read_session(body: &[u8]) -> Result<SessionRecord, RecordError> {
        record::read_session(body)
    }

    /// A queued delivery (with its sequence number).
    pub fn delivery(d: &Delivery, clock: &UnixClock) -> Vec<u8> {
        record::append(0, d.seq, d, clock)
    }

    /// Reads [`delivery`]'s output.
    pub fn read_delivery(body: &[u8], clock: &UnixClock) -> Result<Delivery, RecordError> {
        record::read_append(body, clock).map(|(_, d)| d)
    }

    /// A message: topic, payload, QoS, RETAIN, properties and expiry.
    pub fn message(msg: &Message, clock: &UnixClock) -> Vec<u8> {
        record::retain(msg, clock)
    }

    /// Appends [`message`]'s output to `out` (encoded in place).
    pub fn put_message(out: &mut BytesMut, msg: &Message, clock: &UnixClock) {
        record::put_retain(out, msg, clock)
    }

    /// Reads [`message`]'s output (no publisher: origin 0), its payload taken out of `body`
    /// without a copy.
    pub fn read_message(body: BytesMut, clock: &UnixClock) -> Result<Arc<Message>, RecordError> {
        record::read_retain_from(body, clock)
    }
}

/// Opens the store `config` describes (recovering a disk store's contents), converting the
/// times it keeps by `clock`.
pub fn open(config: &StoreConfig, clock: UnixClock) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match config.backend {
        StoreBackend::Memory => Arc::new(memory::MemoryStore::new()),
        StoreBackend::Disk => Arc::new(disk::DiskStore::open(config, clock)?),
    })
}
