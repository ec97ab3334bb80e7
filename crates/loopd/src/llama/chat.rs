//! One request from the slot gate to the completion (design section 4): the thin loop that does
//! the IO for a [`ChatExchange`].
//!
//! 1. The slot gate ([`super::gate`]), for at most `busy_wait_ms`; if the slot's previous
//!    request was abandoned (its connection closed while the server may still be generating),
//!    `/slots` every `poll_ms` until it says the slot is idle ([`IdleWait`], `busy_wait_ms`).
//! 2. Connect and send the request within `connect_ms`.
//! 3. Then, until the exchange is over: hand its outputs on (events to the caller, `/slots`
//!    polls and the `reasoning_end` call on a second connection, each within its deadline),
//!    look at the cancel token, feed it the bytes read, and read again with a socket timeout
//!    of what is left until [`ChatExchange::poll_timeout`], never more than `poll_ms`, so a
//!    cancel is seen within one poll interval. Only this loop reads the clock.
//! 4. Dropping the connection at the end closes it, which makes the server stop generating
//!    on every error and on a cancel; such an end marks the permit abandoned (step 1).
//!
//! Everything runs on the caller's thread.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::Deserialize;

use crate::config::Config;
use crate::http::{self, READ_CHUNK};

use super::assemble::Buffers;
use super::exchange::{ChatExchange, Output};
use super::gate::SlotPermit;
use super::timers::{IdleWait, SlotSeen};
use super::{
    info, request, Cancel, ChatEvent, ChatRequest, Client, Completion, Failed, InferError,
};

/// The chat-completions path.
pub const CHAT_PATH: &str = "/v1/chat/completions";
/// The control path (`reasoning_end`).
pub const CONTROL_PATH: &str = "/v1/chat/completions/control";

impl Client {
    /// Runs one request: through the slot gate, sent, streamed, and assembled. Events are
    /// emitted as they happen; nothing is final before the returned [`Completion`].
    pub fn chat(
        &self,
        req: &ChatRequest,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, InferError> {
        self.run(req, &Cancel::new(), on_event).map_err(|f| f.error)
    }

    /// One attempt, cancellable from another thread or from `on_event` (it ends within one
    /// `poll_ms`, the connection closed). A failure carries what was assembled before it.
    // `Failed` by value is the runner's contract; a request fails once, so its size costs nothing.
    #[allow(clippy::result_large_err)]
    pub fn run(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        self.attempt(req, cancel, None, on_event)
    }

    /// One attempt; `first_byte_by`, on the client's clock, ends the wait for the first byte.
    // `Failed` by value is the runner's contract; a request fails once, so its size costs nothing.
    #[allow(clippy::result_large_err)]
    pub(super) fn attempt(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        first_byte_by: Option<Duration>,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        let config = &self.config;
        let limits = config.limits;
        let poll = Duration::from_millis(limits.poll_ms);
        let busy = Duration::from_millis(limits.busy_wait_ms);
        let mut permit = self
            .gate
            .acquire(req.slot, busy, poll, cancel, &*self.clock, on_event)
            .map_err(Failed::bare)?;
        wait_idle(config, &mut permit, &*self.clock, cancel, on_event).map_err(Failed::bare)?;
        let mut stream = send(config, req, cancel).map_err(Failed::bare)?;
        let mut buffers = Buffers::new();
        let mut x = ChatExchange::new(limits, self.clock.now(), &mut buffers);
        if let Some(at) = first_byte_by {
            x.set_first_byte_deadline(at);
        }
        let mut buf = crate::heap::array::<READ_CHUNK>();
        let (mut pos, mut len) = (0, 0);
        // The socket's read timeout as last set; `None` until the first read.
        let mut timeout: Option<Duration> = None;
        loop {
            while let Some(out) = x.poll_output() {
                match out {
                    Output::Event(e) => on_event(&e),
                    Output::PollSlots => {
                        let seen = poll_slot(config, req.slot, cancel);
                        x.handle_slots(self.clock.now(), seen);
                    }
                    Output::EndReasoning { id } => {
                        let ok = end_reasoning(config, &id, cancel);
                        x.handle_control_answer(self.clock.now(), ok);
                    }
                    // The plain client names no judge; were one asked, silence is a stall.
                    Output::JudgeSilence => x.handle_silence_verdict(self.clock.now(), false),
                }
            }
            // After the events: a cancel from inside `on_event` is seen here.
            if cancel.is_cancelled() {
                x.cancel();
            }
            if x.is_over() {
                break;
            }
            if pos < len {
                pos += x.handle_bytes(self.clock.now(), &buf[pos..len]);
                continue;
            }
            let now = self.clock.now();
            let wait = x
                .poll_timeout()
                .map_or(poll, |at| at.saturating_sub(now))
                .clamp(Duration::from_millis(1), poll);
            match http::read_within(&mut stream, &mut buf[..], wait, &mut timeout) {
                http::StreamRead::Bytes(n) => (pos, len) = (0, n),
                http::StreamRead::Eof => x.handle_eof(self.clock.now()),
                http::StreamRead::TimedOut => x.handle_timeout(self.clock.now()),
                http::StreamRead::Interrupted => {}
            }
        }
        drop(stream);
        match x.take_result() {
            Some(Ok(done)) => Ok(done),
            Some(Err(error)) => {
                if error.may_leave_slot_busy() {
                    permit.abandon();
                }
                Err(Failed {
                    error,
                    partial: x.partial(),
                })
            }
            None => unreachable!("the loop ends only when the exchange is over"),
        }
    }
}

/// If `permit`'s slot was abandoned by its previous request, asks `/slots` every `poll_ms`
/// until it says the slot is idle (or cannot say), emitting `Waiting { slot_busy: true }` for
/// each busy answer; `WaitTimeout` after `busy_wait_ms`, `Cancelled` on a cancel. A wait that
/// fails leaves the slot marked abandoned for the next request.
pub(crate) fn wait_idle(
    config: &Config,
    permit: &mut SlotPermit<'_>,
    clock: &dyn crate::clock::Clock,
    cancel: &Cancel,
    on_event: &mut dyn FnMut(&ChatEvent),
) -> Result<(), InferError> {
    if !permit.after_abandoned() {
        return Ok(());
    }
    let poll = Duration::from_millis(config.limits.poll_ms);
    let wait = IdleWait::new(config.limits, clock.now());
    let r = loop {
        let seen = poll_slot(config, permit.slot(), cancel);
        if cancel.is_cancelled() {
            break Err(InferError::Cancelled);
        }
        match wait.observe(seen, clock.now()) {
            Ok(true) => break Ok(()),
            Ok(false) => on_event(&ChatEvent::Waiting { slot_busy: true }),
            Err(e) => break Err(e),
        }
        if cancel.sleep(clock, poll) {
            break Err(InferError::Cancelled);
        }
    };
    if r.is_err() {
        permit.abandon();
    }
    r
}

/// Connects to the inference socket and sends `req` as a chat request, within
/// `limits.connect_ms` (or until a cancel).
pub(crate) fn send(
    config: &Config,
    req: &ChatRequest,
    cancel: &Cancel,
) -> Result<UnixStream, InferError> {
    let body = request::render(config, req);
    let connect = Duration::from_millis(config.limits.connect_ms);
    http::request(
        &config.socket,
        "POST",
        CHAT_PATH,
        Some(&body),
        connect,
        cancel,
    )
    .map_err(|e| InferError::from_send(&config.socket, e))
}

/// Asks `/slots` about `slot` on a second connection, within `call_ms`; a cancel ends the
/// call at once (the loop then sees the token).
pub(crate) fn poll_slot(config: &Config, slot: u32, cancel: &Cancel) -> SlotSeen {
    match info::slots(config, cancel) {
        Ok(slots) => match slots.iter().find(|s| s.id == slot) {
            Some(s) if s.is_processing => SlotSeen::Busy,
            Some(_) => SlotSeen::Idle,
            None => SlotSeen::Unavailable,
        },
        Err(_) => SlotSeen::Unavailable,
    }
}

/// Posts `reasoning_end` for completion `id` within `call_ms` (or until a cancel); true only
/// on a 200 with `success: true`.
pub(crate) fn end_reasoning(config: &Config, id: &str, cancel: &Cancel) -> bool {
    #[derive(Deserialize)]
    struct Ack {
        success: bool,
    }
    let body = request::render_reasoning_end(&config.model, id);
    info::call_json::<Ack>(config, "POST", CONTROL_PATH, Some(&body), cancel)
        .is_ok_and(|ack| ack.success)
}
