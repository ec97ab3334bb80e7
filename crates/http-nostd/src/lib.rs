//! Sans-IO reader for one HTTP/1.1 (or 1.0) response: `no_std`, no `alloc`, no panics.
//!
//! Feed it bytes as they arrive, split anywhere; it gives back the head and the decoded body, in
//! the shape of every push parser here: `(bytes consumed, `[`Status`]`)`.
//! httparse tokenizes the head and the chunk-size lines; the framing (RFC 9112 6.3), the caps and
//! the body state machine are this crate's.
//!
//! - The head is gathered in a caller-provided buffer of `H` bytes ([`HEAD_CAP`], 16 KiB), with
//!   at most `F` header fields ([`MAX_HEADERS`], 64; [`ResponseReader::with_field_cap`]).
//! - The body comes out as slices of the caller's input ([`Event::Body`], no copy; for SSE) or is
//!   collected into a [`BodyBuffer`] of `N` bytes ([`BODY_CAP`], 4 MiB; for JSON).
//! - Large buffers are always the caller's storage, so none is ever built on the stack.
//! - [`BodyReader`] pulls the same from any [`embedded_io::Read`]: the head, then the decoded
//!   body as an `embedded_io::Read` itself (for `sse-nostd`'s `EventReader`, say).
//!
//! ```
//! use http_nostd::{Event, Framing, ResponseReader, Status, HEAD_CAP};
//!
//! let mut head_buf = [0u8; HEAD_CAP];
//! let mut reader = ResponseReader::new(&mut head_buf);
//! let input = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
//! let (mut pos, mut body) = (0, [0u8; 5]);
//! let mut body_len = 0;
//! loop {
//!     let (used, event) = reader.feed(&input[pos..]).unwrap();
//!     pos += used;
//!     match event {
//!         Status::Complete(Event::Head) => {
//!             assert_eq!(reader.head().unwrap().framing(), Framing::Chunked)
//!         }
//!         Status::Complete(Event::Body(bytes)) => {
//!             body[body_len..body_len + bytes.len()].copy_from_slice(bytes);
//!             body_len += bytes.len();
//!         }
//!         Status::Complete(Event::End) => break,
//!         Status::Partial => unreachable!("the whole response was given"),
//!     }
//! }
//! assert_eq!(&body, b"hello");
//! assert_eq!(reader.finish(), Ok(()));
//! ```
//!
//! Collecting a JSON body into 4 MiB of heap storage that never passed through the stack, reading
//! from any `std::io::Read` (a `UnixStream` in loopd):
//!
//! ```
//! use std::io::Read;
//! use http_nostd::{BodyBuffer, ResponseReader, Status, BODY_CAP, HEAD_CAP};
//!
//! fn fetch(mut conn: impl Read) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
//!     let head: Box<[u8; HEAD_CAP]> = vec![0; HEAD_CAP].into_boxed_slice().try_into().unwrap();
//!     let body: Box<[u8; BODY_CAP]> = vec![0; BODY_CAP].into_boxed_slice().try_into().unwrap();
//!     let (mut reader, mut body) = (ResponseReader::new(head), BodyBuffer::new(body));
//!     let mut buf = [0u8; 4096];
//!     loop {
//!         let n = conn.read(&mut buf)?;
//!         if n == 0 {
//!             reader.finish()?; // Ok only if the body was complete (Truncated otherwise)
//!             break;
//!         }
//!         // feed_into consumes all of `buf[..n]` unless the body ended inside it.
//!         if reader.feed_into(&buf[..n], &mut body)?.1 == Status::Complete(()) {
//!             break;
//!         }
//!     }
//!     let status = reader.head().map_or(0, |h| h.status());
//!     Ok((status, body.as_bytes().to_vec()))
//! }
//!
//! let wire = &b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"[..];
//! assert_eq!(fetch(wire).unwrap(), (200, br#"{"ok":true}"#.to_vec()));
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(test)]
extern crate std;

mod body;
mod chunked;
mod error;
mod framing;
mod head;
mod read;
mod reader;
#[cfg(test)]
mod tests;

pub use body::BodyBuffer;
pub use chunked::{Chunk, ChunkedDecoder};
pub use error::HttpError;
pub use framing::Framing;
pub use head::{Head, Version};
/// What one call of a push parser found: httparse's own `Status`, the one type every push
/// parser of these crates (`sse-nostd`, `http-nostd`, `llama-proto`) returns, with the count
/// of input bytes consumed: `(usize, Status<T>)`. `Complete(t)`: call again with the input
/// after the bytes consumed; `Partial` is not an error and means all of the input was consumed.
pub use httparse::Status;
pub use read::{BodyReader, ReadError};
pub use reader::{Event, ResponseReader};

/// The head buffer size the design uses: 16 KiB of status line and headers.
pub const HEAD_CAP: usize = 16 * 1024;

/// The body buffer size the design uses for bodies that are not streams: 4 MiB.
pub const BODY_CAP: usize = 4 * 1024 * 1024;

/// The header field cap the design uses: at most 64 fields in a head (httparse needs a fixed
/// slot array). A reader's `F` sets its own.
pub const MAX_HEADERS: usize = 64;

/// At most this many interim (1xx) responses are skipped before the final one.
pub const MAX_INTERIM_RESPONSES: usize = 16;

/// A chunk-size line, extensions and CRLF included, is at most this long.
pub const CHUNK_LINE_CAP: usize = 1024;

/// A chunk size has at most this many hex digits (60 bits; leading zeros count).
pub const MAX_CHUNK_SIZE_DIGITS: usize = 15;
