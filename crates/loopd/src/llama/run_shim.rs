//! SHIM (issue 14, to be deleted when issue 13 lands): the cancellable exchange the request
//! runner needs, with exactly the names and shapes of issue 13's public contract
//! (`/work/notes/issue13-design.md`): [`Cancel`], [`Partial`], [`Failed`], [`Client::run`],
//! [`Client::run_with_retry`] and [`InferError::Cancelled`].
//!
//! It is today's `chat::stream` with two changes: every socket read waits at most `poll_ms`
//! (the silence limits are counted here instead of by the socket timeout), and the token is
//! checked after every read and after every event, so a cancel from another thread or from
//! `on_event` closes the connection within one poll interval. The partial output is collected
//! from the events. Issue 13's sans-IO exchange replaces all of this.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::http::{self, ReadError};
use crate::sse::{EventStream, Item};

use super::assemble::{Buffers, Step};
use super::chat::{CapAction, FirstByteWait, SlotSeen, ThinkingCap};
use super::{info, request, retry};
use super::{ChatEvent, ChatRequest, Client, Completion, InferError, Silence, Timings, ToolCall};

/// A cancellation token: cheap to clone, shared between the thread running a request and
/// whoever may end it.
#[derive(Clone, Default, Debug)]
pub struct Cancel(Arc<CancelInner>);

#[derive(Default, Debug)]
struct CancelInner {
    flag: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Cancel {
    /// A token not yet cancelled.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels: every holder sees it, and sleepers wake at once.
    pub fn cancel(&self) {
        let _g = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.0.flag.store(true, Ordering::SeqCst);
        self.0.wake.notify_all();
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Sleeps `d`, or less if cancelled; true if cancelled.
    pub fn sleep(&self, d: Duration) -> bool {
        let g = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        let (_g, _) = self
            .0
            .wake
            .wait_timeout_while(g, d, |_| !self.is_cancelled())
            .unwrap_or_else(|e| e.into_inner());
        self.is_cancelled()
    }
}

/// What was assembled before a failure.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partial {
    /// The answer text so far.
    pub content: Option<String>,
    /// The reasoning text so far.
    pub reasoning_content: Option<String>,
    /// Calls seen so far (arguments possibly incomplete).
    pub tool_calls: Vec<ToolCall>,
    /// The latest timings the stream carried.
    pub timings: Option<Timings>,
    /// Reasoning tokens so far.
    pub reasoning_tokens: u64,
}

impl Partial {
    /// Folds one event into the partial output.
    fn take(&mut self, e: &ChatEvent) {
        match e {
            ChatEvent::Content(t) => self.content.get_or_insert_with(String::new).push_str(t),
            ChatEvent::Reasoning(t) => self
                .reasoning_content
                .get_or_insert_with(String::new)
                .push_str(t),
            ChatEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                let i = *index as usize;
                while self.tool_calls.len() <= i.min(64) {
                    self.tool_calls.push(ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                }
                if let Some(c) = self.tool_calls.get_mut(i) {
                    if let Some(id) = id {
                        c.id.clone_from(id);
                    }
                    if let Some(n) = name {
                        c.name.clone_from(n);
                    }
                    c.arguments.push_str(arguments);
                }
            }
            _ => {}
        }
    }
}

/// A failed attempt: the error and what was assembled before it.
#[derive(Debug)]
pub struct Failed {
    /// What ended the request.
    pub error: InferError,
    /// The output so far.
    pub partial: Partial,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Failed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Client {
    /// One attempt, cancellable from another thread or from `on_event`: ends within one
    /// `poll_ms` of the cancel with [`InferError::Cancelled`], the connection closed.
    // The shape is issue 13's contract, `Failed` by value.
    #[allow(clippy::result_large_err)]
    pub fn run(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        let mut partial = Partial::default();
        let mut timings = None;
        let mut ev = |e: &ChatEvent| {
            partial.take(e);
            on_event(e);
        };
        let r = self.run_inner(req, cancel, &mut ev, &mut timings);
        r.map_err(|error| {
            partial.timings = timings;
            Failed { error, partial }
        })
    }

    /// [`Client::run`] under the retry schedule; a cancel also ends a retry wait.
    #[allow(clippy::result_large_err)]
    pub fn run_with_retry(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        let schedule = &self.config().retry;
        let start = self.clock().now();
        let total = Duration::from_millis(schedule.total_ms);
        let mut number = 1u32;
        loop {
            let failed = match self.run(req, cancel, on_event) {
                Ok(done) => return Ok(done),
                Err(f) => f,
            };
            if !retry::is_retryable(&failed.error) || number >= schedule.attempts {
                return Err(failed);
            }
            let wait = retry::delay(schedule, number as usize - 1, self.jitter());
            if self.clock().now().saturating_sub(start) + wait > total {
                return Err(failed);
            }
            number += 1;
            on_event(&ChatEvent::Retrying {
                attempt: number,
                after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                error: failed.error.to_string(),
            });
            if cancel.sleep(wait) {
                return Err(Failed {
                    error: InferError::Cancelled,
                    partial: failed.partial,
                });
            }
        }
    }

    fn run_inner(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
        timings: &mut Option<Timings>,
    ) -> Result<Completion, InferError> {
        if cancel.is_cancelled() {
            return Err(InferError::Cancelled);
        }
        let _permit = self.gate().acquire(req.slot, on_event)?;
        let config = self.config();
        let clock = self.clock();
        let limits = config.limits;
        let ms = Duration::from_millis;
        let body = request::render(config, req);
        let mut resp = http::request(&config.socket, "POST", "/v1/chat/completions", Some(&body))?;
        resp.set_timeout(Some(ms(limits.poll_ms)))
            .map_err(|source| InferError::Connect {
                socket: config.socket.clone(),
                source,
            })?;
        let mut wait = FirstByteWait::new(limits, clock.now());
        let mut last_byte = clock.now();
        let status = loop {
            if cancel.is_cancelled() {
                return Err(InferError::Cancelled);
            }
            let before = resp.received();
            match resp.head() {
                Ok(status) => break status,
                Err(ReadError::Timeout) if resp.received() == 0 => {
                    let seen = poll_slot(config, req.slot);
                    on_event(&ChatEvent::Waiting {
                        slot_busy: seen == SlotSeen::Busy,
                    });
                    wait.observe(seen, clock.now())?;
                }
                Err(ReadError::Timeout) => {
                    if resp.received() > before {
                        last_byte = clock.now();
                    } else if clock.now().saturating_sub(last_byte) >= ms(limits.liveness_ms) {
                        return Err(InferError::Stalled(Silence::Liveness));
                    }
                }
                Err(e) => return Err(e.into_infer()),
            }
        };
        if status != 200 {
            return Err(resp.into_http_error());
        }
        let mut buffers = Buffers::new();
        let mut folder = buffers.folder();
        let mut cap = ThinkingCap::new(limits.thinking_cap, limits.thinking_overrun);
        let mut events = EventStream::new();
        let mut done = false;
        let mut last_byte = clock.now();
        let read = loop {
            if done {
                break Ok(());
            }
            if cancel.is_cancelled() {
                break Err(InferError::Cancelled);
            }
            let piece = match resp.next_body() {
                Ok(Some(piece)) => piece,
                Ok(None) => break events.finish(),
                Err(ReadError::Timeout) => {
                    if clock.now().saturating_sub(last_byte) >= ms(limits.liveness_ms) {
                        break Err(InferError::Stalled(Silence::Liveness));
                    }
                    continue;
                }
                Err(e) => break Err(e.into_infer()),
            };
            last_byte = clock.now();
            let fed = events.feed(piece, &mut |item| -> Result<(), InferError> {
                if done || cancel.is_cancelled() {
                    return Ok(());
                }
                match item {
                    Item::Data(data) => {
                        let step = folder.push(data, on_event)?;
                        *timings = Some(folder.timings());
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
            });
            if let Err(e) = fed {
                break Err(e);
            }
        };
        drop(resp);
        match read {
            Ok(()) => folder.completion(cap.capped()),
            Err(InferError::StreamClosedEarly) if folder.is_finished() => {
                folder.completion(cap.capped())
            }
            Err(e) => Err(e),
        }
    }
}

/// Asks `/slots` about `slot` on a second connection.
fn poll_slot(config: &crate::Config, slot: u32) -> SlotSeen {
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
fn end_reasoning(config: &crate::Config, id: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Ack {
        success: bool,
    }
    if id.is_empty() {
        return false;
    }
    let body = request::render_reasoning_end(&config.model, id);
    let timeout = Duration::from_millis(config.limits.liveness_ms);
    let target = "/v1/chat/completions/control";
    info::call_json::<Ack>(&config.socket, "POST", target, Some(&body), timeout)
        .is_ok_and(|ack| ack.success)
}
