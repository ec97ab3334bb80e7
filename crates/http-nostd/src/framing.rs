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
    pub fn name(self) -> &'static str {
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
    // Rule 1 comes first, whatever the headers say (a 304 may carry the length it would have had).
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Framing::None);
    }
    let mut length: Option<u64> = None;
    let mut te = TransferCodings::default();
    for (name, value) in headers {
        // Length first: most names are neither, and this skips the case-folding compare.
        if name.len() == 14 && name.eq_ignore_ascii_case(b"content-length") {
            // The usual value is plain digits; lists of repeated values take the long way.
            let n = parse_decimal(value);
            if let (Ok(n), None) = (n, length) {
                length = Some(n);
                continue;
            }
            for element in value.split(|&b| b == b',') {
                let n = parse_decimal(trim_ows(element))?;
                match length {
                    Some(prev) if prev != n => return Err(HttpError::ConflictingContentLength),
                    _ => length = Some(n),
                }
            }
        } else if name.len() == 17 && name.eq_ignore_ascii_case(b"transfer-encoding") {
            te.add(value)?;
        }
    }
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

/// What the `Transfer-Encoding` lines said, taken together as one list in order.
#[derive(Default)]
struct TransferCodings {
    present: bool,
    codings: usize,
    chunked_seen: bool,
    final_is_chunked: bool,
}

impl TransferCodings {
    fn add(&mut self, value: &[u8]) -> Result<(), HttpError> {
        self.present = true;
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
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
