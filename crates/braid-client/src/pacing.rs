//! Send pacing for MQTT over QUIC on policed links.
//!
//! A link that polices packets (a token bucket that drops what exceeds it, like iptables
//! `limit` or a mobile operator's rate cap) and adds almost no delay defeats a window-based
//! congestion controller: acknowledgements come back at once, so every packet after an ACK
//! goes out while the policer has no token left and is dropped, retransmissions included. A
//! small urgent stream then waits for the same lost data again and again (seed 000,
//! `bench/HOL.md`). Pacing datagrams at the rate the link delivers keeps every packet within
//! the policer's budget, and because quinn builds a packet only when the socket takes it, the
//! highest-priority stream's data goes into the next packet that leaves.
//!
//! [`PacedSocket`] wraps the UDP socket with a token bucket in packets per second;
//! [`Governor`] (wrapping quinn's Cubic) sets the rate from what the connection sees: it stays
//! off until a quarter of the data sent is lost, then paces at the delivered rate, probes 10 %
//! higher while losses stay under 2 %, and turns itself off again if pacing does not bring the
//! losses down (random loss, not a policer) or the rate outgrows any policer.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, CubicConfig};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// How a QUIC client paces the datagrams it sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pacing {
    /// No pacing until heavy loss shows a policer, then at the rate the link delivers.
    #[default]
    Adaptive,
    /// Never paced beyond quinn's own congestion control.
    Off,
    /// At most this many packets per second, always (a link with a known packet budget).
    Fixed(u32),
}

impl std::str::FromStr for Pacing {
    type Err = String;

    /// `adaptive`, `off`, or a number of packets per second.
    fn from_str(s: &str) -> Result<Pacing, String> {
        match s {
            "adaptive" => Ok(Pacing::Adaptive),
            "off" => Ok(Pacing::Off),
            n => match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok(Pacing::Fixed(n)),
                _ => Err(format!("{s:?}: expected adaptive, off, or packets per second (1 or more)")),
            },
        }
    }
}

/// Lowest rate the governor paces at (packets per second).
const MIN_RATE: f64 = 4.0;
/// Above this rate (packets per second) the governor stops pacing: no policer that slow.
const MAX_RATE: f64 = 20_000.0;
/// Shortest interval the governor judges losses over.
const INTERVAL: Duration = Duration::from_millis(250);
/// Fewest bytes acknowledged or lost in an interval for a judgement (8 full packets).
const MIN_SAMPLE: u64 = 8 * 1200;
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

/// A token bucket in packets: the rate (none: unlimited) and the tokens available.
#[derive(Debug)]
struct Bucket {
    rate: Option<f64>,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// Burst allowed at `rate`: two packets, or 4 ms worth at high rates (timer granularity).
    fn capacity(rate: f64) -> f64 {
        (rate * 0.004).max(2.0)
    }

    fn refill(&mut self, now: Instant) {
        if let Some(rate) = self.rate {
            let earned = now.saturating_duration_since(self.last).as_secs_f64() * rate;
            self.tokens = (self.tokens + earned).min(Bucket::capacity(rate));
        }
        self.last = now;
    }

    /// When a packet may go: `None` now, else the instant a token is there.
    fn ready_at(&mut self, now: Instant) -> Option<Instant> {
        self.refill(now);
        let rate = self.rate?;
        (self.tokens < 1.0).then(|| now + Duration::from_secs_f64((1.0 - self.tokens) / rate))
    }
}

/// Shared handle on a bucket: the socket spends it, the governor sets its rate.
#[derive(Clone, Debug)]
pub(crate) struct Pace(Arc<Mutex<Bucket>>);

impl Pace {
    pub(crate) fn new(rate: Option<f64>) -> Pace {
        let tokens = rate.map_or(0.0, Bucket::capacity);
        Pace(Arc::new(Mutex::new(Bucket { rate, tokens, last: Instant::now() })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_rate(&self, rate: Option<f64>) {
        let mut b = self.lock();
        b.refill(Instant::now());
        if b.rate.is_none() {
            b.tokens = rate.map_or(0.0, Bucket::capacity);
        }
        b.rate = rate;
    }

    /// The current rate in packets per second (none: not pacing).
    pub(crate) fn rate(&self) -> Option<f64> {
        self.lock().rate
    }
}

/// A UDP socket that sends at most at its [`Pace`].
#[derive(Debug)]
pub(crate) struct PacedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    pace: Pace,
}

impl PacedSocket {
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, pace: Pace) -> PacedSocket {
        PacedSocket { inner, pace }
    }
}

impl AsyncUdpSocket for PacedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        let inner = self.inner.clone().create_io_poller();
        Box::pin(PacedPoller { socket: self, inner, timer: Box::pin(tokio::time::sleep(Duration::ZERO)) })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let mut b = self.pace.lock();
        if b.ready_at(Instant::now()).is_some() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.inner.try_send(transmit)?;
        if b.rate.is_some() {
            let segments = transmit.segment_size.map_or(1, |s| transmit.contents.len().div_ceil(s.max(1)));
            b.tokens -= segments as f64;
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// One datagram per send while pacing (each spends a token), else segmentation offload.
    fn max_transmit_segments(&self) -> usize {
        if self.pace.rate().is_some() {
            1
        } else {
            self.inner.max_transmit_segments()
        }
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Writable when the bucket has a token and the socket is writable.
struct PacedPoller {
    socket: Arc<PacedSocket>,
    inner: Pin<Box<dyn UdpPoller>>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl fmt::Debug for PacedPoller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacedPoller").finish_non_exhaustive()
    }
}

impl UdpPoller for PacedPoller {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        loop {
            let Some(at) = self.socket.pace.lock().ready_at(Instant::now()) else { break };
            self.timer.as_mut().reset(at.into());
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll_writable(cx)
    }
}

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
pub(crate) struct Governor {
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
    /// Some acknowledged packet was sent while the application had more to send.
    busy: bool,
    /// Intervals in a row of heavy loss while paced.
    heavy: u32,
    /// Pacing given up until then.
    cooldown: Option<Instant>,
}

impl Judge {
    fn new(now: Instant) -> Judge {
        Judge { start: now, acked: 0, acked_packets: 0, lost: 0, busy: false, heavy: 0, cooldown: None }
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
        if elapsed < INTERVAL || (total < MIN_SAMPLE && elapsed < 8 * INTERVAL) {
            return None;
        }
        let loss = if total == 0 { 0.0 } else { self.lost as f64 / total as f64 };
        let delivered = self.acked_packets as f64 / elapsed.as_secs_f64();
        let busy = self.busy;
        *self = Judge { start: now, heavy: self.heavy, cooldown: self.cooldown, ..Judge::new(now) };
        if total < MIN_SAMPLE {
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
        for _ in 0..acked {
            j.acked(1200, false);
        }
        j.lost += lost * 1200;
        *t += INTERVAL;
        j.tick(*t, rate)
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

    #[test]
    fn pacing_parses_from_the_command_line_words() {
        assert_eq!("adaptive".parse(), Ok(Pacing::Adaptive));
        assert_eq!("off".parse(), Ok(Pacing::Off));
        assert_eq!("25".parse(), Ok(Pacing::Fixed(25)));
        assert!("0".parse::<Pacing>().unwrap_err().contains("packets per second"));
        assert!("fast".parse::<Pacing>().is_err());
    }

    #[test]
    fn the_bucket_spaces_packets_at_its_rate_after_a_burst_of_two() {
        let pace = Pace::new(Some(10.0));
        let now = Instant::now();
        let mut b = pace.lock();
        b.last = now;
        assert_eq!(b.ready_at(now), None);
        b.tokens -= 2.0;
        let at = b.ready_at(now).expect("no token left");
        assert!((at - now).as_secs_f64() > 0.09 && (at - now).as_secs_f64() <= 0.1);
        assert_eq!(b.ready_at(now + Duration::from_millis(100)), None);
    }
}
