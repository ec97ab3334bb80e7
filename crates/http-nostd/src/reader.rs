//! [`ResponseReader`]: bytes of one response in, the head and decoded body slices out.

use core::borrow::BorrowMut;

use crate::body::BodyBuffer;
use crate::chunked::{Chunk, ChunkedDecoder};
use crate::head::{self, Head, HeadIndex};
use crate::{Framing, HttpError, Status, MAX_HEADERS, MAX_INTERIM_RESPONSES};

/// What [`ResponseReader::feed`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'i> {
    /// The final (non-1xx) head is complete; [`ResponseReader::head`] returns it from now on.
    Head,
    /// Decoded body bytes: a non-empty slice of the input passed to this call, not a copy.
    Body(&'i [u8]),
    /// The body is complete. Nothing more is consumed; bytes after it are not part of the response.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length(u64),
    Chunked,
    Close,
    Done,
    Failed(HttpError),
}

/// A sans-IO reader for one HTTP/1.x response.
///
/// `S` is the head buffer, `H` bytes: the status line and header fields must fit in it
/// ([`HttpError::HeadersTooLarge`] otherwise), and it caps the trailer section too. Pass
/// `&mut [u8; H]`, a `Box<[u8; H]>`, or (16 KiB being small enough for most stacks) a `[u8; H]`.
///
/// `F` caps the header fields of a head ([`HttpError::TooManyHeaders`] past it; default
/// [`MAX_HEADERS`], 64). The reader holds 16 bytes of offsets per field besides `S` (at least 16
/// fields' worth), about 1.1 KiB at the default, and parsing a head puts `F` httparse slots on
/// the stack (16 bytes each on a 32-bit target, 32 on a 64-bit one). A small host picks both caps:
///
/// ```
/// use http_nostd::{Event, HttpError, ResponseReader};
///
/// let mut head = [0u8; 64];
/// let mut reader = ResponseReader::<_, 64, 2>::with_field_cap(&mut head);
/// let input = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
/// assert_eq!(reader.feed(input), Err(HttpError::TooManyHeaders));
/// ```
///
/// Interim 1xx responses (such as `100 Continue`) are skipped, as RFC 9110 15.2 asks of a user
/// agent, up to [`MAX_INTERIM_RESPONSES`]; a `101` is an error since this client never upgrades.
/// A response to `HEAD` or to `CONNECT` is not supported: its framing depends on the request.
pub struct ResponseReader<S, const H: usize = { crate::HEAD_CAP }, const F: usize = MAX_HEADERS> {
    buf: S,
    len: usize,
    interim: usize,
    // Valid once `has_head`; kept in place (1 KiB) rather than moved through return values.
    index: HeadIndex<F>,
    has_head: bool,
    state: State,
    chunked: ChunkedDecoder<H>,
}

impl<S: BorrowMut<[u8; H]>, const H: usize> ResponseReader<S, H> {
    /// A reader that keeps the head in `storage` (its previous contents are ignored), with at
    /// most [`MAX_HEADERS`] header fields; [`with_field_cap`](Self::with_field_cap) picks another.
    #[inline]
    pub fn new(storage: S) -> Self {
        Self::with_field_cap(storage)
    }
}

impl<S: BorrowMut<[u8; H]>, const H: usize, const F: usize> ResponseReader<S, H, F> {
    // Head offsets are stored as u32; refuse at compile time a head buffer they cannot address.
    const FITS_U32: () = assert!(H <= u32::MAX as usize, "head buffer must be at most 4 GiB");

    /// A reader with `F` header fields at most that keeps the head in `storage` (its previous
    /// contents are ignored). [`new`](Self::new) is this with the default [`MAX_HEADERS`].
    #[inline]
    pub fn with_field_cap(storage: S) -> Self {
        let () = Self::FITS_U32;
        Self {
            buf: storage,
            len: 0,
            interim: 0,
            index: HeadIndex::empty(),
            has_head: false,
            state: State::Head,
            chunked: ChunkedDecoder::new(),
        }
    }

    /// Gives the head buffer back.
    pub fn into_storage(self) -> S {
        self.buf
    }

    /// The final head, once [`Event::Head`] was returned.
    pub fn head(&self) -> Option<Head<'_>> {
        if !self.has_head {
            return None;
        }
        Some(Head::new(&self.buf.borrow()[..self.len], &self.index))
    }

    /// True once the body is complete ([`Event::End`] was or would be returned).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes a prefix of `input` and says what it found; returns the bytes consumed.
    ///
    /// Call it again with the rest of the input until it returns [`Status::Partial`] (then all
    /// input was consumed) or [`Event::End`]. Body slices borrow `input`. An error is final: every
    /// later call returns it again.
    #[inline]
    pub fn feed<'i>(&mut self, input: &'i [u8]) -> Result<(usize, Status<Event<'i>>), HttpError> {
        match self.feed_inner(input) {
            Ok(r) => Ok(r),
            Err(e) => {
                self.state = State::Failed(e);
                Err(e)
            }
        }
    }

    /// Like [`feed`](Self::feed) in a loop, appending the body to `body`; stops when all input is
    /// consumed ([`Status::Partial`]) or the body is complete (`Status::Complete(())`). A
    /// `Content-Length` over the room left in `body` fails at
    /// once with [`HttpError::BodyTooLarge`], before any body byte is read.
    pub fn feed_into<B: BorrowMut<[u8; N]>, const N: usize>(
        &mut self,
        input: &[u8],
        body: &mut BodyBuffer<B, N>,
    ) -> Result<(usize, Status<()>), HttpError> {
        let mut pos = 0;
        loop {
            let (used, event) = self.feed(&input[pos..])?;
            pos += used;
            match event {
                Status::Partial => return Ok((pos, Status::Partial)),
                Status::Complete(Event::End) => return Ok((pos, Status::Complete(()))),
                Status::Complete(Event::Head) => {
                    if let Some(Framing::Length(n)) = self.head().map(|h| h.framing()) {
                        if n > body.room() as u64 {
                            return Err(self.fail(HttpError::BodyTooLarge));
                        }
                    }
                }
                Status::Complete(Event::Body(bytes)) => {
                    if let Err(e) = body.push(bytes) {
                        return Err(self.fail(e));
                    }
                }
            }
        }
    }

    /// Tells the reader that the input ended (the server closed the connection).
    ///
    /// `Ok` when the body is complete, which for a read-to-close body is now. Otherwise
    /// [`HttpError::IncompleteHead`] or [`HttpError::Truncated`]; a previous error is returned again.
    pub fn finish(&mut self) -> Result<(), HttpError> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            State::Failed(e) => Err(e),
            State::Head => {
                // Heads are only parsed at LFs; a malformed unfinished line still names its fault.
                // `index` is unused while no final head was parsed.
                let e = match head::parse(&self.buf.borrow()[..self.len], &mut self.index) {
                    Err(e) => e,
                    Ok(_) => HttpError::IncompleteHead,
                };
                Err(self.fail(e))
            }
            State::Length(_) | State::Chunked => Err(self.fail(HttpError::Truncated)),
        }
    }

    fn fail(&mut self, e: HttpError) -> HttpError {
        self.state = State::Failed(e);
        e
    }

    #[inline]
    fn feed_inner<'i>(&mut self, input: &'i [u8]) -> Result<(usize, Status<Event<'i>>), HttpError> {
        match self.state {
            State::Failed(e) => Err(e),
            State::Done => Ok((0, Status::Complete(Event::End))),
            State::Head => self.feed_head(input),
            State::Length(left) => {
                if input.is_empty() {
                    return Ok((0, Status::Partial));
                }
                let take = if left < input.len() as u64 {
                    left as usize
                } else {
                    input.len()
                };
                let left = left - take as u64;
                self.state = if left == 0 {
                    State::Done
                } else {
                    State::Length(left)
                };
                Ok((take, Status::Complete(Event::Body(&input[..take]))))
            }
            State::Chunked => {
                let (used, chunk) = self.chunked.decode(input)?;
                Ok(match chunk {
                    Status::Partial => (used, Status::Partial),
                    Status::Complete(Chunk::Data(d)) => (used, Status::Complete(Event::Body(d))),
                    Status::Complete(Chunk::End) => {
                        self.state = State::Done;
                        (used, Status::Complete(Event::End))
                    }
                })
            }
            State::Close if input.is_empty() => Ok((0, Status::Partial)),
            State::Close => Ok((input.len(), Status::Complete(Event::Body(input)))),
        }
    }

    /// Gathers the head; skips interim responses. Returns `Head` with the bytes it used, or
    /// `Partial` with all of `input` used.
    fn feed_head<'i>(&mut self, input: &'i [u8]) -> Result<(usize, Status<Event<'i>>), HttpError> {
        let mut pos = 0;
        loop {
            let rest = &input[pos..];
            let old = self.len;
            let take = rest.len().min(H - old);
            let buf: &mut [u8; H] = self.buf.borrow_mut();
            let index = &mut self.index;
            let parsed = if old == 0 {
                // Parse in place first, so a head that arrives whole is copied only up to its end.
                head::parse(&rest[..take], index)?
            } else {
                buf[old..old + take].copy_from_slice(&rest[..take]);
                // A head only ends at an empty line, so it is parsed again only when one may have
                // arrived (or the buffer is full): a head dripped in small reads costs a few
                // parses, not one per line. An earlier fault is still found then, or by `finish`.
                if ends_empty_line(&buf[old.saturating_sub(2)..old + take]) || old + take == H {
                    head::parse(&buf[..old + take], index)?
                } else {
                    None
                }
            };
            let Some((end, folded)) = parsed else {
                if old == 0 {
                    buf[..take].copy_from_slice(&rest[..take]);
                }
                self.len = old + take;
                if self.len == H {
                    return Err(HttpError::HeadersTooLarge);
                }
                return Ok((input.len(), Status::Partial));
            };
            // The head ended inside this input, at `end` counted from the buffer start.
            let used = end.saturating_sub(old);
            if old == 0 {
                buf[..end].copy_from_slice(&rest[..end]);
            }
            pos += used;
            if index.status < 100 {
                return Err(HttpError::InvalidStatusLine);
            }
            if index.status == 101 {
                return Err(HttpError::SwitchingProtocols);
            }
            if index.status < 200 {
                self.interim += 1;
                if self.interim > MAX_INTERIM_RESPONSES {
                    return Err(HttpError::TooManyInterimResponses);
                }
                self.len = 0;
                continue;
            }
            let framing = if folded {
                index.unfold(&mut buf[..end]);
                index.decide_framing(&buf[..end])?
            } else {
                index.framing = index.verdict?;
                index.framing
            };
            self.len = end;
            self.has_head = true;
            self.state = match framing {
                Framing::None | Framing::Length(0) => State::Done,
                Framing::Length(n) => State::Length(n),
                Framing::Chunked => State::Chunked,
                Framing::Close => State::Close,
            };
            return Ok((pos, Status::Complete(Event::Head)));
        }
    }
}

impl<S, const H: usize, const F: usize> core::fmt::Debug for ResponseReader<S, H, F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ResponseReader")
            .field("head_len", &self.len)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// True if `bytes` holds the end of an empty line (`LF LF` or `LF CR LF`).
fn ends_empty_line(bytes: &[u8]) -> bool {
    bytes
        .windows(2)
        .enumerate()
        .any(|(i, w)| w == b"\n\n" || (w == b"\n\r" && bytes.get(i + 2) == Some(&b'\n')))
}
