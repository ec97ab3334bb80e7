//! One `data:` payload of a llama-server chat stream into typed, borrowed fields.
//!
//! [`decode_chunk`] parses a `chat.completion.chunk` (or an in-stream error): the top level,
//! `timings` and `prompt_progress` by hand (`scan`), `choices` and `error` with
//! `serde-json-core`; then it unescapes the strings the assembler needs into a buffer the caller
//! owns. Unknown fields are skipped. Strings without escapes are borrowed from the payload;
//! the others are written to `text`, which never needs more than `payload.len()` bytes.
//! Nothing here allocates or panics.
//!
//! Not decoded: object keys are matched as written (an escaped key such as `"con\u0074ent"`
//! is an unknown field; llama-server never escapes keys).

use core::fmt;

use crate::raw::{RawChunk, RawError};
use crate::scan::parse_chunk;
use crate::unescape::{is_plain, unescape, UnescapeError};
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

/// Why a payload could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Not JSON, or a field the decoder reads has the wrong type.
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
        }
    }
}

impl core::error::Error for DecodeError {}

impl From<UnescapeError> for DecodeError {
    fn from(e: UnescapeError) -> Self {
        match e {
            UnescapeError::Invalid => DecodeError::InvalidString,
            UnescapeError::Full => DecodeError::TextBufferFull,
        }
    }
}

/// Decodes one `data:` payload of a chat stream.
///
/// `text` receives the strings that need unescaping; `text.len() >= payload.len()` is always
/// enough. The returned strings borrow from `payload` and `text`.
///
/// ```
/// use llama_proto::{decode_chunk, Payload};
/// let p = br#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"caf\u00e9\n"}}]}"#;
/// let mut text = [0u8; 64];
/// let Payload::Chunk(c) = decode_chunk(p, &mut text).unwrap() else { panic!() };
/// assert_eq!(c.content, Some("café\n"));
/// ```
pub fn decode_chunk<'a>(payload: &'a [u8], text: &'a mut [u8]) -> Result<Payload<'a>, DecodeError> {
    let mut raw = RawChunk::default();
    parse_chunk(payload, &mut raw).map_err(DecodeError::Json)?;
    let mut out = Text(text);
    if let Some(e) = raw.error {
        return Ok(Payload::Error(server_error(e, &mut out)?));
    }
    // The same checks in the same order as when the chunk was first parsed whole: the id,
    // `choices`, `finish_reason`, the delta's strings, then `tool_calls`.
    let mut chunk = raw.chunk;
    chunk.id = out.opt(chunk.id)?;
    if raw.too_many_choices {
        return Err(DecodeError::TooManyChoices);
    }
    if let Some(reason) = raw.finish_reason {
        chunk.finish_reason =
            Some(FinishReason::from_wire(reason).ok_or(DecodeError::UnknownFinishReason)?);
    }
    chunk.content = out.opt(chunk.content)?;
    chunk.reasoning_content = out.opt(chunk.reasoning_content)?;
    if raw.too_many_tool_calls {
        return Err(DecodeError::TooManyToolCallDeltas);
    }
    for call in &mut chunk.tool_calls[..chunk.tool_calls_len] {
        call.id = out.opt(call.id)?;
        call.name = out.opt(call.name)?;
        call.arguments = out.opt(call.arguments)?;
    }
    Ok(Payload::Chunk(chunk))
}

/// Decodes the data of an `event: error` SSE event (the older form): either the bare
/// `{"code":..,"message":..,"type":..}` object or the `{"error":{...}}` wrapper.
///
/// `text` works as in [`decode_chunk`].
pub fn decode_error_event<'a>(
    payload: &'a [u8],
    text: &'a mut [u8],
) -> Result<ServerError<'a>, DecodeError> {
    #[derive(serde::Deserialize)]
    struct Wrapped<'a> {
        #[serde(borrow)]
        error: RawError<'a>,
    }
    let raw = match serde_json_core::from_slice::<Wrapped<'a>>(payload) {
        Ok((w, _)) => w.error,
        Err(_) => {
            serde_json_core::from_slice::<RawError<'a>>(payload)
                .map_err(DecodeError::Json)?
                .0
        }
    };
    server_error(raw, &mut Text(text))
}

fn server_error<'a>(e: RawError<'a>, out: &mut Text<'a>) -> Result<ServerError<'a>, DecodeError> {
    Ok(ServerError {
        code: e.code,
        kind: out.opt(e.kind)?,
        message: out.string(e.message)?,
    })
}

/// The unused tail of the caller's text buffer.
struct Text<'a>(&'a mut [u8]);

impl<'a> Text<'a> {
    fn opt(&mut self, raw: Option<&'a str>) -> Result<Option<&'a str>, DecodeError> {
        raw.map(|r| self.string(r)).transpose()
    }

    fn string(&mut self, raw: &'a str) -> Result<&'a str, DecodeError> {
        if is_plain(raw) {
            return Ok(raw);
        }
        let n = unescape(raw, self.0)?;
        let (done, rest) = core::mem::take(&mut self.0).split_at_mut(n);
        self.0 = rest;
        let done: &'a [u8] = done;
        // Cannot fail: unescape writes whole UTF-8 characters only.
        core::str::from_utf8(done).map_err(|_| DecodeError::InvalidString)
    }
}
