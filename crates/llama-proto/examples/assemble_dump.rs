//! Conformance helper: an SSE chat stream on stdin (the response body as llama-server sends
//! it, without HTTP framing) in, one JSON object out:
//!
//! `{"id":..,"content":..,"reasoning_content":..,"tool_calls":[{"id":..,"name":..,"arguments":..}],
//! "finish_reason":..,"timings":{"cache_n":..,"prompt_n":..,"predicted_n":..},"reasoning_tokens":..}`
//!
//! or `{"error":"<kind>","message":".."}` and exit status 1. Kinds: `io`, `sse`, `decode`,
//! `server` (the server's own error event), `assemble`, `stream_closed_early` (no
//! `finish_reason`).
//!
//! `cargo run -q -p llama-proto --example assemble_dump < fixtures/plain.sse`

use std::io::Read;
use std::process::ExitCode;

use llama_proto::{decode_chunk, decode_error_event, AssembleError, Assembler, Message, Payload};
use sse_nostd::{Event, Parser, Status};

/// The SSE buffer: loopd's size, the M2a design's 1 MiB cap per line.
const LOOPD_CAP: usize = 1024 * 1024;

const CONTENT: usize = 1024 * 1024;
const REASONING: usize = 1024 * 1024;
const CALLS: usize = 16;
const ARGS: usize = 256 * 1024;

fn heap<const N: usize>() -> Box<[u8; N]> {
    vec![0u8; N]
        .into_boxed_slice()
        .try_into()
        .expect("length is N")
}

fn fail(kind: &str, message: &str) -> ExitCode {
    println!(
        "{{\"error\":{},\"message\":{}}}",
        serde_json::to_string(kind).unwrap(),
        serde_json::to_string(message).unwrap()
    );
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        return fail("io", &e.to_string());
    }
    let mut content = heap::<CONTENT>();
    let mut reasoning = heap::<REASONING>();
    let mut args: Box<[[u8; ARGS]; CALLS]> = vec![[0u8; ARGS]; CALLS]
        .into_boxed_slice()
        .try_into()
        .expect("length is CALLS");
    let mut asm = Box::new(Assembler::new(&mut content, &mut reasoning, &mut args));
    let mut parser = Parser::<_, LOOPD_CAP>::new(heap::<LOOPD_CAP>());
    let mut text = vec![0u8; LOOPD_CAP];

    let mut rest = &input[..];
    loop {
        let (used, event) = match parser.feed(rest) {
            Ok(x) => x,
            Err(e) => return fail("sse", &e.to_string()),
        };
        let exhausted = event == Status::Partial;
        if let Status::Complete(Event::Message(m)) = event {
            if m.event == b"error" {
                return match decode_error_event(m.data, &mut text) {
                    Ok(e) => fail("server", e.message),
                    Err(e) => fail("decode", &e.to_string()),
                };
            }
            if !sse_nostd::is_done(m.data) {
                match decode_chunk(m.data, &mut text) {
                    Ok(Payload::Chunk(c)) => {
                        if let Err(e) = asm.push(&c) {
                            return fail("assemble", &e.to_string());
                        }
                    }
                    Ok(Payload::Error(e)) => return fail("server", e.message),
                    Err(e) => return fail("decode", &e.to_string()),
                }
            }
        }
        rest = &rest[used..];
        if exhausted {
            break;
        }
    }
    if let Err(e) = parser.finish() {
        return fail("sse", &e.to_string());
    }
    match asm.finish() {
        Ok(m) => {
            println!("{}", dump(&m));
            ExitCode::SUCCESS
        }
        Err(e @ AssembleError::NoFinishReason) => fail("stream_closed_early", &e.to_string()),
        Err(e) => fail("assemble", &e.to_string()),
    }
}

fn dump(m: &Message<'_>) -> String {
    let s = |v: &str| serde_json::to_string(v).unwrap();
    let opt = |v: Option<&str>| v.map_or("null".to_string(), s);
    let calls: Vec<String> = m
        .tool_calls
        .iter()
        .map(|t| {
            format!(
                "{{\"id\":{},\"name\":{},\"arguments\":{}}}",
                s(t.id),
                s(t.name),
                s(t.arguments)
            )
        })
        .collect();
    format!(
        "{{\"id\":{},\"content\":{},\"reasoning_content\":{},\"tool_calls\":[{}],\"finish_reason\":{},\"timings\":{},\"reasoning_tokens\":{}}}",
        s(m.id),
        opt(m.content),
        opt(m.reasoning_content),
        calls.join(","),
        s(m.finish_reason.as_str()),
        m.timings.map_or("null".into(), |t| format!(
            "{{\"cache_n\":{},\"prompt_n\":{},\"predicted_n\":{}}}",
            t.cache_n, t.prompt_n, t.predicted_n
        )),
        m.reasoning_tokens
    )
}
