//! Head parsing against httparse alone on the same responses, and chunked decoding against a
//! plain copy of the same payload bytes. Run: see docs/benchmarks/http-nostd.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http_nostd::{Chunk, ChunkedDecoder, Event, ResponseReader, HEAD_CAP, MAX_HEADERS};

/// Heads as llama-server (cpp-httplib) sends them, and a longer one with 20 fields.
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

fn head(c: &mut Criterion) {
    let mut storage = vec![0u8; HEAD_CAP];
    let storage: &mut [u8; HEAD_CAP] = (&mut storage[..]).try_into().unwrap();
    for (name, bytes) in HEADS {
        let mut g = c.benchmark_group(format!("head/{name}"));
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function("httparse", |b| {
            b.iter(|| {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut response = httparse::Response::new(&mut headers);
                let n = response.parse(black_box(bytes)).unwrap();
                black_box((n, response.code, response.headers.len()));
            })
        });
        g.bench_function("http-nostd", |b| {
            b.iter(|| {
                let mut reader = ResponseReader::new(&mut *storage);
                let r = reader.feed(black_box(bytes)).unwrap();
                let head = reader.head().unwrap();
                black_box((r, head.status(), head.framing()));
            })
        });
        g.finish();
    }
}

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

fn chunked(c: &mut Criterion) {
    const EVENTS: usize = 4000;
    let mut payload = Vec::new();
    let mut wire =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    let head_len = wire.len();
    for i in 0..EVENTS {
        let e = event(i);
        assert_eq!(e.len(), 230);
        payload.extend_from_slice(&e);
        wire.extend_from_slice(format!("{:x}\r\n", e.len()).as_bytes());
        wire.extend_from_slice(&e);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let mut out = vec![0u8; payload.len()];
    let mut storage = vec![0u8; HEAD_CAP];
    let storage: &mut [u8; HEAD_CAP] = (&mut storage[..]).try_into().unwrap();

    let mut g = c.benchmark_group("chunked-230B-events");
    g.throughput(Throughput::Bytes(payload.len() as u64));
    g.bench_function("copy-payload", |b| {
        b.iter(|| {
            out.copy_from_slice(black_box(&payload));
            black_box(&out);
        })
    });
    g.bench_function("copy-per-event", |b| {
        b.iter(|| {
            for (dst, src) in out.chunks_mut(230).zip(black_box(&payload).chunks(230)) {
                dst.copy_from_slice(src);
            }
            black_box(&out);
        })
    });
    // What the SSE parser gets: the decoded slices where they lie, no copy.
    g.bench_function("decode-whole-zero-copy", |b| {
        b.iter(|| {
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
        })
    });
    // The chunked decoder alone, past the head: what the reader layer costs on top.
    g.bench_function("chunked-decoder-zero-copy", |b| {
        b.iter(|| {
            let mut decoder = ChunkedDecoder::<HEAD_CAP>::new();
            let body = &black_box(&wire[..])[head_len..];
            let (mut pos, mut total) = (0, 0);
            while let (n, Chunk::Data(d)) = decoder.decode(&body[pos..]).unwrap() {
                total += black_box(d).len();
                pos += n;
            }
            assert_eq!(total, payload.len());
        })
    });
    for read in [usize::MAX, 1460] {
        let label = if read == usize::MAX {
            "decode-whole".to_string()
        } else {
            format!("decode-reads-{read}")
        };
        g.bench_function(label, |b| {
            b.iter(|| {
                let mut reader = ResponseReader::new(&mut *storage);
                let mut at = 0;
                for piece in black_box(&wire[..]).chunks(read.min(wire.len())) {
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
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_secs(1)).measurement_time(std::time::Duration::from_secs(3));
    targets = head, chunked
}
criterion_main!(benches);
