//! A pull API over an `embedded-io` reader, for hosts with a reader but no allocator.

use core::borrow::BorrowMut;
use core::fmt;

use embedded_io::{ErrorKind, Read};

use crate::{Event, Parser, SseError};

/// Pulls events from an [`embedded_io::Read`] through a [`Parser`].
///
/// Reads go into a caller-provided buffer of `B` bytes (`T` lends a `[u8; B]`, like the
/// parser's storage), so neither buffer needs the stack.
///
/// ```
/// use sse_nostd::{Event, EventReader, Parser};
///
/// let stream: &[u8] = b": hi\ndata: a\ndata: b\n\n";
/// let mut reader = EventReader::new(stream, Parser::new([0u8; 256]), [0u8; 8]);
/// assert_eq!(reader.next_event().unwrap(), Some(Event::Comment(b" hi")));
/// match reader.next_event().unwrap() {
///     Some(Event::Message(m)) => assert_eq!(m.data, b"a\nb"),
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(reader.next_event().unwrap(), None);
/// ```
pub struct EventReader<R, S, T, const N: usize, const B: usize> {
    reader: R,
    parser: Parser<S, N>,
    read_buf: T,
    start: usize,
    end: usize,
    ended: bool,
}

impl<R, S, T, const N: usize, const B: usize> EventReader<R, S, T, N, B>
where
    R: Read,
    S: BorrowMut<[u8; N]>,
    T: BorrowMut<[u8; B]>,
{
    /// Reads from `reader` into `read_buf` and parses with `parser`.
    pub fn new(reader: R, parser: Parser<S, N>, read_buf: T) -> Self {
        const {
            assert!(
                B > 0,
                "a read buffer of 0 bytes cannot tell data from end of stream"
            )
        };
        Self {
            reader,
            parser,
            read_buf,
            start: 0,
            end: 0,
            ended: false,
        }
    }

    /// The next event, reading as needed.
    ///
    /// `Ok(None)` once the reader reported end of stream (`Ok(0)`) at an event boundary; an
    /// end inside an event is `Err(ReadError::Parse(SseError::Unterminated))`, after which it
    /// is `Ok(None)`. `Interrupted` reads are retried; other read errors are returned as they
    /// are and the call can be repeated.
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>, ReadError<R::Error>> {
        loop {
            if self.start == self.end {
                if self.ended {
                    return Ok(None);
                }
                let n = loop {
                    match self.reader.read(self.read_buf.borrow_mut()) {
                        Ok(n) => break n,
                        Err(e) if embedded_io::Error::kind(&e) == ErrorKind::Interrupted => {}
                        Err(e) => return Err(ReadError::Read(e)),
                    }
                };
                if n == 0 {
                    self.ended = true;
                    self.parser.finish().map_err(ReadError::Parse)?;
                    return Ok(None);
                }
                // Clamped: a faulty reader claiming more than the buffer must not panic us.
                self.start = 0;
                self.end = n.min(B);
            }
            let at = self.start;
            let input: &[u8; B] = self.read_buf.borrow();
            let (used, ready) = self
                .parser
                .step(&input[at..self.end])
                .map_err(ReadError::Parse)?;
            self.start += used;
            if let Some(ready) = ready {
                // Borrowed afresh on this path only, so the loop above never holds a borrow.
                let input: &[u8; B] = self.read_buf.borrow();
                return Ok(Some(self.parser.ready_event(ready, &input[at..self.end])));
            }
        }
    }

    /// The parser, e.g. for [`Parser::last_event_id`].
    pub fn parser(&self) -> &Parser<S, N> {
        &self.parser
    }

    /// Gives back the reader, the parser and the read buffer.
    pub fn into_parts(self) -> (R, Parser<S, N>, T) {
        (self.reader, self.parser, self.read_buf)
    }
}

// By hand: the derived one would print both buffers byte by byte.
impl<R, S, T, const N: usize, const B: usize> fmt::Debug for EventReader<R, S, T, N, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventReader")
            .field("parser", &self.parser)
            .field("read_buffer", &B)
            .field("buffered", &(self.end - self.start))
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// Why [`EventReader::next_event`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError<E> {
    /// The reader failed.
    Read(E),
    /// The bytes were not a valid event stream (or ended inside an event).
    Parse(SseError),
}

impl<E: fmt::Debug> fmt::Display for ReadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(e) => write!(f, "reading the event stream failed: {e:?}"),
            Self::Parse(e) => write!(f, "{e}"),
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for ReadError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Read(e) => Some(e),
            Self::Parse(e) => Some(e),
        }
    }
}

impl<E: embedded_io::Error + 'static> embedded_io::Error for ReadError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Read(e) => e.kind(),
            Self::Parse(_) => ErrorKind::InvalidData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    /// Hands out its script one step at a time: bytes, or an error kind.
    struct Script<'a>(&'a [Result<&'a [u8], ErrorKind>]);

    impl embedded_io::ErrorType for Script<'_> {
        type Error = ErrorKind;
    }

    impl Read for Script<'_> {
        fn read(&mut self, buf: &mut [u8]) -> Result<usize, ErrorKind> {
            let Some((step, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            self.0 = rest;
            let bytes = (*step)?;
            buf[..bytes.len()].copy_from_slice(bytes);
            Ok(bytes.len())
        }
    }

    fn data(event: Option<Event<'_>>) -> &[u8] {
        match event {
            Some(Event::Message(Message { data, .. })) => data,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn events_across_reads_and_a_clean_end() {
        let script = [Ok(&b"data: a\r"[..]), Ok(b"\n\ndata: b\n"), Ok(b"\n")];
        let mut r = EventReader::new(Script(&script), Parser::new([0u8; 32]), [0u8; 16]);
        assert_eq!(data(r.next_event().unwrap()), b"a");
        assert_eq!(data(r.next_event().unwrap()), b"b");
        assert_eq!(r.next_event().unwrap(), None);
        assert_eq!(r.next_event().unwrap(), None);
    }

    #[test]
    fn interrupted_is_retried_and_other_errors_are_returned() {
        let script = [
            Err(ErrorKind::Interrupted),
            Ok(&b"data: a\n"[..]),
            Err(ErrorKind::TimedOut),
            Ok(b"\n"),
        ];
        let mut r = EventReader::new(Script(&script), Parser::new([0u8; 32]), [0u8; 16]);
        assert_eq!(
            r.next_event().unwrap_err(),
            ReadError::Read(ErrorKind::TimedOut)
        );
        // The caller may go on after a read error: nothing was lost.
        assert_eq!(data(r.next_event().unwrap()), b"a");
    }

    #[test]
    fn an_end_inside_an_event_is_unterminated_once() {
        let stream: &[u8] = b"data: a\n\ndata: b\n";
        let mut r = EventReader::new(stream, Parser::new([0u8; 32]), [0u8; 4]);
        assert_eq!(data(r.next_event().unwrap()), b"a");
        let err = r.next_event().unwrap_err();
        assert!(
            matches!(err, ReadError::Parse(SseError::Unterminated)),
            "{err:?}"
        );
        assert_eq!(r.next_event().unwrap(), None);
    }

    #[test]
    fn parse_errors_pass_through() {
        let script = [Ok(&b"data: 0123456789"[..])];
        let mut r = EventReader::new(Script(&script), Parser::new([0u8; 8]), [0u8; 16]);
        let err = r.next_event().unwrap_err();
        assert_eq!(err, ReadError::Parse(SseError::LineTooLong));
        assert_eq!(embedded_io::Error::kind(&err), ErrorKind::InvalidData);
    }
}
