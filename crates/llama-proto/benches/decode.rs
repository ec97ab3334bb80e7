//! Decode plus assembly per event against serde_json on the same recorded transcripts
//! (`fixtures/{plain,thinking,tool_call}.sse`), in one run.
//!
//! - `llama_proto`: `decode_chunk` into a reused text buffer, then `Assembler::push`;
//! - `serde_json_borrowed`: `serde_json::from_slice` into a borrowed struct with the same
//!   fields (`Cow<str>` so escaped strings still parse), no assembly;
//! - `serde_json_value`: `serde_json::from_slice::<Value>`;
//! - the physical anchor, a `memchr` pass over the same payload bytes: `memchr_newline_count`
//!   (a byte the payloads never hold: the scan alone, as in sse-nostd's bench) and
//!   `memchr_quote_count` (every `"`, which any JSON reader must find).
//!
//! `cargo bench -p llama-proto --bench decode -- --warm-up-time 1 --measurement-time 3`
//! (`LLAMA_PROTO_FIXTURES=<dir>` reads the three `.sse` files from another directory).

use std::borrow::Cow;
use std::hint::black_box;

#[path = "../../sse-nostd/tests/common/owned.rs"]
mod owned;
use owned::{parse_pieces, Ev};

/// The SSE buffer: loopd's size, the M2a design's 1 MiB cap per line.
const SSE_CAP: usize = 1024 * 1024;

use criterion::{criterion_group, Criterion, Throughput};
use llama_proto::{decode_chunk, Assembler, Payload};
use serde::Deserialize;

#[derive(Deserialize)]
#[allow(dead_code)]
struct Chunk<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    choices: Option<Vec<Choice<'a>>>,
    timings: Option<Timings>,
    prompt_progress: Option<Progress>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Choice<'a> {
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ToolCall<'a> {
    index: u32,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Function<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Timings {
    cache_n: u64,
    prompt_n: u64,
    predicted_n: u64,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Progress {
    total: u64,
    cache: u64,
    processed: u64,
    time_ms: u64,
}

/// The chunk payloads of the recorded transcripts, each transcript separately.
fn transcripts() -> Vec<Vec<Vec<u8>>> {
    // LLAMA_PROTO_FIXTURES points the bench at another recording of the same three streams.
    let dir = std::env::var_os("LLAMA_PROTO_FIXTURES").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
        std::path::PathBuf::from,
    );
    ["plain", "thinking", "tool_call"]
        .iter()
        .map(|name| {
            let path = dir.join(format!("{name}.sse"));
            let body = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (the bench needs the recorded fixtures)",
                    path.display()
                )
            });
            parse_pieces::<SSE_CAP>([&body[..]])
                .into_iter()
                .filter_map(|ev| match ev {
                    Ev::Msg(event, data, _)
                        if event == b"message" && !sse_nostd::is_done(&data) =>
                    {
                        Some(data)
                    }
                    Ev::Err(e) => panic!("{}: {e}", path.display()),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

const CONTENT: usize = 256 * 1024;
const REASONING: usize = 256 * 1024;
const CALLS: usize = 8;
const ARGS: usize = 64 * 1024;

/// The transcripts and loopd-sized assembler buffers, shared by both measurements.
struct Setup {
    transcripts: Vec<Vec<Vec<u8>>>,
    events: usize,
    content: Box<[u8; CONTENT]>,
    reasoning: Box<[u8; REASONING]>,
    args: Box<[[u8; ARGS]; CALLS]>,
    text: Vec<u8>,
}

impl Setup {
    fn new() -> Setup {
        let transcripts = transcripts();
        let events = transcripts.iter().map(Vec::len).sum();
        let longest = transcripts
            .iter()
            .flatten()
            .map(Vec::len)
            .max()
            .unwrap_or(0);
        Setup {
            transcripts,
            events,
            content: vec![0u8; CONTENT].into_boxed_slice().try_into().unwrap(),
            reasoning: vec![0u8; REASONING].into_boxed_slice().try_into().unwrap(),
            args: vec![[0u8; ARGS]; CALLS]
                .into_boxed_slice()
                .try_into()
                .unwrap(),
            text: vec![0u8; longest],
        }
    }

    /// Every transcript decoded and assembled, as loopd does it.
    fn ours(&mut self) {
        let mut asm = Assembler::new(&mut self.content, &mut self.reasoning, &mut self.args);
        for t in &self.transcripts {
            asm.reset();
            for p in t {
                match decode_chunk(p, &mut self.text) {
                    Ok(Payload::Chunk(ch)) => asm.push(&ch).expect("fixture assembles"),
                    other => panic!("fixture chunk: {other:?}"),
                }
            }
            black_box(asm.finish().expect("fixture finishes"));
        }
    }

    /// Every chunk into the borrowed struct with serde_json.
    fn borrowed(&self) {
        for p in self.transcripts.iter().flatten() {
            black_box(serde_json::from_slice::<Chunk<'_>>(p).expect("fixture parses"));
        }
    }

    /// A `memchr` count of `byte` over every chunk.
    fn memchr(&self, byte: u8) -> usize {
        self.transcripts
            .iter()
            .flatten()
            .map(|p| memchr::memchr_iter(byte, black_box(p)).count())
            .sum()
    }

    /// Every chunk into `serde_json::Value`.
    fn value(&self) {
        for p in self.transcripts.iter().flatten() {
            black_box(serde_json::from_slice::<serde_json::Value>(p).expect("fixture parses"));
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut s = Setup::new();
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Elements(s.events as u64));
    g.bench_function("llama_proto_decode_assemble", |b| b.iter(|| s.ours()));
    g.bench_function("serde_json_borrowed", |b| b.iter(|| s.borrowed()));
    g.bench_function("serde_json_value", |b| b.iter(|| s.value()));
    g.bench_function("memchr_newline_count", |b| b.iter(|| s.memchr(b'\n')));
    g.bench_function("memchr_quote_count", |b| b.iter(|| s.memchr(b'"')));
    g.finish();
}

/// The three paths interleaved, round after round, keeping each one's fastest round: on a box
/// shared with parallel builds the load shifts between criterion's back-to-back groups, and
/// the minimum of interleaved rounds is the figure least touched by it.
fn interleaved() {
    let mut s = Setup::new();
    let mut best = [u128::MAX; 5];
    for _ in 0..2000 {
        let t = std::time::Instant::now();
        s.ours();
        best[0] = best[0].min(t.elapsed().as_nanos());
        let t = std::time::Instant::now();
        s.borrowed();
        best[1] = best[1].min(t.elapsed().as_nanos());
        let t = std::time::Instant::now();
        s.value();
        best[2] = best[2].min(t.elapsed().as_nanos());
        let t = std::time::Instant::now();
        black_box(s.memchr(b'\n'));
        best[3] = best[3].min(t.elapsed().as_nanos());
        let t = std::time::Instant::now();
        black_box(s.memchr(b'"'));
        best[4] = best[4].min(t.elapsed().as_nanos());
    }
    let events = s.events;
    let per = |ns: u128| ns as f64 / events as f64;
    println!(
        "interleaved, best of 2000 rounds, {events} events: llama_proto {:.0} ns/event, \
         serde_json borrowed {:.0} ns/event, serde_json Value {:.0} ns/event, \
         memchr newline count {:.0} ns/event, memchr quote count {:.0} ns/event; \
         borrowed/llama_proto {:.2}x, Value/llama_proto {:.2}x, \
         llama_proto/memchr newline {:.1}x, llama_proto/memchr quote {:.1}x",
        per(best[0]),
        per(best[1]),
        per(best[2]),
        per(best[3]),
        per(best[4]),
        best[1] as f64 / best[0] as f64,
        best[2] as f64 / best[0] as f64,
        best[0] as f64 / best[3] as f64,
        best[0] as f64 / best[4] as f64,
    );
}

criterion_group!(benches, bench);

fn main() {
    interleaved();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
