//! The workspace's one [`Clock`]: where time comes from for every machine that takes `now`.
//!
//! Only the IO drivers read a clock (loopd's request loops and runner, llama-worker's shell);
//! the machines they drive take `now` as an argument and say when they next need waking.
//! [`SystemClock`] is the operating system's monotonic clock (and its wall clock for the date);
//! [`FakeClock`] moves only when a test tells it to, so timers are tested to the millisecond
//! without sleeping. This crate is the one place in the workspace that reads `Instant::now`
//! and `SystemTime::now` for a machine's time (a test in loopd keeps it so).
//!
//! A blocking wait on a clock (a condition variable with a deadline) computes its deadline
//! from [`Clock::now`] and blocks for at most [`Clock::wait_slice`] of real time before it
//! reads the clock again: all that is left on the system clock, so it wakes exactly as a
//! plain timed wait; a millisecond on a fake clock, so a waiter sees a test move the time.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic time source: a [`Duration`] since some fixed origin, never going backwards.
///
/// Object safe, so a client can hold an `Arc<dyn Clock>`; generic code bounds it with
/// `Clone + 'static` where it needs to (llama-worker's shell).
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Duration;

    /// The wall-clock time: the date a person or a model is told. Never a deadline: it may
    /// jump when the system's date is set.
    fn wall(&self) -> SystemTime;

    /// How long a blocking wait may block in real time while `left` of this clock's time
    /// remains before its deadline; it then reads [`now`](Clock::now) again. All of `left`
    /// by default, which is right for a clock that moves with real time.
    fn wait_slice(&self, left: Duration) -> Duration {
        left
    }
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

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// The longest a blocking wait on a [`FakeClock`] blocks before it looks at the time again.
pub const FAKE_WAIT_SLICE: Duration = Duration::from_millis(1);

/// A clock that moves only when told to; clones share the same time. Its wall time is a
/// fixed date (the Unix epoch unless [`at_wall`](FakeClock::at_wall) says otherwise) plus the
/// time it was moved.
#[derive(Clone, Debug)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
    wall_at_zero: SystemTime,
}

impl Default for FakeClock {
    fn default() -> Self {
        FakeClock {
            nanos: Arc::default(),
            wall_at_zero: UNIX_EPOCH,
        }
    }
}

impl FakeClock {
    /// A fake clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fake clock at zero whose wall time is `wall` now (and moves with it).
    pub fn at_wall(wall: SystemTime) -> Self {
        FakeClock {
            wall_at_zero: wall,
            ..Self::default()
        }
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

    fn wall(&self) -> SystemTime {
        self.wall_at_zero + self.now()
    }

    fn wait_slice(&self, left: Duration) -> Duration {
        left.min(FAKE_WAIT_SLICE)
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
    fn fake_wall_time_is_its_date_plus_the_time_moved_and_waits_are_sliced() {
        let date = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let c = FakeClock::at_wall(date);
        assert_eq!(FakeClock::new().wall(), UNIX_EPOCH);
        assert_eq!(c.wall(), date);
        c.clone().advance(Duration::from_secs(61));
        assert_eq!(c.wall(), date + Duration::from_secs(61));
        assert_eq!(c.wait_slice(Duration::from_secs(60)), FAKE_WAIT_SLICE);
        assert_eq!(c.wait_slice(Duration::ZERO), Duration::ZERO);
        let s = SystemClock::new();
        assert_eq!(
            s.wait_slice(Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        assert!(s.wall() > date);
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
