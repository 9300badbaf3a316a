//! Who may connect: `limits.max_connections` (parked connections count) and
//! `limits.max_connection_rate`, shared by every listener's accept loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::broker::Broker;
use crate::limits::TokenBucket;
use crate::metrics::Metrics;

/// Connection limits for all listeners (as they are now: a reload may change them).
#[derive(Debug)]
pub struct Admission {
    broker: Arc<Broker>,
    connections: TaskTracker,
    /// The connection rate's bucket, made for the rate it is tagged with.
    rate: Mutex<(u32, Option<TokenBucket>)>,
    last_refusal_log: Mutex<Option<Instant>>,
}

impl Admission {
    /// Limits counting the tasks of `connections` and the broker's parked connections.
    pub fn new(broker: &Arc<Broker>, connections: &TaskTracker) -> Admission {
        Admission {
            broker: broker.clone(),
            connections: connections.clone(),
            rate: Mutex::new((0, None)),
            last_refusal_log: Mutex::new(None),
        }
    }

    /// Waits as long as the connection rate asks before the next accept (newcomers wait in the
    /// listen backlog meanwhile); returns at once when the broker shuts down.
    pub async fn pace(&self) {
        let per_sec = self.broker.live().limits.max_connection_rate;
        let now = Instant::now();
        let wait = {
            let mut rate = self.rate.lock();
            if rate.0 != per_sec {
                *rate = (per_sec, (per_sec > 0).then(|| TokenBucket::new(f64::from(per_sec), now)));
            }
            rate.1.as_mut().map_or(Duration::ZERO, |bucket| bucket.take(1.0, now))
        };
        if !wait.is_zero() {
            tokio::select! {
                _ = self.broker.shutdown.cancelled() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Accepts connections on `listener` (a `transport` in log lines) until the broker shuts
    /// down, paced by the connection rate; each admitted one (TCP_NODELAY set) goes to
    /// `admitted`, the others are closed.
    pub async fn accept_each(
        &self,
        listener: &TcpListener,
        transport: &str,
        mut admitted: impl FnMut(TcpStream, SocketAddr),
    ) {
        let shutdown = &self.broker.shutdown;
        loop {
            self.pace().await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if !self.admit() => drop(stream),
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        admitted(stream, peer);
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        warn!(transport, "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }

    /// False when `limits.max_connections` is reached: the new connection is to be closed
    /// (counted in `$SYS/broker/connections/refused`, logged at most once a second).
    pub fn admit(&self) -> bool {
        let max = self.broker.live().limits.max_connections;
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
