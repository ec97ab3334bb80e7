//! A request's result and its events as they go on the wire, with the conversions from the
//! runner's [`RequestResult`] and [`RequestEvent`]. The daemon stores a result as this JSON, a
//! client reads it back into the same types.

use serde::{Deserialize, Serialize};

use loopd_agent::runner::{CallSource, Outcome, RequestEvent, RequestResult, StallAnswer};
use loopd_client::llama::{ChatEvent, ToolCall};

/// Where a call came from: the server parsed it, or it was found written as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireSource {
    /// `tool_calls` from the server.
    Native,
    /// `<tool_call>` text in the content.
    Text,
}

impl From<CallSource> for WireSource {
    fn from(s: CallSource) -> Self {
        match s {
            CallSource::Native => WireSource::Native,
            CallSource::Text => WireSource::Text,
        }
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireOutcome {
    /// With a `finish_reason`.
    Completed,
    /// With a `fail_reason` and a `detail`.
    Failed,
}

/// One call run, in a result's `tool_calls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireToolRun {
    /// Its iteration (1 for the first).
    pub iteration: u32,
    /// The call's id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
    /// Where it came from.
    pub source: WireSource,
    /// Whether it succeeded.
    pub ok: bool,
    /// Its result, or what went wrong.
    pub result: String,
}

/// A call the model asked for that never ran, in a result's `not_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireNotRun {
    /// The call's id.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// An exit signal, in a result's `exits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireExit {
    /// The generation it came in (1 for the first).
    pub generation: u32,
    /// The exit tool.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
    /// Where it came from.
    pub source: WireSource,
}

/// One generation's figures, in a result's `generations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireGeneration {
    /// Tool iterations left when it started.
    pub budget_left: u32,
    /// Prompt tokens from the cache.
    pub cache_n: u64,
    /// Prompt tokens evaluated.
    pub prompt_n: u64,
    /// Tokens generated.
    pub predicted_n: u64,
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
    /// `stop`, `tool_calls`, `length`; `null` when it failed.
    pub finish_reason: Option<String>,
    /// Send to end.
    pub elapsed_ms: u64,
}

/// llama-worker's answer to a stall report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireStall {
    /// It is restarting the server.
    Restarting,
    /// It is not ready; nothing was done.
    NotReady,
    /// The server made progress this long ago.
    NotStalled {
        /// Since the server's last progress.
        since_progress_ms: u64,
    },
}

impl From<&StallAnswer> for WireStall {
    fn from(a: &StallAnswer) -> Self {
        match a {
            StallAnswer::Restarting => WireStall::Restarting,
            StallAnswer::NotReady => WireStall::NotReady,
            StallAnswer::NotStalled { since_progress_ms } => WireStall::NotStalled {
                since_progress_ms: *since_progress_ms,
            },
        }
    }
}

/// An attempt sent again, in a result's `retries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireRetry {
    /// The generation (1 for the first).
    pub generation: u32,
    /// The attempt that followed (2 for the first retry).
    pub attempt: u32,
    /// The wait before it.
    pub after_ms: u64,
    /// The failed attempt's error kind.
    pub error: String,
    /// The failed attempt's error, in words.
    pub detail: String,
}

/// A request's result: the `result` of a `result`, `wait` or `follow` reply, and what the
/// store keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireResult {
    /// The request's id.
    pub id: u64,
    /// Completed or failed.
    pub outcome: WireOutcome,
    /// The last generation's finish reason when completed; `null` when failed.
    pub finish_reason: Option<String>,
    /// Why it failed (`docs/runner.md`'s names, or the daemon's `daemon_restarted`); `null`
    /// when completed. A string, not the runner's `FailReason`: the daemon adds its own.
    pub fail_reason: Option<String>,
    /// What happened, in words, when failed; `null` when completed.
    pub detail: Option<String>,
    /// The last generation's answer (partial on failure).
    pub content: Option<String>,
    /// The last generation's reasoning.
    pub reasoning_content: Option<String>,
    /// The calls run, in order.
    pub tool_calls: Vec<WireToolRun>,
    /// The calls asked for that never ran.
    pub not_run: Vec<WireNotRun>,
    /// The exit signals.
    pub exits: Vec<WireExit>,
    /// One per generation.
    pub generations: Vec<WireGeneration>,
    /// Tool iterations it started with.
    pub budget: u32,
    /// Tool iterations left.
    pub budget_left: u32,
    /// The worker's answers to its stall reports.
    pub stalls: Vec<WireStall>,
    /// The attempts sent again.
    pub retries: Vec<WireRetry>,
    /// The `[[host]]` it ran on; left out on a daemon of one unnamed host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A session's turn: which, and how it ran (docs/sessions.md); left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::TurnRecord>,
}

impl WireResult {
    /// Whether it completed.
    pub fn completed(&self) -> bool {
        self.outcome == WireOutcome::Completed
    }
}

impl From<&RequestResult> for WireResult {
    fn from(r: &RequestResult) -> Self {
        let (outcome, finish_reason, fail_reason, detail) = match &r.outcome {
            Outcome::Completed { finish_reason } => (
                WireOutcome::Completed,
                Some(finish_reason.as_str().to_owned()),
                None,
                None,
            ),
            Outcome::Failed { reason, detail } => (
                WireOutcome::Failed,
                None,
                Some(reason.as_str().to_owned()),
                Some(detail.clone()),
            ),
        };
        WireResult {
            id: r.id.0,
            outcome,
            finish_reason,
            fail_reason,
            detail,
            content: r.content.clone(),
            reasoning_content: r.reasoning_content.clone(),
            tool_calls: r
                .tool_calls
                .iter()
                .map(|t| {
                    let (ok, text) = match &t.result {
                        Ok(s) => (true, s),
                        Err(e) => (false, e),
                    };
                    WireToolRun {
                        iteration: t.iteration,
                        id: t.call.id.clone(),
                        name: t.call.name.clone(),
                        arguments: t.call.arguments.clone(),
                        source: t.source.into(),
                        ok,
                        result: text.clone(),
                    }
                })
                .collect(),
            not_run: r.calls_not_run().map(WireNotRun::from).collect(),
            exits: r
                .exits
                .iter()
                .map(|e| WireExit {
                    generation: e.generation,
                    name: e.call.name.clone(),
                    arguments: e.call.arguments.clone(),
                    source: e.source.into(),
                })
                .collect(),
            generations: r
                .generations
                .iter()
                .map(|g| {
                    let t = g.timings.unwrap_or_default();
                    WireGeneration {
                        budget_left: g.budget_left,
                        cache_n: t.cache_n,
                        prompt_n: t.prompt_n,
                        predicted_n: t.predicted_n,
                        reasoning_tokens: g.reasoning_tokens,
                        finish_reason: g.finish_reason.map(|f| f.as_str().to_owned()),
                        elapsed_ms: u64::try_from(g.elapsed.as_millis()).unwrap_or(u64::MAX),
                    }
                })
                .collect(),
            budget: r.budget,
            budget_left: r.budget_left,
            stalls: r.stalls.iter().map(WireStall::from).collect(),
            retries: r
                .retries
                .iter()
                .map(|t| WireRetry {
                    generation: t.generation,
                    attempt: t.attempt,
                    after_ms: t.after_ms,
                    error: t.error.to_owned(),
                    detail: t.detail.clone(),
                })
                .collect(),
            host: r.host.clone(),
            session: None,
        }
    }
}

impl From<&ToolCall> for WireNotRun {
    fn from(c: &ToolCall) -> Self {
        WireNotRun {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        }
    }
}

/// One event of a running request, as a `follow` stream carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum WireEvent {
    /// A session's compaction wrote its summary of earlier turns (before generation 1).
    Summarized {
        /// The summary, as the conversation now carries it.
        summary: String,
    },
    /// A generation starts.
    Generation {
        /// 1 for the first.
        number: u32,
        /// Tool iterations left.
        budget_left: u32,
    },
    /// A piece of the answer.
    Content {
        /// The piece.
        text: String,
    },
    /// A piece of the reasoning.
    Reasoning {
        /// The piece.
        text: String,
    },
    /// Sent, no byte yet; `/slots` says the slot is busy (or cannot say).
    Waiting {
        /// Whether the slot is processing.
        slot_busy: bool,
    },
    /// Prompt processing progress, in tokens.
    Progress {
        /// In all.
        total: u64,
        /// From the cache.
        cache: u64,
        /// Processed so far.
        processed: u64,
    },
    /// The generation's attempt failed and is sent again.
    Retrying {
        /// The attempt about to start.
        attempt: u32,
        /// The wait before it.
        after_ms: u64,
        /// What went wrong.
        error: String,
    },
    /// The thinking cap was reached.
    ThinkingCapped {
        /// Reasoning tokens then.
        tokens: u64,
    },
    /// A call is about to run.
    ToolStarted {
        /// The call's id.
        id: String,
        /// The tool.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
        /// Where it came from.
        source: WireSource,
    },
    /// A call ended.
    ToolFinished {
        /// The call's id.
        id: String,
        /// Whether it succeeded.
        ok: bool,
        /// Its result, or what went wrong.
        result: String,
    },
    /// An exit tool was called.
    Exit {
        /// The exit tool.
        name: String,
        /// Its arguments, JSON text.
        arguments: String,
        /// Where it came from.
        source: WireSource,
    },
    /// A tool iteration ended.
    Iteration {
        /// 1 for the first.
        number: u32,
        /// Tool iterations left.
        budget_left: u32,
    },
    /// llama-worker answered a stall report.
    Stall(WireStall),
    /// The request's seat on a named `[[host]]`: its first event, and again when it was
    /// moved (`by` is `rehomed`).
    Placed {
        /// The host's name.
        host: String,
        /// The server slot there.
        slot: u32,
        /// `session`, `most_free`, `round_robin` or `rehomed`.
        by: String,
    },
    /// The session's KV restored before generation 1, or saved after the last generation
    /// (docs/sessions.md, "Sessions' KV in files").
    Kv {
        /// `restore` or `save`.
        action: String,
        /// `restored`, `resident`, `missing`, `corrupt`, `mismatch`, `refused`; `saved`,
        /// `small`, `failed`, `too_big`.
        outcome: String,
        /// Tokens restored or saved.
        tokens: u64,
        /// Bytes read or written.
        bytes: u64,
        /// Other files deleted to keep the directory under its cap.
        evicted: u32,
        /// How long it took, in microseconds (the file's hash and the server's call).
        us: u64,
        /// What went wrong, when something did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
}

impl WireEvent {
    /// The event a watcher sees for `e`; `None` for the client's internal ones that say
    /// nothing to a watcher (its own queue, a call's streamed pieces).
    pub fn of(e: &RequestEvent) -> Option<WireEvent> {
        Some(match e {
            RequestEvent::Generation {
                number,
                budget_left,
            } => WireEvent::Generation {
                number: *number,
                budget_left: *budget_left,
            },
            RequestEvent::Chat(c) => match c {
                ChatEvent::Content(t) => WireEvent::Content { text: t.clone() },
                ChatEvent::Reasoning(t) => WireEvent::Reasoning { text: t.clone() },
                ChatEvent::Waiting { slot_busy } => WireEvent::Waiting {
                    slot_busy: *slot_busy,
                },
                ChatEvent::Progress {
                    total,
                    cache,
                    processed,
                } => WireEvent::Progress {
                    total: *total,
                    cache: *cache,
                    processed: *processed,
                },
                ChatEvent::Retrying {
                    attempt,
                    after_ms,
                    error,
                } => WireEvent::Retrying {
                    attempt: *attempt,
                    after_ms: *after_ms,
                    error: error.clone(),
                },
                ChatEvent::ThinkingCapped { tokens } => {
                    WireEvent::ThinkingCapped { tokens: *tokens }
                }
                ChatEvent::Queued { .. } | ChatEvent::ToolCallDelta { .. } => return None,
            },
            RequestEvent::ToolStarted { call, source } => WireEvent::ToolStarted {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                source: (*source).into(),
            },
            RequestEvent::ToolFinished { id, result } => {
                let (ok, text) = match result {
                    Ok(t) => (true, t),
                    Err(e) => (false, e),
                };
                WireEvent::ToolFinished {
                    id: id.clone(),
                    ok,
                    result: text.clone(),
                }
            }
            RequestEvent::Exit(x) => WireEvent::Exit {
                name: x.call.name.clone(),
                arguments: x.call.arguments.clone(),
                source: x.source.into(),
            },
            RequestEvent::Iteration {
                number,
                budget_left,
            } => WireEvent::Iteration {
                number: *number,
                budget_left: *budget_left,
            },
            RequestEvent::Stall(a) => WireEvent::Stall(a.into()),
            RequestEvent::Summarized { summary, .. } => WireEvent::Summarized {
                summary: summary.clone(),
            },
            RequestEvent::Kv(k) => WireEvent::Kv {
                action: k.action.as_str().to_owned(),
                outcome: k.outcome.as_str().to_owned(),
                tokens: k.tokens,
                bytes: k.bytes,
                evicted: k.evicted,
                us: k.micros,
                detail: k.detail.clone(),
            },
            RequestEvent::Placed { host, slot, by } => WireEvent::Placed {
                host: host.clone(),
                slot: *slot,
                by: (*by).to_owned(),
            },
        })
    }
}
