//! What is retryable, and the backoff schedule ([`RetrySchedule`], which
//! [`ChatCall`](super::ChatCall) consults after each failed attempt).
//!
//! `Connect` (and a connect or head past its deadline), `StreamClosedEarly`, `Stalled`,
//! `LoadTimeout` and HTTP 503 are retried:
//! `attempts` in all (4), waiting `delays_ms` (2 s, 8 s, 30 s) each varied by up to
//! `jitter_percent` (25%) either way, and no retry is started whose wait would end more than
//! `total_ms` (5 min) after the first attempt began; a retry's wait for its first byte also
//! ends there (`TimedOut(RetryTotal)`). Every retry goes back through the slot gate (it is a
//! fresh attempt) and emits `Retrying` first. Everything else returns at once.
//! [`RetrySchedule`] decides; the call waits for the time it names.
//! Retrying is safe because nothing is final before a completion, so a retry sends the same
//! bytes again.

use std::time::Duration;

use crate::clock::Jitter;
use crate::config::Retry;

use super::{Deadline, InferError};

/// Whether `e` is worth another attempt.
pub fn is_retryable(e: &InferError) -> bool {
    matches!(
        e,
        InferError::Connect { .. }
            | InferError::TimedOut(Deadline::Connect | Deadline::Call)
            | InferError::StreamClosedEarly
            | InferError::Stalled(_)
            | InferError::LoadTimeout
            | InferError::Http { status: 503, .. }
    )
}

/// The wait before retry number `retry` (0 for the first): the scheduled delay plus the
/// jitter source's offset, clamped to `jitter_percent` of the delay either way.
pub fn delay(schedule: &Retry, retry: usize, jitter: &dyn Jitter) -> Duration {
    let base = schedule.delays_ms.get(retry).copied().unwrap_or(0);
    let spread = base.saturating_mul(schedule.jitter_percent.min(100)) / 100;
    let offset = jitter.offset_ms(spread);
    let ms = if offset < 0 {
        base.saturating_sub(offset.unsigned_abs().min(spread))
    } else {
        base.saturating_add(offset.unsigned_abs().min(spread))
    };
    Duration::from_millis(ms)
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start attempt number `attempt` at `at` (on the schedule's clock), `after_ms` from now.
    RetryAt {
        /// The attempt about to start (2 for the first retry).
        attempt: u32,
        /// When it starts.
        at: Duration,
        /// The wait before it, jitter included.
        after_ms: u64,
    },
    /// Return the error.
    GiveUp,
}

/// The retry schedule of one request as a pure state machine: failures and time in, a
/// [`Decision`] out. It never sleeps; the caller waits until `at`.
#[derive(Debug, Clone)]
pub struct RetrySchedule {
    retry: Retry,
    start: Duration,
    attempt: u32,
}

impl RetrySchedule {
    /// The schedule of a request whose first attempt starts at `start`.
    pub fn new(retry: &Retry, start: Duration) -> Self {
        RetrySchedule {
            retry: retry.clone(),
            start,
            attempt: 1,
        }
    }

    /// The attempt running now (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the running attempt must stop waiting for its first byte: `None` for the first
    /// attempt (its own limits apply), the end of `total_ms` for a retry, so no retry starts
    /// waiting past the budget. A stream that is producing bytes is never cut by it.
    pub fn first_byte_deadline(&self) -> Option<Duration> {
        (self.attempt > 1).then(|| self.start + Duration::from_millis(self.retry.total_ms))
    }

    /// The running attempt failed with `error` at `now`: retry at a time, or give up. A retry
    /// whose wait would end past `total_ms` is not started.
    pub fn on_failure(
        &mut self,
        now: Duration,
        error: &InferError,
        jitter: &dyn Jitter,
    ) -> Decision {
        if !is_retryable(error) || self.attempt >= self.retry.attempts {
            return Decision::GiveUp;
        }
        let wait = delay(&self.retry, self.attempt as usize - 1, jitter);
        let at = now + wait;
        if at.saturating_sub(self.start) > Duration::from_millis(self.retry.total_ms) {
            return Decision::GiveUp;
        }
        self.attempt += 1;
        Decision::RetryAt {
            attempt: self.attempt,
            at,
            after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeJitter;
    use crate::llama::{ProtocolError, Silence};

    fn io(kind: std::io::ErrorKind) -> InferError {
        InferError::Connect {
            socket: "/run/infer.sock".into(),
            source: kind.into(),
        }
    }

    fn s(v: u64) -> Duration {
        Duration::from_secs(v)
    }

    /// The default schedule over failures, each attempt taking `took`; the waits it asked for,
    /// and the attempts it made.
    fn script(errors: &[InferError], offsets: &[i64], took: Duration) -> (Vec<Decision>, u32) {
        let jitter = FakeJitter::new(offsets);
        let mut schedule = RetrySchedule::new(&Retry::default(), Duration::ZERO);
        let mut now = Duration::ZERO;
        let mut decisions = Vec::new();
        for e in errors {
            now += took;
            let d = schedule.on_failure(now, e, &jitter);
            decisions.push(d);
            match d {
                Decision::RetryAt { at, .. } => now = at,
                Decision::GiveUp => break,
            }
        }
        (decisions, schedule.attempt())
    }

    fn retry_at(attempt: u32, at_ms: u64, after_ms: u64) -> Decision {
        Decision::RetryAt {
            attempt,
            at: Duration::from_millis(at_ms),
            after_ms,
        }
    }

    #[test]
    fn exact_schedule_without_jitter_then_give_up() {
        let (decisions, attempts) = script(
            &[
                InferError::Stalled(Silence::Liveness),
                InferError::StreamClosedEarly,
                InferError::LoadTimeout,
                InferError::Http {
                    status: 503,
                    body: "loading".into(),
                },
            ],
            &[],
            Duration::ZERO,
        );
        assert_eq!(
            decisions,
            [
                retry_at(2, 2_000, 2_000),
                retry_at(3, 10_000, 8_000),
                retry_at(4, 40_000, 30_000),
                Decision::GiveUp
            ]
        );
        assert_eq!(attempts, 4);
    }

    #[test]
    fn jitter_is_25_percent_either_way_and_clamped() {
        let (decisions, _) = script(
            &[
                io(std::io::ErrorKind::NotFound),
                InferError::TimedOut(Deadline::Connect),
                InferError::TimedOut(Deadline::Call),
            ],
            // Exactly -25%, +25%, and one past +25% (clamped to +25%).
            &[-500, 2_000, 7_501],
            Duration::ZERO,
        );
        assert_eq!(
            decisions,
            [
                retry_at(2, 1_500, 1_500),
                retry_at(3, 11_500, 10_000),
                retry_at(4, 49_000, 37_500)
            ]
        );
    }

    #[test]
    fn jitter_is_asked_for_a_quarter_of_each_delay() {
        let jitter = FakeJitter::new(&[]);
        let mut schedule = RetrySchedule::new(&Retry::default(), Duration::ZERO);
        for _ in 0..4 {
            schedule.on_failure(
                Duration::ZERO,
                &InferError::Stalled(Silence::Liveness),
                &jitter,
            );
        }
        assert_eq!(jitter.spreads(), [500, 2_000, 7_500]);
    }

    #[test]
    fn other_errors_give_up_at_once() {
        for e in [
            InferError::Busy,
            InferError::WaitTimeout,
            InferError::ThinkingOverrun,
            InferError::Cancelled,
            InferError::TimedOut(Deadline::RetryTotal),
            InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Sse(
                sse_nostd::SseError::LineTooLong,
            ))),
            InferError::Http {
                status: 400,
                body: "the prompt does not fit".into(),
            },
            InferError::Http {
                status: 500,
                body: String::new(),
            },
        ] {
            let (decisions, attempts) = script(&[e], &[], Duration::ZERO);
            assert_eq!((decisions, attempts), (vec![Decision::GiveUp], 1));
        }
    }

    #[test]
    fn never_past_five_minutes_in_total() {
        // Three-minute load waits: 180 s + 2 s fits, but 182 s + 180 s + 8 s does not.
        let (decisions, attempts) = script(
            &[InferError::LoadTimeout, InferError::LoadTimeout],
            &[],
            s(180),
        );
        assert_eq!(decisions, [retry_at(2, 182_000, 2_000), Decision::GiveUp]);
        assert_eq!(attempts, 2);
    }

    #[test]
    fn a_wait_ending_exactly_at_five_minutes_is_allowed() {
        let retry = Retry {
            jitter_percent: 0,
            ..Retry::default()
        };
        let jitter = FakeJitter::new(&[]);
        let mut schedule = RetrySchedule::new(&retry, Duration::ZERO);
        let e = InferError::Stalled(Silence::Liveness);
        // 298 s in the first attempt + 2 s wait = exactly 300 s.
        assert_eq!(
            schedule.on_failure(s(298), &e, &jitter),
            retry_at(2, 300_000, 2_000)
        );
        // One millisecond later it would pass it.
        let mut schedule = RetrySchedule::new(&retry, Duration::ZERO);
        let late = s(298) + Duration::from_millis(1);
        assert_eq!(schedule.on_failure(late, &e, &jitter), Decision::GiveUp);
    }

    #[test]
    fn only_a_retry_has_its_first_byte_wait_clipped_to_the_budget() {
        let jitter = FakeJitter::new(&[]);
        let mut schedule = RetrySchedule::new(&Retry::default(), s(7));
        assert_eq!(schedule.first_byte_deadline(), None);
        schedule.on_failure(s(8), &InferError::StreamClosedEarly, &jitter);
        assert_eq!(schedule.first_byte_deadline(), Some(s(307)));
    }
}
