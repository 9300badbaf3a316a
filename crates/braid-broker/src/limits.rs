//! Overload protection: token buckets (connection rate, per-client publish rate), topic size
//! limits and the memory alarm. None of these drop a client's messages: a client over its
//! rate, or any publisher while memory is above the high-watermark, is simply not read from
//! until it may go on, so TCP flow control slows it down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::warn;

use crate::config::LimitsConfig;

/// A token bucket refilled at `rate` tokens per second, holding at most one second's worth.
/// Taking may overdraw it; the debt says how long to wait.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket for `rate` tokens per second (`rate` > 0).
    pub fn new(rate: f64, now: Instant) -> TokenBucket {
        TokenBucket { rate, tokens: rate, last: now }
    }

    /// Takes `n` tokens at `now`; returns how long to wait before the bucket is out of debt
    /// (zero when it was not overdrawn).
    pub fn take(&mut self, n: f64, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate) - n;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }
}

/// A client's publish rate: messages and bytes per second.
#[derive(Debug, Clone, Default)]
pub struct PublishLimiter {
    messages: Option<TokenBucket>,
    bytes: Option<TokenBucket>,
}

impl PublishLimiter {
    /// Buckets for the configured rates (none when both are 0).
    pub fn new(cfg: &LimitsConfig, now: Instant) -> PublishLimiter {
        let bucket = |rate: f64| (rate > 0.0).then(|| TokenBucket::new(rate, now));
        PublishLimiter {
            messages: bucket(f64::from(cfg.publish_rate)),
            bytes: bucket(cfg.publish_bytes_rate as f64),
        }
    }

    /// Counts one PUBLISH of `bytes`; returns until when the client must not be read from.
    pub fn on_publish(&mut self, bytes: usize, now: Instant) -> Option<Instant> {
        if self.messages.is_none() && self.bytes.is_none() {
            return None;
        }
        let m = self.messages.as_mut().map_or(Duration::ZERO, |b| b.take(1.0, now));
        let b = self.bytes.as_mut().map_or(Duration::ZERO, |b| b.take(bytes as f64, now));
        let wait = m.max(b);
        (!wait.is_zero()).then(|| now + wait)
    }
}

/// Why a topic name or filter is refused, if it is.
pub fn topic_too_big(cfg: &LimitsConfig, topic: &str) -> Option<&'static str> {
    if topic.len() > cfg.max_topic_length {
        Some("topic longer than limits.max_topic_length")
    } else if topic.bytes().filter(|&b| b == b'/').count() >= cfg.max_topic_levels {
        Some("topic with more levels than limits.max_topic_levels")
    } else {
        None
    }
}

/// How often resident memory is measured.
pub const MEMORY_CHECK: Duration = Duration::from_millis(500);

/// The memory alarm: raised while resident memory is above `limits.memory_high_watermark`.
#[derive(Debug, Default)]
pub struct MemoryAlarm {
    watermark: u64,
    raised: AtomicBool,
    cleared: Notify,
}

impl MemoryAlarm {
    /// An alarm for `watermark` bytes (0: never raised).
    pub fn new(watermark: u64) -> MemoryAlarm {
        MemoryAlarm { watermark, ..Default::default() }
    }

    /// True while publishers must not be read from.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Relaxed)
    }

    /// Raises or clears the alarm for a measurement (logging the change).
    pub fn update(&self, rss: u64) {
        let above = self.watermark > 0 && rss > self.watermark;
        if above != self.raised.swap(above, Ordering::Relaxed) {
            if above {
                warn!(
                    rss,
                    watermark = self.watermark,
                    "memory alarm: above limits.memory_high_watermark, not reading from publishers"
                );
            } else {
                warn!(rss, watermark = self.watermark, "memory alarm cleared: reading from publishers again");
                self.cleared.notify_waiters();
            }
        }
    }

    /// Waits until the alarm is not raised.
    pub async fn wait_cleared(&self) {
        loop {
            let cleared = self.cleared.notified();
            if !self.is_raised() {
                return;
            }
            cleared.await;
        }
    }

    /// Measures resident memory every [`MEMORY_CHECK`] until `stop` is cancelled (returns at
    /// once when the alarm is off).
    pub async fn watch(&self, stop: tokio_util::sync::CancellationToken) {
        if self.watermark == 0 {
            return;
        }
        let mut tick = tokio::time::interval(MEMORY_CHECK);
        loop {
            tokio::select! {
                _ = tick.tick() => if let Some(rss) = resident_memory() { self.update(rss) },
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// This process's resident set size in bytes (Linux `/proc/self/status`, `VmRSS`).
pub fn resident_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_a_second_of_burst_then_paces() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, t0);
        for _ in 0..10 {
            assert_eq!(b.take(1.0, t0), Duration::ZERO);
        }
        let wait = b.take(1.0, t0);
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // After waiting, the debt is paid.
        assert_eq!(b.take(0.0, t0 + wait), Duration::ZERO);
        // Idle time refills at most one second's worth.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(b.take(1.0, later), Duration::ZERO);
        }
        assert!(b.take(1.0, later) > Duration::ZERO);
    }

    #[test]
    fn limiter_uses_the_stricter_bucket() {
        let t0 = Instant::now();
        let cfg = LimitsConfig { publish_rate: 1000, publish_bytes_rate: 100, ..Default::default() };
        let mut l = PublishLimiter::new(&cfg, t0);
        assert_eq!(l.on_publish(100, t0), None);
        let until = l.on_publish(50, t0).unwrap();
        assert_eq!(until - t0, Duration::from_millis(500));
        assert_eq!(PublishLimiter::new(&LimitsConfig::default(), t0).on_publish(1 << 30, t0), None);
    }

    #[test]
    fn topic_limits() {
        let cfg = LimitsConfig { max_topic_length: 10, max_topic_levels: 3, ..Default::default() };
        assert_eq!(topic_too_big(&cfg, "a/b/c"), None);
        assert!(topic_too_big(&cfg, "a/b/c/d").is_some());
        assert!(topic_too_big(&cfg, "abcdefghijk").is_some());
    }

    #[test]
    fn alarm_raises_and_clears() {
        let alarm = MemoryAlarm::new(1000);
        alarm.update(999);
        assert!(!alarm.is_raised());
        alarm.update(1001);
        assert!(alarm.is_raised());
        alarm.update(10);
        assert!(!alarm.is_raised());
        let off = MemoryAlarm::new(0);
        off.update(u64::MAX);
        assert!(!off.is_raised());
        assert!(resident_memory().unwrap() > 0);
    }
}
