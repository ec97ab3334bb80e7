//! The whole path, `ChatStream`: arbitrary bytes after a fixed 200 event-stream head (so the
//! body parsers are reached) or raw (so the head is too), fed whole, in pieces of
//! fuzzer-chosen sizes and byte by byte.
//!
//! Checks: no panic; no call consumes more than it was given and `Partial` consumes all; an
//! error is final; and every way of splitting the bytes gives the same events, the same
//! error (from `feed` or `finish`) and the same finished message.

use llama_proto::{Assembler, ChatStream, StreamError, StreamEvent};

#[path = "../../llama-proto/tests/common/stream_feed.rs"]
mod stream_feed;
use stream_feed::feed_pieces;

const HEAD: usize = 256;
const LINE: usize = 512;

/// What the stream said, owned: the events (chunks by their Debug text), then the end.
fn run(input: &[u8], sizes: &[usize]) -> (Vec<String>, Result<String, StreamError>) {
    let (mut head, mut line, mut text) = ([0u8; HEAD], [0u8; LINE], [0u8; LINE]);
    let (mut content, mut reasoning, mut args) = ([0u8; 64], [0u8; 64], [[0u8; 32]; 2]);
    let assembler = Assembler::new(&mut content, &mut reasoning, &mut args);
    let mut stream =
        ChatStream::<HEAD, 8, LINE, 64, 64, 2, 32>::new(&mut head, &mut line, &mut text, assembler);
    let mut pieces = Vec::new();
    let mut at = 0;
    for k in 0.. {
        if at >= input.len() {
            break;
        }
        let size = if sizes.is_empty() {
            input.len()
        } else {
            sizes[k % sizes.len()]
        };
        pieces.push(&input[at..(at + size).min(input.len())]);
        at += size;
    }
    let mut out: Vec<String> = Vec::new();
    // An error is compared through `finish`, which returns it again: whether a fault shows
    // in `feed` or only at `finish` may depend on the split (a head is parsed at its line
    // ends).
    feed_pieces(&mut stream, pieces, |event| {
        let ev = match event {
            StreamEvent::ErrorBody(b) => format!("body {}", b.len()),
            ev => format!("{ev:?}"),
        };
        // Error-body pieces are cut where the reads are: only their total counts.
        match (out.last_mut(), ev.strip_prefix("body ")) {
            (Some(last), Some(n)) if last.starts_with("body ") => {
                let sum: usize = last[5..].parse::<usize>().unwrap() + n.parse::<usize>().unwrap();
                *last = format!("body {sum}");
            }
            _ => out.push(ev.clone()),
        }
        ev != "End"
    });
    let end = stream.finish().map(|m| format!("{m:?}"));
    (out, end)
}

/// The `chat_stream` fuzz target: panics when a check fails.
pub fn chat_stream(data: &[u8]) {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let mut input = Vec::new();
    if control & 1 == 0 {
        input.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n");
        input.extend_from_slice(if control & 2 == 0 {
            &b"Transfer-Encoding: chunked\r\n\r\n"[..]
        } else {
            b"\r\n"
        });
    }
    input.extend_from_slice(body);
    let whole = run(&input, &[]);
    let sizes = [
        usize::from(control >> 4) + 1,
        usize::from(control & 15) + 1,
        3,
    ];
    assert_eq!(run(&input, &sizes), whole, "pieces {sizes:?}");
    if input.len() <= 2048 {
        assert_eq!(run(&input, &[1]), whole, "byte by byte");
    }
}
