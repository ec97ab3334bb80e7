//! Decodes every `data:` payload of the recorded fixtures N times (default 200), for
//! instruction counts under `valgrind --tool=callgrind` that the shared box's load cannot skew:
//! `cargo build --profile bench -p llama-proto --example decode_loop`, then
//! `valgrind --tool=callgrind <target>/release/examples/decode_loop 100`.

use std::hint::black_box;

use llama_proto::{decode_chunk, Payload};

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(200, |s| s.parse().expect("rounds is a number"));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut payloads = Vec::new();
    for name in ["plain", "thinking", "tool_call"] {
        let body = std::fs::read_to_string(dir.join(format!("{name}.sse"))).expect("fixture");
        for line in body.lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                if data != "[DONE]" {
                    payloads.push(data.as_bytes().to_vec());
                }
            }
        }
    }
    let mut text = vec![0u8; 4096];
    let mut sum = 0usize;
    for _ in 0..rounds {
        for p in &payloads {
            match decode_chunk(black_box(p), &mut text) {
                Ok(Payload::Chunk(c)) => {
                    sum += c.content.map_or(0, str::len) + c.tool_calls().len();
                    sum += c.timings.map_or(0, |t| t.predicted_n as usize);
                }
                Ok(Payload::Error(_)) => sum += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }
    println!(
        "{} payloads x {rounds} rounds, checksum {sum}",
        payloads.len()
    );
}
