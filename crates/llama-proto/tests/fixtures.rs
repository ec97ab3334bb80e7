//! Against the transcripts recorded from the real llama-server (`fixtures/`):
//! the message assembled from `<name>.sse` equals the message of `<name>.response.json`, the
//! non-streamed answer to the same request with greedy sampling.
//!
//! Ids are not compared: llama-server draws the completion id and every tool-call id at
//! random per request, so only their presence is checked.

mod common;

use llama_proto::{decode_chunk, AssembleError, Assembler, FinishReason, Payload, Timings};
use serde_json::Value;

/// The message fields the issue compares: content, reasoning, tool calls (name, arguments),
/// finish reason. Empty text is `None` on both sides: the non-streamed response writes an
/// empty content as `""`, the stream sends no piece at all.
#[derive(Debug, PartialEq)]
struct Compared {
    content: Option<String>,
    reasoning: Option<String>,
    calls: Vec<(String, String)>,
    finish: FinishReason,
}

fn non_empty(s: Option<&str>) -> Option<String> {
    s.filter(|s| !s.is_empty()).map(str::to_owned)
}

fn from_response(name: &str) -> Compared {
    let v: Value = serde_json::from_slice(&common::read(&format!("{name}.response.json")))
        .expect("response.json is JSON");
    let choice = &v["choices"][0];
    let m = &choice["message"];
    let calls = m["tool_calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    assert!(
                        t["id"].as_str().is_some_and(|s| !s.is_empty()),
                        "tool call id"
                    );
                    (
                        t["function"]["name"].as_str().unwrap().to_owned(),
                        t["function"]["arguments"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Compared {
        content: non_empty(m["content"].as_str()),
        reasoning: non_empty(m["reasoning_content"].as_str()),
        calls,
        finish: FinishReason::from_wire(choice["finish_reason"].as_str().unwrap()).unwrap(),
    }
}

/// Assembles `<name>.sse` and hands the finished message to `f`.
fn assembled<R>(name: &str, f: impl FnOnce(&llama_proto::Message<'_>) -> R) -> R {
    let mut s = common::storage();
    let mut asm = Assembler::new(&mut s.content, &mut s.reasoning, &mut s.args);
    let payloads = common::payloads(name);
    let mut text = vec![0u8; payloads.iter().map(Vec::len).max().unwrap()];
    for p in &payloads {
        match decode_chunk(p, &mut text) {
            Ok(Payload::Chunk(c)) => asm.push(&c).expect("fixture chunk assembles"),
            other => panic!("{name}: {other:?} for {}", String::from_utf8_lossy(p)),
        }
    }
    let m = asm.finish().expect("fixture stream finishes");
    assert!(!m.id.is_empty());
    f(&m)
}

fn compared(m: &llama_proto::Message<'_>) -> Compared {
    Compared {
        content: non_empty(m.content),
        reasoning: non_empty(m.reasoning_content),
        calls: m
            .tool_calls
            .iter()
            .map(|t| {
                assert!(!t.id.is_empty(), "tool call id");
                (t.name.to_owned(), t.arguments.to_owned())
            })
            .collect(),
        finish: m.finish_reason,
    }
}

#[test]
fn plain_reassembles_to_the_non_streamed_message() {
    let got = assembled("plain", compared);
    assert_eq!(got, from_response("plain"));
    assert!(got.content.is_some());
    assert_eq!(got.finish, FinishReason::Stop);
}

#[test]
fn thinking_reassembles_to_the_non_streamed_message() {
    let got = assembled("thinking", compared);
    assert_eq!(got, from_response("thinking"));
    assert!(
        got.reasoning.is_some(),
        "the thinking fixture has reasoning"
    );
}

#[test]
fn tool_call_reassembles_to_the_non_streamed_message() {
    let got = assembled("tool_call", compared);
    assert_eq!(got, from_response("tool_call"));
    assert_eq!(got.finish, FinishReason::ToolCalls);
    assert!(!got.calls.is_empty());
    for (_, args) in &got.calls {
        let v: Value = serde_json::from_str(args).expect("arguments are JSON");
        assert!(v.is_object(), "arguments start with the first brace");
    }
}

#[test]
fn timings_are_the_last_ones_sent() {
    for name in common::PAIRED.iter().chain(common::SSE_ONLY.iter()) {
        let last = common::payloads(name)
            .iter()
            .rev()
            .find_map(|p| {
                let v: Value = serde_json::from_slice(p).unwrap();
                let t = v.get("timings")?;
                Some(Timings {
                    cache_n: t["cache_n"].as_u64().unwrap(),
                    prompt_n: t["prompt_n"].as_u64().unwrap(),
                    predicted_n: t["predicted_n"].as_u64().unwrap(),
                })
            })
            .expect("fixture carries timings");
        assert_eq!(assembled(name, |m| m.timings), Some(last), "{name}");
    }
}

#[test]
fn reasoning_tokens_are_counted_while_reasoning_streams() {
    let (tokens, total) = assembled("thinking", |m| {
        (m.reasoning_tokens, m.timings.expect("timings").predicted_n)
    });
    assert!(tokens > 0 && tokens <= total, "{tokens} of {total}");
    let (tokens, _) = assembled("plain", |m| {
        (m.reasoning_tokens, m.timings.expect("timings").predicted_n)
    });
    assert_eq!(tokens, 0);
}

#[test]
fn sse_only_fixtures_assemble() {
    for name in common::SSE_ONLY {
        assembled(name, |_| ());
    }
}

#[test]
fn progress_fixture_reports_prompt_progress() {
    let mut seen = Vec::new();
    for p in common::payloads("progress") {
        let mut text = vec![0u8; p.len()];
        if let Ok(Payload::Chunk(c)) = decode_chunk(&p, &mut text) {
            if let Some(pp) = c.prompt_progress {
                seen.push(pp);
            }
        }
    }
    assert!(
        !seen.is_empty(),
        "no prompt_progress in the progress fixture"
    );
    for w in seen.windows(2) {
        assert!(w[0].processed <= w[1].processed);
    }
    for p in &seen {
        assert!(p.processed <= p.total && p.cache <= p.total, "{p:?}");
    }
}

#[test]
fn a_transcript_cut_before_its_finish_reason_is_reported() {
    let payloads = common::payloads("plain");
    let cut = payloads
        .iter()
        .position(|p| {
            let v: Value = serde_json::from_slice(p).unwrap();
            !v["choices"][0]["finish_reason"].is_null()
        })
        .expect("plain has a finish_reason");
    let mut s = common::storage();
    let mut asm = Assembler::new(&mut s.content, &mut s.reasoning, &mut s.args);
    let mut text = vec![0u8; 1 << 16];
    for p in &payloads[..cut] {
        let Ok(Payload::Chunk(c)) = decode_chunk(p, &mut text) else {
            panic!()
        };
        asm.push(&c).unwrap();
    }
    assert_eq!(asm.finish(), Err(AssembleError::NoFinishReason));
}

#[test]
fn reasoning_end_stops_the_count_when_the_answer_starts() {
    let (tokens, total, reasoning, content) = assembled("reasoning_end", |m| {
        (
            m.reasoning_tokens,
            m.timings.expect("timings").predicted_n,
            m.reasoning_content.map(str::len),
            m.content.map(str::len),
        )
    });
    assert!(reasoning.is_some() && content.is_some());
    assert!(tokens > 0 && tokens < total, "{tokens} of {total}");
}
