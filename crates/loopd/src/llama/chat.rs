//! One request from the slot gate to the completion (design section 4).
//!
//! 1. The slot gate ([`super::gate`]).
//! 2. Send, then wait for the first byte: reads time out every `poll_ms`; each time, `/slots`
//!    is asked on a second connection and `Waiting` is emitted. A slot busy for
//!    `busy_wait_ms` is `WaitTimeout`; `/slots` failing or answering 503 for `load_wait_ms`
//!    is `LoadTimeout`; an idle slot with no byte for `idle_grace_ms` is `Stalled`
//!    ([`FirstByteWait`]).
//! 3. After the first byte the read timeout is `liveness_ms`; any byte counts (comments,
//!    progress, deltas). Silence past it is `Stalled`. There is no total deadline.
//! 4. At `thinking_cap` reasoning tokens, `reasoning_end` is posted on a second connection and
//!    `ThinkingCapped` emitted; reasoning that goes on for `thinking_overrun` more tokens, or a
//!    control call not answered `success: true`, closes the stream: `ThinkingOverrun`
//!    ([`ThinkingCap`]).
//! 5. The chunk with `finish_reason` makes the completion; a stream ending without it is
//!    `StreamClosedEarly`.
//!
//! Everything runs on the caller's thread; the second connections are made in between reads.

use std::time::Duration;

use serde::Deserialize;

use crate::clock::Clock;
use crate::config::{Config, Limits};
use crate::http::{self, ReadError, Response};
use crate::sse::{EventStream, Item};

use super::assemble::{Buffers, Folder, Step};
use super::{info, request, ChatEvent, ChatRequest, Client, Completion, InferError, Silence};

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

impl Client {
    /// Runs one request: through the slot gate, sent, streamed, and assembled. Events are
    /// emitted as they happen; nothing is final before the returned [`Completion`].
    pub fn chat(
        &self,
        req: &ChatRequest,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, InferError> {
        let _permit = self.gate.acquire(req.slot, on_event)?;
        let body = request::render(&self.config, req);
        let mut buffers = Buffers::new();
        stream(
            &self.config,
            &*self.clock,
            req.slot,
            &body,
            &mut buffers,
            on_event,
        )
    }
}

/// Sends `body` and streams the answer, with the waits, liveness and thinking cap.
pub fn stream(
    config: &Config,
    clock: &dyn Clock,
    slot: u32,
    body: &[u8],
    buffers: &mut Buffers,
    on_event: &mut dyn FnMut(&ChatEvent),
) -> Result<Completion, InferError> {
    let limits = config.limits;
    let ms = Duration::from_millis;
    let mut resp = http::request(&config.socket, "POST", "/v1/chat/completions", Some(body))?;
    resp.set_timeout(Some(ms(limits.poll_ms)))
        .map_err(|source| InferError::Connect {
            socket: config.socket.clone(),
            source,
        })?;
    resp.set_timeout_after_first_byte(ms(limits.liveness_ms));
    let mut wait = FirstByteWait::new(limits, clock.now());
    let status = loop {
        match resp.head() {
            Ok(status) => break status,
            Err(ReadError::Timeout) if resp.received() == 0 => {
                let seen = poll_slot(config, slot);
                on_event(&ChatEvent::Waiting {
                    slot_busy: seen == SlotSeen::Busy,
                });
                wait.observe(seen, clock.now())?;
            }
            Err(e) => return Err(e.into_infer()),
        }
    };
    if status != 200 {
        return Err(resp.into_http_error());
    }
    let mut folder = buffers.folder();
    let mut cap = ThinkingCap::new(limits.thinking_cap, limits.thinking_overrun);
    let read = read_events(config, &mut resp, &mut folder, &mut cap, on_event);
    // Dropping the response closes the connection, which cancels generation on any error.
    drop(resp);
    match read {
        Ok(()) => folder.completion(cap.capped()),
        // The final chunk came and then the connection broke: the message is complete.
        Err(InferError::StreamClosedEarly) if folder.is_finished() => {
            folder.completion(cap.capped())
        }
        Err(e) => Err(e),
    }
}

/// Reads the event stream until `[DONE]` or the end of the body.
fn read_events(
    config: &Config,
    resp: &mut Response,
    folder: &mut Folder<'_>,
    cap: &mut ThinkingCap,
    on_event: &mut dyn FnMut(&ChatEvent),
) -> Result<(), InferError> {
    let mut events = EventStream::new();
    let mut done = false;
    while !done {
        let Some(piece) = resp.next_body().map_err(ReadError::into_infer)? else {
            return events.finish();
        };
        events.feed(piece, &mut |item| -> Result<(), InferError> {
            match item {
                _ if done => Ok(()),
                Item::Data(data) => {
                    let step = folder.push(data, &mut |e| on_event(&e))?;
                    match cap.check(folder.reasoning_tokens()) {
                        CapAction::None => {}
                        CapAction::Overrun => return Err(InferError::ThinkingOverrun),
                        CapAction::EndReasoning(tokens) => {
                            let id = folder.id().unwrap_or_default();
                            if !end_reasoning(config, id) {
                                return Err(InferError::ThinkingOverrun);
                            }
                            on_event(&ChatEvent::ThinkingCapped { tokens });
                        }
                    }
                    // Nothing may follow the final chunk but `[DONE]`; stop reading here.
                    done = step == Step::Finished;
                    Ok(())
                }
                Item::Error(data) => Err(folder.error_event(data)),
                Item::Done => {
                    done = true;
                    Ok(())
                }
                Item::Other => Ok(()),
            }
        })?;
    }
    Ok(())
}

/// Asks `/slots` about `slot` on a second connection, waiting at most `poll_ms` per read.
fn poll_slot(config: &Config, slot: u32) -> SlotSeen {
    let timeout = Duration::from_millis(config.limits.poll_ms);
    match info::slots(&config.socket, &config.model, timeout) {
        Ok(slots) => match slots.iter().find(|s| s.id == slot) {
            Some(s) if s.is_processing => SlotSeen::Busy,
            Some(_) => SlotSeen::Idle,
            None => SlotSeen::Unavailable,
        },
        Err(_) => SlotSeen::Unavailable,
    }
}

/// Posts `reasoning_end` for completion `id`; true only on a 200 with `success: true`.
fn end_reasoning(config: &Config, id: &str) -> bool {
    #[derive(Deserialize)]
    struct Ack {
        success: bool,
    }
    if id.is_empty() {
        return false;
    }
    let body = request::render_reasoning_end(&config.model, id);
    let timeout = Duration::from_millis(config.limits.liveness_ms);
    let target = "/v1/chat/completions/control";
    info::call_json::<Ack>(target, &config.socket, "POST", target, Some(&body), timeout)
        .is_ok_and(|ack| ack.success)
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
