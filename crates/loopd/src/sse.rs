//! Turns body pieces into the `data:` payloads of an event stream.
//!
//! [`EventStream`] wraps `sse-nostd` with a [`SSE_CAP`] (1 MiB) heap buffer: lines split across
//! reads, CRLF and comment lines are the parser's business; this module sorts what comes out
//! into [`Item`]s and recognises llama-server's `[DONE]`. A line or event over the cap is the
//! parser's [`SseError`].

use sse_nostd::{Event, Parser, SseError, Status};

/// The parser's buffer: the M2a design's 1 MiB cap per SSE line (section 4, "Size caps").
pub const SSE_CAP: usize = 1024 * 1024;

/// One thing the stream said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// The data of an event of the default type.
    Data(&'a [u8]),
    /// The data of an `event: error` event (an older llama-server form of an error).
    Error(&'a [u8]),
    /// `data: [DONE]`: the server has nothing more to say.
    Done,
    /// A comment or another field: a sign of life only.
    Other,
}

/// An event-stream parser with a 1 MiB line and event cap on the heap.
pub struct EventStream {
    parser: Parser<Box<[u8; SSE_CAP]>, SSE_CAP>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl Default for EventStream {
    fn default() -> Self {
        Self::new()
    }
}

impl EventStream {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        EventStream {
            parser: Parser::new(crate::heap::array::<SSE_CAP>()),
        }
    }

    /// Parses from the start of `piece` up to the next item: the bytes consumed, and the item
    /// if one completed (`None` means all of `piece` was consumed and more is needed).
    pub fn next<'a>(&'a mut self, piece: &'a [u8]) -> Result<(usize, Option<Item<'a>>), SseError> {
        let (used, status) = self.parser.feed(piece)?;
        let item = match status {
            Status::Partial => None,
            Status::Complete(Event::Message(m)) if m.event == b"error" => Some(Item::Error(m.data)),
            Status::Complete(Event::Message(m)) if sse_nostd::is_done(m.data) => Some(Item::Done),
            Status::Complete(Event::Message(m)) => Some(Item::Data(m.data)),
            Status::Complete(_) => Some(Item::Other),
        };
        Ok((used, item))
    }

    /// Declares the end of the stream: an event cut off inside is [`SseError::Unterminated`].
    pub fn finish(&mut self) -> Result<(), SseError> {
        self.parser.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(pieces: &[&[u8]]) -> Result<Vec<String>, SseError> {
        let mut s = EventStream::new();
        let mut out = Vec::new();
        for p in pieces {
            let mut p: &[u8] = p;
            loop {
                let (used, item) = s.next(p)?;
                let Some(item) = item else { break };
                out.push(match item {
                    Item::Data(d) => format!("data {}", String::from_utf8_lossy(d)),
                    Item::Error(d) => format!("error {}", String::from_utf8_lossy(d)),
                    Item::Done => "done".into(),
                    Item::Other => "other".into(),
                });
                p = &p[used..];
            }
        }
        s.finish()?;
        Ok(out)
    }

    #[test]
    fn payloads_comments_and_done_split_anywhere() {
        let all: &[u8] = b": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: error\ndata: {\"code\":500}\n\ndata: [DONE]\n\n";
        let want = ["other", "data {\"a\":1}", "error {\"code\":500}", "done"];
        assert_eq!(items(&[all]).unwrap(), want);
        for cut in 0..all.len() {
            assert_eq!(
                items(&[&all[..cut], &all[cut..]]).unwrap(),
                want,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn cut_off_event_is_unterminated() {
        assert_eq!(items(&[b"data: {\"a\""]), Err(SseError::Unterminated));
    }

    #[test]
    fn line_cap_is_1_mib() {
        // A `data:` line of exactly SSE_CAP bytes (without its line end) is accepted.
        let line = |len: usize| {
            let mut l = b"data: ".to_vec();
            l.resize(len, b'x');
            l.extend_from_slice(b"\n\n");
            l
        };
        assert_eq!(items(&[&line(SSE_CAP)]).map(|v| v.len()), Ok(1));
        assert_eq!(items(&[&line(SSE_CAP + 1)]), Err(SseError::LineTooLong));
    }
}
