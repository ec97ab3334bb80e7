//! Time and randomness, passed in from outside so timers and retries are testable.
//!
//! [`SystemClock`] and [`SystemJitter`] are the real ones; [`FakeClock`] and [`FakeJitter`]
//! let a test drive time and the retry schedule exactly. The clock is the workspace's one
//! (crate `clock`, which llama-worker takes too); jitter is loopd's own. A clock only tells
//! the time: waiting is the caller's (on a cancel token, so a cancel ends it).

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

pub use ::clock::{Clock, FakeClock, SystemClock};

/// A source of jitter for the retry waits.
pub trait Jitter: Send + Sync {
    /// An offset in milliseconds in `-spread_ms..=spread_ms`. Callers clamp what they get.
    fn offset_ms(&self, spread_ms: u64) -> i64;
}

/// Uniform jitter from std's randomly keyed SipHash over a counter (no extra dependency;
/// jitter only has to spread retries apart, not be unpredictable).
#[derive(Debug)]
pub struct SystemJitter {
    keys: RandomState,
    counter: AtomicU64,
}

impl SystemJitter {
    /// A source keyed afresh from the OS.
    pub fn new() -> Self {
        SystemJitter {
            keys: RandomState::new(),
            counter: AtomicU64::new(0),
        }
    }
}

impl Default for SystemJitter {
    fn default() -> Self {
        Self::new()
    }
}

impl Jitter for SystemJitter {
    fn offset_ms(&self, spread_ms: u64) -> i64 {
        let mut h = self.keys.build_hasher();
        h.write_u64(self.counter.fetch_add(1, Ordering::Relaxed));
        let width = spread_ms.saturating_mul(2).saturating_add(1);
        let spread = i64::try_from(spread_ms).unwrap_or(i64::MAX);
        i64::try_from(h.finish() % width).unwrap_or(0) - spread
    }
}

/// Jitter that hands out scripted offsets in order (0 once they run out), and records the
/// spreads it was asked for.
#[derive(Debug, Default)]
pub struct FakeJitter {
    state: Mutex<(VecDeque<i64>, Vec<u64>)>,
}

impl FakeJitter {
    /// Jitter that answers `offsets` in order.
    pub fn new(offsets: &[i64]) -> Self {
        FakeJitter {
            state: Mutex::new((offsets.iter().copied().collect(), Vec::new())),
        }
    }
    /// The `spread_ms` of every call so far.
    pub fn spreads(&self) -> Vec<u64> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }
}

impl Jitter for FakeJitter {
    fn offset_ms(&self, spread_ms: u64) -> i64 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1.push(spread_ms);
        s.0.pop_front().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_jitter_stays_within_the_spread() {
        let j = SystemJitter::new();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2_000 {
            let o = j.offset_ms(3);
            assert!((-3..=3).contains(&o), "{o}");
            seen.insert(o);
        }
        assert_eq!(seen.len(), 7, "every offset in the range comes up");
        assert_eq!(j.offset_ms(0), 0);
        assert!((-i64::MAX..=i64::MAX).contains(&j.offset_ms(u64::MAX)));
    }

    #[test]
    fn fake_jitter_answers_in_order_then_zero() {
        let j = FakeJitter::new(&[-5, 7]);
        assert_eq!(
            [j.offset_ms(10), j.offset_ms(20), j.offset_ms(30)],
            [-5, 7, 0]
        );
        assert_eq!(j.spreads(), [10, 20, 30]);
    }
}
