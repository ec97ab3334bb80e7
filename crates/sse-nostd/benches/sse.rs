//! SSE parsing throughput against the peers on the same synthetic llama-server transcript, a
//! memchr newline count as the floor-of-work baseline, and one 8 MiB line whole vs in pieces.
//!
//! `cargo bench -p sse-nostd --bench sse` (figures in docs/benchmarks/sse-nostd.md).

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::stream::{self, StreamExt};
use sse_nostd::{Event, Parser, Status};

/// loopd's buffer: the M2a design's 1 MiB cap per SSE line.
const SSE_CAP: usize = 1024 * 1024;

/// At least 100 MB, as the issue asks.
const TRANSCRIPT_BYTES: usize = 100 * 1000 * 1000;
const BIG_LINE: usize = 8 << 20;

/// A synthetic llama-server stream: `chat.completion.chunk` events of about 230 bytes (the
/// shape llama-server sends, with a full-length `chatcmpl-` id), with varying content so line
/// lengths differ.
fn transcript() -> &'static [u8] {
    const WORDS: [&str; 8] = [
        " the",
        " word",
        " token",
        " and",
        ",",
        " streaming",
        " of",
        " a",
    ];
    let mut out = Vec::with_capacity(TRANSCRIPT_BYTES + 512);
    let mut i = 0usize;
    while out.len() < TRANSCRIPT_BYTES {
        let word = WORDS[i % WORDS.len()];
        out.extend_from_slice(
            format!(
                "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\"{word}\"}}}}],\
                 \"created\":{},\"id\":\"chatcmpl-4Xq7bT9kLm2Vz8RcN1wYp6Hs3JdFa0Ge\",\"model\":\"smollm2\",\"system_fingerprint\":\"b7123-6e41fa0b\",\
                 \"object\":\"chat.completion.chunk\"}}\n\n",
                1764430000 + i / 50
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    Vec::leak(out)
}

fn heap<const N: usize>() -> Box<[u8; N]> {
    vec![0u8; N].into_boxed_slice().try_into().unwrap()
}

/// Our parser over `pieces`: returns (events, data bytes) so nothing is optimised away.
fn ours<const N: usize>(parser: &mut Parser<Box<[u8; N]>, N>, pieces: &[&[u8]]) -> (usize, usize) {
    parser.reset();
    let (mut events, mut bytes) = (0, 0);
    for piece in pieces {
        let mut rest = *piece;
        loop {
            let (used, event) = parser.feed(rest).unwrap();
            rest = &rest[used..];
            match event {
                Status::Complete(Event::Message(m)) => {
                    events += 1;
                    bytes += m.data.len();
                }
                Status::Complete(_) => {}
                Status::Partial => break,
            }
        }
    }
    parser.finish().unwrap();
    (events, bytes)
}

fn sseer(pieces: &[Bytes]) -> (usize, usize) {
    futures::executor::block_on(async {
        let input = stream::iter(pieces.iter().cloned().map(Ok::<_, ()>));
        let mut events = sseer::EventStream::new(input);
        let (mut n, mut bytes) = (0, 0);
        while let Some(event) = events.next().await {
            n += 1;
            bytes += event.unwrap().data.len();
        }
        (n, bytes)
    })
}

fn eventsource_stream(pieces: &[Bytes]) -> (usize, usize) {
    futures::executor::block_on(async {
        let input = stream::iter(pieces.iter().cloned().map(Ok::<_, ()>));
        let mut events = eventsource_stream::EventStream::new(input);
        let (mut n, mut bytes) = (0, 0);
        while let Some(event) = events.next().await {
            n += 1;
            bytes += event.unwrap().data.len();
        }
        (n, bytes)
    })
}

fn transcript_bench(c: &mut Criterion) {
    let input = transcript();
    let events = memchr::memmem::find_iter(input, b"\n\n").count();
    let mut parser = Parser::new(heap::<SSE_CAP>());
    let mut group = c.benchmark_group("transcript");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Bytes(input.len() as u64));

    group.bench_function("memchr_newline_count", |b| {
        b.iter(|| memchr::memchr_iter(b'\n', black_box(input)).count())
    });
    for read in [128usize, 1460] {
        let pieces: Vec<&[u8]> = input.chunks(read).collect();
        // Not a goal, for context: the same count paying one call per read, as any parser must.
        group.bench_with_input(
            BenchmarkId::new("memchr_newline_count_per_read", read),
            &pieces,
            |b, p| {
                b.iter(|| {
                    p.iter()
                        .map(|r| memchr::memchr_iter(b'\n', black_box(r)).count())
                        .sum::<usize>()
                })
            },
        );
        // `from_static`: the peers get their chunks without a copy or an allocation, as we do.
        let shared: Vec<Bytes> = pieces.iter().map(|p| Bytes::from_static(p)).collect();
        assert_eq!(ours(&mut parser, &pieces).0, events);
        assert_eq!(sseer(&shared).0, events);
        assert_eq!(eventsource_stream(&shared).0, events);
        group.bench_with_input(BenchmarkId::new("sse-nostd", read), &pieces, |b, p| {
            b.iter(|| ours(&mut parser, p))
        });
        group.bench_with_input(BenchmarkId::new("sseer", read), &shared, |b, p| {
            b.iter(|| sseer(p))
        });
        group.bench_with_input(
            BenchmarkId::new("eventsource-stream", read),
            &shared,
            |b, p| b.iter(|| eventsource_stream(p)),
        );
    }
    group.finish();
}

fn big_line_bench(c: &mut Criterion) {
    let mut line = vec![b'x'; BIG_LINE];
    line[..6].copy_from_slice(b"data: ");
    line.extend_from_slice(b"\n\n");
    let line: &'static [u8] = Vec::leak(line);
    let mut parser = Parser::new(heap::<{ 2 * BIG_LINE }>());
    let mut group = c.benchmark_group("8MiB_line");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Bytes(line.len() as u64));

    let whole = [line];
    // The line with its end in one feed and the empty line in the next: the data must be
    // copied into the buffer, as it must when it arrives in pieces.
    let whole_then_dispatch = [&line[..line.len() - 1], &line[line.len() - 1..]];
    let pieces: Vec<&[u8]> = line.chunks(line.len().div_ceil(1024)).collect();
    assert_eq!(pieces.len(), 1024);
    // Eight times as many pieces: a rescan per piece would show as growth here.
    let more_pieces: Vec<&[u8]> = line.chunks(line.len().div_ceil(8192)).collect();
    for (name, input) in [
        ("whole", &whole[..]),
        ("whole_then_dispatch", &whole_then_dispatch[..]),
        ("1024_pieces", &pieces[..]),
        ("8192_pieces", &more_pieces[..]),
    ] {
        assert_eq!(ours(&mut parser, input), (1, BIG_LINE - 6));
        group.bench_function(name, |b| b.iter(|| ours(&mut parser, input)));
    }
    group.finish();
}

criterion_group!(benches, transcript_bench, big_line_bench);
criterion_main!(benches);
