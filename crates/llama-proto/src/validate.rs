//! A strict JSON validator that walks one value and says where it ends, with constant stack.
//!
//! It accepts exactly RFC 8259 values (no comments, no trailing commas, no lone surrogates,
//! no raw control characters in strings) and keeps the kinds of the open containers in a
//! bit stack, so nesting costs one bit a level and nothing deeper than the caller's limit
//! is walked. Every byte is looked at a bounded number of times.

use crate::MAX_NESTING;

// The container bit stack is one `u64`.
const _: () = assert!(MAX_NESTING <= 64);

/// Why a value is not valid JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Not JSON: an unexpected byte, or the text ended inside the value.
    Malformed,
    /// Arrays and objects nest deeper than the limit.
    TooDeep,
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

fn number(b: &[u8], mut i: usize) -> Result<usize, Bad> {
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
    Ok(i)
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

#[cfg(test)]
mod tests {
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
