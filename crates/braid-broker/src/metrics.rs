//! Broker-wide counters, published under `$SYS/broker/...` and exported to Prometheus by the
//! HTTP admin listener. Every one is a relaxed atomic: counting takes no lock on the publish
//! path, and a reader sees each counter on its own (not a snapshot of all of them at once).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use braid_proto::{QoS, ReasonCode};

use crate::transport_kind::{PerTransport, Transport};

/// Counters; all relaxed atomics, read only for reporting.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Clients connected now.
    pub clients_connected: AtomicU64,
    /// Highest number of clients connected at once.
    pub clients_maximum: AtomicU64,
    /// Clients connected now through each listener (in-process clients are in none).
    pub connected_by_transport: PerTransport<AtomicU64>,
    /// CONNECTs accepted through each listener since the start.
    pub connections_accepted: PerTransport<AtomicU64>,
    /// CONNECTs refused, by the CONNACK's reason code (0x80 to 0xA2).
    pub connects_refused: ByReason,
    /// PUBLISH packets received from clients, by QoS.
    pub messages_received: ByQos,
    /// PUBLISH packets sent to clients, by QoS.
    pub messages_sent: ByQos,
    /// Bytes read from clients.
    pub bytes_received: AtomicU64,
    /// Bytes written to clients.
    pub bytes_sent: AtomicU64,
    /// Deliveries dropped because a subscriber's queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Deliveries dropped because their message expired before it could be sent.
    pub dropped_expired: AtomicU64,
    /// Deliveries dropped because they were larger than the client's Maximum Packet Size.
    pub dropped_too_large: AtomicU64,
    /// Publishes whose acknowledgement was held back by a full subscriber queue.
    pub publishes_held: AtomicU64,
    /// Publishes refused by the ACL (acknowledged and dropped).
    pub publishes_denied: AtomicU64,
    /// Retained publishes over a `[retained]` limit (v5: refused with 0x97; 3.1.x: sent on
    /// without being retained).
    pub retained_refused: AtomicU64,
    /// Connections closed at accept: `limits.max_connections` reached.
    pub connections_refused: AtomicU64,
    /// Connections closed at accept: the process was out of file descriptors.
    pub connections_refused_fd: AtomicU64,
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

    /// A client connected through `transport` (None: in process).
    pub fn client_connected(&self, transport: Option<Transport>) {
        let now = self.clients_connected.fetch_add(1, Ordering::Relaxed) + 1;
        self.clients_maximum.fetch_max(now, Ordering::Relaxed);
        if let Some(t) = transport {
            self.connected_by_transport.get(t).fetch_add(1, Ordering::Relaxed);
            self.connections_accepted.get(t).fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A client that connected through `transport` disconnected.
    pub fn client_disconnected(&self, transport: Option<Transport>) {
        self.clients_connected.fetch_sub(1, Ordering::Relaxed);
        if let Some(t) = transport {
            self.connected_by_transport.get(t).fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Deliveries and publishes dropped for any reason (`$SYS/broker/publish/messages/dropped`).
    pub fn messages_dropped(&self) -> u64 {
        [&self.dropped_queue_full, &self.dropped_expired, &self.dropped_too_large, &self.publishes_denied]
            .into_iter()
            .map(Metrics::get)
            .sum()
    }
}

/// One counter per QoS.
#[derive(Debug, Default)]
pub struct ByQos([AtomicU64; 3]);

impl ByQos {
    /// Adds `n` at `qos`.
    pub fn add(&self, qos: QoS, n: u64) {
        Metrics::add(&self.0[qos as usize], n);
    }

    /// The count at `qos`.
    pub fn get(&self, qos: QoS) -> u64 {
        Metrics::get(&self.0[qos as usize])
    }

    /// The count over every QoS.
    pub fn total(&self) -> u64 {
        self.0.iter().map(Metrics::get).sum()
    }
}

/// One counter per error reason code (0x80 and above).
#[derive(Debug)]
pub struct ByReason([AtomicU64; 0x23]);

impl Default for ByReason {
    fn default() -> Self {
        ByReason(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl ByReason {
    /// Counts one `reason` (success codes are not counted).
    pub fn count(&self, reason: ReasonCode) {
        if let Some(c) = (reason as usize).checked_sub(0x80).and_then(|i| self.0.get(i)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every reason counted at least once, with its count.
    pub fn counted(&self) -> Vec<(ReasonCode, u64)> {
        (0x80u8..=0xA2)
            .filter_map(|code| {
                let n = Metrics::get(&self.0[usize::from(code - 0x80)]);
                let reason = ReasonCode::from_u8(code)?;
                (n > 0).then_some((reason, n))
            })
            .collect()
    }
}

/// A latency histogram with fixed buckets, counted with relaxed atomics.
#[derive(Debug)]
pub struct Histogram {
    /// The buckets' upper bounds, in microseconds, ascending.
    bounds_us: &'static [u64],
    /// Observations at most each bound (not cumulative), then those above the last.
    counts: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

/// What a [`Histogram`] holds at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Upper bounds in seconds with the cumulative count at each (Prometheus `le` buckets);
    /// the count of every observation is [`HistogramSnapshot::count`].
    pub buckets: Vec<(f64, u64)>,
    /// Every observation.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_secs: f64,
}

impl Histogram {
    /// Buckets from 50 µs to 1 s, for disk syncs and round trips.
    pub const LATENCY_US: &'static [u64] =
        &[50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];

    /// An empty histogram with buckets at `bounds_us` (ascending, in microseconds).
    pub fn new(bounds_us: &'static [u64]) -> Histogram {
        let counts = (0..=bounds_us.len()).map(|_| AtomicU64::new(0)).collect();
        Histogram { bounds_us, counts, sum_us: AtomicU64::new(0) }
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = self.bounds_us.partition_point(|b| *b < us);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.bounds_us.len());
        for (bound, count) in self.bounds_us.iter().zip(self.counts.iter()) {
            cumulative += Metrics::get(count);
            buckets.push((*bound as f64 / 1e6, cumulative));
        }
        let count = cumulative + self.counts.last().map_or(0, Metrics::get);
        HistogramSnapshot { buckets, count, sum_secs: Metrics::get(&self.sum_us) as f64 / 1e6 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_each_observation_in_its_bucket_and_cumulates() {
        let h = Histogram::new(&[100, 1_000]);
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_millis(5));
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.0001, 1), (0.001, 2)]);
        assert_eq!(s.count, 3);
        assert!((s.sum_secs - 0.005201).abs() < 1e-9);
    }

    #[test]
    fn refusals_are_counted_by_reason_and_success_is_not() {
        let r = ByReason::default();
        r.count(ReasonCode::BadUserNameOrPassword);
        r.count(ReasonCode::BadUserNameOrPassword);
        r.count(ReasonCode::Success);
        r.count(ReasonCode::ServerBusy);
        assert_eq!(r.counted(), vec![(ReasonCode::BadUserNameOrPassword, 2), (ReasonCode::ServerBusy, 1)]);
    }
}
