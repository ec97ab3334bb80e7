//! [`ChatCall`]: one chat request from the slot gate to its completion, retries included
//! (design section 4, the whole life of a request), as a sans-IO state machine.
//!
//! It nests the [`ChatExchange`] of the attempt under way and adds what comes around it:
//! 1. the slot gate ([`CallOutput::Acquire`]; the gate itself blocks in the driver, bounded
//!    by `busy_wait_ms` and the cancel token);
//! 2. if the slot's previous request was abandoned (its connection closed while the server
//!    may still have been generating), a `/slots` poll every `poll_ms` until the slot is idle
//!    ([`IdleWait`]: `WaitTimeout` after `busy_wait_ms`);
//! 3. the send ([`CallOutput::Send`]) and the exchange;
//! 4. a failed attempt goes to the [`RetrySchedule`]: a retryable error waits 2 s, 8 s, 30 s
//!    (±25%, never past 5 minutes in all) and goes back through the gate, after a
//!    [`ChatEvent::Retrying`]; anything else ends the call. An owner that must first hear
//!    why an attempt failed (the runner asks llama-worker) [`hold`](ChatCall::hold)s
//!    failures and gives its verdict with [`decide`](ChatCall::decide).
//!
//! Every wait is a deadline from [`poll_timeout`](ChatCall::poll_timeout): it reads no clock,
//! touches no socket and draws no random number itself (the jitter is handed in), so the
//! whole schedule is tested on fake time to the millisecond. The driver (`chat.rs`'s
//! `ChatIo`, shared by [`Client::run`](super::Client::run) and the runner) carries out
//! each [`CallOutput`] and hands the answer back.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Jitter;
use crate::config::{Limits, Retry};

use super::assemble::Storage;
use super::exchange::{ChatExchange, Output};
use super::retry::{Decision, RetrySchedule};
use super::timers::{IdleWait, SlotSeen};
use super::{ChatEvent, ChatRequest, Completion, Failed, InferError, Partial};

/// What the call asks of its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutput {
    /// Show this event.
    Event(ChatEvent),
    /// Take the slot gate for the request's slot (emitting `Queued` while waiting); answer
    /// with [`handle_acquired`](ChatCall::handle_acquired).
    Acquire,
    /// Ask `/slots` about the request's slot; answer with
    /// [`handle_slots`](ChatCall::handle_slots).
    PollSlots,
    /// Connect and send [`request`](ChatCall::request); answer with
    /// [`handle_sent`](ChatCall::handle_sent) or [`handle_send_error`](ChatCall::handle_send_error).
    Send,
    /// Post `reasoning_end` for completion `id`; answer with
    /// [`handle_control_answer`](ChatCall::handle_control_answer).
    EndReasoning {
        /// The completion id.
        id: String,
    },
    /// Ask the judge named with [`judge_silence`](ChatCall::judge_silence) whether the
    /// server is alive; answer with [`handle_silence_verdict`](ChatCall::handle_silence_verdict).
    JudgeSilence,
    /// The attempt is over: close its connection (the server stops generating) and give the
    /// gate's permit back.
    Close {
        /// Closed while the server may still be generating
        /// ([`InferError::may_leave_slot_busy`]): the slot's next permit waits for `/slots`
        /// to say it is idle.
        abandoned: bool,
    },
}

#[derive(Debug)]
enum Phase<'b> {
    /// [`CallOutput::Acquire`] is out.
    Acquiring,
    /// The slot was abandoned: `/slots` until it is idle.
    IdleWait {
        wait: IdleWait,
        next: Duration,
        polling: bool,
    },
    /// [`CallOutput::Send`] is out.
    Sending,
    /// The attempt's answer.
    Exchange(Box<ChatExchange<'b>>),
    /// The attempt failed; the owner's verdict is awaited ([`ChatCall::hold`]).
    Held(InferError),
    /// The next attempt starts at this time.
    RetryWait(Duration),
    /// The call is over.
    Over,
}

/// One chat request's call, as a sans-IO machine: `llama/call.rs`'s module docs say how it is
/// driven (the module is private; the machine is what the crate exports).
pub struct ChatCall<'b> {
    limits: Limits,
    req: ChatRequest,
    schedule: RetrySchedule,
    jitter: Arc<dyn Jitter>,
    phase: Phase<'b>,
    storage: Option<Storage<'b>>,
    outputs: VecDeque<CallOutput>,
    judge: bool,
    hold: bool,
    /// Whether any attempt went out.
    sent: bool,
    /// Whether the server's answer to the last attempt sent has begun.
    answering: bool,
    partial: Partial,
    result: Option<Result<Completion, InferError>>,
}

impl std::fmt::Debug for ChatCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatCall")
            .field("slot", &self.req.slot)
            .field("attempt", &self.schedule.attempt())
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl<'b> ChatCall<'b> {
    /// The call of `req` starting at `now` under `retry` (one attempt in all: no retry),
    /// assembling into `storage`, with `jitter` for the waits between attempts. Its first
    /// output is [`CallOutput::Acquire`].
    pub fn new(
        now: Duration,
        limits: Limits,
        retry: &Retry,
        jitter: Arc<dyn Jitter>,
        req: ChatRequest,
        storage: Storage<'b>,
    ) -> Self {
        ChatCall {
            limits,
            req,
            schedule: RetrySchedule::new(retry, now),
            jitter,
            phase: Phase::Acquiring,
            storage: Some(storage),
            outputs: VecDeque::from([CallOutput::Acquire]),
            judge: false,
            hold: false,
            sent: false,
            answering: false,
            partial: Partial::default(),
            result: None,
        }
    }

    /// Holds each failed attempt until [`decide`](Self::decide) instead of deciding at once.
    pub fn hold(&mut self) {
        self.hold = true;
    }

    /// Whether the attempt sent from now on has its silences judged
    /// ([`CallOutput::JudgeSilence`]): a prefill's rather than failed at `idle_grace_ms`, a
    /// stream's rather than failed at `liveness_ms`.
    pub fn judge_silence(&mut self, judge: bool) {
        self.judge = judge;
    }

    /// The request, as every attempt sends it.
    pub fn request(&self) -> &ChatRequest {
        &self.req
    }

    /// The attempt under way (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.schedule.attempt()
    }

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<CallOutput> {
        if let Some(o) = self.outputs.pop_front() {
            return Some(o);
        }
        match &mut self.phase {
            Phase::Exchange(x) => x.poll_output().map(call_output),
            _ => None,
        }
    }

    /// Gives back an event from [`poll_output`](Self::poll_output) once it was shown, for
    /// the attempt's later events to be written into its strings
    /// ([`ChatExchange::recycle`]; optional).
    pub fn recycle(&mut self, event: ChatEvent) {
        if let Phase::Exchange(x) = &mut self.phase {
            x.recycle(event);
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due; `None` when only an answer
    /// from the driver (or the owner's verdict) can move the call on.
    pub fn poll_timeout(&self) -> Option<Duration> {
        match &self.phase {
            Phase::IdleWait {
                next,
                polling: false,
                ..
            } => Some(*next),
            Phase::Exchange(x) => x.poll_timeout(),
            Phase::RetryWait(at) => Some(*at),
            _ => None,
        }
    }

    /// Whether an attempt is on the wire: sent, and its answer not over.
    pub fn in_flight(&self) -> bool {
        matches!(&self.phase, Phase::Exchange(x) if !x.is_over())
    }

    /// Whether the server's answer to the last attempt sent has begun (see
    /// [`ChatExchange::answering`]); it stays so once that attempt is over.
    pub fn answering(&self) -> bool {
        self.answering
    }

    /// Whether any attempt was sent.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// The error of the attempt held for a verdict ([`hold`](Self::hold)).
    pub fn held(&self) -> Option<&InferError> {
        match &self.phase {
            Phase::Held(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the call is over (its result is ready or taken).
    pub fn is_over(&self) -> bool {
        matches!(self.phase, Phase::Over)
    }

    /// The gate's answer at `now`: the permit was taken (`after_abandoned`: the slot's
    /// previous holder abandoned it), or the error (`Busy`, `WaitTimeout`, `Cancelled`).
    pub fn handle_acquired(&mut self, now: Duration, acquired: Result<bool, InferError>) {
        if !matches!(self.phase, Phase::Acquiring) {
            return;
        }
        match acquired {
            Ok(false) => self.send(),
            Ok(true) => {
                self.phase = Phase::IdleWait {
                    wait: IdleWait::new(self.limits, now),
                    next: now,
                    polling: true,
                };
                self.outputs.push_back(CallOutput::PollSlots);
            }
            // No permit was taken: nothing to close.
            Err(e) => self.attempt_failed(now, e),
        }
    }

    /// The request went out at `now`.
    pub fn handle_sent(&mut self, now: Duration) {
        if !matches!(self.phase, Phase::Sending) {
            return;
        }
        let Some(storage) = self.storage.take() else {
            return;
        };
        let mut x = ChatExchange::with_storage(self.limits, now, storage);
        if let Some(at) = self.schedule.first_byte_deadline() {
            x.set_first_byte_deadline(at);
        }
        if self.judge {
            x.judge_silence();
        }
        (self.sent, self.answering) = (true, false);
        self.phase = Phase::Exchange(Box::new(x));
    }

    /// The request could not be sent (`Connect`, `TimedOut(Connect)`, a cancel).
    pub fn handle_send_error(&mut self, now: Duration, error: InferError) {
        if matches!(self.phase, Phase::Sending) {
            self.outputs
                .push_back(CallOutput::Close { abandoned: false });
            self.attempt_failed(now, error);
        }
    }

    /// Bytes read from the connection at `now`; returns how many were consumed (see
    /// [`ChatExchange::handle_bytes`]).
    pub fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize {
        let Phase::Exchange(x) = &mut self.phase else {
            return input.len();
        };
        let used = x.handle_bytes(now, input);
        self.answering = x.answering();
        self.pump(now);
        used
    }

    /// The connection ended at `now`.
    pub fn handle_eof(&mut self, now: Duration) {
        if let Phase::Exchange(x) = &mut self.phase {
            x.handle_eof(now);
            self.pump(now);
        }
    }

    /// What a `/slots` poll said at `now`: in the wait for an abandoned slot, or in the
    /// wait for the first byte.
    pub fn handle_slots(&mut self, now: Duration, seen: SlotSeen) {
        match &mut self.phase {
            Phase::IdleWait {
                wait,
                next,
                polling,
            } => {
                *polling = false;
                match wait.observe(seen, now) {
                    Ok(true) => self.send(),
                    Ok(false) => {
                        *next = now + ms(self.limits.poll_ms);
                        let e = ChatEvent::Waiting { slot_busy: true };
                        self.outputs.push_back(CallOutput::Event(e));
                    }
                    Err(e) => {
                        // The slot is still busy: its next permit waits for it again.
                        self.outputs
                            .push_back(CallOutput::Close { abandoned: true });
                        self.attempt_failed(now, e);
                    }
                }
            }
            Phase::Exchange(x) => {
                x.handle_slots(now, seen);
                self.pump(now);
            }
            _ => {}
        }
    }

    /// Whether the `reasoning_end` call succeeded.
    pub fn handle_control_answer(&mut self, now: Duration, success: bool) {
        if let Phase::Exchange(x) = &mut self.phase {
            x.handle_control_answer(now, success);
            self.pump(now);
        }
    }

    /// The judge's verdict on a silence (see [`ChatExchange::handle_silence_verdict`]).
    pub fn handle_silence_verdict(&mut self, now: Duration, alive: bool) {
        if let Phase::Exchange(x) = &mut self.phase {
            x.handle_silence_verdict(now, alive);
            self.pump(now);
        }
    }

    /// Time passed: fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        match &mut self.phase {
            Phase::IdleWait {
                next,
                polling: polling @ false,
                ..
            } if now >= *next => {
                *polling = true;
                self.outputs.push_back(CallOutput::PollSlots);
            }
            Phase::Exchange(x) => {
                x.handle_timeout(now);
                self.pump(now);
            }
            Phase::RetryWait(at) if now >= *at => {
                // A retry starts over: what the failed attempt streamed is not its output.
                self.partial = Partial::default();
                self.phase = Phase::Acquiring;
                self.outputs.push_back(CallOutput::Acquire);
            }
            _ => {}
        }
    }

    /// The caller cancelled the call at `now`: it ends `Cancelled` at once (an attempt on the
    /// wire is closed; a wait before a retry is not finished), with the output so far.
    pub fn cancel(&mut self, now: Duration) {
        match &mut self.phase {
            Phase::Exchange(x) => {
                x.cancel();
                self.pump(now);
            }
            Phase::IdleWait { .. } => {
                self.outputs
                    .push_back(CallOutput::Close { abandoned: true });
                self.over(Err(InferError::Cancelled));
            }
            // Not on the wire yet: nothing is sent, a permit taken is given back. (A driver
            // blocked in the gate or the send sees its cancel token itself.)
            Phase::Acquiring | Phase::Sending => {
                self.outputs
                    .retain(|o| !matches!(o, CallOutput::Acquire | CallOutput::Send));
                self.outputs
                    .push_back(CallOutput::Close { abandoned: false });
                self.over(Err(InferError::Cancelled));
            }
            Phase::Over => {}
            Phase::Held(_) | Phase::RetryWait(_) => self.over(Err(InferError::Cancelled)),
        }
    }

    /// The owner's verdict on the attempt held at `now`: `retry` lets the schedule decide
    /// (a retryable error within attempts and time waits and goes again); otherwise the call
    /// ends with the attempt's error. Ignored unless an attempt is held.
    pub fn decide(&mut self, now: Duration, retry: bool) {
        let Phase::Held(_) = self.phase else { return };
        let Phase::Held(error) = std::mem::replace(&mut self.phase, Phase::Over) else {
            return;
        };
        self.conclude(now, error, retry);
    }

    /// The completion, or the error with the last attempt's output, once, when the call is
    /// over.
    // `Failed` by value is the runner's contract; a request fails once, so its size costs nothing.
    #[allow(clippy::result_large_err)]
    pub fn take_result(&mut self) -> Option<Result<Completion, Failed>> {
        let r = self.result.take()?;
        Some(r.map_err(|error| Failed {
            error,
            partial: std::mem::take(&mut self.partial),
        }))
    }

    /// Ends the call and hands its storage back for the next one.
    pub fn into_storage(mut self) -> Storage<'b> {
        match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Exchange(x) => x.into_storage(),
            _ => self
                .storage
                .take()
                .expect("the storage is the exchange's or the call's"),
        }
    }

    fn send(&mut self) {
        self.phase = Phase::Sending;
        self.outputs.push_back(CallOutput::Send);
    }

    /// Ends the attempt if its exchange is over, after handing on what the exchange asked
    /// for. While it runs, [`poll_output`](Self::poll_output) reads the exchange's outputs in
    /// place, after the call's own (which are older: nothing else is queued in this phase),
    /// rather than moving each event through a second queue.
    fn pump(&mut self, now: Duration) {
        let Phase::Exchange(x) = &mut self.phase else {
            return;
        };
        if !x.is_over() {
            return;
        }
        while let Some(o) = x.poll_output() {
            self.outputs.push_back(call_output(o));
        }
        let Phase::Exchange(mut x) = std::mem::replace(&mut self.phase, Phase::Over) else {
            return;
        };
        let result = x.take_result();
        self.partial = x.partial();
        self.storage = Some(x.into_storage());
        match result {
            Some(Ok(done)) => {
                self.outputs
                    .push_back(CallOutput::Close { abandoned: false });
                self.over(Ok(done));
            }
            Some(Err(e)) => {
                let abandoned = e.may_leave_slot_busy();
                self.outputs.push_back(CallOutput::Close { abandoned });
                self.attempt_failed(now, e);
            }
            None => {
                self.outputs
                    .push_back(CallOutput::Close { abandoned: true });
                self.attempt_failed(now, InferError::Cancelled);
            }
        }
    }

    fn attempt_failed(&mut self, now: Duration, error: InferError) {
        if self.hold && !matches!(error, InferError::Cancelled) {
            self.phase = Phase::Held(error);
        } else {
            self.conclude(now, error, true);
        }
    }

    fn conclude(&mut self, now: Duration, error: InferError, retry: bool) {
        let decision = match retry {
            true => self.schedule.on_failure(now, &error, &*self.jitter),
            false => Decision::GiveUp,
        };
        match decision {
            Decision::GiveUp => self.over(Err(error)),
            Decision::RetryAt {
                attempt,
                at,
                after_ms,
            } => {
                self.outputs
                    .push_back(CallOutput::Event(ChatEvent::Retrying {
                        attempt,
                        after_ms,
                        error: error.to_string(),
                    }));
                self.phase = Phase::RetryWait(at);
            }
        }
    }

    fn over(&mut self, result: Result<Completion, InferError>) {
        self.phase = Phase::Over;
        self.result = Some(result);
    }
}

/// What the exchange asked for, as the call's output.
fn call_output(o: Output) -> CallOutput {
    match o {
        Output::Event(e) => CallOutput::Event(e),
        Output::PollSlots => CallOutput::PollSlots,
        Output::EndReasoning { id } => CallOutput::EndReasoning { id },
        Output::JudgeSilence => CallOutput::JudgeSilence,
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}
