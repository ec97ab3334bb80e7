//! One payload as the walk in [`crate::scan`] leaves it: the fields the assembler needs,
//! strings still escaped, written in place (nothing is returned by value on the way).

use crate::chunk::Chunk;

/// One parsed payload. `chunk` holds the strings still escaped and no `finish_reason`.
#[derive(Default)]
pub(crate) struct RawChunk<'a> {
    pub chunk: Chunk<'a>,
    pub finish_reason: Option<&'a str>,
    /// `choices` had more than one element.
    pub too_many_choices: bool,
    /// `delta.tool_calls` had more than [`MAX_TOOL_CALL_DELTAS`](crate::MAX_TOOL_CALL_DELTAS)
    /// elements.
    pub too_many_tool_calls: bool,
    pub error: Option<RawError<'a>>,
}

/// An error object, strings still escaped.
#[derive(Clone, Copy)]
pub(crate) struct RawError<'a> {
    pub code: Option<u32>,
    pub message: &'a str,
    pub kind: Option<&'a str>,
}
