//! One rule per test for the delta assembler, on inline payloads.

use llama_proto::{
    decode_chunk, AssembleError, Assembler, FinishReason, Payload, Timings, ToolCallRef,
    MAX_COMPLETION_ID, MAX_TOOL_CALL_ID, MAX_TOOL_NAME,
};

const C: usize = 16;
const R: usize = 16;
const T: usize = 2;
const A: usize = 16;

struct Bufs {
    content: [u8; C],
    reasoning: [u8; R],
    args: [[u8; A]; T],
}

fn bufs() -> Bufs {
    Bufs {
        content: [0; C],
        reasoning: [0; R],
        args: [[0; A]; T],
    }
}

fn asm(b: &mut Bufs) -> Assembler<'_, C, R, T, A> {
    Assembler::new(&mut b.content, &mut b.reasoning, &mut b.args)
}

fn push(a: &mut Assembler<'_, C, R, T, A>, p: &str) -> Result<(), AssembleError> {
    let mut text = vec![0u8; p.len()];
    match decode_chunk(p.as_bytes(), &mut text).expect("test payload decodes") {
        Payload::Chunk(c) => a.push(&c),
        Payload::Error(e) => panic!("server error {e:?}"),
    }
}

fn content(s: &str) -> String {
    format!(
        r#"{{"id":"c1","choices":[{{"delta":{{"content":{}}}}}]}}"#,
        serde_json::to_string(s).unwrap()
    )
}

fn reasoning(s: &str, predicted: u64) -> String {
    format!(
        r#"{{"id":"c1","choices":[{{"delta":{{"reasoning_content":{}}}}}],"timings":{{"cache_n":0,"prompt_n":5,"predicted_n":{predicted}}}}}"#,
        serde_json::to_string(s).unwrap()
    )
}

fn call(index: u32, id: Option<&str>, name: Option<&str>, args: Option<&str>) -> String {
    let mut f = serde_json::Map::new();
    if let Some(n) = name {
        f.insert("name".into(), n.into());
    }
    if let Some(a) = args {
        f.insert("arguments".into(), a.into());
    }
    let mut c = serde_json::json!({"index": index, "function": f});
    if let Some(i) = id {
        c["id"] = i.into();
        c["type"] = "function".into();
    }
    serde_json::json!({"id":"c1","choices":[{"delta":{"tool_calls":[c]}}]}).to_string()
}

const STOP: &str = r#"{"id":"c1","choices":[{"finish_reason":"stop","index":0,"delta":{}}],"timings":{"cache_n":3,"prompt_n":5,"predicted_n":9}}"#;

#[test]
fn content_concatenates_and_finishes() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(
        &mut a,
        r#"{"id":"c1","choices":[{"delta":{"role":"assistant","content":null}}]}"#,
    )
    .unwrap();
    push(&mut a, &content("Hel")).unwrap();
    push(&mut a, &content("lo!")).unwrap();
    push(&mut a, STOP).unwrap();
    let m = a.finish().unwrap();
    assert_eq!(m.id, "c1");
    assert_eq!(m.content, Some("Hello!"));
    assert_eq!(m.reasoning_content, None);
    assert!(m.tool_calls.is_empty());
    assert_eq!(m.finish_reason, FinishReason::Stop);
    assert_eq!(
        m.timings,
        Some(Timings {
            cache_n: 3,
            prompt_n: 5,
            predicted_n: 9
        })
    );
    assert_eq!(m.reasoning_tokens, 0);
}

#[test]
fn no_finish_reason_is_reported_and_missing_done_is_fine() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &content("x")).unwrap();
    assert_eq!(a.finish(), Err(AssembleError::NoFinishReason));
    push(&mut a, STOP).unwrap();
    assert!(a.finish().is_ok());
}

#[test]
fn no_completion_id_is_reported() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(
        &mut a,
        r#"{"choices":[{"finish_reason":"stop","delta":{}}]}"#,
    )
    .unwrap();
    assert_eq!(a.finish(), Err(AssembleError::NoCompletionId));
}

#[test]
fn content_capacity_at_limit_and_one_past_changes_nothing() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &content(&"x".repeat(C - 1))).unwrap();
    assert_eq!(
        push(&mut a, &content("yz")),
        Err(AssembleError::ContentFull)
    );
    push(&mut a, &content("y")).unwrap();
    assert_eq!(a.content(), Some(&*format!("{}y", "x".repeat(C - 1))));
    assert_eq!(push(&mut a, &content("z")), Err(AssembleError::ContentFull));
}

#[test]
fn reasoning_capacity_at_limit_and_one_past() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &reasoning(&"r".repeat(R), 1)).unwrap();
    assert_eq!(
        push(&mut a, &reasoning("s", 2)),
        Err(AssembleError::ReasoningFull)
    );
    assert_eq!(a.reasoning_content(), Some(&*"r".repeat(R)));
    assert_eq!(a.reasoning_tokens(), 1);
}

#[test]
fn tool_calls_matched_by_index_first_brace_kept() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &call(0, Some("id0"), Some("get"), Some("{"))).unwrap();
    push(&mut a, &call(1, Some("id1"), Some("put"), None)).unwrap();
    push(&mut a, &call(0, None, None, Some("\"k\":1"))).unwrap();
    push(&mut a, &call(1, None, None, Some("{}"))).unwrap();
    push(&mut a, &call(0, None, None, Some("}"))).unwrap();
    push(
        &mut a,
        r#"{"id":"c1","choices":[{"finish_reason":"tool_calls","delta":{}}]}"#,
    )
    .unwrap();
    let m = a.finish().unwrap();
    assert_eq!(m.finish_reason, FinishReason::ToolCalls);
    assert_eq!(m.content, None);
    let calls: Vec<_> = m.tool_calls.iter().collect();
    assert_eq!(
        calls,
        [
            ToolCallRef {
                id: "id0",
                name: "get",
                arguments: "{\"k\":1}"
            },
            ToolCallRef {
                id: "id1",
                name: "put",
                arguments: "{}"
            },
        ]
    );
}

#[test]
fn tool_calls_so_far_before_the_finish() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    assert!(a.tool_calls().is_empty());
    push(&mut a, &call(0, Some("id0"), Some("get"), Some("{\"k"))).unwrap();
    push(&mut a, &call(1, None, None, Some("{"))).unwrap();
    let calls: Vec<_> = a.tool_calls().iter().collect();
    assert_eq!(
        calls,
        [
            ToolCallRef {
                id: "id0",
                name: "get",
                arguments: "{\"k"
            },
            ToolCallRef {
                id: "",
                name: "",
                arguments: "{"
            },
        ]
    );
    assert_eq!(a.finish(), Err(AssembleError::NoFinishReason));
}

#[test]
fn tool_call_count_at_limit_and_one_past() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &call(T as u32 - 1, Some("i"), Some("n"), None)).unwrap();
    assert_eq!(
        push(&mut a, &call(T as u32, Some("i"), Some("n"), None)),
        Err(AssembleError::TooManyToolCalls { index: T as u32 })
    );
}

#[test]
fn arguments_capacity_at_limit_and_one_past() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(
        &mut a,
        &call(1, Some("i"), Some("n"), Some(&"a".repeat(A - 1))),
    )
    .unwrap();
    push(&mut a, &call(1, None, None, Some("b"))).unwrap();
    assert_eq!(
        push(&mut a, &call(1, None, None, Some("c"))),
        Err(AssembleError::ArgumentsFull { index: 1 })
    );
}

#[test]
fn two_deltas_for_one_call_in_one_chunk_are_counted_together() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    let half = "a".repeat(A / 2 + 1);
    let p = serde_json::json!({"id":"c1","choices":[{"delta":{"tool_calls":[
        {"index":0,"id":"i","function":{"name":"n","arguments":half}},
        {"index":0,"function":{"arguments":half}}]}}]})
    .to_string();
    assert_eq!(
        push(&mut a, &p),
        Err(AssembleError::ArgumentsFull { index: 0 })
    );
    assert!(a.finish().is_err());
}

#[test]
fn short_field_limits() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    let id_ok = "i".repeat(MAX_TOOL_CALL_ID);
    let name_ok = "n".repeat(MAX_TOOL_NAME);
    push(&mut a, &call(0, Some(&id_ok), Some(&name_ok), None)).unwrap();
    let long_id = "i".repeat(MAX_TOOL_CALL_ID + 1);
    assert_eq!(
        push(&mut a, &call(1, Some(&long_id), None, None)),
        Err(AssembleError::ToolCallIdTooLong { index: 1 })
    );
    let long_name = "n".repeat(MAX_TOOL_NAME + 1);
    assert_eq!(
        push(&mut a, &call(1, None, Some(&long_name), None)),
        Err(AssembleError::ToolNameTooLong { index: 1 })
    );
    let cid = |n: usize| format!(r#"{{"id":"{}","choices":[]}}"#, "c".repeat(n));
    let mut b2 = bufs();
    let mut a2 = asm(&mut b2);
    push(&mut a2, &cid(MAX_COMPLETION_ID)).unwrap();
    let mut b3 = bufs();
    let mut a3 = asm(&mut b3);
    assert_eq!(
        push(&mut a3, &cid(MAX_COMPLETION_ID + 1)),
        Err(AssembleError::CompletionIdTooLong)
    );
}

#[test]
fn repeated_same_id_and_name_are_fine_changed_ones_are_not() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &call(0, Some("i"), Some("n"), Some("{"))).unwrap();
    push(&mut a, &call(0, Some("i"), Some("n"), Some("}"))).unwrap();
    assert_eq!(
        push(&mut a, &call(0, Some("j"), None, None)),
        Err(AssembleError::ToolCallIdChanged { index: 0 })
    );
    assert_eq!(
        push(&mut a, &call(0, None, Some("m"), None)),
        Err(AssembleError::ToolNameChanged { index: 0 })
    );
    assert_eq!(
        push(&mut a, r#"{"id":"c2","choices":[]}"#),
        Err(AssembleError::CompletionIdChanged)
    );
}

#[test]
fn missing_tool_call_below_highest_index_is_incomplete() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &call(1, Some("i"), Some("n"), Some("{}"))).unwrap();
    push(
        &mut a,
        r#"{"id":"c1","choices":[{"finish_reason":"tool_calls","delta":{}}]}"#,
    )
    .unwrap();
    assert_eq!(
        a.finish(),
        Err(AssembleError::IncompleteToolCall { index: 0 })
    );
}

#[test]
fn delta_after_finish_is_refused_timings_are_not() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, STOP).unwrap();
    assert_eq!(
        push(&mut a, &content("late")),
        Err(AssembleError::DeltaAfterFinish)
    );
    assert_eq!(
        push(
            &mut a,
            r#"{"choices":[{"finish_reason":"length","delta":{}}]}"#
        ),
        Err(AssembleError::DeltaAfterFinish)
    );
    push(
        &mut a,
        r#"{"id":"c1","choices":[],"timings":{"cache_n":3,"prompt_n":5,"predicted_n":10}}"#,
    )
    .unwrap();
    assert_eq!(a.finish().unwrap().timings.unwrap().predicted_n, 10);
}

#[test]
fn reasoning_tokens_follow_predicted_n_while_reasoning_streams() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &reasoning("a", 1)).unwrap();
    push(&mut a, &reasoning("b", 2)).unwrap();
    // A chunk with timings and no text while reasoning: still reasoning.
    push(
        &mut a,
        r#"{"id":"c1","choices":[],"timings":{"cache_n":0,"prompt_n":5,"predicted_n":4}}"#,
    )
    .unwrap();
    assert_eq!(a.reasoning_tokens(), 4);
    let answer = r#"{"id":"c1","choices":[{"delta":{"content":"A"}}],"timings":{"cache_n":0,"prompt_n":5,"predicted_n":6}}"#;
    push(&mut a, answer).unwrap();
    push(
        &mut a,
        r#"{"id":"c1","choices":[],"timings":{"cache_n":0,"prompt_n":5,"predicted_n":7}}"#,
    )
    .unwrap();
    assert_eq!(a.reasoning_tokens(), 4);
}

#[test]
fn empty_pieces_leave_content_none() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &content("")).unwrap();
    push(&mut a, &reasoning("", 0)).unwrap();
    push(&mut a, STOP).unwrap();
    let m = a.finish().unwrap();
    assert_eq!((m.content, m.reasoning_content), (None, None));
}

#[test]
fn reset_forgets_everything() {
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &content("x")).unwrap();
    push(&mut a, &call(0, Some("i"), Some("n"), Some("{}"))).unwrap();
    push(&mut a, STOP).unwrap();
    a.reset();
    assert_eq!(a.finish(), Err(AssembleError::NoFinishReason));
    push(
        &mut a,
        r#"{"id":"c9","choices":[{"finish_reason":"length","delta":{}}]}"#,
    )
    .unwrap();
    let m = a.finish().unwrap();
    assert_eq!((m.id, m.content, m.tool_calls.len()), ("c9", None, 0));
}

#[cfg(feature = "alloc")]
#[test]
fn into_owned_completion() {
    use llama_proto::{AssistantMessage, Completion, ToolCall};
    let mut b = bufs();
    let mut a = asm(&mut b);
    push(&mut a, &reasoning("think", 2)).unwrap();
    push(&mut a, &call(0, Some("id0"), Some("get"), Some("{}"))).unwrap();
    push(
        &mut a,
        r#"{"id":"c1","choices":[{"finish_reason":"tool_calls","delta":{}}]}"#,
    )
    .unwrap();
    let c = Completion::from(&a.finish().unwrap());
    let message = AssistantMessage {
        content: None,
        reasoning_content: Some("think".into()),
        tool_calls: vec![ToolCall {
            id: "id0".into(),
            name: "get".into(),
            arguments: "{}".into(),
        }],
    };
    // The answer read from the assembler before it is finished is the same value.
    assert_eq!(AssistantMessage::from(&a), message);
    assert_eq!(
        c,
        Completion {
            id: "c1".into(),
            message,
            finish_reason: FinishReason::ToolCalls,
            timings: Some(Timings {
                cache_n: 0,
                prompt_n: 5,
                predicted_n: 2
            }),
            reasoning_tokens: 2,
            thinking_capped: false,
        }
    );
}

#[test]
fn messages_compare_by_content_not_by_stale_buffer_bytes() {
    let mut b1 = bufs();
    let mut b2 = Bufs {
        content: [0xff; C],
        reasoning: [0xff; R],
        args: [[0xff; A]; T],
    };
    let mut a1 = asm(&mut b1);
    let mut a2 = asm(&mut b2);
    for a in [&mut a1, &mut a2] {
        push(a, &call(0, Some("i"), Some("n"), Some("{}"))).unwrap();
        push(
            a,
            r#"{"id":"c1","choices":[{"finish_reason":"tool_calls","delta":{}}]}"#,
        )
        .unwrap();
    }
    assert_eq!(a1.finish().unwrap(), a2.finish().unwrap());
    assert_eq!(
        format!("{:?}", a1.finish().unwrap().tool_calls),
        r#"[ToolCallRef { id: "i", name: "n", arguments: "{}" }]"#
    );
}
