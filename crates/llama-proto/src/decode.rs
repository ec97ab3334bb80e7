//! One `data:` payload of a llama-server chat stream into typed, borrowed fields.
//!
//! [`decode_chunk`] parses a `chat.completion.chunk` (or an in-stream error) by hand (`scan`): keys
//! are matched as bytes, values the assembler does not need are skipped to their end. On 64-bit
//! hosts it first matches the payload against the layout llama-server writes (`layout`), and walks
//! it only when that does not match; the two give the same result for every payload (a proptest and
//! the `proto_assemble` fuzz target compare them). Then it unescapes the strings the assembler
//! needs into a buffer the caller owns. Unknown fields are skipped. Strings without escapes are
//! borrowed from the payload; the others are written to `text`, which never needs more than
//! `payload.len()` bytes. Nothing here allocates or panics.
//!
//! Not decoded: object keys are matched as written (an escaped key such as `"con\u0074ent"`
//! is an unknown field; llama-server never escapes keys).

use crate::chunk::{DecodeError, Payload, ServerError};
use crate::raw::{RawChunk, RawError};
use crate::scan::{parse_chunk, parse_error_event};
use crate::unescape::{is_plain, unescape, UnescapeError};
use crate::FinishReason;

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
    #[cfg(target_pointer_width = "64")]
    if crate::layout::parse_laid_out(payload, &mut raw).is_none() {
        // Not llama-server's own layout: the walk decides, from the start.
        raw = RawChunk::default();
        parse_chunk(payload, &mut raw)?;
    }
    #[cfg(not(target_pointer_width = "64"))]
    parse_chunk(payload, &mut raw)?;
    finish(&mut raw, text)
}

/// [`decode_chunk`] by the walk alone, without the 64-bit layout template: the path a 32-bit
/// device takes. For the differential checks (the crate's tests, `fuzz-entries`); not API.
#[cfg(any(test, feature = "differential"))]
#[doc(hidden)]
pub fn decode_chunk_walked<'a>(
    payload: &'a [u8],
    text: &'a mut [u8],
) -> Result<Payload<'a>, DecodeError> {
    let mut raw = RawChunk::default();
    parse_chunk(payload, &mut raw)?;
    finish(&mut raw, text)
}

/// The strings of a parsed payload unescaped into `text`, its wire values checked.
#[inline(always)]
fn finish<'a>(raw: &mut RawChunk<'a>, text: &'a mut [u8]) -> Result<Payload<'a>, DecodeError> {
    let mut out = Text(text);
    if let Some(e) = raw.error {
        return Ok(Payload::Error(server_error(e, &mut out)?));
    }
    // The same checks in the same order as when the chunk was first parsed whole: the id,
    // `choices`, `finish_reason`, the delta's strings, then `tool_calls`.
    // In place: the chunk is moved once, into the result.
    let chunk = &mut raw.chunk;
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
    Ok(Payload::Chunk(raw.chunk))
}

/// Decodes the data of an `event: error` SSE event (the older form): either the bare
/// `{"code":..,"message":..,"type":..}` object or the `{"error":{...}}` wrapper.
///
/// `text` works as in [`decode_chunk`].
pub fn decode_error_event<'a>(
    payload: &'a [u8],
    text: &'a mut [u8],
) -> Result<ServerError<'a>, DecodeError> {
    let raw = parse_error_event(payload)?;
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
