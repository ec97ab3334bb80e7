//! The std face of `llama-proto`'s [`ChatStream`] for loopd: the heap storage of one response
//! ([`Buffers`]), the [`ChatEvent`]s a chunk is reported as, and the [`Completion`] or
//! [`Partial`] read from the assembler at the end.
//!
//! A chunk is reported only after the stream folded it into the assembler (which checks it
//! whole before changing anything), so an event is never emitted for a chunk the completion
//! does not contain. Events are handed over owned, so the caller queues them without a copy;
//! a caller that gives them back once shown lends their strings to later events
//! ([`SpareStrings`]). The capacities below are the caps of one message; going past one is
//! [`InferError::Protocol`] with the assembler's [`AssembleError`].

use http_nostd::MAX_HEADERS;
use llama_proto::{Assembler, ChatStream, Chunk, ServerError, StreamError};

use super::{capped_body, ChatEvent, Completion, InferError, Partial};
use crate::http::HEAD_CAP;
use crate::sse::SSE_CAP;

/// Bytes of answer text one message may carry.
pub const CONTENT_CAP: usize = 1024 * 1024;
/// Bytes of reasoning text one message may carry.
pub const REASONING_CAP: usize = 1024 * 1024;
/// Tool calls one message may carry.
pub const TOOL_CALLS_CAP: usize = 16;
/// Bytes of arguments one tool call may carry.
pub const ARGUMENTS_CAP: usize = 64 * 1024;

/// The assembler inside loopd's stream.
pub(crate) type Message<'s> =
    Assembler<'s, CONTENT_CAP, REASONING_CAP, TOOL_CALLS_CAP, ARGUMENTS_CAP>;

/// loopd's [`ChatStream`]: a 16 KiB head with at most 64 fields, 1 MiB SSE lines, and the
/// message caps above.
pub(crate) type Stream<'s> = ChatStream<
    's,
    HEAD_CAP,
    MAX_HEADERS,
    SSE_CAP,
    CONTENT_CAP,
    REASONING_CAP,
    TOOL_CALLS_CAP,
    ARGUMENTS_CAP,
>;

/// The heap storage of one response (head, SSE line, unescaped strings, content, reasoning,
/// tool-call arguments) for a [`ChatExchange`](super::ChatExchange); allocate once, reuse for
/// every request (a [`Client`](super::Client) keeps those of finished requests in its
/// [`BufferPool`](super::BufferPool): [`Client::buffers`](super::Client::buffers)).
pub struct Buffers {
    head: Box<[u8; HEAD_CAP]>,
    line: Box<[u8; SSE_CAP]>,
    text: Box<[u8; SSE_CAP]>,
    content: Box<[u8; CONTENT_CAP]>,
    reasoning: Box<[u8; REASONING_CAP]>,
    args: Box<[[u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP]>,
}

impl std::fmt::Debug for Buffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffers").finish_non_exhaustive()
    }
}

impl Default for Buffers {
    fn default() -> Self {
        Self::new()
    }
}

impl Buffers {
    /// The heap bytes of one set.
    pub const BYTES: usize =
        HEAD_CAP + 2 * SSE_CAP + CONTENT_CAP + REASONING_CAP + TOOL_CALLS_CAP * ARGUMENTS_CAP;

    /// Zeroed buffers straight on the heap. Only a process's first set comes as untouched
    /// pages: freeing it raises glibc's mmap threshold, and later sets are served from the heap
    /// and cleared with a `memset` of all 5 MiB; so a request takes a finished one's set from
    /// its client's pool instead ([`Client::buffers`](super::Client::buffers)).
    pub fn new() -> Self {
        Buffers {
            head: crate::heap::array::<HEAD_CAP>(),
            line: crate::heap::array::<SSE_CAP>(),
            text: crate::heap::array::<SSE_CAP>(),
            content: crate::heap::array::<CONTENT_CAP>(),
            reasoning: crate::heap::array::<REASONING_CAP>(),
            args: vec![[0u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP]
                .into_boxed_slice()
                .try_into()
                .expect("exactly TOOL_CALLS_CAP rows"),
        }
    }

    /// The buffers lent out as one value, which a [`ChatExchange`](super::ChatExchange) hands
    /// back at the end of its response ([`into_storage`](super::ChatExchange::into_storage))
    /// for the next one.
    pub fn storage(&mut self) -> Storage<'_> {
        Storage {
            head: &mut self.head,
            line: &mut self.line,
            text: &mut self.text,
            content: &mut self.content,
            reasoning: &mut self.reasoning,
            args: &mut self.args,
        }
    }

    /// Where the head buffer lives, to tell one set from another.
    #[cfg(test)]
    pub(crate) fn head_ptr(&self) -> *const u8 {
        self.head.as_ptr()
    }
}

/// [`Buffers`] lent out: what one response's [`ChatStream`] reads into, handed from response
/// to response.
pub struct Storage<'s> {
    head: &'s mut [u8; HEAD_CAP],
    line: &'s mut [u8; SSE_CAP],
    text: &'s mut [u8; SSE_CAP],
    content: &'s mut [u8; CONTENT_CAP],
    reasoning: &'s mut [u8; REASONING_CAP],
    args: &'s mut [[u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP],
}

impl std::fmt::Debug for Storage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").finish_non_exhaustive()
    }
}

impl<'s> Storage<'s> {
    /// A stream at the start of a response, reading into this storage.
    pub(crate) fn into_stream(self) -> Stream<'s> {
        let assembler = Assembler::new(self.content, self.reasoning, self.args);
        ChatStream::new(self.head, self.line, self.text, assembler)
    }

    /// The storage of a stream, for the next response (what it holds is ignored).
    pub(crate) fn from_stream(stream: Stream<'s>) -> Self {
        let (head, line, text, assembler) = stream.into_storage();
        let (content, reasoning, args) = assembler.into_storage();
        Storage {
            head,
            line,
            text,
            content,
            reasoning,
            args,
        }
    }
}

/// A server's in-stream error: `Http` with its code and message (500 when it has no code).
pub fn server_error(e: &ServerError<'_>) -> InferError {
    let status = e
        .code
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (100..1000).contains(c))
        .unwrap_or(500);
    InferError::Http {
        status,
        body: capped_body(e.message.as_bytes()),
    }
}

/// Strings of events already shown, kept for the text of the next events: an event's text is
/// owned (the caller may queue it), and writing it into a string given back saves an
/// allocation and a free an event. At most [`SpareStrings::MOST`] strings of at most
/// [`SpareStrings::CAPACITY`] bytes each are kept.
#[derive(Debug, Default)]
pub(crate) struct SpareStrings(Vec<String>);

impl SpareStrings {
    /// Strings kept: more than the events of one 16 KiB read (llama-server's chunks are about
    /// 500 bytes with their timings), which the client shows and gives back before the next.
    pub const MOST: usize = 64;
    /// The largest capacity kept, so that a long piece does not stay behind.
    pub const CAPACITY: usize = 1024;

    /// `text` as an owned string, in a spare one if there is one.
    pub fn text(&mut self, text: &str) -> String {
        if text.is_empty() {
            return String::new();
        }
        match self.0.pop() {
            Some(mut s) => {
                s.clear();
                s.push_str(text);
                s
            }
            None => text.to_owned(),
        }
    }

    /// Keeps the strings of an event that was shown.
    pub fn keep(&mut self, event: ChatEvent) {
        match event {
            ChatEvent::Reasoning(s) | ChatEvent::Content(s) => self.keep_one(s),
            ChatEvent::ToolCallDelta {
                id,
                name,
                arguments,
                ..
            } => {
                self.keep_one(arguments);
                id.into_iter().chain(name).for_each(|s| self.keep_one(s));
            }
            _ => {}
        }
    }

    fn keep_one(&mut self, s: String) {
        if self.0.len() < Self::MOST && (1..=Self::CAPACITY).contains(&s.capacity()) {
            self.0.push(s);
        }
    }
}

/// Reports a chunk the stream folded in: progress, reasoning, content, then each tool-call
/// delta; their text is written into `spare` strings where it has them.
pub(crate) fn chunk_events(
    chunk: &Chunk<'_>,
    spare: &mut SpareStrings,
    on_event: &mut dyn FnMut(ChatEvent),
) {
    if let Some(p) = chunk.prompt_progress {
        on_event(ChatEvent::Progress {
            total: p.total,
            cache: p.cache,
            processed: p.processed,
        });
    }
    if let Some(r) = chunk.reasoning_content.filter(|r| !r.is_empty()) {
        on_event(ChatEvent::Reasoning(spare.text(r)));
    }
    if let Some(c) = chunk.content.filter(|c| !c.is_empty()) {
        on_event(ChatEvent::Content(spare.text(c)));
    }
    for d in chunk.tool_calls() {
        on_event(ChatEvent::ToolCallDelta {
            index: d.index,
            id: d.id.map(|s| spare.text(s)),
            name: d.name.map(|s| spare.text(s)),
            arguments: spare.text(d.arguments.unwrap_or_default()),
        });
    }
}

/// The finished message. Without a `finish_reason` the stream ended early.
pub(crate) fn completion(
    message: &Message<'_>,
    thinking_capped: bool,
) -> Result<Completion, InferError> {
    let message = message
        .finish()
        .map_err(|e| InferError::from(StreamError::Assemble(e)))?;
    let mut done = Completion::from(&message);
    done.thinking_capped = thinking_capped;
    Ok(done)
}

/// What was assembled so far, for a request that failed part-way.
pub(crate) fn partial(message: &Message<'_>) -> Partial {
    Partial {
        message: message.into(),
        timings: message.timings(),
        reasoning_tokens: message.reasoning_tokens(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::{ProtocolError, Timings, ToolCall};
    use llama_proto::{AssembleError, DecodeError, FinishReason, Status, StreamError, StreamEvent};

    /// `body`, an event stream read to the close, through loopd's stream: the events reported
    /// and the completion or the first error, mapped as the exchange maps them.
    fn fold_body(body: &str) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
        let mut bufs = Buffers::new();
        let mut stream = bufs.storage().into_stream();
        let input = format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n{body}");
        let mut rest = input.as_bytes();
        let mut events = Vec::new();
        loop {
            match stream.feed(rest) {
                Err(e) => return (Err(e.into()), events),
                Ok((_, Status::Partial)) => break,
                Ok((used, Status::Complete(event))) => {
                    match event {
                        StreamEvent::Chunk(c) => {
                            chunk_events(&c, &mut SpareStrings::default(), &mut |e| events.push(e))
                        }
                        StreamEvent::ServerError(e) => return (Err(server_error(&e)), events),
                        _ => {}
                    }
                    rest = &rest[used..];
                }
            }
        }
        let done = match stream.finish() {
            Ok(_) | Err(StreamError::Assemble(_)) => completion(stream.assembler(), false),
            Err(e) => Err(e.into()),
        };
        (done, events)
    }

    fn fold(payloads: &[&str]) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
        fold_body(
            &payloads
                .iter()
                .map(|p| format!("data: {p}\n\n"))
                .collect::<String>(),
        )
    }

    #[test]
    fn deltas_become_events_and_one_completion() {
        let (done, events) = fold(&[
            r#"{"id":"chatcmpl-a","choices":[],"prompt_progress":{"total":10,"cache":2,"processed":10,"time_ms":5}}"#,
            r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}],"timings":{"cache_n":2,"prompt_n":8,"predicted_n":1}}"#,
            r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{"content":"Hi"}}],"timings":{"cache_n":2,"prompt_n":8,"predicted_n":2}}"#,
            r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\""}}]}}]}"#,
            r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"a\":1}"}}]}}]}"#,
            r#"{"id":"chatcmpl-a","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"timings":{"cache_n":2,"prompt_n":8,"predicted_n":9}}"#,
        ]);
        assert_eq!(
            events,
            [
                ChatEvent::Progress {
                    total: 10,
                    cache: 2,
                    processed: 10
                },
                ChatEvent::Reasoning("hm".into()),
                ChatEvent::Content("Hi".into()),
                ChatEvent::ToolCallDelta {
                    index: 0,
                    id: Some("c1".into()),
                    name: Some("f".into()),
                    arguments: "{\"".into()
                },
                ChatEvent::ToolCallDelta {
                    index: 0,
                    id: None,
                    name: None,
                    arguments: "a\":1}".into()
                },
            ]
        );
        let done = done.unwrap();
        assert_eq!(done.id, "chatcmpl-a");
        assert_eq!(
            (
                done.message.content.as_deref(),
                done.message.reasoning_content.as_deref()
            ),
            (Some("Hi"), Some("hm"))
        );
        assert_eq!(
            done.message.tool_calls,
            [ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into()
            }]
        );
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            done.timings,
            Some(Timings {
                cache_n: 2,
                prompt_n: 8,
                predicted_n: 9
            })
        );
        assert_eq!((done.reasoning_tokens, done.thinking_capped), (1, false));
    }

    #[test]
    fn no_finish_reason_is_stream_closed_early() {
        let (r, _) = fold(&[r#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}"#]);
        assert!(matches!(r, Err(InferError::StreamClosedEarly)));
    }

    #[test]
    fn server_error_payload_keeps_code_and_message() {
        let (r, events) =
            fold(&[r#"{"error":{"code":500,"message":"boom","type":"server_error"}}"#]);
        assert!(matches!(r, Err(InferError::Http { status: 500, ref body }) if body == "boom"));
        assert!(events.is_empty());
        let (r, _) = fold(&[r#"{"error":{"message":"no code"}}"#]);
        assert!(
            matches!(r, Err(InferError::Http { status: 500, ref body }) if body == "no code"),
            "{r:?}"
        );
    }

    #[test]
    fn bad_json_and_broken_rules_are_protocol_errors() {
        let (r, _) = fold(&["{not json"]);
        assert!(
            matches!(
                r,
                Err(InferError::Protocol(ProtocolError::Stream(
                    llama_proto::StreamError::Decode(DecodeError::Json(_))
                )))
            ),
            "{r:?}"
        );
        let (r, _) = fold(&[
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":"x"}}]}"#,
            r#"{"id":"b","choices":[{"index":0,"delta":{"content":"y"}}]}"#,
        ]);
        assert!(
            matches!(
                r,
                Err(InferError::Protocol(ProtocolError::Stream(
                    llama_proto::StreamError::Assemble(AssembleError::CompletionIdChanged)
                )))
            ),
            "{r:?}"
        );
    }

    #[test]
    fn tool_call_cap_is_16() {
        let call = |i: u32| {
            format!(
                r#"{{"id":"x","choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":{i},"id":"c{i}","function":{{"name":"f","arguments":"{{}}"}}}}]}}}}]}}"#
            )
        };
        let calls: Vec<String> = (0..=TOOL_CALLS_CAP as u32).map(call).collect();
        let calls: Vec<&str> = calls.iter().map(String::as_str).collect();
        let (e, events) = fold(&calls);
        assert!(matches!(
            e,
            Err(InferError::Protocol(ProtocolError::Stream(
                llama_proto::StreamError::Assemble(AssembleError::TooManyToolCalls { index: 16 })
            )))
        ));
        assert_eq!(
            events.len(),
            TOOL_CALLS_CAP,
            "nothing is reported for a refused chunk"
        );
    }

    #[test]
    fn error_event_forms() {
        let (e, _) = fold_body(
            "event: error\ndata: {\"code\":503,\"message\":\"Loading model\",\"type\":\"unavailable_error\"}\n\n",
        );
        assert!(
            matches!(e, Err(InferError::Http { status: 503, ref body }) if body == "Loading model")
        );
        let (e, _) = fold_body("event: error\ndata: gibberish\n\n");
        assert!(
            matches!(e, Err(InferError::Http { status: 500, ref body }) if body == "gibberish")
        );
    }

    #[test]
    fn the_line_cap_is_1_mib_at_the_limit_and_one_past() {
        // A comment line of exactly SSE_CAP bytes (without its line end) is accepted.
        let line = |len: usize| format!(":{}\n\n{}\n\n", "x".repeat(len - 1), STOP);
        assert!(fold_body(&line(SSE_CAP)).0.is_ok());
        assert!(matches!(
            fold_body(&line(SSE_CAP + 1)).0,
            Err(InferError::Protocol(ProtocolError::Stream(
                llama_proto::StreamError::Sse(sse_nostd::SseError::LineTooLong)
            )))
        ));
    }

    #[test]
    fn spare_strings_keep_at_most_most_of_at_most_capacity() {
        let mut spare = SpareStrings::default();
        let event = |cap: usize| ChatEvent::Content(String::with_capacity(cap));
        spare.keep(event(0));
        spare.keep(event(SpareStrings::CAPACITY + 1));
        assert!(spare.0.is_empty(), "nothing to lend, or too long to keep");
        spare.keep(ChatEvent::ToolCallDelta {
            index: 0,
            id: Some(String::with_capacity(8)),
            name: Some(String::with_capacity(8)),
            arguments: String::with_capacity(SpareStrings::CAPACITY),
        });
        assert_eq!(spare.0.len(), 3);
        for _ in 0..SpareStrings::MOST {
            spare.keep(event(8));
        }
        assert_eq!(spare.0.len(), SpareStrings::MOST);
        // Text goes into a kept string, whatever it held; an empty text takes none.
        assert_eq!(spare.text(""), "");
        assert_eq!(spare.0.len(), SpareStrings::MOST);
        let mut held = spare.0.last().unwrap().clone();
        held.push_str("old");
        spare.0.push(held);
        assert_eq!(spare.text("new"), "new");
        assert_eq!(spare.0.len(), SpareStrings::MOST);
    }

    const STOP: &str =
        r#"data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
}
