//! Where the worker's time comes from: the system's monotonic clock, or a fake one in tests.
//!
//! Only the policy's time (deadlines, window, backoff, thresholds) comes from a [`Clock`].
//! Waiting for a killed process to exit and socket timeouts are real time by nature.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic time source: a [`Duration`] since some fixed origin.
pub trait Clock: Clone + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Duration;
}

/// The system's monotonic clock, counted from when it was created.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the time forward by `by`.
    pub fn advance(&self, by: Duration) {
        let n = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_told_and_clones_share() {
        let c = FakeClock::new();
        let d = c.clone();
        assert_eq!(c.now(), Duration::ZERO);
        d.advance(Duration::from_millis(1500));
        assert_eq!(c.now(), Duration::from_millis(1500));
    }
}
