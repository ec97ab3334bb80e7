//! [`Output`]: what a running request has streamed so far, kept by its observer and
//! checkpointed into its row of the store, so that a request running when the daemon dies
//! comes back at the next start as a `failed` result with reason `daemon_restarted` and this
//! output ([`restarted_result`]), never as silence.
//!
//! [`Checkpoints`] says when to write it: at every tool iteration, and otherwise at most once
//! per [`CHECKPOINT_EVERY`] of the daemon's clock (time is an input).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::db::{Interrupted, RESTARTED};
use super::protocol::{to_line, WireResult};
use loopd_agent::runner::{
    CallSource, FailReason, Outcome, RequestEvent, RequestId, RequestResult, ToolRecord,
};
use loopd_client::llama::{ChatEvent, ToolCall};

/// The longest a running request's streamed output goes unwritten while it streams.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// One tool call run, as checkpointed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CallRun {
    iteration: u32,
    id: String,
    name: String,
    arguments: String,
    native: bool,
    /// `None` while it runs.
    ok: Option<bool>,
    result: String,
}

/// What a request has streamed: the current generation's text (a result's `content` and
/// `reasoning_content` are the last generation's) and the tool calls run so far.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Output {
    /// The current generation's answer text.
    pub content: String,
    /// The current generation's reasoning text.
    pub reasoning: String,
    /// Tool iterations left (`None`: no generation started yet).
    pub budget_left: Option<u32>,
    generation: u32,
    calls: Vec<CallRun>,
}

/// What [`Output::handle`] made of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing that a checkpoint holds.
    None,
    /// Streamed text: checkpointed within [`CHECKPOINT_EVERY`].
    Text,
    /// A tool iteration ended: checkpointed now.
    Iteration,
    /// A retry dropped the failed attempt's text (the transcript drops it too): checkpointed
    /// now, so a restart never brings back text that the request itself threw away.
    Dropped,
}

impl Output {
    /// Takes in one event of the request.
    pub fn handle(&mut self, e: &RequestEvent) -> Change {
        match e {
            RequestEvent::Generation {
                number,
                budget_left,
            } => {
                self.generation = *number;
                self.budget_left = Some(*budget_left);
                self.content.clear();
                self.reasoning.clear();
                Change::None
            }
            RequestEvent::Chat(ChatEvent::Content(t)) => {
                self.content.push_str(t);
                Change::Text
            }
            RequestEvent::Chat(ChatEvent::Reasoning(t)) => {
                self.reasoning.push_str(t);
                Change::Text
            }
            RequestEvent::ToolStarted { call, source } => {
                self.calls.push(CallRun {
                    iteration: self.generation,
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    native: *source == CallSource::Native,
                    ok: None,
                    result: String::new(),
                });
                Change::None
            }
            RequestEvent::ToolFinished { id, result } => {
                if let Some(c) = self.calls.iter_mut().rev().find(|c| &c.id == id) {
                    let (ok, text) = match result {
                        Ok(t) => (true, t),
                        Err(e) => (false, e),
                    };
                    c.ok = Some(ok);
                    c.result.clone_from(text);
                }
                Change::None
            }
            RequestEvent::Chat(ChatEvent::Retrying { .. }) => {
                self.content.clear();
                self.reasoning.clear();
                Change::Dropped
            }
            RequestEvent::Iteration { budget_left, .. } => {
                self.budget_left = Some(*budget_left);
                Change::Iteration
            }
            _ => Change::None,
        }
    }

    /// The checkpoint's JSON text.
    pub fn to_json(&self) -> String {
        // A struct of strings and numbers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// When a request's output is written: at an iteration, or streamed text at most once per
/// [`CHECKPOINT_EVERY`] (the first text at once).
#[derive(Debug, Clone, Copy, Default)]
pub struct Checkpoints {
    last: Option<Duration>,
}

impl Checkpoints {
    /// Whether a change at `now` is to be written now; if so it counts as written.
    pub fn due(&mut self, change: Change, now: Duration) -> bool {
        let due = match change {
            Change::None => false,
            Change::Iteration | Change::Dropped => true,
            Change::Text => self
                .last
                .is_none_or(|at| now >= at.saturating_add(CHECKPOINT_EVERY)),
        };
        if due {
            self.last = Some(now);
        }
        due
    }
}

/// The result of a request found running at start ([`Db::recover`](super::Db::recover)):
/// `failed` with reason `daemon_restarted` and its last checkpointed output, as the JSON of a
/// `result` reply. `budget` is the runner's default, for a submission that named none.
pub fn restarted_result(i: &Interrupted<'_>, budget: u32) -> String {
    let budget = serde_json::from_str::<serde_json::Value>(i.submission)
        .ok()
        .and_then(|s| s["budget"].as_u64())
        .and_then(|b| u32::try_from(b).ok())
        .unwrap_or(budget);
    let out: Output = i
        .output
        .and_then(|o| serde_json::from_str(o).ok())
        .unwrap_or_default();
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let r = RequestResult {
        id: RequestId(i.id),
        outcome: Outcome::Failed {
            // Overwritten below: the runner has no reason of the daemon's.
            reason: FailReason::Cancelled,
            detail: "the daemon stopped while the request ran (killed, crashed or restarted); \
                     the output is what it had streamed by its last checkpoint"
                .into(),
        },
        content: text(&out.content).or_else(|| out.budget_left.map(|_| String::new())),
        reasoning_content: text(&out.reasoning),
        transcript: Vec::new(),
        tool_calls: out
            .calls
            .iter()
            .filter_map(|c| {
                let ok = c.ok?;
                Some(ToolRecord {
                    iteration: c.iteration,
                    call: ToolCall {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                    source: if c.native {
                        CallSource::Native
                    } else {
                        CallSource::Text
                    },
                    result: if ok {
                        Ok(c.result.clone())
                    } else {
                        Err(c.result.clone())
                    },
                })
            })
            .collect(),
        exits: Vec::new(),
        generations: Vec::new(),
        budget,
        budget_left: out.budget_left.unwrap_or(budget),
        stalls: Vec::new(),
        retries: Vec::new(),
        host: i.host.map(str::to_owned),
    };
    let mut w = WireResult::from(&r);
    w.fail_reason = Some(RESTARTED.to_owned());
    to_line(&w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn text_is_checkpointed_at_once_then_at_most_once_a_second_and_iterations_always() {
        let mut c = Checkpoints::default();
        assert!(c.due(Change::Text, MS(100)));
        assert!(!c.due(Change::Text, MS(1_099)));
        assert!(!c.due(Change::None, MS(5_000)));
        assert!(c.due(Change::Text, MS(1_100)));
        assert!(c.due(Change::Iteration, MS(1_101)));
        assert!(!c.due(Change::Text, MS(2_100)));
        assert!(c.due(Change::Text, MS(2_101)));
    }

    /// Found by `make chaos` (seed 778): a retried attempt's text stayed in the checkpoint and
    /// came back after a daemon kill in front of the next attempt's.
    #[test]
    fn a_retry_drops_the_failed_attempts_text_and_is_written_at_once() {
        let mut out = Output::default();
        let mut c = Checkpoints::default();
        out.handle(&RequestEvent::Generation {
            number: 1,
            budget_left: 2,
        });
        let first = out.handle(&RequestEvent::Chat(ChatEvent::Content("The sea,".into())));
        assert!(c.due(first, MS(100)));
        let retry = out.handle(&RequestEvent::Chat(ChatEvent::Retrying {
            attempt: 2,
            after_ms: 400,
            error: "stream_closed_early".into(),
        }));
        assert_eq!(retry, Change::Dropped);
        assert!(c.due(retry, MS(200)), "written at once, not a second later");
        assert_eq!((out.content.as_str(), out.reasoning.as_str()), ("", ""));
        out.handle(&RequestEvent::Chat(ChatEvent::Content("The".into())));
        assert_eq!(out.content, "The");
        assert_eq!(out.generation, 1);
    }

    #[test]
    fn a_restarted_result_carries_the_checkpointed_output() {
        let mut out = Output::default();
        let call = ToolCall {
            id: "c1".into(),
            name: "arithmetic".into(),
            arguments: "{}".into(),
        };
        for e in [
            RequestEvent::Generation {
                number: 1,
                budget_left: 2,
            },
            RequestEvent::ToolStarted {
                call,
                source: CallSource::Native,
            },
            RequestEvent::ToolFinished {
                id: "c1".into(),
                result: Ok("5".into()),
            },
            RequestEvent::Iteration {
                number: 1,
                budget_left: 1,
            },
            RequestEvent::Generation {
                number: 2,
                budget_left: 1,
            },
            RequestEvent::Chat(ChatEvent::Content("The sum ".into())),
            RequestEvent::Chat(ChatEvent::Content("is 5".into())),
        ] {
            out.handle(&e);
        }
        let json = out.to_json();
        let i = Interrupted {
            id: 9,
            created: SystemTime::UNIX_EPOCH,
            submission: r#"{"cmd":"submit","budget":2,"messages":[]}"#,
            output: Some(&json),
            host: None,
            slot: Some(0),
        };
        assert_eq!(
            restarted_result(&i, 3),
            r#"{"id":9,"outcome":"failed","finish_reason":null,"fail_reason":"daemon_restarted","detail":"the daemon stopped while the request ran (killed, crashed or restarted); the output is what it had streamed by its last checkpoint","content":"The sum is 5","reasoning_content":null,"tool_calls":[{"iteration":1,"id":"c1","name":"arithmetic","arguments":"{}","source":"native","ok":true,"result":"5"}],"not_run":[],"exits":[],"generations":[],"budget":2,"budget_left":1,"stalls":[],"retries":[]}"#
        );
        let none = Interrupted {
            output: None,
            submission: "{}",
            ..i
        };
        let v: serde_json::Value = serde_json::from_str(&restarted_result(&none, 3)).unwrap();
        assert_eq!(
            (&v["content"], &v["budget"], &v["budget_left"]),
            (&serde_json::Value::Null, &3.into(), &3.into())
        );
        // With several hosts, the host the request was placed on, as a finished result has it.
        let placed = Interrupted {
            host: Some("gpu-b"),
            ..i
        };
        let v: serde_json::Value = serde_json::from_str(&restarted_result(&placed, 3)).unwrap();
        assert_eq!(v["host"], "gpu-b");
    }
}
