//! The no_std path on a small device: a recorded llama-server response through
//! `http-nostd` -> `sse-nostd` -> `llama-proto`, with the caps a small host picks.
//!
//! Shared by the images in `src/bin/`: `check` (what `make embedded` runs under QEMU), `path`
//! (the path alone, for its flash and RAM), `baseline` (the runtime alone, subtracted from the
//! others) and `httparse_head` (httparse alone parsing the same head: the anchor).
#![no_std]

use http_nostd::{Event as HttpEvent, Framing, HttpError, ResponseReader, Status};
use llama_proto::{
    decode_chunk, decode_error_event, AssembleError, Assembler, DecodeError, Payload,
};
use sse_nostd::{Event as SseEvent, Parser, SseError};

/// The expected answer, computed on the host from the same fixture by `build.rs`.
pub mod expected {
    include!(concat!(env!("OUT_DIR"), "/expected.rs"));
}

/// The HTTP head buffer (and trailer cap): llama-server's head is under 200 bytes.
pub const HEAD_CAP: usize = 512;
/// Header fields a head may hold (llama-server sends 7).
pub const HEADER_FIELDS: usize = 16;
/// The SSE buffer: the longest line, and an event's data next to it. llama-server's chunks
/// with `timings_per_token` run to about 620 bytes.
pub const LINE_CAP: usize = 1024;
/// The decoder's buffer for unescaped strings; the line cap always suffices.
pub const TEXT_CAP: usize = LINE_CAP;
/// The assembler: content and reasoning bytes, tool calls, argument bytes per call.
pub const CONTENT_CAP: usize = 256;
pub const REASONING_CAP: usize = 256;
pub const CALLS_CAP: usize = 2;
pub const ARGS_CAP: usize = 128;

/// Every buffer the path needs, all of it the caller's: a `static` in the images.
pub struct Buffers {
    pub head: [u8; HEAD_CAP],
    pub line: [u8; LINE_CAP],
    pub text: [u8; TEXT_CAP],
    pub content: [u8; CONTENT_CAP],
    pub reasoning: [u8; REASONING_CAP],
    pub args: [[u8; ARGS_CAP]; CALLS_CAP],
}

impl Buffers {
    pub const ZERO: Buffers = Buffers {
        head: [0; HEAD_CAP],
        line: [0; LINE_CAP],
        text: [0; TEXT_CAP],
        content: [0; CONTENT_CAP],
        reasoning: [0; REASONING_CAP],
        args: [[0; ARGS_CAP]; CALLS_CAP],
    };
}

pub type Asm<'b> = Assembler<'b, CONTENT_CAP, REASONING_CAP, CALLS_CAP, ARGS_CAP>;
pub type Reader<'b> = ResponseReader<&'b mut [u8; HEAD_CAP], HEAD_CAP, HEADER_FIELDS>;
pub type Sse<'b> = Parser<&'b mut [u8; LINE_CAP], LINE_CAP>;

/// Why the path gave up, each layer's typed error kept as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    Http(HttpError),
    Sse(SseError),
    Decode(DecodeError),
    Assemble(AssembleError),
    /// Not a `200` with a chunked (or otherwise delimited) `text/event-stream` body.
    NotAStream(u16),
    /// The server sent an error inside the stream.
    ServerError,
    /// A payload after `[DONE]`, or the stream ended without it.
    Done(bool),
}

impl From<HttpError> for PathError {
    fn from(e: HttpError) -> Self {
        PathError::Http(e)
    }
}
impl From<SseError> for PathError {
    fn from(e: SseError) -> Self {
        PathError::Sse(e)
    }
}
impl From<DecodeError> for PathError {
    fn from(e: DecodeError) -> Self {
        PathError::Decode(e)
    }
}
impl From<AssembleError> for PathError {
    fn from(e: AssembleError) -> Self {
        PathError::Assemble(e)
    }
}

/// What the stream looked like, besides the message the assembler holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stream {
    pub status: u16,
    pub events: usize,
    pub done: bool,
    pub body_len: usize,
}

/// Runs `input`, a whole recorded response, through the path in reads of `read` bytes (as a
/// socket would deliver it); the finished message is left in `asm`.
pub fn run(
    input: &[u8],
    read: usize,
    reader: &mut Reader<'_>,
    sse: &mut Sse<'_>,
    text: &mut [u8; TEXT_CAP],
    asm: &mut Asm<'_>,
) -> Result<Stream, PathError> {
    let mut stream = Stream::default();
    'reads: for piece in input.chunks(read.max(1)) {
        let mut rest = piece;
        loop {
            let (used, event) = reader.feed(rest)?;
            rest = &rest[used..];
            match event {
                Status::Partial => break,
                Status::Complete(HttpEvent::Head) => {
                    let head = reader.head().ok_or(PathError::NotAStream(0))?;
                    stream.status = head.status();
                    let sse_type = head
                        .header("content-type")
                        .is_some_and(|v| v.starts_with(b"text/event-stream"));
                    if head.status() != 200 || !sse_type || head.framing() == Framing::None {
                        return Err(PathError::NotAStream(head.status()));
                    }
                }
                Status::Complete(HttpEvent::Body(bytes)) => {
                    stream.body_len += bytes.len();
                    events(bytes, sse, text, asm, &mut stream)?;
                }
                Status::Complete(HttpEvent::End) => break 'reads,
            }
        }
    }
    reader.finish()?;
    sse.finish()?;
    if !stream.done {
        return Err(PathError::Done(false));
    }
    Ok(stream)
}

/// Feeds one slice of the body to the SSE parser and every event it completes to the decoder
/// and the assembler.
fn events(
    mut bytes: &[u8],
    sse: &mut Sse<'_>,
    text: &mut [u8; TEXT_CAP],
    asm: &mut Asm<'_>,
    stream: &mut Stream,
) -> Result<(), PathError> {
    loop {
        let (used, event) = sse.feed(bytes)?;
        let Status::Complete(event) = event else {
            return Ok(());
        };
        if let SseEvent::Message(m) = event {
            stream.events += 1;
            if stream.done {
                return Err(PathError::Done(true));
            }
            if m.event == b"error" {
                decode_error_event(m.data, text)?;
                return Err(PathError::ServerError);
            }
            if sse_nostd::is_done(m.data) {
                stream.done = true;
            } else {
                match decode_chunk(m.data, text)? {
                    Payload::Chunk(c) => asm.push(&c)?,
                    Payload::Error(_) => return Err(PathError::ServerError),
                }
            }
        }
        bytes = &bytes[used..];
    }
}

/// Ends the run: exit status 0 or 1 through semihosting (QEMU exits with it).
pub fn exit(ok: bool) -> ! {
    use cortex_m_semihosting::debug;
    debug::exit(if ok {
        debug::EXIT_SUCCESS
    } else {
        debug::EXIT_FAILURE
    });
    // Only reached without a semihosting host: sleep.
    loop {
        cortex_m::asm::wfi();
    }
}

/// Stack measurement by painting. cortex-m-rt's `paint-stack` feature fills the whole stack
/// (`_stack_end` to `_stack_start`) with [`PAINT`] before `main`, and [`high_water`] reads
/// the mark since boot; [`measure`] paints what lies below the caller again and reads what one
/// call used.
pub mod stack {
    /// cortex-m-rt's `STACK_PAINT_VALUE`.
    pub const PAINT: u32 = 0xCCCC_CCCC;

    extern "C" {
        static _stack_start: u32;
        static _stack_end: u32;
    }

    /// The top of the stack (its initial pointer) and its lowest address.
    pub fn bounds() -> (usize, usize) {
        // Only the addresses of the linker's symbols are taken, never their contents.
        (
            &raw const _stack_start as usize,
            &raw const _stack_end as usize,
        )
    }

    use core::sync::atomic::{AtomicUsize, Ordering};

    /// The deepest mark seen before a [`measure`] painted over it.
    static DEEPEST: AtomicUsize = AtomicUsize::new(0);

    /// Bytes of stack ever used since boot: from the top down to the lowest word that no longer
    /// holds the paint, or deeper if a [`measure`] painted over a deeper mark.
    pub fn high_water() -> usize {
        mark().max(DEEPEST.load(Ordering::Relaxed))
    }

    /// Bytes of stack used since the last paint.
    #[inline(never)]
    fn mark() -> usize {
        let (top, end) = bounds();
        let mut p = end;
        while p < top {
            // SAFETY: `p` is a word of this image's stack region, below the live stack or in it.
            if unsafe { core::ptr::read_volatile(p as *const u32) } != PAINT {
                break;
            }
            p += 4;
        }
        top - p
    }

    /// Runs `f` on freshly painted stack; returns its result and the bytes of stack it used
    /// below this function's frame (its own frames, and everything it called).
    #[inline(never)]
    pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
        DEEPEST.fetch_max(mark(), Ordering::Relaxed);
        let (_, end) = bounds();
        let sp = cortex_m::register::msp::read() as usize;
        // Nothing lives below the stack pointer (no interrupts are enabled): paint it all. The
        // loop calls nothing, so it keeps to registers and this frame.
        let mut p = end;
        while p < sp {
            // SAFETY: the words below the live stack belong to no frame.
            unsafe { core::ptr::write_volatile(p as *mut u32, PAINT) };
            p += 4;
        }
        // Through a frame of its own: were `f` inlined here, its locals would sit in this
        // frame, above `sp`, and go uncounted.
        let r = call(f);
        let mut low = end;
        while low < sp {
            // SAFETY: as above; only read.
            if unsafe { core::ptr::read_volatile(low as *const u32) } != PAINT {
                break;
            }
            low += 4;
        }
        (r, sp - low)
    }

    #[inline(never)]
    fn call<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}
