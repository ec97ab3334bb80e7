//! The chunked transfer coding (RFC 9112 7.1), decoded in place: data comes out as slices of the
//! caller's input, never copied.
//!
//! Strict where a guess could desynchronise the stream: a chunk size is 1 to
//! [`MAX_CHUNK_SIZE_DIGITS`] hex digits, its line (extensions included) at most [`CHUNK_LINE_CAP`]
//! bytes and ended by CRLF, and chunk data is followed by CRLF. Extensions are skipped (after
//! `httparse::parse_chunk_size` checked the line) and trailer fields are checked line by line and
//! discarded, at most `T` bytes of them.

use crate::framing::is_tchar;
use crate::{HttpError, Status, CHUNK_LINE_CAP, HEAD_CAP, MAX_CHUNK_SIZE_DIGITS};

/// What [`ChunkedDecoder::decode`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk<'i> {
    /// Decoded body bytes, a non-empty slice of the input.
    Data(&'i [u8]),
    /// The last chunk and the trailer section were read; the body is complete.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    SizeLine,
    Data(u64),
    DataCr,
    DataLf,
    Trailer(TrailerPhase),
    Done,
    Failed(HttpError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TrailerPhase {
    LineStart,
    Name,
    Value,
    /// A CR was seen; `true` when it ends the empty line that closes the section.
    Cr(bool),
}

/// Where a chunk-size line split across inputs stands, in the grammar httparse accepts:
/// `1*HEXDIG *(SP / HTAB) [ ";" *(any byte but CR) ] CR LF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinePhase {
    Digits,
    Space,
    Extension,
    Cr,
    /// Malformed; reported as `InvalidChunkSize` when the line ends, as for a whole line.
    Bad,
}

/// A chunk-size line split across inputs, read a byte at a time. Whole lines are parsed where
/// they lie; a split one is not gathered (that took a 1 KiB buffer, zeroed per response) but
/// walked with this state, which gives the same size and the same error as the whole line.
#[derive(Debug, Clone, Copy)]
struct PartialLine {
    len: usize,
    /// Leading hex digits seen; only the first [`MAX_CHUNK_SIZE_DIGITS`] go into `size`.
    digits: usize,
    size: u64,
    phase: LinePhase,
}

impl PartialLine {
    const EMPTY: PartialLine = PartialLine {
        len: 0,
        digits: 0,
        size: 0,
        phase: LinePhase::Digits,
    };
}

/// A push decoder for a chunked body; `T` caps the trailer section (default: the 16 KiB head cap).
#[derive(Debug, Clone)]
pub struct ChunkedDecoder<const T: usize = HEAD_CAP> {
    state: State,
    line: PartialLine,
    trailer_len: usize,
}

impl<const T: usize> Default for ChunkedDecoder<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const T: usize> ChunkedDecoder<T> {
    /// A decoder at the start of a chunked body.
    pub const fn new() -> Self {
        Self {
            state: State::SizeLine,
            line: PartialLine::EMPTY,
            trailer_len: 0,
        }
    }

    /// True once the last chunk and the trailers were read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from `input`; returns how many input bytes were used and what was found.
    ///
    /// [`Status::Partial`] is returned only when all of `input` was used. After `End`, nothing more
    /// is used (`(0, End)`): bytes after the body are not part of it. After an error, the same
    /// error is returned again.
    // Always inlined: the call and its result in memory cost about as much as the fast path.
    #[inline(always)]
    pub fn decode<'i>(&mut self, input: &'i [u8]) -> Result<(usize, Status<Chunk<'i>>), HttpError> {
        // The steady state of a stream: a whole `size CRLF data CRLF` chunk in the input. This
        // stays small enough to inline into the caller's loop; everything else is out of line.
        if self.state == State::SizeLine && self.line.len == 0 {
            if let Some((used, data)) = whole_chunk(input) {
                return Ok((used, Status::Complete(Chunk::Data(data))));
            }
        }
        self.decode_general(input)
    }

    #[inline(never)]
    fn decode_general<'i>(
        &mut self,
        input: &'i [u8],
    ) -> Result<(usize, Status<Chunk<'i>>), HttpError> {
        match self.decode_inner(input) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.state = State::Failed(e);
                Err(e)
            }
        }
    }

    fn decode_inner<'i>(
        &mut self,
        input: &'i [u8],
    ) -> Result<(usize, Status<Chunk<'i>>), HttpError> {
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            match self.state {
                State::Failed(e) => return Err(e),
                State::Done => return Ok((pos, Status::Complete(Chunk::End))),
                State::SizeLine => match self.size_line(rest)? {
                    Some(used) => pos += used,
                    None => return Ok((input.len(), Status::Partial)),
                },
                State::Data(left) => {
                    if rest.is_empty() {
                        return Ok((pos, Status::Partial));
                    }
                    // `left as usize` would truncate on 32-bit targets; compare in u64 instead.
                    let take = if left < rest.len() as u64 {
                        left as usize
                    } else {
                        rest.len()
                    };
                    let left = left - take as u64;
                    let mut used = take;
                    self.state = if left > 0 {
                        State::Data(left)
                    } else if rest.get(take..take + 2) == Some(b"\r\n") {
                        // The CRLF after the data is usually here already: take it now.
                        used += 2;
                        State::SizeLine
                    } else {
                        State::DataCr
                    };
                    return Ok((pos + used, Status::Complete(Chunk::Data(&rest[..take]))));
                }
                State::DataCr | State::DataLf => {
                    let Some(&b) = rest.first() else {
                        return Ok((pos, Status::Partial));
                    };
                    self.state = match (self.state, b) {
                        (State::DataCr, b'\r') => State::DataLf,
                        (State::DataLf, b'\n') => State::SizeLine,
                        _ => return Err(HttpError::MissingChunkCrlf),
                    };
                    pos += 1;
                }
                State::Trailer(phase) => {
                    let (used, phase) = self.trailer(rest, phase)?;
                    pos += used;
                    match phase {
                        Some(phase) => {
                            self.state = State::Trailer(phase);
                            return Ok((pos, Status::Partial));
                        }
                        None => self.state = State::Done,
                    }
                }
            }
        }
    }

    /// Reads a chunk-size line; `None` when `rest` ended inside it (all of it is then used).
    #[inline]
    fn size_line(&mut self, rest: &[u8]) -> Result<Option<usize>, HttpError> {
        let fast = match self.line.len {
            0 => fast_size_line(rest),
            _ => None,
        };
        let found = match fast {
            Some(found) => found,
            None => match self.full_size_line(rest)? {
                Some(found) => found,
                None => return Ok(None),
            },
        };
        let (used, size) = found;
        self.state = if size == 0 {
            State::Trailer(TrailerPhase::LineStart)
        } else {
            State::Data(size)
        };
        Ok(Some(used))
    }

    /// Any valid chunk-size line, through httparse; `(bytes used, size)`, or `None` when `rest`
    /// ended inside the line (all of it was then taken into `self.line`).
    fn full_size_line(&mut self, rest: &[u8]) -> Result<Option<(usize, u64)>, HttpError> {
        let lf = rest.iter().position(|&b| b == b'\n');
        match lf {
            // The whole line is in this input: parse it where it lies.
            Some(i) if self.line.len == 0 => {
                if i + 1 > CHUNK_LINE_CAP {
                    return Err(HttpError::ChunkLineTooLong);
                }
                Ok(Some((i + 1, parse_size_line(&rest[..=i])?)))
            }
            _ => {
                let end = lf.map_or(rest.len(), |i| i + 1);
                if self.line.len + end > CHUNK_LINE_CAP {
                    return Err(HttpError::ChunkLineTooLong);
                }
                let line = &mut self.line;
                line.len += end;
                // The LF itself is not stepped: `finish` is what takes it.
                for &b in &rest[..lf.unwrap_or(end)] {
                    line.step(b);
                }
                if lf.is_none() {
                    return Ok(None);
                }
                let size = line.finish()?;
                self.line = PartialLine::EMPTY;
                Ok(Some((end, size)))
            }
        }
    }

    /// Checks and discards trailer bytes; returns the bytes used and the phase to resume in,
    /// or `None` for the phase when the empty line closing the section was read.
    fn trailer(
        &mut self,
        rest: &[u8],
        mut phase: TrailerPhase,
    ) -> Result<(usize, Option<TrailerPhase>), HttpError> {
        for (i, &b) in rest.iter().enumerate() {
            self.trailer_len += 1;
            if self.trailer_len > T {
                return Err(HttpError::TrailersTooLarge);
            }
            phase = match (phase, b) {
                (TrailerPhase::LineStart, b'\r') => TrailerPhase::Cr(true),
                (TrailerPhase::LineStart | TrailerPhase::Name, b) if is_tchar(b) => {
                    TrailerPhase::Name
                }
                (TrailerPhase::Name, b':') => TrailerPhase::Value,
                (TrailerPhase::Value, b'\r') => TrailerPhase::Cr(false),
                (TrailerPhase::Value, b) if b == b'\t' || (b >= 0x20 && b != 0x7f) => {
                    TrailerPhase::Value
                }
                (TrailerPhase::Cr(true), b'\n') => return Ok((i + 1, None)),
                (TrailerPhase::Cr(false), b'\n') => TrailerPhase::LineStart,
                _ => return Err(HttpError::InvalidTrailer),
            };
        }
        Ok((rest.len(), Some(phase)))
    }
}

/// A whole chunk at the start of `input`, `1*15HEXDIG CRLF data CRLF` (no extension, size not
/// 0): `(bytes used, data)`; `None` sends anything else to the general path. Always inlined: as
/// a call, its result goes through memory on the loop's critical path (the decoder alone
/// took about a tenth longer).
#[inline(always)]
fn whole_chunk(input: &[u8]) -> Option<(usize, &[u8])> {
    let (n, size) = fast_size_line(input)?;
    let data = &input[n..];
    if size > 0 && size < data.len() as u64 {
        let size = size as usize;
        if data.get(size..size + 2) == Some(b"\r\n") {
            return Some((n + size + 2, &data[..size]));
        }
    }
    None
}

/// The common line, `1*15HEXDIG CRLF` with no extension, parsed without httparse (which would
/// read it twice); `None` sends anything else, or a line not yet complete, to the full path.
#[inline(always)]
fn fast_size_line(rest: &[u8]) -> Option<(usize, u64)> {
    let mut size: u64 = 0;
    let mut i = 0;
    while i < MAX_CHUNK_SIZE_DIGITS {
        let digit = HEX[usize::from(*rest.get(i)?)];
        if digit > 15 {
            break;
        }
        // At most 15 digits: 60 bits, no overflow.
        size = size << 4 | u64::from(digit);
        i += 1;
    }
    (i > 0 && rest.get(i..i + 2)? == b"\r\n").then_some((i + 2, size))
}

impl PartialLine {
    /// Takes one byte of the line before its LF.
    fn step(&mut self, b: u8) {
        self.phase = match (self.phase, b) {
            (LinePhase::Digits, b) if b.is_ascii_hexdigit() => {
                if self.digits < MAX_CHUNK_SIZE_DIGITS {
                    // `to_digit` cannot fail on a hex digit; 15 digits are 60 bits, no overflow.
                    let digit = char::from(b).to_digit(16).unwrap_or(0);
                    self.size = self.size << 4 | u64::from(digit);
                }
                self.digits += 1;
                LinePhase::Digits
            }
            (LinePhase::Digits | LinePhase::Space, b' ' | b'\t') => LinePhase::Space,
            (LinePhase::Digits | LinePhase::Space, b';') => LinePhase::Extension,
            (LinePhase::Digits | LinePhase::Space | LinePhase::Extension, b'\r') => LinePhase::Cr,
            (LinePhase::Extension, _) => LinePhase::Extension,
            _ => LinePhase::Bad,
        };
    }

    /// The line's LF arrived: its size, or the error [`parse_size_line`] gives for it.
    fn finish(&self) -> Result<u64, HttpError> {
        if self.digits == 0 {
            return Err(HttpError::InvalidChunkSize);
        }
        if self.digits > MAX_CHUNK_SIZE_DIGITS {
            return Err(HttpError::ChunkSizeTooLong);
        }
        match self.phase {
            LinePhase::Cr => Ok(self.size),
            _ => Err(HttpError::InvalidChunkSize),
        }
    }
}

/// The value of each hex digit, and 0xff for every other byte: one load per digit.
static HEX: [u8; 256] = {
    let mut table = [0xff; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            c @ b'0'..=b'9' => c - b'0',
            c @ b'a'..=b'f' => c - b'a' + 10,
            c @ b'A'..=b'F' => c - b'A' + 10,
            _ => 0xff,
        };
        b += 1;
    }
    table
};

/// One whole chunk-size line, LF included: `1*15HEXDIG [ext] CRLF`.
fn parse_size_line(line: &[u8]) -> Result<u64, HttpError> {
    // httparse allows an empty or space-led size (read as 0) and 16 digits; we do not.
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(HttpError::InvalidChunkSize);
    }
    if digits > MAX_CHUNK_SIZE_DIGITS {
        return Err(HttpError::ChunkSizeTooLong);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, size))) if used == line.len() => Ok(size),
        // Partial on a whole line means the LF had no CR before it.
        _ => Err(HttpError::InvalidChunkSize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    /// A whole line (LF included) through the split-line state, a byte at a time.
    fn walk(line: &[u8]) -> Result<u64, HttpError> {
        let mut partial = PartialLine::EMPTY;
        let (last, body) = line.split_last().expect("a line ends in LF");
        assert_eq!(*last, b'\n');
        for &b in body {
            partial.step(b);
        }
        partial.finish()
    }

    /// Every line of up to 5 bytes over an alphabet of the bytes the grammar cares about, plus LF:
    /// the byte walk gives what httparse gives on the whole line.
    #[test]
    fn split_line_state_agrees_with_whole_line_parse_exhaustively() {
        const ALPHABET: &[u8] = b"0aF; \t\rgx";
        let mut checked = 0;
        for len in 0..=5u32 {
            for mut code in 0..ALPHABET.len().pow(len) {
                let mut line: Vec<u8> = (0..len)
                    .map(|_| {
                        let b = ALPHABET[code % ALPHABET.len()];
                        code /= ALPHABET.len();
                        b
                    })
                    .collect();
                line.push(b'\n');
                assert_eq!(walk(&line), parse_size_line(&line), "{line:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 1 + 9 + 81 + 729 + 6561 + 59049);
    }

    #[test]
    fn split_line_state_limits_and_values() {
        assert_eq!(walk(b"fffffffffffffff\r\n"), Ok(0xfff_ffff_ffff_ffff));
        assert_eq!(
            walk(b"0000000000000001\r\n"),
            Err(HttpError::ChunkSizeTooLong)
        );
        assert_eq!(walk(b"E6 \t;x=\"y\"; z\r\n"), Ok(0xe6));
        assert_eq!(walk(b"e6;\r\r\n"), Err(HttpError::InvalidChunkSize));
        assert_eq!(walk(b"\r\n"), Err(HttpError::InvalidChunkSize));
    }

    proptest! {
        #[test]
        fn split_line_state_agrees_with_whole_line_parse(
            body in proptest::collection::vec(
                prop_oneof![
                    Just(b'0'), Just(b'9'), Just(b'a'), Just(b'F'), Just(b';'), Just(b' '),
                    Just(b'\t'), Just(b'\r'), any::<u8>().prop_filter("not LF", |b| *b != b'\n'),
                ],
                0..40,
            ),
            crlf in any::<bool>(),
        ) {
            let mut line = body;
            if crlf {
                line.push(b'\r');
            }
            line.push(b'\n');
            prop_assert_eq!(walk(&line), parse_size_line(&line));
        }
    }
}
