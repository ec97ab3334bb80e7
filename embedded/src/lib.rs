//! The no_std path on a small device: a recorded llama-server response through
//! `llama-proto`'s `ChatStream` (`http-nostd` -> `sse-nostd` -> decoder -> assembler), with the
//! caps a small host picks.
//!
//! Shared by the images in `src/bin/`: `check` (what `make embedded` runs under QEMU), `path`
//! (the path alone, for its flash and RAM), `baseline` (the runtime alone, subtracted from the
//! others) and `httparse_head` (httparse alone parsing the same head: the anchor).
#![no_std]

use http_nostd::ResponseReader;
use llama_proto::{Assembler, ChatStream, Status, StreamError, StreamEvent};
use sse_nostd::Parser;

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

/// The layers alone, for the images that size them one at a time (`http`, `http_sse`).
pub type Reader<'b> = ResponseReader<&'b mut [u8; HEAD_CAP], HEAD_CAP, HEADER_FIELDS>;
pub type Sse<'b> = Parser<&'b mut [u8; LINE_CAP], LINE_CAP>;

impl Buffers {
    /// The whole path over these buffers, at the start of a response.
    pub fn stream(&mut self) -> Path<'_> {
        let assembler = Assembler::new(&mut self.content, &mut self.reasoning, &mut self.args);
        ChatStream::new(&mut self.head, &mut self.line, &mut self.text, assembler)
    }
}

/// `llama-proto`'s `ChatStream` with this host's caps: the whole path, HTTP to message.
pub type Path<'b> = ChatStream<
    'b,
    HEAD_CAP,
    HEADER_FIELDS,
    LINE_CAP,
    CONTENT_CAP,
    REASONING_CAP,
    CALLS_CAP,
    ARGS_CAP,
>;

/// What the stream looked like, besides the message the stream's assembler holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stream {
    pub status: u16,
    /// Chunks and `[DONE]`.
    pub events: usize,
    pub done: bool,
}

/// Runs `input`, a whole recorded response, through the path in reads of `read` bytes (as a
/// socket would deliver it); the finished message is left in `stream`'s assembler.
pub fn run(input: &[u8], read: usize, stream: &mut Path<'_>) -> Result<Stream, StreamError> {
    let mut seen = Stream::default();
    'reads: for piece in input.chunks(read.max(1)) {
        let mut rest = piece;
        loop {
            let (used, status) = stream.feed(rest)?;
            rest = &rest[used..];
            match status {
                Status::Partial => break,
                Status::Complete(StreamEvent::Head(s)) => seen.status = s,
                Status::Complete(StreamEvent::Chunk(_) | StreamEvent::Done) => seen.events += 1,
                Status::Complete(StreamEvent::ServerError(e)) => {
                    return Err(StreamError::Server(e.code))
                }
                Status::Complete(StreamEvent::End) => break 'reads,
                Status::Complete(_) => {}
            }
        }
    }
    // The message is the caller's to check (`stream.assembler().finish()`): a path that
    // accepted every byte but ended without a `finish_reason` is still the path's success.
    match stream.finish() {
        Ok(_) | Err(StreamError::Assemble(_)) => {}
        Err(e) => return Err(e),
    }
    seen.done = stream.is_done();
    Ok(seen)
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
