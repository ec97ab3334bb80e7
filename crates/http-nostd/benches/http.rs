//! Head parsing against httparse alone on the same responses, and chunked decoding against a
//! plain copy of the same payload bytes. Run: see docs/benchmarks/http-nostd.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http_nostd::{Chunk, ChunkedDecoder, Event, ResponseReader, Status, HEAD_CAP, MAX_HEADERS};

mod inputs;
use inputs::{chunked_response, HEADS};

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

fn chunked(c: &mut Criterion) {
    const EVENTS: usize = 4000;
    let (payload, wire, head_len) = chunked_response(EVENTS);
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
                    (n, Status::Complete(Event::Body(d))) => {
                        total += black_box(d).len();
                        pos += n;
                    }
                    (n, Status::Complete(Event::Head)) => pos += n,
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
            while let (n, Status::Complete(Chunk::Data(d))) = decoder.decode(&body[pos..]).unwrap()
            {
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
