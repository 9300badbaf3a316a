//! A connection's activity clocks, which the broker's sweep reads for keep alive and parking.
//! Times are milliseconds on the broker's clock ([`crate::broker::Broker::clock_ms`]), kept
//! modulo 2^32 (4 bytes instead of 8 per clock).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// When bytes last moved on a connection, and whether its silence is excused.
#[derive(Debug)]
pub(super) struct Activity {
    /// When bytes last arrived.
    last_read_ms: AtomicU32,
    /// When bytes last arrived or were written.
    last_io_ms: AtomicU32,
    /// Silence allowed before the keep alive expires (1.5 x keep alive); 0 = no keep alive.
    grace_ms: u32,
    /// The connection is held by backpressure: its silence is not the client's fault.
    held: AtomicBool,
}

impl Activity {
    /// Clocks for a connection with keep alive `keep_alive_secs`, active at `now_ms`.
    pub(super) fn new(keep_alive_secs: u16, now_ms: u64) -> Activity {
        Activity {
            last_read_ms: AtomicU32::new(now_ms as u32),
            last_io_ms: AtomicU32::new(now_ms as u32),
            grace_ms: u32::from(keep_alive_secs) * 1500,
            held: AtomicBool::new(false),
        }
    }

    /// Bytes arrived at `now_ms`.
    pub(super) fn read(&self, now_ms: u64) {
        self.last_read_ms.store(now_ms as u32, Ordering::Relaxed);
        self.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Bytes were written at `now_ms`.
    pub(super) fn wrote(&self, now_ms: u64) {
        self.last_io_ms.store(now_ms as u32, Ordering::Relaxed);
    }

    /// Marks the connection as held by backpressure (or no longer).
    pub(super) fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::Relaxed);
    }

    /// True while held by backpressure.
    pub(super) fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// The keep-alive verdict at `now_ms`: why the client has been silent too long, if it has.
    pub(super) fn keep_alive_expired(&self, now_ms: u64) -> Option<String> {
        if self.grace_ms == 0 || self.is_held() {
            return None;
        }
        let silent = since(now_ms, &self.last_read_ms);
        (silent >= u64::from(self.grace_ms))
            .then(|| format!("nothing received for {silent} ms (keep alive {} s)", self.grace_ms / 1500))
    }

    /// True if nothing moved either way for `after_ms` at `now_ms`.
    pub(super) fn idle_for(&self, now_ms: u64, after_ms: u64) -> bool {
        since(now_ms, &self.last_io_ms) >= after_ms
    }
}

/// Milliseconds from the clock reading in `then` to `now_ms`. Differences stay exact up to 24
/// days, far beyond any keep alive (at most 1.5 x 65,535 s), and a reading a moment newer than
/// `now_ms` (stored by the connection after the sweeper read the clock) counts as 0, not as 49
/// days.
fn since(now_ms: u64, then: &AtomicU32) -> u64 {
    let d = (now_ms as u32).wrapping_sub(then.load(Ordering::Relaxed));
    if d > u32::MAX / 2 {
        0
    } else {
        u64::from(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_survive_wrapping_and_races() {
        let then = AtomicU32::new(u32::MAX - 5);
        assert_eq!(since(u64::from(u32::MAX) + 10, &then), 15, "across the wrap");
        assert_eq!(since(u64::from(u32::MAX) - 6, &then), 0, "a reading newer than now");
        let a = Activity::new(1, 5 << 32);
        assert_eq!(a.keep_alive_expired((5 << 32) + 1499), None);
        assert!(a.keep_alive_expired((5 << 32) + 1500).is_some());
        a.set_held(true);
        assert_eq!(a.keep_alive_expired((5 << 32) + 9000), None, "held: not the client's fault");
    }
}
