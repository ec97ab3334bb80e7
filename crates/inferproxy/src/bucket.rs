//! A token bucket driven by the caller's clock.
//!
//! Promise: `try_take` never reads a clock; the same sequence of `now` values always gives the
//! same answers, so the bucket is tested on a fake clock. Arithmetic is in whole nanoseconds, so
//! there is no rounding drift and no float.

use std::time::{Duration, Instant};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// Holds at most `BURST` tokens and gains `PER_SECOND` tokens a second, continuously.
///
/// A full token is needed to take one; a fraction accrues and is kept. The bucket starts full.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket<const BURST: u32, const PER_SECOND: u32> {
    /// Stored credit, measured as the time it took to earn it; at most `BURST` tokens' worth.
    credit: Duration,
    /// The last `now` seen; credit is earned from here on.
    last: Instant,
}

impl<const BURST: u32, const PER_SECOND: u32> TokenBucket<BURST, PER_SECOND> {
    /// Time to earn one token.
    pub const TOKEN: Duration = Duration::from_nanos(NANOS_PER_SECOND / PER_SECOND as u64);
    /// Credit of a full bucket.
    pub const FULL: Duration = Duration::from_nanos(Self::TOKEN.as_nanos() as u64 * BURST as u64);

    /// A full bucket whose clock starts at `now`.
    pub const fn new(now: Instant) -> Self {
        // Rejected at compile time for any instance: a zero rate would divide by zero above.
        const { assert!(PER_SECOND > 0 && BURST > 0) };
        Self {
            credit: Self::FULL,
            last: now,
        }
    }

    /// Takes one token if a whole one is there at `now`; `false` leaves the bucket unchanged
    /// apart from the credit earned up to `now`.
    ///
    /// A `now` earlier than the last one earns nothing (the clock never runs backwards here).
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        match self.credit.checked_sub(Self::TOKEN) {
            Some(rest) => {
                self.credit = rest;
                true
            }
            None => false,
        }
    }

    /// Whole tokens available at `now` (earned credit is kept, nothing is taken).
    pub fn available(&mut self, now: Instant) -> u32 {
        self.refill(now);
        (self.credit.as_nanos() / Self::TOKEN.as_nanos()) as u32
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.saturating_duration_since(self.last);
        self.credit = self.credit.saturating_add(earned).min(Self::FULL);
        if now > self.last {
            self.last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Bucket = TokenBucket<10, 2>;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn starts_full_and_gives_exactly_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        assert_eq!(b.available(t0), 10);
        for i in 0..10 {
            assert!(b.try_take(t0), "token {i} of the burst");
        }
        assert!(!b.try_take(t0), "the 11th at the same instant");
        assert_eq!(b.available(t0), 0);
    }

    #[test]
    fn refills_one_token_per_half_second() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        while b.try_take(t0) {}
        assert!(
            !b.try_take(t0 + ms(499)),
            "one nanosecond-ish short of a token"
        );
        assert!(b.try_take(t0 + ms(500)), "a whole token at 500 ms");
        assert!(!b.try_take(t0 + ms(500)));
        assert!(!b.try_take(t0 + ms(999)));
        assert!(b.try_take(t0 + ms(1000)));
    }

    #[test]
    fn fractions_are_kept_across_refusals() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        while b.try_take(t0) {}
        // Polling often must not lose the partial credit.
        for step in 1..50 {
            assert!(!b.try_take(t0 + ms(step * 10)), "at {} ms", step * 10);
        }
        assert!(b.try_take(t0 + ms(500)));
    }

    #[test]
    fn credit_is_capped_at_burst() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        b.try_take(t0);
        // An hour idle still gives exactly 10, not 7200.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(b.available(later), 10);
        for _ in 0..10 {
            assert!(b.try_take(later));
        }
        assert!(!b.try_take(later));
    }

    #[test]
    fn two_per_second_over_ten_seconds() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        while b.try_take(t0) {}
        // Ask every 10 ms for 10 s: exactly 20 tokens, the limit being the rate.
        let taken = (1..=1000).filter(|i| b.try_take(t0 + ms(i * 10))).count();
        assert_eq!(taken, 20);
    }

    #[test]
    fn clock_going_backwards_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = Bucket::new(t0);
        while b.try_take(t0) {}
        assert!(!b.try_take(t0 - Duration::from_secs(5)));
        // Earlier readings did not move the reference point back.
        assert!(!b.try_take(t0 + ms(499)));
        assert!(b.try_take(t0 + ms(500)));
    }

    #[test]
    fn constants() {
        assert_eq!(Bucket::TOKEN, ms(500));
        assert_eq!(Bucket::FULL, Duration::from_secs(5));
    }
}
