//! `make bench-e2e`: what the whole local path costs over the bare server, and what it holds
//! back, measured in one run (docs/benchmarks/e2e.md).
//!
//! One request (the system message `loopd serve` writes for a budget of 0 and no tools, one
//! user message, greedy with the self-test's seed, 64 `max_tokens`, no thinking) goes three
//! ways, interleaved round by round: direct to llama-server's TCP port and through inferproxy's
//! Unix socket with the exact bytes loopd renders for it (`loopd_client::llama::render_request` and
//! `loopd_client::http::render`), and through `loopd serve` as a `submit` with `follow`. Every answer is
//! checked to be the same (content, prompt and generated tokens), which it is only if the
//! server got the same prompt. The server's compute time (prompt plus generation) is subtracted
//! from each wall time: from the final chunk's `timings` where the client reads the stream
//! itself, and from llama-server's `/metrics` around the request on the daemon's path (see
//! `metrics.rs`; the two are compared on the other paths and the largest difference printed).
//! Then two clients at once on each path, interleaved the same way: tokens/s of the pair.
//!
//! `ROUNDS` (30) rounds a series, `PAIR_ROUNDS` (as many) pairs a series.

mod client;
mod metrics;
mod stack;
mod stats;
mod stream;
mod worker_trips;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use loopd_client::llama::{render_request, ChatMessage, ChatOptions, ChatRequest};

/// The chat-completions path loopd posts to (the server's README).
const CHAT_PATH: &str = "/v1/chat/completions";
use loopd_agent::runner::{BiosContext, BiosProvider, StandardBios};

use client::{Request, Sample, Target};
use metrics::Scrape;
use stack::Stack;
use stats::{goals, median, Medians};
use worker_trips::Trips;

/// The user message: long enough an answer that 64 tokens end it (`finish_reason` `length`).
const PROMPT: &str = "Tell me about the history of the bicycle.";
/// `max_tokens` of every request.
const MAX_TOKENS: u64 = 64;
/// The paths, in the order each round takes them.
const PATHS: [&str; 3] = ["direct", "inferproxy", "loopd serve"];
/// How long a pair waits for `loopd serve` to have both slots free before it starts.
const IDLE_WAIT: Duration = Duration::from_secs(30);

fn main() {
    let rounds = env_count("ROUNDS", 30);
    let pair_rounds = env_count("PAIR_ROUNDS", rounds);
    let load_start = load_average();
    println!(
        "bench-e2e: {rounds} rounds a series, {pair_rounds} pairs; load average at start {load_start}"
    );
    let stack = Stack::start();
    println!(
        "bench-e2e: the stack is up (loopd serve pid {}); load average {}",
        stack.daemon_pid(),
        load_average()
    );
    let requests = [request(&stack, 0), request(&stack, 1)];
    let targets = [
        Target::Direct(stack.server.addr()),
        Target::Proxy(stack.proxy.socket().to_path_buf()),
        Target::Daemon(stack.daemon_socket.clone()),
    ];
    let addr = stack.server.addr();

    // Warm-up: one of each and a pair, so that every slot's cache holds the prompt. The
    // answer to a prompt evaluated from scratch may differ from the answer to the same prompt
    // found in the cache (the numbers differ a little), so the reference is taken after.
    let cold = run_one(&stack, &targets[0], &requests[0]);
    for t in &targets {
        let warm = run_one(&stack, t, &requests[0]);
        assert_eq!(
            warm.tokens.prompt(),
            cold.tokens.prompt(),
            "warm-up, {t:?}: the prompt's length differs: the paths did not send the same request"
        );
    }
    run_pair(&stack, &targets[0], &requests);
    let reference = run_one(&stack, &targets[0], &requests[0]);
    println!(
        "bench-e2e: the answer ({} prompt tokens, {} generated): {:?}",
        reference.tokens.prompt(),
        reference.tokens.predicted_n,
        reference.content
    );

    let mut wall = [vec![], vec![], vec![]];
    let mut compute = [vec![], vec![], vec![]];
    let mut cost = [vec![], vec![], vec![]];
    let mut stream_cost = [vec![], vec![], vec![]];
    let mut first = [vec![], vec![], vec![]];
    let mut admitted = [vec![], vec![], vec![]];
    let mut stream_minus_metrics = Vec::new();
    let started = Instant::now();
    for round in 0..rounds {
        let mut line = format!("round {}/{rounds}:", round + 1);
        for (p, target) in targets.iter().enumerate() {
            let before = scrape(addr);
            let s = run_one(&stack, target, &requests[0]);
            let c = scrape(addr).compute_ms_since(&before);
            check(&reference, &s, &format!("round {round}, {}", PATHS[p]));
            let w = ms(s.wall);
            wall[p].push(w);
            compute[p].push(c);
            cost[p].push(w - c);
            if let Some(stream) = s.stream_compute_ms {
                stream_cost[p].push(w - stream);
                stream_minus_metrics.push(stream - c);
            }
            first[p].push(ms(s.first_token));
            if let Some(a) = s.admitted {
                admitted[p].push(ms(a));
            }
            line.push_str(&format!(" {} {w:.0} ms ({:.2}),", PATHS[p], w - c));
        }
        eprintln!("{}", line.trim_end_matches(','));
    }
    let single_secs = started.elapsed().as_secs_f64();
    let load_single = load_average();
    let started = Instant::now();

    let mut pair = [vec![], vec![], vec![]];
    for round in 0..pair_rounds {
        let mut line = format!("pair {}/{pair_rounds}:", round + 1);
        for (p, target) in targets.iter().enumerate() {
            let rate = run_pair(&stack, target, &requests);
            pair[p].push(rate);
            line.push_str(&format!(" {} {rate:.1} tokens/s,", PATHS[p]));
        }
        eprintln!("{}", line.trim_end_matches(','));
    }
    let pair_secs = started.elapsed().as_secs_f64();
    let load_pairs = load_average();

    // The worker's round trips on their own: with the model idle, then while it generates
    // (a direct request on slot 0; the trips register slot 1).
    let worker = stack.server.status_socket().to_path_buf();
    let mut idle = Trips::default();
    for _ in 0..rounds.max(1) {
        idle.measure(&worker, 1);
    }
    let mut busy = Trips::default();
    std::thread::scope(|s| {
        let generating = s.spawn(|| client::run(&targets[0], &requests[0]));
        while !generating.is_finished() {
            busy.measure(&worker, 1);
            std::thread::sleep(Duration::from_millis(10));
        }
        generating
            .join()
            .expect("the client thread panicked")
            .unwrap_or_else(|e| panic!("direct, while timing the worker: {e}"));
    });

    let m = |xs: &[f64]| median(xs).unwrap_or(f64::NAN);
    println!();
    println!(
        "| {MAX_TOKENS} tokens, medians of {rounds} rounds | direct to llama-server | through inferproxy | through `loopd serve` |"
    );
    println!("| --- | --- | --- | --- |");
    let row = |name: &str, xs: &[Vec<f64>], unit: &str, digits: usize| {
        let cells: Vec<String> = xs
            .iter()
            .map(|x| match median(x) {
                Some(v) if unit.is_empty() => format!("{v:.digits$}"),
                Some(v) => format!("{v:.digits$} {unit}"),
                None => "n/a".into(),
            })
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    row("wall", &wall, "ms", 1);
    row(
        "server's compute (prompt + generation, /metrics)",
        &compute,
        "ms",
        1,
    );
    row("wall minus the server's compute (/metrics)", &cost, "ms", 2);
    row(
        "wall minus the stream's `timings` (not passed on by loopd)",
        &stream_cost,
        "ms",
        2,
    );
    row("first token at the client", &first, "ms", 2);
    row(
        "the daemon's `ok` line (admission) at the client",
        &admitted,
        "ms",
        2,
    );
    row(
        &format!("two clients at once, tokens/s ({pair_rounds} pairs)"),
        &pair,
        "",
        1,
    );
    println!();
    println!(
        "load average (1, 5, 15 min): at start {load_start}, after the single series ({single_secs:.0} s) {load_single}, after the pairs ({pair_secs:.0} s) {load_pairs}"
    );
    println!(
        "the stream's compute minus /metrics' (direct and inferproxy, {} requests): median {:+.3} ms, largest {:.3} ms",
        stream_minus_metrics.len(),
        m(&stream_minus_metrics),
        stream_minus_metrics.iter().map(|d| d.abs()).fold(0.0, f64::max)
    );
    for (when, t) in [("model idle", &idle), ("model generating", &busy)] {
        println!(
            "llama-worker round trips, {when} ({} sets), median / max ms: status {}, register {}, progress {}, done {}; status + register + done {}",
            t.status.len(),
            spread(&t.status),
            spread(&t.register),
            spread(&t.progress),
            spread(&t.done),
            spread(&t.on_the_path()),
        );
    }
    let medians = Medians {
        proxy_cost: m(&cost[1]),
        daemon_cost: m(&cost[2]),
        direct_first: m(&first[0]),
        daemon_first: m(&first[2]),
        direct_pair: m(&pair[0]),
        daemon_pair: m(&pair[2]),
    };
    println!();
    for g in goals(&medians) {
        let verdict = if g.met { "met" } else { "NOT met" };
        println!("goal: {}: {} ({verdict})", g.what, g.figure);
    }
}

/// The request on `slot`: the body loopd renders for a `submit` with budget 0 and no tools,
/// under the daemon's own config, and the `submit` line that makes the daemon send it.
fn request(stack: &Stack, slot: u32) -> Request {
    let bios = StandardBios.bios(&BiosContext {
        budget_left: 0,
        budget: 0,
        iterations: 0,
        tools: &[],
        exit_tools: &[],
    });
    let chat = ChatRequest::new(
        slot,
        vec![
            ChatMessage::System { content: bios },
            ChatMessage::User {
                content: PROMPT.into(),
            },
        ],
    )
    .with_options(ChatOptions {
        thinking: false,
        max_tokens: Some(MAX_TOKENS),
        sampling: None,
    });
    let body = render_request(&stack.config.client(), &chat);
    let http = loopd_client::http::render("POST", CHAT_PATH, Some(&body));
    let mut submit = serde_json::to_vec(&serde_json::json!({
        "cmd": "submit",
        "messages": [{"role": "user", "content": PROMPT}],
        "budget": 0,
        "thinking": false,
        "max_tokens": MAX_TOKENS,
        "tools": [],
        "follow": true,
    }))
    .expect("a submit line is serialisable");
    submit.push(b'\n');
    Request { http, submit }
}

/// One request; on the daemon's path its result is fetched afterwards (outside the timing),
/// so that the daemon keeps none.
fn run_one(stack: &Stack, target: &Target, req: &Request) -> Sample {
    let s = client::run(target, req).unwrap_or_else(|e| panic!("{target:?}: {e}"));
    if let Some(id) = s.id {
        fetch_result(&stack.daemon_socket, id);
    }
    s
}

fn fetch_result(socket: &Path, id: u64) {
    let reply = client::daemon_command(socket, &format!("{{\"cmd\":\"result\",\"id\":{id}}}"))
        .unwrap_or_else(|e| panic!("result {id}: {e}"));
    assert_eq!(reply["ok"], true, "result {id}: {reply}");
}

/// Two requests at once on `target` (slots 0 and 1; the daemon picks its own); returns the
/// tokens generated over the time from the first start to the last end, per second.
fn run_pair(stack: &Stack, target: &Target, requests: &[Request; 2]) -> f64 {
    if let Target::Daemon(socket) = target {
        wait_daemon_idle(socket);
    }
    let barrier = Barrier::new(2);
    let [a, b] = std::thread::scope(|s| {
        let handles = requests.each_ref().map(|req| {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                client::run(target, req)
            })
        });
        handles.map(|h| {
            h.join()
                .expect("a client thread panicked")
                .unwrap_or_else(|e| panic!("{target:?} (pair): {e}"))
        })
    });
    for id in [a.id, b.id].into_iter().flatten() {
        fetch_result(&stack.daemon_socket, id);
    }
    let start = a.start.min(b.start);
    let end = (a.start + a.wall).max(b.start + b.wall);
    (a.tokens.predicted_n + b.tokens.predicted_n) as f64 / (end - start).as_secs_f64()
}

/// Waits until `loopd serve` says no slot is busy (the previous pair's requests have ended in
/// its runner, not only on the wire).
fn wait_daemon_idle(socket: &Path) {
    let deadline = Instant::now() + IDLE_WAIT;
    loop {
        let s = client::daemon_command(socket, "{\"cmd\":\"status\"}")
            .unwrap_or_else(|e| panic!("status: {e}"));
        if s["status"]["busy"] == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "loopd serve stayed busy: {s}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Panics unless `s` answered as the reference did: the same prompt length, tokens and
/// content, which holds only if the server got the same prompt.
fn check(reference: &Sample, s: &Sample, what: &str) {
    assert_eq!(
        (s.tokens.prompt(), s.tokens.predicted_n, s.content.as_str()),
        (
            reference.tokens.prompt(),
            reference.tokens.predicted_n,
            reference.content.as_str()
        ),
        "{what}: the answer differs from the first direct one: the paths did not send the same request"
    );
}

fn scrape(addr: SocketAddr) -> Scrape {
    let text = client::get(addr, &format!("/metrics?model={}", llama_harness::MODEL_ID))
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    Scrape::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// `median / max` of `xs`, in ms to two places.
fn spread(xs: &[f64]) -> String {
    let max = xs.iter().copied().fold(f64::NAN, f64::max);
    format!("{:.2} / {max:.2}", median(xs).unwrap_or(f64::NAN))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a count")),
        Err(_) => default,
    }
}

/// The three load averages of /proc/loadavg, as it prints them.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
