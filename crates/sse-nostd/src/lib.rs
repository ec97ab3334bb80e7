//! A `no_std`, no-`alloc`, sans-IO parser for `text/event-stream` (server-sent events).
//!
//! Feed it bytes split anywhere with [`Parser::feed`], which answers in the shape of every push
//! parser here, `(bytes consumed, `[`Status`]`)`; take out [`Event`]s that borrow its buffer or
//! your input; call [`Parser::finish`] at the end of the stream. It follows the
//! [WHATWG event-stream interpretation rules]:
//!
//! - lines end in LF, CR or CRLF, also when the CR and the LF arrive in different reads;
//! - a UTF-8 BOM at the very start is skipped (elsewhere it is content);
//! - a line starting with `:` is a comment, reported as [`Event::Comment`] (any byte is a
//!   sign of life to a client watching for stalls);
//! - `field:value` loses one space after the colon; a line without a colon is a field with an
//!   empty value; `data` values are joined with `\n`; an empty line dispatches the event as
//!   [`Event::Message`] if a `data` line was seen, and starts a new event either way;
//! - `event` sets the event type, `id` the last event ID (ignored when it contains NUL; it
//!   persists across events), `retry` with only ASCII digits is reported as [`Event::Retry`];
//!   other fields are ignored;
//! - a stream that ends inside an event is [`SseError::Unterminated`]: never dispatched,
//!   never silently dropped.
//!
//! The buffer is one caller-provided `[u8; N]`; a line or event over it is an error value,
//! never a panic and never a truncated event. [`EventReader`] adds a pull API over any
//! [`embedded_io::Read`]. [`is_done`] recognises llama-server's final `data: [DONE]`.
//!
//! Parsing is byte-based: values are handed out as bytes, and decoding them (UTF-8 with
//! replacement, as browsers do) is the caller's choice. CR and LF never occur inside a UTF-8
//! multi-byte sequence, so lines split the same way either side of decoding.
//!
//! [WHATWG event-stream interpretation rules]: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(any(test, feature = "std"))]
extern crate std;

mod error;
mod event;
mod moves;
mod parser;
mod read;
#[cfg(test)]
mod tests;

// The shared test helper names the crate as its users do.
#[cfg(test)]
extern crate self as sse_nostd;

pub use error::SseError;
pub use event::{is_done, Event, Message};
/// What one call of a push parser found: httparse's own `Status`, the one type every push
/// parser of these crates (`sse-nostd`, `http-nostd`, `llama-proto`) returns, with the count
/// of input bytes consumed: `(usize, Status<T>)`. `Complete(t)`: call again with the input
/// after the bytes consumed; `Partial` is not an error and means all of the input was consumed.
pub use httparse::Status;
pub use parser::{Found, Parser};
pub use read::{EventReader, ReadError};
