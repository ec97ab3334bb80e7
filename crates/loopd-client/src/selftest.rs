//! The startup self-test (design section 5): three checks that the deployed server is the one
//! the config describes, that tool calls parse, and that turn 2 of a conversation hits the cache.
//!
//! Each check returns a [`Check`] with the figures it compared, so `loopd selftest` can print
//! one line per check whatever the outcome. A request that fails outright fails its check with
//! the error as its figure; nothing here panics on what the server says.
//!
//! Every request pins its sampling ([`SAMPLING`]: temperature 0 and a seed) and a small
//! `max_tokens`, so the answers do not vary from run to run and the three checks stay near the
//! design's 1,000 tokens: no turn can ramble until the slot's context is full.

use std::fmt;

use llama_proto::hash::sha256;

use crate::config::Sampling;
use crate::llama::{
    cache_outcome, AssistantMessage, CacheOutcome, ChatEvent, ChatMessage, ChatOptions,
    ChatRequest, Client, FinishReason, ToolCall, ToolSchema, CACHE_LOSS_TOLERANCE,
};

/// The tool of check 2.
pub const TOOL_NAME: &str = "get_weather";

/// The sampling of every self-test request: greedy, with a fixed seed.
pub const SAMPLING: Sampling = Sampling {
    temperature: Some(0.0),
    top_p: None,
    top_k: None,
    min_p: None,
    presence_penalty: None,
    repeat_penalty: None,
    seed: Some(20_260_917),
};

/// `max_tokens` of check 2: a call of [`TOOL_NAME`] with a city is about 25 tokens.
pub const TOOL_MAX_TOKENS: u64 = 64;

/// `max_tokens` of each turn of check 3: the answers are a few words.
pub const CACHE_MAX_TOKENS: u64 = 24;

/// The outcome of one check: its name, whether it passed, and the figures it compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Short name, as printed (`server`, `tool-call`, `cache`).
    pub name: &'static str,
    /// Whether the check passed.
    pub passed: bool,
    /// Expected and got, in words.
    pub detail: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed { "ok  " } else { "FAIL" };
        write!(f, "{verdict} {:<9} {}", self.name, self.detail)
    }
}

/// Runs the three checks in order on `slot`, calling `report` after each one.
pub fn run(client: &Client, slot: u32, report: &mut dyn FnMut(&Check)) -> Vec<Check> {
    let mut checks = Vec::with_capacity(3);
    for check in [server_matches, tool_call_parses, turn_two_hits_cache] {
        let c = check(client, slot);
        report(&c);
        checks.push(c);
    }
    checks
}

/// Check 1: `/props` against the config's `[expect]` section.
pub fn server_matches(client: &Client, _slot: u32) -> Check {
    let name = "server";
    let Some(expect) = client.config().expect.as_ref() else {
        return fail(name, "the config has no [expect] section".into());
    };
    let props = match client.props() {
        Ok(p) => p,
        Err(e) => return fail(name, format!("GET /props failed: {e}")),
    };
    let got_hash = match sha256(props.chat_template.as_bytes()) {
        Ok(h) => h.to_string(),
        Err(e) => return fail(name, format!("hashing chat_template failed: {e}")),
    };
    let want_hash = expect.chat_template_sha256.to_ascii_lowercase();
    let passed = got_hash == want_hash
        && props.n_ctx == expect.n_ctx
        && props.total_slots == expect.total_slots;
    Check {
        name,
        passed,
        detail: format!(
            "chat_template sha256 expected {want_hash} got {got_hash}; n_ctx expected {} got {}; \
             total_slots expected {} got {}",
            expect.n_ctx, props.n_ctx, expect.total_slots, props.total_slots
        ),
    }
}

/// The fixed conversation of check 2: two worked examples, then the question. A small model
/// copies the pattern and a large one needs no help; both answer with a call.
pub fn tool_request(slot: u32) -> ChatRequest {
    let example = |id: &str, city: &str| {
        ChatMessage::Assistant(AssistantMessage {
            content: Some(String::new()),
            reasoning_content: None,
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: TOOL_NAME.into(),
                arguments: format!("{{\"city\": \"{city}\"}}"),
            }],
        })
    };
    let user = |q: &str| ChatMessage::User { content: q.into() };
    let messages = vec![
        ChatMessage::System {
            content: "You answer every question by calling a tool.".into(),
        },
        user("What is the weather in Rome?"),
        example("call_1", "Rome"),
        user("What is the weather in Oslo?"),
        example("call_2", "Oslo"),
        user("What is the weather in Paris?"),
    ];
    let mut req = ChatRequest::new(slot, messages).with_options(pinned(TOOL_MAX_TOKENS));
    req.tools = vec![ToolSchema {
        name: TOOL_NAME.into(),
        description: "Get the current weather for a city.".into(),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name"}},
            "required": ["city"],
        }),
    }];
    req
}

/// No thinking, at most `max_tokens`, and [`SAMPLING`], so that an answer does not vary.
fn pinned(max_tokens: u64) -> ChatOptions {
    ChatOptions {
        thinking: false,
        max_tokens: Some(max_tokens),
        sampling: Some(SAMPLING),
    }
}

/// Check 2: the completion holds a call of [`TOOL_NAME`] whose arguments are a JSON object,
/// and finishes with `tool_calls`.
pub fn tool_call_parses(client: &Client, slot: u32) -> Check {
    let name = "tool-call";
    let done = match client.chat_with_retry(&tool_request(slot), &mut ignore) {
        Ok(c) => c,
        Err(e) => return fail(name, format!("the request failed: {e}")),
    };
    let call = done.message.tool_calls.iter().find(|c| c.name == TOOL_NAME);
    let args_ok = call.is_some_and(|c| {
        serde_json::from_str::<serde_json::Value>(&c.arguments).is_ok_and(|v| v.is_object())
    });
    let passed = args_ok && done.finish_reason == FinishReason::ToolCalls;
    let got_calls: Vec<String> = done
        .message
        .tool_calls
        .iter()
        .map(|c| format!("{}({})", c.name, c.arguments))
        .collect();
    Check {
        name,
        passed,
        detail: format!(
            "expected a {TOOL_NAME} call with JSON object arguments and finish_reason tool_calls; \
             got [{}] finish_reason {}",
            got_calls.join(", "),
            done.finish_reason.as_str()
        ),
    }
}

/// The system prompt of check 3. It is long enough (well over the 64-token allowance of
/// `cache_outcome`) that a turn 2 which reused nothing is reported as a loss.
pub const CACHE_SYSTEM_PROMPT: &str = "You are a terse assistant on a small research ship. \
The crew ask you short questions while they work: about the weather, the instruments, the stores \
in the hold, the charts, and the names of things they see over the side. Answer each question in \
a few words, without greetings, lists or explanations, and never ask a question back. If you do \
not know, say so in three words. Keep every answer on one line. The ship is quiet at night and the \
watch changes every four hours; the crew are tired and want short answers.";

/// The first turn of check 3.
pub fn cache_request(slot: u32) -> ChatRequest {
    let messages = vec![
        ChatMessage::System {
            content: CACHE_SYSTEM_PROMPT.into(),
        },
        ChatMessage::User {
            content: "Name a colour.".into(),
        },
    ];
    ChatRequest::new(slot, messages).with_options(pinned(CACHE_MAX_TOKENS))
}

/// Check 3: a two-turn exchange on `slot`; turn 2 must reuse turn 1's prompt and answer. A
/// server that sends no `timings` fails it: nothing would show a hit.
pub fn turn_two_hits_cache(client: &Client, slot: u32) -> Check {
    let name = "cache";
    let mut req = cache_request(slot);
    let first = match client.chat_with_retry(&req, &mut ignore) {
        Ok(c) => c,
        Err(e) => return fail(name, format!("turn 1 failed: {e}")),
    };
    req.messages
        .push(ChatMessage::Assistant(first.message.clone()));
    req.messages.push(ChatMessage::User {
        content: "Name another.".into(),
    });
    let second = match client.chat_with_retry(&req, &mut ignore) {
        Ok(c) => c,
        Err(e) => return fail(name, format!("turn 2 failed: {e}")),
    };
    let (Some(before), Some(after)) = (first.timings, second.timings) else {
        let turn = if first.timings.is_none() { 1 } else { 2 };
        return fail(
            name,
            format!("expected timings on both turns; the server sent none on turn {turn}"),
        );
    };
    let outcome = cache_outcome(&before, &after);
    Check {
        name,
        passed: !matches!(outcome, CacheOutcome::Loss { .. }),
        detail: format!(
            "turn 2 expected to reuse about {} tokens (at most {CACHE_LOSS_TOLERANCE} short); got \
             cache_n {} (prompt_n {})",
            before.total(),
            after.cache_n,
            after.prompt_n
        ),
    }
}

fn fail(name: &'static str, detail: String) -> Check {
    Check {
        name,
        passed: false,
        detail,
    }
}

fn ignore(_: &ChatEvent) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_prints_its_verdict_name_and_figures() {
        let c = Check {
            name: "cache",
            passed: false,
            detail: "expected 1 got 2".into(),
        };
        assert_eq!(c.to_string(), "FAIL cache     expected 1 got 2");
        let c = Check { passed: true, ..c };
        assert_eq!(c.to_string(), "ok   cache     expected 1 got 2");
    }

    #[test]
    fn the_tool_request_ends_with_the_question_and_offers_one_tool() {
        let r = tool_request(1);
        assert_eq!(r.slot, 1);
        assert!(!r.options.thinking);
        assert_eq!(r.tools.len(), 1);
        assert_eq!(r.tools[0].name, TOOL_NAME);
        assert_eq!(
            r.messages.last(),
            Some(&ChatMessage::User {
                content: "What is the weather in Paris?".into()
            })
        );
    }
}
