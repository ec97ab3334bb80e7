//! Cache loss: did this request reuse the KV cache the previous one left behind?

use crate::Timings;

/// How many tokens `current.cache_n` may fall short of the previous total before it is a loss.
///
/// The server re-evaluates a few trailing tokens even on a perfect hit (the last
/// generated tokens are re-tokenised with the chat template), so an exact match is not required.
pub const CACHE_LOSS_TOLERANCE: u64 = 64;

/// The result of [`cache_outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// `current.cache_n` is within [`CACHE_LOSS_TOLERANCE`] of the previous total (or above it).
    Hit,
    /// More than [`CACHE_LOSS_TOLERANCE`] tokens short.
    Loss {
        /// The previous request's `cache_n + prompt_n + predicted_n`.
        expected: u64,
        /// The current request's `cache_n`.
        cached: u64,
    },
}

/// Compares `current.cache_n` with the previous request's total (`cache_n + prompt_n +
/// predicted_n`): more than [`CACHE_LOSS_TOLERANCE`] tokens short is a loss, reported with both.
///
/// ```
/// use llama_proto::{cache_outcome, CacheOutcome, Timings};
/// let prev = Timings { cache_n: 0, prompt_n: 900, predicted_n: 100 };
/// assert_eq!(cache_outcome(&prev, &Timings { cache_n: 936, prompt_n: 20, predicted_n: 5 }), CacheOutcome::Hit);
/// assert_eq!(
///     cache_outcome(&prev, &Timings { cache_n: 935, prompt_n: 20, predicted_n: 5 }),
///     CacheOutcome::Loss { expected: 1000, cached: 935 }
/// );
/// ```
pub fn cache_outcome(previous: &Timings, current: &Timings) -> CacheOutcome {
    let expected = previous.total();
    let cached = current.cache_n;
    if expected.saturating_sub(cached) > CACHE_LOSS_TOLERANCE {
        CacheOutcome::Loss { expected, cached }
    } else {
        CacheOutcome::Hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(cache_n: u64, prompt_n: u64, predicted_n: u64) -> Timings {
        Timings {
            cache_n,
            prompt_n,
            predicted_n,
        }
    }

    #[test]
    fn exactly_tolerance_short_is_a_hit() {
        assert_eq!(
            cache_outcome(&t(100, 200, 50), &t(286, 10, 1)),
            CacheOutcome::Hit
        );
    }

    #[test]
    fn one_past_tolerance_is_a_loss_with_both_numbers() {
        assert_eq!(
            cache_outcome(&t(100, 200, 50), &t(285, 10, 1)),
            CacheOutcome::Loss {
                expected: 350,
                cached: 285
            }
        );
    }

    #[test]
    fn more_than_expected_is_a_hit() {
        assert_eq!(
            cache_outcome(&t(0, 10, 10), &t(5000, 1, 1)),
            CacheOutcome::Hit
        );
    }

    #[test]
    fn first_request_with_nothing_cached_is_a_loss() {
        assert_eq!(
            cache_outcome(&t(0, 1000, 0), &t(0, 1100, 0)),
            CacheOutcome::Loss {
                expected: 1000,
                cached: 0
            }
        );
    }

    #[test]
    fn saturating_total_does_not_overflow() {
        assert_eq!(
            cache_outcome(&t(u64::MAX, 1, 1), &t(0, 0, 0)),
            CacheOutcome::Loss {
                expected: u64::MAX,
                cached: 0
            }
        );
    }
}
