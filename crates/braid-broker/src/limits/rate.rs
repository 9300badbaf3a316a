//! Token buckets: the connection rate at accept and each client's publish rate. A client over
//! its rate is not read from until it may go on, so TCP flow control slows it down.

use std::time::{Duration, Instant};

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
}
