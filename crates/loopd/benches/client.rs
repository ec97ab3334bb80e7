//! The whole client path, bytes on the socket to `Completion`: CPU time of the client thread
//! per streamed event, for a 10,000-event transcript served by the fake server over a Unix
//! socket (one chunk per event, as llama-server sends them).
//!
//! The peer, in the same run: the same HTTP layer (loopd's `Response`), then
//! `eventsource-stream` for the events and `serde_json` into owned chunk structs, folding the
//! deltas into strings. Only the client thread's CPU time is counted (the server thread is the
//! same for both), via `CLOCK_THREAD_CPUTIME_ID`.
//!
//! cargo bench -p loopd --bench client -- --warm-up-time 1 --measurement-time 3
//!
//! A line first splits each path's client-thread CPU into user space and the kernel
//! (`getrusage(RUSAGE_THREAD)`, 30 requests each in turn).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::StreamExt;
use serde::Deserialize;

use loopd_client::config::ClientConfig;
use loopd_client::llama::{ChatRequest, Client};
use support::{FakeServer, Reply};

/// Events in the transcript.
const EVENTS: usize = 10_000;

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A content chunk in the format llama-server streams (its fields and their order, from
/// `fixtures/plain.sse`), with a growing `predicted_n`.
fn content_event(i: usize) -> Vec<u8> {
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\" word{}\"}}}}],\"created\":1764400000,\"id\":\"chatcmpl-bench0123456789abcdef0123456789\",\"model\":\"smollm2\",\"system_fingerprint\":\"b1-abcdef0\",\"object\":\"chat.completion.chunk\",\"timings\":{{\"cache_n\":0,\"prompt_n\":14,\"prompt_ms\":21.5,\"prompt_per_token_ms\":1.53,\"prompt_per_second\":651.2,\"predicted_n\":{},\"predicted_ms\":{}.25,\"predicted_per_token_ms\":4.1,\"predicted_per_second\":243.9}}}}\n\n",
        i % 10,
        i + 1,
        i * 4
    )
    .into_bytes()
}

fn transcript() -> Vec<Vec<u8>> {
    let mut events: Vec<Vec<u8>> = (0..EVENTS - 2).map(content_event).collect();
    events.push(
        b"data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],\"created\":1764400000,\"id\":\"chatcmpl-bench0123456789abcdef0123456789\",\"model\":\"smollm2\",\"object\":\"chat.completion.chunk\",\"timings\":{\"cache_n\":0,\"prompt_n\":14,\"predicted_n\":9998}}\n\n"
            .to_vec(),
    );
    events.push(b"data: [DONE]\n\n".to_vec());
    events
}

/// User and system CPU time of the calling thread.
fn thread_user_sys() -> (Duration, Duration) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD is a constant Linux supports.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Where each path's client-thread CPU goes, user space against the kernel (the socket
/// reads), over `rounds` requests each, taken in turn; printed before criterion's groups. The
/// kernel's share is the same work on both paths, so it bounds the ratio a faster parser can
/// reach.
fn user_kernel_split(client: &Client, config: &ClientConfig, rounds: usize) {
    let mut sum = [(Duration::ZERO, Duration::ZERO); 2];
    for _ in 0..rounds {
        for (k, slot) in sum.iter_mut().enumerate() {
            let (u0, s0) = thread_user_sys();
            if k == 0 {
                std::hint::black_box(loopd_once(client));
            } else {
                std::hint::black_box(baseline_once(config));
            }
            let (u1, s1) = thread_user_sys();
            slot.0 += u1 - u0;
            slot.1 += s1 - s0;
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / rounds as f64;
    let [(lu, ls), (pu, ps)] = sum;
    println!(
        "user/kernel split, {rounds} requests each in turn, ms per 10,000 events: loopd user {:.2} \
         kernel {:.2}, peer user {:.2} kernel {:.2}; user-space ratio {:.2}x, whole {:.2}x",
        ms(lu),
        ms(ls),
        ms(pu),
        ms(ps),
        pu.as_secs_f64() / lu.as_secs_f64(),
        (pu + ps).as_secs_f64() / (lu + ls).as_secs_f64(),
    );
}

fn request() -> ChatRequest {
    ChatRequest::user(0, "Count.")
}

/// loopd: `Client::chat`, every event delivered to a callback.
fn loopd_once(client: &Client) -> usize {
    let mut events = 0;
    let done = client
        .chat(&request(), &mut |_| events += 1)
        .expect("completion");
    assert_eq!(done.timings.expect("timings").predicted_n, 9_998);
    events
}

#[derive(Deserialize)]
struct Chunk {
    #[allow(dead_code)]
    id: String,
    choices: Vec<Choice>,
    timings: Option<Timings>,
}

#[derive(Deserialize)]
struct Choice {
    delta: Delta,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    reasoning_content: Option<String>,
}

#[derive(Deserialize)]
struct Timings {
    predicted_n: u64,
}

/// The peer: same socket and HTTP layer, then eventsource-stream and serde_json.
fn baseline_once(config: &ClientConfig) -> usize {
    let body = loopd_client::llama::render_request(config, &request());
    let far = std::time::Instant::now() + Duration::from_secs(60);
    let stream = loopd_client::http::request(
        &config.socket,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        Duration::from_secs(5),
        &loopd_client::llama::Cancel::new(),
    )
    .expect("connect");
    let mut resp =
        loopd_client::http::Response::new(stream, far, &loopd_client::llama::Cancel::new());
    assert_eq!(resp.head().expect("head"), 200);
    let pieces = futures::stream::poll_fn(move |_| {
        std::task::Poll::Ready(match resp.next_body() {
            Ok(Some(p)) => Some(Ok::<_, std::io::Error>(p.to_vec())),
            Ok(None) => None,
            Err(e) => Some(Err(std::io::Error::other(format!("{e:?}")))),
        })
    });
    let mut events = eventsource_stream::Eventsource::eventsource(pieces);
    let (mut content, mut reasoning, mut n, mut predicted, mut finished) =
        (String::new(), String::new(), 0, 0, false);
    futures::executor::block_on(async {
        while let Some(ev) = events.next().await {
            let ev = ev.expect("event");
            if ev.data == "[DONE]" {
                break;
            }
            let chunk: Chunk = serde_json::from_str(&ev.data).expect("chunk");
            n += 1;
            if let Some(t) = chunk.timings {
                predicted = t.predicted_n;
            }
            if let Some(c) = chunk.choices.into_iter().next() {
                content.push_str(c.delta.content.as_deref().unwrap_or(""));
                reasoning.push_str(c.delta.reasoning_content.as_deref().unwrap_or(""));
                finished |= c.finish_reason.is_some();
            }
        }
    });
    assert!(finished && predicted == 9_998 && !content.is_empty());
    n
}

fn bench(c: &mut Criterion) {
    let server = FakeServer::start(vec![(
        "/v1/chat/completions",
        vec![Reply::sse(transcript())],
    )]);
    let config = ClientConfig::new(server.socket(), "smollm2");
    let client = Client::new(config.clone());
    assert_eq!(loopd_once(&client), EVENTS - 2, "content events");
    assert_eq!(baseline_once(&config), EVENTS - 1, "data events");
    user_kernel_split(&client, &config, 30);

    let mut g = c.benchmark_group("client_10k_events");
    g.throughput(Throughput::Elements(EVENTS as u64));
    g.sample_size(10);
    g.bench_function("loopd", |b| {
        b.iter_custom(|iters| {
            let mut cpu = Duration::ZERO;
            for _ in 0..iters {
                let t = thread_cpu();
                std::hint::black_box(loopd_once(&client));
                cpu += thread_cpu() - t;
            }
            cpu
        })
    });
    g.bench_function("eventsource-stream+serde_json", |b| {
        b.iter_custom(|iters| {
            let mut cpu = Duration::ZERO;
            for _ in 0..iters {
                let t = thread_cpu();
                std::hint::black_box(baseline_once(&config));
                cpu += thread_cpu() - t;
            }
            cpu
        })
    });
    // The same response from memory: what the exchange costs without the socket.
    let mut bytes =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for e in transcript() {
        bytes.extend_from_slice(format!("{:x}\r\n", e.len()).as_bytes());
        bytes.extend_from_slice(&e);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    g.bench_function("loopd_parse_only", |b| {
        b.iter_custom(|iters| {
            let mut cpu = Duration::ZERO;
            for _ in 0..iters {
                let t = thread_cpu();
                std::hint::black_box(parse_only(&bytes));
                cpu += thread_cpu() - t;
            }
            cpu
        })
    });
    // llama-proto's decode_chunk alone over the same payloads, to show where parse time goes.
    let payloads: Vec<Vec<u8>> = transcript()
        .iter()
        .map(|e| {
            e.strip_prefix(b"data: ")
                .unwrap()
                .strip_suffix(b"\n\n")
                .unwrap()
                .to_vec()
        })
        .filter(|p| p != b"[DONE]")
        .collect();
    let mut text = vec![0u8; 64 * 1024];
    g.bench_function("llama_proto_decode_only", |b| {
        b.iter_custom(|iters| {
            let mut cpu = Duration::ZERO;
            for _ in 0..iters {
                let t = thread_cpu();
                for p in &payloads {
                    std::hint::black_box(llama_proto::decode_chunk(p, &mut text).is_ok());
                }
                cpu += thread_cpu() - t;
            }
            cpu
        })
    });
    g.finish();
}

/// The exchange (HTTP, SSE, decode and assemble) over the response in memory, in 16 KiB
/// reads, every output drained as the client loop does.
fn parse_only(bytes: &[u8]) -> usize {
    use loopd_client::llama::{ChatExchange, Output};
    let mut buffers = loopd_client::llama::Buffers::new();
    let limits = loopd_client::config::Limits::default();
    let mut x = ChatExchange::new(limits, Duration::ZERO, &mut buffers);
    let mut n = 0;
    for piece in bytes.chunks(16 * 1024) {
        x.handle_bytes(Duration::ZERO, piece);
        while let Some(out) = x.poll_output() {
            if let Output::Event(e) = out {
                std::hint::black_box(&e);
                n += 1;
            }
        }
        if x.is_over() {
            break;
        }
    }
    x.take_result().expect("over").expect("done");
    n
}

criterion_group!(benches, bench);
criterion_main!(benches);
