//! One rule per test for `decode_chunk` and `decode_error_event`, on inline payloads.

use llama_proto::{
    decode_chunk, decode_error_event, Chunk, DecodeError, FinishReason, Payload, PromptProgress,
    ServerError, Timings, ToolCallDelta, MAX_TOOL_CALL_DELTAS,
};

fn chunk<'a>(p: &'a [u8], text: &'a mut [u8]) -> Chunk<'a> {
    match decode_chunk(p, text) {
        Ok(Payload::Chunk(c)) => c,
        other => panic!("expected a chunk, got {other:?}"),
    }
}

#[test]
fn first_chunk_role_and_null_content() {
    let p = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1764400000,"id":"chatcmpl-abc","model":"m","system_fingerprint":"b1-x","object":"chat.completion.chunk"}"#;
    let mut t = [0u8; 256];
    let c = chunk(p, &mut t);
    assert_eq!(c.id, Some("chatcmpl-abc"));
    assert_eq!(c.content, None);
    assert_eq!(c.reasoning_content, None);
    assert!(c.tool_calls().is_empty());
    assert_eq!(c.finish_reason, None);
    assert!(!c.has_delta());
}

#[test]
fn content_and_reasoning_deltas() {
    let p =
        br#"{"choices":[{"index":0,"delta":{"reasoning_content":"hm","content":"Hi"}}],"id":"x"}"#;
    let mut t = [0u8; 256];
    let c = chunk(p, &mut t);
    assert_eq!(c.content, Some("Hi"));
    assert_eq!(c.reasoning_content, Some("hm"));
    assert!(c.has_delta());
}

#[test]
fn timings_keep_three_counts_and_skip_floats() {
    let p = br#"{"choices":[{"index":0,"delta":{"content":"a"}}],"timings":{"cache_n":12,"prompt_n":34,"prompt_ms":1.5e1,"prompt_per_token_ms":-0.25,"prompt_per_second":2.0,"predicted_n":5,"predicted_ms":9.75,"draft_n":2,"draft_n_accepted":1}}"#;
    let mut t = [0u8; 256];
    assert_eq!(
        chunk(p, &mut t).timings,
        Some(Timings {
            cache_n: 12,
            prompt_n: 34,
            predicted_n: 5
        })
    );
}

#[test]
fn prompt_progress() {
    let p = br#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"id":"x","prompt_progress":{"total":2048,"cache":100,"processed":612,"time_ms":1234}}"#;
    let mut t = [0u8; 256];
    assert_eq!(
        chunk(p, &mut t).prompt_progress,
        Some(PromptProgress {
            total: 2048,
            cache: 100,
            processed: 612,
            time_ms: 1234
        })
    );
}

#[test]
fn finish_reasons() {
    for (wire, want) in [
        ("stop", FinishReason::Stop),
        ("tool_calls", FinishReason::ToolCalls),
        ("length", FinishReason::Length),
    ] {
        let p = format!(r#"{{"choices":[{{"finish_reason":"{wire}","index":0,"delta":{{}}}}]}}"#);
        let mut t = [0u8; 256];
        assert_eq!(chunk(p.as_bytes(), &mut t).finish_reason, Some(want));
    }
    let mut t = [0u8; 256];
    assert_eq!(
        decode_chunk(
            br#"{"choices":[{"finish_reason":"eos","delta":{}}]}"#,
            &mut t
        ),
        Err(DecodeError::UnknownFinishReason)
    );
}

#[test]
fn usage_chunk_with_empty_choices() {
    let p = br#"{"choices":[],"id":"x","usage":{"completion_tokens":3,"prompt_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"cache_n":0,"prompt_n":4,"predicted_n":3}}"#;
    let mut t = [0u8; 256];
    let c = chunk(p, &mut t);
    assert!(!c.has_delta());
    assert_eq!(
        c.timings,
        Some(Timings {
            cache_n: 0,
            prompt_n: 4,
            predicted_n: 3
        })
    );
}

#[test]
fn tool_call_deltas() {
    let p = br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]}}]}"#;
    let mut t = [0u8; 256];
    assert_eq!(
        chunk(p, &mut t).tool_calls(),
        &[ToolCallDelta {
            index: 0,
            id: Some("call_1"),
            name: Some("get_weather"),
            arguments: Some("{\"city\":"),
        }]
    );
    let p = br#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"\"Paris\"}"}}]}}]}"#;
    let mut t = [0u8; 256];
    assert_eq!(
        chunk(p, &mut t).tool_calls(),
        &[ToolCallDelta {
            index: 1,
            id: None,
            name: None,
            arguments: Some("\"Paris\"}")
        }]
    );
}

#[test]
fn tool_call_deltas_at_cap_and_one_past() {
    let one = r#"{"index":0,"function":{"arguments":"x"}}"#;
    let mk = |n: usize| {
        let calls = vec![one; n].join(",");
        format!(r#"{{"choices":[{{"delta":{{"tool_calls":[{calls}]}}}}]}}"#)
    };
    let mut t = [0u8; 1024];
    let at = mk(MAX_TOOL_CALL_DELTAS);
    assert_eq!(
        chunk(at.as_bytes(), &mut t).tool_calls().len(),
        MAX_TOOL_CALL_DELTAS
    );
    let past = mk(MAX_TOOL_CALL_DELTAS + 1);
    assert_eq!(
        decode_chunk(past.as_bytes(), &mut t),
        Err(DecodeError::TooManyToolCallDeltas)
    );
}

#[test]
fn more_than_one_choice_is_refused() {
    let p = br#"{"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}"#;
    let mut t = [0u8; 256];
    assert_eq!(decode_chunk(p, &mut t), Err(DecodeError::TooManyChoices));
}

#[test]
fn escapes_decode_exactly_into_the_callers_buffer() {
    let p = br#"{"choices":[{"delta":{"content":"a\"b\\c\/\n\t\u00e9\ud83d\ude00","reasoning_content":"plain"}}]}"#;
    let mut t = [0u8; 256];
    let c = chunk(p, &mut t);
    assert_eq!(c.content, Some("a\"b\\c/\n\té😀"));
    assert_eq!(c.reasoning_content, Some("plain"));
}

#[test]
fn raw_utf8_passes_through() {
    let p = "{\"choices\":[{\"delta\":{\"content\":\"día 中 😀\"}}]}";
    let mut t = [0u8; 8];
    assert_eq!(chunk(p.as_bytes(), &mut t).content, Some("día 中 😀"));
}

#[test]
fn lone_surrogate_and_raw_control_are_invalid() {
    let mut t = [0u8; 256];
    assert_eq!(
        decode_chunk(br#"{"choices":[{"delta":{"content":"\ud83d"}}]}"#, &mut t),
        Err(DecodeError::InvalidString)
    );
    assert_eq!(
        decode_chunk(
            b"{\"choices\":[{\"delta\":{\"content\":\"a\x01b\"}}]}",
            &mut t
        ),
        Err(DecodeError::InvalidString)
    );
}

#[test]
fn text_buffer_at_limit_and_one_past() {
    // Two escaped strings: "a\n" -> 2 bytes, "\tb" -> 2 bytes.
    let p = br#"{"choices":[{"delta":{"content":"a\n","reasoning_content":"\tb"}}]}"#;
    let mut t = [0u8; 4];
    let c = chunk(p, &mut t);
    assert_eq!((c.content, c.reasoning_content), (Some("a\n"), Some("\tb")));
    let mut t = [0u8; 3];
    assert_eq!(decode_chunk(p, &mut t), Err(DecodeError::TextBufferFull));
}

#[test]
fn unknown_fields_are_ignored_at_every_level() {
    let p = br#"{"zz":[1,{"a":[true,null]}],"choices":[{"logprobs":{"content":[{"token":"a","logprob":-0.1}]},"delta":{"extra":{"x":1},"content":"ok"},"index":0}],"__verbose":{"n":1}}"#;
    let mut t = [0u8; 256];
    assert_eq!(chunk(p, &mut t).content, Some("ok"));
}

#[test]
fn not_json_or_wrong_type_is_a_json_error() {
    let mut t = [0u8; 256];
    assert!(matches!(
        decode_chunk(b"not json", &mut t),
        Err(DecodeError::Json(_))
    ));
    assert!(matches!(
        decode_chunk(br#"{"choices":[{"delta":{"content":5}}]}"#, &mut t),
        Err(DecodeError::Json(_))
    ));
    assert!(matches!(
        decode_chunk(
            br#"{"timings":{"cache_n":-1,"prompt_n":0,"predicted_n":0}}"#,
            &mut t
        ),
        Err(DecodeError::Json(_))
    ));
}

#[test]
fn in_stream_error_payload() {
    let p = br#"{"error":{"code":500,"message":"context \"full\"","type":"server_error"}}"#;
    let mut t = [0u8; 256];
    assert_eq!(
        decode_chunk(p, &mut t),
        Ok(Payload::Error(ServerError {
            code: Some(500),
            kind: Some("server_error"),
            message: "context \"full\"",
        }))
    );
}

#[test]
fn older_event_error_form_bare_and_wrapped() {
    let mut t = [0u8; 256];
    let bare =
        br#"{"code":400,"message":"the prompt does not fit","type":"exceed_context_size_error"}"#;
    assert_eq!(
        decode_error_event(bare, &mut t),
        Ok(ServerError {
            code: Some(400),
            kind: Some("exceed_context_size_error"),
            message: "the prompt does not fit",
        })
    );
    let wrapped = br#"{"error":{"message":"boom"}}"#;
    assert_eq!(
        decode_error_event(wrapped, &mut t),
        Ok(ServerError {
            code: None,
            kind: None,
            message: "boom"
        })
    );
    assert!(matches!(
        decode_error_event(b"{}", &mut t),
        Err(DecodeError::Json(_))
    ));
}
