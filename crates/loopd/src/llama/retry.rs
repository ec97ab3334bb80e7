//! `chat_with_retry`: what is retryable, and the backoff schedule.
//!
//! `Connect`, `StreamClosedEarly`, `Stalled`, `LoadTimeout` and HTTP 503 are retried:
//! `attempts` in all (4), waiting `delays_ms` (2 s, 8 s, 30 s) each varied by up to
//! `jitter_percent` (25%) either way, and no retry is started whose wait would end more than
//! `total_ms` (5 min) after the first attempt began. Every retry goes back through the slot
//! gate (it is a fresh `chat`) and emits `Retrying` first. Everything else returns at once.
//! Retrying is safe because nothing is final before a completion, so a retry sends the same
//! bytes again.

use std::time::Duration;

use crate::clock::{Clock, Jitter};
use crate::config::Retry;

use super::{ChatEvent, ChatRequest, Client, Completion, InferError};

/// Whether `e` is worth another attempt.
pub fn is_retryable(e: &InferError) -> bool {
    matches!(
        e,
        InferError::Connect { .. }
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

/// Runs `attempt` under `schedule`: the retry loop without the client, so it can be tested
/// on a fake clock with a fake jitter source.
pub fn run<T>(
    schedule: &Retry,
    clock: &dyn Clock,
    jitter: &dyn Jitter,
    on_event: &mut dyn FnMut(&ChatEvent),
    mut attempt: impl FnMut(&mut dyn FnMut(&ChatEvent)) -> Result<T, InferError>,
) -> Result<T, InferError> {
    let start = clock.now();
    let total = Duration::from_millis(schedule.total_ms);
    let mut number = 1u32;
    loop {
        let error = match attempt(on_event) {
            Ok(done) => return Ok(done),
            Err(e) => e,
        };
        if !is_retryable(&error) || number >= schedule.attempts {
            return Err(error);
        }
        let wait = delay(schedule, number as usize - 1, jitter);
        if clock.now().saturating_sub(start) + wait > total {
            return Err(error);
        }
        number += 1;
        let after_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        on_event(&ChatEvent::Retrying {
            attempt: number,
            after_ms,
            error: error.to_string(),
        });
        clock.sleep(wait);
    }
}

impl Client {
    /// [`Client::chat`] under the retry schedule of the config; emits `Retrying` before each
    /// retry. Returns the first completion, the first error that is not retryable, or the last
    /// error once attempts or time run out.
    pub fn chat_with_retry(
        &self,
        req: &ChatRequest,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, InferError> {
        run(
            &self.config.retry,
            &*self.clock,
            &*self.jitter,
            on_event,
            |ev| self.chat(req, ev),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{FakeClock, FakeJitter};
    use crate::llama::Silence;

    fn io(kind: std::io::ErrorKind) -> InferError {
        InferError::Connect {
            socket: "/run/infer.sock".into(),
            source: kind.into(),
        }
    }

    /// Runs the default schedule over scripted outcomes; each attempt takes `took` on the clock.
    fn script(
        outcomes: Vec<Result<u32, InferError>>,
        offsets: &[i64],
        took: Duration,
    ) -> (
        Result<u32, InferError>,
        Vec<ChatEvent>,
        Vec<Duration>,
        usize,
    ) {
        let clock = FakeClock::new();
        let jitter = FakeJitter::new(offsets);
        let mut events = Vec::new();
        let mut outcomes = outcomes.into_iter();
        let mut calls = 0;
        let r = run(
            &Retry::default(),
            &clock,
            &jitter,
            &mut |e| events.push(e.clone()),
            |_| {
                calls += 1;
                clock.advance(took);
                outcomes.next().expect("no more attempts scripted")
            },
        );
        (r, events, clock.sleeps(), calls)
    }

    fn retrying(attempt: u32, after_ms: u64, error: &str) -> ChatEvent {
        ChatEvent::Retrying {
            attempt,
            after_ms,
            error: error.into(),
        }
    }

    #[test]
    fn exact_schedule_without_jitter_then_the_last_error() {
        let (r, events, sleeps, calls) = script(
            vec![
                Err(InferError::Stalled(Silence::Liveness)),
                Err(InferError::StreamClosedEarly),
                Err(InferError::LoadTimeout),
                Err(InferError::Http {
                    status: 503,
                    body: "loading".into(),
                }),
            ],
            &[],
            Duration::ZERO,
        );
        assert!(matches!(r, Err(InferError::Http { status: 503, .. })));
        assert_eq!(calls, 4);
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        assert_eq!(sleeps, ms(&[2_000, 8_000, 30_000]));
        assert_eq!(
            events,
            [
                retrying(
                    2,
                    2_000,
                    &InferError::Stalled(Silence::Liveness).to_string()
                ),
                retrying(3, 8_000, &InferError::StreamClosedEarly.to_string()),
                retrying(4, 30_000, &InferError::LoadTimeout.to_string()),
            ]
        );
    }

    #[test]
    fn jitter_is_25_percent_either_way_and_clamped() {
        let (r, events, sleeps, _) = script(
            vec![
                Err(io(std::io::ErrorKind::NotFound)),
                Err(InferError::Stalled(Silence::Liveness)),
                Err(InferError::Stalled(Silence::Liveness)),
                Ok(7),
            ],
            // Exactly -25%, +25%, and one past +25% (clamped to +25%).
            &[-500, 2_000, 7_501],
            Duration::ZERO,
        );
        assert_eq!(r.unwrap(), 7);
        let ms: Vec<u64> = sleeps.iter().map(|d| d.as_millis() as u64).collect();
        assert_eq!(ms, [1_500, 10_000, 37_500]);
        assert!(matches!(
            events[0],
            ChatEvent::Retrying {
                attempt: 2,
                after_ms: 1_500,
                ..
            }
        ));
    }

    #[test]
    fn jitter_is_asked_for_a_quarter_of_each_delay() {
        let clock = FakeClock::new();
        let jitter = FakeJitter::new(&[]);
        let _ = run(
            &Retry::default(),
            &clock,
            &jitter,
            &mut |_| {},
            |_| -> Result<(), _> { Err(InferError::Stalled(Silence::Liveness)) },
        );
        assert_eq!(jitter.spreads(), [500, 2_000, 7_500]);
    }

    #[test]
    fn success_on_a_retry_returns_it() {
        let (r, events, sleeps, calls) = script(
            vec![Err(InferError::Stalled(Silence::Liveness)), Ok(1)],
            &[],
            Duration::ZERO,
        );
        assert_eq!((r.unwrap(), calls), (1, 2));
        assert_eq!(events.len(), 1);
        assert_eq!(sleeps, [Duration::from_secs(2)]);
    }

    #[test]
    fn other_errors_return_at_once() {
        for e in [
            InferError::Busy,
            InferError::WaitTimeout,
            InferError::ThinkingOverrun,
            InferError::Protocol(crate::llama::ProtocolError::Sse(
                sse_nostd::SseError::LineTooLong,
            )),
            InferError::Http {
                status: 400,
                body: "the prompt does not fit".into(),
            },
            InferError::Http {
                status: 500,
                body: String::new(),
            },
        ] {
            let shown = e.to_string();
            let (r, events, sleeps, calls) = script(vec![Err(e)], &[], Duration::ZERO);
            assert_eq!(r.unwrap_err().to_string(), shown);
            assert_eq!((events.len(), sleeps.len(), calls), (0, 0, 1));
        }
    }

    #[test]
    fn never_past_five_minutes_in_total() {
        // Three-minute load waits: 180 s + 2 s fits, but 182 s + 180 s + 8 s does not.
        let (r, events, sleeps, calls) = script(
            vec![Err(InferError::LoadTimeout), Err(InferError::LoadTimeout)],
            &[],
            Duration::from_secs(180),
        );
        assert!(matches!(r, Err(InferError::LoadTimeout)));
        assert_eq!((calls, events.len()), (2, 1));
        assert_eq!(sleeps, [Duration::from_secs(2)]);
    }

    #[test]
    fn a_wait_ending_exactly_at_five_minutes_is_allowed() {
        let schedule = Retry {
            jitter_percent: 0,
            ..Retry::default()
        };
        let clock = FakeClock::new();
        let jitter = FakeJitter::new(&[]);
        let mut calls = 0;
        let r = run(&schedule, &clock, &jitter, &mut |_| {}, |_| {
            calls += 1;
            // 298 s in the first attempt + 2 s wait = exactly 300 s; the next would pass it.
            clock.advance(if calls == 1 {
                Duration::from_secs(298)
            } else {
                Duration::ZERO
            });
            Err::<(), _>(InferError::Stalled(Silence::Liveness))
        });
        assert!(r.is_err());
        assert_eq!(calls, 2);
        assert_eq!(clock.now(), Duration::from_secs(300));
    }
}
