//! [`Cancel`]: a token that stops a request from another thread (or from its own event callback).
//!
//! The request loop checks the token at least once per `limits.poll_ms` (every read it makes is
//! at most that long), and every wait it does itself (the slot gate, a retry's backoff, a
//! connect) wakes for it, so a cancelled request ends within one poll interval and closes its
//! connection, which makes the server stop generating.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use crate::clock::Clock;

#[derive(Debug, Default)]
struct Flag {
    cancelled: Mutex<bool>,
    woken: Condvar,
    /// Who cancelled, when not the caller (the daemon's shutdown): the result's detail.
    why: OnceLock<&'static str>,
}

/// A cancellation token; clones share one flag.
#[derive(Clone, Default, Debug)]
pub struct Cancel(Arc<Flag>);

impl Cancel {
    /// A token that is not cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    // Setting a bool cannot leave it half-written, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.0.cancelled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cancels every request holding a clone of this token, and wakes their waits.
    pub fn cancel(&self) {
        *self.lock() = true;
        self.0.woken.notify_all();
    }

    /// [`cancel`](Self::cancel), with the detail the request's result gives instead of the
    /// caller's ("loopd serve was stopped"); the first reason given is kept.
    pub fn cancel_because(&self, why: &'static str) {
        let _ = self.0.why.set(why);
        self.cancel();
    }

    /// The reason [`cancel_because`](Self::cancel_because) gave, if any.
    pub fn why(&self) -> Option<&'static str> {
        self.0.why.get().copied()
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        *self.lock()
    }

    /// Sleeps until `d` of `clock`'s time has passed, or until cancelled; true if cancelled.
    pub fn sleep(&self, clock: &dyn Clock, d: Duration) -> bool {
        let until = clock.now().checked_add(d);
        let mut cancelled = self.lock();
        loop {
            if *cancelled {
                return true;
            }
            let left = until.map_or(Duration::MAX, |t| t.saturating_sub(clock.now()));
            if left.is_zero() {
                return false;
            }
            cancelled = self
                .0
                .woken
                .wait_timeout(cancelled, clock.wait_slice(left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, SystemClock};
    use std::time::Instant;

    #[test]
    fn sleep_runs_its_time_unless_cancelled() {
        let c = Cancel::new();
        let clock = SystemClock::new();
        let start = Instant::now();
        assert!(!c.sleep(&clock, Duration::from_millis(20)));
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(!c.is_cancelled());
        c.cancel();
        assert!(c.is_cancelled());
        let start = Instant::now();
        assert!(c.sleep(&clock, Duration::from_secs(60)));
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn cancel_from_another_thread_wakes_a_sleeper_at_once() {
        let c = Cancel::new();
        let other = c.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            (
                other.sleep(&SystemClock::new(), Duration::from_secs(60)),
                start.elapsed(),
            )
        });
        std::thread::sleep(Duration::from_millis(20));
        c.cancel();
        let (cancelled, took) = t.join().unwrap();
        assert!(cancelled);
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_sleep_on_a_fake_clock_ends_when_the_test_moves_the_time() {
        let clock = FakeClock::new();
        let (c, fake) = (Cancel::new(), clock.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || tx.send(c.sleep(&fake, Duration::from_secs(60))));
        // A minute of fake time: real time does not end it.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        clock.advance(Duration::from_millis(59_999));
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        clock.advance(Duration::from_millis(1));
        let cancelled = rx.recv_timeout(Duration::from_secs(5)).expect("woke");
        assert!(!cancelled);
        t.join().unwrap().unwrap();
    }
}
