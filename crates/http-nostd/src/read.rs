//! A pull API over an `embedded-io` reader: the response head, then the decoded body as an
//! [`embedded_io::Read`] itself, for hosts with a reader but no allocator.

use core::borrow::BorrowMut;
use core::fmt;

use embedded_io::{ErrorKind, ErrorType, Read};

use crate::{Event, Head, HttpError, ResponseReader, Status};

/// Reads one response from an [`embedded_io::Read`] through a [`ResponseReader`]: the head
/// with [`head`](Self::head), then the decoded body through its own [`Read`] impl (`Ok(0)` at
/// the end of the body), so it can feed another pull adapter, such as `sse-nostd`'s
/// `EventReader`.
///
/// Reads go into a caller-provided buffer of `B` bytes (`T` lends a `[u8; B]`, like the
/// reader's storage), so no buffer needs the stack.
///
/// ```
/// use embedded_io::Read;
/// use http_nostd::{BodyReader, ResponseReader};
///
/// let wire: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
/// let mut body = BodyReader::new(wire, ResponseReader::new([0u8; 256]), [0u8; 16]);
/// assert_eq!(body.head().unwrap().status(), 200);
/// let mut out = [0u8; 8];
/// let mut len = 0;
/// loop {
///     match body.read(&mut out[len..]).unwrap() {
///         0 => break,
///         n => len += n,
///     }
/// }
/// assert_eq!(&out[..len], b"abcde");
/// ```
pub struct BodyReader<R, S, T, const H: usize, const F: usize, const B: usize> {
    conn: R,
    reader: ResponseReader<S, H, F>,
    read_buf: T,
    // Undecoded input in the read buffer, and decoded body bytes not handed out yet (they lie
    // in the read buffer before `start`).
    start: usize,
    end: usize,
    body: (usize, usize),
    has_head: bool,
    ended: bool,
}

impl<R, S, T, const H: usize, const F: usize, const B: usize> BodyReader<R, S, T, H, F, B>
where
    R: Read,
    S: BorrowMut<[u8; H]>,
    T: BorrowMut<[u8; B]>,
{
    /// Reads from `conn` into `read_buf` and parses with `reader`.
    pub fn new(conn: R, reader: ResponseReader<S, H, F>, read_buf: T) -> Self {
        const {
            assert!(
                B > 0,
                "a read buffer of 0 bytes cannot tell data from end of stream"
            )
        };
        Self {
            conn,
            reader,
            read_buf,
            start: 0,
            end: 0,
            body: (0, 0),
            has_head: false,
            ended: false,
        }
    }

    /// The response head, reading as needed (interim 1xx responses are skipped).
    pub fn head(&mut self) -> Result<Head<'_>, ReadError<R::Error>> {
        while !self.has_head {
            self.step()?;
        }
        // Set only once the reader returned its head.
        self.reader
            .head()
            .ok_or(ReadError::Http(HttpError::IncompleteHead))
    }

    /// The response reader, e.g. for [`ResponseReader::is_done`].
    pub fn reader(&self) -> &ResponseReader<S, H, F> {
        &self.reader
    }

    /// Gives back the connection, the response reader and the read buffer.
    pub fn into_parts(self) -> (R, ResponseReader<S, H, F>, T) {
        (self.conn, self.reader, self.read_buf)
    }

    /// One turn: decodes buffered input, or reads more. Leaves decoded body bytes in
    /// `self.body`, or sets `has_head` or `ended`.
    fn step(&mut self) -> Result<(), ReadError<R::Error>> {
        if self.start == self.end {
            if self.ended {
                return Ok(());
            }
            let n = loop {
                match self.conn.read(self.read_buf.borrow_mut()) {
                    Ok(n) => break n,
                    Err(e) if embedded_io::Error::kind(&e) == ErrorKind::Interrupted => {}
                    Err(e) => return Err(ReadError::Read(e)),
                }
            };
            if n == 0 {
                self.ended = true;
                return self.reader.finish().map_err(ReadError::Http);
            }
            // Clamped: a faulty reader claiming more than the buffer must not panic us.
            (self.start, self.end) = (0, n.min(B));
        }
        let buf: &[u8; B] = self.read_buf.borrow();
        let input = &buf[self.start..self.end];
        let (used, status) = self.reader.feed(input).map_err(ReadError::Http)?;
        let at = self.start;
        self.start += used;
        match status {
            Status::Partial => {}
            Status::Complete(Event::Head) => self.has_head = true,
            Status::Complete(Event::Body(bytes)) => {
                // Where the slice lies in the read buffer (it is a slice of `input`).
                let offset = (bytes.as_ptr() as usize).saturating_sub(input.as_ptr() as usize);
                self.body = (at + offset, at + offset + bytes.len());
            }
            Status::Complete(Event::End) => {
                self.ended = true;
                self.start = self.end;
            }
        }
        Ok(())
    }
}

impl<R: Read, S, T, const H: usize, const F: usize, const B: usize> ErrorType
    for BodyReader<R, S, T, H, F, B>
where
    R::Error: 'static,
{
    type Error = ReadError<R::Error>;
}

impl<R, S, T, const H: usize, const F: usize, const B: usize> Read for BodyReader<R, S, T, H, F, B>
where
    R: Read,
    R::Error: 'static,
    S: BorrowMut<[u8; H]>,
    T: BorrowMut<[u8; B]>,
{
    /// Decoded body bytes; `Ok(0)` at the end of the body (or for an empty `out`). The head
    /// is read first if [`head`](Self::head) was not called. A connection that ends before
    /// the body does is `Err(ReadError::Http(HttpError::Truncated))`.
    fn read(&mut self, out: &mut [u8]) -> Result<usize, Self::Error> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.body.0 == self.body.1 {
            if self.ended && self.start == self.end {
                return Ok(0);
            }
            self.step()?;
        }
        let (from, to) = self.body;
        let n = out.len().min(to - from);
        let buf: &[u8; B] = self.read_buf.borrow();
        out[..n].copy_from_slice(&buf[from..from + n]);
        self.body.0 += n;
        Ok(n)
    }
}

// By hand: the derived one would print the buffers byte by byte.
impl<R, S, T, const H: usize, const F: usize, const B: usize> fmt::Debug
    for BodyReader<R, S, T, H, F, B>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyReader")
            .field("reader", &self.reader)
            .field("read_buffer", &B)
            .field("buffered", &(self.end - self.start))
            .field("body_buffered", &(self.body.1 - self.body.0))
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// Why a [`BodyReader`] call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadError<E> {
    /// The connection failed.
    Read(E),
    /// The bytes were not a valid response (or ended early); final, as the reader's errors are.
    Http(HttpError),
}

impl<E: fmt::Debug> fmt::Display for ReadError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read(e) => write!(f, "reading the response failed: {e:?}"),
            Self::Http(e) => write!(f, "{e}"),
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for ReadError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Read(e) => Some(e),
            Self::Http(e) => Some(e),
        }
    }
}

impl<E: embedded_io::Error + 'static> embedded_io::Error for ReadError<E> {
    fn kind(&self) -> ErrorKind {
        match self {
            Self::Read(e) => e.kind(),
            Self::Http(_) => ErrorKind::InvalidData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out its script one step at a time: bytes, or an error kind.
    struct Script<'a>(&'a [Result<&'a [u8], ErrorKind>]);

    impl ErrorType for Script<'_> {
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

    /// The whole body in reads of `out` bytes at most.
    fn body<R: Read<Error = E>, E: embedded_io::Error + 'static, const B: usize>(
        r: &mut BodyReader<R, [u8; 256], [u8; B], 256, 16, B>,
        out: usize,
    ) -> Result<std::vec::Vec<u8>, ReadError<E>> {
        let mut all = std::vec::Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match r.read(&mut buf[..out])? {
                0 => return Ok(all),
                n => all.extend_from_slice(&buf[..n]),
            }
        }
    }

    const CHUNKED: &[u8] =
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\nextra";

    #[test]
    fn every_read_size_and_every_output_size_give_the_body() {
        for out in 1..=13 {
            let mut r = BodyReader::<_, _, _, 256, 16, 3>::new(
                CHUNKED,
                ResponseReader::with_field_cap([0u8; 256]),
                [0u8; 3],
            );
            assert_eq!(r.head().unwrap().status(), 200);
            assert_eq!(body(&mut r, out).unwrap(), b"hello, world");
            // Bytes after the body are not read as body; the end repeats.
            assert_eq!(r.read(&mut [0u8; 4]).unwrap(), 0);
            assert!(r.reader().is_done());
        }
        // Without `head()` first: the head is read on the way.
        let mut r = BodyReader::<_, _, _, 256, 16, 64>::new(
            CHUNKED,
            ResponseReader::with_field_cap([0u8; 256]),
            [0u8; 64],
        );
        assert_eq!(body(&mut r, 64).unwrap(), b"hello, world");
    }

    #[test]
    fn a_body_read_to_the_close_ends_with_the_connection() {
        let wire: &[u8] = b"HTTP/1.1 200 OK\r\n\r\nuntil the end";
        let mut r = BodyReader::<_, _, _, 256, 16, 5>::new(
            wire,
            ResponseReader::with_field_cap([0u8; 256]),
            [0u8; 5],
        );
        assert_eq!(body(&mut r, 4).unwrap(), b"until the end");
    }

    #[test]
    fn a_cut_off_body_is_truncated_and_read_errors_pass_through() {
        let script = [
            Err(ErrorKind::Interrupted),
            Ok(&b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"[..]),
            Err(ErrorKind::TimedOut),
            Ok(b"de"),
        ];
        let mut r = BodyReader::<_, _, _, 256, 16, 64>::new(
            Script(&script),
            ResponseReader::with_field_cap([0u8; 256]),
            [0u8; 64],
        );
        let mut out = [0u8; 16];
        assert_eq!(r.read(&mut out), Ok(3));
        let err = r.read(&mut out).unwrap_err();
        assert_eq!(err, ReadError::Read(ErrorKind::TimedOut));
        assert_eq!(r.read(&mut out), Ok(2));
        let err = r.read(&mut out).unwrap_err();
        assert_eq!(err, ReadError::Http(HttpError::Truncated));
        assert_eq!(embedded_io::Error::kind(&err), ErrorKind::InvalidData);
    }

    #[test]
    fn a_malformed_head_is_the_readers_error() {
        let wire: &[u8] = b"HTTP/2 200 OK\r\n\r\n";
        let mut r = BodyReader::<_, _, _, 256, 16, 64>::new(
            wire,
            ResponseReader::with_field_cap([0u8; 256]),
            [0u8; 64],
        );
        assert_eq!(
            r.head().map(|h| h.status()),
            Err(ReadError::Http(HttpError::InvalidVersion))
        );
    }
}
