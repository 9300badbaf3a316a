//! Persistence of sessions, queued deliveries and retained messages behind one interface, so
//! the broker's hot path does not depend on where state lives. [`memory::MemoryStore`] keeps
//! nothing (the broker's own structures are the state); [`disk::DiskStore`] appends every
//! change to a log under `store.data_dir` with group commit and reloads it at start. See
//! `docs/persistence.md`.

mod backend;
pub mod disk;
pub mod memory;
mod record;

pub use backend::{
    packet_id_for, Op, Recovered, RecoveredSession, SessionRecord, Stage, Store, StoreError, Stored,
    SubscriptionRecord, Ticket,
};
pub use record::unix_now;

use std::sync::Arc;

use crate::config::{StoreBackend, StoreConfig};

/// Opens the store `config` describes (recovering a disk store's contents).
pub fn open(config: &StoreConfig) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match config.backend {
        StoreBackend::Memory => Arc::new(memory::MemoryStore::new()),
        StoreBackend::Disk => Arc::new(disk::DiskStore::open(config)?),
    })
}
