//! Owned chat types (the `alloc` feature): what `loopd` sends and gets back.

use alloc::string::String;
use alloc::vec::Vec;

use crate::{FinishReason, Timings};

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
    /// `role: "assistant"`: the same three fields a `Completion` carries, so a log replays as is.
    Assistant {
        /// The answer text, if any.
        content: Option<String>,
        /// The thinking text, if any.
        reasoning_content: Option<String>,
        /// Tool calls the assistant made, in index order.
        tool_calls: Vec<ToolCall>,
    },
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

/// A finished assistant message. Nothing is final before this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The completion id (`chatcmpl-...`).
    pub id: String,
    /// The answer text, if any was streamed.
    pub content: Option<String>,
    /// The thinking text, if any was streamed.
    pub reasoning_content: Option<String>,
    /// Tool calls, in index order.
    pub tool_calls: Vec<ToolCall>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The last timings the stream carried; `None` if it carried none.
    pub timings: Option<Timings>,
    /// Tokens generated while reasoning streamed (from the per-chunk `predicted_n`).
    pub reasoning_tokens: u64,
    /// Whether the client ended reasoning early (set by `loopd`, never by the assembler).
    pub thinking_capped: bool,
}

impl From<&crate::Message<'_>> for Completion {
    /// Copies a finished message; `thinking_capped` is `false` (the caller sets it).
    fn from(m: &crate::Message<'_>) -> Self {
        Completion {
            id: m.id.into(),
            content: m.content.map(Into::into),
            reasoning_content: m.reasoning_content.map(Into::into),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|t| ToolCall {
                    id: t.id.into(),
                    name: t.name.into(),
                    arguments: t.arguments.into(),
                })
                .collect(),
            finish_reason: m.finish_reason,
            timings: m.timings,
            reasoning_tokens: m.reasoning_tokens,
            thinking_capped: false,
        }
    }
}
