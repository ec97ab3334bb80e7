//! One request from its slot to its result: the tool loop of seed 003, appendix G.
//!
//! Each generation sends BIOS, caller's system message, conversation, and what the runner has
//! added so far. Its answer is then one of:
//! - no normal tool call: the request is complete;
//! - normal calls (the server's `tool_calls`, or, when there are none, `<tool_call>` blocks
//!   written in the content): one **iteration**. With the budget at 0 that is
//!   `tool_execution_error` ("tool iteration budget exhausted"); otherwise the calls run one
//!   after another in the listed order, any failure is `tool_execution_error`, and on success
//!   one assistant message with the calls and one tool message per call are appended, the
//!   budget goes down by exactly 1, and the next generation starts with a new BIOS.
//!
//! Exit-tool calls are recorded wherever they appear and are neither run nor appended. A
//! `<tool_call>` block that does not parse, or names no tool, is `tool_parse_error`. The loop
//! detector watches the streamed content and reasoning; when it fires the stream is closed
//! and the request fails with `loop_detected`. Every failure keeps the output so far.

use std::time::Instant;

use llama_proto::{prose, text_calls, LoopDetector};

use crate::llama::{
    ChatEvent, ChatMessage, ChatRequest, Completion, Failed, InferError, Partial, ToolCall,
};

use super::bios::BiosContext;
use super::tools::{run_call, ToolError};
use super::worker::{self, StallAnswer, WorkerState};
use super::{
    lock, watch, CallSource, Control, ExitSignal, FailReason, GenerationStats, Observer, Outcome,
    RequestId, RunEvent, RunRequest, RunResult, Shared, ToolRecord,
};

/// What one answer asks for, once exit calls are set aside.
struct Asked {
    /// Normal calls in order, with their source.
    calls: Vec<(ToolCall, CallSource)>,
    /// The content to keep in the assistant message (the prose around text calls).
    content: Option<String>,
}

/// Why a request stops, before it becomes an [`Outcome`].
struct Stop {
    reason: FailReason,
    detail: String,
}

fn stop(reason: FailReason, detail: impl Into<String>) -> Stop {
    Stop {
        reason,
        detail: detail.into(),
    }
}

/// Runs `req` to its result on runner slot `slot`.
pub(super) fn run(
    shared: &Shared,
    id: RequestId,
    slot: u32,
    req: RunRequest,
    control: &Control,
    mut observer: Option<Observer>,
) -> RunResult {
    let budget = req.budget.unwrap_or(shared.settings.budget);
    let mut r = no_output(
        id,
        budget,
        Outcome::Completed {
            finish_reason: llama_proto::FinishReason::Stop,
        },
    );
    let mut emit = |e: &RunEvent| {
        if let Some(o) = observer.as_mut() {
            o(e);
        }
    };
    let outcome = match tool_loop(shared, slot, &req, control, &mut r, &mut emit) {
        Ok(done) => Outcome::Completed {
            finish_reason: done.finish_reason,
        },
        Err(s) => Outcome::Failed {
            reason: s.reason,
            detail: s.detail,
        },
    };
    r.outcome = outcome;
    r.stalls = lock(&control.stalls).clone();
    r
}

/// The result of a request whose run panicked: nothing of its output survives.
pub(super) fn panicked(id: RequestId, budget: u32) -> RunResult {
    no_output(
        id,
        budget,
        Outcome::Failed {
            reason: FailReason::Panicked,
            detail: "the request's observer or BIOS provider panicked".into(),
        },
    )
}

/// A result with `outcome` and no output yet: the whole budget left.
fn no_output(id: RequestId, budget: u32, outcome: Outcome) -> RunResult {
    RunResult {
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
    }
}

fn tool_loop(
    shared: &Shared,
    slot: u32,
    req: &RunRequest,
    control: &Control,
    r: &mut RunResult,
    emit: &mut dyn FnMut(&RunEvent),
) -> Result<Completion, Stop> {
    let schemas = shared.tools.schemas();
    let exit_names: Vec<String> = schemas
        .iter()
        .filter(|s| shared.tools.is_exit(&s.name))
        .map(|s| s.name.clone())
        .collect();
    let mut iterations = 0u32;
    loop {
        let number = r.generations.len() as u32 + 1;
        let bios = shared.bios.bios(&BiosContext {
            budget_left: r.budget_left,
            budget: r.budget,
            iterations,
            tools: &schemas,
            exit_tools: &exit_names,
        });
        let mut messages = Vec::with_capacity(req.messages.len() + r.transcript.len() + 2);
        messages.push(ChatMessage::System { content: bios });
        if let Some(system) = &req.system {
            messages.push(ChatMessage::System {
                content: system.clone(),
            });
        }
        messages.extend(req.messages.iter().cloned());
        messages.extend(r.transcript.iter().cloned());
        let chat = ChatRequest {
            slot,
            messages,
            tools: schemas.clone(),
            thinking: req.thinking,
            max_tokens: req.max_tokens,
            sampling: req.sampling,
        };
        emit(&RunEvent::Generation {
            number,
            budget_left: r.budget_left,
        });
        let started = Instant::now();
        let answer = generate(shared, &chat, control, emit);
        let stats = |timings, reasoning_tokens, finish_reason| GenerationStats {
            budget_left: r.budget_left,
            timings,
            reasoning_tokens,
            finish_reason,
            elapsed: started.elapsed(),
        };
        let done = match answer {
            Ok(done) => done,
            Err(boxed) => {
                let (failed, stop) = *boxed;
                let p = failed.partial;
                r.generations
                    .push(stats(p.timings, p.reasoning_tokens, None));
                r.content.clone_from(&p.content);
                r.reasoning_content.clone_from(&p.reasoning_content);
                r.transcript.push(assistant(&p));
                return Err(stop);
            }
        };
        r.generations.push(stats(
            done.timings,
            done.reasoning_tokens,
            Some(done.finish_reason),
        ));
        r.content.clone_from(&done.content);
        r.reasoning_content.clone_from(&done.reasoning_content);
        let asked = match asked(shared, &done, number, r, emit) {
            Ok(a) => a,
            Err(s) => {
                r.transcript.push(ChatMessage::Assistant {
                    content: done.content.clone(),
                    reasoning_content: done.reasoning_content.clone(),
                    tool_calls: done.tool_calls.clone(),
                });
                return Err(s);
            }
        };
        let message = ChatMessage::Assistant {
            content: asked.content,
            reasoning_content: done.reasoning_content.clone(),
            tool_calls: asked.calls.iter().map(|(c, _)| c.clone()).collect(),
        };
        r.transcript.push(message);
        if asked.calls.is_empty() {
            return Ok(done);
        }
        if r.budget_left == 0 {
            return Err(stop(
                FailReason::ToolExecutionError,
                "tool iteration budget exhausted",
            ));
        }
        iterations += 1;
        let timeout = std::time::Duration::from_millis(shared.settings.tool_timeout_ms);
        let poll = std::time::Duration::from_millis(shared.client.config().limits.poll_ms);
        for (call, source) in asked.calls {
            emit(&RunEvent::ToolStarted {
                call: call.clone(),
                source,
            });
            let result = match shared.tools.get(&call.name) {
                Some(tool) => run_call(tool, &call.arguments, timeout, poll, &control.cancel),
                None => Err(ToolError::Failed(format!("no tool named `{}`", call.name))),
            };
            let shown = result.clone().map_err(|e| e.to_string());
            emit(&RunEvent::ToolFinished {
                id: call.id.clone(),
                result: shown.clone(),
            });
            r.tool_calls.push(ToolRecord {
                iteration: iterations,
                call: call.clone(),
                source,
                result: shown,
            });
            match result {
                Ok(text) => r.transcript.push(ChatMessage::Tool {
                    tool_call_id: call.id.clone(),
                    content: text,
                }),
                Err(ToolError::Cancelled) => {
                    let (reason, detail) = control
                        .reason()
                        .unwrap_or((FailReason::Cancelled, "cancelled".into()));
                    return Err(stop(reason, detail));
                }
                Err(e) => {
                    return Err(stop(
                        FailReason::ToolExecutionError,
                        format!("tool `{}` (call {}) {e}", call.name, call.id),
                    ))
                }
            }
        }
        r.budget_left -= 1;
        emit(&RunEvent::Iteration {
            number: iterations,
            budget_left: r.budget_left,
        });
    }
}

/// The assistant message of a partial answer, kept in the transcript.
fn assistant(p: &Partial) -> ChatMessage {
    ChatMessage::Assistant {
        content: p.content.clone(),
        reasoning_content: p.reasoning_content.clone(),
        tool_calls: p.tool_calls.clone(),
    }
}

/// One generation through the client, with the loop detector and stall bookkeeping.
fn generate(
    shared: &Shared,
    chat: &ChatRequest,
    control: &Control,
    emit: &mut dyn FnMut(&RunEvent),
) -> Result<Completion, Box<(Failed, Stop)>> {
    let clock = shared.client.clock();
    let loops = shared.settings.loop_detector;
    // The config was validated, so the detector accepts it; an invalid one in code is a
    // detector that never fires rather than a panic.
    let mut content_loop = LoopDetector::new(loops).ok();
    let mut reasoning_loop = LoopDetector::new(loops).ok();
    {
        let mut p = lock(&control.progress);
        p.generating = true;
        p.last = clock.now();
        p.reported = None;
    }
    let mut stalls_seen = 0;
    let mut on_event = |e: &ChatEvent| {
        let fired = match e {
            ChatEvent::Content(t) => content_loop.as_mut().and_then(|d| d.push(t.as_bytes())),
            ChatEvent::Reasoning(t) => reasoning_loop.as_mut().and_then(|d| d.push(t.as_bytes())),
            _ => None,
        };
        if !matches!(
            e,
            ChatEvent::Waiting { .. } | ChatEvent::Queued { .. } | ChatEvent::Retrying { .. }
        ) {
            let mut p = lock(&control.progress);
            p.last = clock.now();
            p.reported = None;
        }
        emit(&RunEvent::Chat(e.clone()));
        let stalls = lock(&control.stalls).clone();
        for s in &stalls[stalls_seen..] {
            emit(&RunEvent::Stall(*s));
        }
        stalls_seen = stalls.len();
        if let Some(d) = fired {
            control.fail(
                FailReason::LoopDetected,
                format!("the stream repeated itself: {d}"),
            );
        }
    };
    let result = shared.client.run(chat, &control.cancel, &mut on_event);
    lock(&control.progress).generating = false;
    match result {
        // The runner stopped this generation (a loop, a cancel, a restart) while the rest of
        // the stream was already in hand, so the client finished it: the runner's reason
        // stands, with the whole output kept.
        Ok(done) => match control.reason() {
            Some((reason, detail)) => {
                let partial = Partial {
                    content: done.content,
                    reasoning_content: done.reasoning_content,
                    tool_calls: done.tool_calls,
                    timings: done.timings,
                    reasoning_tokens: done.reasoning_tokens,
                };
                let failed = Failed {
                    error: InferError::Cancelled,
                    partial,
                };
                Err(Box::new((failed, stop(reason, detail))))
            }
            None => Ok(done),
        },
        Err(failed) => {
            let s = why(shared, control, &failed.error);
            Err(Box::new((failed, s)))
        }
    }
}

/// The reason a generation failed: the runner's own (cancel, loop, restart) when one was set,
/// else what the worker says happened, else the client's error.
fn why(shared: &Shared, control: &Control, e: &InferError) -> Stop {
    if let Some((reason, detail)) = control.reason() {
        return stop(reason, detail);
    }
    if matches!(e, InferError::Cancelled) {
        return stop(FailReason::Cancelled, "cancelled");
    }
    if let Some(socket) = &shared.settings.worker_socket {
        let timeout = std::time::Duration::from_millis(shared.settings.worker_timeout_ms);
        // The client gave up on a silent server: that is a stall to report.
        if matches!(e, InferError::Stalled(_)) {
            watch::report(control, socket, timeout, shared.settings.stall_ms);
            if lock(&control.stalls).last() == Some(&StallAnswer::Restarting) {
                if let Some((reason, detail)) = control.reason() {
                    return stop(reason, format!("{detail} ({e})"));
                }
            }
        }
        // A broken stream while the worker restarts is the restart's doing.
        if let Ok(status) = worker::status(socket, timeout) {
            if status.state != WorkerState::Ready || Some(status.spawns) != control.spawns {
                watch::check_restart(control, &status);
                if let Some((reason, detail)) = control.reason() {
                    return stop(reason, format!("{detail} ({e})"));
                }
            }
        }
    }
    stop(FailReason::Client(e.clone()), e.to_string())
}

/// Sets exit calls aside (recording them) and finds the normal calls of an answer, from its
/// `tool_calls` or, when it has none, from `<tool_call>` text in its content.
fn asked(
    shared: &Shared,
    done: &Completion,
    generation: u32,
    r: &mut RunResult,
    emit: &mut dyn FnMut(&RunEvent),
) -> Result<Asked, Stop> {
    let mut record_exit = |call: ToolCall, source| {
        let signal = ExitSignal {
            generation,
            call,
            source,
        };
        emit(&RunEvent::Exit(signal.clone()));
        r.exits.push(signal);
    };
    if !done.tool_calls.is_empty() {
        let mut calls = Vec::new();
        for c in &done.tool_calls {
            if shared.tools.is_exit(&c.name) {
                record_exit(c.clone(), CallSource::Native);
            } else {
                calls.push((c.clone(), CallSource::Native));
            }
        }
        return Ok(Asked {
            calls,
            content: done.content.clone(),
        });
    }
    let Some(content) = done.content.as_deref() else {
        return Ok(Asked {
            calls: Vec::new(),
            content: None,
        });
    };
    let mut calls = Vec::new();
    let mut found = false;
    for (k, block) in text_calls(content).enumerate() {
        found = true;
        let call = block.outcome.map_err(|e| {
            stop(
                FailReason::ToolParseError,
                format!("<tool_call> block at byte {}: {e}", block.start),
            )
        })?;
        let Some(tool) = shared.tools.get(call.name) else {
            return Err(stop(
                FailReason::ToolParseError,
                format!(
                    "<tool_call> block at byte {} names no tool: `{}`",
                    block.start, call.name
                ),
            ));
        };
        let call = ToolCall {
            id: format!("text-{generation}-{k}"),
            name: call.name.to_owned(),
            arguments: call.arguments.to_owned(),
        };
        if tool.is_exit() {
            record_exit(call, CallSource::Text);
        } else {
            calls.push((call, CallSource::Text));
        }
    }
    let content = if found {
        let kept: String = prose(content).collect();
        let kept = kept.trim();
        (!kept.is_empty()).then(|| kept.to_owned())
    } else {
        Some(content.to_owned())
    };
    Ok(Asked { calls, content })
}
