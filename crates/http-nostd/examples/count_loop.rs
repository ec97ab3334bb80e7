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
use http_nostd::{Chunk, ChunkedDecoder, Event, ResponseReader, HEAD_CAP, MAX_HEADERS};
use std::hint::black_box;
const HEADS: [(&str, &[u8]); 3] = [
    (
        "sse",
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream\r\n\
          Server: llama.cpp\r\nTransfer-Encoding: chunked\r\nAccess-Control-Allow-Origin: \r\n\r\n",
    ),
    (
        "json",
        b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nContent-Length: 1234\r\n\
          Content-Type: application/json; charset=utf-8\r\nKeep-Alive: timeout=5, max=5\r\n\
          Server: llama.cpp\r\n\r\n",
    ),
    (
        "20-fields",
        b"HTTP/1.1 200 OK\r\nDate: Sun, 29 Nov 2026 17:00:00 GMT\r\nServer: llama.cpp\r\n\
          Content-Type: application/json; charset=utf-8\r\nContent-Length: 1234\r\n\
          Cache-Control: no-cache, no-store, must-revalidate\r\nPragma: no-cache\r\nExpires: 0\r\n\
          Vary: Accept-Encoding\r\nX-Request-Id: 0f8e2c9a-5d4b-4c1e-9a7f-3b2d1e0c9f8a\r\n\
          X-Slot-Id: 3\r\nX-Model: qwen3-30b-a3b-instruct-q4_k_m.gguf\r\n\
          Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Headers: content-type, authorization\r\n\
          Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nStrict-Transport-Security: max-age=63072000\r\n\
          X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n\
          Keep-Alive: timeout=5, max=100\r\nConnection: keep-alive\r\n\r\n",
    ),
];

/// A llama-server-like event: `data: {...}\n\n`, 230 bytes.
fn event(i: usize) -> Vec<u8> {
    let mut e = format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\" tok{i:05}\"}}}}],\
         \"created\":1764435600,\"id\":\"chatcmpl-abc\",\"model\":\"qwen\",\"object\":\"chat.completion.chunk\"}}"
    )
    .into_bytes();
    e.resize(228, b' ');
    e.extend_from_slice(b"\n\n");
    e
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args[1].as_str();
    let n: usize = args[2].parse().unwrap();
    let mut storage = vec![0u8; HEAD_CAP];
    let storage: &mut [u8; HEAD_CAP] = (&mut storage[..]).try_into().unwrap();
    const EVENTS: usize = 4000;
    let mut payload = Vec::new();
    let mut wire =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    let head_len = wire.len();
    for i in 0..EVENTS {
        let e = event(i);
        payload.extend_from_slice(&e);
        wire.extend_from_slice(format!("{:x}\r\n", e.len()).as_bytes());
        wire.extend_from_slice(&e);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
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
                        (n, Event::Body(d)) => {
                            total += black_box(d).len();
                            pos += n;
                        }
                        (n, Event::Head) => pos += n,
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
                while let (n, Chunk::Data(d)) = decoder.decode(&body[pos..]).unwrap() {
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
                            (n, Event::Body(d)) => {
                                out[at..at + d.len()].copy_from_slice(d);
                                at += d.len();
                                pos += n;
                            }
                            (n, Event::Head) => pos += n,
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
