//! The public shapes of one decoded `data:` payload, and why one could not be decoded.
//!
//! They live apart from the decoder so that the scanner and the wire visitors that fill them
//! depend on the types, not on the decoder that calls them.

use core::fmt;

use crate::{FinishReason, Timings};

/// Most tool-call deltas one chunk may carry (llama-server sends one per chunk).
pub const MAX_TOOL_CALL_DELTAS: usize = 4;

/// What one `data:` payload said.
// No allocator to box the chunk, and nearly every payload is a chunk anyway.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// A `chat.completion.chunk`.
    Chunk(Chunk<'a>),
    /// `{"error":{...}}`: the server gave up on the request.
    Error(ServerError<'a>),
}

/// The fields of one `chat.completion.chunk` the assembler uses. Absent fields are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Chunk<'a> {
    /// The completion id (`chatcmpl-...`).
    pub id: Option<&'a str>,
    /// `choices[0].delta.content`.
    pub content: Option<&'a str>,
    /// `choices[0].delta.reasoning_content`.
    pub reasoning_content: Option<&'a str>,
    // Slots and a length rather than a `heapless::Vec`: that has drop glue, and a value with
    // drop glue returned from `ChatStream::feed` keeps the stream borrowed to the end of the
    // `match` on it (no call on the stream in an arm). `Chunk` stays `Copy`.
    pub(crate) tool_calls: [ToolCallDelta<'a>; MAX_TOOL_CALL_DELTAS],
    pub(crate) tool_calls_len: usize,
    /// `choices[0].finish_reason`.
    pub finish_reason: Option<FinishReason>,
    /// `timings` (only `cache_n`, `prompt_n`, `predicted_n`).
    pub timings: Option<Timings>,
    /// `prompt_progress`, sent while the prompt is processed when `return_progress` is set.
    pub prompt_progress: Option<PromptProgress>,
}

impl<'a> Chunk<'a> {
    /// `choices[0].delta.tool_calls`, in the order they were sent.
    pub fn tool_calls(&self) -> &[ToolCallDelta<'a>] {
        &self.tool_calls[..self.tool_calls_len]
    }

    /// True when the chunk carries content, reasoning or a tool-call delta.
    pub fn has_delta(&self) -> bool {
        self.content.is_some() || self.reasoning_content.is_some() || self.tool_calls_len > 0
    }
}

/// One element of `delta.tool_calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ToolCallDelta<'a> {
    /// Which tool call this continues.
    pub index: u32,
    /// The call id; sent once, with the first delta of the call.
    pub id: Option<&'a str>,
    /// `function.name`; sent once.
    pub name: Option<&'a str>,
    /// `function.arguments`: the next piece of the raw JSON arguments text.
    pub arguments: Option<&'a str>,
}

/// `prompt_progress`: how far prompt processing has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PromptProgress {
    /// Prompt tokens in all.
    pub total: u64,
    /// Prompt tokens reused from the cache.
    pub cache: u64,
    /// Prompt tokens processed so far (the cached ones included).
    pub processed: u64,
    /// Milliseconds spent so far.
    pub time_ms: u64,
}

/// An error the server sent inside the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerError<'a> {
    /// `code`, an HTTP-like status (500, 400, ...), if sent.
    pub code: Option<u32>,
    /// `type`, e.g. `"server_error"`, if sent.
    pub kind: Option<&'a str>,
    /// `message`, unescaped.
    pub message: &'a str,
}

/// How deeply arrays and objects may nest anywhere in a payload, the top-level object
/// included (`{"choices":[{"delta":{}}]}` is 4 deep).
///
/// llama-server never sends more than 6. The decoder does not recurse (it counts the depth of
/// what it skips), so its stack does not grow with nesting; the limit keeps the answer the
/// same as when a recursive parser read these payloads, and bounds what any consumer of the
/// same bytes might meet (`docs/benchmarks/chat-stream.md` has the measured peak).
pub const MAX_NESTING: usize = 32;

/// Why a payload could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, or a field the decoder reads has the wrong type: the variant
    /// `serde-json-core` names for the same fault (its parser is no longer used).
    Json(serde_json_core::de::Error),
    /// A string has a bad escape, a lone surrogate or a raw control character.
    InvalidString,
    /// The caller's `text` buffer is too small for the unescaped strings.
    TextBufferFull,
    /// More than one element in `choices` (the client never asks for `n > 1`).
    TooManyChoices,
    /// More than [`MAX_TOOL_CALL_DELTAS`] elements in `delta.tool_calls`.
    TooManyToolCallDeltas,
    /// `finish_reason` is none of `stop`, `tool_calls`, `length`.
    UnknownFinishReason,
    /// Arrays and objects nest deeper than [`MAX_NESTING`] somewhere in the payload.
    TooDeep,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Json(e) => write!(f, "chunk is not the expected JSON: {e}"),
            DecodeError::InvalidString => f.write_str(
                "chunk string has a bad escape, a lone surrogate or a raw control character",
            ),
            DecodeError::TextBufferFull => f.write_str("chunk strings do not fit the text buffer"),
            DecodeError::TooManyChoices => f.write_str("chunk has more than one choice"),
            DecodeError::TooManyToolCallDeltas => write!(
                f,
                "chunk has more than {MAX_TOOL_CALL_DELTAS} tool-call deltas"
            ),
            DecodeError::UnknownFinishReason => f.write_str("chunk has an unknown finish_reason"),
            DecodeError::TooDeep => write!(
                f,
                "chunk nests arrays and objects deeper than {MAX_NESTING} levels"
            ),
        }
    }
}

impl core::error::Error for DecodeError {}
