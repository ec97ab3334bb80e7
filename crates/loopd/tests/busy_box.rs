//! A healthy server on a busy box is not restarted. Beside two CPU-bound
//! processes, one slot streams a long answer while a long prompt goes to the other slot:
//! llama-server puts the streaming slot's next token in the same batch as the other slot's
//! prompt, so the stream hears nothing until the whole prompt is evaluated. That silence is
//! longer than llama-worker's `stall_timeout_s` here; before the fix the worker judged the
//! stream by its own bytes alone and restarted the server (cause `stall`), failing both
//! requests `worker_restarted`. Now the prompt's CPU time is the stream's progress too.
//!
//! The whole local stack (llama-worker running the router, inferproxy, loopd's runner with
//! two slots, registering each generation and keeping a watch open), on the default timeline
//! divided by a factor (5, as `make chaos` and `wedged_server.rs`), so a stall is 6 s. The
//! box's prompt rate is measured first (beside the same load): the long prompt is sized to
//! take about three stall timeouts, and where even the longest prompt a slot holds would be
//! quicker than that, the factor is raised until it is not. The premise (the stream was silent
//! past `stall_timeout_s` while the prompt was evaluated) is checked, not assumed.
//!
//! The second shape (the `CHAOS_FACTOR=5` chaos run beside two CPU-bound loops): at a
//! token a second, the opening of a tool call, which llama-server generates but does not
//! stream until its parser can make a delta of it, is a silence past `stall_timeout_s` from a
//! healthy server. Here the model instance is throttled (stopped and continued, running one
//! twentieth of the time), so its tokens come that slowly on any box, and an agent request
//! calls the arithmetic tool. Before the fix the worker restarted the server (or loopd cut the
//! stream as `stalled` and retried it from the start); now the worker reads the slot's
//! `n_decoded` from `/slots`, and loopd puts the stream's silence to the worker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use llama_harness::{load_average, CpuLoad, LocalServer, Proxy};
use loopd::config::Config;
use loopd::daemon::protocol::{SubmitCmd, WireMessage};
use loopd_agent::runner::{
    builtin_tools, Outcome, RequestEvent, RequestId, RequestResult, Runner, StallAnswer,
    StandardBios, Submission, ToolRegistry,
};
use loopd_client::llama::{ChatEvent, ChatMessage, Client};

/// One test at a time: each starts a stack of its own and sets the load it needs (two
/// CPU-bound loops in one, a throttled instance in the other), and the other's beside it is
/// load neither test means (the throttled one was restarted in 3 of 3 soak runs beside them).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The CPU-bound processes beside the stack (the two shell loops).
const LOAD: usize = 2;
/// The longest prompt, in lines of [`long_prompt`]: about 3,600 tokens, which fits a slot's
/// 4,096 (`scripts/serve.sh`: 8,192 over 2 slots) with the answer, and one batch of 4,096.
const MAX_LINES: usize = 260;
/// The lines of the prompt the box's rate is measured with.
const PROBE_LINES: usize = 60;
/// The long prompt should take this many stall timeouts; at least this many over two.
const STALLS: f64 = 3.0;
/// The largest factor: the worker's stall timeout is 1 s there.
const MAX_FACTOR: u64 = 30;

/// The default timeline (docs/llama-worker.md, docs/runner.md) divided by `factor`.
fn worker_config(factor: u64) -> String {
    let s = |default: f64| default / factor as f64;
    format!(
        "stall_timeout_s = {}\ncpu_probe_interval_s = {}\nprobe_interval_s = {}\n\
         unready_restart_s = {}\nrestart_backoff_s = {}\n",
        s(30.0),
        s(5.0),
        s(5.0),
        s(30.0),
        s(2.0)
    )
}

fn stall_timeout(factor: u64) -> Duration {
    Duration::from_millis(30_000 / factor)
}

fn loopd_config(factor: u64, server: &LocalServer, proxy: &Proxy) -> Config {
    let d = Config::new(proxy.socket(), server.model());
    let mut c = d.clone();
    c.limits.poll_ms = d.limits.poll_ms / factor;
    c.limits.busy_wait_ms = d.limits.busy_wait_ms / factor;
    c.limits.load_wait_ms = d.limits.load_wait_ms / factor;
    c.limits.idle_grace_ms = d.limits.idle_grace_ms / factor;
    c.limits.liveness_ms = d.limits.liveness_ms / factor;
    c.runner.stall_ms = d.runner.stall_ms / factor;
    c.runner.death_grace_ms = d.runner.death_grace_ms / factor;
    c.runner.worker_poll_ms = d.runner.worker_poll_ms / factor;
    c.retry.delays_ms = d.retry.delays_ms.iter().map(|v| v / factor).collect();
    c.retry.total_ms = d.retry.total_ms / factor;
    c.runner.worker_socket = Some(server.status_socket().to_owned());
    c.sampling.temperature = Some(0.0);
    c
}

/// The stack on the timeline divided by `factor`, with the whole prompt in one batch.
struct Stack {
    factor: u64,
    server: LocalServer,
    // Kept alive with the runner that uses it.
    _proxy: Proxy,
    runner: Runner,
}

impl Stack {
    fn start(factor: u64) -> Stack {
        Self::start_with(factor, |_| ToolRegistry::new())
    }

    fn start_with(factor: u64, tools: impl FnOnce(&Client) -> ToolRegistry) -> Stack {
        // One batch of 4,096: the prompt is one decode, as a long agent transcript's chunk is.
        let server = LocalServer::start_with_configs(&worker_config(factor), "b = 4096\n");
        let proxy = Proxy::start(server.addr());
        let mut c = loopd_config(factor, &server, &proxy);
        c.sampling.seed = Some(42);
        let client = Client::new(c.client());
        let tools = tools(&client);
        let runner = Runner::new(Arc::new(client), c.runner, tools, Arc::new(StandardBios), 2);
        Stack {
            factor,
            server,
            _proxy: proxy,
            runner,
        }
    }

    /// Submits `sub` once a slot is free.
    fn run(&self, sub: Submission) -> RequestId {
        llama_harness::wait_for("a free slot", Duration::from_secs(30), || {
            self.runner.submit(sub.clone()).map_err(|e| e.to_string())
        })
    }

    fn result(&self, id: RequestId, what: &str) -> RequestResult {
        self.runner
            .wait_result(id, Duration::from_secs(600))
            .unwrap_or_else(|e| {
                panic!(
                    "{what}: no result within 600 s ({e}); server log {:?}",
                    self.server.log()
                )
            })
    }

    /// (spawns, total_restarts) from the worker's status.
    fn restarts(&self) -> (u64, u64) {
        let s = self.server.worker_status().expect("a worker status");
        (
            s["spawns"].as_u64().expect("spawns"),
            s["total_restarts"].as_u64().expect("total_restarts"),
        )
    }
}

fn ask(text: &str, max_tokens: u64) -> Submission {
    let mut s = Submission {
        messages: vec![ChatMessage::User {
            content: text.into(),
        }],
        ..Submission::default()
    };
    s.options.max_tokens = Some(max_tokens);
    s
}

/// A prompt of `lines` numbered lines (about 14 tokens each) the model must read whole;
/// `head` makes it one no other prompt shares a prefix with (no cache reuse).
fn long_prompt(head: &str, lines: usize) -> String {
    let mut p = format!("{head} Say only the colour of the last box.\n");
    let colours = ["red", "green", "blue", "yellow", "white", "black", "orange"];
    for i in 1..=lines {
        p.push_str(&format!(
            "Box {i} is {} and holds {} stones.\n",
            colours[i % colours.len()],
            i * 7 % 13
        ));
    }
    p
}

fn prompt_tokens(r: &RequestResult) -> u64 {
    r.generations
        .iter()
        .filter_map(|g| g.timings)
        .map(|t| t.prompt_n)
        .max()
        .unwrap_or(0)
}

/// The box's prompt rate beside the load: (tokens per line, tokens per second), from one
/// prompt of [`PROBE_LINES`] lines evaluated whole (submit to result, one token generated).
fn measure(stack: &Stack) -> (f64, f64) {
    let start = Instant::now();
    let id = stack.run(ask(
        &long_prompt("Measure: here is a list.", PROBE_LINES),
        1,
    ));
    let r = stack.result(id, "the measuring prompt");
    let took = start.elapsed().as_secs_f64();
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "the measuring prompt completes: {r:?}"
    );
    let tokens = prompt_tokens(&r) as f64;
    assert!(tokens > 0.0, "timings with the prompt's tokens: {r:?}");
    (tokens / PROBE_LINES as f64, tokens / took)
}

// Minutes of two CPU-bound processes beside the stack, and 2 of 3 in the first soak: run by
// `make soak` (loopd-busy-box) and by hand, not by every `make test`, as `make chaos` is.
#[test]
#[ignore = "loads the box for minutes; make soak runs it (ONLY=loopd-busy-box)"]
fn a_stream_held_up_by_the_other_slots_long_prompt_on_a_busy_box_is_not_restarted() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let load = CpuLoad::start(LOAD);
    let mut stack = Stack::start(5);
    let (per_line, rate) = measure(&stack);
    let longest = MAX_LINES as f64 * per_line / rate;
    // Raise the factor until the longest prompt takes the stall timeouts it should.
    let want = STALLS * 30.0;
    if longest < want / stack.factor as f64 {
        let factor = ((want / longest).ceil() as u64).min(MAX_FACTOR);
        eprintln!(
            "busy_box: the longest prompt would take {longest:.1} s here: factor {factor} \
             instead of {}",
            stack.factor
        );
        drop(stack);
        stack = Stack::start(factor);
    }
    let stall = stall_timeout(stack.factor);
    let lines = ((STALLS * stall.as_secs_f64() * rate / per_line).ceil() as usize)
        .clamp(PROBE_LINES, MAX_LINES);
    eprintln!(
        "busy_box: {per_line:.1} tokens a line, {rate:.0} tokens/s beside {LOAD} CPU-bound \
         processes (load average {}); factor {}, stall_timeout {stall:?}; a prompt of {lines} \
         lines",
        load_average(),
        stack.factor
    );
    let before = stack.restarts();

    // The stream: its content events, stamped; the first one lets the long prompt go.
    let contents: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (streaming, first_content) = std::sync::mpsc::channel();
    let seen = contents.clone();
    let stream_observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Chat(ChatEvent::Content(_)) = e {
            let mut seen = seen.lock().unwrap();
            if seen.is_empty() {
                let _ = streaming.send(());
            }
            seen.push(Instant::now());
        }
    });
    let a = stack
        .runner
        .submit_observed(
            ask("Write the numbers from 1 to 300, one per line.", 600),
            Some(stream_observer),
        )
        .expect("a free slot for the stream");
    first_content
        .recv_timeout(Duration::from_secs(120))
        .expect("the stream's first content within 120 s");
    // The long prompt on the other slot, while the stream runs; its first content is the end
    // of its prefill.
    let (answered, first_answer) = std::sync::mpsc::channel();
    let mut told = false;
    let prompt_observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Chat(ChatEvent::Content(_)) = e {
            if !std::mem::replace(&mut told, true) {
                let _ = answered.send(Instant::now());
            }
        }
    });
    let sent = Instant::now();
    let b = stack
        .runner
        .submit_observed(
            ask(&long_prompt("Here is a list.", lines), 8),
            Some(prompt_observer),
        )
        .expect("the other slot free for the long prompt");
    let rb = stack.result(b, "the long prompt");
    let ra = stack.result(a, "the stream");
    // When its prefill ended: its first content (none if it failed before).
    let prefill = first_answer.try_recv().map(|t| t - sent).ok();
    let contents = contents.lock().unwrap().clone();
    let longest_silence = contents
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    let after = stack.restarts();
    eprintln!(
        "busy_box: the long prompt ({} tokens) answered {:?} after its submit; the stream's \
         longest silence {:.1} s over {} content events (stall_timeout {stall:?}); its stall \
         reports {:?}, its retries {:?}; (spawns, restarts) before {before:?}, after {after:?}; \
         load average {}",
        prompt_tokens(&rb),
        prefill,
        longest_silence.as_secs_f64(),
        contents.len(),
        ra.stalls,
        ra.retries,
        load_average()
    );
    // No restart, and both complete (before the fix: both `worker_restarted`, the stream's
    // stall report answered `restarting` or the worker's own timer first).
    assert_eq!(after, before, "(spawns, total_restarts) of the worker");
    assert!(
        matches!(ra.outcome, Outcome::Completed { .. }),
        "the stream completes: {ra:?}"
    );
    assert!(
        matches!(rb.outcome, Outcome::Completed { .. }),
        "the long prompt completes: {rb:?}"
    );
    // Whatever the stream reported, the worker found it alive.
    assert!(
        ra.stalls
            .iter()
            .all(|s| matches!(s, StallAnswer::NotStalled { .. })),
        "{:?}",
        ra.stalls
    );
    // The premise: the stream heard nothing for longer than the worker's stall timeout while
    // the prompt was evaluated.
    assert!(
        prefill.is_some_and(|p| p > stall) && longest_silence > stall,
        "the prompt took {prefill:?} and the stream's longest silence was {longest_silence:?}: \
         the test needs both past stall_timeout {stall:?}"
    );
    assert_eq!(stack.runner.busy_slots(), 0);
    drop(load);
}

/// Stops and continues `pid` so that it runs `on` of every `on + off` while `active` says so,
/// until dropped (then it is left running).
struct Throttle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Throttle {
    fn start(pid: u32, on: Duration, off: Duration, active: Arc<AtomicBool>) -> Throttle {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let signal = move |sig: libc::c_int| {
            // SAFETY: kill(2) with a pid this test found and a valid signal; no memory passes.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        };
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                if !active.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                signal(libc::SIGSTOP);
                std::thread::sleep(off);
                signal(libc::SIGCONT);
                std::thread::sleep(on);
            }
            signal(libc::SIGCONT);
        });
        Throttle {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The worked examples of `make run` (scripts/run-example.json), then a question the model
/// answers with an arithmetic call (3 of 3 at temperature 0, seed 42).
fn tool_request() -> Submission {
    let path = llama_harness::workspace_root().join("scripts/run-example.json");
    let mut messages: Vec<WireMessage> =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    messages.push(WireMessage::user(
        "What is 17 times 23? Use the arithmetic tool.",
    ));
    let mut cmd = SubmitCmd::new(messages);
    cmd.budget = Some(2);
    cmd.max_tokens = Some(64);
    cmd.tools = Some(vec!["arithmetic".into()]);
    cmd.to_submission().unwrap()
}

// Minutes of a throttled server: run by `make soak` (loopd-busy-box) and by hand.
#[test]
#[ignore = "throttles a real server for minutes; make soak runs it (ONLY=loopd-busy-box)"]
fn a_tool_calls_silent_opening_on_a_slow_server_is_not_a_stall() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // stall_timeout and liveness 3 s; /slots asked from 1.5 s of silence, every 0.5 s.
    let stack = Stack::start_with(10, |client| {
        builtin_tools(None, client.shared_clock()).unwrap()
    });
    let stall = stall_timeout(stack.factor);
    let status = stack.server.worker_status().expect("a worker status");
    let router = status["pid"].as_u64().expect("the router's pid") as u32;
    let instance = match llama_harness::children_of(router).as_slice() {
        [one] => *one,
        other => panic!("router {router} has children {other:?}, not one model instance"),
    };
    let before = stack.restarts();
    // The first generation's prompt runs at full speed; from its end (its last progress event)
    // until the tool runs, the instance runs 25 ms in 1000 (in 500, the opening took 2.5 s on
    // a quiet box, under the stall_timeout it must pass). What is seen: when the throttle
    // began, the first piece of the answer, and the worker's answers in between.
    #[derive(Default)]
    struct Seen {
        throttled_at: Option<Instant>,
        first_piece: Option<Instant>,
        alive_in_opening: u32,
        calls: u32,
    }
    let active = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let (s, on) = (seen.clone(), active.clone());
    let observer = Box::new(move |e: &RequestEvent| {
        let mut s = s.lock().unwrap();
        match e {
            RequestEvent::Chat(ChatEvent::Progress {
                total, processed, ..
            }) if processed == total && s.calls == 0 && s.throttled_at.is_none() => {
                on.store(true, Ordering::SeqCst);
                s.throttled_at = Some(Instant::now());
            }
            RequestEvent::Chat(
                ChatEvent::Content(_) | ChatEvent::Reasoning(_) | ChatEvent::ToolCallDelta { .. },
            ) if s.throttled_at.is_some() && s.first_piece.is_none() => {
                s.first_piece = Some(Instant::now());
            }
            RequestEvent::ToolStarted { .. } => {
                on.store(false, Ordering::SeqCst);
                s.calls += 1;
            }
            RequestEvent::Stall(StallAnswer::NotStalled { .. })
                if s.throttled_at.is_some() && s.first_piece.is_none() =>
            {
                s.alive_in_opening += 1;
            }
            _ => {}
        }
    });
    let throttle = Throttle::start(
        instance,
        Duration::from_millis(25),
        Duration::from_millis(975),
        active,
    );
    let id = stack
        .runner
        .submit_observed(tool_request(), Some(observer))
        .expect("a free slot");
    let r = stack.result(id, "the tool request");
    drop(throttle);
    let after = stack.restarts();
    let seen = seen.lock().unwrap();
    let opening = seen.throttled_at.zip(seen.first_piece).map(|(a, b)| b - a);
    eprintln!(
        "busy_box: throttled to 1/40 from the end of the prompt; the answer's first piece \
         {opening:?} later (stall_timeout {stall:?}); {} tool calls; stall answers {:?} ({} \
         not_stalled before the first piece); retries {:?}; (spawns, restarts) before \
         {before:?}, after {after:?}; outcome {:?}",
        seen.calls, r.stalls, seen.alive_in_opening, r.retries, r.outcome
    );
    assert_eq!(after, before, "(spawns, total_restarts) of the worker");
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "the request completes: {r:?}"
    );
    assert!(r.retries.is_empty(), "no retry: {:?}", r.retries);
    assert!(seen.calls >= 1, "the model called the tool: {r:?}");
    // The premise: the answer's opening was silent past stall_timeout, and the worker, asked
    // in that silence, found the slot decoding.
    assert!(
        opening.is_some_and(|o| o > stall) && seen.alive_in_opening >= 1,
        "the answer's first piece came {opening:?} after the prompt, with {} not_stalled \
         answers in between: the test needs a silence past stall_timeout {stall:?} that the \
         worker judged",
        seen.alive_in_opening
    );
    assert_eq!(stack.runner.busy_slots(), 0);
}
