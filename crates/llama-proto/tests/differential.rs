//! Differential test against `serde_json`: wherever `serde_json` deserializes a payload into
//! the same schema, `decode_chunk` yields the same fields, or a cap error.
//!
//! Inputs: generated chunks (every field, unknown fields, floats, strings with quotes, control
//! characters and astral characters, optionally with all non-ASCII written as `\uXXXX`
//! surrogate pairs and `/` as `\/`), byte-mutated copies of them, and every chunk of the
//! recorded fixtures (see `fixtures.rs`). Escaped object keys are not generated: the decoder
//! matches keys as written (documented in `decode`).

use std::borrow::Cow;

use llama_proto::{decode_chunk, DecodeError, FinishReason, Payload, MAX_TOOL_CALL_DELTAS};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct RefChunk<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<RefChoice<'a>>>,
    timings: Option<RefTimings>,
    prompt_progress: Option<RefProgress>,
    #[serde(borrow)]
    error: Option<RefError<'a>>,
}

#[derive(Deserialize)]
struct RefChoice<'a> {
    #[serde(borrow)]
    delta: Option<RefDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RefDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<RefToolCall<'a>>>,
}

#[derive(Deserialize)]
struct RefToolCall<'a> {
    index: u32,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<RefFunction<'a>>,
}

#[derive(Deserialize)]
struct RefFunction<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct RefTimings {
    cache_n: u64,
    prompt_n: u64,
    predicted_n: u64,
}

#[derive(Deserialize)]
struct RefProgress {
    total: u64,
    cache: u64,
    processed: u64,
    time_ms: u64,
}

#[derive(Deserialize)]
struct RefError<'a> {
    code: Option<u32>,
    #[serde(borrow)]
    message: Cow<'a, str>,
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

/// One tool-call delta: index, id, name, arguments.
type Call = (u32, Option<String>, Option<String>, Option<String>);

/// The fields both decoders agree on, owned, in one comparable shape.
#[derive(Debug, PartialEq)]
enum Fields {
    Error(Option<u32>, Option<String>, String),
    Chunk {
        id: Option<String>,
        content: Option<String>,
        reasoning: Option<String>,
        calls: Vec<Call>,
        finish: Option<FinishReason>,
        timings: Option<(u64, u64, u64)>,
        progress: Option<(u64, u64, u64, u64)>,
    },
}

/// `None` when serde_json does not accept the payload (or it names an unknown finish reason).
/// `Some(Err(..))` when it is accepted but over one of the decoder's caps.
///
/// The reference reads the payload as text (`from_str`): JSON is UTF-8, and `from_slice` skips
/// invalid UTF-8 inside ignored values, which the decoder (like any JSON parser) refuses.
fn reference(payload: &[u8]) -> Option<Result<Fields, DecodeError>> {
    let r: RefChunk<'_> = serde_json::from_str(std::str::from_utf8(payload).ok()?).ok()?;
    let s = |c: Option<Cow<'_, str>>| c.map(Cow::into_owned);
    if let Some(e) = r.error {
        return Some(Ok(Fields::Error(e.code, s(e.kind), e.message.into_owned())));
    }
    let choices = r.choices.unwrap_or_default();
    if choices.len() > 1 {
        return Some(Err(DecodeError::TooManyChoices));
    }
    let (mut content, mut reasoning, mut calls, mut finish) = (None, None, Vec::new(), None);
    if let Some(c) = choices.into_iter().next() {
        if let Some(f) = c.finish_reason {
            finish = Some(FinishReason::from_wire(&f)?);
        }
        if let Some(d) = c.delta {
            content = s(d.content);
            reasoning = s(d.reasoning_content);
            let tc = d.tool_calls.unwrap_or_default();
            if tc.len() > MAX_TOOL_CALL_DELTAS {
                return Some(Err(DecodeError::TooManyToolCallDeltas));
            }
            for t in tc {
                let (name, args) = t
                    .function
                    .map_or((None, None), |f| (s(f.name), s(f.arguments)));
                calls.push((t.index, s(t.id), name, args));
            }
        }
    }
    Some(Ok(Fields::Chunk {
        id: s(r.id),
        content,
        reasoning,
        calls,
        finish,
        timings: r.timings.map(|t| (t.cache_n, t.prompt_n, t.predicted_n)),
        progress: r
            .prompt_progress
            .map(|p| (p.total, p.cache, p.processed, p.time_ms)),
    }))
}

fn ours(payload: &[u8]) -> Result<Fields, DecodeError> {
    let mut text = vec![0u8; payload.len()];
    let o = |x: Option<&str>| x.map(str::to_owned);
    Ok(match decode_chunk(payload, &mut text)? {
        Payload::Error(e) => Fields::Error(e.code, o(e.kind), e.message.to_owned()),
        Payload::Chunk(c) => Fields::Chunk {
            id: o(c.id),
            content: o(c.content),
            reasoning: o(c.reasoning_content),
            calls: c
                .tool_calls()
                .iter()
                .map(|t| (t.index, o(t.id), o(t.name), o(t.arguments)))
                .collect(),
            finish: c.finish_reason,
            timings: c.timings.map(|t| (t.cache_n, t.prompt_n, t.predicted_n)),
            progress: c
                .prompt_progress
                .map(|p| (p.total, p.cache, p.processed, p.time_ms)),
        },
    })
}

/// The differential rule itself; also used by `fixtures.rs` through a copy of this check.
pub fn check(payload: &[u8]) {
    let mine = ours(payload);
    let Some(expected) = reference(payload) else {
        return;
    };
    match (&expected, &mine) {
        (Ok(e), Ok(m)) => assert_eq!(e, m, "payload {}", String::from_utf8_lossy(payload)),
        (Err(cap), Err(m)) => assert_eq!(cap, m, "payload {}", String::from_utf8_lossy(payload)),
        _ => panic!(
            "serde_json: {expected:?}, decode_chunk: {mine:?}, payload {}",
            String::from_utf8_lossy(payload)
        ),
    }
}

/// Writes every non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF) and `/` as
/// `\/`; both only occur inside strings in serialized JSON.
fn escape_all(json: &str) -> String {
    let mut out = String::new();
    for c in json.chars() {
        if c == '/' {
            out.push_str("\\/");
        } else if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04X}"));
            }
        }
    }
    out
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z {}:,\"]{0,12}",
        "\\PC{0,8}",
        proptest::collection::vec(
            prop_oneof![
                Just('\u{0}'),
                Just('\n'),
                Just('"'),
                Just('\\'),
                Just('/'),
                Just('é'),
                Just('中'),
                Just('😀'),
                Just('\u{1F}'),
                Just('\u{7F}'),
                Just('\u{FFFF}'),
                any::<char>(),
            ],
            0..8
        )
        .prop_map(|v| v.into_iter().collect()),
    ]
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn unknown() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn count() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => (0u64..100_000).prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => scalar(),
    ]
}

fn tool_call() -> impl Strategy<Value = Value> {
    (
        prop_oneof![9 => (0u32..4).prop_map(Value::from), 1 => scalar()],
        opt(text()),
        opt(text()),
        opt(text()),
        any::<bool>(),
    )
        .prop_map(|(index, id, name, args, with_function)| {
            let mut c = json!({ "index": index });
            if let Some(id) = id {
                c["id"] = id.into();
                c["type"] = "function".into();
            }
            if with_function || name.is_some() || args.is_some() {
                let mut f = json!({});
                if let Some(n) = name {
                    f["name"] = n.into();
                }
                if let Some(a) = args {
                    f["arguments"] = a.into();
                }
                c["function"] = f;
            }
            c
        })
}

fn chunk() -> impl Strategy<Value = Value> {
    let delta = (
        opt(prop_oneof![text().prop_map(Value::from), Just(Value::Null)]),
        opt(text()),
        opt(proptest::collection::vec(
            tool_call(),
            0..(MAX_TOOL_CALL_DELTAS + 2),
        )),
        opt(unknown()),
    )
        .prop_map(|(content, reasoning, calls, extra)| {
            let mut d = json!({});
            if let Some(c) = content {
                d["content"] = c;
            }
            if let Some(r) = reasoning {
                d["reasoning_content"] = r.into();
            }
            if let Some(c) = calls {
                d["tool_calls"] = c.into();
            }
            if let Some(e) = extra {
                d["role"] = e;
            }
            d
        });
    let finish = prop_oneof![
        Just(Value::Null),
        Just(json!("stop")),
        Just(json!("tool_calls")),
        Just(json!("length")),
        text().prop_map(Value::from),
    ];
    let choice = (opt(delta), opt(finish)).prop_map(|(d, f)| {
        let mut c = json!({ "index": 0 });
        if let Some(d) = d {
            c["delta"] = d;
        }
        if let Some(f) = f {
            c["finish_reason"] = f;
        }
        c
    });
    let timings = (count(), count(), count(), any::<f64>()).prop_map(|(c, p, n, ms)| {
        json!({"cache_n": c, "prompt_n": p, "prompt_ms": ms.abs() % 1e6, "predicted_n": n,
               "predicted_per_second": ms.abs() % 1e3})
    });
    let progress = (count(), count(), count(), count())
        .prop_map(|(t, c, p, ms)| json!({"total": t, "cache": c, "processed": p, "time_ms": ms}));
    let error = (opt(count()), text(), opt(text())).prop_map(|(code, msg, kind)| {
        let mut e = json!({ "message": msg });
        if let Some(c) = code {
            e["code"] = c;
        }
        if let Some(k) = kind {
            e["type"] = k.into();
        }
        e
    });
    (
        opt(text()),
        opt(proptest::collection::vec(choice, 0..3)),
        opt(timings),
        opt(progress),
        proptest::option::weighted(0.1, error),
        opt(unknown()),
    )
        .prop_map(|(id, choices, timings, progress, error, extra)| {
            let mut c = json!({ "object": "chat.completion.chunk", "created": 1764400000 });
            if let Some(id) = id {
                c["id"] = id.into();
            }
            if let Some(ch) = choices {
                c["choices"] = ch.into();
            }
            if let Some(t) = timings {
                c["timings"] = t;
            }
            if let Some(p) = progress {
                c["prompt_progress"] = p;
            }
            if let Some(e) = error {
                c["error"] = e;
            }
            if let Some(x) = extra {
                c["system_fingerprint"] = x;
            }
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn generated_chunks_agree(c in chunk(), escaped in any::<bool>()) {
        let s = serde_json::to_string(&c).unwrap();
        let s = if escaped { escape_all(&s) } else { s };
        check(s.as_bytes());
    }

    #[test]
    fn mutated_chunks_agree_or_are_refused(c in chunk(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let mut b = serde_json::to_vec(&c).unwrap();
        for (at, byte) in flips {
            let i = at.index(b.len());
            b[i] = byte;
        }
        check(&b);
    }
}

#[test]
fn the_generator_reaches_every_field() {
    // Guards against a generator that only ever produces rejects: this payload is in its range.
    let p = escape_all(
        &json!({"id":"c/😀","choices":[{"index":0,"delta":{"content":"é\n","reasoning_content":"r",
        "tool_calls":[{"index":1,"id":"i","type":"function","function":{"name":"n","arguments":"{\"a\":1}"}}]},
        "finish_reason":"stop"}],"timings":{"cache_n":1,"prompt_n":2,"prompt_ms":0.5,"predicted_n":3},
        "prompt_progress":{"total":4,"cache":5,"processed":6,"time_ms":7}})
        .to_string(),
    );
    assert!(matches!(
        reference(p.as_bytes()),
        Some(Ok(Fields::Chunk { .. }))
    ));
    check(p.as_bytes());
}

mod common;

#[test]
fn every_fixture_chunk_agrees() {
    let mut n = 0;
    for name in common::PAIRED.iter().chain(common::SSE_ONLY.iter()) {
        for p in common::payloads(name) {
            assert!(
                reference(&p).is_some_and(|r| r.is_ok()),
                "serde_json refuses a fixture chunk"
            );
            check(&p);
            n += 1;
        }
    }
    assert!(n > 50, "only {n} fixture chunks");
}
