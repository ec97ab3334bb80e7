//! Shared by the fixture-based tests: reading the recorded transcripts in `fixtures/`.
#![allow(dead_code)]

use std::path::PathBuf;

#[path = "../../../sse-nostd/tests/common/owned.rs"]
mod owned;
use owned::{parse_pieces, Ev};

/// The recorded transcripts with a non-streamed twin, and the SSE-only ones.
pub const PAIRED: [&str; 4] = ["plain", "thinking", "tool_call", "tool_call_text"];
pub const SSE_ONLY: [&str; 3] = ["progress", "reasoning_end", "looping"];

pub fn fixture(name: &str) -> PathBuf {
    llama_harness::fixture_path(name)
}

pub fn read(name: &str) -> Vec<u8> {
    llama_harness::fixture(name)
}

/// One SSE event: its type and data.
#[derive(Debug, Clone)]
pub struct SseEvent {
    pub event: Vec<u8>,
    pub data: Vec<u8>,
}

/// The SSE buffer: loopd's size, the M2a design's 1 MiB cap per line.
pub const SSE_CAP: usize = 1024 * 1024;

/// Every event of `<name>.sse`, `[DONE]` included, parsed with `sse-nostd`.
pub fn events(name: &str) -> Vec<SseEvent> {
    let body = read(&format!("{name}.sse"));
    parse_pieces::<SSE_CAP>([&body[..]])
        .into_iter()
        .filter_map(|ev| match ev {
            Ev::Msg(event, data, _) => Some(SseEvent { event, data }),
            Ev::Err(e) => panic!("fixture {name}.sse does not parse: {e}"),
            Ev::Comment(_) | Ev::Retry(_) => None,
        })
        .collect()
}

/// The chunk payloads of `<name>.sse`: `message` events other than `[DONE]`.
pub fn payloads(name: &str) -> Vec<Vec<u8>> {
    events(name)
        .into_iter()
        .filter(|e| e.event == b"message" && !sse_nostd::is_done(&e.data))
        .map(|e| e.data)
        .collect()
}

/// Heap storage for an assembler with loopd-sized capacities.
pub const CONTENT: usize = 256 * 1024;
pub const REASONING: usize = 256 * 1024;
pub const CALLS: usize = 8;
pub const ARGS: usize = 64 * 1024;

pub struct Storage {
    pub content: Box<[u8; CONTENT]>,
    pub reasoning: Box<[u8; REASONING]>,
    pub args: Box<[[u8; ARGS]; CALLS]>,
}

pub fn storage() -> Storage {
    Storage {
        content: vec![0u8; CONTENT].into_boxed_slice().try_into().unwrap(),
        reasoning: vec![0u8; REASONING].into_boxed_slice().try_into().unwrap(),
        args: vec![[0u8; ARGS]; CALLS]
            .into_boxed_slice()
            .try_into()
            .unwrap(),
    }
}
