//! The one chat IO driver: [`ChatIo`] carries out what a [`ChatCall`] (or the runner's
//! `AgentRequest`, which nests one) asks, and [`Client::run`] / [`Client::run_with_retry`]
//! are its thin loop.
//!
//! - [`ChatIo::acquire`]: the slot gate ([`super::gate`]), blocking for at most
//!   `busy_wait_ms` or until a cancel;
//! - [`ChatIo::send`]: connect and send within `connect_ms`;
//! - [`ChatIo::poll_slots`] and [`ChatIo::end_reasoning`]: a second connection, within
//!   `call_ms`;
//! - [`ChatIo::read`]: the bytes of the connection into the machine ([`ByteSink`]), with a
//!   socket timeout of what is left until the machine's `poll_timeout`, never more than
//!   `poll_ms`, so a cancel is seen within one poll interval;
//! - [`ChatIo::drain`]: what the connection already holds, without waiting, before the
//!   machine hears of anything that ends the stream from outside;
//! - [`ChatIo::close`]: dropping the connection closes it, which makes the server stop
//!   generating; the permit goes back to the gate, marked abandoned when the machine says so.
//!
//! Every decision (the wait for an abandoned slot, the retries, every timer) is the
//! machine's; only these loops read the clock. Everything runs on the caller's thread.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::clock::Clock;
use crate::config::{ClientConfig, Retry};
use crate::http::{self, READ_CHUNK};

use super::call::{CallOutput, ChatCall};
use super::gate::SlotPermit;
use super::timers::SlotSeen;
use super::{
    info, request, Cancel, ChatEvent, ChatRequest, Client, Completion, Failed, InferError,
};

/// The chat-completions path.
pub const CHAT_PATH: &str = "/v1/chat/completions";
/// The control path (`reasoning_end`).
pub const CONTROL_PATH: &str = "/v1/chat/completions/control";

/// What takes the bytes [`ChatIo::read`] reads: a [`ChatCall`], or a machine nesting one.
pub trait ByteSink {
    /// Bytes read at `now`; returns how many were consumed.
    fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize;
    /// The connection ended at `now`.
    fn handle_eof(&mut self, now: Duration);
    /// Time passed: fires every timer due at `now`.
    fn handle_timeout(&mut self, now: Duration);
}

impl ByteSink for ChatCall<'_> {
    fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize {
        ChatCall::handle_bytes(self, now, input)
    }
    fn handle_eof(&mut self, now: Duration) {
        ChatCall::handle_eof(self, now)
    }
    fn handle_timeout(&mut self, now: Duration) {
        ChatCall::handle_timeout(self, now)
    }
}

/// The IO of one chat call on one slot: its gate permit, its connection and read buffer.
pub struct ChatIo<'c> {
    client: &'c Client,
    slot: u32,
    permit: Option<SlotPermit<'c>>,
    stream: Option<UnixStream>,
    buf: Box<[u8; READ_CHUNK]>,
    pos: usize,
    len: usize,
    // The socket's read timeout as last set; `None` for a new connection.
    timeout: Option<Duration>,
}

impl std::fmt::Debug for ChatIo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatIo")
            .field("slot", &self.slot)
            .field("permit", &self.permit.is_some())
            .field("connected", &self.stream.is_some())
            .finish_non_exhaustive()
    }
}

impl<'c> ChatIo<'c> {
    /// The IO of calls on `slot` through `client`.
    pub fn new(client: &'c Client, slot: u32) -> Self {
        ChatIo {
            client,
            slot,
            permit: None,
            stream: None,
            buf: crate::heap::array::<READ_CHUNK>(),
            pos: 0,
            len: 0,
            timeout: None,
        }
    }

    /// Takes the slot gate, emitting `Queued` while waiting: whether the slot's previous
    /// holder abandoned it, or `Busy`, `WaitTimeout`, `Cancelled`.
    pub fn acquire(
        &mut self,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<bool, InferError> {
        let limits = self.client.config.limits;
        let permit = self.client.gate.acquire(
            self.slot,
            Duration::from_millis(limits.busy_wait_ms),
            Duration::from_millis(limits.poll_ms),
            cancel,
            &*self.client.clock,
            on_event,
        )?;
        let after = permit.after_abandoned();
        self.permit = Some(permit);
        Ok(after)
    }

    /// Connects to the inference socket and sends `req` within `limits.connect_ms` (or until
    /// a cancel).
    pub fn send(&mut self, req: &ChatRequest, cancel: &Cancel) -> Result<(), InferError> {
        let s = send(&self.client.config, req, cancel)?;
        (self.stream, self.timeout, self.pos, self.len) = (Some(s), None, 0, 0);
        Ok(())
    }

    /// Asks `/slots` about the slot on a second connection.
    pub fn poll_slots(&self, cancel: &Cancel) -> SlotSeen {
        poll_slot(&self.client.config, self.slot, cancel)
    }

    /// Posts `reasoning_end` for completion `id`; true only on `success: true`.
    pub fn end_reasoning(&self, id: &str, cancel: &Cancel) -> bool {
        end_reasoning(&self.client.config, id, cancel)
    }

    /// Closes the connection and gives the permit back (`abandoned`: the server may still be
    /// generating on the slot).
    pub fn close(&mut self, abandoned: bool) {
        if let Some(p) = self.permit.as_mut().filter(|_| abandoned) {
            p.abandon();
        }
        (self.stream, self.permit, self.pos, self.len) = (None, None, 0, 0);
    }

    /// Feeds `sink` what the connection has: bytes left over from the last read first, else
    /// one read waiting at most `wait` (its timeout or end handed on at the clock's time).
    /// False, and nothing done, without a connection.
    pub fn read(&mut self, clock: &dyn Clock, wait: Duration, sink: &mut dyn ByteSink) -> bool {
        let Some(s) = self.stream.as_mut() else {
            return false;
        };
        if self.pos < self.len {
            self.pos += sink.handle_bytes(clock.now(), &self.buf[self.pos..self.len]);
            return true;
        }
        match http::read_within(s, &mut self.buf[..], wait, &mut self.timeout) {
            http::StreamRead::Bytes(n) => (self.pos, self.len) = (0, n),
            http::StreamRead::Eof => sink.handle_eof(clock.now()),
            http::StreamRead::TimedOut => sink.handle_timeout(clock.now()),
            http::StreamRead::Interrupted => {}
        }
        true
    }

    /// Feeds `sink` everything the connection already holds, without waiting: the bytes left
    /// over from the last read, then reads until the socket is empty, ends (handed on as
    /// the end) or `DRAIN_MOST` bytes were read, or the sink takes no more for now (a
    /// `reasoning_end` is out). A driver calls it before it hands its machine anything that
    /// ends the stream from outside (a failure the worker pushed or answered, a lost host, a
    /// cancel), so the output the server sent before that is kept whole.
    pub fn drain(&mut self, clock: &dyn Clock, sink: &mut dyn ByteSink) {
        let Some(s) = self.stream.as_mut() else {
            return;
        };
        let mut left = DRAIN_MOST;
        loop {
            if self.pos < self.len {
                let used = sink.handle_bytes(clock.now(), &self.buf[self.pos..self.len]);
                self.pos += used;
                if used == 0 {
                    return;
                }
                continue;
            }
            if left == 0 {
                return;
            }
            match http::read_now(s, &mut self.buf[..]) {
                http::StreamRead::Bytes(n) => {
                    (self.pos, self.len) = (0, n);
                    left = left.saturating_sub(n);
                }
                http::StreamRead::Eof => return sink.handle_eof(clock.now()),
                http::StreamRead::Interrupted => {}
                http::StreamRead::TimedOut => return,
            }
        }
    }
}

/// The most [`ChatIo::drain`] reads: more than a local socket's buffer holds, so everything
/// that was there when the drain began, and a bound on a server that streams as fast as it
/// is read.
pub const DRAIN_MOST: usize = 4 * 1024 * 1024;

/// How long a driver waits for IO before it looks at its machine again: until `due` (the
/// machine's `poll_timeout`), at least 1 ms, at most `most`.
pub fn wait_until(now: Duration, due: Option<Duration>, most: Duration) -> Duration {
    due.map_or(most, |at| at.saturating_sub(now))
        .clamp(Duration::from_millis(1), most)
}

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
        self.call(req, &Retry::once(), cancel, on_event)
    }

    /// [`Client::run`] under the retry schedule of the config (`[retry]`): `Retrying` before
    /// each retry, the waits between attempts ended at once by a cancel (then `Cancelled`).
    // `Failed` by value is the runner's contract; a request fails once, so its size costs nothing.
    #[allow(clippy::result_large_err)]
    pub fn run_with_retry(
        &self,
        req: &ChatRequest,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        self.call(req, &self.config.retry, cancel, on_event)
    }

    /// [`Client::chat`] under the retry schedule of the config; emits `Retrying` before each
    /// retry. Returns the first completion, the first error that is not retryable, or the last
    /// error once attempts or time run out.
    pub fn chat_with_retry(
        &self,
        req: &ChatRequest,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, InferError> {
        self.run_with_retry(req, &Cancel::new(), on_event)
            .map_err(|f| f.error)
    }

    /// The loop of one [`ChatCall`] over a [`ChatIo`].
    #[allow(clippy::result_large_err)]
    fn call(
        &self,
        req: &ChatRequest,
        retry: &Retry,
        cancel: &Cancel,
        on_event: &mut dyn FnMut(&ChatEvent),
    ) -> Result<Completion, Failed> {
        let clock = &*self.clock;
        let poll = Duration::from_millis(self.config.limits.poll_ms);
        let mut buffers = self.buffers();
        let jitter = Arc::clone(&self.jitter);
        let (limits, now) = (self.config.limits, clock.now());
        let mut call = ChatCall::new(now, limits, retry, jitter, req.clone(), buffers.storage());
        let mut io = ChatIo::new(self, req.slot);
        let mut cancelled = false;
        loop {
            while let Some(out) = call.poll_output() {
                match out {
                    CallOutput::Event(e) => {
                        on_event(&e);
                        call.recycle(e);
                    }
                    CallOutput::Acquire => {
                        let acquired = io.acquire(cancel, on_event);
                        call.handle_acquired(clock.now(), acquired);
                    }
                    CallOutput::PollSlots => {
                        let seen = io.poll_slots(cancel);
                        call.handle_slots(clock.now(), seen);
                    }
                    CallOutput::Send => match io.send(call.request(), cancel) {
                        Ok(()) => call.handle_sent(clock.now()),
                        Err(e) => call.handle_send_error(clock.now(), e),
                    },
                    CallOutput::EndReasoning { id } => {
                        let ok = io.end_reasoning(&id, cancel);
                        call.handle_control_answer(clock.now(), ok);
                    }
                    // The plain client names no judge; were one asked, silence is a stall.
                    CallOutput::JudgeSilence => call.handle_silence_verdict(clock.now(), false),
                    CallOutput::Close { abandoned } => io.close(abandoned),
                }
            }
            if call.is_over() {
                break;
            }
            // After the events: a cancel from inside `on_event` is seen here.
            if cancel.is_cancelled() && !std::mem::replace(&mut cancelled, true) {
                io.drain(clock, &mut call);
                call.cancel(clock.now());
                continue;
            }
            let now = clock.now();
            let due = call.poll_timeout();
            if due.is_some_and(|at| now >= at) {
                call.handle_timeout(now);
                continue;
            }
            let wait = wait_until(now, due, poll);
            if !io.read(clock, wait, &mut call) {
                cancel.sleep(clock, wait);
                call.handle_timeout(clock.now());
            }
        }
        io.close(false);
        call.take_result()
            .expect("the loop ends only when the call is over")
    }
}

/// Connects to the inference socket and sends `req` as a chat request, within
/// `limits.connect_ms` (or until a cancel).
fn send(
    config: &ClientConfig,
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
fn poll_slot(config: &ClientConfig, slot: u32, cancel: &Cancel) -> SlotSeen {
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
fn end_reasoning(config: &ClientConfig, id: &str, cancel: &Cancel) -> bool {
    #[derive(Deserialize)]
    struct Ack {
        success: bool,
    }
    let body = request::render_reasoning_end(&config.model, id);
    info::call_json::<Ack>(config, "POST", CONTROL_PATH, Some(&body), cancel)
        .is_ok_and(|ack| ack.success)
}
