//! The one error type of the parser: what was wrong with the stream.

use core::fmt;

/// Why the parser refused a stream.
///
/// Every variant is final for the stream: once [`Parser::feed`](crate::Parser::feed) has
/// returned an error, it returns the same error again until [`Parser::reset`](crate::Parser::reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SseError {
    /// One line (without its line end) is longer than the buffer capacity `N`.
    LineTooLong,
    /// A line fits the buffer on its own, but not together with what the buffer already holds
    /// for the current event: its data so far, its event type and the last event ID.
    EventTooLarge,
    /// The stream ended inside an event: after a field line with no empty line following it,
    /// or in the middle of a line. The open event was not dispatched.
    Unterminated,
}

impl SseError {
    /// The variant's name, e.g. `"LineTooLong"`, for logs and machine-readable output.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LineTooLong => "LineTooLong",
            Self::EventTooLarge => "EventTooLarge",
            Self::Unterminated => "Unterminated",
        }
    }
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LineTooLong => "event-stream line longer than the parser's buffer",
            Self::EventTooLarge => {
                "event-stream event (data, event type, last id and current line) larger than the parser's buffer"
            }
            Self::Unterminated => "event stream ended inside an event (no empty line after it)",
        })
    }
}

impl core::error::Error for SseError {}

#[cfg(feature = "std")]
impl From<SseError> for std::io::Error {
    fn from(e: SseError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}
