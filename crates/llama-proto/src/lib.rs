//! llama-server chat protocol, sans IO.
//!
//! The core is `no_std` without an allocator:
//! - [`decode_chunk`]: one `data:` payload of a chat stream into a borrowed [`Chunk`]
//!   (or a [`ServerError`]), strings unescaped into a buffer the caller owns;
//! - [`Assembler`]: folds chunks into one [`Message`], capacities as const generics,
//!   storage supplied by the caller;
//! - [`ChatStream`]: the whole path of one response, `http-nostd`'s reader, `sse-nostd`'s
//!   parser, the decoder and the assembler, with one error type ([`StreamError`]);
//! - [`text_calls`] / [`parse_text_calls`]: tool calls the model wrote as `<tool_call>` text
//!   in its content (when the server did not parse them), each a borrowed [`TextCall`] or a
//!   [`TextCallError`], and the [`prose`] around them;
//! - [`check_json_object`]: one JSON object (a native tool call's arguments) held to the
//!   rules of a `<tool_call>` object, a [`JsonError`] naming what was wrong and where;
//! - [`LoopDetector`]: fed the streamed content, says at which byte one line, one sentence or
//!   a short cycle of them started repeating, with thresholds by length ([`LoopConfig`]);
//! - [`cache_outcome`] and [`hash`].
//!
//! Fixed-capacity collections: the assembler's tool-call table and its short ids and names
//! are `heapless` (`Vec`, `String`). The large buffers (content, reasoning, arguments, the
//! decoder's text) are the caller's storage instead, since a `heapless` collection holds its
//! storage inline and these must never pass through the stack; and a [`Chunk`]'s tool-call
//! deltas are slots and a length, since a `heapless::Vec` has drop glue and would keep a
//! [`ChatStream`] borrowed through a `match` on what it returned.
//!
//! The `alloc` feature adds the owned types `loopd` builds requests from and returns at the
//! end of a request ([`ChatMessage`], [`AssistantMessage`], [`ToolCall`], [`ToolSchema`],
//! [`Completion`]).
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(test)]
extern crate std;

/// Every `data:` payload that is a JSON object in the recorded `streams` (the text of
/// `fixtures/*.sse`), for the tests that hold the decoder's paths to each other.
#[cfg(test)]
fn recorded_payloads(streams: &[&'static str]) -> std::vec::Vec<&'static str> {
    streams
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|p| p.starts_with('{'))
        .collect()
}

mod assemble;
pub mod cache;
mod chunk;
mod decode;
pub mod hash;
#[cfg(target_pointer_width = "64")]
mod layout;
#[cfg(feature = "alloc")]
mod owned;
mod raw;
mod repeat;
mod scan;
mod stream;
mod text_calls;
mod types;
mod unescape;
mod validate;

pub use assemble::{
    AssembleError, Assembler, Message, ToolCallRef, ToolCalls, MAX_COMPLETION_ID, MAX_TOOL_CALL_ID,
    MAX_TOOL_NAME,
};
pub use cache::{cache_outcome, CacheOutcome, CACHE_LOSS_TOLERANCE};
pub use chunk::{
    Chunk, DecodeError, Payload, PromptProgress, ServerError, ToolCallDelta, MAX_NESTING,
    MAX_TOOL_CALL_DELTAS,
};
#[cfg(feature = "differential")]
pub use decode::decode_chunk_walked;
pub use decode::{decode_chunk, decode_error_event};
/// The push shape of [`ChatStream::feed`] and of its parts: httparse's `Status`.
pub use http_nostd::Status;
#[cfg(feature = "alloc")]
pub use owned::{AssistantMessage, ChatMessage, Completion, ToolCall, ToolSchema};
pub use repeat::{LoopConfig, LoopConfigError, LoopDetected, LoopDetector, MAX_CYCLE_LINES};
pub use stream::{ChatStream, StreamError, StreamEvent};
pub use text_calls::{
    parse_text_calls, prose, text_calls, Prose, TextCall, TextCallBlock, TextCallError,
    TextCallList, TextCalls, TooManyTextCalls,
};
pub use types::{FinishReason, Timings};
pub use validate::{check_json_object, JsonError, MAX_NUMBER_LEN};
