//! The client protocol of `loopd serve` ([docs/loopd.md](../../../docs/loopd.md)): one JSON
//! line in, JSON lines out, one command per connection. This module parses a command line
//! into a [`Command`] or a typed [`ProtoError`], and writes results and events as JSON; it does
//! no IO.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::llama::{AssistantMessage, ChatEvent, ChatMessage, ChatOptions, ToolCall};
use crate::runner::{CallSource, Outcome, RequestEvent, RequestResult, StallAnswer, Submission};

/// Longest command line, newline included: a bigger one is refused with `LINE_TOO_LONG`.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Longest `wait` a client may ask for; a longer `timeout_ms` is cut to this.
pub const MAX_WAIT_MS: u64 = 600_000;

/// What a client may ask.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Start an agent request; with `follow`, stream its events on this connection.
    Submit {
        /// The request; its `tools` are the ones the client chose (names of the daemon's set).
        request: Submission,
        /// Stream events then the result on this connection.
        follow: bool,
    },
    /// Fetch a finished result (once).
    Result {
        /// The request.
        id: u64,
    },
    /// Wait up to `timeout_ms` for a result, then as `Result`.
    Wait {
        /// The request.
        id: u64,
        /// How long to wait, at most [`MAX_WAIT_MS`].
        timeout_ms: u64,
    },
    /// End a running request as `cancelled`.
    Cancel {
        /// The request.
        id: u64,
    },
    /// Stream a running request's events from now on, then its result (not fetched).
    Follow {
        /// The request.
        id: u64,
    },
    /// Slots, running requests, kept results, worker link.
    Status,
    /// The daemon's counters in the Prometheus text format.
    Metrics,
}

/// Why a command was refused before or while it ran; its code is on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The line is longer than [`MAX_LINE_BYTES`].
    LineTooLong,
    /// The line is not JSON (the parser's message).
    BadJson(String),
    /// `cmd` is missing or names no command.
    UnknownCommand(String),
    /// A field is missing, of the wrong type, or unknown (serde's message).
    BadRequest(String),
    /// `tools` names a tool the daemon does not offer.
    UnknownTool(String),
    /// A runner refusal (`NO_SLOT_AVAILABLE`, `WORKER_NOT_READY`, ...), with its detail.
    Refused(&'static str, String),
    /// No such request, or its result was fetched or evicted.
    NotFound,
    /// The request is still running.
    Pending,
    /// The daemon is shutting down and takes no new request.
    ShuttingDown,
    /// Too many connections are open at once.
    TooManyConnections,
    /// The client sent no whole line before the read deadline.
    ReadTimeout,
}

impl ProtoError {
    /// The code on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProtoError::LineTooLong => "LINE_TOO_LONG",
            ProtoError::BadJson(_) => "BAD_JSON",
            ProtoError::UnknownCommand(_) => "UNKNOWN_COMMAND",
            ProtoError::BadRequest(_) => "BAD_REQUEST",
            ProtoError::UnknownTool(_) => "UNKNOWN_TOOL",
            ProtoError::Refused(code, _) => code,
            ProtoError::NotFound => "NOT_FOUND",
            ProtoError::Pending => "PENDING",
            ProtoError::ShuttingDown => "SHUTTING_DOWN",
            ProtoError::TooManyConnections => "TOO_MANY_CONNECTIONS",
            ProtoError::ReadTimeout => "READ_TIMEOUT",
        }
    }

    /// The error line: `{"ok":false,"error":CODE,"detail":...}`.
    pub fn to_line(&self) -> String {
        json!({"ok": false, "error": self.as_str(), "detail": self.to_string()}).to_string()
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::LineTooLong => {
                write!(f, "the command line is longer than {MAX_LINE_BYTES} bytes")
            }
            ProtoError::BadJson(e) => write!(f, "the line is not JSON: {e}"),
            ProtoError::UnknownCommand(c) => write!(
                f,
                "unknown command {c}; use submit, result, wait, cancel, follow, status or metrics"
            ),
            ProtoError::BadRequest(e) => write!(f, "bad request: {e}"),
            ProtoError::UnknownTool(t) => write!(f, "the daemon offers no tool `{t}`"),
            ProtoError::Refused(_, d) => f.write_str(d),
            ProtoError::NotFound => {
                f.write_str("no such request, or its result was already fetched or has expired")
            }
            ProtoError::Pending => f.write_str("the request is still running"),
            ProtoError::ShuttingDown => f.write_str("the daemon is shutting down"),
            ProtoError::TooManyConnections => f.write_str("too many connections; try again"),
            ProtoError::ReadTimeout => f.write_str("no whole command line before the deadline"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// One message of a `submit`'s `messages`, as on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireMessage {
    /// `user`, `system`, `assistant` or `tool`.
    pub role: String,
    /// Its text.
    #[serde(default)]
    pub content: String,
    /// An assistant turn's calls (an earlier turn of the conversation, or a worked example).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireCall>,
    /// A tool turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl WireMessage {
    /// A user message.
    pub fn user(content: impl Into<String>) -> WireMessage {
        WireMessage {
            role: "user".into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// One call of an assistant turn, as on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireCall {
    /// The call's id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments, JSON text.
    pub arguments: String,
}

/// The `submit` command line, as the daemon reads it and its clients write it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submit {
    /// `submit`.
    pub cmd: String,
    /// The conversation: at least one user message.
    pub messages: Vec<WireMessage>,
    /// A system message, sent after the BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Tool iterations allowed (`runner.budget` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u32>,
    /// Let the model think.
    #[serde(default)]
    pub thinking: bool,
    /// The generations' `max_tokens` (`limits.max_tokens` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The tools offered, by name (all of the daemon's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Stream the events, then the result, on this connection.
    #[serde(default)]
    pub follow: bool,
}

impl Submit {
    /// A submit of `messages`, everything else left to the daemon's defaults.
    pub fn new(messages: Vec<WireMessage>) -> Submit {
        Submit {
            cmd: "submit".into(),
            messages,
            system: None,
            budget: None,
            thinking: false,
            max_tokens: None,
            tools: None,
            follow: false,
        }
    }

    /// The command line, without its newline.
    pub fn to_line(&self) -> String {
        // Strings, numbers and lists of them always serialize.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireId {
    #[allow(dead_code)]
    cmd: String,
    id: u64,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WireBare {
    #[allow(dead_code)]
    cmd: String,
}

fn typed<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, ProtoError> {
    serde_json::from_value(v).map_err(|e| ProtoError::BadRequest(e.to_string()))
}

/// Parses one command line (without its newline).
pub fn parse(line: &[u8]) -> Result<Command, ProtoError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(ProtoError::LineTooLong);
    }
    let v: Value = serde_json::from_slice(line).map_err(|e| ProtoError::BadJson(e.to_string()))?;
    let cmd = match v.get("cmd") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(ProtoError::UnknownCommand(other.to_string())),
        None if v.is_object() => return Err(ProtoError::UnknownCommand("(no `cmd`)".into())),
        None => {
            return Err(ProtoError::BadRequest(
                "the line is not a JSON object".into(),
            ))
        }
    };
    match cmd.as_str() {
        "submit" => {
            let w: Submit = typed(v)?;
            let mut messages = Vec::with_capacity(w.messages.len());
            for m in w.messages {
                let role = m.role.as_str();
                if role != "assistant" && !m.tool_calls.is_empty() {
                    return Err(ProtoError::BadRequest(format!(
                        "role `{role}`: only an assistant message has tool_calls"
                    )));
                }
                if role != "tool" && m.tool_call_id.is_some() {
                    return Err(ProtoError::BadRequest(format!(
                        "role `{role}`: only a tool message has a tool_call_id"
                    )));
                }
                messages.push(match role {
                    "user" => ChatMessage::User { content: m.content },
                    "system" => ChatMessage::System { content: m.content },
                    "assistant" => ChatMessage::Assistant(AssistantMessage {
                        content: Some(m.content),
                        reasoning_content: None,
                        tool_calls: m
                            .tool_calls
                            .into_iter()
                            .map(|c| ToolCall {
                                id: c.id,
                                name: c.name,
                                arguments: c.arguments,
                            })
                            .collect(),
                    }),
                    "tool" => ChatMessage::Tool {
                        tool_call_id: m.tool_call_id.ok_or_else(|| {
                            ProtoError::BadRequest("role `tool`: tool_call_id is required".into())
                        })?,
                        content: m.content,
                    },
                    other => {
                        return Err(ProtoError::BadRequest(format!(
                            "role `{other}`: use user, system, assistant or tool"
                        )))
                    }
                });
            }
            if !messages
                .iter()
                .any(|m| matches!(m, ChatMessage::User { .. }))
            {
                return Err(ProtoError::BadRequest(
                    "messages: at least one user message is needed".into(),
                ));
            }
            Ok(Command::Submit {
                request: Submission {
                    system: w.system,
                    messages,
                    budget: w.budget,
                    tools: w.tools,
                    options: ChatOptions {
                        thinking: w.thinking,
                        max_tokens: w.max_tokens,
                        ..ChatOptions::default()
                    },
                },
                follow: w.follow,
            })
        }
        "result" | "cancel" | "follow" => {
            let w: WireId = typed(v)?;
            if w.timeout_ms.is_some() {
                return Err(ProtoError::BadRequest(format!(
                    "unknown field `timeout_ms` for {cmd}"
                )));
            }
            Ok(match cmd.as_str() {
                "result" => Command::Result { id: w.id },
                "cancel" => Command::Cancel { id: w.id },
                _ => Command::Follow { id: w.id },
            })
        }
        "wait" => {
            let w: WireId = typed(v)?;
            Ok(Command::Wait {
                id: w.id,
                timeout_ms: w.timeout_ms.unwrap_or(MAX_WAIT_MS).min(MAX_WAIT_MS),
            })
        }
        "status" | "metrics" => {
            let _: WireBare = typed(v)?;
            Ok(if cmd == "status" {
                Command::Status
            } else {
                Command::Metrics
            })
        }
        other => Err(ProtoError::UnknownCommand(format!("`{other}`"))),
    }
}

fn source(s: CallSource) -> &'static str {
    match s {
        CallSource::Native => "native",
        CallSource::Text => "text",
    }
}

fn stall(a: &StallAnswer) -> Value {
    match a {
        StallAnswer::Restarting => json!({"answer": "restarting"}),
        StallAnswer::NotReady => json!({"answer": "not_ready"}),
        StallAnswer::NotStalled { since_progress_ms } => {
            json!({"answer": "not_stalled", "since_progress_ms": since_progress_ms})
        }
    }
}

/// A result as JSON (the `result` of a `result`, `wait` or `follow` reply).
pub fn result_json(r: &RequestResult) -> Value {
    let (outcome, finish, reason, detail) = match &r.outcome {
        Outcome::Completed { finish_reason } => {
            ("completed", Some(finish_reason.as_str()), None, None)
        }
        Outcome::Failed { reason, detail } => {
            ("failed", None, Some(reason.as_str()), Some(detail.as_str()))
        }
    };
    let tool_calls: Vec<Value> = r
        .tool_calls
        .iter()
        .map(|t| {
            let (ok, text) = match &t.result {
                Ok(s) => (true, s),
                Err(e) => (false, e),
            };
            json!({"iteration": t.iteration, "id": t.call.id, "name": t.call.name,
                   "arguments": t.call.arguments, "source": source(t.source),
                   "ok": ok, "result": text})
        })
        .collect();
    let exits: Vec<Value> = r
        .exits
        .iter()
        .map(|e| {
            json!({"generation": e.generation, "name": e.call.name,
                   "arguments": e.call.arguments, "source": source(e.source)})
        })
        .collect();
    let not_run: Vec<Value> = r
        .calls_not_run()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
        .collect();
    let generations: Vec<Value> = r
        .generations
        .iter()
        .map(|g| {
            let t = g.timings.unwrap_or_default();
            json!({"budget_left": g.budget_left, "cache_n": t.cache_n, "prompt_n": t.prompt_n,
                   "predicted_n": t.predicted_n, "reasoning_tokens": g.reasoning_tokens,
                   "finish_reason": g.finish_reason.map(|f| f.as_str()),
                   "elapsed_ms": u64::try_from(g.elapsed.as_millis()).unwrap_or(u64::MAX)})
        })
        .collect();
    json!({
        "id": r.id.0, "outcome": outcome, "finish_reason": finish, "fail_reason": reason,
        "detail": detail, "content": r.content, "reasoning_content": r.reasoning_content,
        "tool_calls": tool_calls, "not_run": not_run, "exits": exits, "generations": generations,
        "budget": r.budget, "budget_left": r.budget_left,
        "stalls": r.stalls.iter().map(stall).collect::<Vec<_>>(),
        "retries": r.retries.iter().map(|t| json!({"generation": t.generation,
            "attempt": t.attempt, "after_ms": t.after_ms, "error": t.error, "detail": t.detail}))
            .collect::<Vec<_>>(),
    })
}

/// An event as JSON (`{"event": ...}` on a `follow` stream); `None` for the client's
/// internal ones that say nothing to a watcher.
pub fn event_json(e: &RequestEvent) -> Option<Value> {
    Some(match e {
        RequestEvent::Generation {
            number,
            budget_left,
        } => json!({"event": "generation", "number": number, "budget_left": budget_left}),
        RequestEvent::Chat(c) => match c {
            ChatEvent::Content(t) => json!({"event": "content", "text": t}),
            ChatEvent::Reasoning(t) => json!({"event": "reasoning", "text": t}),
            ChatEvent::Waiting { slot_busy } => json!({"event": "waiting", "slot_busy": slot_busy}),
            ChatEvent::Progress {
                total,
                cache,
                processed,
            } => {
                json!({"event": "progress", "total": total, "cache": cache, "processed": processed})
            }
            ChatEvent::Retrying {
                attempt,
                after_ms,
                error,
            } => {
                json!({"event": "retrying", "attempt": attempt, "after_ms": after_ms, "error": error})
            }
            ChatEvent::ThinkingCapped { tokens } => {
                json!({"event": "thinking_capped", "tokens": tokens})
            }
            _ => return None,
        },
        RequestEvent::ToolStarted { call, source: s } => json!({"event": "tool_started",
            "id": call.id, "name": call.name, "arguments": call.arguments, "source": source(*s)}),
        RequestEvent::ToolFinished { id, result } => match result {
            Ok(t) => json!({"event": "tool_finished", "id": id, "ok": true, "result": t}),
            Err(e) => json!({"event": "tool_finished", "id": id, "ok": false, "result": e}),
        },
        RequestEvent::Exit(x) => json!({"event": "exit", "name": x.call.name,
            "arguments": x.call.arguments, "source": source(x.source)}),
        RequestEvent::Iteration {
            number,
            budget_left,
        } => json!({"event": "iteration", "number": number, "budget_left": budget_left}),
        RequestEvent::Stall(a) => {
            let mut v = stall(a);
            v["event"] = json!("stall");
            v
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> &'static str {
        parse(line.as_bytes()).unwrap_err().as_str()
    }

    #[test]
    fn every_command_parses() {
        let c = parse(
            br#"{"cmd":"submit","messages":[{"role":"user","content":"hi"}],"budget":2,"thinking":true,"tools":["arithmetic"],"follow":true}"#,
        )
        .unwrap();
        let Command::Submit { request, follow } = c else {
            panic!("{c:?}")
        };
        assert_eq!(request.budget, Some(2));
        assert!(request.options.thinking && follow);
        assert_eq!(request.tools, Some(vec!["arithmetic".to_string()]));
        assert_eq!(
            parse(br#"{"cmd":"result","id":3}"#),
            Ok(Command::Result { id: 3 })
        );
        assert_eq!(
            parse(br#"{"cmd":"wait","id":3,"timeout_ms":99999999}"#),
            Ok(Command::Wait {
                id: 3,
                timeout_ms: MAX_WAIT_MS
            })
        );
        assert_eq!(
            parse(br#"{"cmd":"cancel","id":1}"#),
            Ok(Command::Cancel { id: 1 })
        );
        assert_eq!(
            parse(br#"{"cmd":"follow","id":1}"#),
            Ok(Command::Follow { id: 1 })
        );
        assert_eq!(parse(br#"{"cmd":"status"}"#), Ok(Command::Status));
        assert_eq!(parse(br#"{"cmd":"metrics"}"#), Ok(Command::Metrics));
    }

    #[test]
    fn earlier_turns_carry_their_tool_calls_and_results() {
        let c = parse(
            br#"{"cmd":"submit","messages":[{"role":"user","content":"2+3?"},
                {"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"arithmetic","arguments":"{}"}]},
                {"role":"tool","tool_call_id":"c1","content":"5"},{"role":"user","content":"and 4+4?"}]}"#,
        )
        .unwrap();
        let Command::Submit { request, .. } = c else {
            panic!("{c:?}")
        };
        assert_eq!(
            request.messages[1..3],
            [
                ChatMessage::Assistant(AssistantMessage {
                    content: Some(String::new()),
                    reasoning_content: None,
                    tool_calls: vec![ToolCall {
                        id: "c1".into(),
                        name: "arithmetic".into(),
                        arguments: "{}".into()
                    }],
                }),
                ChatMessage::Tool {
                    tool_call_id: "c1".into(),
                    content: "5".into()
                }
            ]
        );
        for (line, detail) in [
            (
                r#"{"role":"tool","content":"x"}"#,
                "role `tool`: tool_call_id is required",
            ),
            (
                r#"{"role":"user","content":"x","tool_call_id":"c"}"#,
                "role `user`: only a tool message has a tool_call_id",
            ),
            (
                r#"{"role":"user","content":"x","tool_calls":[{"id":"c","name":"n","arguments":"{}"}]}"#,
                "role `user`: only an assistant message has tool_calls",
            ),
        ] {
            let cmd = format!(
                r#"{{"cmd":"submit","messages":[{line},{{"role":"user","content":"q"}}]}}"#
            );
            assert_eq!(
                parse(cmd.as_bytes()),
                Err(ProtoError::BadRequest(detail.into())),
                "{line}"
            );
        }
    }

    /// The clients write their submit with the type the daemon reads it with.
    #[test]
    fn a_clients_submit_is_the_line_the_daemon_reads() {
        let s = Submit {
            budget: Some(2),
            max_tokens: Some(64),
            follow: true,
            ..Submit::new(vec![WireMessage::user("hi")])
        };
        assert_eq!(
            s.to_line(),
            r#"{"cmd":"submit","messages":[{"role":"user","content":"hi"}],"budget":2,"thinking":false,"max_tokens":64,"follow":true}"#
        );
        let Ok(Command::Submit { request, follow }) = parse(s.to_line().as_bytes()) else {
            panic!("{}", s.to_line())
        };
        assert_eq!(
            (request.budget, request.options.max_tokens, follow),
            (Some(2), Some(64), true)
        );
    }

    #[test]
    fn bad_lines_get_their_own_codes() {
        assert_eq!(code("not json"), "BAD_JSON");
        assert_eq!(code(r#"{"cmd":"explode"}"#), "UNKNOWN_COMMAND");
        assert_eq!(code(r#"{"id":1}"#), "UNKNOWN_COMMAND");
        assert_eq!(code(r#"{"cmd":7}"#), "UNKNOWN_COMMAND");
        assert_eq!(code("[1,2]"), "BAD_REQUEST");
        assert_eq!(code(r#"{"cmd":"result"}"#), "BAD_REQUEST");
        assert_eq!(code(r#"{"cmd":"result","id":-1}"#), "BAD_REQUEST");
        assert_eq!(code(r#"{"cmd":"status","x":1}"#), "BAD_REQUEST");
        assert_eq!(code(r#"{"cmd":"submit","messages":[]}"#), "BAD_REQUEST");
        assert_eq!(
            code(r#"{"cmd":"submit","messages":[{"role":"tool","content":"x"}]}"#),
            "BAD_REQUEST"
        );
        assert_eq!(
            code(r#"{"cmd":"result","id":1,"timeout_ms":5}"#),
            "BAD_REQUEST"
        );
        let long = vec![b' '; MAX_LINE_BYTES + 1];
        assert_eq!(parse(&long), Err(ProtoError::LineTooLong));
        let mut at_cap = br#"{"cmd":"status"}"#.to_vec();
        at_cap.resize(MAX_LINE_BYTES, b' ');
        assert_eq!(parse(&at_cap), Ok(Command::Status));
    }

    #[test]
    fn an_error_line_names_its_code_and_detail() {
        assert_eq!(
            ProtoError::NotFound.to_line(),
            r#"{"ok":false,"error":"NOT_FOUND","detail":"no such request, or its result was already fetched or has expired"}"#
        );
    }

    /// A batch of three calls at budget 0: one exit signal, one run earlier, one refused. The
    /// result says which ran and which did not, so a client can show the refusal.
    #[test]
    fn a_result_names_the_calls_that_never_ran() {
        use crate::runner::{ExitSignal, FailReason, RequestId, ToolRecord};
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        };
        let asked = |calls: Vec<ToolCall>| {
            ChatMessage::Assistant(AssistantMessage {
                content: Some(String::new()),
                reasoning_content: None,
                tool_calls: calls,
            })
        };
        let r = RequestResult {
            id: RequestId(3),
            outcome: Outcome::Failed {
                reason: FailReason::ToolExecutionError,
                detail: "tool iteration budget exhausted".into(),
            },
            content: Some(String::new()),
            reasoning_content: None,
            transcript: vec![
                asked(vec![call("a", "arithmetic")]),
                ChatMessage::Tool {
                    tool_call_id: "a".into(),
                    content: "5".into(),
                },
                asked(vec![call("b", "finish"), call("c", "arithmetic")]),
            ],
            tool_calls: vec![ToolRecord {
                iteration: 1,
                call: call("a", "arithmetic"),
                source: CallSource::Native,
                result: Ok("5".into()),
            }],
            exits: vec![ExitSignal {
                generation: 2,
                call: call("b", "finish"),
                source: CallSource::Native,
            }],
            generations: vec![],
            budget: 1,
            budget_left: 0,
            stalls: vec![],
            retries: vec![],
        };
        assert_eq!(
            result_json(&r)["not_run"],
            json!([{"id": "c", "name": "arithmetic", "arguments": "{}"}])
        );
        assert_eq!(
            result_json(&r)["tool_calls"][0]["id"],
            "a",
            "the call that ran is not among them"
        );
    }
}
