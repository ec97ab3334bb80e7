//! Sessions on the wire (docs/sessions.md): the five commands (`open`, `turn`, `history`,
//! `list`, `delete`), their replies, and a session's log as its records.
//!
//! A session's log is what its turns added to the conversation, in order: per turn, any
//! compaction, the user message, what the runner added (assistant messages with their calls,
//! tool results, the last answer), then a [`TurnRecord`]. Records are written only when a
//! turn completes; a turn that failed or was cancelled leaves the log as it was.

use serde::{Deserialize, Serialize};

use super::reply::OkTrue;
use super::ProtoError;
use super::WireCall;

/// The longest session name: 256 bytes (as a submit's `session`).
pub const MAX_SESSION_NAME_BYTES: usize = super::MAX_SESSION_BYTES;

/// `open`: start a session with its settings; every turn of it uses them.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenCmd {
    /// Its name (1 to 256 bytes, no control characters); absent: the daemon names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// A system message, sent after the BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Tool iterations of each turn (`runner.budget` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u32>,
    /// Let the model think.
    #[serde(default)]
    pub thinking: bool,
    /// Each generation's `max_tokens` (`limits.max_tokens` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The tools offered, by name (all of the daemon's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl OpenCmd {
    /// The settings it opens the session with.
    pub fn settings(&self) -> SessionSettings {
        SessionSettings {
            system: self.system.clone(),
            budget: self.budget,
            thinking: self.thinking,
            max_tokens: self.max_tokens,
            tools: self.tools.clone(),
        }
    }
}

/// What every turn of a session is sent with; fixed at `open`, except `budget` (a turn may
/// change it from then on).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSettings {
    /// A system message, sent after the BIOS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Tool iterations of each turn (`runner.budget` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u32>,
    /// Let the model think.
    #[serde(default)]
    pub thinking: bool,
    /// Each generation's `max_tokens` (`limits.max_tokens` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The tools offered, by name (all of the daemon's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

/// `turn`: one new user message in a session; the reply is a submit's (`{"ok":true,"id":N}`,
/// then with `follow` its events and its result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnCmd {
    /// The session.
    pub session: String,
    /// The user's message.
    pub content: String,
    /// Stream the events, then the result, on this connection.
    #[serde(default)]
    pub follow: bool,
    /// The session's tool iterations from this turn on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u32>,
}

/// `history`: a session's settings and its whole log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryCmd {
    /// The session.
    pub session: String,
}

/// `list`: every session, most recently used first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListCmd {}

/// `delete`: a session and every record of it, from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteCmd {
    /// The session.
    pub session: String,
}

/// The reply to `open`: `{"ok":true,"session":NAME}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenReply {
    /// `true`.
    pub ok: OkTrue,
    /// The session's name.
    pub session: String,
}

/// The reply to `delete`: `{"ok":true,"deleted":NAME}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteReply {
    /// `true`.
    pub ok: OkTrue,
    /// The session deleted.
    pub deleted: String,
}

/// One session, as `list` and `history` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLine {
    /// Its name.
    pub name: String,
    /// Turns completed (those in the log).
    pub turns: u32,
    /// The log's size: the bytes of its records' JSON.
    pub bytes: u64,
    /// When it was opened, Unix milliseconds.
    pub created_ms: u64,
    /// When its last turn completed (or it was opened), Unix milliseconds.
    pub updated_ms: u64,
    /// The request of the turn running now, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<u64>,
}

/// The reply to `list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListReply {
    /// `true`.
    pub ok: OkTrue,
    /// Most recently used first.
    pub sessions: Vec<SessionLine>,
}

/// The reply to `history`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryReply {
    /// `true`.
    pub ok: OkTrue,
    /// The session.
    pub session: SessionLine,
    /// Its settings.
    pub settings: SessionSettings,
    /// Its log, oldest first.
    pub records: Vec<Record>,
}

/// One record of a session's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// The user's message that opened a turn.
    User {
        /// Its text.
        content: String,
    },
    /// An answer of the model's, as the next generation is sent it (the seed's
    /// `LogRecord::Assistant`).
    Assistant {
        /// Its text (`null` for an answer of calls only).
        content: Option<String>,
        /// Its reasoning, if the model thought.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<String>,
        /// The calls it asked for.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall>,
    },
    /// A tool's result.
    Tool {
        /// The call it answers.
        tool_call_id: String,
        /// The result text.
        content: String,
    },
    /// A compaction, before the turn it made room for.
    Compaction(Compaction),
    /// The end of a completed turn: how it ran.
    Turn(TurnRecord),
}

/// A compaction of the log, by its rule (docs/sessions.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compaction {
    /// `tool_results` (older tool results replaced by a note of their size) or `summary`
    /// (turns replaced by a summary the model wrote).
    pub rule: CompactionRule,
    /// The first turn it covers (a summary never covers turn 1).
    pub from_turn: u32,
    /// The last turn it covers.
    pub through_turn: u32,
    /// The summary, for `summary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The daemon's estimate of the prompt, in tokens, before and after.
    pub tokens_before: u64,
    /// After.
    pub tokens_after: u64,
}

/// How a compaction made room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionRule {
    /// Tool results of the turns covered are replaced by a note of their size.
    ToolResults,
    /// The turns covered are replaced by the model's summary of them.
    Summary,
}

impl CompactionRule {
    /// `tool_results` or `summary`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionRule::ToolResults => "tool_results",
            CompactionRule::Summary => "summary",
        }
    }
}

/// How a completed turn ran: in its result (`session`) and at the end of its records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnRecord {
    /// The session.
    pub session: String,
    /// 1 for the first.
    pub turn: u32,
    /// Its request.
    pub request: u64,
    /// Whether its request extended the last turn's (its messages are the last turn's, its
    /// answer and the new user message); `false` on the first turn.
    pub extends: bool,
    /// Why not, when it does not: `first_turn`, `compacted`, `settings_changed` (the budget,
    /// hence the BIOS) or `template_changed` (the server's chat template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// `hit`, `loss` or `none` (the first turn, or no timings): whether its first
    /// generation found the last turn's whole conversation in the server's prompt cache
    /// (`llama_proto::cache_outcome`).
    pub cache_outcome: String,
    /// Its first generation's tokens taken from the prompt cache.
    pub cache_n: u64,
    /// Its first generation's prompt tokens evaluated.
    pub prompt_n: u64,
    /// Its last generation's conversation in tokens (`cache_n + prompt_n + predicted_n`),
    /// what the next turn's cache is judged against.
    pub total_n: u64,
    /// The compactions made for it, by rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compacted: Vec<CompactionRule>,
}

/// Checks a session name's length: 1 to [`MAX_SESSION_NAME_BYTES`] bytes (a submit's
/// `session` is held to this alone).
pub(super) fn check_name_length(name: &str) -> Result<(), ProtoError> {
    if name.is_empty() || name.len() > MAX_SESSION_NAME_BYTES {
        return Err(ProtoError::BadRequest(format!(
            "session: {} bytes; it must be 1 to {MAX_SESSION_NAME_BYTES}",
            name.len()
        )));
    }
    Ok(())
}

/// Checks a session name: 1 to [`MAX_SESSION_NAME_BYTES`] bytes, no control characters.
pub fn check_name(name: &str) -> Result<(), ProtoError> {
    check_name_length(name)?;
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(ProtoError::BadRequest(format!(
            "session: the control character {c:?} is not allowed in a name"
        )));
    }
    Ok(())
}
