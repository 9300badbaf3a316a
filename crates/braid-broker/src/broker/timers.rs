//! The broker's timers in one place: a heap of deadlines for will delays, session expiries and
//! the connection sweep (keep alive, parking). The core never reads a clock: the runtime asks
//! [`Timers::next`] when to wake and hands the time in; a test advances a virtual clock.
//!
//! Timers are not cancelled: each one re-checks, when it fires, that what it was set for still
//! holds (the session's connection generation, a will still pending), which is what a
//! reconnect or a takeover changes.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use crate::session::Session;

/// What a timer does when it fires.
#[derive(Debug)]
pub(crate) enum Timer {
    /// Send the will of `session`, if connection `generation` is still its latest.
    Will { session: Arc<Session>, generation: u64 },
    /// End `session`, if it is still offline since connection `generation` ended.
    Expiry { session: Arc<Session>, generation: u64 },
    /// Close silent connections (keep alive) and park idle ones; runs again after
    /// [`super::SWEEP_INTERVAL`].
    Sweep,
}

/// A heap of timers, earliest first; timers due at the same instant fire in the order they
/// were set.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Entry>,
    /// Order of setting, to break ties.
    next_seq: u64,
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    timer: Timer,
}

impl Timers {
    /// Sets `timer` to fire at `at`. True if it is now the earliest (the runtime's wait must
    /// be shortened).
    pub(crate) fn set(&mut self, at: Instant, timer: Timer) -> bool {
        let earliest = self.next().is_none_or(|next| at < next);
        self.next_seq += 1;
        self.heap.push(Entry { at, seq: self.next_seq, timer });
        earliest
    }

    /// When the earliest timer is due.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|e| e.at)
    }

    /// The earliest timer if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        if self.next()? > now {
            return None;
        }
        self.heap.pop().map(|e| e.timer)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, and the earliest must come out first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::QueueLimits;
    use std::time::Duration;

    #[test]
    fn fires_earliest_first_and_ties_in_setting_order() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        assert!(timers.set(t0 + Duration::from_secs(5), Timer::Sweep));
        let s = |generation| Timer::Will {
            session: Arc::new(Session::new(
                1,
                "c".into(),
                Arc::new(QueueLimits::from_config(&Default::default())),
            )),
            generation,
        };
        assert!(timers.set(t0 + Duration::from_secs(1), s(1)), "earlier than the sweep");
        assert!(!timers.set(t0 + Duration::from_secs(1), s(2)), "a tie is not earlier");
        assert_eq!(timers.next(), Some(t0 + Duration::from_secs(1)));
        assert!(timers.pop_due(t0).is_none(), "nothing due yet");
        let due = |t: &mut Timers, at| match t.pop_due(at) {
            Some(Timer::Will { generation, .. }) => generation,
            other => panic!("expected a will, got {other:?}"),
        };
        assert_eq!(due(&mut timers, t0 + Duration::from_secs(1)), 1);
        assert_eq!(due(&mut timers, t0 + Duration::from_secs(1)), 2);
        assert!(timers.pop_due(t0 + Duration::from_secs(4)).is_none());
        assert!(matches!(timers.pop_due(t0 + Duration::from_secs(9)), Some(Timer::Sweep)));
        assert_eq!(timers.next(), None, "every timer fired");
    }
}
