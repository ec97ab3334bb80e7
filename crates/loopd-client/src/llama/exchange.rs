//! [`ChatExchange`]: one chat request's answer as a sans-IO state machine (design section 4,
//! steps 2 to 5), in the shape of quinn-proto and llama-worker's `Policy`.
//!
//! Bytes, `/slots` answers, control-call answers and time go in (`handle_*`, each with `now`);
//! what the caller must do comes out of [`poll_output`](ChatExchange::poll_output) (an event to
//! show, a `/slots` poll to make, a `reasoning_end` to post), and
//! [`poll_timeout`](ChatExchange::poll_timeout) says when it next needs
//! [`handle_timeout`](ChatExchange::handle_timeout). It owns the response's path,
//! `llama-proto`'s `ChatStream` (HTTP reader, event-stream parser, chunk decoder, assembler),
//! and the first-byte wait, liveness and the thinking cap; it reads no clock and touches no
//! socket, so every timer is tested on fake time to the millisecond.
//!
//! Timers, by phase:
//! - before the first byte, and after a 200 head until the stream's first event past the
//!   prompt (the prefill: llama-server sends its head and the progress of the cached part as
//!   soon as it starts on the request, then progress after each batch, and its answer only
//!   once the whole prompt is processed): a `/slots` poll every `poll_ms` (after the head,
//!   every `liveness_ms`) ([`FirstByteWait`] turns the answers into `WaitTimeout`, `LoadTimeout` or `Stalled(IdleGrace)`); for a retry, nothing
//!   past the retry budget before the first byte
//!   ([`set_first_byte_deadline`](ChatExchange::set_first_byte_deadline)).
//!   With a judge ([`judge_silence`](ChatExchange::judge_silence): llama-worker, which sees
//!   the server's CPU time and each slot's decoded tokens) `idle_grace_ms` asks it
//!   ([`Output::JudgeSilence`]) instead of failing, and the wait starts over while it says
//!   the server is alive;
//! - the response head, once its first byte came: `call_ms` whole, and `liveness_ms` of silence;
//! - a 200 stream from its first event past the prompt: `liveness_ms` of silence, and no
//!   total deadline; with a judge, the silence is put to it instead, and the stream's
//!   liveness starts over while it says the server is alive (its slot decodes tokens it
//!   does not stream yet, as a tool call's opening, or another slot's prompt holds it up);
//! - an error body: `call_ms` from the head; what arrived by then is kept.

use std::collections::VecDeque;
use std::time::Duration;

use llama_proto::{Status, StreamError, StreamEvent};

use crate::config::Limits;

use super::assemble::{
    chunk_events, completion, partial, server_error, Buffers, SpareStrings, Storage, Stream,
};
use super::timers::{CapAction, FirstByteWait, SlotSeen, ThinkingCap};
use super::{
    capped_body, ChatEvent, Completion, Deadline, InferError, Partial, Silence, ERROR_BODY_CAP,
};

/// What the exchange asks of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Show this event.
    Event(ChatEvent),
    /// Ask `/slots` about the request's slot and pass the answer to
    /// [`handle_slots`](ChatExchange::handle_slots).
    PollSlots,
    /// Post `reasoning_end` for completion `id` and pass whether it succeeded to
    /// [`handle_control_answer`](ChatExchange::handle_control_answer). No byte is consumed
    /// until then.
    EndReasoning {
        /// The completion id.
        id: String,
    },
    /// No byte came while the slot stayed idle for `idle_grace_ms`, or none for `liveness_ms`
    /// mid-stream, and a judge was named with
    /// [`judge_silence`](ChatExchange::judge_silence): ask it whether the server is
    /// alive and pass its verdict to
    /// [`handle_silence_verdict`](ChatExchange::handle_silence_verdict). No `/slots` poll
    /// runs until then.
    JudgeSilence,
}

#[derive(Debug)]
enum Phase {
    /// Sent; no byte yet.
    Sent,
    /// Some of the head arrived.
    Head,
    /// A 200 head arrived, and no event yet but prompt progress short of the whole prompt
    /// (llama-server reports the cached part at once, then each batch): the server is
    /// processing the prompt. Timed as
    /// [`Phase::Sent`] (a long prefill is a busy slot, not a silent stream).
    Prefill,
    /// The stream's first event arrived: the event stream.
    Stream,
    /// An error status arrived: its body, kept up to [`ERROR_BODY_CAP`], until `until`.
    ErrorBody {
        status: u16,
        body: Vec<u8>,
        until: Duration,
    },
}

/// What one event of the stream meant, with nothing borrowed from the stream.
enum Seen {
    Head(u16),
    Chunk {
        finished: bool,
        /// Only prompt progress short of the whole prompt: the prefill goes on.
        prompt_pending: bool,
    },
    ErrorBody,
    Server(InferError),
    Done,
    End,
    Idle,
}

/// One request's answer, from the sent request to the completion or the error.
pub struct ChatExchange<'b> {
    limits: Limits,
    stream: Stream<'b>,
    wait: FirstByteWait,
    cap: ThinkingCap,
    phase: Phase,
    next_poll: Duration,
    polling: bool,
    judge: bool,
    judging: bool,
    clip: Option<Duration>,
    first_byte: Duration,
    last_byte: Duration,
    // Set while `reasoning_end` is out: the cap's token count. The bytes after the chunk that
    // hit it are not consumed; the caller hands them back after the answer.
    capped: Option<u64>,
    outputs: VecDeque<Output>,
    // Strings of events shown and given back ([`recycle`](Self::recycle)).
    spare: SpareStrings,
    outcome: Option<Result<(), InferError>>,
    finished: bool,
}

impl std::fmt::Debug for ChatExchange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatExchange")
            .field("phase", &self.phase)
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl<'b> ChatExchange<'b> {
    /// The exchange of a request whose last byte was sent at `sent_at`; the message is
    /// assembled in `buffers`.
    pub fn new(limits: Limits, sent_at: Duration, buffers: &'b mut Buffers) -> Self {
        Self::with_storage(limits, sent_at, buffers.storage())
    }

    /// As [`new`](Self::new), assembling into `storage`, which
    /// [`into_storage`](Self::into_storage) hands back for the next request: a machine that
    /// runs one exchange after another keeps one set of buffers.
    pub fn with_storage(limits: Limits, sent_at: Duration, storage: Storage<'b>) -> Self {
        ChatExchange {
            limits,
            stream: storage.into_stream(),
            wait: FirstByteWait::new(limits, sent_at),
            cap: ThinkingCap::new(limits.thinking_cap, limits.thinking_overrun),
            phase: Phase::Sent,
            next_poll: sent_at + ms(limits.poll_ms),
            polling: false,
            judge: false,
            judging: false,
            clip: None,
            first_byte: sent_at,
            last_byte: sent_at,
            capped: None,
            outputs: VecDeque::new(),
            spare: SpareStrings::default(),
            outcome: None,
            finished: false,
        }
    }

    /// Gives up waiting for the first byte at `at` with `TimedOut(RetryTotal)` (a retry's wait
    /// is clipped to the retry budget). Once a byte came it no longer applies.
    pub fn set_first_byte_deadline(&mut self, at: Duration) {
        self.clip = Some(at);
    }

    /// Names a judge of silence: a prefill's `idle_grace_ms` and a stream's `liveness_ms` ask
    /// it ([`Output::JudgeSilence`]) rather than failing with `Stalled`.
    pub fn judge_silence(&mut self) {
        self.judge = true;
    }

    /// The judge's verdict on a silence, at `now`. In the prefill: alive, the first-byte wait
    /// starts over (a `/slots` poll `poll_ms` later); not alive, `Stalled(IdleGrace)`; ignored
    /// once a byte came. Mid-stream: alive, the stream's liveness runs from `now` (or its last
    /// byte, if later); not alive, `Stalled(Liveness)`. Ignored unless a verdict was asked for.
    pub fn handle_silence_verdict(&mut self, now: Duration, alive: bool) {
        if !std::mem::take(&mut self.judging) || self.outcome.is_some() {
            return;
        }
        if matches!(self.phase, Phase::Stream) {
            if alive {
                self.last_byte = self.last_byte.max(now);
            } else {
                self.fail(InferError::Stalled(Silence::Liveness));
            }
            return;
        }
        if !matches!(self.phase, Phase::Sent | Phase::Prefill) {
            return;
        }
        if alive {
            self.wait = FirstByteWait::new(self.limits, now);
            self.next_poll = now + self.poll_every();
        } else {
            self.fail(InferError::Stalled(Silence::IdleGrace));
        }
    }

    /// Takes bytes read from the connection at `now`; returns how many were consumed. All are,
    /// unless the thinking cap is reached (then those up to the end of the capping chunk, and
    /// none until the `reasoning_end` answer: the caller hands the rest back after it) or the
    /// exchange is over (then all, and ignored).
    pub fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize {
        if self.outcome.is_some() || self.finished {
            return input.len();
        }
        if self.capped.is_some() || input.is_empty() {
            return 0;
        }
        if matches!(self.phase, Phase::Sent) {
            self.phase = Phase::Head;
            self.first_byte = now;
        }
        self.last_byte = now;
        let mut rest = input;
        while !rest.is_empty() && self.outcome.is_none() && self.capped.is_none() {
            // Read where `feed` wrote it: moving the event (a chunk is 360 bytes) out of the
            // result and then out of the event cost two copies an event.
            let fed = self.stream.feed(rest);
            let (used, event) = match &fed {
                Ok((used, Status::Complete(event))) => (*used, event),
                Ok((used, Status::Partial)) => {
                    rest = &rest[*used..];
                    continue;
                }
                Err(e) => {
                    let e = *e;
                    self.on_stream_error(e);
                    break;
                }
            };
            rest = &rest[used..];
            // Only the fields the stream does not own are touched while `event` borrows it.
            let seen = match event {
                StreamEvent::Head(status) => Seen::Head(*status),
                StreamEvent::Chunk(c) => {
                    let outputs = &mut self.outputs;
                    chunk_events(c, &mut self.spare, &mut |e| {
                        outputs.push_back(Output::Event(e))
                    });
                    let empty = |t: Option<&str>| t.is_none_or(str::is_empty);
                    Seen::Chunk {
                        finished: c.finish_reason.is_some(),
                        prompt_pending: c.prompt_progress.is_some_and(|p| p.processed < p.total)
                            && c.finish_reason.is_none()
                            && empty(c.content)
                            && empty(c.reasoning_content)
                            && c.tool_calls().is_empty(),
                    }
                }
                StreamEvent::ErrorBody(piece) => {
                    if let Phase::ErrorBody { body, .. } = &mut self.phase {
                        let room = ERROR_BODY_CAP - body.len();
                        body.extend_from_slice(&piece[..piece.len().min(room)]);
                    }
                    Seen::ErrorBody
                }
                StreamEvent::ServerError(e) => Seen::Server(server_error(e)),
                StreamEvent::Done => Seen::Done,
                StreamEvent::End => Seen::End,
                _ => Seen::Idle,
            };
            self.on_seen(now, seen);
        }
        input.len() - rest.len()
    }

    /// The connection ended at `now` (a reset counts as an end).
    pub fn handle_eof(&mut self, _now: Duration) {
        if self.outcome.is_some() {
            return;
        }
        match self.phase {
            Phase::Sent | Phase::Head => self.fail(InferError::StreamClosedEarly),
            Phase::ErrorBody { .. } => self.finish_error(),
            // A body cut anywhere before the final chunk is `StreamClosedEarly` (the
            // conversion says where that can be).
            Phase::Prefill | Phase::Stream => match self.stream.finish() {
                Ok(_) => self.outcome = Some(Ok(())),
                Err(e) => self.fail(e.into()),
            },
        }
    }

    /// What one `/slots` poll said, at `now`.
    pub fn handle_slots(&mut self, now: Duration, seen: SlotSeen) {
        self.polling = false;
        if self.outcome.is_some() || !matches!(self.phase, Phase::Sent | Phase::Prefill) {
            return;
        }
        // An idle slot is the server not yet at this request: nothing to wait on, said.
        if seen != SlotSeen::Idle {
            self.outputs.push_back(Output::Event(ChatEvent::Waiting {
                slot_busy: seen == SlotSeen::Busy,
            }));
        }
        match self.wait.observe(seen, now) {
            Ok(()) => self.next_poll = now + self.poll_every(),
            Err(InferError::Stalled(Silence::IdleGrace)) if self.judge => {
                self.judging = true;
                self.outputs.push_back(Output::JudgeSilence);
            }
            Err(e) => self.fail(e),
        }
    }

    /// Whether the `reasoning_end` call succeeded (a 200 with `success: true`), at `now`.
    pub fn handle_control_answer(&mut self, now: Duration, success: bool) {
        let Some(tokens) = self.capped.take() else {
            return;
        };
        if self.outcome.is_some() {
            return;
        }
        if !success {
            self.fail(InferError::ThinkingOverrun);
            return;
        }
        self.outputs
            .push_back(Output::Event(ChatEvent::ThinkingCapped { tokens }));
        // Bytes that waited in the socket during the call are not the server's silence.
        self.last_byte = self.last_byte.max(now);
    }

    /// Time passed: fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.outcome.is_some() || self.capped.is_some() {
            return;
        }
        let liveness = self.last_byte + ms(self.limits.liveness_ms);
        match self.phase {
            Phase::Sent | Phase::Prefill => {
                let sent = matches!(self.phase, Phase::Sent);
                if sent && self.clip.is_some_and(|at| now >= at) {
                    self.fail(InferError::TimedOut(Deadline::RetryTotal));
                } else if !self.polling && !self.judging && now >= self.next_poll {
                    self.polling = true;
                    self.outputs.push_back(Output::PollSlots);
                }
            }
            Phase::Head => {
                let whole = self.first_byte + ms(self.limits.call_ms);
                if now >= whole.min(liveness) {
                    self.fail(if whole <= liveness {
                        InferError::TimedOut(Deadline::Call)
                    } else {
                        InferError::Stalled(Silence::Liveness)
                    });
                }
            }
            Phase::Stream if now < liveness || self.judging => {}
            Phase::Stream if self.judge => {
                self.judging = true;
                self.outputs.push_back(Output::JudgeSilence);
            }
            Phase::Stream => self.fail(InferError::Stalled(Silence::Liveness)),
            Phase::ErrorBody { until, .. } if now >= until.min(liveness) => self.finish_error(),
            Phase::ErrorBody { .. } => {}
        }
    }

    /// The caller cancelled the request.
    pub fn cancel(&mut self) {
        self.fail(InferError::Cancelled);
    }

    /// The next thing to do, in order.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Gives back an event from [`poll_output`](Self::poll_output) once it was shown: the
    /// text of later events is written into its strings rather than new ones (optional; it
    /// saves an allocation an event).
    pub fn recycle(&mut self, event: ChatEvent) {
        self.spare.keep(event);
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due (on the clock of `now`);
    /// `None` when no timer runs (over, or waiting for a `/slots` or control answer).
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.outcome.is_some() || self.capped.is_some() {
            return None;
        }
        let liveness = self.last_byte + ms(self.limits.liveness_ms);
        match &self.phase {
            Phase::Sent if self.polling || self.judging => self.clip,
            Phase::Sent => Some(self.clip.map_or(self.next_poll, |c| c.min(self.next_poll))),
            Phase::Prefill if self.polling || self.judging => None,
            Phase::Prefill => Some(self.next_poll),
            Phase::Head => Some(liveness.min(self.first_byte + ms(self.limits.call_ms))),
            Phase::Stream if self.judging => None,
            Phase::Stream => Some(liveness),
            Phase::ErrorBody { until, .. } => Some(liveness.min(*until)),
        }
    }

    /// How long after a `/slots` answer the next is asked: `poll_ms` before the head;
    /// `liveness_ms` in the prefill after it, where the server has taken the request and the
    /// only question is whether it is still on it (each poll is a connection, and inferproxy
    /// admits 2 a second).
    fn poll_every(&self) -> Duration {
        ms(match self.phase {
            Phase::Prefill => self.limits.liveness_ms,
            _ => self.limits.poll_ms,
        })
    }

    /// Whether the server's answer has begun: the stream's first event past the prompt (or
    /// an error body) arrived. Before it the server is still on the prompt, whatever bytes of
    /// the head and of prompt progress came.
    pub fn answering(&self) -> bool {
        matches!(self.phase, Phase::Stream | Phase::ErrorBody { .. })
    }

    /// Whether the request is over (its result is ready or taken).
    pub fn is_over(&self) -> bool {
        self.outcome.is_some() || self.finished
    }

    /// The completion or the error, once, when the request is over.
    pub fn take_result(&mut self) -> Option<Result<Completion, InferError>> {
        let outcome = self.outcome.take()?;
        self.finished = true;
        Some(outcome.and_then(|()| completion(self.stream.assembler(), self.cap.capped())))
    }

    /// What was assembled so far.
    pub fn partial(&self) -> Partial {
        partial(self.stream.assembler())
    }

    /// Ends the exchange and hands its storage back.
    pub fn into_storage(self) -> Storage<'b> {
        Storage::from_stream(self.stream)
    }

    fn fail(&mut self, e: InferError) {
        if self.outcome.is_none() && !self.finished {
            self.outcome = Some(Err(e));
        }
    }

    fn on_stream_error(&mut self, e: StreamError) {
        if matches!(self.phase, Phase::ErrorBody { .. }) {
            // A broken error body still says what the status said.
            self.finish_error();
        } else {
            self.fail(e.into());
        }
    }

    /// What an event of the stream means for the request.
    fn on_seen(&mut self, now: Duration, seen: Seen) {
        let prefill_goes_on = matches!(
            seen,
            Seen::Idle
                | Seen::Chunk {
                    prompt_pending: true,
                    ..
                }
        );
        if matches!(self.phase, Phase::Prefill) && !prefill_goes_on {
            // The prompt is processed: liveness runs from this event.
            self.phase = Phase::Stream;
        }
        match seen {
            Seen::Head(status) => {
                if status == 200 {
                    self.next_poll = now + ms(self.limits.liveness_ms);
                }
                self.phase = if status == 200 {
                    Phase::Prefill
                } else {
                    Phase::ErrorBody {
                        status,
                        body: Vec::new(),
                        until: now + ms(self.limits.call_ms),
                    }
                };
            }
            // Nothing may follow the final chunk but `[DONE]`; stop reading here.
            Seen::Chunk { finished: true, .. } | Seen::Done => self.outcome = Some(Ok(())),
            Seen::Chunk {
                finished: false, ..
            } => {
                match self.cap.check(self.stream.assembler().reasoning_tokens()) {
                    CapAction::None => {}
                    CapAction::Overrun => self.fail(InferError::ThinkingOverrun),
                    CapAction::EndReasoning(tokens) => {
                        let id = self.stream.assembler().id().unwrap_or_default().to_owned();
                        if id.is_empty() {
                            // No id to name in the control call: the cap cannot be enforced.
                            self.fail(InferError::ThinkingOverrun);
                            return;
                        }
                        self.capped = Some(tokens);
                        self.outputs.push_back(Output::EndReasoning { id });
                    }
                }
            }
            Seen::ErrorBody => {
                if matches!(&self.phase, Phase::ErrorBody { body, .. } if body.len() == ERROR_BODY_CAP)
                {
                    self.finish_error();
                }
            }
            Seen::Server(e) => self.fail(e),
            Seen::End => match self.phase {
                Phase::ErrorBody { .. } => self.finish_error(),
                _ => self.outcome = Some(Ok(())),
            },
            Seen::Idle => {}
        }
    }

    fn finish_error(&mut self) {
        if let Phase::ErrorBody { status, body, .. } = &self.phase {
            let e = InferError::Http {
                status: *status,
                body: capped_body(body),
            };
            self.fail(e);
        }
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[cfg(test)]
mod tests;
