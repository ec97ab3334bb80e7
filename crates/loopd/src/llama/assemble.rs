//! The std face of `llama-proto`'s assembler: `data:` payloads in, [`ChatEvent`]s out as they
//! arrive, and the [`Completion`] at the end.
//!
//! Each payload is decoded, folded into the assembler (which checks it whole before changing
//! anything), and only then reported, so an event is never emitted for a chunk the
//! completion does not contain. Events are handed over owned, so the caller queues them
//! without a copy. The capacities below are the caps of one message; going past one is
//! [`InferError::Protocol`] with the assembler's [`AssembleError`](llama_proto::AssembleError).

use llama_proto::{decode_chunk, decode_error_event, Payload, ServerError};

use super::{capped_body, ChatEvent, Completion, InferError, Partial, Timings, ToolCall};

/// Bytes of answer text one message may carry.
pub const CONTENT_CAP: usize = 1024 * 1024;
/// Bytes of reasoning text one message may carry.
pub const REASONING_CAP: usize = 1024 * 1024;
/// Tool calls one message may carry.
pub const TOOL_CALLS_CAP: usize = 16;
/// Bytes of arguments one tool call may carry.
pub const ARGUMENTS_CAP: usize = 64 * 1024;
/// Bytes of unescaped strings one payload may need: a payload is at most an SSE line.
pub const TEXT_CAP: usize = crate::sse::SSE_CAP;

type Inner<'s> =
    llama_proto::Assembler<'s, CONTENT_CAP, REASONING_CAP, TOOL_CALLS_CAP, ARGUMENTS_CAP>;

/// The heap storage of one message (content, reasoning, tool-call arguments) for a
/// [`ChatExchange`](super::ChatExchange); allocate once, reuse for every request.
pub struct Buffers {
    content: Box<[u8; CONTENT_CAP]>,
    reasoning: Box<[u8; REASONING_CAP]>,
    args: Box<[[u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP]>,
    text: Box<[u8]>,
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
    /// Zeroed buffers straight on the heap (the allocator hands out untouched pages).
    pub fn new() -> Self {
        Buffers {
            content: crate::heap::array::<CONTENT_CAP>(),
            reasoning: crate::heap::array::<REASONING_CAP>(),
            args: vec![[0u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP]
                .into_boxed_slice()
                .try_into()
                .expect("exactly TOOL_CALLS_CAP rows"),
            text: vec![0u8; TEXT_CAP].into_boxed_slice(),
        }
    }

    /// A folder at the start of a message, writing into these buffers.
    pub fn folder(&mut self) -> Folder<'_> {
        Folder::new(self.storage())
    }

    /// The buffers lent out as one value, which a [`Folder`] hands back at the end of its
    /// message ([`Folder::into_storage`]) for the next one.
    pub fn storage(&mut self) -> Storage<'_> {
        Storage {
            content: &mut self.content,
            reasoning: &mut self.reasoning,
            args: &mut self.args,
            text: &mut self.text,
        }
    }
}

/// [`Buffers`] lent out: what one [`Folder`] writes into, handed from message to message.
pub struct Storage<'s> {
    content: &'s mut [u8; CONTENT_CAP],
    reasoning: &'s mut [u8; REASONING_CAP],
    args: &'s mut [[u8; ARGUMENTS_CAP]; TOOL_CALLS_CAP],
    text: &'s mut [u8],
}

impl std::fmt::Debug for Storage<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").finish_non_exhaustive()
    }
}

/// What a payload meant for the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Folded in; read on.
    More,
    /// The chunk carried the `finish_reason`.
    Finished,
}

/// Folds one message's payloads, emitting events as they come.
pub struct Folder<'s> {
    inner: Inner<'s>,
    text: &'s mut [u8],
}

impl std::fmt::Debug for Folder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Folder")
            .field("id", &self.inner.id())
            .finish_non_exhaustive()
    }
}

/// A server's in-stream error: `Http` with its code and message (500 when it has no code).
pub fn server_error(e: &ServerError<'_>) -> InferError {
    match e
        .code
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (100..1000).contains(c))
    {
        Some(status) => InferError::Http {
            status,
            body: capped_body(e.message.as_bytes()),
        },
        None => InferError::Http {
            status: 500,
            body: capped_body(e.message.as_bytes()),
        },
    }
}

impl<'s> Folder<'s> {
    /// A folder at the start of a message, writing into `storage`.
    pub fn new(storage: Storage<'s>) -> Self {
        Folder {
            inner: Inner::new(storage.content, storage.reasoning, storage.args),
            text: storage.text,
        }
    }

    /// The storage back, for the next message.
    pub fn into_storage(self) -> Storage<'s> {
        let (content, reasoning, args) = self.inner.into_storage();
        Storage {
            content,
            reasoning,
            args,
            text: self.text,
        }
    }

    /// Decodes one `data:` payload, folds it in and emits its events.
    pub fn push(
        &mut self,
        data: &[u8],
        on_event: &mut dyn FnMut(ChatEvent),
    ) -> Result<Step, InferError> {
        let chunk = match decode_chunk(data, self.text)? {
            Payload::Error(e) => return Err(server_error(&e)),
            Payload::Chunk(c) => c,
        };
        self.inner.push(&chunk)?;
        if let Some(p) = chunk.prompt_progress {
            on_event(ChatEvent::Progress {
                total: p.total,
                cache: p.cache,
                processed: p.processed,
            });
        }
        if let Some(r) = chunk.reasoning_content.filter(|r| !r.is_empty()) {
            on_event(ChatEvent::Reasoning(r.to_owned()));
        }
        if let Some(c) = chunk.content.filter(|c| !c.is_empty()) {
            on_event(ChatEvent::Content(c.to_owned()));
        }
        for d in chunk.tool_calls() {
            on_event(ChatEvent::ToolCallDelta {
                index: d.index,
                id: d.id.map(str::to_owned),
                name: d.name.map(str::to_owned),
                arguments: d.arguments.unwrap_or_default().to_owned(),
            });
        }
        Ok(if chunk.finish_reason.is_some() {
            Step::Finished
        } else {
            Step::More
        })
    }

    /// Decodes the data of an `event: error` event into the error it reports; data that is
    /// not the error JSON is kept as the body of an HTTP 500.
    pub fn error_event(&mut self, data: &[u8]) -> InferError {
        match decode_error_event(data, self.text) {
            Ok(e) => server_error(&e),
            Err(_) => InferError::Http {
                status: 500,
                body: capped_body(data),
            },
        }
    }

    /// The completion id, once a chunk carried it.
    pub fn id(&self) -> Option<&str> {
        self.inner.id()
    }

    /// Reasoning tokens so far, from the per-chunk `predicted_n`.
    pub fn reasoning_tokens(&self) -> u64 {
        self.inner.reasoning_tokens()
    }

    /// Whether the final chunk arrived.
    pub fn is_finished(&self) -> bool {
        self.inner.finish_reason().is_some()
    }

    /// The latest timings, zeros if none came.
    pub fn timings(&self) -> Timings {
        self.inner.timings().unwrap_or_default()
    }

    /// The finished message. Without a `finish_reason` the stream ended early.
    pub fn completion(&self, thinking_capped: bool) -> Result<Completion, InferError> {
        let message = self.inner.finish().map_err(|e| match e {
            llama_proto::AssembleError::NoFinishReason => InferError::StreamClosedEarly,
            other => InferError::from(other),
        })?;
        let mut done = Completion::from(&message);
        done.thinking_capped = thinking_capped;
        Ok(done)
    }

    /// What was assembled so far, for a request that failed part-way.
    pub fn partial(&self) -> Partial {
        Partial {
            content: self.inner.content().map(str::to_owned),
            reasoning_content: self.inner.reasoning_content().map(str::to_owned),
            tool_calls: self
                .inner
                .tool_calls()
                .iter()
                .map(|c| ToolCall {
                    id: c.id.to_owned(),
                    name: c.name.to_owned(),
                    arguments: c.arguments.to_owned(),
                })
                .collect(),
            timings: self.inner.timings(),
            reasoning_tokens: self.inner.reasoning_tokens(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::ProtocolError;
    use llama_proto::{AssembleError, DecodeError, FinishReason};

    fn fold(payloads: &[&str]) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
        let mut bufs = Buffers::new();
        let mut f = bufs.folder();
        let mut events = Vec::new();
        for p in payloads {
            if let Err(e) = f.push(p.as_bytes(), &mut |e| events.push(e)) {
                return (Err(e), events);
            }
        }
        (f.completion(false), events)
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
            (done.content.as_deref(), done.reasoning_content.as_deref()),
            (Some("Hi"), Some("hm"))
        );
        assert_eq!(
            done.tool_calls,
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
                Err(InferError::Protocol(ProtocolError::Decode(
                    DecodeError::Json(_)
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
                Err(InferError::Protocol(ProtocolError::Assemble(
                    AssembleError::CompletionIdChanged
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
        let mut bufs = Buffers::new();
        let mut f = bufs.folder();
        for i in 0..TOOL_CALLS_CAP as u32 {
            f.push(call(i).as_bytes(), &mut |_| {}).unwrap();
        }
        let mut events = 0;
        let e = f
            .push(call(TOOL_CALLS_CAP as u32).as_bytes(), &mut |_| events += 1)
            .unwrap_err();
        assert!(matches!(
            e,
            InferError::Protocol(ProtocolError::Assemble(AssembleError::TooManyToolCalls {
                index: 16
            }))
        ));
        assert_eq!(events, 0, "nothing is reported for a refused chunk");
    }

    #[test]
    fn error_event_forms() {
        let mut bufs = Buffers::new();
        let mut f = bufs.folder();
        let e =
            f.error_event(br#"{"code":503,"message":"Loading model","type":"unavailable_error"}"#);
        assert!(matches!(e, InferError::Http { status: 503, ref body } if body == "Loading model"));
        let e = f.error_event(b"gibberish");
        assert!(matches!(e, InferError::Http { status: 500, ref body } if body == "gibberish"));
    }
}
