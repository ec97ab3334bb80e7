//! The workspace's one [`Clock`]: where time comes from for every machine that takes `now`.
//!
//! Only the IO drivers read a clock (loopd's request loops and runner, llama-worker's shell);
//! the machines they drive take `now` as an argument and say when they next need waking.
//! [`SystemClock`] is the operating system's monotonic clock; [`FakeClock`] moves only when a
//! test tells it to, so timers are tested to the millisecond without sleeping. This crate is
//! the one place in the workspace that reads `Instant::now` for a machine's time (a test in
//! loopd keeps it so).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A monotonic time source: a [`Duration`] since some fixed origin, never going backwards.
///
/// Object safe, so a client can hold an `Arc<dyn Clock>`; generic code bounds it with
/// `Clone + 'static` where it needs to (llama-worker's shell).
pub trait Clock: Send + Sync {
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

    /// Moves the time forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let n = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                Some(v.saturating_add(n))
            });
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
        d.advance(Duration::from_millis(5));
        d.advance(Duration::from_secs(2));
        assert_eq!(c.now(), Duration::from_millis(2_005));
        c.advance(Duration::MAX);
        assert_eq!(c.now(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn system_clock_is_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.now() >= a + Duration::from_millis(2));
    }

    #[test]
    fn a_clock_is_object_safe() {
        let c: Arc<dyn Clock> = Arc::new(FakeClock::new());
        assert_eq!(c.now(), Duration::ZERO);
    }
}
