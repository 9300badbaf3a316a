//! The adaptive delivery window: how many QoS 1/2 deliveries a connection may have
//! unacknowledged, within the client's Receive Maximum. It grows while acknowledgements come
//! back about as fast as the fastest seen lately and shrinks when they start to queue, so a
//! backlog waits in the session queue, where backpressure and the overflow policies see it,
//! instead of in socket buffers in front of the client where it only adds latency
//! (docs/flow-control.md, "The delivery window").

use std::time::Instant;

/// Microseconds from `epoch` to `now` (0 if `now` is before it), modulo 2^32: differences are
/// exact up to ~71 minutes. Times compared with each other must share their epoch (each
/// in-flight window keeps its own: [`super::inflight::Inflight`]).
pub(super) fn micros(now: Instant, epoch: Instant) -> u32 {
    now.saturating_duration_since(epoch).as_micros() as u32
}

/// Window of a new connection.
const INITIAL: u32 = 64;
/// The window never shrinks below this (the client's Receive Maximum may be smaller). Below
/// about 32 a busy broker's writes get small: fanning one publisher out to 1000 subscribers,
/// every window was cut to the minimum whatever it was; at 8 or 16 a write carried 10-14
/// deliveries, at 32 about 22, and at 8 the broker made about twice the system calls per
/// delivery that it makes at 32 (docs/flow-control.md, "The delivery window").
const MIN: u32 = 32;
/// Acknowledgement delay above the lowest seen that counts as queueing: the larger of this and
/// the lowest delay itself.
const SLACK_US: u32 = 1_000;
/// The lowest delay is learnt afresh after this long, so a path that got slower is not judged
/// by a delay it can no longer give.
const MIN_DELAY_LIFETIME_US: u32 = 10_000_000;

/// Delay-based window of one connection (sans-IO: times come in as [`micros`]).
///
/// Judged once per round trip by the fastest acknowledgement of the round, as CoDel judges a
/// queue by its lowest sojourn time: a client that reads in bursts delays some
/// acknowledgements whatever the window, but only a queue the window itself builds delays
/// every one of them. And only a queue the window builds gets shorter when the window is cut:
/// a round that is as slow after a cut as the one that caused it makes its delay the new
/// normal instead of cutting again. A machine whose CPU is saturated (fan-out to many
/// subscribers) delays every acknowledgement whatever the window, and there a smaller window
/// only means more, smaller writes for the same messages.
#[derive(Debug, Clone)]
pub struct AdaptiveWindow {
    size: u32,
    /// Lowest acknowledgement delay seen since `base_at`, or the delay a cut did not lower, µs
    /// (`u32::MAX`: none yet).
    base: u32,
    base_at: u32,
    /// Deliveries sent from this time on end the current round.
    round_start: u32,
    /// Lowest delay of the current round, µs.
    round_min: u32,
    /// Growing by one per fast acknowledgement (until the first round that queued).
    slow_start: bool,
    /// The delay that made the last round cut the window, µs (`u32::MAX`: the last round did
    /// not cut).
    cut_for: u32,
}

impl AdaptiveWindow {
    /// The window of a connection that has had no acknowledgement yet.
    pub const FRESH: AdaptiveWindow = AdaptiveWindow {
        size: INITIAL,
        base: u32::MAX,
        base_at: 0,
        round_start: 0,
        round_min: u32::MAX,
        slow_start: true,
        cut_for: u32::MAX,
    };
}

impl Default for AdaptiveWindow {
    fn default() -> Self {
        AdaptiveWindow::FRESH
    }
}

impl AdaptiveWindow {
    /// Deliveries that may be unacknowledged now.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// An acknowledgement (PUBACK, or PUBREC for QoS 2) of a delivery sent at `sent`, arriving
    /// at `now`; `full` says whether the window was in use up to its size, since a window that
    /// is not filled has not shown it could use more.
    pub fn on_ack(&mut self, sent: u32, now: u32, full: bool) {
        let delay = now.wrapping_sub(sent);
        if delay > i32::MAX as u32 {
            return; // sent "after" now: a resend's clock from another connection
        }
        if delay < self.base || now.wrapping_sub(self.base_at) > MIN_DELAY_LIFETIME_US {
            self.base = delay;
            self.base_at = now;
        }
        let target = self.base.saturating_add(self.base.max(SLACK_US));
        self.round_min = self.round_min.min(delay);
        if self.slow_start && full && delay <= target {
            self.size += 1;
        }
        if sent.wrapping_sub(self.round_start) as i32 >= 0 {
            // Sent after the round began: the round is over.
            if self.round_min > target && self.round_min >= self.cut_for - self.cut_for / 8 {
                // The last cut hardly lowered the delay (by less than half its own share): the
                // queue is not this window's (the client, or the whole machine, got slower).
                // Judge against this delay now.
                self.base = self.round_min;
                self.base_at = now;
                self.cut_for = u32::MAX;
            } else if self.round_min > target {
                let cut = (self.size - self.size / 4).max(MIN);
                // A cut to the minimum is not a quarter, and below it there is nothing to judge.
                self.cut_for = if cut > MIN { self.round_min } else { u32::MAX };
                self.size = cut;
                self.slow_start = false;
            } else {
                self.cut_for = u32::MAX;
                if full && !self.slow_start {
                    self.size += (self.size / 16).max(1);
                }
            }
            self.round_start = now;
            self.round_min = u32::MAX;
        }
        self.size = self.size.min(u32::from(u16::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Acknowledges `n` deliveries, one every 10 µs, each `delay` µs after it was sent.
    fn acks(w: &mut AdaptiveWindow, now: &mut u32, n: u32, delay: u32) {
        for _ in 0..n {
            *now += 10;
            w.on_ack(now.wrapping_sub(delay), *now, true);
        }
    }

    /// A window grown to 100 by fast (50 µs) acknowledgements.
    fn grown() -> (AdaptiveWindow, u32) {
        let (mut w, mut now) = (AdaptiveWindow::default(), 1_000_000);
        acks(&mut w, &mut now, 36, 50);
        assert_eq!(w.size(), 100, "one more per fast acknowledgement at first");
        (w, now)
    }

    #[test]
    fn does_not_grow_when_the_window_is_not_filled() {
        let mut w = AdaptiveWindow::default();
        w.on_ack(0, 50, false);
        assert_eq!(w.size(), INITIAL as usize);
    }

    #[test]
    fn a_queue_the_window_builds_is_cut_round_by_round_then_growth_is_gradual() {
        let (mut w, mut now) = grown();
        // The client takes 50 µs per message: the acknowledgements wait behind the window.
        acks(&mut w, &mut now, 400, 5_000);
        assert_eq!(w.size(), 100, "the round is not over yet");
        acks(&mut w, &mut now, 200, 5_000);
        assert_eq!(w.size(), 75, "one cut for the round");
        acks(&mut w, &mut now, 500, 75 * 50);
        assert_eq!(w.size(), 57, "the cut lowered the delay, but not enough: one more");
        acks(&mut w, &mut now, 5, 50);
        assert_eq!(w.size(), 60, "fast again: a sixteenth more per round");
    }

    #[test]
    fn a_delay_the_cut_did_not_lower_is_the_new_normal() {
        // Every acknowledgement now takes 5 ms whatever the window (a saturated machine).
        let (mut w, mut now) = grown();
        acks(&mut w, &mut now, 600, 5_000);
        assert_eq!(w.size(), 75, "one cut for the round");
        acks(&mut w, &mut now, 5_000, 5_000);
        let grown_again = w.size();
        assert!(grown_again > 75, "no second cut; it grows again from 5 ms ({grown_again})");
        acks(&mut w, &mut now, 3_000, 12_000);
        assert!(w.size() < grown_again, "a queue beyond the new normal is still cut ({})", w.size());
    }

    #[test]
    fn a_client_that_reads_in_bursts_is_not_cut() {
        // Most acknowledgements wait for the client's next read, but some come back at once:
        // no queue stands in front of it.
        let (mut w, mut now) = grown();
        for _ in 0..200 {
            acks(&mut w, &mut now, 9, 5_000);
            acks(&mut w, &mut now, 1, 50);
        }
        assert!(w.size() > 100, "{}", w.size());
    }

    #[test]
    fn never_below_the_minimum() {
        let (mut w, mut now) = grown();
        // A queue of the window's own making: 200 µs per message in flight.
        for _ in 0..50_000 {
            let delay = w.size() as u32 * 200;
            acks(&mut w, &mut now, 1, delay);
        }
        assert_eq!(w.size(), MIN as usize);
    }

    #[test]
    fn a_slow_client_is_judged_by_its_own_delay() {
        // A client that always takes 20 ms to acknowledge is not queueing: its window grows.
        let (mut w, mut now) = (AdaptiveWindow::default(), 1_000_000);
        acks(&mut w, &mut now, 50, 20_000);
        assert_eq!(w.size(), 114);
    }

    #[test]
    fn the_lowest_delay_is_learnt_again() {
        let (mut w, mut now) = grown();
        now += MIN_DELAY_LIFETIME_US;
        acks(&mut w, &mut now, 3_000, 20_000);
        assert!(w.size() >= 100, "after the lifetime 20 ms is the new normal: no cut ({})", w.size());
    }
}
