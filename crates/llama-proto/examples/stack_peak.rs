//! Peak stack of `decode_chunk`, measured by painting: a deeper frame fills a region below
//! the caller with a pattern, the decoder runs, and the lowest byte it overwrote gives its
//! peak. `cargo run --release -p llama-proto --example stack_peak` prints one line per
//! payload: a recorded chunk, the deepest payload accepted at each place, and a refused flood.
//!
//! The reading of the painted region below the stack pointer is outside Rust's rules (hence
//! `unsafe` here, never in the crate); it is a measurement on x86-64 Linux, where that memory
//! is mapped stack, not a proof. The firmware image measures the same way on the device.

use std::hint::black_box;

use llama_proto::{decode_chunk, MAX_NESTING};

const PAINT: usize = 64 * 1024;
const PATTERN: u8 = 0xA5;

/// Fills `PAINT` bytes of stack below the caller's frame; returns where they start.
#[inline(never)]
fn paint() -> usize {
    let mut region = [PATTERN; PAINT];
    black_box(&mut region);
    region.as_ptr() as usize
}

/// How many bytes at the top of the painted region were overwritten since `paint`.
#[inline(never)]
fn used(start: usize) -> usize {
    let mut untouched = 0;
    while untouched < PAINT {
        // SAFETY: see the module docs; the region is this thread's mapped stack.
        let b = unsafe { std::ptr::read_volatile((start + untouched) as *const u8) };
        if b != PATTERN {
            break;
        }
        untouched += 1;
    }
    PAINT - untouched
}

#[inline(never)]
fn decode(p: &[u8], text: &mut [u8]) -> bool {
    black_box(decode_chunk(black_box(p), text)).is_ok()
}

fn measure(p: &[u8]) -> (usize, bool) {
    let mut text = vec![0u8; p.len()];
    let start = paint();
    let ok = decode(p, &mut text);
    (used(start), ok)
}

fn main() {
    let nest = |n: usize| format!("{}1{}", r#"{"k":"#.repeat(n), "}".repeat(n));
    let cases = [
        (
            "recorded chunk in llama-server's layout (the 64-bit template)",
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\""}}]}}],"created":1,"id":"chatcmpl-x","model":"m","system_fingerprint":"b0","object":"chat.completion.chunk","timings":{"cache_n":0,"prompt_n":24,"prompt_ms":3.5,"prompt_per_token_ms":0.1,"prompt_per_second":9.3,"predicted_n":1,"predicted_ms":0.0,"predicted_per_token_ms":0.0,"predicted_per_second":0.0},"prompt_progress":{"total":24,"cache":0,"processed":24,"time_ms":3}}"#.to_string(),
        ),
        (
            "recorded chunk (tool call)",
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\""}}]}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","timings":{"cache_n":0,"prompt_n":24,"prompt_ms":3.5,"predicted_n":1}}"#.to_string(),
        ),
        (
            "deepest accepted, top level",
            format!(r#"{{"x":{}}}"#, nest(MAX_NESTING - 1)),
        ),
        (
            "deepest accepted, in choices",
            format!(r#"{{"choices":[{{"delta":{{"content":"a"}},"x":{}}}]}}"#, nest(MAX_NESTING - 3)),
        ),
        (
            "deepest accepted, in delta",
            format!(r#"{{"choices":[{{"delta":{{"content":"a","x":{}}}}}]}}"#, nest(MAX_NESTING - 4)),
        ),
        (
            "deepest accepted, in a tool call",
            format!(
                r#"{{"choices":[{{"delta":{{"tool_calls":[{{"index":0,"function":{{"name":"f","x":{}}}}}]}}}}]}}"#,
                nest(MAX_NESTING - 7)
            ),
        ),
        (
            "refused: 1 MiB of [ in choices",
            format!(r#"{{"choices":[{{"x":{}"#, "[".repeat(1 << 20)),
        ),
    ];
    let mut peak = 0;
    for (name, p) in &cases {
        let (bytes, ok) = measure(p.as_bytes());
        peak = peak.max(bytes);
        let verdict = if ok { "decoded" } else { "refused" };
        println!("{bytes:>6} bytes  {verdict:<8} {name}");
    }
    println!("{peak:>6} bytes  peak of decode_chunk (MAX_NESTING = {MAX_NESTING})");
}
