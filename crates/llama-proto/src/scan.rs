//! One chunk payload walked by hand, all of it: the top level, `choices[0]` and its `delta`,
//! the tool calls, `error`, `timings` and `prompt_progress`.
//!
//! Most of a llama-server chunk is data the client never reads: `created`, `model`,
//! `system_fingerprint`, `object` and nine `timings` fields, six of them floats. Here a
//! skipped value costs one scan for its end (eight bytes at a time), a key is compared as the
//! bytes between its quotes, and the counts the assembler needs are read directly; nothing is
//! tokenised into a value that is then thrown away, and nothing of the chunk is copied on
//! the way out (the fields are written in place into one [`RawChunk`]). What this walk
//! accepts is checked only as far as the fields the decoder returns: a skipped value is not
//! validated beyond finding its end, so a payload `serde_json` would reject may still decode.
//! Every error is a `serde_json_core::de::Error`, the variant `serde-json-core` gave for the
//! same fault when it parsed these values, except nesting past [`MAX_NESTING`], which is
//! [`DecodeError::TooDeep`].
//!
//! On 64-bit hosts a key where llama-server puts it (`"key":` among the next three keys of
//! that object's [`Order`], in the order its chunks write them) is matched as whole words,
//! with no scan for its closing quote; any other key, order or spelling takes the scan. Both
//! give the same key and position, so the result does not depend on the order (a proptest
//! holds the two to the same result).
//!
//! On 64-bit hosts `decode_chunk` tries the template in [`crate::layout`] first, which reads
//! its values with this walk's steps; the walk decides every payload that template does not
//! match exactly, and is the only path on a 32-bit device.
//!
//! The walk keeps a depth count, not a stack: the objects it descends into are at fixed
//! depths (at most 7), and a skipped value's depth is counted against the limit, so its stack
//! use is constant whatever the payload.

use serde_json_core::de::Error;

use crate::chunk::{DecodeError, PromptProgress, ToolCallDelta, MAX_NESTING};
use crate::raw::{RawChunk, RawError};
use crate::Timings;

type Result<T> = core::result::Result<T, DecodeError>;

impl From<Error> for DecodeError {
    fn from(e: Error) -> Self {
        DecodeError::Json(e)
    }
}

// How deep each walked object sits, the top level being 1: a value skipped inside one of them
// has that many enclosing arrays and objects.
pub(crate) const TOP: usize = 1;
pub(crate) const CHOICES: usize = 2;
pub(crate) const CHOICE: usize = 3;
pub(crate) const DELTA: usize = 4;
pub(crate) const CALLS: usize = 5;
pub(crate) const CALL: usize = 6;
pub(crate) const FUNCTION: usize = 7;

// The keys of each walked object in the order llama-server's chunks write them.
const TOP_KEYS: Order = keys![
    "choices",
    "created",
    "id",
    "model",
    "system_fingerprint",
    "object",
    "timings",
    "prompt_progress",
];
const CHOICE_KEYS: Order = keys!["finish_reason", "index", "delta"];
const DELTA_KEYS: Order = keys!["content", "reasoning_content", "tool_calls"];
const CALL_KEYS: Order = keys!["index", "id", "type", "function"];
const FUNCTION_KEYS: Order = keys!["name", "arguments"];
const TIMINGS_KEYS: Order = keys![
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "predicted_per_second",
];
const PROGRESS_KEYS: Order = keys!["total", "cache", "processed", "time_ms"];
const NO_KEYS: Order = keys![];

/// Parses `payload` into `out` (which must start as `RawChunk::default()`).
pub(crate) fn parse_chunk<'a>(payload: &'a [u8], out: &mut RawChunk<'a>) -> Result<()> {
    let mut s = Scan { b: payload, i: 0 };
    if s.ws().ok_or(Error::EofWhileParsingValue)? != b'{' {
        return Err(Error::InvalidType.into());
    }
    let mut seen = Seen(0);
    s.object(TOP_KEYS, |s, key| match key {
        b"choices" => {
            seen.first(1)?;
            s.choices(out)
        }
        b"id" => {
            seen.first(2)?;
            out.chunk.id = s.opt_str()?;
            Ok(())
        }
        b"timings" => {
            seen.first(4)?;
            out.chunk.timings = s
                .counts(
                    TIMINGS_KEYS,
                    #[cfg_attr(target_pointer_width = "64", inline(always))]
                    |k| match k {
                        b"cache_n" => Some(0),
                        b"prompt_n" => Some(1),
                        b"predicted_n" => Some(2),
                        _ => None,
                    },
                )?
                .map(|[cache_n, prompt_n, predicted_n]| Timings {
                    cache_n,
                    prompt_n,
                    predicted_n,
                });
            Ok(())
        }
        b"prompt_progress" => {
            seen.first(8)?;
            out.chunk.prompt_progress = s
                .counts(
                    PROGRESS_KEYS,
                    #[cfg_attr(target_pointer_width = "64", inline(always))]
                    |k| match k {
                        b"total" => Some(0),
                        b"cache" => Some(1),
                        b"processed" => Some(2),
                        b"time_ms" => Some(3),
                        _ => None,
                    },
                )?
                .map(|[total, cache, processed, time_ms]| PromptProgress {
                    total,
                    cache,
                    processed,
                    time_ms,
                });
            Ok(())
        }
        b"error" => {
            seen.first(16)?;
            out.error = s.opt_error(TOP)?;
            Ok(())
        }
        _ => s.skip(TOP),
    })?;
    s.end()
}

/// Parses the data of an `event: error` event: the `{"error":{...}}` wrapper, or else the bare
/// `{"code":..,"message":..,"type":..}` object.
pub(crate) fn parse_error_event(payload: &[u8]) -> Result<RawError<'_>> {
    let mut s = Scan { b: payload, i: 0 };
    if s.ws().ok_or(Error::EofWhileParsingValue)? != b'{' {
        return Err(Error::InvalidType.into());
    }
    let mut wrapped: Option<RawError<'_>> = None;
    let mut bare = ErrorFields::default();
    let mut seen = Seen(0);
    s.object(NO_KEYS, |s, key| match key {
        b"error" => {
            seen.first(8)?;
            // A wrapper that is not an error object leaves the bare form to decide.
            let at = s.i;
            match s.opt_error(TOP) {
                Ok(e) => wrapped = e,
                Err(DecodeError::Json(_)) => {
                    s.i = at;
                    s.skip(TOP)?;
                }
                Err(e) => return Err(e),
            }
            Ok(())
        }
        key => bare.field(s, key, &mut seen, TOP),
    })?;
    s.end()?;
    match wrapped {
        Some(e) => Ok(e),
        None => bare.finish(),
    }
}

/// Which known keys an object has had: a repeated one is an error, as a derived visitor's
/// `duplicate_field`.
struct Seen(u8);

impl Seen {
    fn first(&mut self, bit: u8) -> Result<()> {
        if self.0 & bit != 0 {
            return Err(Error::CustomError.into());
        }
        self.0 |= bit;
        Ok(())
    }
}

/// The fields of an error object as they are read.
#[derive(Default)]
struct ErrorFields<'a> {
    code: Option<u32>,
    message: Option<&'a str>,
    kind: Option<&'a str>,
}

impl<'a> ErrorFields<'a> {
    fn field(&mut self, s: &mut Scan<'a>, key: &[u8], seen: &mut Seen, depth: usize) -> Result<()> {
        match key {
            b"code" => {
                seen.first(1)?;
                self.code = match s.ws() {
                    Some(b'n') => s.null().map(|()| None)?,
                    _ => Some(s.u32()?),
                };
            }
            b"message" => {
                seen.first(2)?;
                self.message = Some(s.str()?);
            }
            b"type" => {
                seen.first(4)?;
                self.kind = s.opt_str()?;
            }
            _ => s.skip(depth)?,
        }
        Ok(())
    }

    fn finish(self) -> Result<RawError<'a>> {
        Ok(RawError {
            code: self.code,
            // A missing required field, as a derived visitor said.
            message: self.message.ok_or(Error::CustomError)?,
            kind: self.kind,
        })
    }
}

// The walk's small steps are forced inline on 64-bit hosts, where that made the decode
// fast; on a 32-bit device the optimizer decides, and one copy per call site would cost
// flash (docs/benchmarks/embedded.md).
pub(crate) struct Scan<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) i: usize,
}

impl<'a> Scan<'a> {
    /// Skips whitespace; returns the next byte.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn ws(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            // Every byte that is not whitespace and starts a token is above the space.
            if c > b' ' || !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(c);
            }
            self.i += 1;
        }
        None
    }

    fn colon(&mut self) -> Result<()> {
        if self.ws().ok_or(Error::EofWhileParsingObject)? != b':' {
            return Err(Error::ExpectedColon.into());
        }
        self.i += 1;
        Ok(())
    }

    /// A string at `self.i` (the opening quote); returns the raw bytes between the quotes.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn string(&mut self) -> Result<&'a [u8]> {
        let start = self.i + 1;
        let mut at = start;
        loop {
            let rest = self.b.get(at..).ok_or(Error::EofWhileParsingString)?;
            at += find(rest, in_string).ok_or(Error::EofWhileParsingString)?;
            if self.b.get(at) == Some(&b'"') {
                self.i = at + 1;
                return Ok(self.b.get(start..at).unwrap_or_default());
            }
            // A backslash: the next byte is escaped, whatever it is.
            at += 2;
        }
    }

    /// Skips one value inside `outer` enclosing arrays and objects; returns it. Strings are
    /// skipped as strings; arrays and objects up to their matching close (refused past
    /// [`MAX_NESTING`] in all); anything else up to the next `,`, `}` or `]`.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn value(&mut self, outer: usize) -> Result<&'a [u8]> {
        let start = self.i;
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => self.nested(outer)?,
            b',' | b'}' | b']' => return Err(Error::ExpectedSomeValue.into()),
            _ => self.scalar()?,
        }
        Ok(self.b.get(start..self.i).unwrap_or_default())
    }

    /// Passes a number, `true`, `false` or `null` at `self.i` to the next `,`, `}` or `]`,
    /// without looking at its bytes.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn scalar(&mut self) -> Result<()> {
        let rest = self.b.get(self.i..).unwrap_or_default();
        // A `match`, not `or_else`: that closure was left a call.
        self.i += match find_near(rest, delimiter) {
            Some(n) => n,
            None => find(rest, delimiter).ok_or(Error::EofWhileParsingValue)?,
        };
        Ok(())
    }

    #[cfg(target_pointer_width = "64")]
    /// Skips the array or object whose opening bracket is at `self.i`, to its matching close.
    /// One pass over eight bytes at a time: the quotes, backslashes and brackets of a word are
    /// handled from its masks without going back to memory, so a word with no bracket
    /// outside a string is passed in one step whatever its quotes. `outer` arrays and
    /// objects enclose this one. Out of line: llama-server's chunks skip no array or object,
    /// and the callers of [`value`](Self::value) stay small.
    #[inline(never)]
    fn nested(&mut self, outer: usize) -> Result<()> {
        let mut st = Nesting {
            room: MAX_NESTING.saturating_sub(outer),
            ..Nesting::default()
        };
        let mut at = self.i;
        while let Some(Ok(bytes)) = self.b.get(at..at + 8).map(<[u8; 8]>::try_from) {
            if let Some(end) = st.word(u64::from_le_bytes(bytes))? {
                self.i = at + end + 1;
                return Ok(());
            }
            at += 8;
        }
        let rest = self.b.get(at..).unwrap_or_default();
        let mut tail = [b' '; 8];
        tail.get_mut(..rest.len())
            .ok_or(Error::EofWhileParsingValue)?
            .copy_from_slice(rest);
        // Spaces pad the word and change no state.
        match st.word(u64::from_le_bytes(tail))? {
            Some(end) if end < rest.len() => {
                self.i = at + end + 1;
                Ok(())
            }
            _ => Err(Error::EofWhileParsingValue.into()),
        }
    }

    /// Skips the array or object whose opening bracket is at `self.i`, to its matching close,
    /// a byte at a time (smaller on a 32-bit device than the word walk above). `outer` arrays
    /// and objects enclose this one.
    #[cfg(not(target_pointer_width = "64"))]
    fn nested(&mut self, outer: usize) -> Result<()> {
        let room = MAX_NESTING.saturating_sub(outer);
        let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
        let mut at = self.i;
        while let Some(&b) = self.b.get(at) {
            at += 1;
            if in_str {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > room {
                        return Err(DecodeError::TooDeep);
                    }
                }
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        self.i = at;
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(Error::EofWhileParsingValue.into())
    }

    /// `null` or a string, as `Option<&str>` from `serde-json-core` (escapes kept).
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn opt_str(&mut self) -> Result<Option<&'a str>> {
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'"' => {
                let raw = self.string()?;
                core::str::from_utf8(raw)
                    .map(Some)
                    .map_err(|_| Error::InvalidUnicodeCodePoint.into())
            }
            b'n' => self.null().map(|()| None),
            _ => Err(Error::InvalidType.into()),
        }
    }

    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn null(&mut self) -> Result<()> {
        match self.b.get(self.i..self.i + 4) {
            Some(b"null") => {
                self.i += 4;
                Ok(())
            }
            _ => Err(Error::ExpectedSomeIdent.into()),
        }
    }

    /// The object whose `{` is at `self.i`, to its `}`: `field` is called with each key (the
    /// raw bytes between its quotes) and must consume the value after the colon.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn object(
        &mut self,
        order: Order,
        field: impl FnMut(&mut Self, &'a [u8]) -> Result<()>,
    ) -> Result<()> {
        // One copy of the loop on a 32-bit device (flash), one per call site on a 64-bit host.
        #[cfg(not(target_pointer_width = "64"))]
        let field: &mut dyn FnMut(&mut Self, &'a [u8]) -> Result<()> = &mut { field };
        self.object_with(order, field)
    }

    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn object_with<F>(&mut self, order: Order, mut field: F) -> Result<()>
    where
        F: FnMut(&mut Self, &'a [u8]) -> Result<()>,
    {
        self.i += 1;
        match self.ws().ok_or(Error::EofWhileParsingObject)? {
            b'}' => {
                self.i += 1;
                return Ok(());
            }
            b'"' => {}
            _ => return Err(Error::KeyMustBeAString.into()),
        }
        #[cfg(target_pointer_width = "64")]
        let mut next = 0;
        loop {
            #[cfg(target_pointer_width = "64")]
            let key = match self.known_key(order, &mut next) {
                Some(key) => key,
                None => {
                    let key = self.string()?;
                    self.colon()?;
                    key
                }
            };
            #[cfg(not(target_pointer_width = "64"))]
            let key = {
                let () = order;
                let key = self.string()?;
                self.colon()?;
                key
            };
            field(self, key)?;
            match self.ws().ok_or(Error::EofWhileParsingObject)? {
                b',' => {
                    self.i += 1;
                    match self.ws().ok_or(Error::EofWhileParsingValue)? {
                        b'"' => {}
                        b'}' => return Err(Error::TrailingComma.into()),
                        _ => return Err(Error::KeyMustBeAString.into()),
                    }
                }
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Error::ExpectedObjectCommaOrEnd.into()),
            }
        }
    }

    /// `null`, or the array whose `[` is next: `element` is called with each element's
    /// position and must consume it. False for `null`.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn opt_array(&mut self, element: impl FnMut(&mut Self, usize) -> Result<()>) -> Result<bool> {
        #[cfg(not(target_pointer_width = "64"))]
        let element: &mut dyn FnMut(&mut Self, usize) -> Result<()> = &mut { element };
        self.opt_array_with(element)
    }

    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn opt_array_with<F>(&mut self, mut element: F) -> Result<bool>
    where
        F: FnMut(&mut Self, usize) -> Result<()>,
    {
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'n' => return self.null().map(|()| false),
            b'[' => self.i += 1,
            _ => return Err(Error::InvalidType.into()),
        }
        if self.ws().ok_or(Error::EofWhileParsingList)? == b']' {
            self.i += 1;
            return Ok(true);
        }
        let mut n = 0;
        loop {
            element(self, n)?;
            n += 1;
            match self.ws().ok_or(Error::EofWhileParsingList)? {
                b',' => {
                    self.i += 1;
                    if self.ws().ok_or(Error::EofWhileParsingValue)? == b']' {
                        return Err(Error::TrailingComma.into());
                    }
                }
                b']' => {
                    self.i += 1;
                    return Ok(true);
                }
                _ => return Err(Error::ExpectedListCommaOrEnd.into()),
            }
        }
    }

    /// `null`, or the object whose `{` is next, walked by `field` as in [`object`](Self::object).
    /// False for `null`.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn opt_object(
        &mut self,
        order: Order,
        field: impl FnMut(&mut Self, &'a [u8]) -> Result<()>,
    ) -> Result<bool> {
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'n' => self.null().map(|()| false),
            b'{' => self.object(order, field).map(|()| true),
            _ => Err(Error::InvalidType.into()),
        }
    }

    /// Skips a value the decoder does not read, inside `depth` arrays and objects; a number,
    /// the usual case, is passed to the next delimiter without looking at its digits.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn skip(&mut self, depth: usize) -> Result<()> {
        self.value(depth).map(drop)
    }

    /// The key at `self.i` if it is written as one of the three keys of `order` from `next`
    /// on (`"key":`, compared as four words; a key within 32 bytes of the payload's end is
    /// left to the scan); `self.i` is then after the colon, as after [`string`](Self::string)
    /// and [`colon`](Self::colon), and `next` after that key. `None` changes neither.
    #[cfg(target_pointer_width = "64")]
    #[inline(always)]
    fn known_key(&mut self, order: Order, next: &mut usize) -> Option<&'a [u8]> {
        #[cfg(test)]
        if tests::GENERAL_ONLY.with(core::cell::Cell::get) {
            return None;
        }
        let at = self.i;
        let ahead = <&[u8; 32]>::try_from(self.b.get(at..at + 32)?).ok()?;
        let word = |j: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&ahead[j * 8..j * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let words = [word(0), word(1), word(2), word(3)];
        let mut n = *next;
        while let Some(k) = order.get(n).filter(|_| n < *next + 3) {
            if k.is(&words) {
                *next = n + 1;
                self.i = at + k.len;
                return ahead.get(1..k.len - 2);
            }
            n += 1;
        }
        None
    }

    /// Only whitespace may follow the top-level value.
    pub(crate) fn end(&mut self) -> Result<()> {
        match self.ws() {
            None => Ok(()),
            Some(_) => Err(Error::TrailingCharacters.into()),
        }
    }

    /// `choices`: `null` or an array; the first element is read, the others skipped and
    /// flagged.
    fn choices(&mut self, out: &mut RawChunk<'a>) -> Result<()> {
        self.opt_array(|s, n| {
            if n > 0 {
                out.too_many_choices = true;
                return s.skip(CHOICES);
            }
            if s.ws() != Some(b'{') {
                return Err(Error::InvalidType.into());
            }
            let mut seen = Seen(0);
            s.object(CHOICE_KEYS, |s, key| match key {
                b"finish_reason" => {
                    seen.first(1)?;
                    out.finish_reason = s.opt_str()?;
                    Ok(())
                }
                b"delta" => {
                    seen.first(2)?;
                    s.delta(out)
                }
                _ => s.skip(CHOICE),
            })
        })
        .map(drop)
    }

    /// `choices[0].delta`: `null` or an object.
    fn delta(&mut self, out: &mut RawChunk<'a>) -> Result<()> {
        let mut seen = Seen(0);
        self.opt_object(DELTA_KEYS, |s, key| match key {
            b"content" => {
                seen.first(1)?;
                out.chunk.content = s.opt_str()?;
                Ok(())
            }
            b"reasoning_content" => {
                seen.first(2)?;
                out.chunk.reasoning_content = s.opt_str()?;
                Ok(())
            }
            b"tool_calls" => {
                seen.first(4)?;
                s.tool_calls(out)
            }
            _ => s.skip(DELTA),
        })
        .map(drop)
    }

    /// `delta.tool_calls`: up to [`MAX_TOOL_CALL_DELTAS`](crate::MAX_TOOL_CALL_DELTAS) elements into the chunk's slots;
    /// further ones are skipped and flagged.
    fn tool_calls(&mut self, out: &mut RawChunk<'a>) -> Result<()> {
        self.opt_array(|s, n| {
            let Some(slot) = out.chunk.tool_calls.get_mut(n) else {
                out.too_many_tool_calls = true;
                return s.skip(CALLS);
            };
            if s.ws() != Some(b'{') {
                return Err(Error::InvalidType.into());
            }
            let mut call = ToolCallDelta::default();
            let mut seen = Seen(0);
            s.object(CALL_KEYS, |s, key| match key {
                b"index" => {
                    seen.first(1)?;
                    call.index = s.u32()?;
                    Ok(())
                }
                b"id" => {
                    seen.first(2)?;
                    call.id = s.opt_str()?;
                    Ok(())
                }
                b"function" => {
                    seen.first(4)?;
                    let mut seen = Seen(0);
                    s.opt_object(FUNCTION_KEYS, |s, key| match key {
                        b"name" => {
                            seen.first(1)?;
                            call.name = s.opt_str()?;
                            Ok(())
                        }
                        b"arguments" => {
                            seen.first(2)?;
                            call.arguments = s.opt_str()?;
                            Ok(())
                        }
                        _ => s.skip(FUNCTION),
                    })
                    .map(drop)
                }
                _ => s.skip(CALL),
            })?;
            if seen.0 & 1 == 0 {
                // `index` is required, as the derived visitor said.
                return Err(Error::CustomError.into());
            }
            *slot = call;
            out.chunk.tool_calls_len = n + 1;
            Ok(())
        })
        .map(drop)
    }

    /// `null` or an error object inside `depth` arrays and objects.
    fn opt_error(&mut self, depth: usize) -> Result<Option<RawError<'a>>> {
        let mut fields = ErrorFields::default();
        let mut seen = Seen(0);
        if self.opt_object(NO_KEYS, |s, key| fields.field(s, key, &mut seen, depth + 1))? {
            fields.finish().map(Some)
        } else {
            Ok(None)
        }
    }

    /// A string (escapes kept), as `&str` from `serde-json-core`.
    fn str(&mut self) -> Result<&'a str> {
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'"' => {
                let raw = self.string()?;
                core::str::from_utf8(raw).map_err(|_| Error::InvalidUnicodeCodePoint.into())
            }
            _ => Err(Error::InvalidType.into()),
        }
    }

    /// `null`, or an object whose fields `field` numbers are all unsigned integers and required
    /// (other fields skipped), as a derived struct of `u64`s reads it.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    fn counts<const N: usize>(
        &mut self,
        order: Order,
        field: impl Fn(&[u8]) -> Option<usize>,
    ) -> Result<Option<[u64; N]>> {
        let mut vals = [0u64; N];
        let mut seen = 0u32;
        // Inline on a 64-bit host: a call per field kept the walk's state in memory.
        let present = self.opt_object(
            order,
            #[cfg_attr(target_pointer_width = "64", inline(always))]
            |s, key| match field(key) {
                Some(k) => {
                    if seen & (1 << k) != 0 {
                        return Err(Error::CustomError.into());
                    }
                    seen |= 1 << k;
                    if let Some(v) = vals.get_mut(k) {
                        *v = s.u64()?;
                    }
                    Ok(())
                }
                // Inside the top-level object and this one.
                None => s.skip(2),
            },
        )?;
        if !present {
            return Ok(None);
        }
        if seen.count_ones() as usize != N {
            // A missing field, as the derived visitors said.
            return Err(Error::CustomError.into());
        }
        Ok(Some(vals))
    }

    /// An unsigned integer that fits 32 bits, as `serde-json-core` reads a `u32`.
    pub(crate) fn u32(&mut self) -> Result<u32> {
        let n = self.u64()?;
        u32::try_from(n).map_err(|_| Error::InvalidNumber.into())
    }

    /// An unsigned integer, as `serde-json-core` reads a `u64`.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn u64(&mut self) -> Result<u64> {
        let first = self.ws().ok_or(Error::EofWhileParsingValue)?;
        self.u64_from(first)
    }

    /// [`u64`](Self::u64) after the whitespace: `first` is the byte at `self.i`.
    #[cfg_attr(target_pointer_width = "64", inline(always))]
    pub(crate) fn u64_from(&mut self, first: u8) -> Result<u64> {
        match first {
            b'-' => return Err(Error::InvalidNumber.into()),
            b'0' => {
                self.i += 1;
                return Ok(0);
            }
            b'1'..=b'9' => {}
            _ => return Err(Error::InvalidType.into()),
        }
        let mut n = 0u64;
        while let Some(&c @ b'0'..=b'9') = self.b.get(self.i) {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(c - b'0')))
                .ok_or(Error::InvalidNumber)?;
            self.i += 1;
        }
        Ok(n)
    }
}

/// The keys of one object in the order llama-server writes them, for
/// [`Scan::known_key`]; nothing on a 32-bit device, where the scan alone keeps the flash small.
#[cfg(target_pointer_width = "64")]
type Order = &'static [Known];
#[cfg(not(target_pointer_width = "64"))]
type Order = ();

#[cfg(target_pointer_width = "64")]
macro_rules! keys {
    ($($key:literal),* $(,)?) => {
        &[$(Known::new($key)),*]
    };
}
#[cfg(not(target_pointer_width = "64"))]
macro_rules! keys {
    ($($key:literal),* $(,)?) => {
        ()
    };
}
use keys;

/// One key as it is written before its value, `"key":`, in little-endian words and the masks
/// of the bytes it fills (the rest of the four words is masked off).
#[cfg(target_pointer_width = "64")]
struct Known {
    words: [u64; 4],
    masks: [u64; 4],
    /// Bytes of `"key":`.
    len: usize,
}

#[cfg(target_pointer_width = "64")]
impl Known {
    /// Refuses (at compile time) a key the scan would read differently: one with a quote or
    /// a backslash, or too long for the four words.
    const fn new(key: &str) -> Known {
        let key = key.as_bytes();
        let len = key.len() + 3;
        assert!(len <= 32, "a known key fits four words");
        let (mut words, mut masks) = ([0u64; 4], [0u64; 4]);
        let mut j = 0;
        while j < len {
            let b = if j == 0 || j == len - 2 {
                b'"'
            } else if j == len - 1 {
                b':'
            } else {
                assert!(
                    key[j - 1] != b'"' && key[j - 1] != b'\\',
                    "a known key is plain"
                );
                key[j - 1]
            };
            words[j / 8] |= (b as u64) << (8 * (j % 8));
            masks[j / 8] |= 0xff << (8 * (j % 8));
            j += 1;
        }
        Known { words, masks, len }
    }

    /// True when `words`, the 32 bytes where a key starts, begin with this key's `"key":`.
    #[inline(always)]
    fn is(&self, words: &[u64; 4]) -> bool {
        let d = |j: usize| (words[j] ^ self.words[j]) & self.masks[j];
        d(0) | d(1) | d(2) | d(3) == 0
    }
}

// The byte sets `find` looks for, as masks over eight bytes at a time (cheaper than a byte
// loop; docs/benchmarks/llama-proto.md has the counts). `x | 0x20` folds `[` into `{` and `]`
// into `}` and leaves no other byte on either.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` equal to `b`. A set bit above a true match may be
/// spurious (the subtraction borrows), so only the lowest one is meaningful.
#[inline(always)]
fn eq(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * u64::from(b));
    x.wrapping_sub(ONES) & !x & HIGH
}

/// `\` or a byte below the space: a string that needs unescaping (or is invalid). A set
/// bit above a true one may be spurious; only whether any is set counts.
#[cfg(target_pointer_width = "64")]
pub(crate) fn escape_or_control(w: u64) -> u64 {
    eq(w, b'\\') | (w.wrapping_sub(ONES * 0x20) & !w & HIGH)
}

/// `"` or `\`: the end of a string or an escape in it.
fn in_string(w: u64) -> u64 {
    eq(w, b'"') | eq(w, b'\\')
}

/// The high bit of each byte of `w` equal to `b`, exactly (no borrow between bytes), for
/// masks whose every bit is used.
#[cfg(target_pointer_width = "64")]
#[inline(always)]
fn eq_exact(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * u64::from(b));
    !(((x & !HIGH).wrapping_add(!HIGH)) | x | !HIGH)
}

/// Where [`Scan::nested`] is between words.
#[cfg(target_pointer_width = "64")]
#[derive(Default)]
struct Nesting {
    depth: usize,
    /// How deep `depth` may go.
    room: usize,
    in_str: bool,
    /// The first byte of the next word is escaped.
    skip_first: bool,
}

#[cfg(target_pointer_width = "64")]
impl Nesting {
    /// Walks one word (little-endian bytes); returns the byte index of the close that ends
    /// the value, if it is in this word.
    #[inline(always)]
    fn word(&mut self, w: u64) -> Result<Option<usize>> {
        let f = w | (ONES * 0x20);
        let quote = eq_exact(w, b'"');
        let backslash = eq_exact(w, b'\\');
        let open = eq_exact(f, b'{');
        let close = eq_exact(f, b'}');
        let mut m = quote | backslash | open | close;
        if self.skip_first {
            m &= !0x80;
            self.skip_first = false;
        }
        while m != 0 {
            let bit = m & m.wrapping_neg();
            m ^= bit;
            if self.in_str {
                if bit & quote != 0 {
                    self.in_str = false;
                } else if bit & backslash != 0 {
                    // The escaped byte is the next one, maybe in the next word.
                    match bit.checked_shl(8).filter(|&b| b != 0) {
                        Some(next) => m &= !next,
                        None => self.skip_first = true,
                    }
                }
            } else if bit & quote != 0 {
                self.in_str = true;
            } else if bit & open != 0 {
                self.depth += 1;
                if self.depth > self.room {
                    return Err(DecodeError::TooDeep);
                }
            } else if bit & close != 0 {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return Ok(Some(bit.trailing_zeros() as usize / 8));
                }
            }
        }
        Ok(None)
    }
}

/// `,`, `}` or `]`: the end of a scalar.
fn delimiter(w: u64) -> u64 {
    eq(w, b',') | eq(w | (ONES * 0x20), b'}')
}

/// The position of the first byte of `s` that `set` marks.
#[cfg(target_pointer_width = "64")]
#[inline(always)]
fn find(s: &[u8], set: fn(u64) -> u64) -> Option<usize> {
    let mut words = s.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let Ok(bytes) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let m = set(u64::from_le_bytes(bytes));
        if m != 0 {
            return Some(at + m.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let mut tail = [0u8; 8];
    let rest = words.remainder();
    tail.get_mut(..rest.len())?.copy_from_slice(rest);
    // The zero padding is in none of the sets.
    let m = set(u64::from_le_bytes(tail));
    (m != 0).then(|| at + m.trailing_zeros() as usize / 8)
}

/// The position of the first byte of `s` that `set` marks if it is among the first 24 (and `s`
/// is that long): three words in turn, without `find`'s loop (a number ends there).
#[cfg(target_pointer_width = "64")]
#[inline(always)]
fn find_near(s: &[u8], set: fn(u64) -> u64) -> Option<usize> {
    let ahead = <&[u8; 24]>::try_from(s.get(..24)?).ok()?;
    let word = |j: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&ahead[j * 8..j * 8 + 8]);
        set(u64::from_le_bytes(w))
    };
    let hit = |j: usize, m: u64| (m != 0).then(|| j * 8 + m.trailing_zeros() as usize / 8);
    hit(0, word(0))
        .or_else(|| hit(1, word(1)))
        .or_else(|| hit(2, word(2)))
}

/// Nothing near on a 32-bit device: `find` there is a byte loop already.
#[cfg(not(target_pointer_width = "64"))]
fn find_near(_: &[u8], _: fn(u64) -> u64) -> Option<usize> {
    None
}

/// The position of the first byte of `s` that `set` marks, a byte at a time: on a 32-bit
/// device each 64-bit word operation is several instructions, and the word loop costs flash.
/// The mask of a lone byte is exact (nothing below it to borrow from).
#[cfg(not(target_pointer_width = "64"))]
fn find(s: &[u8], set: fn(u64) -> u64) -> Option<usize> {
    s.iter().position(|&b| set(u64::from(b)) & 0x80 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;
    use std::string::String;
    use std::vec::Vec;

    use proptest::prelude::*;

    std::thread_local! {
        /// Set by a test to walk every key with the scan alone ([`Scan::known_key`] off).
        pub(super) static GENERAL_ONLY: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
    }

    /// The walk (`decode_chunk_walked`, the layout template off) with the known keys matched
    /// as words, then with the scan alone.
    fn both_ways(p: &[u8]) -> [String; 2] {
        [false, true].map(|general| {
            GENERAL_ONLY.with(|g| g.set(general));
            let mut text = std::vec![0u8; p.len()];
            let out = format!("{:?}", crate::decode::decode_chunk_walked(p, &mut text));
            GENERAL_ONLY.with(|g| g.set(false));
            out
        })
    }

    /// Every `data:` payload of the three recorded streams.
    fn recorded() -> Vec<&'static str> {
        crate::recorded_payloads(&[
            include_str!("../../../fixtures/plain.sse"),
            include_str!("../../../fixtures/thinking.sse"),
            include_str!("../../../fixtures/tool_call.sse"),
        ])
    }

    #[test]
    fn known_keys_give_what_the_scan_gives_on_the_recordings() {
        let payloads = recorded();
        assert_eq!(payloads.len(), 51);
        for p in payloads {
            let [known, general] = both_ways(p.as_bytes());
            assert_eq!(known, general, "{p}");
            assert!(known.starts_with("Ok(Chunk("), "{known}");
        }
    }

    #[test]
    fn known_keys_out_of_order_missing_escaped_or_spaced_give_what_the_scan_gives() {
        for p in [
            r#"{"id":"a","choices":[{"delta":{"content":"x"},"index":0,"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"timings":{"prompt_n":1,"cache_n":2,"predicted_n":3}}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}","name":"f"},"index":0}]}}]}"#,
            r#"{"c\u0068oices":[],"choices" :[{"delta":{"content" : "y"}}],"id":"b"}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"timings":{"cache_n":1,"cache_n":1,"prompt_n":2,"predicted_n":3}}"#,
            r#"{"choices":null,"created":1,"id":null,"model":"m","timings":null,"prompt_progress":null}"#,
            r#"{"choices""#,
            r#"{"choices":"#,
            r#"{"id":"#,
        ] {
            let [known, general] = both_ways(p.as_bytes());
            assert_eq!(known, general, "{p}");
        }
    }

    proptest! {
        /// A recorded payload with bytes replaced (JSON's own bytes most often) and maybe cut
        /// short decodes the same whichever way its keys are found.
        #[test]
        fn known_keys_give_what_the_scan_gives_on_damaged_recordings(
            which in 0usize..51,
            edits in proptest::collection::vec(
                (any::<prop::sample::Index>(), prop::sample::select(b"\"{}[]:, \\0an".to_vec())),
                0..4,
            ),
            cut in any::<prop::sample::Index>(),
            cut_it in any::<bool>(),
        ) {
            let mut p = recorded()[which].as_bytes().to_vec();
            for (at, b) in edits {
                let at = at.index(p.len());
                p[at] = b;
            }
            if cut_it {
                p.truncate(cut.index(p.len() + 1));
            }
            let [known, general] = both_ways(&p);
            prop_assert_eq!(known, general);
        }
    }

    fn parse(p: &str) -> core::result::Result<RawChunk<'_>, Error> {
        let mut out = RawChunk::default();
        parse_chunk(p.as_bytes(), &mut out)
            .map(|()| out)
            .map_err(|e| match e {
                DecodeError::Json(e) => e,
                other => panic!("{other:?}"),
            })
    }

    #[test]
    fn skipped_values_with_brackets_quotes_and_escapes_inside_strings() {
        let p =
            r#"{"x":"a\"}]{[\\","y":[{"z":"]\"["},[1,{}]],"w":-1.5e3,"id":"c","v":{"id":"no"}}"#;
        assert_eq!(parse(p).unwrap().chunk.id, Some("c"));
    }

    #[test]
    fn whitespace_around_every_token() {
        let p = " \n{ \"id\" :\t\"c\" , \"timings\" : { \"cache_n\" : 1 , \"prompt_n\" : 2 ,\r\n \
                 \"predicted_n\" : 3 } , \"choices\" : [ { \"delta\" : { \"content\" : \"x\" } } ] } \n";
        let r = parse(p).unwrap();
        assert_eq!(r.chunk.id, Some("c"));
        assert_eq!(r.chunk.content, Some("x"));
        let t = r.chunk.timings.unwrap();
        assert_eq!((t.cache_n, t.prompt_n, t.predicted_n), (1, 2, 3));
    }

    #[test]
    fn every_string_length_around_the_eight_byte_words() {
        for n in 0..20 {
            let s = "a".repeat(n);
            let p = format!(r#"{{"{s}":"{s}","id":"{s}","{s}x":{n}}}"#);
            assert_eq!(parse(&p).unwrap().chunk.id, Some(s.as_str()), "{p}");
            let p = format!(r#"{{"id":"{s}\"{s}"}}"#);
            let id = format!(r#"{s}\"{s}"#);
            assert_eq!(parse(&p).unwrap().chunk.id, Some(id.as_str()), "{p}");
        }
    }

    #[test]
    fn nested_strings_with_escapes_and_brackets_across_word_boundaries() {
        for n in 0..20 {
            let s = "a".repeat(n);
            for body in [r#"\"]}"#, r#"\\"#, r#"\\\"{["#, "]}", r#"\u005d"#] {
                let content = format!("{s}{body}{s}");
                let p = format!(
                    r#"{{"x":[{{"y":"{content}"}},"{s}"],"choices":[{{"delta":{{"content":"{content}"}}}}],"id":"c"}}"#
                );
                let r = parse(&p).unwrap();
                assert_eq!(r.chunk.content, Some(content.as_str()), "{p}");
                assert_eq!(r.chunk.id, Some("c"), "{p}");
            }
        }
    }

    #[test]
    fn counts_read_as_serde_json_core_reads_a_u64() {
        let t = |v: &str| {
            let p = format!(r#"{{"timings":{{"cache_n":{v},"prompt_n":0,"predicted_n":0}}}}"#);
            parse(&p).map(|r| r.chunk.timings.map(|t| t.cache_n))
        };
        assert_eq!(t("18446744073709551615"), Ok(Some(u64::MAX)));
        assert_eq!(t("18446744073709551616"), Err(Error::InvalidNumber));
        assert_eq!(t("-1"), Err(Error::InvalidNumber));
        assert_eq!(t("\"1\""), Err(Error::InvalidType));
        assert_eq!(t("null"), Err(Error::InvalidType));
        assert_eq!(t("1.5"), Err(Error::ExpectedObjectCommaOrEnd));
        assert_eq!(parse(r#"{"timings":null}"#).unwrap().chunk.timings, None);
    }

    #[test]
    fn missing_and_repeated_fields_are_errors() {
        let missing = r#"{"timings":{"cache_n":1,"prompt_n":2,"predicted_ms":0.5}}"#;
        assert_eq!(parse(missing).err(), Some(Error::CustomError));
        let twice = r#"{"timings":{"cache_n":1,"cache_n":1,"prompt_n":2,"predicted_n":3}}"#;
        assert_eq!(parse(twice).err(), Some(Error::CustomError));
        assert_eq!(
            parse(r#"{"id":"a","id":"b"}"#).err(),
            Some(Error::CustomError)
        );
        // Unknown keys may repeat, as with the derived visitors.
        assert!(parse(r#"{"model":"a","model":"b"}"#).is_ok());
    }

    #[test]
    fn malformed_top_levels_are_the_serde_json_core_errors() {
        assert_eq!(parse("").err(), Some(Error::EofWhileParsingValue));
        assert_eq!(parse("[]").err(), Some(Error::InvalidType));
        assert_eq!(parse("{} x").err(), Some(Error::TrailingCharacters));
        assert_eq!(parse(r#"{"id":"a",}"#).err(), Some(Error::TrailingComma));
        assert_eq!(parse(r#"{"id" "a"}"#).err(), Some(Error::ExpectedColon));
        assert_eq!(
            parse(r#"{"id":"a" "x":1}"#).err(),
            Some(Error::ExpectedObjectCommaOrEnd)
        );
        assert_eq!(parse(r#"{1:2}"#).err(), Some(Error::KeyMustBeAString));
        assert_eq!(parse(r#"{"x":,}"#).err(), Some(Error::ExpectedSomeValue));
        assert_eq!(parse(r#"{"id":nul}"#).err(), Some(Error::ExpectedSomeIdent));
        assert_eq!(parse(r#"{"id":1}"#).err(), Some(Error::InvalidType));
    }

    #[test]
    fn every_prefix_of_a_recorded_chunk_is_an_error_not_a_panic() {
        let p = r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a\"b"}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","timings":{"cache_n":0,"prompt_n":24,"prompt_ms":3.5,"predicted_n":1},"prompt_progress":{"total":24,"cache":0,"processed":24,"time_ms":3}}"#;
        assert!(parse(p).is_ok());
        for end in 0..p.len() {
            let cut: String = p[..end].into();
            assert!(parse(&cut).is_err(), "{cut}");
        }
    }
}
