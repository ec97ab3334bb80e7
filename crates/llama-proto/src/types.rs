//! Small Copy types shared by the decoder, the assembler and the owned forms.

/// Why generation stopped, as the final chunk's `finish_reason` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// `"stop"`: the model ended its answer (or hit a stop string).
    Stop,
    /// `"tool_calls"`: the model asked for one or more tool calls.
    ToolCalls,
    /// `"length"`: `max_tokens` or the context ran out.
    Length,
}

impl FinishReason {
    /// The wire name (`"stop"`, `"tool_calls"`, `"length"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
        }
    }

    /// Parses the wire name; `None` for anything else.
    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "stop" => Some(FinishReason::Stop),
            "tool_calls" => Some(FinishReason::ToolCalls),
            "length" => Some(FinishReason::Length),
            _ => None,
        }
    }
}

/// The token counts of a chunk's `timings` object (other timing fields are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Timings {
    /// Prompt tokens reused from the slot's KV cache.
    pub cache_n: u64,
    /// Prompt tokens evaluated for this request.
    pub prompt_n: u64,
    /// Tokens generated so far.
    pub predicted_n: u64,
}

impl Timings {
    /// Tokens the slot holds after this request: `cache_n + prompt_n + predicted_n` (saturating).
    pub const fn total(&self) -> u64 {
        self.cache_n
            .saturating_add(self.prompt_n)
            .saturating_add(self.predicted_n)
    }
}
