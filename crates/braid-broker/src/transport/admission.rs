//! Who may connect: `limits.max_connections` (parked connections count) and
//! `limits.max_connection_rate`, shared by every listener's accept loop; and what happens when
//! the process is out of file descriptors: one spare descriptor is kept open, so that a client
//! waiting in the listen backlog can still be accepted and closed at once (it sees its
//! connection end instead of waiting for a CONNACK that never comes). Logged once per stretch,
//! counted, and over by itself when descriptors free up.

use std::fs::File;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

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
    /// The spare descriptor (of `/dev/null`), given up to accept and close a connection when
    /// the process is out of descriptors.
    spare: Mutex<Option<File>>,
    /// Out of descriptors since the last accept that worked.
    out_of_fds: AtomicBool,
}

impl Admission {
    /// Limits counting the tasks of `connections` and the broker's parked connections.
    pub fn new(broker: &Arc<Broker>, connections: &TaskTracker) -> Admission {
        Admission {
            broker: broker.clone(),
            connections: connections.clone(),
            rate: Mutex::new((0, None)),
            last_refusal_log: Mutex::new(None),
            spare: Mutex::new(File::open("/dev/null").ok()),
            out_of_fds: AtomicBool::new(false),
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
                _ = self.broker.shutdown().cancelled() => {}
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
        let shutdown = &self.broker.shutdown();
        loop {
            self.pace().await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if !self.admit() => drop(stream),
                    Ok((stream, peer)) => {
                        self.fds_back(transport);
                        let _ = stream.set_nodelay(true);
                        admitted(stream, peer);
                    }
                    Err(e) if out_of_descriptors(&e) => self.shed(listener, transport).await,
                    Err(e) => {
                        // Anything else: back off instead of spinning.
                        warn!(transport, "accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
    }

    /// The process is out of file descriptors and a client waits on `listener`: gives up the
    /// spare descriptor, accepts and closes every waiting connection, and takes the spare
    /// again. Logged once per stretch (counted in `connections_refused_fd`); if the spare
    /// cannot be had, waits a moment, as nothing can be accepted.
    async fn shed(&self, listener: &TcpListener, transport: &str) {
        if !self.out_of_fds.swap(true, Ordering::Relaxed) {
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
            warn!(
                transport,
                ?limit,
                "out of file descriptors: new connections are closed at once until some are free"
            );
        }
        let had_spare = self.spare.lock().take().is_some();
        let mut shed = 0u64;
        // With the spare given up, each waiting client takes the descriptor it left, and gives
        // it back as it is closed.
        while had_spare && rustix::net::accept(listener).is_ok() {
            shed += 1;
        }
        Metrics::add(&self.broker.metrics().connections_refused_fd, shed);
        *self.spare.lock() = File::open("/dev/null").ok();
        if shed == 0 {
            tokio::select! {
                _ = self.broker.shutdown().cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// An accept worked: if it was out of descriptors, says that it is over.
    fn fds_back(&self, transport: &str) {
        if self.out_of_fds.swap(false, Ordering::Relaxed) {
            let refused = Metrics::get(&self.broker.metrics().connections_refused_fd);
            info!(
                transport,
                refused_since_start = refused,
                "file descriptors free again: accepting connections"
            );
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
        Metrics::add(&self.broker.metrics().connections_refused, 1);
        let mut last = self.last_refusal_log.lock();
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            warn!(max, "limits.max_connections reached: closing new connections");
            *last = Some(Instant::now());
        }
        false
    }
}

/// True for the accept errors that mean the process (EMFILE) or the system (ENFILE) has no
/// file descriptor left.
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::MFILE.raw_os_error() || code == rustix::io::Errno::NFILE.raw_os_error())
}
