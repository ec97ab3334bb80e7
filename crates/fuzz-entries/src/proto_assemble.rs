//! Decoder and assembler together: every input line is one `data:` payload.
//!
//! Checks: no panic; the 64-bit layout template and the walk alone decode every line the
//! same (`decode_chunk` against `decode_chunk_walked`: the same chunk or the same error); a
//! text buffer as long as the payload is always enough; a payload is
//! valid JSON is refused as too deep only when a plain bracket count says it nests past the
//! limit;
//! capacities hold; a refused chunk changes nothing; the same chunks fed to a second
//! assembler give the same message. Seeds with deep nesting are in `fuzz/seeds/`.
#[path = "../../llama-proto/tests/common/json_depth.rs"]
mod json_depth;

use json_depth::depth;
use llama_proto::{
    decode_chunk, decode_chunk_walked, AssembleError, Assembler, DecodeError, Message, Payload,
    MAX_NESTING,
};

const C: usize = 64;
const R: usize = 64;
const T: usize = 4;
const A: usize = 32;

type Asm<'s> = Assembler<'s, C, R, T, A>;

/// Everything observable about an assembler, owned, for comparisons.
#[derive(Debug, PartialEq)]
struct Seen {
    id: Option<String>,
    content: Option<String>,
    reasoning: Option<String>,
    timings: Option<llama_proto::Timings>,
    reasoning_tokens: u64,
    finish: Result<String, AssembleError>,
}

fn message_text(m: &Message<'_>) -> String {
    let calls: Vec<_> = m.tool_calls.iter().collect();
    format!("{m:?} {calls:?}")
}

fn seen(a: &Asm<'_>) -> Seen {
    Seen {
        id: a.id().map(Into::into),
        content: a.content().map(Into::into),
        reasoning: a.reasoning_content().map(Into::into),
        timings: a.timings(),
        reasoning_tokens: a.reasoning_tokens(),
        finish: a.finish().map(|m| message_text(&m)),
    }
}

fn run(lines: &[&[u8]], a: &mut Asm<'_>) -> Vec<Result<(), AssembleError>> {
    let mut results = Vec::new();
    for line in lines {
        let mut text = vec![0u8; line.len()];
        let mut walked_text = vec![0u8; line.len()];
        let decoded = decode_chunk(line, &mut text);
        assert_eq!(
            decoded,
            decode_chunk_walked(line, &mut walked_text),
            "the layout template and the walk disagree"
        );
        let chunk = match decoded {
            Ok(Payload::Chunk(c)) => c,
            Ok(Payload::Error(_)) => continue,
            Err(DecodeError::TooDeep) => {
                // Only valid JSON has one reading of where its strings are; on malformed input
                // the decoder and the reference may split tokens differently.
                if serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok() {
                    assert!(depth(line) > MAX_NESTING, "refused as too deep but is not");
                }
                continue;
            }
            Err(e) => {
                assert_ne!(
                    e,
                    DecodeError::TextBufferFull,
                    "text as long as the payload is enough"
                );
                continue;
            }
        };
        let before = seen(a);
        let r = a.push(&chunk);
        if r.is_err() {
            assert_eq!(before, seen(a), "a refused chunk changed the assembler");
        }
        if let Some(c) = a.content() {
            assert!(c.len() <= C);
        }
        if let Some(r) = a.reasoning_content() {
            assert!(r.len() <= R);
        }
        if let Ok(m) = a.finish() {
            assert!(m.tool_calls.len() <= T);
            for t in m.tool_calls.iter() {
                assert!(t.arguments.len() <= A);
            }
        }
        results.push(r);
    }
    results
}

/// The `proto_assemble` fuzz target: panics when a check fails.
pub fn proto_assemble(data: &[u8]) {
    let lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    let (mut c1, mut r1, mut a1) = ([0u8; C], [0u8; R], [[0u8; A]; T]);
    let (mut c2, mut r2, mut a2) = ([0xffu8; C], [0xffu8; R], [[0xffu8; A]; T]);
    let mut first = Assembler::new(&mut c1, &mut r1, &mut a1);
    let mut second = Assembler::new(&mut c2, &mut r2, &mut a2);
    let res1 = run(&lines, &mut first);
    let res2 = run(&lines, &mut second);
    assert_eq!(res1, res2);
    assert_eq!(seen(&first), seen(&second));
    // After a reset the assembler behaves as new.
    first.reset();
    assert_eq!(run(&lines, &mut first), res2);
    assert_eq!(seen(&first), seen(&second));
}
