//! The growing pause between attempts, shared by the client's reconnects and Braid's bridges.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The pauses between attempts: `first`, doubling after each up to `max`, each optionally
/// spread by ±25 % ([`Backoff::jittered`]) so that many clients dropped at once do not come
/// back at once.
///
/// ```
/// # use std::time::Duration;
/// let mut backoff = braid_client::Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
/// let pauses: Vec<u128> = (0..4).map(|_| backoff.pause().as_millis()).collect();
/// assert_eq!(pauses, [100, 200, 300, 300]);
/// backoff.reset();
/// assert_eq!(backoff.next(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
    jitter: bool,
}

impl Backoff {
    /// Pauses of `first`, doubling up to `max`, without jitter.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff { first, max, next: first.min(max), jitter: false }
    }

    /// The same pauses, each spread by ±25 %.
    pub fn jittered(self) -> Backoff {
        Backoff { jitter: true, ..self }
    }

    /// The pause [`Backoff::pause`] gives next, before any jitter.
    pub fn next(&self) -> Duration {
        self.next
    }

    /// The next pause is `first` again (the last attempt went well for a while).
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }

    /// The pause to take before the next attempt (jittered if asked); doubles the one after.
    pub fn pause(&mut self) -> Duration {
        let pause = if self.jitter { jitter(self.next) } else { self.next };
        self.next = self.next.saturating_mul(2).min(self.max);
        pause
    }
}

/// `base` ±25 %.
fn jitter(base: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let quarter = base / 4;
    let spread = u64::try_from(quarter.as_nanos()).unwrap_or(u64::MAX).saturating_mul(2);
    let offset = if spread == 0 { 0 } else { random % spread };
    base - quarter + Duration::from_nanos(offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_most_and_start_over_on_reset() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(200), ms(1_000));
        let pauses: Vec<Duration> = (0..5).map(|_| b.pause()).collect();
        assert_eq!(pauses, [ms(200), ms(400), ms(800), ms(1_000), ms(1_000)]);
        assert_eq!(b.next(), ms(1_000));
        b.reset();
        assert_eq!((b.next(), b.pause(), b.next()), (ms(200), ms(200), ms(400)));
        // A first pause above the most is the most.
        assert_eq!(Backoff::new(ms(5_000), ms(1_000)).pause(), ms(1_000));
        // No overflow however long it goes on.
        let mut long = Backoff::new(Duration::MAX / 2, Duration::MAX);
        for _ in 0..4 {
            long.pause();
        }
        assert_eq!(long.next(), Duration::MAX);
    }

    #[test]
    fn jitter_stays_within_a_quarter() {
        for ms in [0u64, 1, 100, 30_000] {
            let base = Duration::from_millis(ms);
            for _ in 0..50 {
                let d = jitter(base);
                assert!(d >= base - base / 4 && d <= base + base / 4, "{d:?} for {base:?}");
            }
        }
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30)).jittered();
        let first = b.pause();
        assert!(first >= Duration::from_millis(75) && first <= Duration::from_millis(125), "{first:?}");
        assert_eq!(b.next(), Duration::from_millis(200), "jitter spreads a pause, not the doubling");
    }
}
