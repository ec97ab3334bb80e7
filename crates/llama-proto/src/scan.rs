//! The top level of a chunk payload, walked by hand; the values the decoder needs in full
//! (`choices`, `error`) are handed to `serde-json-core`.
//!
//! Most of a llama-server chunk is data the client never reads: `created`, `model`,
//! `system_fingerprint`, `object` and nine `timings` fields, six of them floats. Through
//! `serde-json-core` every key and every skipped string costs a byte-by-byte scan and a
//! `from_utf8` pass (docs/benchmarks/llama-proto.md has the counts); here a skipped value costs one
//! scan for its end, and the three `timings` counts and the four `prompt_progress` numbers are
//! read directly. What this walk accepts is checked only as far as the fields the decoder
//! returns: a skipped value is not validated beyond finding its end (as `serde-json-core`
//! does for skipped numbers), so a payload `serde_json` would reject may still decode.
//! Every error is a `serde_json_core::de::Error`, as before, except nesting past
//! [`MAX_NESTING`], which is [`DecodeError::TooDeep`].
//!
//! The walk itself keeps a depth count, not a stack, so its own stack use is constant. It is
//! also what bounds `serde-json-core`'s: every value handed over has been walked to its end
//! first, so nothing deeper than the limit ever reaches a recursive parser.

use serde::de::DeserializeSeed;
use serde_json_core::de::Error;

use crate::chunk::{DecodeError, PromptProgress, MAX_NESTING};
use crate::raw::{ChoicesSeed, Opt, RawChunk, RawError};
use crate::Timings;

type Result<T> = core::result::Result<T, DecodeError>;

impl From<Error> for DecodeError {
    fn from(e: Error) -> Self {
        DecodeError::Json(e)
    }
}

/// Checks that no array or object in `payload` nests deeper than [`MAX_NESTING`], the
/// payload's own outer value included. Anything else about the payload is left to its parser.
pub(crate) fn check_nesting(payload: &[u8]) -> Result<()> {
    let mut s = Scan { b: payload, i: 0 };
    match s.ws() {
        Some(b'{' | b'[') => s.nested(0).map(drop).or_else(|e| match e {
            DecodeError::TooDeep => Err(e),
            // Malformed: the parser that runs next says how.
            _ => Ok(()),
        }),
        _ => Ok(()),
    }
}

/// Parses `payload` into `out` (which must start as `RawChunk::default()`).
pub(crate) fn parse_chunk<'a>(payload: &'a [u8], out: &mut RawChunk<'a>) -> Result<()> {
    let mut s = Scan { b: payload, i: 0 };
    if s.ws().ok_or(Error::EofWhileParsingValue)? != b'{' {
        return Err(Error::InvalidType.into());
    }
    s.i += 1;
    let mut seen = 0u8;
    let mut first = true;
    loop {
        match s.ws().ok_or(Error::EofWhileParsingObject)? {
            b'}' if first => {
                s.i += 1;
                break;
            }
            b'"' if first => {}
            _ if first => return Err(Error::KeyMustBeAString.into()),
            b',' => {
                s.i += 1;
                match s.ws().ok_or(Error::EofWhileParsingValue)? {
                    b'"' => {}
                    b'}' => return Err(Error::TrailingComma.into()),
                    _ => return Err(Error::KeyMustBeAString.into()),
                }
            }
            b'}' => {
                s.i += 1;
                break;
            }
            _ => return Err(Error::ExpectedObjectCommaOrEnd.into()),
        }
        first = false;
        let key = s.string()?;
        s.colon()?;
        let bit = match key {
            b"choices" => 1,
            b"id" => 2,
            b"timings" => 4,
            b"prompt_progress" => 8,
            b"error" => 16,
            _ => 0,
        };
        if seen & bit != 0 {
            // As the derived visitors said for a repeated field.
            return Err(Error::CustomError.into());
        }
        seen |= bit;
        match bit {
            1 => {
                let value = s.value(1)?;
                serde_json_core_value(value, |de| Opt(ChoicesSeed(&mut *out)).deserialize(de))?;
            }
            2 => out.chunk.id = s.opt_str()?,
            4 => {
                out.chunk.timings = s
                    .counts(|k| match k {
                        b"cache_n" => Some(0),
                        b"prompt_n" => Some(1),
                        b"predicted_n" => Some(2),
                        _ => None,
                    })?
                    .map(|[cache_n, prompt_n, predicted_n]| Timings {
                        cache_n,
                        prompt_n,
                        predicted_n,
                    });
            }
            8 => {
                out.chunk.prompt_progress = s
                    .counts(|k| match k {
                        b"total" => Some(0),
                        b"cache" => Some(1),
                        b"processed" => Some(2),
                        b"time_ms" => Some(3),
                        _ => None,
                    })?
                    .map(|[total, cache, processed, time_ms]| PromptProgress {
                        total,
                        cache,
                        processed,
                        time_ms,
                    });
            }
            16 => {
                let value = s.value(1)?;
                serde_json_core_value(value, |de| {
                    serde::Deserialize::deserialize(de).map(|e: Option<RawError<'a>>| {
                        out.error = e;
                    })
                })?;
            }
            _ => {
                s.value(1)?;
            }
        }
    }
    match s.ws() {
        None => Ok(()),
        Some(_) => Err(Error::TrailingCharacters.into()),
    }
}

/// Runs `f` on a `serde-json-core` deserializer over exactly one value.
fn serde_json_core_value<'a>(
    value: &'a [u8],
    f: impl FnOnce(&mut serde_json_core::de::Deserializer<'a, '_>) -> core::result::Result<(), Error>,
) -> Result<()> {
    let mut de = serde_json_core::de::Deserializer::new(value, None);
    f(&mut de)?;
    Ok(de.end().map(drop)?)
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    /// Skips whitespace; returns the next byte.
    fn ws(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            if !matches!(c, b' ' | b'\n' | b'\t' | b'\r') {
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
    #[inline(always)]
    fn string(&mut self) -> Result<&'a [u8]> {
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
    fn value(&mut self, outer: usize) -> Result<&'a [u8]> {
        let start = self.i;
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'"' => {
                self.string()?;
            }
            b'{' | b'[' => self.nested(outer)?,
            b',' | b'}' | b']' => return Err(Error::ExpectedSomeValue.into()),
            _ => {
                let rest = self.b.get(self.i..).unwrap_or_default();
                self.i += find(rest, delimiter).ok_or(Error::EofWhileParsingValue)?;
            }
        }
        Ok(self.b.get(start..self.i).unwrap_or_default())
    }

    /// Skips the array or object whose opening bracket is at `self.i`, to its matching close.
    /// One pass over eight bytes at a time: the quotes, backslashes and brackets of a word are
    /// handled from its masks without going back to memory, so a word with no bracket
    /// outside a string is passed in one step whatever its quotes. `outer` arrays and
    /// objects enclose this one.
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

    /// `null` or a string, as `Option<&str>` from `serde-json-core` (escapes kept).
    fn opt_str(&mut self) -> Result<Option<&'a str>> {
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

    fn null(&mut self) -> Result<()> {
        match self.b.get(self.i..self.i + 4) {
            Some(b"null") => {
                self.i += 4;
                Ok(())
            }
            _ => Err(Error::ExpectedSomeIdent.into()),
        }
    }

    /// `null`, or an object whose fields `field` numbers are all unsigned integers and required
    /// (other fields skipped), as a derived struct of `u64`s reads it.
    fn counts<const N: usize>(
        &mut self,
        field: fn(&[u8]) -> Option<usize>,
    ) -> Result<Option<[u64; N]>> {
        match self.ws().ok_or(Error::EofWhileParsingValue)? {
            b'n' => return self.null().map(|()| None),
            b'{' => self.i += 1,
            _ => return Err(Error::InvalidType.into()),
        }
        let mut vals = [0u64; N];
        let mut seen = 0u32;
        let mut first = true;
        loop {
            match self.ws().ok_or(Error::EofWhileParsingObject)? {
                b'}' if first => break,
                b'"' if first => {}
                _ if first => return Err(Error::KeyMustBeAString.into()),
                b',' => {
                    self.i += 1;
                    match self.ws().ok_or(Error::EofWhileParsingValue)? {
                        b'"' => {}
                        b'}' => return Err(Error::TrailingComma.into()),
                        _ => return Err(Error::KeyMustBeAString.into()),
                    }
                }
                b'}' => break,
                _ => return Err(Error::ExpectedObjectCommaOrEnd.into()),
            }
            first = false;
            let key = self.string()?;
            self.colon()?;
            match field(key) {
                Some(k) => {
                    if seen & (1 << k) != 0 {
                        return Err(Error::CustomError.into());
                    }
                    seen |= 1 << k;
                    if let Some(v) = vals.get_mut(k) {
                        *v = self.u64()?;
                    }
                }
                // A number, the usual case, ends at the next delimiter.
                None if matches!(self.ws(), Some(b'0'..=b'9' | b'-')) => {
                    let rest = self.b.get(self.i..).unwrap_or_default();
                    self.i += find(rest, delimiter).ok_or(Error::EofWhileParsingValue)?;
                }
                None => {
                    // Inside the top-level object and this one.
                    self.value(2)?;
                }
            }
        }
        self.i += 1;
        if seen.count_ones() as usize != N {
            // A missing field, as the derived visitors said.
            return Err(Error::CustomError.into());
        }
        Ok(Some(vals))
    }

    /// An unsigned integer, as `serde-json-core` reads a `u64`.
    fn u64(&mut self) -> Result<u64> {
        let first = self.ws().ok_or(Error::EofWhileParsingValue)?;
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

/// `"` or `\`: the end of a string or an escape in it.
fn in_string(w: u64) -> u64 {
    eq(w, b'"') | eq(w, b'\\')
}

/// The high bit of each byte of `w` equal to `b`, exactly (no borrow between bytes), for
/// masks whose every bit is used.
#[inline(always)]
fn eq_exact(w: u64, b: u8) -> u64 {
    let x = w ^ (ONES * u64::from(b));
    !(((x & !HIGH).wrapping_add(!HIGH)) | x | !HIGH)
}

/// Where [`Scan::nested`] is between words.
#[derive(Default)]
struct Nesting {
    depth: usize,
    /// How deep `depth` may go.
    room: usize,
    in_str: bool,
    /// The first byte of the next word is escaped.
    skip_first: bool,
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;
    use std::string::String;

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
