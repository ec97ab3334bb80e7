//! The nesting limit: every place a value can sit, at [`MAX_NESTING`] and one past it, and the
//! worst payloads that fit in loopd's 1 MiB line decoded on a thread with a small stack.

use llama_proto::{decode_chunk, decode_error_event, DecodeError, Payload, MAX_NESTING};

/// `n` nested arrays around `1`.
fn arrays(n: usize) -> String {
    format!("{}1{}", "[".repeat(n), "]".repeat(n))
}

/// `n` nested objects around `1`.
fn objects(n: usize) -> String {
    format!("{}1{}", r#"{"k":"#.repeat(n), "}".repeat(n))
}

/// One place a deep value can sit: the payload around it, and how many arrays and objects
/// enclose the value there (the top-level object included).
struct Place {
    name: &'static str,
    outer: usize,
    payload: fn(&str) -> String,
}

const PLACES: &[Place] = &[
    Place {
        name: "top level",
        outer: 1,
        payload: |v| format!(r#"{{"choices":[{{"delta":{{"content":"a"}}}}],"x":{v}}}"#),
    },
    Place {
        name: "choices",
        outer: 3,
        payload: |v| format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"a"}},"x":{v}}}]}}"#),
    },
    Place {
        name: "delta",
        outer: 4,
        payload: |v| format!(r#"{{"choices":[{{"delta":{{"content":"a","x":{v}}}}}]}}"#),
    },
    Place {
        name: "tool call",
        outer: 7,
        payload: |v| {
            format!(
                r#"{{"choices":[{{"delta":{{"content":"a","tool_calls":[{{"index":0,"function":{{"name":"f","arguments":"{{}}","x":{v}}}}}]}}}}]}}"#
            )
        },
    },
    Place {
        name: "timings",
        outer: 2,
        payload: |v| {
            format!(
                r#"{{"choices":[{{"delta":{{"content":"a"}}}}],"timings":{{"cache_n":1,"prompt_n":2,"predicted_n":3,"x":{v}}}}}"#
            )
        },
    },
    Place {
        name: "prompt_progress",
        outer: 2,
        payload: |v| {
            format!(
                r#"{{"choices":[{{"delta":{{"content":"a"}}}}],"prompt_progress":{{"total":1,"cache":0,"processed":1,"time_ms":1,"x":{v}}}}}"#
            )
        },
    },
];

fn decode(p: &str) -> Result<Option<String>, DecodeError> {
    let mut text = vec![0u8; p.len()];
    match decode_chunk(p.as_bytes(), &mut text)? {
        Payload::Chunk(c) => Ok(c.content.map(Into::into)),
        Payload::Error(e) => Ok(Some(format!("error: {}", e.message))),
    }
}

#[test]
fn every_place_decodes_at_the_limit_and_refuses_one_past_it() {
    for place in PLACES {
        for (shape, nest) in [
            ("arrays", arrays as fn(usize) -> String),
            ("objects", objects),
        ] {
            let at = (place.payload)(&nest(MAX_NESTING - place.outer));
            assert_eq!(
                decode(&at),
                Ok(Some("a".into())),
                "{} with {shape} at the limit",
                place.name
            );
            let past = (place.payload)(&nest(MAX_NESTING - place.outer + 1));
            assert_eq!(
                decode(&past),
                Err(DecodeError::TooDeep),
                "{} with {shape} one past the limit",
                place.name
            );
        }
    }
}

#[test]
fn a_second_choice_is_checked_for_depth_before_it_is_refused_as_one_too_many() {
    let p = |v: &str| format!(r#"{{"choices":[{{"delta":{{"content":"a"}}}},{v}]}}"#);
    assert_eq!(
        decode(&p(&arrays(MAX_NESTING - 2))),
        Err(DecodeError::TooManyChoices)
    );
    assert_eq!(
        decode(&p(&arrays(MAX_NESTING - 1))),
        Err(DecodeError::TooDeep)
    );
}

#[test]
fn error_payloads_at_the_limit_and_one_past_it() {
    let wrapped = |v: &str| format!(r#"{{"error":{{"code":500,"message":"m","x":{v}}}}}"#);
    assert_eq!(
        decode(&wrapped(&arrays(MAX_NESTING - 2))),
        Ok(Some("error: m".into()))
    );
    assert_eq!(
        decode(&wrapped(&arrays(MAX_NESTING - 1))),
        Err(DecodeError::TooDeep)
    );

    // `event: error` data, in both of its forms.
    let event = |p: &str| {
        let mut text = vec![0u8; p.len()];
        decode_error_event(p.as_bytes(), &mut text).map(|e| String::from(e.message))
    };
    assert_eq!(event(&wrapped(&arrays(MAX_NESTING - 2))), Ok("m".into()));
    assert_eq!(
        event(&wrapped(&objects(MAX_NESTING - 1))),
        Err(DecodeError::TooDeep)
    );
    let bare = |v: &str| format!(r#"{{"code":500,"message":"m","x":{v}}}"#);
    assert_eq!(event(&bare(&arrays(MAX_NESTING - 1))), Ok("m".into()));
    assert_eq!(
        event(&bare(&arrays(MAX_NESTING))),
        Err(DecodeError::TooDeep)
    );
}

#[test]
fn the_payload_itself_counts_as_one_level() {
    // A bare array payload is not a chunk, but its depth is checked first all the same when
    // it is an error event; as a chunk it is refused for its type before anything nests.
    let mut text = [0u8; 8];
    assert!(matches!(
        decode_chunk(b"[[1]]", &mut text),
        Err(DecodeError::Json(_))
    ));
    let deep = format!("{{\"x\":{}}}", arrays(MAX_NESTING - 1));
    assert_eq!(decode(&deep), Ok(None));
    let deeper = format!("{{\"x\":{}}}", arrays(MAX_NESTING));
    assert_eq!(decode(&deeper), Err(DecodeError::TooDeep));
}

#[test]
fn brackets_inside_strings_do_not_count() {
    let s = "[{".repeat(100);
    let p = format!(r#"{{"choices":[{{"delta":{{"content":"{s}","x":"{s}"}}}}],"y":"{s}"}}"#);
    assert_eq!(decode(&p), Ok(Some(s)));
}

/// loopd's SSE line cap: the largest payload a server can get to the decoder.
const LINE_CAP: usize = 1 << 20;

/// Opens `n` brackets around a value and fills up to `len` bytes, unterminated: the attack
/// that once overflowed loopd's stack.
fn flood(prefix: &str, len: usize) -> String {
    let mut p = String::from(prefix);
    while p.len() < len {
        p.push('[');
    }
    p
}

#[test]
fn the_worst_payloads_in_a_1_mib_line_decode_on_a_64_kib_stack() {
    let worst = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(|| {
            let mut results = Vec::new();
            // Deep floods at each place a recursive parser could meet them.
            for prefix in [
                r#"{"x":"#,
                r#"{"choices":[{"index":0,"delta":{"content":"a"},"x":"#,
                r#"{"choices":[{"delta":{"content":"a","x":"#,
                r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"x":"#,
                r#"{"error":{"message":"m","x":"#,
            ] {
                results.push(decode(&flood(prefix, LINE_CAP)));
                let mut closed = flood(prefix, LINE_CAP / 2);
                let opened = closed.len() - prefix.len();
                closed.push_str(&"]".repeat(opened));
                results.push(decode(&closed));
            }
            let mut text = vec![0u8; LINE_CAP];
            let event = flood(r#"{"message":"m","x":"#, LINE_CAP);
            results.push(decode_error_event(event.as_bytes(), &mut text).map(|_| None));
            // The deepest payload accepted, filling the line: choices at the limit, repeated.
            let one = objects(MAX_NESTING - 3);
            let mut deepest = String::from(r#"{"choices":[{"delta":{"content":"a"}"#);
            while deepest.len() + one.len() + 8 < LINE_CAP {
                deepest.push_str(",\"x\":");
                deepest.push_str(&one);
            }
            deepest.push_str("}]}");
            results.push(decode(&deepest));
            results
        })
        .expect("spawn")
        .join()
        .expect("the decoder overflowed a 64 KiB stack");
    let (deepest, refused) = worst.split_last().expect("results");
    assert_eq!(deepest, &Ok(Some("a".into())));
    assert!(
        refused.iter().all(|r| r == &Err(DecodeError::TooDeep)),
        "{refused:?}"
    );
}
