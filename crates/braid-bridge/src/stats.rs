//! A bridge's counters and state, published under `$SYS/bridges/<kind>/<name>/...` every
//! `sys.interval_secs` (retained, as the broker's own `$SYS` topics).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_broker::message::Message;
use braid_broker::Broker;
use braid_proto::{ByteString, Bytes};

/// What one bridge counts.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// The other side answers (the last thing heard from it was not a failure).
    pub up: AtomicBool,
    /// Messages bridged out and acknowledged by the other side.
    pub sent: AtomicU64,
    /// Messages the other side failed to take that go out again (the outbox resends them).
    pub failed: AtomicU64,
    /// Messages not bridged out, for good: too large, or a topic or key that cannot be made
    /// for them, or refused by the other side as such.
    pub dropped: AtomicU64,
    /// Messages handed to the other side and not acknowledged yet.
    pub in_flight: AtomicU64,
    /// Messages brought in and published in Braid.
    pub received: AtomicU64,
    /// Records brought in that could not be published (no MQTT topic can be made for them).
    pub skipped: AtomicU64,
    /// When a message was last logged as dropped or skipped, in seconds since the bridge
    /// started: such lines are logged at most once a second (the counters count them all).
    last_logged: AtomicU64,
    started: OnceInstant,
}

/// When the stats were made.
#[derive(Debug)]
struct OnceInstant(Instant);

impl Default for OnceInstant {
    fn default() -> Self {
        OnceInstant(Instant::now())
    }
}

/// Adds one to `counter`.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Takes one from `counter`.
pub(crate) fn drop_one(counter: &AtomicU64) {
    counter.fetch_sub(1, Ordering::Relaxed);
}

impl Stats {
    /// True if a line about a dropped or skipped message may be logged now (at most one a
    /// second, the first at once).
    pub(crate) fn may_log(&self) -> bool {
        let now = self.started.0.elapsed().as_secs() + 1;
        let last = self.last_logged.load(Ordering::Relaxed);
        now > last
            && self.last_logged.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Sets whether the other side answers; true if that changed.
    pub(crate) fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::Relaxed) != up
    }
}

/// Publishes `stats` under `$SYS/bridges/<kind>/<name>/` until the broker shuts down (not at
/// all if `sys.interval_secs` is 0), with `out/queued`, what the session of `outbox` (a client
/// id) holds, if the bridge has one.
pub(crate) async fn publish(
    broker: Arc<Broker>,
    kind: &'static str,
    name: String,
    stats: Arc<Stats>,
    outbox: Option<String>,
) {
    let secs = broker.config.sys.interval_secs;
    if secs == 0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(secs));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = broker.shutdown.cancelled() => return,
        }
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed).to_string();
        let state = if stats.up.load(Ordering::Relaxed) { "up" } else { "down" };
        let values = [
            ("state", state.to_string()),
            ("out/sent", get(&stats.sent)),
            ("out/failed", get(&stats.failed)),
            ("out/dropped", get(&stats.dropped)),
            ("out/inflight", get(&stats.in_flight)),
            ("in/received", get(&stats.received)),
            ("in/skipped", get(&stats.skipped)),
        ];
        let queued = outbox.as_deref().map(|o| ("out/queued", broker.held_for(o).unwrap_or(0).to_string()));
        for (topic, value) in values.into_iter().chain(queued) {
            let topic = ByteString::from(format!("$SYS/bridges/{kind}/{name}/{topic}"));
            let _ = broker.publish(Message::internal(topic, Bytes::from(value), true), Instant::now());
        }
    }
}
