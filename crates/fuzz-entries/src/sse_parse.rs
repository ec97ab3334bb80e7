//! Feeds arbitrary bytes to the SSE parser whole, in pieces of fuzzer-chosen sizes and byte
//! by byte: nothing panics, every event respects the cap, and all ways agree on the events
//! and the error.

#[path = "../../sse-nostd/tests/common/owned.rs"]
mod owned;
use owned::{parse_pieces, Ev};

/// The events of `input` in pieces of `sizes` (cycled; whole when empty), each checked
/// against the cap `N`.
fn run<const N: usize>(input: &[u8], sizes: &[usize]) -> Vec<Ev> {
    let mut pieces = Vec::new();
    let mut at = 0;
    for &size in sizes.iter().cycle() {
        if at >= input.len() {
            break;
        }
        pieces.push(&input[at..(at + size).min(input.len())]);
        at += size;
    }
    if sizes.is_empty() {
        pieces.push(input);
    }
    let out = parse_pieces::<N>(pieces);
    for ev in &out {
        match ev {
            Ev::Msg(event, data, id) => {
                let event_len = if event == b"message" { 0 } else { event.len() };
                // The cap: data, event type and id all lived in the N-byte buffer.
                assert!(data.len() + event_len + id.len() <= N);
                assert!(!event.is_empty());
            }
            Ev::Comment(c) => assert!(c.len() < N),
            Ev::Retry(_) | Ev::Err(_) => {}
        }
    }
    out
}

fn check<const N: usize>(input: &[u8], sizes: &[usize]) {
    let whole = run::<N>(input, &[]);
    assert_eq!(
        run::<N>(input, sizes),
        whole,
        "fuzzer-sized pieces {sizes:?}"
    );
    if input.len() <= 1024 {
        assert_eq!(run::<N>(input, &[1]), whole, "byte by byte");
    }
}

/// The `sse_parse` fuzz target: panics when a check fails.
pub fn sse_parse(data: &[u8]) {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    // Piece sizes from the control byte: small pieces hit every CR|LF and BOM split.
    let sizes = [
        usize::from(control % 16) + 1,
        usize::from(control / 16) + 1,
        3,
    ];
    check::<32>(input, &sizes);
    check::<4096>(input, &sizes);
}
