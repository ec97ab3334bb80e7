//! The event-stream cap loopd gives `sse-nostd`'s parser inside its `ChatStream`
//! ([`llama::assemble`](crate::llama)); the parsing itself is the stream's.

/// The parser's buffer: the M2a design's 1 MiB cap per SSE line (section 4, "Size caps"). A
/// line or event over it is the parser's `SseError`.
pub const SSE_CAP: usize = 1024 * 1024;
