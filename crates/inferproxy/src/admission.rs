//! The decision taken for each accepted connection: forward it or close it at once.
//!
//! Promise: no clock and no sockets in here; the caller passes `now` and the number of
//! connections still open, so every rule is tested exactly.

use core::fmt;
use std::time::Instant;

use crate::bucket::TokenBucket;

/// Connections forwarded at the same time; one more is closed at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Accepts allowed back to back before the rate limit applies.
pub const ACCEPT_BURST: u32 = 10;
/// Accepts allowed per second once the burst is spent.
pub const ACCEPTS_PER_SECOND: u32 = 2;

/// The accept-rate bucket with the limits above.
pub type AcceptBucket = TokenBucket<ACCEPT_BURST, ACCEPTS_PER_SECOND>;

/// Why a connection was closed without being forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// `MAX_CONNECTIONS` were already open.
    Busy,
    /// The accept bucket was empty.
    Rate,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy => write!(f, "{MAX_CONNECTIONS} connections already open"),
            Self::Rate => write!(
                f,
                "accept rate limit (burst {ACCEPT_BURST}, {ACCEPTS_PER_SECOND} per second)"
            ),
        }
    }
}

impl core::error::Error for Refusal {}

/// Holds the accept bucket and applies both limits.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    bucket: AcceptBucket,
}

impl Admission {
    /// A full bucket whose clock starts at `now`.
    pub const fn new(now: Instant) -> Self {
        Self {
            bucket: AcceptBucket::new(now),
        }
    }

    /// Decides for one accepted connection, given how many are open (`open`) before it.
    ///
    /// Every accept spends a token, even one refused as `Busy`: a client that retries in a
    /// tight loop while the proxy is full is slowed down too.
    pub fn admit(&mut self, now: Instant, open: usize) -> Result<(), Refusal> {
        if !self.bucket.try_take(now) {
            return Err(Refusal::Rate);
        }
        if open >= MAX_CONNECTIONS {
            return Err(Refusal::Busy);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn eight_open_admits_none_seven_admits_one() {
        let t0 = Instant::now();
        let mut a = Admission::new(t0);
        assert_eq!(a.admit(t0, MAX_CONNECTIONS - 1), Ok(()));
        assert_eq!(a.admit(t0, MAX_CONNECTIONS), Err(Refusal::Busy));
        assert_eq!(a.admit(t0, MAX_CONNECTIONS + 1), Err(Refusal::Busy));
    }

    #[test]
    fn busy_refusals_spend_tokens() {
        let t0 = Instant::now();
        let mut a = Admission::new(t0);
        for _ in 0..ACCEPT_BURST {
            assert_eq!(a.admit(t0, MAX_CONNECTIONS), Err(Refusal::Busy));
        }
        assert_eq!(a.admit(t0, 0), Err(Refusal::Rate));
        assert_eq!(a.admit(t0 + Duration::from_millis(500), 0), Ok(()));
    }

    #[test]
    fn eleventh_of_a_burst_is_rate_limited() {
        let t0 = Instant::now();
        let mut a = Admission::new(t0);
        for i in 0..ACCEPT_BURST {
            assert_eq!(a.admit(t0 + Duration::from_millis(i.into()), 0), Ok(()));
        }
        assert_eq!(
            a.admit(t0 + Duration::from_millis(10), 0),
            Err(Refusal::Rate)
        );
    }

    #[test]
    fn refusals_name_the_limit() {
        assert_eq!(Refusal::Busy.to_string(), "8 connections already open");
        assert_eq!(
            Refusal::Rate.to_string(),
            "accept rate limit (burst 10, 2 per second)"
        );
    }
}
