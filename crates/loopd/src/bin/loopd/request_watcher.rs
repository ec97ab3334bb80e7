//! How `loopd run` shows one agent request on a terminal: its [`RequestEvent`]s rendered live
//! as `loopd ask` shows a chat (the `ask` watcher underneath), plus each generation's budget,
//! each call once (with its arguments and its outcome, when it ends), the exit signals and the
//! stalls in words; then, from the [`RequestResult`], a summary per generation and the calls
//! the model asked for that never ran (the budget spent).

use std::io::Write;

use loopd::llama::{ChatEvent, ToolCall};
use loopd::runner::{CallSource, Outcome, RequestEvent, RequestResult, StallAnswer};

use crate::ask::Watcher;

/// Longest tool result shown on the terminal (the model gets all of it).
const SHOWN_RESULT: usize = 400;

/// Renders [`RequestEvent`]s with an `ask` watcher underneath.
pub struct RequestWatcher<W: Write> {
    inner: Watcher<W>,
    /// The call running, shown with its outcome when it ends.
    running: Option<(ToolCall, CallSource)>,
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= SHOWN_RESULT {
        return s.to_owned();
    }
    let cut: String = s.chars().take(SHOWN_RESULT).collect();
    format!("{cut}… ({} bytes)", s.len())
}

impl<W: Write> RequestWatcher<W> {
    /// A watcher writing to `out`; `terminal` turns on the bar and the colours.
    pub fn new(out: W, terminal: bool) -> Self {
        RequestWatcher {
            inner: Watcher::new(out, terminal),
            running: None,
        }
    }

    /// Shows one event; write errors are ignored.
    pub fn event(&mut self, e: &RequestEvent) {
        let line = match e {
            // A call is shown once, when it runs; its streamed pieces would show it twice.
            RequestEvent::Chat(ChatEvent::ToolCallDelta { .. }) => return,
            RequestEvent::Chat(c) => return self.inner.event(c),
            RequestEvent::Generation {
                number,
                budget_left,
            } => format!("== generation {number}: {budget_left} tool iterations left"),
            RequestEvent::ToolStarted { call, source } => {
                self.running = Some((call.clone(), *source));
                return;
            }
            RequestEvent::ToolFinished { id, result } => {
                let outcome = match result {
                    Ok(text) => shorten(text),
                    Err(e) => format!("error: {e}"),
                };
                match self.running.take() {
                    Some((call, source)) if call.id == *id => {
                        format!("tool {} -> {outcome}", shown_call(&call, source))
                    }
                    _ => format!("tool call {id} -> {outcome}"),
                }
            }
            RequestEvent::Exit(s) => format!("exit signal: {}({})", s.call.name, s.call.arguments),
            RequestEvent::Iteration {
                number,
                budget_left,
            } => format!("iteration {number} done: {budget_left} tool iterations left"),
            RequestEvent::Stall(a) => stall_words(a),
        };
        let _ = self.inner.notice(&line);
    }

    /// Shows the outcome and one line per generation.
    pub fn finish(&mut self, r: &RequestResult) {
        for (i, g) in r.generations.iter().enumerate() {
            let t = g.timings.unwrap_or_default();
            let finish = g.finish_reason.map_or("failed", |f| f.as_str());
            let _ = self.inner.notice(&format!(
                "generation {}: budget left {}, prompt {} tokens ({} from cache), generated {}, \
                 {finish}, {:.1} s",
                i + 1,
                g.budget_left,
                t.prompt_n.saturating_add(t.cache_n),
                t.cache_n,
                t.predicted_n,
                g.elapsed.as_secs_f64()
            ));
        }
        for call in r.calls_not_run() {
            let why = if r.budget_left == 0 {
                format!("not run: no tool iterations left (budget {})", r.budget)
            } else {
                "not run".to_owned()
            };
            let _ = self.inner.notice(&format!(
                "tool {} -> {why}",
                shown_call(call, CallSource::Native)
            ));
        }
        let end = match &r.outcome {
            Outcome::Completed { finish_reason } => format!(
                "completed ({}) after {} tool calls; {} of {} tool iterations left",
                finish_reason.as_str(),
                r.tool_calls.len(),
                r.budget_left,
                r.budget
            ),
            Outcome::Failed { reason, detail } => format!("failed: {reason}: {detail}"),
        };
        let _ = self.inner.notice(&end);
    }
}

/// A call as the model wrote it: `name(arguments)`, and where it came from.
fn shown_call(call: &ToolCall, source: CallSource) -> String {
    let how = match source {
        CallSource::Native => "",
        CallSource::Text => " (parsed from text)",
    };
    format!("{}({}){how}", call.name, call.arguments)
}

/// llama-worker's answer to a stall report, in words.
fn stall_words(a: &StallAnswer) -> String {
    let what = match a {
        StallAnswer::Restarting => "no progress; it is restarting the server".to_owned(),
        StallAnswer::NotReady => "it is not ready yet; nothing was done".to_owned(),
        StallAnswer::NotStalled { since_progress_ms } => format!(
            "the server made progress {:.1} s ago; no restart",
            *since_progress_ms as f64 / 1000.0
        ),
    };
    format!("stall reported to llama-worker: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd::llama::{AssistantMessage, ChatEvent, ChatMessage, ToolCall};

    use loopd::runner::{FailReason, RequestId, ToolRecord};

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "arithmetic".into(),
            arguments: args.into(),
        }
    }

    fn shown(w: RequestWatcher<Vec<u8>>) -> String {
        String::from_utf8(w.inner.into_inner()).unwrap()
    }

    #[test]
    fn iterations_show_each_call_once_with_its_outcome_and_the_budget() {
        let mut w = RequestWatcher::new(Vec::new(), false);
        let add = call("c1", r#"{"operation":"add","numbers":[2,3]}"#);
        w.event(&RequestEvent::Generation {
            number: 1,
            budget_left: 2,
        });
        // The streamed pieces of the call are not shown: the call is, once, when it ends.
        w.event(&RequestEvent::Chat(ChatEvent::ToolCallDelta {
            index: 0,
            id: Some("c1".into()),
            name: Some("arithmetic".into()),
            arguments: add.arguments.clone(),
        }));
        w.event(&RequestEvent::ToolStarted {
            call: add,
            source: CallSource::Text,
        });
        w.event(&RequestEvent::ToolFinished {
            id: "c1".into(),
            result: Ok("5".into()),
        });
        w.event(&RequestEvent::ToolStarted {
            call: call("c2", "[1]"),
            source: CallSource::Native,
        });
        w.event(&RequestEvent::ToolFinished {
            id: "c2".into(),
            result: Err("bad arguments: not a JSON object".into()),
        });
        w.event(&RequestEvent::Iteration {
            number: 1,
            budget_left: 1,
        });
        w.event(&RequestEvent::Chat(ChatEvent::Content("Five.".into())));
        assert_eq!(
            shown(w),
            "== generation 1: 2 tool iterations left\n\
             tool arithmetic({\"operation\":\"add\",\"numbers\":[2,3]}) (parsed from text) -> 5\n\
             tool arithmetic([1]) -> error: bad arguments: not a JSON object\n\
             iteration 1 done: 1 tool iterations left\n[answer]\nFive."
        );
    }

    #[test]
    fn stalls_are_said_in_words() {
        let mut w = RequestWatcher::new(Vec::new(), false);
        for a in [
            StallAnswer::NotStalled {
                since_progress_ms: 200,
            },
            StallAnswer::NotReady,
            StallAnswer::Restarting,
        ] {
            w.event(&RequestEvent::Stall(a));
        }
        assert_eq!(
            shown(w),
            "stall reported to llama-worker: the server made progress 0.2 s ago; no restart\n\
             stall reported to llama-worker: it is not ready yet; nothing was done\n\
             stall reported to llama-worker: no progress; it is restarting the server\n"
        );
    }

    #[test]
    fn a_call_refused_for_the_budget_says_so() {
        let mut w = RequestWatcher::new(Vec::new(), false);
        let (ran, refused) = (call("c1", "{}"), call("c2", r#"{"n":2}"#));
        let r = RequestResult {
            id: RequestId(3),
            outcome: Outcome::Failed {
                reason: FailReason::ToolExecutionError,
                detail: "tool iteration budget exhausted".into(),
            },
            content: None,
            reasoning_content: None,
            transcript: vec![
                ChatMessage::Assistant(AssistantMessage {
                    content: None,
                    reasoning_content: None,
                    tool_calls: vec![ran.clone()],
                }),
                ChatMessage::Tool {
                    tool_call_id: "c1".into(),
                    content: "1".into(),
                },
                ChatMessage::Assistant(AssistantMessage {
                    content: None,
                    reasoning_content: None,
                    tool_calls: vec![refused],
                }),
            ],
            tool_calls: vec![ToolRecord {
                iteration: 1,
                call: ran,
                source: CallSource::Native,
                result: Ok("1".into()),
            }],
            exits: Vec::new(),
            generations: Vec::new(),
            budget: 1,
            budget_left: 0,
            stalls: Vec::new(),
            retries: Vec::new(),
        };
        w.finish(&r);
        assert_eq!(
            shown(w),
            "tool arithmetic({\"n\":2}) -> not run: no tool iterations left (budget 1)\n\
             failed: tool_execution_error: tool iteration budget exhausted\n"
        );
    }
}
