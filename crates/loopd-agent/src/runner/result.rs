//! What a request ends with ([`RequestResult`], its [`Outcome`] and [`FailReason`]) and what it
//! shows while it runs ([`RequestEvent`]).

use std::fmt;
use std::time::Duration;

use loopd_client::llama::{
    CacheOutcome, ChatEvent, ChatMessage, FinishReason, InferError, Timings, ToolCall,
};

use super::worker::StallAnswer;
use super::RequestId;

/// Why a request failed, printable exactly as seed 003 names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailReason {
    /// A tool call failed, or a call came with the budget at 0.
    ToolExecutionError,
    /// A call written as text could not be parsed, or names no tool.
    ToolParseError,
    /// llama-worker restarted the server under the request.
    WorkerRestarted,
    /// The server died on its own under the request.
    ServerDied,
    /// llama-worker was stopped under the request.
    WorkerStopped,
    /// The streamed content repeated itself.
    LoopDetected,
    /// [`Runner::cancel`](super::Runner::cancel) (or the runner being dropped).
    Cancelled,
    /// The client's own error (never [`InferError::Cancelled`]: a cancel is the runner's).
    Client(InferError),
    /// Code the runner calls (an observer, a BIOS provider) panicked; the slot is freed.
    Panicked,
    /// The request's inference host was lost (its watch silent for 3 s, ended or refused,
    /// or its inference socket refused a connect): `host_lost`.
    HostLost,
}

impl FailReason {
    /// `tool_execution_error`, `tool_parse_error`, `worker_restarted`, `server_died`,
    /// `worker_stopped`, `loop_detected`, `cancelled`, `panicked`, `host_lost`, or the client
    /// error's name.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailReason::ToolExecutionError => "tool_execution_error",
            FailReason::ToolParseError => "tool_parse_error",
            FailReason::WorkerRestarted => "worker_restarted",
            FailReason::ServerDied => "server_died",
            FailReason::WorkerStopped => "worker_stopped",
            FailReason::LoopDetected => "loop_detected",
            FailReason::Cancelled => "cancelled",
            FailReason::Client(c) => c.as_str(),
            FailReason::Panicked => "panicked",
            FailReason::HostLost => "host_lost",
        }
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The model answered without asking for a tool.
    Completed {
        /// The last generation's finish reason.
        finish_reason: FinishReason,
    },
    /// It failed; the output so far is kept.
    Failed {
        /// The reason, by name.
        reason: FailReason,
        /// What happened, in words.
        detail: String,
    },
}

impl Outcome {
    /// The failure reason, if it failed.
    pub fn fail_reason(&self) -> Option<&FailReason> {
        match self {
            Outcome::Failed { reason, .. } => Some(reason),
            Outcome::Completed { .. } => None,
        }
    }
}

/// Where a call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSource {
    /// The server parsed it (`tool_calls`).
    Native,
    /// The fallback parser found it written as `<tool_call>` text in the content.
    Text,
}

/// One normal tool call the runner ran (or tried to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolRecord {
    /// The iteration it belonged to (1 for the first).
    pub iteration: u32,
    /// The call.
    pub call: ToolCall,
    /// Where it came from.
    pub source: CallSource,
    /// Its result text, or what went wrong.
    pub result: Result<String, String>,
}

/// One exit-tool call: a signal for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitSignal {
    /// The generation it appeared in (1 for the first).
    pub generation: u32,
    /// The call.
    pub call: ToolCall,
    /// Where it came from.
    pub source: CallSource,
}

/// The figures of one generation (one assistant message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenerationStats {
    /// Tool iterations left when it started.
    pub budget_left: u32,
    /// The server's timings (`cache_n`, `prompt_n`, `predicted_n`), if the stream carried any.
    pub timings: Option<Timings>,
    /// Whether it reused the slot's cache as the generation before it left it
    /// ([`cache_outcome`](loopd_client::llama::cache_outcome)); `None` for the first generation and
    /// for one that failed or carried no timings.
    pub cache: Option<CacheOutcome>,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// Its finish reason; `None` when it failed.
    pub finish_reason: Option<FinishReason>,
    /// Wall time from send to end.
    pub elapsed: Duration,
}

/// One failed attempt of a generation that was tried again (M2a section 4): what it streamed
/// was dropped, and the same messages were sent again after `after_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryRecord {
    /// The generation it belongs to (1 for the first; 0 for the summary generation of a
    /// [`Summarize`](super::Summarize), which is not one of the request's generations).
    pub generation: u32,
    /// The attempt that followed (2 for the first retry).
    pub attempt: u32,
    /// The wait before it, jitter included.
    pub after_ms: u64,
    /// The failed attempt's error kind ([`InferError::as_str`]: `connect_error`,
    /// `stream_closed_early`, `stalled`, ...).
    pub error: &'static str,
    /// The failed attempt's error, in words.
    pub detail: String,
}

/// The terminal result of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestResult {
    /// The request.
    pub id: RequestId,
    /// How it ended.
    pub outcome: Outcome,
    /// The last generation's answer text (partial on failure).
    pub content: Option<String>,
    /// The last generation's reasoning text (partial on failure).
    pub reasoning_content: Option<String>,
    /// Everything the runner added to the conversation: the assistant tool-call messages, the
    /// tool results, and the last assistant message (partial on failure).
    pub transcript: Vec<ChatMessage>,
    /// The normal tool calls run, in order.
    pub tool_calls: Vec<ToolRecord>,
    /// The exit-tool signals, in order.
    pub exits: Vec<ExitSignal>,
    /// One entry per generation.
    pub generations: Vec<GenerationStats>,
    /// Tool iterations the request started with.
    pub budget: u32,
    /// Tool iterations left at the end.
    pub budget_left: u32,
    /// The worker's answers to the stalls this request reported.
    pub stalls: Vec<StallAnswer>,
    /// The attempts tried again, in order (a retry never spends budget).
    pub retries: Vec<RetryRecord>,
    /// The `[[host]]` it ran on (the last one, if it was rehomed); `None` on a runner of one
    /// unnamed host (today's config without `[[host]]`).
    pub host: Option<String>,
}

impl RequestResult {
    /// The calls the model asked for that never ran: not among the calls run nor the exit
    /// signals (a call refused for the budget, or a batch cut short by a failure).
    pub fn calls_not_run(&self) -> impl Iterator<Item = &ToolCall> {
        self.transcript
            .iter()
            .filter_map(|m| match m {
                ChatMessage::Assistant(a) => Some(&a.tool_calls),
                _ => None,
            })
            .flatten()
            .filter(|c| {
                !self.tool_calls.iter().any(|t| t.call.id == c.id)
                    && !self.exits.iter().any(|e| e.call.id == c.id)
            })
    }
}

/// What a request does, for a caller watching it live.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// A generation starts with this BIOS.
    Generation {
        /// 1 for the first.
        number: u32,
        /// Tool iterations left.
        budget_left: u32,
    },
    /// The client's event for the current generation.
    Chat(ChatEvent),
    /// A normal call is about to run.
    ToolStarted {
        /// The call.
        call: ToolCall,
        /// Where it came from.
        source: CallSource,
    },
    /// A normal call ended.
    ToolFinished {
        /// The call's id.
        id: String,
        /// The result text, or what went wrong.
        result: Result<String, String>,
    },
    /// An exit tool was called.
    Exit(ExitSignal),
    /// An iteration ended; generation continues.
    Iteration {
        /// 1 for the first.
        number: u32,
        /// Tool iterations left.
        budget_left: u32,
    },
    /// The worker answered a stall report.
    Stall(StallAnswer),
    /// The summary generation of a [`Summarize`](super::Summarize) ended: its text, now written
    /// into the conversation, and the server's counts for it. It comes before generation 1's
    /// [`Generation`](RequestEvent::Generation); the summary generation has none of its own,
    /// and its content and reasoning are not streamed as [`Chat`](RequestEvent::Chat) events
    /// (its waits, progress and retries are).
    Summarized {
        /// The summary: the answer's content, trimmed, or `(no summary)` when that is empty.
        summary: String,
        /// Its generation's timings, when the server sent them.
        timings: Option<Timings>,
    },
    /// The request was given a seat on a named `[[host]]` (first of all its events), or was
    /// moved to another one because its host refused the connect (`rehomed`).
    Placed {
        /// The host's name.
        host: String,
        /// The server slot there.
        slot: u32,
        /// Why there: `session`, `most_free`, `round_robin` or `rehomed`.
        by: &'static str,
    },
    /// The session's KV was restored before generation 1, or saved after the last one
    /// (requests with a `session` on a host with a KV directory; `runner/kv.rs`).
    Kv(super::KvReport),
}
