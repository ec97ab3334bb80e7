//! A fixed-count loop over the same cases as `benches/http.rs`, for instruction counts that the
//! shared machine's load cannot skew (see docs/benchmarks/http-nostd.md):
//!
//!     cargo build --release -p http-nostd --example count_loop
//!     valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!       target/release/examples/count_loop <case> <iterations>
//!
//! Run each case at N and 2N iterations; the difference over N is the count per iteration, free
//! of the setup. Cases: `httparse-<head>` and `ours-<head>` (head: sse, json, 20-fields), `zc`
//! (the reader, zero-copy), `dec` (the chunked decoder alone), `reads` (1460-byte reads, copied).
use http_nostd::{Chunk, ChunkedDecoder, Event, ResponseReader, Status, HEAD_CAP, MAX_HEADERS};
use std::hint::black_box;

#[path = "../benches/inputs/mod.rs"]
mod inputs;
use inputs::{chunked_response, HEADS};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args[1].as_str();
    let n: usize = args[2].parse().unwrap();
    let mut storage = vec![0u8; HEAD_CAP];
    let storage: &mut [u8; HEAD_CAP] = (&mut storage[..]).try_into().unwrap();
    const EVENTS: usize = 4000;
    let (payload, wire, head_len) = chunked_response(EVENTS);
    let mut out = vec![0u8; payload.len()];
    for (name, bytes) in HEADS {
        if case == format!("httparse-{name}") {
            for _ in 0..n {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut response = httparse::Response::new(&mut headers);
                let r = response.parse(black_box(bytes)).unwrap();
                black_box((r, response.code, response.headers.len()));
            }
        }
        if case == format!("ours-{name}") {
            for _ in 0..n {
                let mut reader = ResponseReader::new(&mut *storage);
                let r = reader.feed(black_box(bytes)).unwrap();
                let head = reader.head().unwrap();
                black_box((r, head.status(), head.framing()));
            }
        }
    }
    match case {
        "copy-payload" => {
            for _ in 0..n {
                out.copy_from_slice(black_box(&payload));
                black_box(&out);
            }
        }
        "copy-per-event" => {
            for _ in 0..n {
                for (dst, src) in out.chunks_mut(230).zip(black_box(&payload).chunks(230)) {
                    dst.copy_from_slice(src);
                }
                black_box(&out);
            }
        }
        "zc" => {
            for _ in 0..n {
                let mut reader = ResponseReader::new(&mut *storage);
                let (mut pos, mut total) = (0, 0);
                loop {
                    match reader.feed(&black_box(&wire[..])[pos..]).unwrap() {
                        (n, Status::Complete(Event::Body(d))) => {
                            total += black_box(d).len();
                            pos += n;
                        }
                        (n, Status::Complete(Event::Head)) => pos += n,
                        (_, _) => break,
                    }
                }
                assert_eq!(total, payload.len());
            }
        }
        "dec" => {
            for _ in 0..n {
                let mut decoder = ChunkedDecoder::<HEAD_CAP>::new();
                let body = &black_box(&wire[..])[head_len..];
                let (mut pos, mut total) = (0, 0);
                while let (n, Status::Complete(Chunk::Data(d))) =
                    decoder.decode(&body[pos..]).unwrap()
                {
                    total += black_box(d).len();
                    pos += n;
                }
                assert_eq!(total, payload.len());
            }
        }
        "reads" => {
            for _ in 0..n {
                let mut reader = ResponseReader::new(&mut *storage);
                let mut at = 0;
                for piece in black_box(&wire[..]).chunks(1460) {
                    let mut pos = 0;
                    loop {
                        match reader.feed(&piece[pos..]).unwrap() {
                            (n, Status::Complete(Event::Body(d))) => {
                                out[at..at + d.len()].copy_from_slice(d);
                                at += d.len();
                                pos += n;
                            }
                            (n, Status::Complete(Event::Head)) => pos += n,
                            (_, _) => break,
                        }
                    }
                }
                assert_eq!(at, payload.len());
                black_box(&out);
            }
        }
        _ => {}
    }
    black_box(&out);
}
