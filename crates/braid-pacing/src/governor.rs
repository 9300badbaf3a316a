//! The governor: a quinn congestion controller wrapping Cubic (which still sets the window)
//! that judges each interval's losses and sets the pacing rate of its connection's [`Pace`].

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, CubicConfig};

use crate::Pace;

/// Lowest rate the governor paces at (packets per second).
const MIN_RATE: f64 = 4.0;
/// Above this rate (packets per second) the governor stops pacing: no policer that slow.
const MAX_RATE: f64 = 20_000.0;
/// Shortest interval the governor judges losses over.
const INTERVAL: Duration = Duration::from_millis(250);
/// Fewest packets sent in an interval for a judgement. Counted in packets, not bytes: a
/// policer counts packets, and the loop it traps a sender in (a probe gets through, the
/// retransmission right after its ACK does not) is made of small packets, as at the start of
/// a connection, when a lost CONNECT or SUBACK is all there is to send (`bench/HOL.md`).
const MIN_PACKETS: u64 = 8;
/// Loss fraction that turns pacing on, and that keeps cutting the rate once on.
const ENGAGE_LOSS: f64 = 0.25;
/// Loss fraction above which a paced rate is cut to the delivered rate.
const CUT_LOSS: f64 = 0.10;
/// Loss fraction below which a paced rate is raised by [`PROBE_GAIN`].
const PROBE_LOSS: f64 = 0.02;
const PROBE_GAIN: f64 = 1.1;
/// Intervals in a row of loss above [`ENGAGE_LOSS`] while paced after which pacing is judged
/// useless (the loss is not the rate's fault) and turned off for [`COOLDOWN`].
const GIVE_UP: u32 = 8;
const COOLDOWN: Duration = Duration::from_secs(30);

/// Builds [`Governor`]s that set `pace`.
pub(crate) struct GovernorFactory {
    pace: Pace,
    cubic: Arc<CubicConfig>,
}

impl GovernorFactory {
    pub(crate) fn new(pace: Pace) -> GovernorFactory {
        GovernorFactory { pace, cubic: Arc::new(CubicConfig::default()) }
    }
}

impl ControllerFactory for GovernorFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let cubic = self.cubic.clone().build(now, current_mtu);
        Box::new(Governor { cubic, pace: self.pace.clone(), judge: Judge::new(now) })
    }
}

/// Cubic for the window, and the judge of losses for the pacing rate.
struct Governor {
    cubic: Box<dyn Controller>,
    pace: Pace,
    judge: Judge,
}

impl Governor {
    fn tick(&mut self, now: Instant) {
        if let Some(rate) = self.judge.tick(now, self.pace.rate()) {
            self.pace.set_rate(rate);
        }
    }
}

impl Controller for Governor {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.cubic.on_sent(now, bytes, last_packet_number);
        self.judge.sent += 1;
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &quinn_proto::RttEstimator,
    ) {
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
        self.judge.acked(bytes, app_limited);
        self.tick(now);
    }

    fn on_end_acks(&mut self, now: Instant, in_flight: u64, app_limited: bool, largest: Option<u64>) {
        self.cubic.on_end_acks(now, in_flight, app_limited, largest);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.cubic.on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
        self.judge.lost += lost_bytes;
        self.tick(now);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.cubic.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.cubic.window()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Governor {
            cubic: self.cubic.clone_box(),
            pace: self.pace.clone(),
            judge: self.judge.clone(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.cubic.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Counts what an interval acknowledged and lost, and decides the pacing rate from it.
#[derive(Clone, Debug)]
struct Judge {
    start: Instant,
    acked: u64,
    acked_packets: u64,
    lost: u64,
    /// Packets sent.
    sent: u64,
    /// Some acknowledged packet was sent while the application had more to send.
    busy: bool,
    /// Intervals in a row of heavy loss while paced.
    heavy: u32,
    /// Pacing given up until then.
    cooldown: Option<Instant>,
}

impl Judge {
    fn new(now: Instant) -> Judge {
        Judge {
            start: now,
            acked: 0,
            acked_packets: 0,
            lost: 0,
            sent: 0,
            busy: false,
            heavy: 0,
            cooldown: None,
        }
    }

    fn acked(&mut self, bytes: u64, app_limited: bool) {
        self.acked += bytes;
        self.acked_packets += 1;
        self.busy |= !app_limited;
    }

    /// At the end of an interval with enough data, the new rate (`Some(None)`: stop pacing);
    /// `None` while the interval goes on or the rate stays.
    fn tick(&mut self, now: Instant, rate: Option<f64>) -> Option<Option<f64>> {
        let elapsed = now.saturating_duration_since(self.start);
        let total = self.acked + self.lost;
        let sent = self.sent;
        if elapsed < INTERVAL || (sent < MIN_PACKETS && elapsed < 8 * INTERVAL) {
            return None;
        }
        let loss = if total == 0 { 0.0 } else { self.lost as f64 / total as f64 };
        let delivered = self.acked_packets as f64 / elapsed.as_secs_f64();
        let busy = self.busy;
        *self = Judge { start: now, heavy: self.heavy, cooldown: self.cooldown, ..Judge::new(now) };
        if sent < MIN_PACKETS || total == 0 {
            return None;
        }
        match rate {
            None => {
                let cooling = self.cooldown.is_some_and(|until| now < until);
                (loss > ENGAGE_LOSS && !cooling).then_some(Some(delivered.max(MIN_RATE)))
            }
            Some(rate) => {
                self.heavy = if loss > ENGAGE_LOSS { self.heavy + 1 } else { 0 };
                if self.heavy >= GIVE_UP {
                    self.heavy = 0;
                    self.cooldown = Some(now + COOLDOWN);
                    Some(None)
                } else if loss > CUT_LOSS {
                    Some(Some((delivered.min(rate) * 0.95).max(MIN_RATE)))
                } else if loss < PROBE_LOSS && busy {
                    let raised = rate * PROBE_GAIN;
                    Some((raised < MAX_RATE).then_some(raised))
                } else {
                    None
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One interval: `acked` full packets acknowledged and `lost` lost, the sender busy.
    fn interval(
        j: &mut Judge,
        t: &mut Instant,
        acked: u64,
        lost: u64,
        rate: Option<f64>,
    ) -> Option<Option<f64>> {
        sized(j, 1200, acked, lost);
        *t += INTERVAL;
        j.tick(*t, rate)
    }

    /// `acked` and `lost` packets of `size` bytes, all sent in this interval.
    fn sized(j: &mut Judge, size: u64, acked: u64, lost: u64) {
        for _ in 0..acked {
            j.acked(size, false);
        }
        j.lost += lost * size;
        j.sent += acked + lost;
    }

    #[test]
    fn small_packets_caught_by_a_policer_turn_pacing_on_too() {
        // The start of a connection behind a policer: a 40-byte probe gets through, the
        // 60-byte retransmission sent right after its ACK is dropped, 30 times a second.
        let mut t = Instant::now();
        let mut j = Judge::new(t);
        for _ in 0..8 {
            j.acked(40, true);
            j.lost += 60;
            j.sent += 2;
        }
        t += INTERVAL;
        let rate = j.tick(t, None).expect("judged").expect("pacing on");
        assert!((rate - 32.0).abs() < 0.01, "{rate}");
    }

    #[test]
    fn a_policer_turns_pacing_on_at_the_delivered_rate_and_the_rate_probes_upward() {
        let mut t = Instant::now();
        let mut j = Judge::new(t);
        // 120 packets/s offered, 30/s delivered (7.5 per 250 ms, here 8): pacing at 32/s.
        let rate = interval(&mut j, &mut t, 8, 22, None).unwrap().unwrap();
        assert!((rate - 32.0).abs() < 0.01, "{rate}");
        // Paced within the budget, no loss: 10 % more.
        assert_eq!(interval(&mut j, &mut t, 8, 0, Some(rate)), Some(Some(rate * PROBE_GAIN)));
        // Over the budget again (20 % lost): cut to 95 % of what arrived.
        let cut = interval(&mut j, &mut t, 8, 2, Some(35.2)).unwrap().unwrap();
        assert!((cut - 30.4).abs() < 0.01, "{cut}");
        // A little loss: the rate holds.
        assert_eq!(interval(&mut j, &mut t, 20, 1, Some(cut)), None);
    }

    #[test]
    fn little_loss_or_an_idle_link_leaves_pacing_off() {
        let mut t = Instant::now();
        let mut j = Judge::new(t);
        assert_eq!(interval(&mut j, &mut t, 100, 10, None), None);
        assert_eq!(interval(&mut j, &mut t, 1, 1, None), None, "too few packets to judge");
    }

    #[test]
    fn loss_that_pacing_does_not_cure_turns_it_off_for_a_while() {
        let mut t = Instant::now();
        let mut j = Judge::new(t);
        let mut rate = interval(&mut j, &mut t, 60, 40, None).unwrap();
        for _ in 0..GIVE_UP - 1 {
            rate = interval(&mut j, &mut t, 60, 40, rate).unwrap();
            assert!(rate.is_some());
        }
        assert_eq!(interval(&mut j, &mut t, 60, 40, rate), Some(None));
        assert_eq!(interval(&mut j, &mut t, 60, 40, None), None, "cooling down");
    }
}
