//! A strict JSON validator that walks one value and says where it ends, with constant stack.
//!
//! It accepts RFC 8259 values (no comments, no trailing commas, no lone surrogates, no raw
//! control characters in strings) whose every number every reader takes, and keeps the kinds
//! of the open containers in a bit stack, so nesting costs one bit a level and nothing deeper
//! than the caller's limit is walked. Every byte is looked at a bounded number of times.
//!
//! A number is accepted only when its text is at most [`MAX_NUMBER_LEN`] bytes and its
//! correctly rounded `f64` is below `f64::MAX` in magnitude; underflow to zero is accepted,
//! as every reader takes it. llama-server's nlohmann::json reads with `strtod` (correctly
//! rounded) and refuses only an infinity; serde_json's default parser is not correctly
//! rounded and overflows on some texts that round to `f64::MAX` (`1.7976931348623158e308`),
//! never on one that rounds lower (checked over every significand and exponent it can hold
//! in `tests/text_calls.rs`). So both read every value accepted here.
//! [`check_json_object`] applies these rules to a whole text.

use core::fmt;

use crate::MAX_NESTING;

/// The longest number text accepted, in bytes: any `f64` written out takes at most 24, and
/// the cap bounds the work of reading one.
pub const MAX_NUMBER_LEN: usize = 64;

// The container bit stack is one `u64`.
const _: () = assert!(MAX_NESTING <= 64);

/// Why a value is not valid JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Not JSON: an unexpected byte, or the text ended inside the value.
    Malformed,
    /// Arrays and objects nest deeper than the limit.
    TooDeep,
    /// A number's text is longer than [`MAX_NUMBER_LEN`].
    NumberTooLong,
    /// A number rounds to `f64::MAX` or beyond in magnitude.
    NumberOutOfRange,
}

/// A [`Fault`] and the byte offset where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bad {
    pub(crate) fault: Fault,
    pub(crate) at: usize,
}

fn malformed(at: usize) -> Bad {
    Bad {
        fault: Fault::Malformed,
        at,
    }
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// Validates the string that opens at `b[i] == b'"'`; returns the index one past its closing
/// quote.
pub(crate) fn string(b: &[u8], mut i: usize) -> Result<usize, Bad> {
    if b.get(i) != Some(&b'"') {
        return Err(malformed(i));
    }
    i += 1;
    // A high surrogate escape waits for its low half.
    let mut want_low = false;
    loop {
        let c = *b.get(i).ok_or(malformed(i))?;
        if want_low && c != b'\\' {
            return Err(malformed(i));
        }
        match c {
            b'"' => return Ok(i + 1),
            b'\\' => {
                let e = *b.get(i + 1).ok_or(malformed(i + 1))?;
                if want_low && e != b'u' {
                    return Err(malformed(i));
                }
                match e {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let u = hex4(b, i + 2)?;
                        let high = (0xD800..0xDC00).contains(&u);
                        let low = (0xDC00..0xE000).contains(&u);
                        if want_low != low || (want_low && high) {
                            return Err(malformed(i));
                        }
                        want_low = high;
                        i += 6;
                    }
                    _ => return Err(malformed(i + 1)),
                }
            }
            0..=0x1f => return Err(malformed(i)),
            _ => i += 1,
        }
    }
}

fn hex4(b: &[u8], i: usize) -> Result<u32, Bad> {
    let mut u = 0u32;
    for k in i..i + 4 {
        let d = match b.get(k) {
            Some(c @ b'0'..=b'9') => c - b'0',
            Some(c @ b'a'..=b'f') => c - b'a' + 10,
            Some(c @ b'A'..=b'F') => c - b'A' + 10,
            _ => return Err(malformed(k)),
        };
        u = u << 4 | u32::from(d);
    }
    Ok(u)
}

fn digits(b: &[u8], mut i: usize) -> Result<usize, Bad> {
    if !b.get(i).is_some_and(u8::is_ascii_digit) {
        return Err(malformed(i));
    }
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    Ok(i)
}

/// Validates the number that starts at `b[start]`; returns the index one past it. Its grammar
/// is checked first, then its length and its range, both reported at `start`.
fn number(b: &[u8], start: usize) -> Result<usize, Bad> {
    let mut i = start;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match b.get(i) {
        Some(b'0') => i + 1,
        _ => digits(b, i)?,
    };
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    let fault = if i - start > MAX_NUMBER_LEN {
        Fault::NumberTooLong
    } else if in_range(b.get(start..i).unwrap_or_default()) {
        return Ok(i);
    } else {
        Fault::NumberOutOfRange
    };
    Err(Bad { fault, at: start })
}

/// Whether the number `text` (valid JSON grammar) rounds below `f64::MAX` in magnitude.
fn in_range(text: &[u8]) -> bool {
    // JSON's number grammar is a subset of `f64`'s `FromStr`, which rounds correctly.
    core::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<f64>().ok())
        .is_some_and(|x| x.abs() < f64::MAX)
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, Bad> {
    for (k, &w) in word.iter().enumerate() {
        if b.get(i + k) != Some(&w) {
            return Err(malformed(i + k));
        }
    }
    Ok(i + word.len())
}

/// After an object's `{` or `,`: the key, the colon, and whitespace up to the value.
fn key(b: &[u8], i: usize) -> Result<usize, Bad> {
    let i = string(b, ws(b, i))?;
    let i = ws(b, i);
    if b.get(i) != Some(&b':') {
        return Err(malformed(i));
    }
    Ok(i + 1)
}

/// Validates the JSON value that starts at `b[i]` (no leading whitespace); returns the index
/// one past its end. Arrays and objects may nest `max_depth` deep, the value itself counting
/// as the first level.
pub(crate) fn value(b: &[u8], mut i: usize, max_depth: usize) -> Result<usize, Bad> {
    // Bit k set: the container at depth k + 1 is an object.
    let mut objects = 0u64;
    let mut depth = 0usize;
    loop {
        // One value starts at `i`.
        i = ws(b, i);
        let c = *b.get(i).ok_or(malformed(i))?;
        match c {
            b'{' | b'[' => {
                if depth == max_depth {
                    return Err(Bad {
                        fault: Fault::TooDeep,
                        at: i,
                    });
                }
                let object = c == b'{';
                objects = objects & !(1 << depth) | u64::from(object) << depth;
                depth += 1;
                let close = if object { b'}' } else { b']' };
                let j = ws(b, i + 1);
                if b.get(j) == Some(&close) {
                    depth -= 1;
                    i = j + 1;
                } else {
                    i = if object { key(b, j)? } else { j };
                    continue;
                }
            }
            b'"' => i = string(b, i)?,
            b'-' | b'0'..=b'9' => i = number(b, i)?,
            b't' => i = literal(b, i, b"true")?,
            b'f' => i = literal(b, i, b"false")?,
            b'n' => i = literal(b, i, b"null")?,
            _ => return Err(malformed(i)),
        }
        // A value ended at `i`: close containers until one wants another value.
        loop {
            if depth == 0 {
                return Ok(i);
            }
            let object = objects >> (depth - 1) & 1 == 1;
            i = ws(b, i);
            match b.get(i) {
                Some(b',') => {
                    i = if object { key(b, i + 1)? } else { i + 1 };
                    break;
                }
                Some(b'}') if object => {}
                Some(b']') if !object => {}
                _ => return Err(malformed(i)),
            }
            depth -= 1;
            i += 1;
        }
    }
}

/// Why a text is not one JSON object: see [`check_json_object`]. Offsets are bytes into the
/// text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JsonError {
    /// The text does not start with an object (after whitespace).
    NotAnObject {
        /// Where the object should start.
        at: usize,
    },
    /// The object is not valid JSON.
    Malformed {
        /// The first byte the JSON cannot have, or the text's end if it stops short.
        at: usize,
    },
    /// Arrays and objects nest deeper than [`MAX_NESTING`].
    TooDeep {
        /// The opening bracket one level too deep.
        at: usize,
    },
    /// A number's text is longer than [`MAX_NUMBER_LEN`] bytes.
    NumberTooLong {
        /// The number's first byte.
        at: usize,
    },
    /// A number rounds to `f64::MAX` or beyond in magnitude, where a reader may overflow.
    NumberOutOfRange {
        /// The number's first byte.
        at: usize,
    },
    /// Something other than whitespace after the object.
    TrailingText {
        /// The first byte after the object that is not whitespace.
        at: usize,
    },
}

impl From<Bad> for JsonError {
    fn from(bad: Bad) -> JsonError {
        let at = bad.at;
        match bad.fault {
            Fault::Malformed => JsonError::Malformed { at },
            Fault::TooDeep => JsonError::TooDeep { at },
            Fault::NumberTooLong => JsonError::NumberTooLong { at },
            Fault::NumberOutOfRange => JsonError::NumberOutOfRange { at },
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            JsonError::NotAnObject { at } => write!(f, "no JSON object at byte {at}"),
            JsonError::Malformed { at } => write!(f, "JSON is malformed at byte {at}"),
            JsonError::TooDeep { at } => write!(
                f,
                "JSON nests deeper than {MAX_NESTING} levels at byte {at}"
            ),
            JsonError::NumberTooLong { at } => write!(
                f,
                "JSON number at byte {at} is longer than {MAX_NUMBER_LEN} bytes"
            ),
            JsonError::NumberOutOfRange { at } => write!(
                f,
                "JSON number at byte {at} is out of range (it rounds to f64::MAX or beyond)"
            ),
            JsonError::TrailingText { at } => {
                write!(f, "text after the JSON object at byte {at}")
            }
        }
    }
}

impl core::error::Error for JsonError {}

/// Checks that `text` is one JSON object, whitespace around it allowed, by the rules every
/// `<tool_call>` object is held to: strict RFC 8259, arrays and objects nested at most
/// [`MAX_NESTING`] deep (the object itself counting as the first level), and every number at
/// most [`MAX_NUMBER_LEN`] bytes and below `f64::MAX` in magnitude once correctly rounded
/// (underflow to zero is fine). A text accepted here is read by serde_json and by
/// llama-server's nlohmann::json alike. The first fault in the text is reported.
///
/// No allocation; the work is linear in the text's length and the stack use constant.
///
/// ```
/// use llama_proto::{check_json_object, JsonError};
///
/// assert_eq!(check_json_object(" {\"city\": \"Paris\", \"days\": 3}\n"), Ok(()));
/// assert_eq!(check_json_object("{\"n\": 1e-400}"), Ok(()));
/// assert_eq!(
///     check_json_object("{\"n\": 1e400}"),
///     Err(JsonError::NumberOutOfRange { at: 6 })
/// );
/// assert_eq!(check_json_object("[1]"), Err(JsonError::NotAnObject { at: 0 }));
/// ```
pub fn check_json_object(text: &str) -> Result<(), JsonError> {
    let b = text.as_bytes();
    let start = ws(b, 0);
    if b.get(start) != Some(&b'{') {
        return Err(JsonError::NotAnObject { at: start });
    }
    let end = ws(b, value(b, start, MAX_NESTING)?);
    if end < b.len() {
        return Err(JsonError::TrailingText { at: end });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::format;

    use super::*;

    fn check(s: &str) -> Result<usize, Bad> {
        value(s.as_bytes(), 0, 3)
    }

    #[test]
    fn valid_values_end_where_they_end() {
        for (s, end) in [
            ("{}", 2),
            ("[] x", 2),
            (
                "{\"a\": [1, -2.5e+3, true, false, null, \"\\u00e9\\n\"]} ",
                50,
            ),
            ("\"\\ud83d\\ude00\"", 14),
            ("0", 1),
            ("-0.5E7,", 6),
            ("[[[]]]", 6),
        ] {
            assert_eq!(check(s), Ok(end), "{s}");
        }
    }

    #[test]
    fn invalid_values_say_where() {
        for (s, at) in [
            ("{,}", 1),
            ("{\"a\" 1}", 5),
            ("{\"a\": 1,}", 8),
            ("[1,]", 3),
            ("[1 2]", 3),
            ("[01]", 2),
            ("1.", 2),
            ("1e", 2),
            ("-", 1),
            ("tru", 3),
            ("\"a", 2),
            ("\"\\x\"", 2),
            ("\"\\u12g4\"", 5),
            ("\"\\ud83d\"", 7),
            ("\"\\ud83dx\"", 7),
            ("\"\\ude00\"", 1),
            ("\"\\ud83d\\ud83d\"", 7),
            ("\"a\u{1}\"", 2),
            ("{\"a\": 1]", 7),
            ("[1}", 2),
            ("", 0),
            ("{", 1),
        ] {
            assert_eq!(check(s), Err(malformed(at)), "{s}");
        }
    }

    fn bad(fault: Fault, at: usize) -> Result<usize, Bad> {
        Err(Bad { fault, at })
    }

    #[test]
    fn numbers_below_f64_max_are_valid_and_the_rest_out_of_range_at_their_start() {
        for s in [
            // f64::MAX's neighbour below, and the last text before the midpoint to f64::MAX.
            "1.7976931348623155e308",
            "1.797693134862315608e308",
            "-1.7976931348623155e308",
            // Underflow reads as zero.
            "1e-400",
            "-1e-400",
            "0e999999999",
            "1e308",
        ] {
            assert_eq!(check(s), Ok(s.len()), "{s}");
        }
        for s in [
            // Past the midpoint, it rounds to f64::MAX.
            "1.797693134862315609e308",
            "1.7976931348623157e308",
            "-1.7976931348623157e308",
            "1.7976931348623159e308",
            "1e400",
            "-1e400",
            "1e999999999999",
        ] {
            assert_eq!(check(s), bad(Fault::NumberOutOfRange, 0), "{s}");
        }
        assert_eq!(check("[0, 1e400]"), bad(Fault::NumberOutOfRange, 4));
    }

    #[test]
    fn numbers_at_the_length_cap_and_one_past() {
        let at_cap = format!("1{}", "0".repeat(MAX_NUMBER_LEN - 1));
        assert_eq!(check(&at_cap), Ok(MAX_NUMBER_LEN));
        let past = format!("{at_cap}0");
        assert_eq!(check(&past), bad(Fault::NumberTooLong, 0));
        let neg = format!("-0.{}", "1".repeat(MAX_NUMBER_LEN - 3));
        assert_eq!(check(&format!("[{neg}]")), Ok(MAX_NUMBER_LEN + 2));
        assert_eq!(check(&format!("[{neg}1]")), bad(Fault::NumberTooLong, 1));
        // The grammar is checked before the length.
        assert_eq!(check(&format!("{past}.")), Err(malformed(past.len() + 1)));
    }

    #[test]
    fn depth_at_the_limit_and_one_past() {
        assert_eq!(check("[{\"a\": [1]}]"), Ok(12));
        assert_eq!(
            check("[{\"a\": [[1]]}]"),
            Err(Bad {
                fault: Fault::TooDeep,
                at: 8
            })
        );
        assert_eq!(value(b"1", 0, 0), Ok(1));
        assert_eq!(
            value(b"[]", 0, 0),
            Err(Bad {
                fault: Fault::TooDeep,
                at: 0
            })
        );
    }
}
