//! Feeds arbitrary bytes to the SSE parser whole, in pieces of fuzzer-chosen sizes and byte
//! by byte: nothing panics, every event respects the cap, and all ways agree on the events
//! and the error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sse_nostd::{Event, Parser};

#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Msg(Vec<u8>, Vec<u8>, Vec<u8>),
    Comment(Vec<u8>),
    Retry(u64),
    Err(sse_nostd::SseError),
}

fn run<const N: usize>(input: &[u8], sizes: &[usize]) -> Vec<Owned> {
    let storage: Box<[u8; N]> = vec![0u8; N].into_boxed_slice().try_into().unwrap();
    let mut parser = Parser::new(storage);
    let mut out = Vec::new();
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
    for piece in pieces {
        let mut rest = piece;
        loop {
            match parser.feed(rest) {
                Ok((used, event)) => {
                    assert!(used <= rest.len());
                    let Some(event) = event else {
                        assert_eq!(used, rest.len(), "None must mean all consumed");
                        break;
                    };
                    out.push(match event {
                        Event::Message(m) => {
                            let event_len = if m.event == b"message" { 0 } else { m.event.len() };
                            // The cap: data, event type and id all lived in the N-byte buffer.
                            assert!(m.data.len() + event_len + m.id.len() <= N);
                            assert!(!m.event.is_empty());
                            Owned::Msg(m.event.to_vec(), m.data.to_vec(), m.id.to_vec())
                        }
                        Event::Comment(c) => {
                            assert!(c.len() < N);
                            Owned::Comment(c.to_vec())
                        }
                        Event::Retry(ms) => Owned::Retry(ms),
                        _ => unreachable!("no other event kinds"),
                    });
                    rest = &rest[used..];
                }
                Err(e) => {
                    // Errors are final.
                    assert_eq!(parser.feed(b"\n\n"), Err(e));
                    out.push(Owned::Err(e));
                    return out;
                }
            }
        }
    }
    if let Err(e) = parser.finish() {
        out.push(Owned::Err(e));
    }
    out
}

fn check<const N: usize>(input: &[u8], sizes: &[usize]) {
    let whole = run::<N>(input, &[]);
    assert_eq!(run::<N>(input, sizes), whole, "fuzzer-sized pieces {sizes:?}");
    if input.len() <= 1024 {
        assert_eq!(run::<N>(input, &[1]), whole, "byte by byte");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    // Piece sizes from the control byte: small pieces hit every CR|LF and BOM split.
    let sizes = [usize::from(control % 16) + 1, usize::from(control / 16) + 1, 3];
    check::<32>(input, &sizes);
    check::<4096>(input, &sizes);
});
