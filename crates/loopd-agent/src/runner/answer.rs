//! What one answer asks for: its exit calls set aside, and its normal calls, from the server's
//! `tool_calls` or, when it has none, from `<tool_call>` blocks written in its content (the
//! fallback parser). A pure function of the answer and the tools.

use llama_proto::{prose, text_calls};

use loopd_client::llama::{AssistantMessage, ToolCall};

use super::{CallSource, ExitSignal, FailReason, ToolRegistry};

/// What one answer asks for, once exit calls are set aside.
#[derive(Debug)]
pub(super) struct Asked {
    /// Normal calls in order, with their source.
    pub calls: Vec<(ToolCall, CallSource)>,
    /// Exit calls in order, recorded and never run.
    pub exits: Vec<ExitSignal>,
    /// The content to keep in the assistant message (the prose around text calls).
    pub content: Option<String>,
}

/// Reads `answer`, the answer of generation `generation`: `Err` with `tool_parse_error` and
/// its detail when a `<tool_call>` block does not parse or names no tool.
pub(super) fn asked(
    tools: &ToolRegistry,
    answer: &AssistantMessage,
    generation: u32,
) -> Result<Asked, (FailReason, String)> {
    let mut asked = Asked {
        calls: Vec::new(),
        exits: Vec::new(),
        content: answer.content.clone(),
    };
    let sort = |asked: &mut Asked, call: ToolCall, source| {
        if tools.is_exit(&call.name) {
            asked.exits.push(ExitSignal {
                generation,
                call,
                source,
            });
        } else {
            asked.calls.push((call, source));
        }
    };
    if !answer.tool_calls.is_empty() {
        for c in &answer.tool_calls {
            sort(&mut asked, c.clone(), CallSource::Native);
        }
        return Ok(asked);
    }
    let Some(content) = answer.content.as_deref() else {
        return Ok(asked);
    };
    let mut found = false;
    for (k, block) in text_calls(content).enumerate() {
        found = true;
        let call = block.outcome.map_err(|e| {
            (
                FailReason::ToolParseError,
                format!("<tool_call> block at byte {}: {e}", block.start),
            )
        })?;
        if tools.get(call.name).is_none() {
            return Err((
                FailReason::ToolParseError,
                format!(
                    "<tool_call> block at byte {} names no tool: `{}`",
                    block.start, call.name
                ),
            ));
        }
        let call = ToolCall {
            id: format!("text-{generation}-{k}"),
            name: call.name.to_owned(),
            arguments: call.arguments.to_owned(),
        };
        sort(&mut asked, call, CallSource::Text);
    }
    if found {
        let kept: String = prose(content).collect();
        let kept = kept.trim();
        asked.content = (!kept.is_empty()).then(|| kept.to_owned());
    }
    Ok(asked)
}
