//! How `loopd run` (in process and `--daemon`) and `loopd submit --follow` show one agent
//! request, and `loopd result` its result: one renderer over the protocol's [`WireEvent`]
//! and [`WireResult`] (the in-process runner's events are converted with [`WireEvent::of`],
//! the daemon's arrive as they are). The chat part is rendered as `loopd ask` shows a chat
//! (the `ask` watcher underneath: on a terminal the progress bar and the reasoning dimmed
//! unless `NO_COLOR` is set), plus each generation's budget, each call once (with its
//! arguments and its outcome, when it ends), the exit signals and the stalls in words; then a
//! summary per generation, the calls the model asked for that never ran (the budget spent)
//! and one line of outcome.

use std::io::{IsTerminal, Stdout, Write};

use loopd::daemon::protocol::{WireEvent, WireResult, WireSource, WireStall};
use loopd_client::llama::ChatEvent;

use crate::ask::Watcher;

/// Longest tool result shown on the terminal (the model gets all of it).
const SHOWN_RESULT: usize = 400;

/// Renders a request's [`WireEvent`]s and its [`WireResult`], with an `ask` watcher underneath.
pub struct RequestWatcher<W: Write> {
    inner: Watcher<W>,
    /// The call running: its id and how it is shown, with its outcome when it ends.
    running: Option<(String, String)>,
    /// The first write that failed: nothing more is written after it.
    error: Option<std::io::Error>,
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= SHOWN_RESULT {
        return s.to_owned();
    }
    let cut: String = s.chars().take(SHOWN_RESULT).collect();
    format!("{cut}… ({} bytes)", s.len())
}

impl RequestWatcher<Stdout> {
    /// A watcher on stdout: the bar when it is a terminal, colours unless `NO_COLOR` is set.
    pub fn for_stdout() -> Self {
        let out = std::io::stdout();
        let terminal = out.is_terminal();
        let colour = crate::ask::colour_allowed(std::env::var_os("NO_COLOR").as_deref());
        RequestWatcher::new(out, terminal, colour)
    }
}

impl<W: Write> RequestWatcher<W> {
    /// A watcher writing to `out`; `terminal` turns on the bar, and `colour` (on a terminal)
    /// the colours.
    pub fn new(out: W, terminal: bool, colour: bool) -> Self {
        RequestWatcher {
            inner: Watcher::new(out, terminal).with_colour(colour),
            running: None,
            error: None,
        }
    }

    /// The first write that failed, if one did (a closed stdout: the command ends with 141
    /// once the request has).
    pub fn write_error(&mut self) -> Option<std::io::Error> {
        self.error.take().or_else(|| self.inner.write_error())
    }

    /// One line of its own; after a failed write, nothing.
    fn say(&mut self, line: &str) {
        if self.error.is_none() {
            self.error = self.inner.write_error();
        }
        if self.error.is_none() {
            self.error = self.inner.notice(line).err();
        }
    }

    /// Shows one event; the first write error is kept for [`write_error`](Self::write_error).
    pub fn event(&mut self, e: &WireEvent) {
        if self.error.is_some() {
            return;
        }
        let chat = |c: ChatEvent| Some(c);
        let chat_event = match e {
            WireEvent::Content { text } => chat(ChatEvent::Content(text.clone())),
            WireEvent::Reasoning { text } => chat(ChatEvent::Reasoning(text.clone())),
            WireEvent::Waiting { slot_busy } => chat(ChatEvent::Waiting {
                slot_busy: *slot_busy,
            }),
            WireEvent::Progress {
                total,
                cache,
                processed,
            } => chat(ChatEvent::Progress {
                total: *total,
                cache: *cache,
                processed: *processed,
            }),
            WireEvent::Retrying {
                attempt,
                after_ms,
                error,
            } => chat(ChatEvent::Retrying {
                attempt: *attempt,
                after_ms: *after_ms,
                error: error.clone(),
            }),
            WireEvent::ThinkingCapped { tokens } => {
                chat(ChatEvent::ThinkingCapped { tokens: *tokens })
            }
            _ => None,
        };
        if let Some(c) = chat_event {
            return self.inner.event(&c);
        }
        let line = match e {
            WireEvent::Generation {
                number,
                budget_left,
            } => format!("== generation {number}: {budget_left} tool iterations left"),
            WireEvent::ToolStarted {
                id,
                name,
                arguments,
                source,
            } => {
                self.running = Some((id.clone(), shown_call(name, arguments, *source)));
                return;
            }
            WireEvent::ToolFinished { id, ok, result } => {
                let outcome = if *ok {
                    shorten(result)
                } else {
                    format!("error: {result}")
                };
                match self.running.take() {
                    Some((started, call)) if started == *id => format!("tool {call} -> {outcome}"),
                    _ => format!("tool call {id} -> {outcome}"),
                }
            }
            WireEvent::Exit {
                name, arguments, ..
            } => format!("exit signal: {name}({arguments})"),
            WireEvent::Iteration {
                number,
                budget_left,
            } => format!("iteration {number} done: {budget_left} tool iterations left"),
            WireEvent::Stall(a) => stall_words(a),
            WireEvent::Placed { host, slot, by } if by == "rehomed" => {
                format!("host refused the connect: placed again on host {host}, slot {slot}")
            }
            WireEvent::Placed { host, slot, .. } => format!("on host {host}, slot {slot}"),
            WireEvent::Kv {
                action,
                outcome,
                tokens,
                detail,
                ..
            } => {
                let why = detail.as_ref().map_or(String::new(), |d| format!(" ({d})"));
                format!("kv {action}: {outcome}, {tokens} tokens{why}")
            }
            // The chat events, shown above.
            _ => return,
        };
        self.say(&line);
    }

    /// After the events: one line per generation, the calls never run, the outcome.
    pub fn finish(&mut self, r: &WireResult) {
        for (i, g) in r.generations.iter().enumerate() {
            let finish = g.finish_reason.as_deref().unwrap_or("failed");
            self.say(&format!(
                "generation {}: budget left {}, prompt {} tokens ({} from cache), generated {}, \
                 {finish}, {:.1} s",
                i + 1,
                g.budget_left,
                g.prompt_n.saturating_add(g.cache_n),
                g.cache_n,
                g.predicted_n,
                g.elapsed_ms as f64 / 1000.0
            ));
        }
        self.end(r);
    }

    /// A result whose events were not shown (`loopd result`): the answer, every call run with
    /// its outcome, the calls never run, the outcome.
    pub fn result(&mut self, r: &WireResult) {
        if let Some(c) = &r.content {
            self.say(c);
        }
        for t in &r.tool_calls {
            let outcome = if t.ok {
                shorten(&t.result)
            } else {
                format!("error: {}", t.result)
            };
            self.say(&format!(
                "tool {} -> {outcome}",
                shown_call(&t.name, &t.arguments, t.source)
            ));
        }
        self.end(r);
    }

    fn end(&mut self, r: &WireResult) {
        for call in &r.not_run {
            let why = if r.budget_left == 0 {
                format!("not run: no tool iterations left (budget {})", r.budget)
            } else {
                "not run".to_owned()
            };
            self.say(&format!(
                "tool {} -> {why}",
                shown_call(&call.name, &call.arguments, WireSource::Native)
            ));
        }
        let end = if r.completed() {
            format!(
                "completed ({}) after {} tool calls; {} of {} tool iterations left",
                r.finish_reason.as_deref().unwrap_or("?"),
                r.tool_calls.len(),
                r.budget_left,
                r.budget
            )
        } else {
            format!(
                "failed: {}: {}",
                r.fail_reason.as_deref().unwrap_or("?"),
                r.detail.as_deref().unwrap_or("")
            )
        };
        self.say(&format!("req-{}: {end}", r.id));
    }
}

/// A call as the model wrote it: `name(arguments)`, and where it came from.
fn shown_call(name: &str, arguments: &str, source: WireSource) -> String {
    let how = match source {
        WireSource::Native => "",
        WireSource::Text => " (parsed from text)",
    };
    format!("{name}({arguments}){how}")
}

/// llama-worker's answer to a stall report, in words.
fn stall_words(a: &WireStall) -> String {
    let what = match a {
        WireStall::Restarting => "no progress; it is restarting the server".to_owned(),
        WireStall::NotReady => "it is not ready yet; nothing was done".to_owned(),
        WireStall::NotStalled { since_progress_ms } => format!(
            "the server made progress {:.1} s ago; no restart",
            *since_progress_ms as f64 / 1000.0
        ),
    };
    format!("stall reported to llama-worker: {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd::daemon::protocol::{WireNotRun, WireOutcome, WireToolRun};
    use loopd_agent::runner::{
        CallSource, FailReason, Outcome, RequestEvent, RequestId, RequestResult, StallAnswer,
        ToolRecord,
    };
    use loopd_client::llama::{AssistantMessage, ChatMessage, ToolCall};

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

    /// The in-process runner's events, as `loopd run` converts them.
    fn show(w: &mut RequestWatcher<Vec<u8>>, e: RequestEvent) {
        if let Some(e) = WireEvent::of(&e) {
            w.event(&e);
        }
    }

    #[test]
    fn iterations_show_each_call_once_with_its_outcome_and_the_budget() {
        let mut w = RequestWatcher::new(Vec::new(), false, false);
        let add = call("c1", r#"{"operation":"add","numbers":[2,3]}"#);
        show(
            &mut w,
            RequestEvent::Generation {
                number: 1,
                budget_left: 2,
            },
        );
        // The streamed pieces of the call are not shown: the call is, once, when it ends.
        show(
            &mut w,
            RequestEvent::Chat(ChatEvent::ToolCallDelta {
                index: 0,
                id: Some("c1".into()),
                name: Some("arithmetic".into()),
                arguments: add.arguments.clone(),
            }),
        );
        show(
            &mut w,
            RequestEvent::ToolStarted {
                call: add,
                source: CallSource::Text,
            },
        );
        show(
            &mut w,
            RequestEvent::ToolFinished {
                id: "c1".into(),
                result: Ok("5".into()),
            },
        );
        show(
            &mut w,
            RequestEvent::ToolStarted {
                call: call("c2", "[1]"),
                source: CallSource::Native,
            },
        );
        show(
            &mut w,
            RequestEvent::ToolFinished {
                id: "c2".into(),
                result: Err("bad arguments: not a JSON object".into()),
            },
        );
        show(
            &mut w,
            RequestEvent::Iteration {
                number: 1,
                budget_left: 1,
            },
        );
        show(
            &mut w,
            RequestEvent::Chat(ChatEvent::Content("Five.".into())),
        );
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
        let mut w = RequestWatcher::new(Vec::new(), false, false);
        for a in [
            StallAnswer::NotStalled {
                since_progress_ms: 200,
            },
            StallAnswer::NotReady,
            StallAnswer::Restarting,
        ] {
            show(&mut w, RequestEvent::Stall(a));
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
        let mut w = RequestWatcher::new(Vec::new(), false, false);
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
            host: None,
        };
        w.finish(&WireResult::from(&r));
        assert_eq!(
            shown(w),
            "tool arithmetic({\"n\":2}) -> not run: no tool iterations left (budget 1)\n\
             req-3: failed: tool_execution_error: tool iteration budget exhausted\n"
        );
    }

    /// A followed request as the daemon streams it (`run --daemon`, `submit --follow`), its
    /// reasoning and answer, then the same result fetched by `loopd result`: on a terminal
    /// with colours, on one with `NO_COLOR`, and into a pipe.
    #[test]
    fn a_followed_request_and_its_result_byte_for_byte_with_and_without_colour() {
        let lines = [
            r#"{"event":"generation","number":1,"budget_left":1}"#,
            r#"{"event":"reasoning","text":"add"}"#,
            r#"{"event":"tool_started","id":"a","name":"read_file","arguments":"{\"path\":\"start.txt\"}","source":"native"}"#,
            r#"{"event":"tool_finished","id":"a","ok":true,"result":"go on"}"#,
            r#"{"event":"iteration","number":1,"budget_left":0}"#,
            r#"{"event":"generation","number":2,"budget_left":0}"#,
            r#"{"event":"content","text":"Do"}"#,
            r#"{"event":"content","text":"ne."}"#,
        ];
        let events: Vec<WireEvent> = lines
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let result = WireResult {
            id: 7,
            outcome: WireOutcome::Failed,
            finish_reason: None,
            fail_reason: Some("tool_execution_error".into()),
            detail: Some("tool iteration budget exhausted".into()),
            content: Some("Done.".into()),
            reasoning_content: None,
            tool_calls: vec![WireToolRun {
                iteration: 1,
                id: "a".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"start.txt"}"#.into(),
                source: WireSource::Native,
                ok: true,
                result: "go on".into(),
            }],
            not_run: vec![WireNotRun {
                id: "b".into(),
                name: "read_file".into(),
                arguments: "{}".into(),
            }],
            exits: vec![],
            generations: vec![],
            budget: 1,
            budget_left: 0,
            stalls: vec![],
            retries: vec![],
            host: None,
            session: None,
        };
        let followed = |terminal, colour| {
            let mut w = RequestWatcher::new(Vec::new(), terminal, colour);
            for e in &events {
                w.event(e);
            }
            w.finish(&result);
            shown(w)
        };
        let tail = "tool read_file({}) -> not run: no tool iterations left (budget 1)\n\
                    req-7: failed: tool_execution_error: tool iteration budget exhausted\n";
        let plain = format!(
            "== generation 1: 1 tool iterations left\n\
             [reasoning]\nadd\n\
             tool read_file({{\"path\":\"start.txt\"}}) -> go on\n\
             iteration 1 done: 0 tool iterations left\n\
             == generation 2: 0 tool iterations left\n\
             [answer]\nDone.\n{tail}"
        );
        assert_eq!(followed(false, false), plain);
        assert_eq!(followed(false, true), plain, "no colour off a terminal");
        assert_eq!(
            followed(true, false),
            plain,
            "NO_COLOR: the headers instead"
        );
        assert_eq!(
            followed(true, true),
            format!(
                "== generation 1: 1 tool iterations left\n\
                 \x1b[2madd\x1b[0m\n\
                 tool read_file({{\"path\":\"start.txt\"}}) -> go on\n\
                 iteration 1 done: 0 tool iterations left\n\
                 == generation 2: 0 tool iterations left\n\
                 Done.\n{tail}"
            )
        );
        // Not followed (`loopd result`): the answer, then every call.
        let mut w = RequestWatcher::new(Vec::new(), false, false);
        w.result(&result);
        assert_eq!(
            shown(w),
            format!("Done.\ntool read_file({{\"path\":\"start.txt\"}}) -> go on\n{tail}")
        );
    }
}
