//! The push parser: bytes in, split anywhere; events out, borrowed.
//!
//! It follows the WHATWG event-stream interpretation rules on bytes (line ends, BOM, fields,
//! dispatch). It never panics on any input and never allocates; all state is a few counters
//! plus one caller-provided buffer of `N` bytes.

use core::borrow::BorrowMut;

use memchr::{memchr, memchr2};

use crate::moves;
use crate::{Event, Message, SseError, Status};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];
/// How many BOM bytes must match before the stream counts as started past its first bytes.
const BOM_DONE: u8 = 3;

/// A push parser for `text/event-stream` with a buffer of `N` bytes.
///
/// The buffer is the caller's storage `S` (anything that lends a `[u8; N]` mutably:
/// `&mut [u8; N]`, `&'static mut [u8; N]`, `Box<[u8; N]>`, or a small `[u8; N]` by value), so
/// a 1 MiB buffer never has to pass through the stack.
///
/// # Capacity
/// At any moment the buffer holds the last event ID, the current event type, the current
/// event's data (lines joined with `\n`) and the line being read. A line longer than `N`
/// bytes is [`SseError::LineTooLong`]; a line that fits alone but not next to the rest is
/// [`SseError::EventTooLarge`] (reported at its end, or at the end of the stream). Both depend
/// only on the bytes, never on how they were split.
///
/// # Example: a heap buffer of 1 MiB, never on the stack
/// ```
/// use sse_nostd::{Event, Parser, Status};
///
/// const CAP: usize = 1024 * 1024;
/// // `vec!` fills the heap directly; `try_into` only re-types the box.
/// let storage: Box<[u8; CAP]> = vec![0u8; CAP].into_boxed_slice().try_into().unwrap();
/// let mut parser = Parser::new(storage);
/// let mut datas = Vec::new();
/// for read in [&b"data: hel"[..], b"lo\r", b"\n\r\n: ping\n"] {
///     let mut rest = read;
///     loop {
///         let (used, event) = parser.feed(rest).unwrap();
///         rest = &rest[used..];
///         match event {
///             Status::Complete(Event::Message(m)) => datas.push(m.data.to_vec()),
///             Status::Complete(_) => {}
///             Status::Partial => break, // `rest` is fully consumed
///         }
///     }
/// }
/// parser.finish().unwrap();
/// assert_eq!(datas, [b"hello".to_vec()]);
/// ```
///
/// # Example: a borrowed buffer (e.g. a `static` one on a device)
/// ```
/// use sse_nostd::{Event, Parser, SseError, Status};
///
/// let mut storage = [0u8; 64];
/// let mut parser = Parser::new(&mut storage);
/// let (used, event) = parser.feed(b"event: tick\ndata: 1\n\ndata: x").unwrap();
/// match event {
///     Status::Complete(Event::Message(m)) => {
///         assert_eq!((m.event, m.data), (&b"tick"[..], &b"1"[..]))
///     }
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(used, 21);
/// assert_eq!(parser.feed(b"data: x").unwrap(), (7, Status::Partial));
/// assert_eq!(parser.finish(), Err(SseError::Unterminated));
/// ```
pub struct Parser<S, const N: usize> {
    storage: S,
    // Layout of the buffer: [data_start, data_start + data_len) holds the data, the line being
    // read follows it directly, and the tail holds the event type then the last event ID:
    // [N - id_len - event_len, N - id_len) and [N - id_len, N).
    data_start: usize,
    data_len: usize,
    // A `data` line was seen: the data buffer is non-empty even when `data_len` is 0.
    has_data: bool,
    line_len: usize,
    event_len: usize,
    id_len: usize,
    // The line being read no longer fits next to the event: it is only counted.
    overflow: bool,
    // A field line was seen since the last empty line: the stream is inside an event.
    open: bool,
    // The previous input ended in a CR line end; an LF starting the next input belongs to it.
    pending_cr: bool,
    // BOM bytes matched so far at the start of the stream, BOM_DONE once past it.
    bom: u8,
    failed: Option<SseError>,
}

// By hand: the derived one would print all N buffer bytes.
impl<S, const N: usize> core::fmt::Debug for Parser<S, N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Parser")
            .field("capacity", &N)
            .field("data_len", &self.data_len)
            .field("line_len", &self.line_len)
            .field("event_len", &self.event_len)
            .field("id_len", &self.id_len)
            .field("open", &self.open)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Where a byte range lies: in the caller's current input or in the parser's buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Span {
    Input(usize, usize),
    Buffer(usize, usize),
}

/// The fields the parser acts on.
#[derive(Debug, Clone, Copy)]
enum Field {
    Data,
    Event,
    Id,
    Retry,
    Other,
}

/// An event found by [`Parser::advance`], described by positions only: it borrows nothing, so
/// a caller can go on feeding in a loop and take the [`Event`] out only where it returns it.
///
/// Turn it into the event with [`Parser::event`], before the next call that feeds the parser.
#[derive(Debug, Clone, Copy)]
pub struct Found(pub(crate) Ready);

#[derive(Debug, Clone, Copy)]
pub(crate) enum Ready {
    Message {
        event: Option<(usize, usize)>,
        data: Span,
        id: (usize, usize),
    },
    Comment(Span),
    Retry(u64),
}

impl<S: BorrowMut<[u8; N]>, const N: usize> Parser<S, N> {
    /// The buffer capacity in bytes.
    pub const CAPACITY: usize = N;

    /// A parser at the start of a stream, using `storage` as its buffer (its contents are
    /// ignored).
    pub fn new(storage: S) -> Self {
        Self {
            storage,
            data_start: 0,
            data_len: 0,
            has_data: false,
            line_len: 0,
            event_len: 0,
            id_len: 0,
            overflow: false,
            open: false,
            pending_cr: false,
            bom: 0,
            failed: None,
        }
    }

    /// Parses `input` up to and including the next event, httparse-style.
    ///
    /// Returns how many bytes of `input` were consumed and what was found. On
    /// [`Status::Partial`] all of `input` was consumed (kept in the buffer as needed); on
    /// [`Status::Complete`] call again with the unconsumed rest. An error is final for the
    /// stream (see [`SseError`]).
    pub fn feed<'a>(&'a mut self, input: &'a [u8]) -> Result<(usize, Status<Event<'a>>), SseError> {
        let (used, ready) = self.step(input)?;
        Ok(match ready {
            Some(r) => (used, Status::Complete(self.ready_event(r, input))),
            None => (used, Status::Partial),
        })
    }

    /// Declares the end of the stream.
    ///
    /// `Err(Unterminated)` when the stream ended inside an event or a line; the open event
    /// is not dispatched. After a feed error, that error again. Call [`reset`](Self::reset)
    /// before parsing another stream with this parser.
    pub fn finish(&mut self) -> Result<(), SseError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.overflow {
            // The line being read had already outgrown the event's room.
            return Err(self.fail(SseError::EventTooLarge));
        }
        let partial_bom = self.bom > 0 && self.bom < BOM_DONE;
        if self.open || self.line_len > 0 || partial_bom {
            return Err(SseError::Unterminated);
        }
        Ok(())
    }

    /// Forgets everything, including the last event ID and any error, to start a new stream.
    pub fn reset(&mut self) {
        self.data_start = 0;
        self.data_len = 0;
        self.has_data = false;
        self.line_len = 0;
        self.event_len = 0;
        self.id_len = 0;
        self.overflow = false;
        self.open = false;
        self.pending_cr = false;
        self.bom = 0;
        self.failed = None;
    }

    /// The last event ID seen (without a NUL), empty if none.
    pub fn last_event_id(&self) -> &[u8] {
        &self.buf()[N - self.id_len..]
    }

    /// Gives the storage back, e.g. to reuse the heap buffer for another parser.
    pub fn into_storage(self) -> S {
        self.storage
    }

    fn buf(&self) -> &[u8; N] {
        self.storage.borrow()
    }

    fn buf_mut(&mut self) -> &mut [u8; N] {
        self.storage.borrow_mut()
    }

    /// Start of the tail (event type, then last event ID): the data and line must end before.
    fn tail_start(&self) -> usize {
        N - self.id_len - self.event_len
    }

    fn data_end(&self) -> usize {
        self.data_start + self.data_len
    }

    /// Checks that a line of `line_len` bytes fits, by counting logical bytes only, so the
    /// answer never depends on where earlier bytes happen to sit.
    #[inline]
    fn check_line(&self, line_len: usize) -> Result<(), SseError> {
        if line_len > N {
            return Err(SseError::LineTooLong);
        }
        if self.data_len + line_len > self.tail_start() {
            return Err(SseError::EventTooLarge);
        }
        Ok(())
    }

    /// Moves the data (and the partial line after it) to the start of the buffer, when a
    /// stripped `data:` prefix left a gap there and the bytes must make room.
    fn compact(&mut self) {
        if self.data_start > 0 {
            let (start, end) = (self.data_start, self.data_end() + self.line_len);
            moves::move_within(self.buf_mut(), start..end, 0);
            self.data_start = 0;
        }
    }

    /// Appends bytes of a line whose end has not been seen yet.
    ///
    /// A line that outgrows the room next to the event but not `N` is only counted from then
    /// on: whether it ends as `EventTooLarge` or grows into `LineTooLong` must not depend on
    /// where the reads were cut.
    #[inline]
    fn append_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        let new_len = self.line_len + bytes.len();
        if new_len > N {
            return Err(SseError::LineTooLong);
        }
        if self.overflow || self.data_len + new_len > self.tail_start() {
            self.overflow = true;
            self.line_len = new_len;
            return Ok(());
        }
        if self.data_end() + new_len > self.tail_start() {
            self.compact();
        }
        let at = self.data_end() + self.line_len;
        self.buf_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        self.line_len = new_len;
        Ok(())
    }

    fn fail(&mut self, e: SseError) -> SseError {
        self.failed = Some(e);
        e
    }

    /// [`feed`](Self::feed) in two steps, for a caller that feeds in a loop and returns an
    /// event from inside it (as a composition of parsers does): the event comes back as a
    /// [`Found`] that borrows nothing, and [`event`](Self::event) gives the [`Event`] itself.
    /// (The borrow checker cannot yet see that a `feed` result which is not returned leaves
    /// the parser free for the next turn of the loop.)
    ///
    /// ```
    /// use sse_nostd::{Event, Parser, Status};
    ///
    /// let mut parser = Parser::new([0u8; 64]);
    /// let input = b": hi\ndata: a\n\n";
    /// let mut rest = &input[..];
    /// let data = loop {
    ///     let (used, status) = parser.advance(rest).unwrap();
    ///     match status {
    ///         Status::Complete(found) => match parser.event(found, rest) {
    ///             Event::Message(m) => break m.data,
    ///             _ => rest = &rest[used..],
    ///         },
    ///         Status::Partial => unreachable!("the event is in the input"),
    ///     }
    /// };
    /// assert_eq!(data, b"a");
    /// ```
    #[inline]
    pub fn advance(&mut self, input: &[u8]) -> Result<(usize, Status<Found>), SseError> {
        Ok(match self.step(input)? {
            (used, Some(ready)) => (used, Status::Complete(Found(ready))),
            (used, None) => (used, Status::Partial),
        })
    }

    /// The parse itself, its result borrowing nothing.
    #[inline]
    pub(crate) fn step(&mut self, input: &[u8]) -> Result<(usize, Option<Ready>), SseError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        self.advance_inner(input).map_err(|e| self.fail(e))
    }

    fn advance_inner(&mut self, input: &[u8]) -> Result<(usize, Option<Ready>), SseError> {
        let mut pos = 0;
        while self.bom < BOM_DONE && pos < input.len() {
            if input[pos] == BOM[usize::from(self.bom)] {
                self.bom += 1;
                pos += 1;
            } else {
                // Not a BOM after all: the bytes matched so far are ordinary line content.
                let matched = usize::from(self.bom);
                self.bom = BOM_DONE;
                self.append_line(&BOM[..matched])?;
            }
        }
        if self.pending_cr && pos < input.len() {
            self.pending_cr = false;
            if input[pos] == b'\n' {
                pos += 1;
            }
        }
        // The current event's data while it is still only in `input`: copied into the buffer
        // only if this call returns without dispatching it, so a whole event in one read is
        // never copied.
        let mut lazy: Option<(usize, usize)> = None;
        loop {
            let rest = &input[pos..];
            // The empty line after each event: no search needed.
            if self.line_len == 0 && rest.first() == Some(&b'\n') {
                pos += 1;
                if let Some(ready) = self.dispatch(&mut lazy) {
                    return Ok((pos, Some(ready)));
                }
                continue;
            }
            let Some(i) = memchr2(b'\n', b'\r', rest) else {
                self.flush(input, &mut lazy);
                self.append_line(rest)?;
                return Ok((input.len(), None));
            };
            let mut next = pos + i + 1;
            if rest[i] == b'\r' {
                match input.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.pending_cr = true,
                }
            }
            let line = if self.line_len == 0 {
                self.check_line(i)?;
                Span::Input(pos, pos + i)
            } else {
                self.append_line(&rest[..i])?;
                if self.overflow {
                    return Err(SseError::EventTooLarge);
                }
                let start = self.data_end();
                let line = Span::Buffer(start, start + self.line_len);
                self.line_len = 0;
                line
            };
            pos = next;
            if let Some(ready) = self.line(input, line, &mut lazy) {
                if !matches!(ready, Ready::Message { .. }) {
                    self.flush(input, &mut lazy);
                }
                return Ok((pos, Some(ready)));
            }
        }
    }

    /// Copies data still only in `input` into the buffer, before `input` goes away.
    #[inline]
    fn flush(&mut self, input: &[u8], lazy: &mut Option<(usize, usize)>) {
        if let Some((s, e)) = lazy.take() {
            // Fits: `check_line` counted these bytes when their line arrived, and the data is
            // alone in the buffer while lazy.
            self.buf_mut()[..e - s].copy_from_slice(&input[s..e]);
            self.data_start = 0;
        }
    }

    fn bytes<'a>(&'a self, input: &'a [u8], span: Span) -> &'a [u8] {
        match span {
            // Checked: `event` may be handed another input than `advance` saw.
            Span::Input(s, e) => input.get(s..e).unwrap_or_default(),
            Span::Buffer(s, e) => &self.buf()[s..e],
        }
    }

    /// Interprets one complete line (without its line end).
    fn line(
        &mut self,
        input: &[u8],
        line: Span,
        lazy: &mut Option<(usize, usize)>,
    ) -> Option<Ready> {
        let (start, end) = match line {
            Span::Input(s, e) | Span::Buffer(s, e) => (s, e),
        };
        let at = |s: usize, e: usize| match line {
            Span::Input(..) => Span::Input(s, e),
            Span::Buffer(..) => Span::Buffer(s, e),
        };
        if start == end {
            return self.dispatch(lazy);
        }
        let (field, value_start) = {
            let bytes = self.bytes(input, line);
            if bytes[0] == b':' {
                return Some(Ready::Comment(at(start + 1, end)));
            }
            let space_at = |i: usize| usize::from(bytes.get(i) == Some(&b' '));
            // `data:` is nearly every line in practice: skip the colon search for it.
            if bytes.starts_with(b"data:") {
                (Field::Data, 5 + space_at(5))
            } else {
                let (name, value_start) = match memchr(b':', bytes) {
                    Some(c) => (&bytes[..c], c + 1 + space_at(c + 1)),
                    None => (bytes, bytes.len()),
                };
                let field = match name {
                    b"data" => Field::Data,
                    b"event" => Field::Event,
                    b"id" => Field::Id,
                    b"retry" => Field::Retry,
                    _ => Field::Other,
                };
                (field, value_start)
            }
        };
        let value = at(start + value_start, end);
        self.open = true;
        match field {
            Field::Data => self.push_data(input, value, lazy),
            Field::Event => self.set_event(input, value),
            Field::Id => {
                if memchr(0, self.bytes(input, value)).is_none() {
                    self.set_id(input, value);
                }
            }
            Field::Retry => {
                let digits = self.bytes(input, value);
                if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
                    let ms = digits.iter().fold(0u64, |ms, d| {
                        ms.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                    });
                    return Some(Ready::Retry(ms));
                }
            }
            Field::Other => {}
        }
        None
    }

    /// An empty line: dispatch the event if it has data, and start a new one either way.
    #[inline]
    fn dispatch(&mut self, lazy: &mut Option<(usize, usize)>) -> Option<Ready> {
        self.open = false;
        let has_data = self.has_data;
        let event = (self.event_len > 0).then(|| (self.tail_start(), N - self.id_len));
        let data = match lazy.take() {
            Some((s, e)) => Span::Input(s, e),
            None => Span::Buffer(self.data_start, self.data_end()),
        };
        // Only the lengths are reset: the bytes stay in place until the next call, so the
        // event handed out can borrow them.
        self.has_data = false;
        self.data_start = 0;
        self.data_len = 0;
        self.event_len = 0;
        has_data.then_some(Ready::Message {
            event,
            data,
            id: (N - self.id_len, N),
        })
    }

    #[inline]
    fn push_data(&mut self, input: &[u8], value: Span, lazy: &mut Option<(usize, usize)>) {
        match value {
            Span::Input(s, e) if !self.has_data => {
                *lazy = Some((s, e));
                self.data_start = 0;
                self.data_len = e - s;
            }
            Span::Buffer(s, e) if !self.has_data => {
                // The value already sits right after the (empty) data: adopt it in place.
                self.data_start = s;
                self.data_len = e - s;
            }
            Span::Input(s, e) => {
                self.flush(input, lazy);
                // Fits logically (the whole line did); a stripped prefix gap may need closing.
                if self.data_end() + 1 + (e - s) > self.tail_start() {
                    self.compact();
                }
                let at = self.data_end();
                let buf = self.buf_mut();
                buf[at] = b'\n';
                buf[at + 1..at + 1 + (e - s)].copy_from_slice(&input[s..e]);
                self.data_len += 1 + (e - s);
            }
            Span::Buffer(s, e) => {
                // The line starts at the data's end and its value at least 5 bytes later
                // (`data:`), so moving the value left by at least 4 stays in the line.
                let at = self.data_end();
                let buf = self.buf_mut();
                buf[at] = b'\n';
                moves::move_within(buf, s..e, at + 1);
                self.data_len += 1 + (e - s);
            }
        }
        self.has_data = true;
    }

    fn set_event(&mut self, input: &[u8], value: Span) {
        // Room: the line `event:<value>` fitted next to the data and the old tail, and the
        // data's prefix gap is at most 6 bytes (`data: `), so the new tail clears the data.
        let id_start = N - self.id_len;
        match value {
            Span::Input(s, e) => {
                self.buf_mut()[id_start - (e - s)..id_start].copy_from_slice(&input[s..e]);
                self.event_len = e - s;
            }
            Span::Buffer(s, e) => {
                moves::move_within(self.buf_mut(), s..e, id_start - (e - s));
                self.event_len = e - s;
            }
        }
    }

    fn set_id(&mut self, input: &[u8], value: Span) {
        let event = (self.tail_start(), N - self.id_len);
        let event_len = self.event_len;
        match value {
            Span::Input(s, e) => {
                let len = e - s;
                if self.data_end() + event_len + len > N {
                    self.compact();
                }
                let buf = self.buf_mut();
                moves::move_within(buf, event.0..event.1, N - len - event_len);
                buf[N - len..].copy_from_slice(&input[s..e]);
                self.id_len = len;
            }
            Span::Buffer(s, e) => {
                // The value may sit where the moved event type must go: bring the event type
                // next to the value, swap the two in place, then move both to the end.
                let len = e - s;
                let buf = self.buf_mut();
                moves::move_within(buf, event.0..event.1, e);
                moves::rotate_left(&mut buf[s..e + event_len], len);
                moves::move_within(buf, s..e + event_len, N - len - event_len);
                self.id_len = len;
            }
        }
    }

    /// The event `found` describes, from the same `input` that was given to
    /// [`advance`](Self::advance) (given another, its bytes are wrong or empty, never a panic).
    #[inline]
    pub fn event<'a>(&'a self, found: Found, input: &'a [u8]) -> Event<'a> {
        self.ready_event(found.0, input)
    }

    #[inline]
    pub(crate) fn ready_event<'a>(&'a self, ready: Ready, input: &'a [u8]) -> Event<'a> {
        match ready {
            Ready::Message { event, data, id } => Event::Message(Message {
                event: match event {
                    Some((s, e)) => &self.buf()[s..e],
                    None => b"message",
                },
                data: self.bytes(input, data),
                id: &self.buf()[id.0..id.1],
            }),
            Ready::Comment(span) => Event::Comment(self.bytes(input, span)),
            Ready::Retry(ms) => Event::Retry(ms),
        }
    }
}
