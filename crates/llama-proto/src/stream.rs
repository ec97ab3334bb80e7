//! [`ChatStream`]: one llama-server chat response, from the bytes on the connection to the
//! assembled message: `http-nostd`'s response reader, `sse-nostd`'s parser, [`decode_chunk`]
//! and the [`Assembler`], composed once for every host (loopd, the firmware image, any other).
//!
//! It is a push parser in the shape of its parts: [`feed`](ChatStream::feed) answers
//! `(bytes consumed, Status<StreamEvent>)`, [`finish`](ChatStream::finish) is the end of the
//! input. All storage is the caller's; nothing allocates, nothing panics, and every way the
//! bytes can be wrong is one [`StreamError`].

use core::fmt;

use http_nostd::{Event as HttpEvent, Head, HttpError, ResponseReader, Status};
use sse_nostd::{Event as SseEvent, Found, Parser, SseError};

use crate::{
    decode_chunk, decode_error_event, AssembleError, Assembler, Chunk, DecodeError, Message,
    Payload, ServerError,
};

/// What one [`ChatStream::feed`] found.
// No allocator to box the chunk, and nearly every event is a chunk anyway.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamEvent<'a> {
    /// The response head, with its status ([`ChatStream::head`] has the rest). A `200`'s body
    /// is the event stream; any other status's body comes as [`ErrorBody`](Self::ErrorBody).
    Head(u16),
    /// A chunk, already folded into the assembler: what to show as it streams.
    Chunk(Chunk<'a>),
    /// A comment, a `retry` or an event of another type: no content, but a sign of life.
    Idle,
    /// `data: [DONE]`: the server has nothing more to say.
    Done,
    /// The server gave up on the request inside the stream (a chunk's `error`, or an
    /// `event: error`, whose data is the message when it is not the error JSON). The stream
    /// is over: later calls return [`StreamError::Server`].
    ServerError(ServerError<'a>),
    /// A piece of the body of a response that is not a `200`, as it arrived.
    ErrorBody(&'a [u8]),
    /// The body is complete; later calls consume nothing and return `End` again.
    End,
}

/// Why a chat response could not be read: the one error of the whole path, each part's own
/// typed error kept as it is. Once returned, every later call returns it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamError {
    /// The HTTP response is malformed or over a cap ([`HttpError`]).
    Http(HttpError),
    /// The event stream is malformed or over the line cap ([`SseError`]).
    Sse(SseError),
    /// A `data:` payload is not a chunk ([`DecodeError`]).
    Decode(DecodeError),
    /// A chunk does not fit the message or contradicts an earlier one ([`AssembleError`]).
    Assemble(AssembleError),
    /// A `200` whose `Content-Type` is not `text/event-stream` (none at all is accepted).
    NotEventStream,
    /// [`finish`](ChatStream::finish) of a response whose status is not `200`.
    Status(u16),
    /// The server reported an error in the stream (its `code`, if it sent one).
    Server(Option<u32>),
    /// An event after `data: [DONE]`.
    AfterDone,
}

impl StreamError {
    /// The variant name, for machine-readable output (`"Sse"`, `"AfterDone"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Http(_) => "Http",
            Self::Sse(_) => "Sse",
            Self::Decode(_) => "Decode",
            Self::Assemble(_) => "Assemble",
            Self::NotEventStream => "NotEventStream",
            Self::Status(_) => "Status",
            Self::Server(_) => "Server",
            Self::AfterDone => "AfterDone",
        }
    }
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(e) => write!(f, "HTTP response: {e}"),
            Self::Sse(e) => write!(f, "event stream: {e}"),
            Self::Decode(e) => write!(f, "chunk: {e}"),
            Self::Assemble(e) => write!(f, "stream: {e}"),
            Self::NotEventStream => f.write_str("a 200 response that is not text/event-stream"),
            Self::Status(s) => write!(f, "HTTP status {s}"),
            Self::Server(Some(code)) => write!(f, "the server reported error {code} in the stream"),
            Self::Server(None) => f.write_str("the server reported an error in the stream"),
            Self::AfterDone => f.write_str("an event after data: [DONE]"),
        }
    }
}

impl core::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Http(e) => Some(e),
            Self::Sse(e) => Some(e),
            Self::Decode(e) => Some(e),
            Self::Assemble(e) => Some(e),
            _ => None,
        }
    }
}

impl From<HttpError> for StreamError {
    fn from(e: HttpError) -> Self {
        Self::Http(e)
    }
}

impl From<SseError> for StreamError {
    fn from(e: SseError) -> Self {
        Self::Sse(e)
    }
}

impl From<DecodeError> for StreamError {
    fn from(e: DecodeError) -> Self {
        Self::Decode(e)
    }
}

impl From<AssembleError> for StreamError {
    fn from(e: AssembleError) -> Self {
        Self::Assemble(e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Stream,
    ErrorBody(u16),
}

/// One chat response, bytes in, the assembled [`Message`] out.
///
/// The caps are the parts' own: `H` bytes of head with at most `F` header fields
/// ([`ResponseReader`]), `L` bytes of SSE line and event ([`Parser`]; the decoder's text buffer
/// has the same `L`, which is always enough for one payload), and the assembler's `C`, `R`,
/// `K` and `A` ([`Assembler`]). The storage is borrowed for `'s`; the stream itself holds only
/// the parts' small state and can live on the stack.
///
/// ```
/// use llama_proto::{Assembler, ChatStream, Status, StreamEvent};
///
/// let wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n\
///     data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
///     data: {\"id\":\"c1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
///     data: [DONE]\n\n";
/// let (mut head, mut line, mut text) = ([0u8; 256], [0u8; 256], [0u8; 256]);
/// let (mut content, mut reasoning, mut args) = ([0u8; 64], [0u8; 64], [[0u8; 64]; 1]);
/// let assembler = Assembler::new(&mut content, &mut reasoning, &mut args);
/// let mut stream = ChatStream::<_, 8, _, _, _, _, _>::new(&mut head, &mut line, &mut text, assembler);
/// let mut shown = Vec::new();
/// for piece in [&wire[..40], &wire[40..]] {
///     let mut rest = piece;
///     loop {
///         let (used, status) = stream.feed(rest).unwrap();
///         rest = &rest[used..];
///         match status {
///             Status::Complete(StreamEvent::Chunk(c)) => shown.extend(c.content.map(String::from)),
///             Status::Complete(_) => {}
///             Status::Partial => break,
///         }
///     }
/// }
/// assert_eq!(shown, ["Hi"]);
/// let message = stream.finish().unwrap();
/// assert_eq!(message.content, Some("Hi"));
/// ```
pub struct ChatStream<
    's,
    const H: usize,
    const F: usize,
    const L: usize,
    const C: usize,
    const R: usize,
    const K: usize,
    const A: usize,
> {
    reader: ResponseReader<&'s mut [u8; H], H, F>,
    parser: Parser<&'s mut [u8; L], L>,
    text: &'s mut [u8; L],
    assembler: Assembler<'s, C, R, K, A>,
    phase: Phase,
    // Decoded body bytes at the start of the next input that the parser has not seen yet (an
    // event ended inside a body slice), and the framing bytes after them that the HTTP reader
    // has consumed already.
    pending: usize,
    skip: usize,
    done: bool,
    ended: bool,
    failed: Option<StreamError>,
}

impl<
        's,
        const H: usize,
        const F: usize,
        const L: usize,
        const C: usize,
        const R: usize,
        const K: usize,
        const A: usize,
    > ChatStream<'s, H, F, L, C, R, K, A>
{
    /// A stream at the start of a response: the head goes into `head`, SSE lines into `line`,
    /// unescaped strings into `text` (their old contents are ignored), and the message into
    /// `assembler`.
    pub fn new(
        head: &'s mut [u8; H],
        line: &'s mut [u8; L],
        text: &'s mut [u8; L],
        assembler: Assembler<'s, C, R, K, A>,
    ) -> Self {
        ChatStream {
            reader: ResponseReader::with_field_cap(head),
            parser: Parser::new(line),
            text,
            assembler,
            phase: Phase::Head,
            pending: 0,
            skip: 0,
            done: false,
            ended: false,
            failed: None,
        }
    }

    /// Consumes a prefix of `input` and says what it found, as every push parser here does:
    /// on [`Status::Partial`] all of `input` was consumed; on [`Status::Complete`] call again
    /// with the input after the bytes consumed (the same bytes a connection would deliver
    /// next: a caller may stop after any event, e.g. to post a control call, and go on later).
    pub fn feed<'a>(
        &'a mut self,
        input: &'a [u8],
    ) -> Result<(usize, Status<StreamEvent<'a>>), StreamError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let mut pos = 0;
        if self.pending > 0 {
            let body = &input[..self.pending.min(input.len())];
            let (used, status) = match self.parser.advance(body) {
                Ok(r) => r,
                Err(e) => return Err(*self.failed.insert(e.into())),
            };
            if let Status::Complete(found) = status {
                self.pending -= used;
                return self.on_event(found, body, used);
            }
            self.pending -= body.len();
            pos = body.len();
            if self.pending > 0 {
                return Ok((pos, Status::Partial));
            }
        }
        let skipped = self.skip.min(input.len() - pos);
        self.skip -= skipped;
        pos += skipped;
        loop {
            let (used, status) = match self.reader.feed(&input[pos..]) {
                Ok(r) => r,
                Err(e) => return Err(*self.failed.insert(e.into())),
            };
            pos += used;
            let body = match status {
                Status::Partial => return Ok((pos, Status::Partial)),
                Status::Complete(HttpEvent::Head) => return self.on_head(pos),
                Status::Complete(HttpEvent::End) => return self.on_end(pos),
                Status::Complete(HttpEvent::Body(body)) => body,
            };
            if let Phase::ErrorBody(_) = self.phase {
                return Ok((pos, Status::Complete(StreamEvent::ErrorBody(body))));
            }
            let (parsed, status) = match self.parser.advance(body) {
                Ok(r) => r,
                Err(e) => return Err(*self.failed.insert(e.into())),
            };
            if let Status::Complete(found) = status {
                // Where the body slice lies in `input` (http-nostd hands out slices of it).
                let at = (body.as_ptr() as usize).saturating_sub(input.as_ptr() as usize);
                let body_end = at + body.len();
                if parsed < body.len() {
                    // The event ended inside the slice: the caller hands the rest back.
                    self.pending = body.len() - parsed;
                    self.skip = pos.saturating_sub(body_end);
                    pos = at + parsed;
                }
                return self.on_event(found, body, pos);
            }
        }
    }

    /// The input ended (the server closed the connection): the finished message.
    ///
    /// A body cut off after the chunk with the `finish_reason` still gives the message (the
    /// answer is whole; only `[DONE]` or the end of the chunked framing is missing). A
    /// response that is not a `200` is [`StreamError::Status`].
    pub fn finish(&mut self) -> Result<Message<'_>, StreamError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if !self.ended {
            match self.reader.finish() {
                // A body read to the close ends here.
                Ok(()) if self.phase == Phase::Stream => {
                    if let Err(e) = self.parser.finish() {
                        return Err(*self.failed.insert(e.into()));
                    }
                }
                Ok(()) => {}
                Err(HttpError::Truncated) if self.assembler.finish_reason().is_some() => {}
                Err(e) => return Err(*self.failed.insert(e.into())),
            }
            self.ended = true;
        }
        if let Phase::ErrorBody(status) = self.phase {
            return Err(StreamError::Status(status));
        }
        self.assembler.finish().map_err(StreamError::Assemble)
    }

    /// The response head, once [`StreamEvent::Head`] was returned.
    pub fn head(&self) -> Option<Head<'_>> {
        self.reader.head()
    }

    /// The message so far (its id, reasoning tokens, finish reason, partial content).
    pub fn assembler(&self) -> &Assembler<'s, C, R, K, A> {
        &self.assembler
    }

    /// True once `data: [DONE]` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Hands the caller's storage back as [`new`](Self::new) took it, for the next response
    /// (`new` ignores what the buffers hold; [`Assembler::into_storage`] frees the message's),
    /// so a caller that keeps one set of buffers reads response after response, as each part
    /// (`ResponseReader`, `Parser`, `Assembler`) already allows.
    #[allow(clippy::type_complexity)]
    pub fn into_storage(
        self,
    ) -> (
        &'s mut [u8; H],
        &'s mut [u8; L],
        &'s mut [u8; L],
        Assembler<'s, C, R, K, A>,
    ) {
        (
            self.reader.into_storage(),
            self.parser.into_storage(),
            self.text,
            self.assembler,
        )
    }

    fn on_head<'a>(
        &'a mut self,
        pos: usize,
    ) -> Result<(usize, Status<StreamEvent<'a>>), StreamError> {
        let (status, event_stream) = self.reader.head().map_or((0, false), |h| {
            // No Content-Type at all is taken as the stream a 200 to a streamed request is.
            let sse = h.header("content-type").is_none_or(|media| {
                let prefix = b"text/event-stream";
                media.len() >= prefix.len() && media[..prefix.len()].eq_ignore_ascii_case(prefix)
            });
            (h.status(), sse)
        });
        self.phase = match status {
            200 if event_stream => Phase::Stream,
            200 => return Err(*self.failed.insert(StreamError::NotEventStream)),
            _ => Phase::ErrorBody(status),
        };
        Ok((pos, Status::Complete(StreamEvent::Head(status))))
    }

    fn on_end<'a>(
        &'a mut self,
        pos: usize,
    ) -> Result<(usize, Status<StreamEvent<'a>>), StreamError> {
        if self.phase == Phase::Stream && !self.ended {
            if let Err(e) = self.parser.finish() {
                return Err(*self.failed.insert(e.into()));
            }
        }
        self.ended = true;
        Ok((pos, Status::Complete(StreamEvent::End)))
    }

    /// The event `found` in `body`: decoded, folded in, and handed out with `used`.
    // Out of line: its decode frames must not add to `feed`'s own.
    #[inline(never)]
    fn on_event<'a>(
        &'a mut self,
        found: Found,
        body: &'a [u8],
        used: usize,
    ) -> Result<(usize, Status<StreamEvent<'a>>), StreamError> {
        let SseEvent::Message(m) = self.parser.event(found, body) else {
            return Ok((used, Status::Complete(StreamEvent::Idle)));
        };
        if self.done {
            return Err(*self.failed.insert(StreamError::AfterDone));
        }
        let event = if m.event == b"error" {
            let e = match decode_error_event(m.data, &mut self.text[..]) {
                Ok(e) => e,
                // The event's type says it is the server's error even when its data is not
                // the error JSON: the data (its UTF-8 part) is the message.
                Err(_) => ServerError {
                    code: None,
                    kind: None,
                    message: utf8_prefix(m.data),
                },
            };
            self.failed = Some(StreamError::Server(e.code));
            StreamEvent::ServerError(e)
        } else if m.event != b"message" {
            StreamEvent::Idle
        } else if sse_nostd::is_done(m.data) {
            self.done = true;
            StreamEvent::Done
        } else {
            match decode_chunk(m.data, &mut self.text[..]) {
                Ok(Payload::Chunk(c)) => match self.assembler.push(&c) {
                    Ok(()) => StreamEvent::Chunk(c),
                    Err(e) => return Err(*self.failed.insert(e.into())),
                },
                Ok(Payload::Error(e)) => {
                    self.failed = Some(StreamError::Server(e.code));
                    StreamEvent::ServerError(e)
                }
                Err(e) => return Err(*self.failed.insert(e.into())),
            }
        };
        Ok((used, Status::Complete(event)))
    }
}

/// The longest prefix of `bytes` that is UTF-8.
fn utf8_prefix(bytes: &[u8]) -> &str {
    match core::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
    }
}

impl<
        const H: usize,
        const F: usize,
        const L: usize,
        const C: usize,
        const R: usize,
        const K: usize,
        const A: usize,
    > fmt::Debug for ChatStream<'_, H, F, L, C, R, K, A>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatStream")
            .field("phase", &self.phase)
            .field("done", &self.done)
            .field("ended", &self.ended)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}
