//! [`AgentRequest`]: one agent request as a sans-IO machine (seed 003, appendix G), in the
//! shape of llama-worker's `Policy` and the client's [`ChatExchange`], which it nests for the
//! generation under way.
//!
//! Inputs, each with `now`: what the driver did about an action ([`handle_sent`],
//! [`handle_bytes`], [`handle_eof`], [`handle_slots`], [`handle_control_answer`],
//! [`handle_tool_result`], [`handle_worker_status`], [`handle_stall_answer`],
//! [`handle_registered`], [`handle_worker_failed`]), time passing
//! ([`handle_timeout`]) and [`cancel`]. Outputs: [`Action`]s from [`poll_action`], in order,
//! and [`poll_timeout`], the time the machine next needs [`handle_timeout`]. It decides
//! everything a request decides: the BIOS, the budget, exit tools, fallback parsing, loop
//! detection, stall bookkeeping, tool deadlines, and why it failed (its own reason first,
//! then the worker's, then the client's). It never blocks, spawns or reads a clock; the
//! driver in `drive.rs` does the IO.
//!
//! A request with a [`Summarize`](super::Summarize) sends its summary generation first: the
//! BIOS, the system message and the messages to summarize, with the generations' tools and
//! options (`max_tokens` its own, thinking off). It is the same [`ChatCall`] under the same
//! policy as every generation (gate, retries, registration, stalls, loop detection, cancel),
//! so its failure ends the request with the reason a generation's would, and no output. Its
//! answer's content is written into the user message it names, [`RequestEvent::Summarized`]
//! goes out, and generation 1 starts. It counts as no generation: not in the result's
//! generations or transcript, no budget, no `Generation` event, no cache baseline; its retries
//! are recorded as generation 0's.
//!
//! With a worker socket each generation is registered with llama-worker before it is sent
//! (`register <slot>`), its first token and then its bytes at most every [`PROGRESS_EVERY`]
//! are reported (`progress <id> first_byte|bytes`), and it is unregistered (`done <id>`) when
//! it ends, after any stall report about it (`stall <id>`). A failure the worker pushes for the
//! generation ([`handle_worker_failed`]) ends the request at once. A registered generation's
//! silences are the worker's to judge: when the slot stays idle for `limits.idle_grace_ms`
//! with no answer yet (the head and `prompt_progress` are not one: llama-server sends them as
//! soon as it takes the request), or the stream is silent for `runner.stall_ms`, it is
//! reported as a stall, and the wait starts over while the worker says `not_stalled` (it has
//! seen the server's CPU time work on the prompt, or the generation's slot decode tokens that
//! are not streamed yet, such as a tool call's opening).
//!
//! [`handle_sent`]: AgentRequest::handle_sent
//! [`handle_bytes`]: AgentRequest::handle_bytes
//! [`handle_eof`]: AgentRequest::handle_eof
//! [`handle_slots`]: AgentRequest::handle_slots
//! [`handle_control_answer`]: AgentRequest::handle_control_answer
//! [`handle_tool_result`]: AgentRequest::handle_tool_result
//! [`handle_worker_status`]: AgentRequest::handle_worker_status
//! [`handle_stall_answer`]: AgentRequest::handle_stall_answer
//! [`handle_registered`]: AgentRequest::handle_registered
//! [`handle_worker_failed`]: AgentRequest::handle_worker_failed
//! [`handle_timeout`]: AgentRequest::handle_timeout
//! [`cancel`]: AgentRequest::cancel
//! [`poll_action`]: AgentRequest::poll_action
//! [`poll_timeout`]: AgentRequest::poll_timeout

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use llama_proto::{cache_outcome, FinishReason, JsonError, LoopDetector};

use super::RunnerConfig;
use loopd_client::clock::Jitter;
use loopd_client::config::{Limits, Retry};
use loopd_client::llama::{
    CallOutput, ChatCall, ChatEvent, ChatMessage, ChatRequest, Completion, Deadline, Failed,
    InferError, Partial, SlotSeen, Storage, Timings, ToolCall, ToolSchema,
};

use super::answer::asked;
use super::bios::{BiosContext, BiosProvider};
use super::worker::{
    ProgressKind, RegisterAnswer, StallAnswer, WorkerError, WorkerFailReason, WorkerState,
    WorkerStatus,
};
use super::{
    CallSource, FailReason, GenerationStats, Outcome, RequestEvent, RequestId, RequestResult,
    RetryRecord, Submission, Summarize, ToolError, ToolRecord, ToolRegistry,
};

/// The generation's stream bytes are reported to llama-worker at most this often (after the
/// first byte, reported at once): the worker's view of the last byte is at most this old.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What the machine asks of its driver.
#[derive(Debug)]
pub enum Action {
    /// Show this event to whoever watches the request.
    Event(RequestEvent),
    /// Take the slot gate for the request's slot; answer with
    /// [`handle_acquired`](AgentRequest::handle_acquired).
    Acquire,
    /// Connect and send this request, then call
    /// [`handle_sent`](AgentRequest::handle_sent) or, when it could not be sent,
    /// [`handle_send_error`](AgentRequest::handle_send_error).
    Send(ChatRequest),
    /// Ask `/slots` about the request's slot; answer with
    /// [`handle_slots`](AgentRequest::handle_slots).
    PollSlots,
    /// Post `reasoning_end` for completion `id`; answer with
    /// [`handle_control_answer`](AgentRequest::handle_control_answer).
    EndReasoning {
        /// The completion id.
        id: String,
    },
    /// The generation is over: close its connection (the server stops generating).
    Close {
        /// The connection is closed while the server may still be generating (a cancel, a
        /// stall, a deadline: [`InferError::may_leave_slot_busy`]): mark the slot abandoned,
        /// so its next request waits for `/slots` to say it is idle.
        abandoned: bool,
    },
    /// Run a tool call (on a thread of its own); answer with
    /// [`handle_tool_result`](AgentRequest::handle_tool_result).
    RunTool {
        /// The call's id, given back with the result.
        id: String,
        /// The registered tool to run.
        name: String,
        /// Its arguments, already checked to be a JSON object.
        arguments: serde_json::Value,
    },
    /// The machine gave up on the call `id` (its deadline, a cancel, a restart): tell the
    /// tool through its cancel token and forget it; a late result is ignored.
    CancelTool {
        /// The call's id.
        id: String,
    },
    /// Read llama-worker's status; answer with
    /// [`handle_worker_status`](AgentRequest::handle_worker_status).
    WorkerStatus,
    /// Report a stall to llama-worker (`stall <id>` for a registered generation, else a bare
    /// `stall`); answer with [`handle_stall_answer`](AgentRequest::handle_stall_answer).
    ReportStall {
        /// The generation's id with the worker, when it is registered.
        generation: Option<u64>,
    },
    /// Register the generation about to be sent with llama-worker (`register <slot>`);
    /// answer with [`handle_registered`](AgentRequest::handle_registered). Its
    /// [`Action::Send`] follows the answer.
    RegisterGeneration,
    /// Report stream progress of the registered generation `id`; no answer is needed.
    ReportProgress {
        /// The generation's id with the worker.
        id: u64,
        /// `first_byte` once, then `bytes`.
        kind: ProgressKind,
    },
    /// The registered generation `id` ended: unregister it (`done <id>`); no answer is
    /// needed.
    GenerationDone {
        /// The generation's id with the worker.
        id: u64,
    },
    /// The request is over: its result. Nothing follows.
    Done(Box<RequestResult>),
}

/// What an [`AgentRequest`] is made from, besides the request itself.
pub struct Setup<'a> {
    /// The request's id.
    pub id: RequestId,
    /// Its slot (runner slot = server slot).
    pub slot: u32,
    /// The client's timers and caps (for the nested exchange).
    pub limits: Limits,
    /// The retry schedule of each generation (`[retry]`).
    pub retry: Retry,
    /// The jitter of the waits between attempts.
    pub jitter: Arc<dyn Jitter>,
    /// The runner's settings.
    pub settings: &'a RunnerConfig,
    /// The tools offered.
    pub tools: &'a ToolRegistry,
    /// Writes the BIOS.
    pub bios: Arc<dyn BiosProvider>,
    /// llama-worker's `spawns` at admission; `None` without a worker socket.
    pub spawns: Option<u64>,
}

/// Which answer the failure policy waits for from the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Stall,
    Status,
}

/// A tool call under way.
#[derive(Debug)]
struct Running {
    call: ToolCall,
    source: CallSource,
    deadline: Duration,
}

enum Phase<'b> {
    /// Between two steps (never seen from outside).
    Between,
    /// The generation's call: the gate, the attempts and the waits between them.
    Generating(Box<ChatCall<'b>>),
    /// An attempt failed with the client's error (held in the call); the worker is asked why.
    Concluding {
        call: Box<ChatCall<'b>>,
        ask: Ask,
    },
    /// An iteration's calls: those still to run, and the one running.
    Tools {
        calls: VecDeque<(ToolCall, CallSource)>,
        running: Option<Running>,
    },
    Done,
}

/// One agent request, as a sans-IO machine: `runner/agent.rs`'s module docs say how it is
/// driven (the module is private; the machine is what the crate exports).
pub struct AgentRequest<'b> {
    slot: u32,
    req: Submission,
    limits: Limits,
    retry: Retry,
    jitter: Arc<dyn Jitter>,
    settings: RunnerConfig,
    tools: ToolRegistry,
    schemas: Vec<ToolSchema>,
    exit_names: Vec<String>,
    /// The provider, for the budget notes.
    bios: Arc<dyn BiosProvider>,
    /// The BIOS, written once: a BIOS that changed would cost the whole prompt cache.
    bios_text: String,
    spawns: Option<u64>,
    r: RequestResult,
    iterations: u32,
    phase: Phase<'b>,
    storage: Option<Storage<'b>>,
    actions: VecDeque<Action>,
    /// The machine's own reason to end (a loop, a cancel, a restart); the first one wins.
    fail: Option<(FailReason, String)>,
    started: Duration,
    loops: (Option<LoopDetector>, Option<LoopDetector>),
    last_progress: Duration,
    reported: Option<Duration>,
    previous: Option<Timings>,
    next_status: Duration,
    status_out: bool,
    stall_out: bool,
    /// A registration is out for the attempt about to be sent.
    registering: bool,
    /// The kind of the error that the attempt being retried failed with.
    retrying: Option<&'static str>,
    /// The generation's id with the worker, while registered.
    generation: Option<u64>,
    /// When its progress was last reported; `None` before its first byte.
    progressed: Option<Duration>,
    /// A stall report is out to judge a silent prefill (the exchange waits for it).
    judging: bool,
    /// The judge said the silent prefill is not alive: the stall was reported already.
    silence_reported: bool,
    /// Until when a generation that broke off waits for the worker to explain it.
    explain_by: Option<Duration>,
}

impl std::fmt::Debug for AgentRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRequest")
            .field("id", &self.r.id)
            .field("slot", &self.slot)
            .field("budget_left", &self.r.budget_left)
            .finish_non_exhaustive()
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// A result with no output yet: the whole budget left.
pub(super) fn no_output(id: RequestId, budget: u32, outcome: Outcome) -> RequestResult {
    RequestResult {
        id,
        outcome,
        content: None,
        reasoning_content: None,
        transcript: Vec::new(),
        tool_calls: Vec::new(),
        exits: Vec::new(),
        generations: Vec::new(),
        budget,
        budget_left: budget,
        stalls: Vec::new(),
        retries: Vec::new(),
        host: None,
    }
}

/// What a request starts with: the tools it offers and the BIOS its generations open with.
pub(super) struct Opening {
    pub tools: ToolRegistry,
    pub schemas: Vec<loopd_client::llama::ToolSchema>,
    pub exit_names: Vec<String>,
    pub bios_text: String,
}

/// The request's choice of `registry`'s tools (what its generations offer; a call to any
/// other is refused as a call to an unknown one) and the BIOS `bios` writes for it with
/// `budget` iterations: the same text the machine sends, so a session key hashed from it
/// (`fleet::SessionKey`) is the one the server's prompt cache sees.
pub(super) fn opening(
    registry: &ToolRegistry,
    bios: &dyn BiosProvider,
    req: &Submission,
    budget: u32,
) -> Opening {
    let tools = match &req.tools {
        Some(names) => registry.only(names),
        None => registry.clone(),
    };
    let schemas = tools.schemas();
    let exit_names: Vec<String> = schemas
        .iter()
        .filter(|s| tools.is_exit(&s.name))
        .map(|s| s.name.clone())
        .collect();
    let bios_text = bios.bios(&BiosContext {
        budget_left: budget,
        budget,
        iterations: 0,
        tools: &schemas,
        exit_tools: &exit_names,
    });
    Opening {
        tools,
        schemas,
        exit_names,
        bios_text,
    }
}

impl<'b> AgentRequest<'b> {
    /// The request `req` at `now`, assembling into `storage`; its first action sends its
    /// summary generation when it has a [`Summarize`], else generation 1.
    pub fn new(now: Duration, setup: Setup<'_>, req: Submission, storage: Storage<'b>) -> Self {
        let budget = req.budget.unwrap_or(setup.settings.budget);
        let Opening {
            tools,
            schemas,
            exit_names,
            bios_text,
        } = opening(setup.tools, &*setup.bios, &req, budget);
        let completed = Outcome::Completed {
            finish_reason: FinishReason::Stop,
        };
        let mut m = AgentRequest {
            slot: setup.slot,
            req,
            limits: setup.limits,
            retry: setup.retry,
            jitter: setup.jitter,
            settings: setup.settings.clone(),
            tools,
            schemas,
            exit_names,
            bios: setup.bios,
            bios_text,
            spawns: setup.spawns,
            r: no_output(setup.id, budget, completed),
            iterations: 0,
            phase: Phase::Between,
            storage: Some(storage),
            actions: VecDeque::new(),
            fail: None,
            started: now,
            loops: (None, None),
            last_progress: now,
            reported: None,
            previous: None,
            next_status: now + ms(setup.settings.worker_poll_ms),
            status_out: false,
            stall_out: false,
            registering: false,
            retrying: None,
            generation: None,
            progressed: None,
            judging: false,
            silence_reported: false,
            explain_by: None,
        };
        m.start_generation(now);
        m
    }

    /// The next thing to do, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether the result has been handed out (as [`Action::Done`]) or is queued.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due; `None` when only an
    /// answer from the driver can move the request on.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let mut at: Option<Duration> = None;
        let mut add = |t: Option<Duration>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        match &self.phase {
            Phase::Done => return None,
            Phase::Generating(call) => {
                add(call.poll_timeout());
                add(self.stall_due());
            }
            Phase::Tools {
                running: Some(run), ..
            } => add(Some(run.deadline)),
            _ => {}
        }
        if self.worker() && !self.status_out {
            add(Some(self.next_status));
        }
        at
    }

    /// The gate's answer: the slot is this request's (`after_abandoned`: its previous
    /// holder abandoned it, so `/slots` is asked until it is idle), or the error.
    pub fn handle_acquired(&mut self, now: Duration, acquired: Result<bool, InferError>) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_acquired(now, acquired);
            self.pump(now);
        }
    }

    /// The request went out at `now`: its answer is awaited.
    pub fn handle_sent(&mut self, now: Duration) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_sent(now);
            // Stream progress is counted from the send, not from the gate or a retry's wait.
            self.last_progress = now;
            self.reported = None;
            self.pump(now);
        }
    }

    /// The request could not be sent (`Connect`, `TimedOut(Connect)`, a cancel).
    pub fn handle_send_error(&mut self, now: Duration, error: InferError) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_send_error(now, error);
            self.pump(now);
        }
    }

    /// Bytes read from the connection at `now`; returns how many were consumed (all, unless
    /// a `reasoning_end` is out: then none until its answer).
    pub fn handle_bytes(&mut self, now: Duration, input: &[u8]) -> usize {
        let Phase::Generating(call) = &mut self.phase else {
            return input.len();
        };
        let used = call.handle_bytes(now, input);
        // The head comes as soon as the server takes the request: the worker judges the
        // prefill by CPU time until the first event (appendix J), so that is the first byte.
        let answering = used > 0 && call.answering();
        // The read's events go out first: the caller's first token does not wait for the
        // worker's round trip (`make bench-e2e`'s trace found one on the path).
        self.pump(now);
        if answering {
            self.report_progress(now);
        }
        used
    }

    /// The connection ended at `now`.
    pub fn handle_eof(&mut self, now: Duration) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_eof(now);
            self.pump(now);
        }
    }

    /// What a `/slots` poll said.
    pub fn handle_slots(&mut self, now: Duration, seen: SlotSeen) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_slots(now, seen);
            self.pump(now);
        }
    }

    /// Whether `reasoning_end` succeeded.
    pub fn handle_control_answer(&mut self, now: Duration, success: bool) {
        if let Phase::Generating(call) = &mut self.phase {
            call.handle_control_answer(now, success);
            self.pump(now);
        }
    }

    /// The result of the call `id`; ignored unless that call is the one running.
    pub fn handle_tool_result(
        &mut self,
        now: Duration,
        id: &str,
        result: Result<String, ToolError>,
    ) {
        let Phase::Tools { running, .. } = &mut self.phase else {
            return;
        };
        if running.as_ref().is_none_or(|r| r.call.id != id) {
            return;
        }
        let Some(run) = running.take() else { return };
        self.tool_done(now, run, result);
    }

    /// llama-worker's status (or why it could not be read).
    pub fn handle_worker_status(
        &mut self,
        now: Duration,
        status: Result<WorkerStatus, WorkerError>,
    ) {
        self.status_out = false;
        self.next_status = now + ms(self.settings.worker_poll_ms);
        if let Ok(st) = &status {
            self.check_restart(st);
        }
        if let Phase::Concluding {
            ask: Ask::Status, ..
        } = self.phase
        {
            // A generation that broke off waits for the worker's push (or a restart on the
            // status poll) until `death_grace_ms`.
            let waiting = self.explain_by.is_some_and(|t| now < t);
            if self.fail.is_some() || !waiting {
                self.conclude(now);
            }
        } else if self.fail.is_some() {
            self.abort(now);
        }
    }

    /// llama-worker's answer to a stall report (or why there was none).
    pub fn handle_stall_answer(&mut self, now: Duration, answer: Result<StallAnswer, WorkerError>) {
        self.stall_out = false;
        let alive = matches!(answer, Ok(StallAnswer::NotStalled { .. }));
        if let Ok(a) = answer {
            self.r.stalls.push(a);
            self.actions
                .push_back(Action::Event(RequestEvent::Stall(a)));
            if a == StallAnswer::Restarting {
                let prefill = matches!(&self.phase, Phase::Generating(c) if !c.answering());
                let detail = if self.judging && prefill {
                    format!(
                        "no byte while the slot was idle for {} ms (limits.idle_grace_ms); \
                         llama-worker saw no progress either and restarted llama-server",
                        self.limits.idle_grace_ms
                    )
                } else {
                    format!(
                        "no stream progress for {} ms (runner.stall_ms); llama-worker saw none \
                         either and restarted llama-server",
                        self.settings.stall_ms
                    )
                };
                self.set_fail(FailReason::WorkerRestarted, detail);
            }
        }
        if std::mem::take(&mut self.judging) {
            if let Phase::Generating(call) = &mut self.phase {
                let alive = alive && self.fail.is_none();
                self.silence_reported = !alive;
                call.handle_silence_verdict(now, alive);
                self.pump(now);
                return;
            }
        }
        if let Phase::Concluding {
            ask: Ask::Stall, ..
        } = self.phase
        {
            self.unregister();
            if self.fail.is_some() {
                self.conclude(now);
            } else {
                self.ask_worker(Ask::Status);
            }
        } else if self.fail.is_some() {
            self.abort(now);
        }
    }

    /// llama-worker's answer to `register` (or why there was none). Registered: the
    /// attempt is sent, its silent prefill the worker's to judge. Refused: the worker is not
    /// ready, the request fails with its output so far. No answer: it is sent unregistered
    /// (the status poll still watches it).
    pub fn handle_registered(
        &mut self,
        now: Duration,
        answer: Result<RegisterAnswer, WorkerError>,
    ) {
        if !std::mem::take(&mut self.registering) {
            return;
        }
        if let Ok(RegisterAnswer::Registered(id)) = answer {
            self.generation = Some(id);
        }
        if let Ok(RegisterAnswer::SlotTaken) = answer {
            let detail = format!(
                "llama-worker refused to register {}: another client's generation holds server \
                 slot {} (slot_taken)",
                self.generation_name(),
                self.slot
            );
            self.set_fail(FailReason::Client(InferError::Busy), detail);
        }
        if let Ok(RegisterAnswer::Refused(state)) = answer {
            let reason = match state {
                WorkerState::Stopped => FailReason::WorkerStopped,
                _ => FailReason::WorkerRestarted,
            };
            let detail = format!(
                "llama-worker refused to register {} (worker {})",
                self.generation_name(),
                state.as_str()
            );
            self.set_fail(reason, detail);
        }
        if self.fail.is_some() {
            self.abort(now);
            return;
        }
        let registered = self.generation.is_some();
        if let Phase::Generating(call) = &mut self.phase {
            call.judge_silence(registered);
            let chat = call.request().clone();
            self.actions.push_back(Action::Send(chat));
        }
    }

    /// llama-worker pushed the failure of generation `id` on its watch channel (and forgot
    /// it): the request ends at once with `reason` and its output so far. An id that is not
    /// the registered generation's is stale and ignored.
    pub fn handle_worker_failed(&mut self, now: Duration, id: u64, reason: WorkerFailReason) {
        if self.generation != Some(id) {
            return;
        }
        self.generation = None;
        let (reason, what) = match reason {
            WorkerFailReason::WorkerRestarted => (
                FailReason::WorkerRestarted,
                "llama-worker restarted llama-server",
            ),
            WorkerFailReason::ServerDied => {
                (FailReason::ServerDied, "llama-server died on its own")
            }
            WorkerFailReason::WorkerStopped => {
                (FailReason::WorkerStopped, "llama-worker was stopped")
            }
        };
        self.set_fail(
            reason,
            format!("{what} (generation {id}, pushed on the watch)"),
        );
        self.abort(now);
    }

    /// Time passed: fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        match &mut self.phase {
            Phase::Done => return,
            Phase::Generating(call) => {
                call.handle_timeout(now);
                self.pump(now);
            }
            Phase::Tools { running, .. } if running.as_ref().is_some_and(|r| now >= r.deadline) => {
                if let Some(run) = running.take() {
                    self.actions.push_back(Action::CancelTool {
                        id: run.call.id.clone(),
                    });
                    let after_ms = self.settings.tool_timeout_ms;
                    self.tool_done(now, run, Err(ToolError::TimedOut { after_ms }));
                }
            }
            _ => {}
        }
        if self.stall_due().is_some_and(|at| now >= at) {
            self.reported = Some(now);
            self.stall_out = true;
            let generation = self.generation;
            self.actions.push_back(Action::ReportStall { generation });
        }
        if self.worker() && !self.status_out && !self.is_done() && now >= self.next_status {
            self.status_out = true;
            self.actions.push_back(Action::WorkerStatus);
        }
    }

    /// The caller cancelled the request: it ends as `cancelled` with its output so far.
    pub fn cancel(&mut self, now: Duration) {
        self.cancel_because(now, "cancelled by the caller");
    }

    /// [`cancel`](Self::cancel) by someone else than the caller, `detail` saying who (the
    /// daemon's shutdown): the same `cancelled` reason, the detail in its words.
    pub fn cancel_because(&mut self, now: Duration, detail: &str) {
        self.set_fail(FailReason::Cancelled, detail.into());
        self.abort(now);
    }

    /// The generation about to be sent found its host's inference socket refusing (nothing
    /// was sent) and the request was placed on `slot` of another host, whose worker's
    /// `spawns` is `spawns`: the generation starts again there at once, a cold prefill, its
    /// retry schedule from the start. The old host's registration is dropped without a
    /// `done` (that host is lost; its worker forgets the registration with the watch). Only
    /// while the generation has not been sent; otherwise nothing happens.
    pub fn handle_rehomed(&mut self, now: Duration, slot: u32, spawns: Option<u64>) {
        if !matches!(&self.phase, Phase::Generating(call) if !call.sent()) || self.fail.is_some() {
            return;
        }
        let Phase::Generating(call) = std::mem::replace(&mut self.phase, Phase::Between) else {
            return;
        };
        self.storage = Some(call.into_storage());
        self.generation = None;
        self.progressed = None;
        self.registering = false;
        self.slot = slot;
        self.spawns = spawns;
        self.start_generation(now);
    }

    /// The request's host was lost (fleet health): it ends `host_lost` with its partial
    /// output, whatever it was doing; nothing is retried.
    pub fn handle_host_lost(&mut self, now: Duration, detail: String) {
        if matches!(self.phase, Phase::Done) {
            return;
        }
        self.set_fail(FailReason::HostLost, detail);
        self.abort(now);
    }

    fn worker(&self) -> bool {
        self.settings.worker_socket.is_some()
    }

    /// When a stall report is next due: while generating with a worker socket and no report
    /// out, one `stall_ms` after the later of the last progress and the last report.
    fn stall_due(&self) -> Option<Duration> {
        let generating = matches!(&self.phase, Phase::Generating(call) if call.in_flight());
        (generating && self.worker() && !self.stall_out && self.fail.is_none()).then(|| {
            self.reported
                .unwrap_or(self.last_progress)
                .max(self.last_progress)
                + ms(self.settings.stall_ms)
        })
    }

    /// Reports the registered generation's stream progress: its first byte at once, then at
    /// most every [`PROGRESS_EVERY`].
    fn report_progress(&mut self, now: Duration) {
        let Some(id) = self.generation else { return };
        let kind = match self.progressed {
            None => ProgressKind::FirstByte,
            Some(at) if now >= at + PROGRESS_EVERY => ProgressKind::Bytes,
            Some(_) => return,
        };
        self.progressed = Some(now);
        self.actions.push_back(Action::ReportProgress { id, kind });
    }

    /// The generation ended: unregister it with the worker.
    fn unregister(&mut self) {
        self.progressed = None;
        if let Some(id) = self.generation.take() {
            self.actions.push_back(Action::GenerationDone { id });
        }
    }

    fn set_fail(&mut self, reason: FailReason, detail: String) {
        if self.fail.is_none() {
            self.fail = Some((reason, detail));
        }
    }

    /// Ends whatever runs with the machine's own reason.
    fn abort(&mut self, now: Duration) {
        let Some((reason, detail)) = self.fail.clone() else {
            return;
        };
        match &mut self.phase {
            Phase::Between | Phase::Done => {}
            Phase::Generating(call) => {
                call.cancel(now);
                self.pump(now);
            }
            Phase::Concluding { .. } => self.conclude(now),
            Phase::Tools { running, .. } => {
                if let Some(run) = running.take() {
                    self.actions.push_back(Action::CancelTool {
                        id: run.call.id.clone(),
                    });
                    self.tool_done(now, run, Err(ToolError::Cancelled));
                } else {
                    self.end(Outcome::Failed { reason, detail });
                }
            }
        }
    }

    /// Fails the request if the worker no longer runs the server it was admitted under.
    fn check_restart(&mut self, st: &WorkerStatus) {
        let Some(spawns) = self.spawns else { return };
        if st.state == WorkerState::Ready && st.spawns == spawns {
            return;
        }
        let (reason, what) = match st.state {
            WorkerState::Stopped => (FailReason::WorkerStopped, "llama-worker was stopped"),
            _ if st.server_died() => (FailReason::ServerDied, "llama-server died on its own"),
            _ => (
                FailReason::WorkerRestarted,
                "llama-worker restarted llama-server",
            ),
        };
        let detail = format!(
            "{what} (worker {}, spawn {} -> {})",
            st.state.as_str(),
            spawns,
            st.spawns
        );
        self.set_fail(reason, detail);
    }

    /// Whether the generation under way (or about to start) is the summary generation.
    fn summarizing(&self) -> bool {
        self.req.summarize.is_some()
    }

    /// The generation under way, as a failure's detail names it.
    fn generation_name(&self) -> String {
        if self.summarizing() {
            "the summary generation".into()
        } else {
            format!("generation {}", self.r.generations.len() + 1)
        }
    }

    /// Starts the summary generation while the request has a [`Summarize`] not yet answered,
    /// else its next own generation.
    fn start_generation(&mut self, now: Duration) {
        let bios = self.bios_text.clone();
        let mut messages =
            Vec::with_capacity(self.req.messages.len() + self.r.transcript.len() + 2);
        messages.push(ChatMessage::System { content: bios });
        if let Some(system) = &self.req.system {
            messages.push(ChatMessage::System {
                content: system.clone(),
            });
        }
        let mut options = self.req.options.clone();
        match &self.req.summarize {
            // The same BIOS, system message and tools as the generations after it, so the
            // server's prompt cache keeps that prefix for generation 1.
            Some(summarize) => {
                messages.extend(summarize.messages.iter().cloned());
                options.max_tokens = Some(summarize.max_tokens);
                options.thinking = false;
            }
            None => {
                messages.extend(self.req.messages.iter().cloned());
                messages.extend(self.r.transcript.iter().cloned());
                self.actions
                    .push_back(Action::Event(RequestEvent::Generation {
                        number: self.r.generations.len() as u32 + 1,
                        budget_left: self.r.budget_left,
                    }));
            }
        }
        let chat = ChatRequest {
            slot: self.slot,
            messages,
            tools: self.schemas.clone(),
            options,
        };
        let Some(storage) = self.storage.take() else {
            return;
        };
        let jitter = Arc::clone(&self.jitter);
        let mut call = ChatCall::new(now, self.limits, &self.retry, jitter, chat, storage);
        // Each failed attempt waits for the failure policy (the worker's word) before the
        // schedule may retry it.
        call.hold();
        self.phase = Phase::Generating(Box::new(call));
        self.started = now;
        // The config was validated, so the detector accepts it; an invalid one in code is a
        // detector that never fires rather than a panic.
        let loops = self.settings.loop_detector;
        self.loops = (LoopDetector::new(loops).ok(), LoopDetector::new(loops).ok());
        self.last_progress = now;
        self.reported = None;
        self.pump(now);
    }

    /// Hands on what the call asked for; then a failed attempt goes to the failure policy,
    /// and a call that is over ends the generation.
    fn pump(&mut self, now: Duration) {
        loop {
            let Phase::Generating(call) = &mut self.phase else {
                return;
            };
            let mut outputs = Vec::new();
            while let Some(o) = call.poll_output() {
                outputs.push(o);
            }
            let drained = outputs.is_empty();
            for o in outputs {
                self.on_call_output(now, o);
            }
            let Phase::Generating(call) = &mut self.phase else {
                return;
            };
            if self.fail.is_some() && !call.is_over() && call.held().is_none() {
                call.cancel(now);
                continue;
            }
            if call.held().is_some() {
                self.generation_failed(now);
                return;
            }
            if call.is_over() {
                break;
            }
            if drained {
                return;
            }
        }
        let Phase::Generating(mut call) = std::mem::replace(&mut self.phase, Phase::Between) else {
            return;
        };
        let result = call.take_result();
        let sent = call.sent();
        self.storage = Some(call.into_storage());
        match (result, self.fail.clone()) {
            (Some(Ok(done)), None) => self.answered(now, done),
            // Stopped by the machine while the rest of the stream was in hand: its reason
            // stands, with the whole output kept.
            (Some(Ok(done)), Some((reason, detail))) => {
                self.keep_partial(now, done.into());
                self.unregister();
                self.end(Outcome::Failed { reason, detail });
            }
            (Some(Err(Failed { error, partial })), fail) => {
                // A generation stopped before anything went out is no generation.
                if sent || !matches!(error, InferError::Cancelled) {
                    self.keep_partial(now, partial);
                }
                let (reason, detail) = match (fail, error) {
                    (Some(f), _) => f,
                    (None, InferError::Cancelled) => (FailReason::Cancelled, "cancelled".into()),
                    (None, e) => (FailReason::Client(e.clone()), e.to_string()),
                };
                self.end(Outcome::Failed { reason, detail });
            }
            (None, _) => {
                let (reason, detail) = self
                    .fail
                    .clone()
                    .unwrap_or((FailReason::Cancelled, "cancelled".into()));
                self.end(Outcome::Failed { reason, detail });
            }
        }
    }

    /// One output of the generation's call, as the machine's action.
    fn on_call_output(&mut self, now: Duration, o: CallOutput) {
        match o {
            CallOutput::Event(e) => self.on_chat_event(now, e),
            CallOutput::Acquire => self.actions.push_back(Action::Acquire),
            CallOutput::PollSlots => self.actions.push_back(Action::PollSlots),
            // With a worker, each attempt is registered first; its answer sends it.
            CallOutput::Send if self.worker() => {
                self.registering = true;
                self.actions.push_back(Action::RegisterGeneration);
            }
            CallOutput::Send => {
                if let Phase::Generating(call) = &self.phase {
                    self.actions.push_back(Action::Send(call.request().clone()));
                }
            }
            CallOutput::EndReasoning { id } => self.actions.push_back(Action::EndReasoning { id }),
            CallOutput::JudgeSilence => {
                self.judging = true;
                // A report already out (the periodic one, due at the same silence with the
                // defaults) is the question: its answer is the verdict.
                if !self.stall_out {
                    self.stall_out = true;
                    let generation = self.generation;
                    self.actions.push_back(Action::ReportStall { generation });
                }
            }
            CallOutput::Close { abandoned } => {
                self.registering = false;
                self.actions.push_back(Action::Close { abandoned });
            }
        }
    }

    fn on_chat_event(&mut self, now: Duration, e: ChatEvent) {
        let fired = match &e {
            ChatEvent::Content(t) => self.loops.0.as_mut().and_then(|d| d.push(t.as_bytes())),
            ChatEvent::Reasoning(t) => self.loops.1.as_mut().and_then(|d| d.push(t.as_bytes())),
            _ => None,
        };
        if !matches!(
            e,
            ChatEvent::Waiting { .. } | ChatEvent::Queued { .. } | ChatEvent::Retrying { .. }
        ) {
            self.last_progress = now;
            self.reported = None;
        }
        if let ChatEvent::Retrying {
            attempt,
            after_ms,
            error,
        } = &e
        {
            // What the failed attempt streamed is dropped: the retry starts over.
            let loops = self.settings.loop_detector;
            self.loops = (LoopDetector::new(loops).ok(), LoopDetector::new(loops).ok());
            self.r.retries.push(RetryRecord {
                generation: if self.summarizing() {
                    0
                } else {
                    self.r.generations.len() as u32 + 1
                },
                attempt: *attempt,
                after_ms: *after_ms,
                error: self.retrying.take().unwrap_or("unknown"),
                detail: error.clone(),
            });
        }
        // The summary's text is not the answer: a watcher gets it whole in `Summarized`.
        let text = matches!(
            e,
            ChatEvent::Content(_) | ChatEvent::Reasoning(_) | ChatEvent::ToolCallDelta { .. }
        );
        if !(text && self.summarizing()) {
            self.actions.push_back(Action::Event(RequestEvent::Chat(e)));
        }
        if let Some(d) = fired {
            let detail = format!("the stream repeated itself: {d}");
            self.set_fail(FailReason::LoopDetected, detail);
        }
    }

    /// Records a generation that ended without an answer, keeping its output; a summary
    /// generation's output is no part of the request's.
    fn keep_partial(&mut self, now: Duration, p: Partial) {
        if self.summarizing() {
            return;
        }
        self.r.generations.push(GenerationStats {
            budget_left: self.r.budget_left,
            timings: p.timings,
            cache: None,
            reasoning_tokens: p.reasoning_tokens,
            finish_reason: None,
            elapsed: now.saturating_sub(self.started),
        });
        self.r.content.clone_from(&p.message.content);
        self.r
            .reasoning_content
            .clone_from(&p.message.reasoning_content);
        // A generation that failed before its first token said nothing: no empty assistant
        // turn in the transcript (a caller may send it back as history).
        let m = &p.message;
        let said = m.content.as_deref().is_some_and(|c| !c.is_empty())
            || m.reasoning_content
                .as_deref()
                .is_some_and(|c| !c.is_empty())
            || !m.tool_calls.is_empty();
        if said {
            self.r.transcript.push(ChatMessage::Assistant(p.message));
        }
    }

    /// The failure policy for an attempt the client ended with an error (held in the
    /// call): the machine's own reason when it has one; with a worker socket, what the worker
    /// says (a silent server is reported as a stall first) before the retry schedule may try
    /// again; without one, the schedule decides at once.
    fn generation_failed(&mut self, now: Duration) {
        let Phase::Generating(call) = std::mem::replace(&mut self.phase, Phase::Between) else {
            return;
        };
        let Some(error) = call.held().cloned() else {
            self.phase = Phase::Generating(call);
            return;
        };
        if self.fail.is_some() || !self.worker() {
            self.phase = Phase::Concluding {
                call,
                ask: Ask::Status,
            };
            self.conclude(now);
            return;
        }
        let reported = std::mem::take(&mut self.silence_reported);
        let ask = if matches!(error, InferError::Stalled(_)) && !reported {
            Ask::Stall
        } else {
            Ask::Status
        };
        // A stall is reported about the generation, so it stays registered until answered;
        // one that broke off stays registered for the worker to explain (a server death).
        let grace = self.settings.death_grace_ms;
        // (An attempt that was never sent has nothing for it to explain.)
        let broke_off = !matches!(
            error,
            InferError::Stalled(_)
                | InferError::Connect { .. }
                | InferError::TimedOut(Deadline::Connect)
        );
        if ask == Ask::Status && broke_off && self.generation.is_some() && grace > 0 {
            self.explain_by = Some(now + ms(grace));
        } else if ask == Ask::Status {
            self.unregister();
        }
        self.phase = Phase::Concluding { call, ask };
        self.ask_worker(ask);
    }

    fn ask_worker(&mut self, ask: Ask) {
        if let Phase::Concluding { ask: a, .. } = &mut self.phase {
            *a = ask;
        }
        match ask {
            Ask::Stall => {
                self.stall_out = true;
                let generation = self.generation;
                self.actions.push_back(Action::ReportStall { generation });
            }
            Ask::Status => {
                self.status_out = true;
                self.actions.push_back(Action::WorkerStatus);
            }
        }
    }

    /// Concludes an attempt that failed once the worker has answered (or without a worker):
    /// the machine's reason (a restart, a death, a cancel) ends the request with the
    /// attempt's output; otherwise the retry schedule decides, and a retry starts over from
    /// the same messages.
    fn conclude(&mut self, now: Duration) {
        let Phase::Concluding { mut call, .. } = std::mem::replace(&mut self.phase, Phase::Between)
        else {
            return;
        };
        self.explain_by = None;
        self.unregister();
        match self.fail.clone() {
            Some((reason, detail)) => {
                let error = call.held().map(|e| e.to_string());
                call.decide(now, false);
                let partial = match call.take_result() {
                    Some(Err(f)) => f.partial,
                    _ => Partial::default(),
                };
                self.storage = Some(call.into_storage());
                self.keep_partial(now, partial);
                let detail = match error {
                    Some(e) => format!("{detail} ({e})"),
                    None => detail,
                };
                self.end(Outcome::Failed { reason, detail });
            }
            None => {
                self.retrying = call.held().map(InferError::as_str);
                call.decide(now, true);
                self.phase = Phase::Generating(call);
                self.pump(now);
            }
        }
    }

    /// A whole answer: complete, or an iteration of tool calls.
    fn answered(&mut self, now: Duration, done: Completion) {
        self.unregister();
        if let Some(summarize) = self.req.summarize.take() {
            self.summarized(now, summarize, done);
            return;
        }
        let cache = match (&self.previous, &done.timings) {
            (Some(p), Some(c)) => Some(cache_outcome(p, c)),
            _ => None,
        };
        self.previous = done.timings;
        self.r.generations.push(GenerationStats {
            budget_left: self.r.budget_left,
            timings: done.timings,
            cache,
            reasoning_tokens: done.reasoning_tokens,
            finish_reason: Some(done.finish_reason),
            elapsed: now.saturating_sub(self.started),
        });
        let mut message = done.message;
        self.r.content.clone_from(&message.content);
        self.r
            .reasoning_content
            .clone_from(&message.reasoning_content);
        let number = self.r.generations.len() as u32;
        let asked = match asked(&self.tools, &message, number) {
            Ok(a) => a,
            Err((reason, detail)) => {
                self.r.transcript.push(ChatMessage::Assistant(message));
                self.end(Outcome::Failed { reason, detail });
                return;
            }
        };
        for signal in asked.exits {
            self.actions
                .push_back(Action::Event(RequestEvent::Exit(signal.clone())));
            self.r.exits.push(signal);
        }
        // The transcript keeps the answer as the next generation must see it: the prose
        // around calls written as text, and only the normal calls (exit calls never run).
        message.content = asked.content;
        message.tool_calls = asked.calls.iter().map(|(c, _)| c.clone()).collect();
        self.r.transcript.push(ChatMessage::Assistant(message));
        if asked.calls.is_empty() {
            let finish_reason = done.finish_reason;
            self.end(Outcome::Completed { finish_reason });
            return;
        }
        if self.r.budget_left == 0 {
            let reason = FailReason::ToolExecutionError;
            let detail = "tool iteration budget exhausted".into();
            self.end(Outcome::Failed { reason, detail });
            return;
        }
        self.iterations += 1;
        self.phase = Phase::Tools {
            calls: asked.calls.into(),
            running: None,
        };
        self.next_tool(now);
    }

    /// The summary generation's answer: its content is written into the conversation, then
    /// generation 1 starts. It is not one of the request's generations: no budget, no
    /// transcript, and its timings are not the cache baseline of generation 1.
    fn summarized(&mut self, now: Duration, summarize: Summarize, done: Completion) {
        let text = done.message.content.as_deref().map_or("", str::trim);
        // An empty summary still replaces the turns it covers: the conversation says so.
        let summary = if text.is_empty() {
            "(no summary)"
        } else {
            text
        }
        .to_owned();
        if let Some(ChatMessage::User { content }) = self.req.messages.get_mut(summarize.into) {
            *content = format!("{}{summary}\n\n{content}", summarize.prefix);
        }
        self.actions
            .push_back(Action::Event(RequestEvent::Summarized {
                summary,
                timings: done.timings,
            }));
        self.start_generation(now);
    }

    /// Starts the next call of the iteration, or ends the iteration.
    fn next_tool(&mut self, now: Duration) {
        let Phase::Tools { calls, running } = &mut self.phase else {
            return;
        };
        let Some((call, source)) = calls.pop_front() else {
            self.r.budget_left -= 1;
            self.note_budget();
            self.actions
                .push_back(Action::Event(RequestEvent::Iteration {
                    number: self.iterations,
                    budget_left: self.r.budget_left,
                }));
            self.start_generation(now);
            return;
        };
        self.actions
            .push_back(Action::Event(RequestEvent::ToolStarted {
                call: call.clone(),
                source,
            }));
        let checked = match self.tools.get(&call.name) {
            None => Err(ToolError::Failed(format!("no tool named `{}`", call.name))),
            // The rules every `<tool_call>` object is held to, for native calls too: what a
            // tool runs on, the next request's history can carry back to the server.
            Some(_) => match llama_proto::check_json_object(&call.arguments) {
                Err(e) if !matches!(e, JsonError::NotAnObject { .. }) => {
                    Err(ToolError::BadArguments(format!("not JSON: {e}")))
                }
                _ => match serde_json::from_str::<serde_json::Value>(&call.arguments) {
                    Err(e) => Err(ToolError::BadArguments(format!("not JSON: {e}"))),
                    Ok(v) if !v.is_object() => {
                        Err(ToolError::BadArguments("not a JSON object".into()))
                    }
                    Ok(v) => Ok(v),
                },
            },
        };
        let deadline = now + ms(self.settings.tool_timeout_ms);
        let run = Running {
            call,
            source,
            deadline,
        };
        match checked {
            Ok(arguments) => {
                self.actions.push_back(Action::RunTool {
                    id: run.call.id.clone(),
                    name: run.call.name.clone(),
                    arguments,
                });
                *running = Some(run);
            }
            Err(e) => self.tool_done(now, run, Err(e)),
        }
    }

    /// Appends the provider's budget note to the newest tool result, the one place a change
    /// costs the prompt cache nothing.
    fn note_budget(&mut self) {
        let note = self.bios.budget_note(&BiosContext {
            budget_left: self.r.budget_left,
            budget: self.r.budget,
            iterations: self.iterations,
            tools: &self.schemas,
            exit_tools: &self.exit_names,
        });
        let last = self.r.transcript.last_mut();
        if let (Some(note), Some(ChatMessage::Tool { content, .. })) = (note, last) {
            content.push_str("\n\n");
            content.push_str(&note);
        }
    }

    fn tool_done(&mut self, now: Duration, run: Running, result: Result<String, ToolError>) {
        let shown = result.clone().map_err(|e| e.to_string());
        self.actions
            .push_back(Action::Event(RequestEvent::ToolFinished {
                id: run.call.id.clone(),
                result: shown.clone(),
            }));
        self.r.tool_calls.push(ToolRecord {
            iteration: self.iterations,
            call: run.call.clone(),
            source: run.source,
            result: shown,
        });
        match result {
            Ok(text) => {
                self.r.transcript.push(ChatMessage::Tool {
                    tool_call_id: run.call.id,
                    content: text,
                });
                self.next_tool(now);
            }
            Err(ToolError::Cancelled) => {
                let (reason, detail) = self
                    .fail
                    .clone()
                    .unwrap_or((FailReason::Cancelled, "cancelled".into()));
                self.end(Outcome::Failed { reason, detail });
            }
            Err(e) => {
                let reason = FailReason::ToolExecutionError;
                let detail = format!("tool `{}` (call {}) {e}", run.call.name, run.call.id);
                self.end(Outcome::Failed { reason, detail });
            }
        }
    }

    fn end(&mut self, outcome: Outcome) {
        if matches!(self.phase, Phase::Done) {
            return;
        }
        self.unregister();
        self.phase = Phase::Done;
        let mut r = no_output(self.r.id, self.r.budget, outcome.clone());
        std::mem::swap(&mut r, &mut self.r);
        r.outcome = outcome;
        self.actions.push_back(Action::Done(Box::new(r)));
    }
}
