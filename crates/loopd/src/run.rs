//! `loopd run`: one agent request through the runner with the built-in tools, shown live as
//! `loopd ask` shows a request, plus each generation's budget, the calls with their
//! arguments, their results and the exit signals; then a summary per generation.

use std::io::Write;

use loopd::runner::{CallSource, Outcome, RunEvent, RunResult};

use crate::ask::Watcher;

/// Longest tool result shown on the terminal (the model gets all of it).
const SHOWN_RESULT: usize = 400;

/// Renders [`RunEvent`]s with an `ask` watcher underneath.
pub struct RunWatcher<W: Write> {
    inner: Watcher<W>,
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= SHOWN_RESULT {
        return s.to_owned();
    }
    let cut: String = s.chars().take(SHOWN_RESULT).collect();
    format!("{cut}… ({} bytes)", s.len())
}

impl<W: Write> RunWatcher<W> {
    /// A watcher writing to `out`; `terminal` turns on the bar and the colours.
    pub fn new(out: W, terminal: bool) -> Self {
        RunWatcher {
            inner: Watcher::new(out, terminal),
        }
    }

    /// Shows one event; write errors are ignored.
    pub fn event(&mut self, e: &RunEvent) {
        let line = match e {
            RunEvent::Chat(c) => return self.inner.event(c),
            RunEvent::Generation {
                number,
                budget_left,
            } => format!("== generation {number}: {budget_left} tool iterations left"),
            RunEvent::ToolStarted { call, source } => {
                let how = match source {
                    CallSource::Native => "",
                    CallSource::Text => " (parsed from text)",
                };
                format!("-> {}({}){how}", call.name, call.arguments)
            }
            RunEvent::ToolFinished { result, .. } => match result {
                Ok(text) => format!("<- {}", shorten(text)),
                Err(e) => format!("<- error: {e}"),
            },
            RunEvent::Exit(s) => format!("exit signal: {}({})", s.call.name, s.call.arguments),
            RunEvent::Iteration {
                number,
                budget_left,
            } => format!("iteration {number} done: {budget_left} tool iterations left"),
            RunEvent::Stall(a) => format!("stall reported to llama-worker: {a:?}"),
        };
        let _ = self.inner.notice(&line);
    }

    /// Shows the outcome and one line per generation.
    pub fn finish(&mut self, r: &RunResult) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use loopd::llama::{ChatEvent, ToolCall};

    #[test]
    fn iterations_show_calls_results_and_budget() {
        let mut w = RunWatcher::new(Vec::new(), false);
        let call = ToolCall {
            id: "c1".into(),
            name: "arithmetic".into(),
            arguments: r#"{"operation":"add","numbers":[2,3]}"#.into(),
        };
        w.event(&RunEvent::Generation {
            number: 1,
            budget_left: 2,
        });
        w.event(&RunEvent::ToolStarted {
            call,
            source: CallSource::Text,
        });
        w.event(&RunEvent::ToolFinished {
            id: "c1".into(),
            result: Ok("5".into()),
        });
        w.event(&RunEvent::Iteration {
            number: 1,
            budget_left: 1,
        });
        w.event(&RunEvent::Chat(ChatEvent::Content("Five.".into())));
        let out = String::from_utf8(w.inner.into_inner()).unwrap();
        assert_eq!(
            out,
            "== generation 1: 2 tool iterations left\n\
             -> arithmetic({\"operation\":\"add\",\"numbers\":[2,3]}) (parsed from text)\n\
             <- 5\niteration 1 done: 1 tool iterations left\n[answer]\nFive."
        );
    }
}
