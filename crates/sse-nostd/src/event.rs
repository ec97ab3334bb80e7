//! What the parser hands out: events borrowing its buffer or the caller's input.

/// One thing the stream said.
///
/// Only [`Event::Message`] is an event in the WHATWG sense; comments and `retry` are reported
/// too because a client needs them (any byte is a sign of life; `retry` sets the reconnection
/// delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event<'a> {
    /// A dispatched event: an empty line after at least one `data` line.
    Message(Message<'a>),
    /// A comment line: everything after the leading `:` (a space after it is kept).
    Comment(&'a [u8]),
    /// A `retry` field whose value is all ASCII digits: the reconnection time in milliseconds,
    /// saturating at `u64::MAX`.
    Retry(u64),
}

/// A dispatched event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message<'a> {
    /// The event type: the last `event` field's value, or `b"message"` when none was set (or
    /// it was set to the empty string).
    pub event: &'a [u8],
    /// The `data` lines' values joined with `\n`, without a final `\n`.
    pub data: &'a [u8],
    /// The last event ID: the value of the last `id` field without a NUL seen so far in the
    /// stream (it persists across events), empty if none.
    pub id: &'a [u8],
}

/// True when `data` is llama-server's end-of-stream marker, `[DONE]` (sent as `data: [DONE]`).
///
/// ```
/// assert!(sse_nostd::is_done(b"[DONE]"));
/// assert!(!sse_nostd::is_done(b"{\"choices\":[]}"));
/// ```
pub fn is_done(data: &[u8]) -> bool {
    data == b"[DONE]"
}
