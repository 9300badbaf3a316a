//! The memory store: nothing is persisted. Sessions, queues and retained messages live only
//! in the broker's own structures and are gone at restart (the fastest option, for tests and
//! for brokers whose clients do not need durability).

use tokio::sync::watch;

use super::backend::{Op, Recovered, Store, Ticket};

/// Keeps nothing; every change is "durable" at once.
#[derive(Debug)]
pub struct MemoryStore {
    durable: watch::Sender<Ticket>,
}

impl MemoryStore {
    /// A memory store.
    pub fn new() -> MemoryStore {
        MemoryStore { durable: watch::Sender::new(Ticket::MAX) }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl Store for MemoryStore {
    fn persistent(&self) -> bool {
        false
    }

    fn sync(&self) -> bool {
        false
    }

    fn submit(&self, _op: Op) -> Ticket {
        0
    }

    fn durable(&self) -> watch::Receiver<Ticket> {
        self.durable.subscribe()
    }

    fn take_recovered(&self) -> Recovered {
        Recovered::default()
    }

    fn close(&self) {}
}
