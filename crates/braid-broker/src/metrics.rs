//! Broker-wide counters, published under `$SYS/broker/...`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters; all relaxed atomics, read only for reporting.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Clients connected now.
    pub clients_connected: AtomicU64,
    /// Highest number of clients connected at once.
    pub clients_maximum: AtomicU64,
    /// PUBLISH packets received from clients.
    pub messages_received: AtomicU64,
    /// PUBLISH packets sent to clients.
    pub messages_sent: AtomicU64,
    /// Bytes read from clients.
    pub bytes_received: AtomicU64,
    /// Bytes written to clients.
    pub bytes_sent: AtomicU64,
    /// Deliveries dropped: queue full, expired, or too large for the client.
    pub messages_dropped: AtomicU64,
    /// Publishes whose acknowledgement was held back by a full subscriber queue.
    pub publishes_held: AtomicU64,
    /// Publishes refused by the ACL.
    pub publishes_denied: AtomicU64,
    /// Connections closed at accept: `limits.max_connections` reached.
    pub connections_refused: AtomicU64,
    /// Idle connections parked now (see [`crate::transport::tcp::park`]).
    pub clients_parked: AtomicU64,
}

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// A client connected.
    pub fn client_connected(&self) {
        let now = self.clients_connected.fetch_add(1, Ordering::Relaxed) + 1;
        self.clients_maximum.fetch_max(now, Ordering::Relaxed);
    }

    /// A client disconnected.
    pub fn client_disconnected(&self) {
        self.clients_connected.fetch_sub(1, Ordering::Relaxed);
    }
}
