//! The commands a client may send, one struct each, and [`Command`], the line that carries
//! one of them under its `cmd` name.

use serde::{Deserialize, Serialize};

use super::session::{DeleteCmd, HistoryCmd, ListCmd, OpenCmd, TurnCmd};
use super::ProtoError;
use loopd_agent::runner::Submission;
use loopd_client::llama::{AssistantMessage, ChatMessage, ChatOptions, ToolCall};

/// One command line: `{"cmd":NAME, ...the command's fields}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Start an agent request.
    Submit(SubmitCmd),
    /// Fetch a finished result (once).
    Result(ResultCmd),
    /// Wait for a result, then as `result`.
    Wait(WaitCmd),
    /// End a running request as `cancelled`.
    Cancel(CancelCmd),
    /// Stream a running request's events, then its result (not fetched).
    Follow(FollowCmd),
    /// Slots, running requests, kept results.
    Status(StatusCmd),
    /// The counters in the Prometheus text format.
    Metrics(MetricsCmd),
    /// Start a session (docs/sessions.md).
    Open(OpenCmd),
    /// One turn of a session: a request whose conversation is the session's log.
    Turn(TurnCmd),
    /// A session's settings and log.
    History(HistoryCmd),
    /// Every session.
    List(ListCmd),
    /// A session and its log, gone from the store.
    Delete(DeleteCmd),
}

impl Command {
    /// Every `cmd` name, as [`parse`](super::parse) accepts them.
    pub const NAMES: [&'static str; 12] = [
        "submit", "result", "wait", "cancel", "follow", "status", "metrics", "open", "turn",
        "history", "list", "delete",
    ];

    /// The command line, without its newline.
    pub fn to_line(&self) -> String {
        super::to_line(self)
    }
}

macro_rules! into_command {
    ($($t:ident => $v:ident),*) => {
        $(impl From<$t> for Command {
            fn from(c: $t) -> Command {
                Command::$v(c)
            }
        })*
    };
}

into_command!(SubmitCmd => Submit, ResultCmd => Result, WaitCmd => Wait, CancelCmd => Cancel,
    FollowCmd => Follow, StatusCmd => Status, MetricsCmd => Metrics, OpenCmd => Open,
    TurnCmd => Turn, HistoryCmd => History, ListCmd => List, DeleteCmd => Delete);

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

impl WireCall {
    /// The call as the client sends it.
    pub fn to_call(&self) -> ToolCall {
        ToolCall {
            id: self.id.clone(),
            name: self.name.clone(),
            arguments: self.arguments.clone(),
        }
    }
}

impl From<&ToolCall> for WireCall {
    fn from(c: &ToolCall) -> Self {
        WireCall {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        }
    }
}

/// `submit`: start an agent request; with `follow`, stream its events on this connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitCmd {
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
    /// The conversation this request continues: on several hosts, requests of one session
    /// go back to the host whose prompt cache holds it (1 to 256 bytes). Absent: the BIOS,
    /// the system message and the first user message are the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// The longest `session` a submit may name.
pub const MAX_SESSION_BYTES: usize = 256;

impl SubmitCmd {
    /// A submit of `messages`, everything else left to the daemon's defaults.
    pub fn new(messages: Vec<WireMessage>) -> SubmitCmd {
        SubmitCmd {
            messages,
            system: None,
            budget: None,
            thinking: false,
            max_tokens: None,
            tools: None,
            follow: false,
            session: None,
        }
    }

    /// The runner's submission, checked: roles known, calls only on an assistant turn, a
    /// `tool_call_id` only (and always) on a tool turn, at least one user message.
    pub fn to_submission(&self) -> Result<Submission, ProtoError> {
        let mut messages = Vec::with_capacity(self.messages.len());
        for m in &self.messages {
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
            let content = m.content.clone();
            messages.push(match role {
                "user" => ChatMessage::User { content },
                "system" => ChatMessage::System { content },
                "assistant" => ChatMessage::Assistant(AssistantMessage {
                    content: Some(content),
                    reasoning_content: None,
                    tool_calls: m.tool_calls.iter().map(WireCall::to_call).collect(),
                }),
                "tool" => ChatMessage::Tool {
                    tool_call_id: m.tool_call_id.clone().ok_or_else(|| {
                        ProtoError::BadRequest("role `tool`: tool_call_id is required".into())
                    })?,
                    content,
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
        if let Some(session) = &self.session {
            super::session::check_name_length(session)?;
        }
        Ok(Submission {
            session: self.session.clone(),
            summarize: None,
            system: self.system.clone(),
            messages,
            budget: self.budget,
            tools: self.tools.clone(),
            options: ChatOptions {
                thinking: self.thinking,
                max_tokens: self.max_tokens,
                ..ChatOptions::default()
            },
        })
    }
}

/// `result`: fetch a finished result, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultCmd {
    /// The request.
    pub id: u64,
}

/// `wait`: wait up to `timeout_ms` for a result, then as `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitCmd {
    /// The request.
    pub id: u64,
    /// How long to wait ([`MAX_WAIT_MS`](super::MAX_WAIT_MS) when absent, and at most that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl WaitCmd {
    /// The wait asked for, cut to [`MAX_WAIT_MS`](super::MAX_WAIT_MS).
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
            .unwrap_or(super::MAX_WAIT_MS)
            .min(super::MAX_WAIT_MS)
    }
}

/// `cancel`: end a running request as `cancelled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelCmd {
    /// The request.
    pub id: u64,
}

/// `follow`: stream a running request's events from now on, then its result (not fetched).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowCmd {
    /// The request.
    pub id: u64,
}

/// `status`: slots, running requests, kept results, connections, tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusCmd {}

/// `metrics`: the counters in the Prometheus text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsCmd {}
