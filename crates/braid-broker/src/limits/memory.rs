//! The memory alarm: while resident memory is above `limits.memory_high_watermark`, no
//! publisher is read from, so memory stops growing without a message being dropped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::warn;

/// How often resident memory is measured.
pub const MEMORY_CHECK: Duration = Duration::from_millis(500);

/// The memory alarm: raised while resident memory is above `limits.memory_high_watermark`.
#[derive(Debug, Default)]
pub struct MemoryAlarm {
    /// In bytes; 0: never raised. A reload may change it.
    watermark: AtomicU64,
    raised: AtomicBool,
    cleared: Notify,
}

impl MemoryAlarm {
    /// An alarm for `watermark` bytes (0: never raised).
    pub fn new(watermark: u64) -> MemoryAlarm {
        MemoryAlarm { watermark: AtomicU64::new(watermark), ..Default::default() }
    }

    /// Changes the watermark (a reload); the next measurement applies it.
    pub fn set_watermark(&self, watermark: u64) {
        self.watermark.store(watermark, Ordering::Relaxed);
    }

    /// True while publishers must not be read from.
    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Relaxed)
    }

    /// Raises or clears the alarm for a measurement (logging the change).
    pub fn update(&self, rss: u64) {
        let watermark = self.watermark.load(Ordering::Relaxed);
        let above = watermark > 0 && rss > watermark;
        if above != self.raised.swap(above, Ordering::Relaxed) {
            if above {
                warn!(
                    rss,
                    watermark,
                    "memory alarm: above limits.memory_high_watermark, not reading from publishers"
                );
            } else {
                warn!(rss, watermark, "memory alarm cleared: reading from publishers again");
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

    /// Measures resident memory every [`MEMORY_CHECK`] while a watermark is set, until `stop`
    /// is cancelled.
    pub async fn watch(&self, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(MEMORY_CHECK);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            match self.watermark.load(Ordering::Relaxed) {
                0 => self.update(0),
                _ => {
                    if let Some(rss) = resident_memory() {
                        self.update(rss)
                    }
                }
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
