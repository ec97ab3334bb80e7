//! Where the worker's time comes from: the workspace's one clock (crate `clock`), the
//! system's monotonic clock in the daemon and a fake one in tests.
//!
//! Only the policy's time (deadlines, window, backoff, thresholds) comes from a [`Clock`].
//! Waiting for a killed process to exit and socket timeouts are real time by nature.

pub use ::clock::{Clock, FakeClock, SystemClock};

/// The bound the shell puts on its clock: the workspace's [`Clock`], and a copy for each of
/// its threads. Every cloneable clock is one; this names a bound, not a second clock.
pub trait SharedClock: Clock + Clone + 'static {}

impl<T: Clock + Clone + 'static> SharedClock for T {}
