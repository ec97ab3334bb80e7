//! Turns body pieces into the `data:` payloads of an event stream.
//!
//! [`EventStream`] wraps `sse-nostd` with a [`SSE_CAP`] (1 MiB) heap buffer: lines split across
//! reads, CRLF and comment lines are the parser's business; this module sorts what comes out
//! into [`Item`]s and recognises llama-server's `[DONE]`. A line or event over the cap is
//! [`InferError::Protocol`].

use sse_nostd::{Event, Parser, SseError};

pub use sse_nostd::LOOPD_CAP as SSE_CAP;

use crate::http::heap_array;
use crate::llama::InferError;
#[cfg(test)]
use crate::llama::Silence;

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

fn protocol(e: SseError) -> InferError {
    InferError::from(e)
}

impl EventStream {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        EventStream {
            parser: Parser::new(heap_array::<SSE_CAP>()),
        }
    }

    /// Parses one body piece, calling `on_item` for each item in it, in order. Stops at the
    /// first error `on_item` returns.
    pub fn feed<E: From<InferError>>(
        &mut self,
        mut piece: &[u8],
        on_item: &mut dyn FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        loop {
            let (used, event) = self.parser.feed(piece).map_err(|e| E::from(protocol(e)))?;
            let item = match event {
                None => return Ok(()),
                Some(Event::Message(m)) if m.event == b"error" => Item::Error(m.data),
                Some(Event::Message(m)) if sse_nostd::is_done(m.data) => Item::Done,
                Some(Event::Message(m)) => Item::Data(m.data),
                Some(_) => Item::Other,
            };
            on_item(item)?;
            piece = &piece[used..];
        }
    }

    /// Declares the end of the stream: an event cut off inside is [`InferError::Protocol`].
    pub fn finish(&mut self) -> Result<(), InferError> {
        self.parser.finish().map_err(protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::ProtocolError;

    fn items(pieces: &[&[u8]]) -> Result<Vec<String>, InferError> {
        let mut s = EventStream::new();
        let mut out = Vec::new();
        for p in pieces {
            s.feed(p, &mut |item| -> Result<(), InferError> {
                out.push(match item {
                    Item::Data(d) => format!("data {}", String::from_utf8_lossy(d)),
                    Item::Error(d) => format!("error {}", String::from_utf8_lossy(d)),
                    Item::Done => "done".into(),
                    Item::Other => "other".into(),
                });
                Ok(())
            })?;
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
    fn cut_off_event_is_a_protocol_error() {
        assert!(matches!(
            items(&[b"data: {\"a\""]),
            Err(InferError::Protocol(_))
        ));
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
        assert_eq!(items(&[&line(SSE_CAP)]).map(|v| v.len()).ok(), Some(1));
        let e = items(&[&line(SSE_CAP + 1)]).map(|v| v.len());
        assert!(
            matches!(
                e,
                Err(InferError::Protocol(ProtocolError::Sse(
                    SseError::LineTooLong
                )))
            ),
            "{e:?}"
        );
    }

    #[test]
    fn an_error_from_the_callback_stops_the_feed() {
        let mut s = EventStream::new();
        let mut seen = 0;
        let r = s.feed(b"data: 1\n\ndata: 2\n\n", &mut |_| {
            seen += 1;
            Err(InferError::Stalled(Silence::Liveness))
        });
        assert!(matches!(r, Err(InferError::Stalled(Silence::Liveness))));
        assert_eq!(seen, 1);
    }
}
