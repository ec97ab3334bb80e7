//! Owned chat types (the `alloc` feature): what `loopd` sends and gets back.

use alloc::string::String;
use alloc::vec::Vec;

use crate::{Assembler, FinishReason, Message, Timings, ToolCalls};

/// One message of a chat request: the four kinds the chat template knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatMessage {
    /// `role: "system"`.
    System {
        /// The system prompt.
        content: String,
    },
    /// `role: "user"`.
    User {
        /// What the user said.
        content: String,
    },
    /// `role: "assistant"`: an answer as the stream assembled it, so a log replays as is.
    Assistant(AssistantMessage),
    /// `role: "tool"`: a tool's result.
    Tool {
        /// The `id` of the [`ToolCall`] this answers.
        tool_call_id: String,
        /// The tool's output.
        content: String,
    },
}

/// One tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ToolCall {
    /// The server-assigned call id.
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments: the raw JSON text exactly as streamed (not re-serialised).
    pub arguments: String,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSchema {
    /// The function name.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// The JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

/// One assistant answer: what the stream assembled, what a failed generation kept, and what
/// the transcript holds, the same value all the way (no copy field by field).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AssistantMessage {
    /// The answer text, if any was streamed.
    pub content: Option<String>,
    /// The thinking text, if any was streamed.
    pub reasoning_content: Option<String>,
    /// Tool calls, in index order. In a partial answer the last one's arguments may be
    /// incomplete, and a call whose id or name had not arrived has it empty.
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// Owns the borrowed parts of a message: a finished one, or an assembler's so far.
    fn owned(content: Option<&str>, reasoning_content: Option<&str>, calls: ToolCalls<'_>) -> Self {
        AssistantMessage {
            content: content.map(Into::into),
            reasoning_content: reasoning_content.map(Into::into),
            tool_calls: calls
                .iter()
                .map(|t| ToolCall {
                    id: t.id.into(),
                    name: t.name.into(),
                    arguments: t.arguments.into(),
                })
                .collect(),
        }
    }
}

impl From<&Message<'_>> for AssistantMessage {
    /// The answer of a finished message.
    fn from(m: &Message<'_>) -> Self {
        Self::owned(m.content, m.reasoning_content, m.tool_calls)
    }
}

impl<const C: usize, const R: usize, const T: usize, const A: usize>
    From<&Assembler<'_, C, R, T, A>> for AssistantMessage
{
    /// The answer assembled so far (of a generation that may yet fail).
    fn from(a: &Assembler<'_, C, R, T, A>) -> Self {
        Self::owned(a.content(), a.reasoning_content(), a.tool_calls())
    }
}

/// A finished generation: its answer and how the stream ended. Nothing is final before this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The completion id (`chatcmpl-...`).
    pub id: String,
    /// The answer.
    pub message: AssistantMessage,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The last timings the stream carried; `None` if it carried none.
    pub timings: Option<Timings>,
    /// Tokens generated while reasoning streamed (from the per-chunk `predicted_n`).
    pub reasoning_tokens: u64,
    /// Whether the client ended reasoning early (set by `loopd`, never by the assembler).
    pub thinking_capped: bool,
}

impl From<&Message<'_>> for Completion {
    /// Copies a finished message; `thinking_capped` is `false` (the caller sets it).
    fn from(m: &Message<'_>) -> Self {
        Completion {
            id: m.id.into(),
            message: m.into(),
            finish_reason: m.finish_reason,
            timings: m.timings,
            reasoning_tokens: m.reasoning_tokens,
            thinking_capped: false,
        }
    }
}
