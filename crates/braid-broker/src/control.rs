//! The handle through which anything outside a connection's task reaches it: a wake-up when
//! deliveries are ready, a close request (takeover, shutdown, eviction, keep-alive expiry), and
//! the activity clock the keep-alive sweeper reads. One small struct, so an idle connection
//! waits on a single notification.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use braid_proto::ReasonCode;

/// Why a connection closes: the reason code and a human-readable detail, sent to v5 clients as
/// DISCONNECT's Reason String.
pub type CloseReason = (ReasonCode, Cow<'static, str>);

/// Control block of one connection. The first close reason given wins; the connection sends it
/// in a v5 DISCONNECT before closing the socket.
#[derive(Debug)]
pub struct ConnControl {
    notify: Notify,
    closed: AtomicBool,
    reason: Mutex<Option<CloseReason>>,
    /// Milliseconds (on the broker's clock) when bytes last arrived.
    last_activity_ms: AtomicU64,
    /// Silence allowed before the keep alive expires (1.5 x keep alive); 0 = no keep alive.
    grace_ms: u64,
    /// The connection is held by backpressure: its silence is not the client's fault.
    held: AtomicBool,
}

impl ConnControl {
    /// A control for a connection with keep alive `keep_alive_secs` (0 = none), active at
    /// `now_ms`.
    pub fn new(keep_alive_secs: u16, now_ms: u64) -> ConnControl {
        ConnControl {
            notify: Notify::new(),
            closed: AtomicBool::new(false),
            reason: Mutex::new(None),
            last_activity_ms: AtomicU64::new(now_ms),
            grace_ms: u64::from(keep_alive_secs) * 1500,
            held: AtomicBool::new(false),
        }
    }

    /// Wakes the connection: deliveries are ready (a wake before it waits is not lost).
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Waits for [`ConnControl::wake`] or a close.
    pub async fn woken(&self) {
        self.notify.notified().await
    }

    /// Asks the connection to close with `reason`, explained by the code's own description.
    pub fn close(&self, reason: ReasonCode) {
        self.close_because(reason, reason.description());
    }

    /// Asks the connection to close with `reason`, explained by `detail`.
    pub fn close_because(&self, reason: ReasonCode, detail: impl Into<Cow<'static, str>>) {
        self.reason.lock().get_or_insert_with(|| (reason, detail.into()));
        self.closed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    /// True once a close was asked for.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Why the connection closes (server shutdown when no one said).
    pub fn reason(&self) -> ReasonCode {
        self.reason.lock().as_ref().map_or(ReasonCode::ServerShuttingDown, |r| r.0)
    }

    /// Why the connection closes, with its detail.
    pub fn reason_with_detail(&self) -> CloseReason {
        let r = self.reason.lock();
        r.clone().unwrap_or((ReasonCode::ServerShuttingDown, Cow::Borrowed("server shutting down")))
    }

    /// Bytes arrived at `now_ms`.
    pub fn touch(&self, now_ms: u64) {
        self.last_activity_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Marks the connection as held by backpressure (or no longer, at `now_ms`).
    pub fn set_held(&self, held: bool, now_ms: u64) {
        self.held.store(held, Ordering::Relaxed);
        self.touch(now_ms);
    }

    /// Closes the connection (0x8D) if nothing arrived for 1.5 times its keep alive.
    pub fn expire_if_silent(&self, now_ms: u64) {
        if self.grace_ms == 0 || self.held.load(Ordering::Relaxed) || self.is_closed() {
            return;
        }
        let silent = now_ms.saturating_sub(self.last_activity_ms.load(Ordering::Relaxed));
        if silent >= self.grace_ms {
            self.close_because(
                ReasonCode::KeepAliveTimeout,
                format!("nothing received for {silent} ms (keep alive {} s)", self.grace_ms / 1500),
            );
        }
    }
}
