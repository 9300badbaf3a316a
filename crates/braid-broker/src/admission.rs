//! Who may connect: `limits.max_connections` (parked connections count) and
//! `limits.max_connection_rate`, shared by every listener's accept loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::broker::Broker;
use crate::limits::TokenBucket;
use crate::metrics::Metrics;

/// Connection limits for all listeners.
#[derive(Debug)]
pub struct Admission {
    broker: Arc<Broker>,
    connections: TaskTracker,
    rate: Option<Mutex<TokenBucket>>,
    last_refusal_log: Mutex<Option<Instant>>,
}

impl Admission {
    /// Limits counting the tasks of `connections` and the broker's parked connections.
    pub fn new(broker: &Arc<Broker>, connections: &TaskTracker) -> Admission {
        let per_sec = broker.config.limits.max_connection_rate;
        Admission {
            broker: broker.clone(),
            connections: connections.clone(),
            rate: (per_sec > 0).then(|| Mutex::new(TokenBucket::new(f64::from(per_sec), Instant::now()))),
            last_refusal_log: Mutex::new(None),
        }
    }

    /// Waits as long as the connection rate asks before the next accept (newcomers wait in the
    /// listen backlog meanwhile); returns at once when the broker shuts down.
    pub async fn pace(&self) {
        let wait = match &self.rate {
            Some(rate) => rate.lock().take(1.0, Instant::now()),
            None => Duration::ZERO,
        };
        if !wait.is_zero() {
            tokio::select! {
                _ = self.broker.shutdown.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// False when `limits.max_connections` is reached: the new connection is to be closed
    /// (counted in `$SYS/broker/connections/refused`, logged at most once a second).
    pub fn admit(&self) -> bool {
        let max = self.broker.config.limits.max_connections;
        let open = self.connections.len() + self.broker.parked();
        if max == 0 || open < max {
            return true;
        }
        Metrics::add(&self.broker.metrics.connections_refused, 1);
        let mut last = self.last_refusal_log.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            warn!(max, "limits.max_connections reached: closing new connections");
            *last = Some(Instant::now());
        }
        false
    }
}
