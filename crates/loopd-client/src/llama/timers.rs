//! The two timers of a request that are more than a deadline: the wait for the first byte,
//! which depends on what `/slots` says (design section 4, step 2), and the thinking cap, which
//! counts reasoning tokens (step 4). Both are pure: answers and time in, a verdict out.

use std::time::Duration;

use crate::config::Limits;

use super::{InferError, Silence};

/// What one `/slots` poll said about the request's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotSeen {
    /// The slot is processing a task.
    Busy,
    /// The slot is idle.
    Idle,
    /// `/slots` failed, answered an error (503 while a model loads), or has no such slot.
    Unavailable,
}

/// The first-byte wait as a state machine: each poll's answer and time in, a verdict out.
///
/// A limit is measured from the end of the last poll that saw something else (or from the
/// send, for the first run), so it covers the whole time the slot was seen that way.
#[derive(Debug, Clone)]
pub struct FirstByteWait {
    limits: Limits,
    seen: Option<SlotSeen>,
    since: Duration,
    last: Duration,
}

impl FirstByteWait {
    /// A wait for a request sent at `sent_at`.
    pub fn new(limits: Limits, sent_at: Duration) -> Self {
        FirstByteWait {
            limits,
            seen: None,
            since: sent_at,
            last: sent_at,
        }
    }

    /// Takes one poll's answer at `now`: `Ok` to keep waiting, or the error that ends it.
    pub fn observe(&mut self, seen: SlotSeen, now: Duration) -> Result<(), InferError> {
        if self.seen != Some(seen) {
            self.seen = Some(seen);
            self.since = self.last;
        }
        self.last = now;
        let held = now.saturating_sub(self.since);
        let ms = |v: u64| Duration::from_millis(v);
        match seen {
            SlotSeen::Busy if held >= ms(self.limits.busy_wait_ms) => Err(InferError::WaitTimeout),
            SlotSeen::Unavailable if held >= ms(self.limits.load_wait_ms) => {
                Err(InferError::LoadTimeout)
            }
            SlotSeen::Idle if held >= ms(self.limits.idle_grace_ms) => {
                Err(InferError::Stalled(Silence::IdleGrace))
            }
            _ => Ok(()),
        }
    }
}

/// The wait for a slot that the previous request left abandoned (closed while the server may
/// still have been generating): each `/slots` answer and time in, whether to send.
///
/// A slot seen idle lets the request go; so does a `/slots` that cannot say (the first-byte
/// wait after the send handles a loading server). Busy past `limits.busy_wait_ms` from the
/// start of the wait is `WaitTimeout`.
#[derive(Debug, Clone, Copy)]
pub struct IdleWait {
    busy_wait: Duration,
    since: Duration,
}

impl IdleWait {
    /// A wait that starts at `now`.
    pub fn new(limits: Limits, now: Duration) -> Self {
        IdleWait {
            busy_wait: Duration::from_millis(limits.busy_wait_ms),
            since: now,
        }
    }

    /// Takes one poll's answer at `now`: `Ok(true)` to send, `Ok(false)` to poll again after
    /// `poll_ms`, or `WaitTimeout`.
    pub fn observe(&self, seen: SlotSeen, now: Duration) -> Result<bool, InferError> {
        match seen {
            SlotSeen::Idle | SlotSeen::Unavailable => Ok(true),
            SlotSeen::Busy if now.saturating_sub(self.since) >= self.busy_wait => {
                Err(InferError::WaitTimeout)
            }
            SlotSeen::Busy => Ok(false),
        }
    }
}

/// What the thinking cap asks of the client after a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapAction {
    /// Nothing to do.
    None,
    /// The cap was reached at this many tokens: post `reasoning_end`.
    EndReasoning(u64),
    /// Reasoning went on `thinking_overrun` tokens past the cap.
    Overrun,
}

/// The thinking cap as a state machine over the running reasoning-token count.
#[derive(Debug, Clone, Copy)]
pub struct ThinkingCap {
    cap: u64,
    overrun: u64,
    capped_at: Option<u64>,
}

impl ThinkingCap {
    /// A cap of `cap` tokens with `overrun` tokens of grace after it.
    pub fn new(cap: u64, overrun: u64) -> Self {
        ThinkingCap {
            cap,
            overrun,
            capped_at: None,
        }
    }

    /// Whether `reasoning_end` was asked for.
    pub fn capped(&self) -> bool {
        self.capped_at.is_some()
    }

    /// Takes the reasoning tokens counted so far.
    pub fn check(&mut self, tokens: u64) -> CapAction {
        match self.capped_at {
            None if tokens >= self.cap => {
                self.capped_at = Some(tokens);
                CapAction::EndReasoning(tokens)
            }
            Some(at) if tokens >= at.saturating_add(self.overrun) => CapAction::Overrun,
            _ => CapAction::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            busy_wait_ms: 1_000,
            load_wait_ms: 700,
            idle_grace_ms: 300,
            ..Limits::default()
        }
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn outcome(w: &mut FirstByteWait, seen: SlotSeen, now: u64) -> Option<String> {
        w.observe(seen, at(now)).err().map(|e| e.to_string())
    }

    #[test]
    fn an_abandoned_slot_is_waited_for_while_busy_up_to_busy_wait_ms() {
        let w = IdleWait::new(limits(), at(100));
        assert_eq!(w.observe(SlotSeen::Busy, at(100)).ok(), Some(false));
        assert_eq!(w.observe(SlotSeen::Busy, at(1_099)).ok(), Some(false));
        assert!(matches!(
            w.observe(SlotSeen::Busy, at(1_100)),
            Err(InferError::WaitTimeout)
        ));
        assert_eq!(w.observe(SlotSeen::Idle, at(1_099)).ok(), Some(true));
        assert_eq!(w.observe(SlotSeen::Unavailable, at(100)).ok(), Some(true));
    }

    #[test]
    fn busy_slot_waits_up_to_busy_wait_ms() {
        let mut w = FirstByteWait::new(limits(), at(0));
        for t in [100, 500, 999] {
            assert_eq!(outcome(&mut w, SlotSeen::Busy, t), None);
        }
        assert_eq!(
            outcome(&mut w, SlotSeen::Busy, 1_000),
            Some(InferError::WaitTimeout.to_string())
        );
    }

    #[test]
    fn unavailable_waits_up_to_load_wait_ms() {
        let mut w = FirstByteWait::new(limits(), at(50));
        assert_eq!(outcome(&mut w, SlotSeen::Unavailable, 749), None);
        assert_eq!(
            outcome(&mut w, SlotSeen::Unavailable, 750),
            Some(InferError::LoadTimeout.to_string())
        );
    }

    #[test]
    fn idle_slot_gets_idle_grace_ms() {
        let mut w = FirstByteWait::new(limits(), at(0));
        assert_eq!(outcome(&mut w, SlotSeen::Idle, 299), None);
        assert_eq!(
            outcome(&mut w, SlotSeen::Idle, 300),
            Some(InferError::Stalled(Silence::IdleGrace).to_string())
        );
    }

    #[test]
    fn a_change_restarts_the_clock_from_the_last_poll() {
        let mut w = FirstByteWait::new(limits(), at(0));
        assert_eq!(outcome(&mut w, SlotSeen::Busy, 900), None);
        // Idle since the busy poll at 900: 1150 is 250 ms of idleness, 1200 is 300.
        assert_eq!(outcome(&mut w, SlotSeen::Idle, 1_150), None);
        assert_eq!(
            outcome(&mut w, SlotSeen::Idle, 1_200),
            Some(InferError::Stalled(Silence::IdleGrace).to_string())
        );
        // Loading after busy: the busy time does not count toward the load limit.
        let mut w = FirstByteWait::new(limits(), at(0));
        assert_eq!(outcome(&mut w, SlotSeen::Busy, 990), None);
        assert_eq!(outcome(&mut w, SlotSeen::Unavailable, 1_600), None);
        assert_eq!(
            outcome(&mut w, SlotSeen::Unavailable, 1_690),
            Some(InferError::LoadTimeout.to_string())
        );
    }

    #[test]
    fn thinking_cap_then_overrun_at_exactly_the_limits() {
        let mut c = ThinkingCap::new(4_096, 256);
        assert_eq!(c.check(4_095), CapAction::None);
        assert!(!c.capped());
        assert_eq!(c.check(4_096), CapAction::EndReasoning(4_096));
        assert!(c.capped());
        assert_eq!(c.check(4_351), CapAction::None);
        assert_eq!(c.check(4_352), CapAction::Overrun);
    }

    #[test]
    fn overrun_counts_from_where_the_cap_was_seen() {
        let mut c = ThinkingCap::new(10, 5);
        // A chunk can jump past the cap; the grace starts from the count seen then.
        assert_eq!(c.check(12), CapAction::EndReasoning(12));
        assert_eq!(c.check(16), CapAction::None);
        assert_eq!(c.check(17), CapAction::Overrun);
    }
}
