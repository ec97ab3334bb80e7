//! Sizes of the fixed state of `LoopDetector` and the text-call types, and the cost per byte
//! of each against a loop that only counts newlines (the floor any line-based scan pays).
//! `cargo run --release -p llama-proto --example state_sizes`; figures in
//! `docs/benchmarks/llama-proto.md`.

use std::hint::black_box;
use std::mem::size_of;
use std::time::Instant;

use llama_proto::{
    parse_text_calls, text_calls, LoopConfig, LoopDetector, Prose, TextCall, TextCallBlock,
    TextCallError, TextCallList, TextCalls,
};

/// Best of five runs of `f` over `bytes` bytes, in ns per byte.
fn ns_per_byte(bytes: usize, mut f: impl FnMut() -> usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        black_box(f());
        best = best.min(t.elapsed().as_nanos() as f64 / bytes as f64);
    }
    best
}

fn main() {
    println!("size_of (bytes, {}-bit target):", usize::BITS);
    println!("  {:>5}  LoopDetector", size_of::<LoopDetector>());
    println!("  {:>5}  LoopConfig", size_of::<LoopConfig>());
    println!(
        "  {:>5}  TextCalls (the iterator)",
        size_of::<TextCalls<'_>>()
    );
    println!("  {:>5}  Prose", size_of::<Prose<'_>>());
    println!("  {:>5}  TextCall", size_of::<TextCall<'_>>());
    println!("  {:>5}  TextCallError", size_of::<TextCallError>());
    println!("  {:>5}  TextCallBlock", size_of::<TextCallBlock<'_>>());
    println!("  {:>5}  TextCallList<8>", size_of::<TextCallList<'_, 8>>());

    // 16 MiB of prose lines that never repeat back to back, in 64-byte deltas.
    let prose: String = (0..)
        .map(|i| format!("Line {i} of an answer that goes on without repeating itself.\n"))
        .take_while({
            let mut n = 0;
            move |l: &String| {
                n += l.len();
                n <= 16 << 20
            }
        })
        .collect();
    let bytes = prose.as_bytes();
    let floor = ns_per_byte(bytes.len(), || {
        bytes
            .chunks(64)
            .map(|c| c.iter().filter(|&&b| b == b'\n').count())
            .sum::<usize>()
    });
    let detect = ns_per_byte(bytes.len(), || {
        let mut d = LoopDetector::default();
        bytes.chunks(64).filter_map(|c| d.push(c)).count()
    });
    // The same size of content holding a call every 4 KiB, found with the iterator.
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2, 3]}}\n</tool_call>\n";
    let with_calls: String = prose
        .as_bytes()
        .chunks(4096)
        .flat_map(|c| [std::str::from_utf8(c).unwrap(), call])
        .collect();
    let scan = ns_per_byte(with_calls.len(), || {
        text_calls(&with_calls)
            .filter(|b| b.outcome.is_ok())
            .count()
    });
    let eight = call.repeat(8);
    let list = ns_per_byte(eight.len(), || {
        parse_text_calls::<8>(&eight).map_or(0, |l| l.len())
    });
    println!("cost per byte (best of 5):");
    println!("  {floor:>6.3} ns  newline count (floor), 16 MiB in 64-byte pieces");
    println!("  {detect:>6.3} ns  LoopDetector::push, same input");
    println!("  {scan:>6.3} ns  text_calls, 16 MiB with a call every 4 KiB");
    println!("  {list:>6.3} ns  parse_text_calls::<8>, 8 calls back to back");
}
