//! Folds decoded chunks into one assistant message, without an allocator.
//!
//! A chunk is applied whole or not at all: when a capacity would be exceeded the error
//! names it and the assembler is unchanged.

use core::fmt;

use heapless::{String, Vec};

use crate::{Chunk, FinishReason, Timings};

/// Longest completion id kept (llama-server sends `chatcmpl-` and 32 characters).
pub const MAX_COMPLETION_ID: usize = 64;
/// Longest tool-call id kept (llama-server sends 32 characters).
pub const MAX_TOOL_CALL_ID: usize = 64;
/// Longest tool (function) name kept.
pub const MAX_TOOL_NAME: usize = 128;

/// Why a chunk could not be folded in, or the message is not complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AssembleError {
    /// The content would exceed the `CONTENT` capacity.
    ContentFull,
    /// The reasoning would exceed the `REASONING` capacity.
    ReasoningFull,
    /// A tool call's `index` is not below the `CALLS` capacity.
    TooManyToolCalls {
        /// The index sent.
        index: u32,
    },
    /// A tool call's arguments would exceed the `ARGS` capacity.
    ArgumentsFull {
        /// The tool call's index.
        index: u32,
    },
    /// The completion id is longer than [`MAX_COMPLETION_ID`].
    CompletionIdTooLong,
    /// A tool-call id is longer than [`MAX_TOOL_CALL_ID`].
    ToolCallIdTooLong {
        /// The tool call's index.
        index: u32,
    },
    /// A tool name is longer than [`MAX_TOOL_NAME`].
    ToolNameTooLong {
        /// The tool call's index.
        index: u32,
    },
    /// A chunk carried a different completion id than the first.
    CompletionIdChanged,
    /// A tool call's id was sent again with a different value.
    ToolCallIdChanged {
        /// The tool call's index.
        index: u32,
    },
    /// A tool call's name was sent again with a different value.
    ToolNameChanged {
        /// The tool call's index.
        index: u32,
    },
    /// A second, different `finish_reason`, or a delta after the `finish_reason`.
    DeltaAfterFinish,
    /// [`Assembler::finish`]: the stream ended without a `finish_reason`.
    NoFinishReason,
    /// [`Assembler::finish`]: the stream ended without a completion id.
    NoCompletionId,
    /// [`Assembler::finish`]: a tool call below the highest index never arrived, or one has
    /// no id or no name.
    IncompleteToolCall {
        /// The tool call's index.
        index: u32,
    },
}

impl fmt::Display for AssembleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AssembleError::ContentFull => f.write_str("content exceeds the content capacity"),
            AssembleError::ReasoningFull => f.write_str("reasoning exceeds the reasoning capacity"),
            AssembleError::TooManyToolCalls { index } => {
                write!(f, "tool call index {index} exceeds the tool-call capacity")
            }
            AssembleError::ArgumentsFull { index } => write!(
                f,
                "arguments of tool call {index} exceed the per-call argument capacity"
            ),
            AssembleError::CompletionIdTooLong => {
                write!(f, "completion id longer than {MAX_COMPLETION_ID} bytes")
            }
            AssembleError::ToolCallIdTooLong { index } => write!(
                f,
                "id of tool call {index} longer than {MAX_TOOL_CALL_ID} bytes"
            ),
            AssembleError::ToolNameTooLong { index } => write!(
                f,
                "name of tool call {index} longer than {MAX_TOOL_NAME} bytes"
            ),
            AssembleError::CompletionIdChanged => f.write_str("completion id changed mid-stream"),
            AssembleError::ToolCallIdChanged { index } => {
                write!(f, "id of tool call {index} changed mid-stream")
            }
            AssembleError::ToolNameChanged { index } => {
                write!(f, "name of tool call {index} changed mid-stream")
            }
            AssembleError::DeltaAfterFinish => f.write_str("delta after finish_reason"),
            AssembleError::NoFinishReason => f.write_str("stream ended without a finish_reason"),
            AssembleError::NoCompletionId => f.write_str("stream ended without a completion id"),
            AssembleError::IncompleteToolCall { index } => {
                write!(f, "tool call {index} is missing, or has no id or no name")
            }
        }
    }
}

impl core::error::Error for AssembleError {}

/// Keeps `s` in `slot`, written in place (no string-sized temporary on the stack); `s` is no
/// longer than `N` (the caller checked).
fn keep<const N: usize>(slot: &mut Option<String<N>>, s: &str) {
    let kept = slot.insert(String::new());
    let _ = kept.push_str(s);
}

/// What is known about one tool call; its arguments live in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CallMeta {
    seen: bool,
    id: Option<String<MAX_TOOL_CALL_ID>>,
    name: Option<String<MAX_TOOL_NAME>>,
    args_len: usize,
}

impl CallMeta {
    const EMPTY: Self = CallMeta {
        seen: false,
        id: None,
        name: None,
        args_len: 0,
    };
}

/// The delta assembler. `CONTENT` and `REASONING` are byte capacities, `CALLS` the number of
/// tool calls, `ARGS` the argument bytes per call.
///
/// A chunk is applied whole or not at all: when a capacity would be exceeded the error names
/// it and the assembler is unchanged.
///
/// The three large buffers are the caller's, so a 256 KiB message never sits on the stack.
/// `loopd` allocates them once on the heap and reuses them for every request
/// ([`reset`](Self::reset) between requests):
///
/// ```
/// use llama_proto::Assembler;
/// const CONTENT: usize = 256 * 1024;
/// const REASONING: usize = 256 * 1024;
/// const CALLS: usize = 8;
/// const ARGS: usize = 64 * 1024;
/// // vec! writes zeros straight into the heap block; nothing this size touches the stack.
/// let mut content: Box<[u8; CONTENT]> = vec![0u8; CONTENT].into_boxed_slice().try_into().unwrap();
/// let mut reasoning: Box<[u8; REASONING]> =
///     vec![0u8; REASONING].into_boxed_slice().try_into().unwrap();
/// // One ARGS-sized element is built on the stack and cloned into the heap block.
/// let mut args: Box<[[u8; ARGS]; CALLS]> =
///     vec![[0u8; ARGS]; CALLS].into_boxed_slice().try_into().unwrap();
/// let mut asm = Assembler::new(&mut content, &mut reasoning, &mut args);
/// assert_eq!(asm.finish(), Err(llama_proto::AssembleError::NoFinishReason));
/// ```
///
/// The assembler itself holds only lengths and the short ids and names (about 220 bytes per
/// tool call), so it can live on the stack or in a `Box`.
#[derive(Debug)]
pub struct Assembler<
    's,
    const CONTENT: usize,
    const REASONING: usize,
    const CALLS: usize,
    const ARGS: usize,
> {
    content: &'s mut [u8; CONTENT],
    content_len: usize,
    has_content: bool,
    reasoning: &'s mut [u8; REASONING],
    reasoning_len: usize,
    args: &'s mut [[u8; ARGS]; CALLS],
    // The tool-call table, by index: a call's slot exists once it or a later one was seen.
    calls: Vec<CallMeta, CALLS>,
    id: Option<String<MAX_COMPLETION_ID>>,
    finish_reason: Option<FinishReason>,
    timings: Option<Timings>,
    last_predicted: u64,
    reasoning_tokens: u64,
    in_reasoning: bool,
}

impl<'s, const CONTENT: usize, const REASONING: usize, const CALLS: usize, const ARGS: usize>
    Assembler<'s, CONTENT, REASONING, CALLS, ARGS>
{
    /// An empty assembler writing into the caller's buffers (their old contents are ignored).
    pub fn new(
        content: &'s mut [u8; CONTENT],
        reasoning: &'s mut [u8; REASONING],
        args: &'s mut [[u8; ARGS]; CALLS],
    ) -> Self {
        Assembler {
            content,
            content_len: 0,
            has_content: false,
            reasoning,
            reasoning_len: 0,
            args,
            calls: Vec::new(),
            id: None,
            finish_reason: None,
            timings: None,
            last_predicted: 0,
            reasoning_tokens: 0,
            in_reasoning: false,
        }
    }

    /// Hands the caller's buffers back for the next message (`new` ignores what they hold),
    /// so a caller that keeps one set of buffers can assemble message after message.
    #[allow(clippy::type_complexity)]
    pub fn into_storage(
        self,
    ) -> (
        &'s mut [u8; CONTENT],
        &'s mut [u8; REASONING],
        &'s mut [[u8; ARGS]; CALLS],
    ) {
        (self.content, self.reasoning, self.args)
    }

    /// Forgets everything folded in, keeping the buffers, for the next request.
    pub fn reset(&mut self) {
        self.content_len = 0;
        self.has_content = false;
        self.reasoning_len = 0;
        self.calls.clear();
        self.id = None;
        self.finish_reason = None;
        self.timings = None;
        self.last_predicted = 0;
        self.reasoning_tokens = 0;
        self.in_reasoning = false;
    }

    /// Folds one chunk in. On error nothing changed.
    pub fn push(&mut self, chunk: &Chunk<'_>) -> Result<(), AssembleError> {
        self.check(chunk)?;

        if let (Some(id), None) = (chunk.id, &self.id) {
            keep(&mut self.id, id);
        }
        if let Some(s) = chunk.content {
            self.content[self.content_len..self.content_len + s.len()]
                .copy_from_slice(s.as_bytes());
            self.content_len += s.len();
        }
        if let Some(s) = chunk.reasoning_content {
            self.reasoning[self.reasoning_len..self.reasoning_len + s.len()]
                .copy_from_slice(s.as_bytes());
            self.reasoning_len += s.len();
        }
        for d in chunk.tool_calls() {
            let i = d.index as usize;
            if i >= self.calls.len() {
                // Fits: `check` refused an index past CALLS.
                let _ = self.calls.resize(i + 1, CallMeta::EMPTY);
            }
            let (Some(meta), Some(args)) = (self.calls.get_mut(i), self.args.get_mut(i)) else {
                continue;
            };
            meta.seen = true;
            if let (Some(id), None) = (d.id, &meta.id) {
                keep(&mut meta.id, id);
            }
            if let (Some(name), None) = (d.name, &meta.name) {
                keep(&mut meta.name, name);
            }
            if let Some(a) = d.arguments {
                args[meta.args_len..meta.args_len + a.len()].copy_from_slice(a.as_bytes());
                meta.args_len += a.len();
            }
        }
        if chunk.finish_reason.is_some() {
            self.finish_reason = chunk.finish_reason;
        }

        // Reasoning tokens: the growth of predicted_n is charged to reasoning while
        // reasoning streams (this chunk carries reasoning, or no text and reasoning was last).
        let carries_answer =
            chunk.content.is_some_and(|s| !s.is_empty()) || !chunk.tool_calls().is_empty();
        let carries_reasoning = chunk.reasoning_content.is_some_and(|s| !s.is_empty());
        if carries_reasoning {
            self.in_reasoning = true;
        }
        if let Some(t) = chunk.timings {
            let grown = t.predicted_n.saturating_sub(self.last_predicted);
            if carries_reasoning || (self.in_reasoning && !carries_answer) {
                self.reasoning_tokens = self.reasoning_tokens.saturating_add(grown);
            }
            self.last_predicted = self.last_predicted.max(t.predicted_n);
            self.timings = Some(t);
        }
        if carries_answer {
            self.in_reasoning = false;
        }
        if chunk.content.is_some_and(|s| !s.is_empty()) {
            self.has_content = true;
        }
        Ok(())
    }

    /// Every rule `push` enforces, checked before anything is written.
    fn check(&self, chunk: &Chunk<'_>) -> Result<(), AssembleError> {
        if let Some(id) = chunk.id {
            if id.len() > MAX_COMPLETION_ID {
                return Err(AssembleError::CompletionIdTooLong);
            }
            if self.id.as_deref().is_some_and(|known| known != id) {
                return Err(AssembleError::CompletionIdChanged);
            }
        }
        if self.finish_reason.is_some()
            && (chunk.has_delta()
                || chunk
                    .finish_reason
                    .is_some_and(|r| Some(r) != self.finish_reason))
        {
            return Err(AssembleError::DeltaAfterFinish);
        }
        let content = chunk.content.map_or(0, str::len);
        if content > CONTENT - self.content_len {
            return Err(AssembleError::ContentFull);
        }
        let reasoning = chunk.reasoning_content.map_or(0, str::len);
        if reasoning > REASONING - self.reasoning_len {
            return Err(AssembleError::ReasoningFull);
        }
        let deltas = chunk.tool_calls();
        for (k, d) in deltas.iter().enumerate() {
            let index = d.index;
            let i = index as usize;
            if i >= CALLS {
                return Err(AssembleError::TooManyToolCalls { index });
            }
            let meta = self.calls.get(i).unwrap_or(&CallMeta::EMPTY);
            // Earlier deltas of the same chunk for the same call count too.
            let earlier = &deltas[..k];
            if let Some(id) = d.id {
                if id.len() > MAX_TOOL_CALL_ID {
                    return Err(AssembleError::ToolCallIdTooLong { index });
                }
                let known = meta.id.as_deref().or_else(|| {
                    earlier
                        .iter()
                        .filter(|e| e.index == index)
                        .find_map(|e| e.id)
                });
                if known.is_some_and(|k| k != id) {
                    return Err(AssembleError::ToolCallIdChanged { index });
                }
            }
            if let Some(name) = d.name {
                if name.len() > MAX_TOOL_NAME {
                    return Err(AssembleError::ToolNameTooLong { index });
                }
                let known = meta.name.as_deref().or_else(|| {
                    earlier
                        .iter()
                        .filter(|e| e.index == index)
                        .find_map(|e| e.name)
                });
                if known.is_some_and(|k| k != name) {
                    return Err(AssembleError::ToolNameChanged { index });
                }
            }
            let pending: usize = deltas[..=k]
                .iter()
                .filter(|e| e.index == index)
                .map(|e| e.arguments.map_or(0, str::len))
                .sum();
            if pending > ARGS - meta.args_len {
                return Err(AssembleError::ArgumentsFull { index });
            }
        }
        Ok(())
    }

    /// The completion id, once a chunk carried it.
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The latest timings.
    pub fn timings(&self) -> Option<Timings> {
        self.timings
    }

    /// Tokens generated while reasoning streamed so far (for the thinking cap).
    pub fn reasoning_tokens(&self) -> u64 {
        self.reasoning_tokens
    }

    /// The `finish_reason`, once the final chunk arrived.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish_reason
    }

    /// The content so far (`None` until a non-empty piece arrived).
    pub fn content(&self) -> Option<&str> {
        self.has_content
            .then(|| core::str::from_utf8(&self.content[..self.content_len]).unwrap_or_default())
    }

    /// The reasoning so far (`None` until a non-empty piece arrived).
    pub fn reasoning_content(&self) -> Option<&str> {
        (self.reasoning_len > 0).then(|| {
            core::str::from_utf8(&self.reasoning[..self.reasoning_len]).unwrap_or_default()
        })
    }

    /// The tool calls seen so far, in index order: for the output of a request that failed
    /// part-way, so an id or name may be empty and the arguments incomplete.
    pub fn tool_calls(&self) -> ToolCalls<'_> {
        ToolCalls {
            metas: &self.calls,
            args: self.args.as_flattened(),
            stride: ARGS,
        }
    }

    /// The finished message. A stream without `finish_reason` is
    /// [`AssembleError::NoFinishReason`]; a missing `[DONE]` afterwards does not matter.
    pub fn finish(&self) -> Result<Message<'_>, AssembleError> {
        let finish_reason = self.finish_reason.ok_or(AssembleError::NoFinishReason)?;
        let id = self.id().ok_or(AssembleError::NoCompletionId)?;
        for (i, m) in self.calls.iter().enumerate() {
            if !(m.seen && m.id.is_some() && m.name.is_some()) {
                return Err(AssembleError::IncompleteToolCall { index: i as u32 });
            }
        }
        Ok(Message {
            id,
            content: self.content(),
            reasoning_content: self.reasoning_content(),
            tool_calls: ToolCalls {
                metas: &self.calls,
                args: self.args.as_flattened(),
                stride: ARGS,
            },
            finish_reason,
            timings: self.timings,
            reasoning_tokens: self.reasoning_tokens,
        })
    }
}

/// A finished assistant message, borrowed from the [`Assembler`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    /// The completion id.
    pub id: &'a str,
    /// The answer text (`None` when no non-empty piece arrived).
    pub content: Option<&'a str>,
    /// The thinking text (`None` when no non-empty piece arrived).
    pub reasoning_content: Option<&'a str>,
    /// The tool calls, in index order.
    pub tool_calls: ToolCalls<'a>,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The latest timings; `None` if the stream carried none.
    pub timings: Option<Timings>,
    /// Tokens generated while reasoning streamed.
    pub reasoning_tokens: u64,
}

/// The tool calls of a [`Message`]. Equality compares the calls, not the buffers.
#[derive(Clone, Copy)]
pub struct ToolCalls<'a> {
    metas: &'a [CallMeta],
    args: &'a [u8],
    stride: usize,
}

/// One tool call of a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ToolCallRef<'a> {
    /// The call id.
    pub id: &'a str,
    /// The function name.
    pub name: &'a str,
    /// The raw JSON arguments text, exactly as streamed.
    pub arguments: &'a str,
}

impl<'a> ToolCalls<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// The call at `i`.
    pub fn get(&self, i: usize) -> Option<ToolCallRef<'a>> {
        let m = self.metas.get(i)?;
        let start = i * self.stride;
        let args = self.args.get(start..start + m.args_len)?;
        Some(ToolCallRef {
            id: m.id.as_deref().unwrap_or_default(),
            name: m.name.as_deref().unwrap_or_default(),
            // Cannot fail: only whole `&str`s are appended.
            arguments: core::str::from_utf8(args).unwrap_or_default(),
        })
    }

    /// The calls in index order.
    pub fn iter(&self) -> impl Iterator<Item = ToolCallRef<'a>> + 'a {
        let this = *self;
        (0..this.len()).filter_map(move |i| this.get(i))
    }
}

impl PartialEq for ToolCalls<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for ToolCalls<'_> {}

impl fmt::Debug for ToolCalls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}
