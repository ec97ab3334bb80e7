//! How the body of a response is delimited: RFC 9112 section 6.3, for a user agent.
//!
//! The rules are applied in the RFC's order; where the RFC allows a guess, we return an error.

use crate::HttpError;

/// How the body of a response ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// No body: a 1xx, 204 or 304 status (RFC 9112 6.3 rule 1).
    None,
    /// Exactly this many bytes (`Content-Length`, rule 6).
    Length(u64),
    /// Chunked transfer coding, the final coding of `Transfer-Encoding` (rule 4).
    Chunked,
    /// Until the connection closes (a non-chunked final coding, rule 4, or no framing, rule 8).
    Close,
}

impl Framing {
    /// The name printed by the `http_dump` example: `none`, `length`, `chunked` or `close`.
    pub fn as_str(self) -> &'static str {
        match self {
            Framing::None => "none",
            Framing::Length(_) => "length",
            Framing::Chunked => "chunked",
            Framing::Close => "close",
        }
    }
}

/// Decides the framing from the status, the minor version and the header fields.
pub(crate) fn decide<'a>(
    status: u16,
    minor_version: u8,
    headers: impl Iterator<Item = (&'a [u8], &'a [u8])>,
) -> Result<Framing, HttpError> {
    let mut fields = Fields::default();
    for (name, value) in headers {
        fields.add(name, value);
    }
    fields.decide(status, minor_version)
}

/// The framing-relevant header fields, taken one at a time, so the head parser can feed them in
/// the same pass that records the header offsets.
#[derive(Default)]
pub(crate) struct Fields {
    length: Option<u64>,
    te: TransferCodings,
    /// The first fault in the fields; later fields are not looked at, as in a loop that returns.
    fault: Option<HttpError>,
}

impl Fields {
    #[inline]
    pub(crate) fn add(&mut self, name: &[u8], value: &[u8]) {
        if self.fault.is_some() {
            return;
        }
        // Length first: most names are neither, and this skips the case-folding compare.
        let r = match name.len() {
            14 if token_eq_lower(name, b"content-length") => self.content_length(value),
            17 if token_eq_lower(name, b"transfer-encoding") => self.te.add(value),
            _ => return,
        };
        if let Err(e) = r {
            self.fault = Some(e);
        }
    }

    fn content_length(&mut self, value: &[u8]) -> Result<(), HttpError> {
        // The usual value is plain digits; lists of repeated values take the long way.
        let n = parse_decimal(value);
        if let (Ok(n), None) = (n, self.length) {
            self.length = Some(n);
            return Ok(());
        }
        for element in value.split(|&b| b == b',') {
            let n = parse_decimal(trim_ows(element))?;
            match self.length {
                Some(prev) if prev != n => return Err(HttpError::ConflictingContentLength),
                _ => self.length = Some(n),
            }
        }
        Ok(())
    }

    /// The framing, given the status and the minor version, once every field was added.
    pub(crate) fn decide(self, status: u16, minor_version: u8) -> Result<Framing, HttpError> {
        // Rule 1 comes first, whatever the headers say (a 304 may carry the length it would have
        // had, or even a malformed one).
        if (100..200).contains(&status) || status == 204 || status == 304 {
            return Ok(Framing::None);
        }
        if let Some(e) = self.fault {
            return Err(e);
        }
        let (length, te) = (self.length, self.te);
        if te.present {
            if length.is_some() {
                return Err(HttpError::TransferEncodingWithContentLength);
            }
            if minor_version == 0 {
                return Err(HttpError::TransferEncodingInHttp10);
            }
            if te.codings == 0 {
                return Err(HttpError::InvalidTransferEncoding);
            }
            return Ok(if te.final_is_chunked {
                Framing::Chunked
            } else {
                Framing::Close
            });
        }
        Ok(match length {
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        })
    }
}

/// What the `Transfer-Encoding` lines said, taken together as one list in order.
#[derive(Default, Clone, Copy)]
struct TransferCodings {
    present: bool,
    codings: usize,
    chunked_seen: bool,
    final_is_chunked: bool,
}

impl TransferCodings {
    fn add(&mut self, value: &[u8]) -> Result<(), HttpError> {
        self.present = true;
        // The usual value, checked whole before the general list walk below.
        if value.len() == 7 && token_eq_lower(value, b"chunked") {
            if self.chunked_seen {
                return Err(HttpError::InvalidTransferEncoding);
            }
            self.chunked_seen = true;
            self.final_is_chunked = true;
            self.codings += 1;
            return Ok(());
        }
        for element in value.split(|&b| b == b',') {
            let element = trim_ows(element);
            // RFC 9110 5.6.1: empty list elements are ignored.
            if element.is_empty() {
                continue;
            }
            let name_end = element
                .iter()
                .position(|&b| b == b';')
                .unwrap_or(element.len());
            let name = trim_ows(&element[..name_end]);
            if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
                return Err(HttpError::InvalidTransferEncoding);
            }
            let chunked = name.eq_ignore_ascii_case(b"chunked");
            // RFC 9112 6.1: a sender MUST NOT apply chunked more than once.
            if chunked && self.chunked_seen {
                return Err(HttpError::InvalidTransferEncoding);
            }
            self.chunked_seen |= chunked;
            self.final_is_chunked = chunked;
            self.codings += 1;
        }
        Ok(())
    }
}

/// `a` equals `lower` (lower-case letters and `-`, at least 4 bytes) ignoring ASCII case, for an
/// `a` of token characters (a header name), or any `a` when `lower` is all letters. Setting bit
/// 0x20 maps `A`-`Z` onto `a`-`z`; the only other byte it maps onto a letter or `-` is CR (onto
/// `-`), not a token character. Compared a word at a time (the last word overlapping), since
/// `eq_ignore_ascii_case` goes byte by byte and this runs for every header field.
#[inline]
fn token_eq_lower(a: &[u8], lower: &[u8]) -> bool {
    if a.len() != lower.len() {
        return false;
    }
    if a.len() < 8 {
        let word = |s: &[u8], at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&s[at..at + 4]);
            u32::from_le_bytes(w) | 0x2020_2020
        };
        let last = a.len().saturating_sub(4);
        return a.len() >= 4 && word(a, 0) == word(lower, 0) && word(a, last) == word(lower, last);
    }
    let word = |s: &[u8], at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_le_bytes(w) | 0x2020_2020_2020_2020
    };
    let last = a.len() - 8;
    let mut at = 0;
    while at < last {
        if word(a, at) != word(lower, at) {
            return false;
        }
        at += 8;
    }
    word(a, last) == word(lower, last)
}

/// `1*DIGIT` as a u64; anything else (sign, space, empty, overflow) is invalid.
fn parse_decimal(digits: &[u8]) -> Result<u64, HttpError> {
    if digits.is_empty() {
        return Err(HttpError::InvalidContentLength);
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(HttpError::InvalidContentLength);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(HttpError::InvalidContentLength)?;
    }
    Ok(n)
}

fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// RFC 9110 5.6.2 token characters.
#[inline]
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// [`is_tchar`] as a table: one load per byte instead of a search of the punctuation list.
static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The word compare agrees with `eq_ignore_ascii_case` for every name it is used with, on
    /// every byte at every position, where its argument's byte class allows.
    #[test]
    fn token_eq_lower_agrees_with_eq_ignore_ascii_case() {
        let names: [&[u8]; 3] = [b"content-length", b"transfer-encoding", b"chunked"];
        for lower in names {
            let letters_only = lower.iter().all(u8::is_ascii_lowercase);
            assert!(token_eq_lower(lower, lower));
            let upper = lower.to_ascii_uppercase();
            assert!(token_eq_lower(&upper, lower));
            assert!(!token_eq_lower(&lower[1..], lower));
            for at in 0..lower.len() {
                for b in 0..=255u8 {
                    if !letters_only && !is_tchar(b) {
                        continue;
                    }
                    let mut a = upper.clone();
                    a[at] = b;
                    assert_eq!(
                        token_eq_lower(&a, lower),
                        a.eq_ignore_ascii_case(lower),
                        "{a:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn tchar_table_is_rfc_9110_tokens() {
        for b in 0..=255u8 {
            let expected = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            assert_eq!(is_tchar(b), expected, "{b}");
        }
    }
}
