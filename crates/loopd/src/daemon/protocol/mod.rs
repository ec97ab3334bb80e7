//! The client protocol of `loopd serve` ([docs/loopd.md](../../../docs/loopd.md)): one JSON
//! line in, JSON lines out, one command per connection. Every message is a serde type here,
//! shared by the daemon and its clients: the commands ([`Command`] and one struct each), the
//! replies (one struct each, and [`ErrorReply`] with its [`ErrorCode`]), the result
//! ([`WireResult`]) and the events ([`WireEvent`]). [`parse`] reads a command line into a
//! [`Command`] or a typed [`ProtoError`]; nothing here does IO.

use std::fmt;

use serde_json::Value;

use loopd_agent::runner::{RequestId, ResultError};

mod command;
mod reply;
mod result;
mod session;

pub use command::{
    CancelCmd, Command, FollowCmd, MetricsCmd, ResultCmd, StatusCmd, SubmitCmd, WaitCmd, WireCall,
    WireMessage, MAX_SESSION_BYTES,
};
pub use reply::{
    to_line, CancelReply, CancelState, ErrorCode, ErrorReply, FollowReply, HostLine, MetricsReply,
    OkFalse, OkTrue, ResultReply, ServeState, Status, StatusReply, SubmitReply,
};
pub use result::{
    WireEvent, WireExit, WireGeneration, WireNotRun, WireOutcome, WireResult, WireRetry,
    WireSource, WireStall, WireToolRun,
};
pub use session::{
    check_name, Compaction, CompactionRule, DeleteCmd, DeleteReply, HistoryCmd, HistoryReply,
    ListCmd, ListReply, OpenCmd, OpenReply, Record, SessionLine, SessionSettings, TurnCmd,
    TurnRecord, MAX_SESSION_NAME_BYTES,
};

/// Longest command line, newline included: a bigger one is refused with `LINE_TOO_LONG`.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Longest `wait` a client may ask for; a longer `timeout_ms` is cut to this.
pub const MAX_WAIT_MS: u64 = 600_000;

/// Why a command was refused before or while it ran; its [`ErrorCode`] is on the wire.
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
    /// A refusal of the runner's or the store's (`NO_SLOT_AVAILABLE`, `STORE_FULL`, ...),
    /// with its detail.
    Refused(ErrorCode, String),
    /// Not found (no such request, or its result was fetched or evicted) or still pending:
    /// the runner's own [`ResultError`], one type for the idea wherever it is said.
    Result(ResultError),
    /// `follow` of a request that has ended: its result is to be fetched.
    Ended(RequestId),
    /// The follower fell this many events behind and was dropped.
    FollowerDropped(usize),
    /// The daemon is shutting down and takes no new request.
    ShuttingDown,
    /// Too many connections are open at once.
    TooManyConnections,
    /// The client sent no whole line before the read deadline.
    ReadTimeout,
}

impl From<ResultError> for ProtoError {
    fn from(e: ResultError) -> Self {
        ProtoError::Result(e)
    }
}

impl ProtoError {
    /// The code on the wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            ProtoError::LineTooLong => ErrorCode::LineTooLong,
            ProtoError::BadJson(_) => ErrorCode::BadJson,
            ProtoError::UnknownCommand(_) => ErrorCode::UnknownCommand,
            ProtoError::BadRequest(_) => ErrorCode::BadRequest,
            ProtoError::UnknownTool(_) => ErrorCode::UnknownTool,
            ProtoError::Refused(code, _) => *code,
            ProtoError::Result(ResultError::NotFound) => ErrorCode::NotFound,
            ProtoError::Result(ResultError::Pending) => ErrorCode::Pending,
            ProtoError::Ended(_) => ErrorCode::Ended,
            ProtoError::FollowerDropped(_) => ErrorCode::FollowerDropped,
            ProtoError::ShuttingDown => ErrorCode::ShuttingDown,
            ProtoError::TooManyConnections => ErrorCode::TooManyConnections,
            ProtoError::ReadTimeout => ErrorCode::ReadTimeout,
        }
    }

    /// The code's name on the wire.
    pub fn as_str(&self) -> &'static str {
        self.code().as_str()
    }

    /// The error reply.
    pub fn reply(&self) -> ErrorReply {
        ErrorReply::new(self.code(), self.to_string())
    }

    /// The error line: `{"ok":false,"error":CODE,"detail":...}`.
    pub fn to_line(&self) -> String {
        to_line(&self.reply())
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
                "unknown command {c}; use submit, result, wait, cancel, follow, status, metrics, \
                 open, turn, history, list or delete"
            ),
            ProtoError::BadRequest(e) => write!(f, "bad request: {e}"),
            ProtoError::UnknownTool(t) => write!(f, "the daemon offers no tool `{t}`"),
            ProtoError::Refused(_, d) => f.write_str(d),
            ProtoError::Result(ResultError::NotFound) => {
                f.write_str("no such request, or its result was already fetched or has expired")
            }
            ProtoError::Result(ResultError::Pending) => f.write_str("the request is still running"),
            ProtoError::Ended(id) => write!(f, "{id} has ended; fetch its result with result"),
            ProtoError::FollowerDropped(n) => write!(f, "the client fell {n} events behind"),
            ProtoError::ShuttingDown => f.write_str("the daemon is shutting down"),
            ProtoError::TooManyConnections => f.write_str("too many connections; try again"),
            ProtoError::ReadTimeout => f.write_str("no whole command line before the deadline"),
        }
    }
}

impl std::error::Error for ProtoError {}

/// Parses one command line (without its newline): [`ProtoError::LineTooLong`] when it has
/// [`MAX_LINE_BYTES`] bytes or more, which its newline would take past the cap. A key given
/// twice is refused (`BAD_REQUEST`), never read as its last value. A `submit`'s messages are
/// checked when it applies itself ([`SubmitCmd::to_submission`]).
pub fn parse(line: &[u8]) -> Result<Command, ProtoError> {
    if line.len() >= MAX_LINE_BYTES {
        return Err(ProtoError::LineTooLong);
    }
    let v: Value = serde_json::from_slice(line).map_err(|e| ProtoError::BadJson(e.to_string()))?;
    match v.get("cmd") {
        Some(Value::String(s)) if Command::NAMES.contains(&s.as_str()) => {}
        Some(Value::String(s)) => return Err(ProtoError::UnknownCommand(format!("`{s}`"))),
        Some(other) => return Err(ProtoError::UnknownCommand(other.to_string())),
        None if v.is_object() => return Err(ProtoError::UnknownCommand("(no `cmd`)".into())),
        None => {
            return Err(ProtoError::BadRequest(
                "the line is not a JSON object".into(),
            ))
        }
    }
    // From the bytes, not from `v`: a `Value` keeps the last of a key given twice, where
    // serde's structs refuse it.
    serde_json::from_slice(line).map_err(|e| ProtoError::BadRequest(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd_agent::runner::{CallSource, Outcome, RequestResult, Submission};
    use loopd_client::llama::{AssistantMessage, ChatMessage, ToolCall};

    /// The code of a line refused by the parse or, for a submit, by its checks.
    fn code(line: &str) -> &'static str {
        match parse(line.as_bytes()) {
            Ok(Command::Submit(s)) => s.to_submission().unwrap_err().as_str(),
            other => other.unwrap_err().as_str(),
        }
    }

    fn submission(line: &[u8]) -> (Submission, bool) {
        match parse(line) {
            Ok(Command::Submit(s)) => (s.to_submission().unwrap(), s.follow),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_command_parses() {
        let (request, follow) = submission(
            br#"{"cmd":"submit","messages":[{"role":"user","content":"hi"}],"budget":2,"thinking":true,"tools":["arithmetic"],"follow":true}"#,
        );
        assert_eq!(request.budget, Some(2));
        assert!(request.options.thinking && follow);
        assert_eq!(request.tools, Some(vec!["arithmetic".to_string()]));
        assert_eq!(
            parse(br#"{"cmd":"result","id":3}"#),
            Ok(Command::Result(ResultCmd { id: 3 }))
        );
        let wait = parse(br#"{"cmd":"wait","id":3,"timeout_ms":99999999}"#);
        let Ok(Command::Wait(w)) = wait else {
            panic!("{wait:?}")
        };
        assert_eq!((w.id, w.timeout_ms()), (3, MAX_WAIT_MS));
        assert_eq!(
            WaitCmd {
                id: 3,
                timeout_ms: None
            }
            .timeout_ms(),
            MAX_WAIT_MS
        );
        assert_eq!(
            WaitCmd {
                id: 3,
                timeout_ms: Some(MAX_WAIT_MS)
            }
            .timeout_ms(),
            MAX_WAIT_MS
        );
        assert_eq!(
            parse(br#"{"cmd":"cancel","id":1}"#),
            Ok(Command::Cancel(CancelCmd { id: 1 }))
        );
        assert_eq!(
            parse(br#"{"cmd":"follow","id":1}"#),
            Ok(Command::Follow(FollowCmd { id: 1 }))
        );
        assert_eq!(
            parse(br#"{"cmd":"status"}"#),
            Ok(Command::Status(StatusCmd {}))
        );
        assert_eq!(
            parse(br#"{"cmd":"metrics"}"#),
            Ok(Command::Metrics(MetricsCmd {}))
        );
    }

    #[test]
    fn earlier_turns_carry_their_tool_calls_and_results() {
        let (request, _) = submission(
            br#"{"cmd":"submit","messages":[{"role":"user","content":"2+3?"},
                {"role":"assistant","content":"","tool_calls":[{"id":"c1","name":"arithmetic","arguments":"{}"}]},
                {"role":"tool","tool_call_id":"c1","content":"5"},{"role":"user","content":"and 4+4?"}]}"#,
        );
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
            let Ok(Command::Submit(s)) = parse(cmd.as_bytes()) else {
                panic!("{cmd}")
            };
            assert_eq!(
                s.to_submission(),
                Err(ProtoError::BadRequest(detail.into())),
                "{line}"
            );
        }
    }

    /// The clients write their submit with the type the daemon reads it with.
    #[test]
    fn a_clients_submit_is_the_line_the_daemon_reads() {
        let s = SubmitCmd {
            budget: Some(2),
            max_tokens: Some(64),
            follow: true,
            ..SubmitCmd::new(vec![WireMessage::user("hi")])
        };
        let line = Command::from(s).to_line();
        assert_eq!(
            line,
            r#"{"cmd":"submit","messages":[{"role":"user","content":"hi"}],"budget":2,"thinking":false,"max_tokens":64,"follow":true}"#
        );
        let (request, follow) = submission(line.as_bytes());
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
        assert_eq!(code(r#"{"cmd":"metrics","id":1}"#), "BAD_REQUEST");
        assert_eq!(code(r#"{"cmd":"submit","messages":[]}"#), "BAD_REQUEST");
        assert_eq!(
            code(r#"{"cmd":"submit","messages":[{"role":"tool","content":"x"}]}"#),
            "BAD_REQUEST"
        );
        assert_eq!(
            parse(br#"{"cmd":"result","id":1,"timeout_ms":5}"#),
            Err(ProtoError::BadRequest(
                "unknown field `timeout_ms`, expected `id`".into()
            ))
        );
    }

    /// The cap counts the newline (docs/loopd.md): a line of `MAX_LINE_BYTES - 1` bytes is
    /// the longest read; one of `MAX_LINE_BYTES` is refused, as the socket reader refuses it.
    #[test]
    fn the_line_cap_counts_the_newline() {
        let mut at_cap = br#"{"cmd":"status"}"#.to_vec();
        at_cap.resize(MAX_LINE_BYTES - 1, b' ');
        assert_eq!(parse(&at_cap), Ok(Command::Status(StatusCmd {})));
        at_cap.push(b' ');
        assert_eq!(parse(&at_cap), Err(ProtoError::LineTooLong));
    }

    /// A key given twice has no one reading (a `serde_json::Value` kept the last): refused,
    /// at the top level, in a message and for `cmd` itself.
    #[test]
    fn a_key_given_twice_is_refused() {
        for (line, detail) in [
            (r#"{"cmd":"result","id":1,"id":2}"#, "duplicate field `id`"),
            (
                r#"{"cmd":"submit","messages":[{"role":"user","role":"system","content":"x"}]}"#,
                "duplicate field `role`",
            ),
            (
                r#"{"cmd":"explode","cmd":"status"}"#,
                "unknown variant `explode`",
            ),
        ] {
            let e = parse(line.as_bytes()).unwrap_err();
            assert_eq!(e.code(), ErrorCode::BadRequest, "{line}");
            assert!(e.to_string().contains(detail), "{line}: {e}");
        }
    }

    #[test]
    fn an_error_line_names_its_code_and_detail() {
        assert_eq!(
            ProtoError::from(ResultError::NotFound).to_line(),
            r#"{"ok":false,"error":"NOT_FOUND","detail":"no such request, or its result was already fetched or has expired"}"#
        );
        assert_eq!(
            ProtoError::Ended(RequestId(7)).to_line(),
            r#"{"ok":false,"error":"ENDED","detail":"req-7 has ended; fetch its result with result"}"#
        );
    }

    /// Every code reads back as itself, and an unknown one is not taken for another.
    #[test]
    fn every_error_code_round_trips_by_its_name() {
        for c in ErrorCode::ALL {
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), c);
        }
        assert!(serde_json::from_str::<ErrorCode>(r#""NOT_A_CODE""#).is_err());
        let names: std::collections::HashSet<_> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    /// `ok` is `true` in a reply and `false` in an error, and nothing else reads as either.
    #[test]
    fn ok_is_fixed_per_reply() {
        assert_eq!(
            serde_json::from_str::<SubmitReply>(r#"{"ok":true,"id":7}"#).unwrap(),
            SubmitReply::new(7)
        );
        assert!(serde_json::from_str::<SubmitReply>(r#"{"ok":false,"id":7}"#).is_err());
        assert!(
            serde_json::from_str::<ErrorReply>(r#"{"ok":true,"error":"PENDING","detail":""}"#)
                .is_err()
        );
    }

    /// A batch of three calls at budget 0: one exit signal, one run earlier, one refused. The
    /// result says which ran and which did not, so a client can show the refusal.
    #[test]
    fn a_result_names_the_calls_that_never_ran() {
        use loopd_agent::runner::{ExitSignal, FailReason, RequestId, ToolRecord};
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
            host: None,
        };
        let w = WireResult::from(&r);
        assert_eq!(
            w.not_run,
            [WireNotRun {
                id: "c".into(),
                name: "arithmetic".into(),
                arguments: "{}".into()
            }]
        );
        assert_eq!(
            w.tool_calls[0].id, "a",
            "the call that ran is not among them"
        );
    }
}
