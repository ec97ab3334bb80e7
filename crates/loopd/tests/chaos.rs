//! `make chaos`: the whole real stack (llama-worker running the router, inferproxy,
//! the real `loopd serve`) on the default timers divided by one factor (`CHAOS_FACTOR`, 5, as
//! in `wedged_server.rs`), answering `CHAOS_N` agent requests (50) of mixed kinds over the
//! daemon's socket while a thread injects faults at random times from a seeded RNG
//! (`CHAOS_SEED`; the seed is printed first so a failure can be replayed):
//!
//! - SIGKILL of the model instance (a child of the router): the worker restarts the unit (or,
//!   when a request reaches the router before the worker's probe, the router starts a new
//!   instance and the worker never sees the death: counted apart, docs/chaos.md finding 2);
//! - SIGSTOP of the model instance: the worker sees the generation make no progress and
//!   restarts the unit;
//! - SIGKILL of inferproxy, and its restart a moment later;
//! - a client `cancel` of a running request;
//! - a tool that hangs: `read_file` on a FIFO with no writer blocks for ever in `open`, and
//!   the runner must give it up at `runner.tool_timeout_ms`;
//! - SIGKILL of `loopd serve` itself, and a new one started on the same store: a
//!   request it had acknowledged is fetched from the next daemon, finished (its result was
//!   stored) or `failed`/`daemon_restarted` with the output checkpointed (a prefix of what it
//!   streamed); a submit it never answered is sent again; ids acknowledged after the restart
//!   are greater than every one before it.
//!
//! Checked, each by waiting for the condition with a deadline and saying what was last seen:
//! every request ends with a named outcome within its deadline and keeps the content it had
//! streamed; a cancelled one ends `cancelled`; the hanging tool is given up at its deadline;
//! no process of a killed server group survives the restart; at the end no runner slot is
//! busy, no server slot is processing, no generation is registered with the worker, the
//! worker is `ready`, a last request completes, and the daemon's own counters agree with the
//! outcomes seen here (in a run where the daemon was not killed: its counters are its
//! process's). Every acknowledged id is accounted for: a result was fetched for it. The figures
//! go to stderr and, by hand, to docs/chaos.md.
//!
//! `CHAOS_HOSTS=2` (`make chaos HOSTS=2`) puts a second host beside the first: its
//! own llama-worker router and inferproxy, reached through two socat forwarders standing in
//! for the SSH tunnel, and one daemon over both (`[[host]]` a and b). A server fault then hits
//! either host's model instance, and two more faults come in: b partitioned (its forwarders
//! killed, started again after 1 to 5 s) and b black-holed (its forwarders stopped for 3.5 to
//! 6 s). Checked besides: `host_lost` is among the named reasons, and no submit is refused
//! with a worker's code while a host was up (a refusal counts only when both hosts were
//! down, or within 10 s of being down, when it came: within an injected fault, or while its
//! worker, asked every 200 ms on its own socket, said anything but `ready`).
//!
//! `CHAOS_LOAD=n` runs n CPU-bound processes beside the stack for the run (a busy
//! box, as other builds make it); `CHAOS_FAULTS=0` injects nothing, and then every request must complete with no
//! restart. A request that failed with an error the runner retries must have used up its
//! retries.
//!
//! Ignored, so that `make test` (`cargo test --workspace --all-features`) does not run it: it
//! takes minutes and kills processes on purpose. `make chaos` runs it with `--ignored`.

mod real_serve;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use llama_harness::{wait_for, Forwarder, LocalServer, Proxy};
use loopd::config::Config;
use loopd_client::llama::Client;
use loopd_client::selftest::SAMPLING;
use loopd_client::ClientConfig;
use real_serve::{start_serve, Serve};
use serde_json::{json, Value};

/// The rolls of b's partition and black hole in the injector's first list (HOSTS=2).
const PARTITION: u64 = 100;
const BLACK_HOLE: u64 = 101;

/// Every fail reason a result may name: the runner's own and the client's (docs/runner.md).
const NAMED: &[&str] = &[
    "tool_execution_error",
    "tool_parse_error",
    "worker_restarted",
    "server_died",
    "worker_stopped",
    "loop_detected",
    "cancelled",
    "daemon_restarted",
    "panicked",
    "host_lost",
    "busy",
    "connect_error",
    "wait_timeout",
    "load_timeout",
    "stalled",
    "timed_out",
    "stream_closed_early",
    "thinking_overrun",
    "http_error",
    "protocol_error",
];

/// The refusals a client is told to try again later (docs/loopd.md, admission).
/// `SESSION_BUSY`: a turn of the same session is running (turns run one at a time).
const TRY_AGAIN: &[&str] = &["NO_SLOT_AVAILABLE", "WORKER_NOT_READY", "SESSION_BUSY"];

/// The sessions whose turns are among the requests (`chaos-0`, ...).
const SESSIONS: u64 = 3;

/// Not a daemon's code: the daemon was being killed and started again (no answer, or no
/// socket); the submit is sent again.
const DAEMON_RESTARTING: &str = "daemon restarting";

/// The FIFO in the read_file folder: `open` blocks on it while nobody writes.
const HANG_FILE: &str = "pipe.txt";

/// When the run started, for the timestamps of its log lines.
static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// One line of the run's log, stamped with the seconds since it started.
macro_rules! say {
    ($($a:tt)*) => {
        eprintln!("chaos {:7.1} s: {}", T0.get_or_init(Instant::now).elapsed().as_secs_f64(), format!($($a)*))
    };
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// xorshift64*: enough to replay a run from its seed without a new dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // A zero state would stay zero.
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn between_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }
}

/// The factor, the timers it gives, and what a run needs to know of them.
struct Timers {
    factor: u64,
    loopd: Config,
}

impl Timers {
    fn new(factor: u64) -> Timers {
        assert!(factor >= 1, "CHAOS_FACTOR must be at least 1");
        let d = Config::new("/unused", "unused");
        let mut c = d.clone();
        // The timeline's timers are scaled; the bounds on single IO calls (connect_ms,
        // call_ms, worker_timeout_ms) are not: a loaded 2-core box needs them as they are.
        c.limits.poll_ms = d.limits.poll_ms / factor;
        c.limits.busy_wait_ms = d.limits.busy_wait_ms / factor;
        c.limits.load_wait_ms = d.limits.load_wait_ms / factor;
        c.limits.idle_grace_ms = d.limits.idle_grace_ms / factor;
        c.limits.liveness_ms = d.limits.liveness_ms / factor;
        c.runner.tool_timeout_ms = d.runner.tool_timeout_ms / factor;
        c.runner.worker_poll_ms = d.runner.worker_poll_ms / factor;
        c.runner.stall_ms = d.runner.stall_ms / factor;
        c.runner.death_grace_ms = d.runner.death_grace_ms / factor;
        c.retry.delays_ms = d.retry.delays_ms.iter().map(|v| v / factor).collect();
        c.retry.total_ms = d.retry.total_ms / factor;
        Timers { factor, loopd: c }
    }

    /// llama-worker's defaults (docs/llama-worker.md) divided by the factor.
    fn worker_config(&self) -> String {
        let s = |default: f64| default / self.factor as f64;
        format!(
            "stall_timeout_s = {}\ncpu_probe_interval_s = {}\nprobe_interval_s = {}\n\
             unready_restart_s = {}\nrestart_backoff_s = {}\nrestart_window_s = {}\n\
             max_restarts_per_window = {MAX_RESTARTS}\n",
            s(30.0),
            s(5.0),
            s(5.0),
            s(30.0),
            s(2.0),
            s(600.0),
        )
    }

    /// How long one request may take from its accepted submit to its result: every wait it
    /// may legitimately sit in, one after another, plus a minute for the 2-core box
    /// (3 minutes with the factor 5).
    fn request_deadline(&self) -> Duration {
        let c = &self.loopd;
        let per_generation = c.limits.liveness_ms + c.runner.tool_timeout_ms;
        Duration::from_millis(
            c.retry.total_ms
                + c.limits.load_wait_ms
                + u64::from(c.runner.budget.min(BUDGET) + 1) * per_generation
                + 60_000,
        )
    }

    fn poll(&self) -> Duration {
        Duration::from_millis(self.loopd.limits.poll_ms)
    }

    /// Whether request `r`, failed with a retryable error, had used up its generation's
    /// retries (docs/runner.md, Retries): every attempt, or no time left in `retry.total_ms`
    /// for the next wait at its shortest (jitter taken off). The time is counted from the
    /// generation's event, which comes no later than its first attempt, so a failure this
    /// calls early surely was.
    fn retries_ran_out(&self, r: &Record) -> bool {
        let c = &self.loopd.retry;
        let (generation, began) = r.last_generation.unwrap_or((0, r.ended - r.took));
        let retried = r.retries.iter().filter(|(g, _)| *g == generation).count();
        let Some(&next) = c.delays_ms.get(retried) else {
            return true;
        };
        let shortest = next - next * c.jitter_percent.min(100) / 100;
        retried + 1 >= c.attempts as usize
            || (r.ended - began).as_millis() as u64 + shortest > c.total_ms
    }
}

/// The failure reasons the runner's retry schedule tries again (docs/runner.md, Retries):
/// a request that ends with one has used up its retries, or the run fails.
const RETRYABLE: &[&str] = &[
    "connect_error",
    "stream_closed_early",
    "stalled",
    "load_timeout",
];

/// Restarts in a row the worker allows here. Crash-loop protection (5 by default, with a
/// whole ready `restart_window_s` to start counting again) has tests of its own; a run of
/// chaos injects more server faults than that in a few minutes, on purpose.
const MAX_RESTARTS: u64 = 50;

/// The tool budget of every request here.
const BUDGET: u32 = 2;
/// Tool-calling requests, as `daemon_real_server.rs` found: SmolLM2 calls a tool when the
/// request carries worked examples of calls (`messages` before the question).
const SYSTEM: &str = "You answer every question by calling a tool.";

fn call(i: u32, name: &str, args: Value) -> Value {
    json!({"role": "assistant", "content": "", "tool_calls": [{"id": format!("call_{i}"),
           "name": name, "arguments": args.to_string()}]})
}

fn tool_result(i: u32, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": text})
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn answer(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

/// What a request asks, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Plain,
    Arithmetic,
    Time,
    ReadFile,
    /// `read_file` of the FIFO: the injected hanging tool.
    Hang,
    /// A turn of one of the [`SESSIONS`].
    Turn,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Arithmetic => "arithmetic",
            Kind::Time => "current_time",
            Kind::ReadFile => "read_file",
            Kind::Hang => "hanging read_file",
            Kind::Turn => "session turn",
        }
    }
}

/// The submit command of one request of `kind`.
fn submit_command(kind: Kind, rng: &mut Rng) -> Value {
    if kind == Kind::Turn {
        let questions = [
            "Name a colour.",
            "What did I ask you before?",
            "Say one more word.",
            "Count to five.",
            "Name an animal.",
        ];
        let q = questions[rng.below(questions.len() as u64) as usize];
        let session = format!("chaos-{}", rng.below(SESSIONS));
        return json!({"cmd": "turn", "session": session, "content": q, "follow": true});
    }
    let mut m = Vec::new();
    let (tools, prompt, max_tokens): (Vec<&str>, String, u32) = match kind {
        Kind::Plain => {
            let prompts = [
                "Count from one to fifty in words.",
                "Why is the sky blue?",
                "Write a short poem about the sea.",
                "List ten fruits, one per line.",
                "Explain what a computer is.",
            ];
            let p = prompts[rng.below(prompts.len() as u64) as usize];
            (vec![], p.to_owned(), 96)
        }
        Kind::Arithmetic => {
            for (k, (a, b)) in [(2, 4), (3, 5), (6, 2)].into_iter().enumerate() {
                let i = k as u32 + 1;
                m.push(user(&format!("Multiply {a} by {b}.")));
                m.push(call(
                    i,
                    "arithmetic",
                    json!({"operation": "multiply", "numbers": [a, b]}),
                ));
                m.push(tool_result(i, &(a * b).to_string()));
                m.push(answer(&(a * b).to_string()));
            }
            let (a, b) = (2 + rng.below(30), 2 + rng.below(30));
            (vec!["arithmetic"], format!("Multiply {a} by {b}."), 64)
        }
        Kind::Time => {
            for (i, t) in [(1, "2026-01-02T03:04:05Z"), (2, "2026-03-04T05:06:07Z")] {
                m.push(user("What time is it?"));
                m.push(call(i, "current_time", json!({})));
                m.push(tool_result(i, t));
                m.push(answer(&format!("It is {t}.")));
            }
            (vec!["current_time"], "What time is it?".to_owned(), 64)
        }
        Kind::Turn => unreachable!("a turn's command is made above"),
        Kind::ReadFile | Kind::Hang => {
            for (i, (f, t)) in [(1, ("a.txt", "apples")), (2, ("b.txt", "bread"))] {
                m.push(user(&format!("Read the file {f}.")));
                m.push(call(i, "read_file", json!({"path": f})));
                m.push(tool_result(i, t));
                m.push(answer(&format!("The file {f} says: {t}")));
            }
            let f = if kind == Kind::Hang {
                HANG_FILE
            } else {
                "notes.txt"
            };
            (vec!["read_file"], format!("Read the file {f}."), 64)
        }
    };
    m.push(user(&prompt));
    let mut cmd = json!({"cmd": "submit", "messages": m, "budget": BUDGET,
                         "max_tokens": max_tokens, "tools": tools, "follow": true});
    if kind != Kind::Plain {
        cmd["system"] = SYSTEM.into();
    }
    cmd
}

/// One command line to the daemon, one answer line back.
fn daemon_call(socket: &Path, cmd: &Value, timeout: Duration) -> Result<Value, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{cmd}\n").as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut line = String::new();
    BufReader::new(s)
        .read_line(&mut line)
        .map_err(|e| format!("read: {e}"))?;
    serde_json::from_str(&line).map_err(|e| format!("not JSON ({e}): {line:?}"))
}

/// What the request threads and the injector share.
#[derive(Default)]
struct Shared {
    /// Running requests, by id: whether content has streamed in the current generation.
    running: Mutex<BTreeMap<u64, bool>>,
    /// Requests the injector cancelled while they ran (the daemon said `cancelling`).
    cancelled: Mutex<Vec<u64>>,
    /// Set by the injector: the next request reads the FIFO.
    hang_next: AtomicBool,
    /// Requests that read the FIFO and have not ended.
    hanging: AtomicUsize,
    /// Requests not yet submitted.
    remaining: AtomicUsize,
    /// Set when every request has ended: inject nothing more.
    done: AtomicBool,
    /// `loopd serve` kills so far (counted before each kill).
    daemon_kills: AtomicUsize,
    /// Twice the kills done, plus one while a kill is under way (from just before it until
    /// the next daemon is ready): one atomic, so a snapshot never falls between the two.
    daemon_epoch: AtomicUsize,
    /// Every acknowledged id, with the daemon kills counted when it was acknowledged.
    acks: Mutex<Vec<(usize, u64)>>,
    /// Each time a host was down (`CHAOS_HOSTS=2`): an injected fault, or its worker saying
    /// anything but `ready`: the host (0 a, 1 b), its start and, once over, its end.
    down: Mutex<Vec<(usize, Instant, Option<Instant>)>>,
}

impl Shared {
    /// A fault on `host` begins; returns its index for [`Shared::host_up`].
    fn host_down(&self, host: usize) -> usize {
        let mut d = self.down.lock().unwrap();
        d.push((host, Instant::now(), None));
        d.len() - 1
    }

    fn host_up(&self, fault: usize) {
        if let Some(f) = self.down.lock().unwrap().get_mut(fault) {
            f.2 = Some(Instant::now());
        }
    }

    /// Whether every one of `hosts` hosts was within a fault (or `grace` after its end) at `at`.
    fn all_down_at(&self, hosts: usize, at: Instant, grace: Duration) -> bool {
        let d = self.down.lock().unwrap();
        (0..hosts).all(|h| {
            d.iter().any(|&(host, from, to)| {
                host == h && from <= at && to.is_none_or(|to| at <= to + grace)
            })
        })
    }
}

impl Shared {
    /// The daemon epoch before any kill under way: a connection opened now may still be
    /// talking to the daemon being killed. Compared with [`Shared::epoch`] later, a difference
    /// says a kill began since.
    fn daemons_before(&self) -> usize {
        self.daemon_epoch.load(Ordering::SeqCst) & !1
    }

    fn epoch(&self) -> usize {
        self.daemon_epoch.load(Ordering::SeqCst)
    }
}

/// How one request ended, as seen here.
#[derive(Debug)]
struct Record {
    kind: Kind,
    id: u64,
    outcome: String,
    reason: Option<String>,
    detail: String,
    content: Option<String>,
    /// Content streamed in the request's last generation (from its `follow` events).
    streamed: String,
    /// When a `read_file` of the FIFO started, if one did.
    hang_started: Option<Instant>,
    ended: Instant,
    took: Duration,
    tools: Vec<String>,
    /// The retries of the result (`retries`): each one's generation and failed attempt's error.
    retries: Vec<(u64, String)>,
    /// The last `generation` event: its number and when it came (its first attempt began then
    /// or a moment later).
    last_generation: Option<(u64, Instant)>,
    /// The daemon that acknowledged it was killed: its result came from the next one.
    across_restart: bool,
    /// A turn's session.
    session: Option<String>,
    /// Its `kv` events' action and outcome, in order.
    kv: Vec<(String, String)>,
    /// A turn's `session` record's `cache_n` and `total_n`.
    turn_tokens: Option<(u64, u64)>,
}

enum Attempt {
    /// Told to try again later (the code).
    Refused(String),
    Done(Box<Record>),
}

/// Waits for request `id`'s result (`wait`, which removes it) until `end_by`, through daemon
/// restarts: a refused connection or a cut answer is tried again every 300 ms.
fn wait_across_restarts(socket: &Path, id: u64, end_by: Instant) -> Result<Value, String> {
    let mut last = String::new();
    loop {
        let left = end_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "request {id}: no result by its deadline; last: {last}"
            ));
        }
        let cmd = json!({"cmd": "wait", "id": id, "timeout_ms": left.as_millis() as u64});
        match daemon_call(socket, &cmd, left + Duration::from_secs(5)) {
            Ok(v) if v["ok"] == true => return Ok(v),
            Ok(v) if v["error"] == "PENDING" => last = v.to_string(),
            Ok(v) => return Err(format!("request {id}: wait answered {v}")),
            Err(e) => {
                last = e;
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
}

/// Submits one request with `follow`, reads its events and the result copy, then fetches the
/// result with `wait` (which removes it): the two must agree. When the injector kills the
/// daemon meanwhile, a submit not yet acknowledged is refused (sent again later), and an
/// acknowledged one is fetched from the next daemon.
fn run_one(
    socket: &Path,
    kind: Kind,
    cmd: &Value,
    deadline: Duration,
    shared: &Shared,
) -> Result<Attempt, String> {
    let session = cmd["session"].as_str().map(str::to_owned);
    let kills = shared.daemons_before();
    let killed = || shared.epoch() != kills;
    let restarting = |e: String| {
        if killed() {
            Ok(Attempt::Refused(DAEMON_RESTARTING.to_owned()))
        } else {
            Err(e)
        }
    };
    let mut s = match UnixStream::connect(socket) {
        Ok(s) => s,
        // The socket file stays behind a killed daemon: refused until the next one binds.
        Err(e) if shared.daemon_kills.load(Ordering::SeqCst) > 0 => {
            let _ = e;
            return Ok(Attempt::Refused(DAEMON_RESTARTING.to_owned()));
        }
        Err(e) => return Err(format!("connect: {e}")),
    };
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    if let Err(e) = s.write_all(format!("{cmd}\n").as_bytes()) {
        return restarting(format!("write: {e}"));
    }
    let started = Instant::now();
    let end_by = started + deadline;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let mut next_line = |what: &str| -> Result<Value, String> {
        let left = end_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no {what} within the deadline of {deadline:?}"));
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) => Err(format!(
                "the daemon closed the connection before the {what}"
            )),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("not JSON ({e}): {line:?}")),
            Err(e) => Err(format!(
                "no {what} within the deadline of {deadline:?}: {e}"
            )),
        }
    };
    let first = match next_line("submit answer") {
        Ok(v) => v,
        Err(e) => return restarting(e),
    };
    if first["ok"] != true {
        let code = first["error"].as_str().unwrap_or("").to_owned();
        return if TRY_AGAIN.contains(&code.as_str()) {
            Ok(Attempt::Refused(code))
        } else {
            Err(format!("submit refused: {first}"))
        };
    }
    let id = first["id"]
        .as_u64()
        .ok_or_else(|| format!("no id in {first}"))?;
    // A kill under way: this ack came from the daemon being killed.
    let acked_at = shared.daemons_before();
    shared.acks.lock().unwrap().push((acked_at, id));
    shared.running.lock().unwrap().insert(id, false);
    let mut streamed = String::new();
    let mut hang_started = None;
    let mut tools = Vec::new();
    let mut kv = Vec::new();
    let mut last_generation = None;
    let killed_since_ack = || shared.epoch() != acked_at;
    let mut across_restart = false;
    let copy = loop {
        let line = match next_line("result") {
            Ok(l) => l,
            Err(_) if killed_since_ack() => {
                across_restart = true;
                break None;
            }
            Err(e) => {
                shared.running.lock().unwrap().remove(&id);
                return Err(format!("request {id} ({}): {e}", kind.name()));
            }
        };
        // The result line; a `tool_finished` event has a `result` too, its text.
        if line.get("event").is_none() && line["result"].is_object() {
            break Some(line["result"].clone());
        }
        match line["event"].as_str() {
            // The partial output kept is the last generation's: a new generation (or a new
            // attempt at one) starts the text afresh.
            Some("generation") => {
                streamed.clear();
                last_generation = line["number"].as_u64().map(|n| (n, Instant::now()));
            }
            Some("retrying") => streamed.clear(),
            Some("kv") => {
                let s = |k: &str| line[k].as_str().unwrap_or("").to_owned();
                kv.push((s("action"), s("outcome")));
            }
            Some("content") => {
                streamed.push_str(line["text"].as_str().unwrap_or(""));
                shared.running.lock().unwrap().insert(id, true);
            }
            Some("tool_started") => {
                let name = line["name"].as_str().unwrap_or("").to_owned();
                let args = line["arguments"].as_str().unwrap_or("");
                if name == "read_file" && args.contains(HANG_FILE) {
                    hang_started = Some(Instant::now());
                }
                tools.push(name);
            }
            _ => {}
        }
        // An error line ends the stream (a `tool_finished` event has an `ok` of its own).
        if line.get("event").is_none() && line["ok"] == false {
            shared.running.lock().unwrap().remove(&id);
            return Err(format!("request {id}: the follow stream said {line}"));
        }
    };
    let ended = Instant::now();
    shared.running.lock().unwrap().remove(&id);
    let left = end_by
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    let cmd = json!({"cmd": "wait", "id": id, "timeout_ms": left.as_millis() as u64});
    let fetched = match daemon_call(socket, &cmd, left + Duration::from_secs(5)) {
        Ok(v) if v["ok"] == true => v,
        // Killed before or while it was asked: the next daemon has it in its store.
        _ if killed_since_ack() => {
            across_restart = true;
            wait_across_restarts(socket, id, Instant::now() + left)?
        }
        Ok(v) => return Err(format!("request {id}: `wait` answered {v}")),
        Err(e) => return Err(format!("request {id}: wait: {e}")),
    };
    let result = &fetched["result"];
    if let Some(copy) = &copy {
        if result["outcome"] != copy["outcome"] {
            return Err(format!(
                "request {id}: `wait` answered {fetched}, the follow stream ended with {copy}"
            ));
        }
    }
    let ended = if copy.is_some() {
        ended
    } else {
        Instant::now()
    };
    Ok(Attempt::Done(Box::new(Record {
        kind,
        id,
        outcome: result["outcome"].as_str().unwrap_or("").to_owned(),
        reason: result["fail_reason"].as_str().map(str::to_owned),
        detail: result["detail"].as_str().unwrap_or("").to_owned(),
        content: result["content"].as_str().map(str::to_owned),
        streamed,
        hang_started,
        ended,
        took: ended - started,
        tools,
        retries: result["retries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let generation = r["generation"].as_u64().unwrap_or(0);
                (generation, r["error"].as_str().unwrap_or("").to_owned())
            })
            .collect(),
        last_generation,
        across_restart,
        session,
        kv,
        turn_tokens: result["session"]["cache_n"]
            .as_u64()
            .zip(result["session"]["total_n"].as_u64()),
    })))
}

/// The live pids (a zombie has already died) whose parent pid and process group satisfy
/// `pick`, from `/proc/*/stat`.
fn scan_proc(pick: impl Fn(u32, u32) -> bool) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid pgrp ...`: the comm may hold spaces, so split after its `)`.
        let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
        let state = rest.next()?;
        let ppid: u32 = rest.next()?.parse().ok()?;
        let pgrp: u32 = rest.next()?.parse().ok()?;
        (state != "Z" && pick(ppid, pgrp)).then_some(pid)
    })
    .collect()
}
fn group_members(pgid: u32) -> Vec<u32> {
    scan_proc(|_, pgrp| pgrp == pgid)
}

fn kill(signal: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The worker's Prometheus text (`metrics`, read to `# EOF`).
fn worker_metrics(socket: &Path) -> Result<String, String> {
    let mut s = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"metrics\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut s, &mut text).map_err(|e| e.to_string())?;
    if !text.trim_end().ends_with("# EOF") {
        return Err(format!("metrics cut short: {text}"));
    }
    Ok(text)
}

/// `name{label="value"} n` lines of `text` as (value, n).
fn series(text: &str, name: &str, label: &str) -> Vec<(String, f64)> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (labels, n) = rest.rsplit_once("} ")?;
            let key = format!("{label}=\"");
            let v = labels.split(',').find_map(|kv| kv.strip_prefix(&key))?;
            Some((v.trim_end_matches('"').to_owned(), n.trim().parse().ok()?))
        })
        .collect()
}

/// What the injector did, for the summary and the checks.
#[derive(Default)]
struct Injected {
    /// Faults injected, by name.
    counts: BTreeMap<&'static str, u32>,
    /// Faults not injected and why (no running request, crash-loop headroom, ...).
    skipped: BTreeMap<String, u32>,
    /// Each server restart caused here: what was injected, the group killed, how long until
    /// the worker was ready again.
    restarts: Vec<String>,
    /// Each `loopd serve` killed here and how long until the next one was ready.
    daemon_restarts: Vec<String>,
}

struct Injector<'a> {
    server: &'a LocalServer,
    /// `CHAOS_HOSTS=2`: host b's server and its two forwarders (infer, status).
    host_b: Option<(&'a LocalServer, &'a Mutex<(Forwarder, Forwarder)>)>,
    /// `loopd serve`, and what starts the next one: its config, read_file folder and run
    /// directory (its store, its log).
    serve: &'a Mutex<Serve>,
    serve_paths: (&'a Path, &'a Path, &'a Path),
    proxy: &'a Mutex<Proxy>,
    daemon: &'a Path,
    shared: &'a Shared,
    rng: Rng,
    out: Injected,
    /// llama-worker's `probe_interval_s`, scaled.
    probe_interval: Duration,
}

impl Injector<'_> {
    fn skip(&mut self, why: impl Into<String>) {
        *self.out.skipped.entry(why.into()).or_default() += 1;
    }

    fn run(mut self) -> Injected {
        // CHAOS_FAULTS=0: the same requests without faults, the baseline to compare with.
        let faults = env_u64("CHAOS_FAULTS", 1) != 0;
        // Every kind once first, in a seeded order (a roll of each kind's range below), so a
        // short run injects each; a kind skipped for now is tried again later. Then at random.
        let mut first: Vec<u64> = vec![0, 25, 45, 65, 85, 89];
        // HOSTS=2: a partition and a black hole of b among the first too (rolls past 99, which
        // only this list gives).
        if self.host_b.is_some() {
            first.extend([PARTITION, BLACK_HOLE]);
        }
        for i in (1..first.len()).rev() {
            first.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        while faults && !self.shared.done.load(Ordering::SeqCst) {
            std::thread::sleep(self.rng.between_ms(1_500, 6_000));
            if self.shared.done.load(Ordering::SeqCst) {
                break;
            }
            let again = |first: &mut Vec<u64>, roll: u64, from_first: bool| {
                if from_first {
                    first.insert(0, roll);
                }
            };
            let from_first = !first.is_empty();
            let roll = first.pop().unwrap_or_else(|| self.rng.below(100));
            match roll {
                0..=44 => {
                    // A stopped instance is found only by a generation that waits on it, so a
                    // server fault needs requests still to come; and the crash-loop budget,
                    // raised here, is not to be used up by the injector alone.
                    if self.shared.remaining.load(Ordering::SeqCst) < 3 {
                        self.skip("server fault: fewer than 3 requests left to meet it");
                        again(&mut first, roll, from_first);
                        continue;
                    }
                    let target = match self.host_b {
                        Some((b, _)) if self.rng.below(2) == 1 => (1, b),
                        _ => (0, self.server),
                    };
                    let consecutive = target
                        .1
                        .worker_status()
                        .ok()
                        .and_then(|s| s["consecutive_restarts"].as_u64())
                        .unwrap_or(u64::MAX);
                    if consecutive + 2 >= MAX_RESTARTS {
                        self.skip("server fault: crash-loop headroom");
                        again(&mut first, roll, from_first);
                        continue;
                    }
                    self.server_fault(if roll < 25 { "-KILL" } else { "-STOP" }, target);
                }
                PARTITION => self.network_fault(Some(true)),
                BLACK_HOLE => self.network_fault(Some(false)),
                45..=64 if self.host_b.is_some() && self.rng.below(3) != 0 => {
                    self.network_fault(None);
                }
                45..=64 => {
                    let down = self.rng.between_ms(100, 2_000);
                    let mut p = self.proxy.lock().unwrap();
                    let fault = self.shared.host_down(0);
                    p.kill();
                    std::thread::sleep(down);
                    p.restart();
                    drop(p);
                    self.shared.host_up(fault);
                    say!("inferproxy killed, restarted after {down:?}");
                    *self
                        .out
                        .counts
                        .entry("SIGKILL inferproxy + restart")
                        .or_default() += 1;
                }
                65..=84 => {
                    let ids: Vec<u64> = self
                        .shared
                        .running
                        .lock()
                        .unwrap()
                        .keys()
                        .copied()
                        .collect();
                    if ids.is_empty() {
                        self.skip("cancel: no request running");
                        again(&mut first, roll, from_first);
                        continue;
                    }
                    let id = ids[self.rng.below(ids.len() as u64) as usize];
                    let a = match daemon_call(
                        self.daemon,
                        &json!({"cmd": "cancel", "id": id}),
                        Duration::from_secs(10),
                    ) {
                        Ok(a) => a,
                        Err(e) if self.shared.daemon_kills.load(Ordering::SeqCst) > 0 => {
                            // A request of a killed daemon, still listed until its thread
                            // fetches it from the next one.
                            self.skip(format!("cancel: {e}"));
                            continue;
                        }
                        Err(e) => panic!("cancel {id}: {e}"),
                    };
                    match a["state"].as_str() {
                        Some("cancelling") => {
                            self.shared.cancelled.lock().unwrap().push(id);
                            *self.out.counts.entry("client cancel").or_default() += 1;
                            say!("cancel {id}");
                        }
                        // It ended between the pick and the cancel.
                        _ => self.skip(format!("cancel: answered {a}")),
                    }
                }
                85..=88 => {
                    if self.shared.remaining.load(Ordering::SeqCst) < 3 {
                        self.skip("daemon kill: fewer than 3 requests left");
                        again(&mut first, roll, from_first);
                        continue;
                    }
                    self.daemon_fault();
                }
                _ => {
                    self.shared.hang_next.store(true, Ordering::SeqCst);
                    *self.out.counts.entry("hanging tool").or_default() += 1;
                    say!("the next request reads the FIFO");
                    // No other fault until that request has ended (or 30 s): a kill would end
                    // it before its tool ran, and the hang is what this fault is about.
                    let until = Instant::now() + Duration::from_secs(30);
                    while Instant::now() < until
                        && !self.shared.done.load(Ordering::SeqCst)
                        && (self.shared.hang_next.load(Ordering::SeqCst)
                            || self.shared.hanging.load(Ordering::SeqCst) > 0)
                    {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
        self.out
    }

    /// SIGKILL of `loopd serve`, then a new one on the same config and store, waited for until
    /// it says `READY=1` (after its self-test).
    fn daemon_fault(&mut self) {
        let (config, folder, dir) = self.serve_paths;
        let mut serve = self.serve.lock().unwrap();
        let pid = serve.0.id();
        self.shared.daemon_epoch.fetch_add(1, Ordering::SeqCst);
        self.shared.daemon_kills.fetch_add(1, Ordering::SeqCst);
        assert!(kill("-KILL", pid), "kill -KILL {pid}");
        let _ = serve.0.wait();
        let at = Instant::now();
        say!("SIGKILL loopd serve {pid}; starting the next one on the same store");
        let (next, _) = start_serve(config, folder, dir);
        *serve = next;
        self.shared.daemon_epoch.fetch_add(1, Ordering::SeqCst);
        *self
            .out
            .counts
            .entry("SIGKILL loopd serve + restart")
            .or_default() += 1;
        self.out.daemon_restarts.push(format!(
            "loopd serve {pid} killed: the next one ({}) ready after {:.1} s",
            serve.0.id(),
            at.elapsed().as_secs_f64()
        ));
        say!(
            "loopd serve {} ready after {:.1} s",
            serve.0.id(),
            at.elapsed().as_secs_f64()
        );
    }

    /// Host b's forwarders killed and started again after 1 to 5 s (a partition), or stopped
    /// for 3.5 to 6 s and continued (a black hole); then b must be ready again in the
    /// daemon's `status`.
    fn network_fault(&mut self, partition: Option<bool>) {
        let Some((_, links)) = self.host_b else {
            return;
        };
        let partition = partition.unwrap_or_else(|| self.rng.below(2) == 0);
        let fault = self.shared.host_down(1);
        let at = Instant::now();
        let name = if partition {
            let down = self.rng.between_ms(1_000, 5_000);
            let mut l = links.lock().unwrap();
            l.0.kill();
            l.1.kill();
            say!("host b partitioned (forwarders killed) for {down:?}");
            std::thread::sleep(down);
            l.0.restart();
            l.1.restart();
            "host b partitioned + rejoined"
        } else {
            let down = self.rng.between_ms(3_500, 6_000);
            let l = links.lock().unwrap();
            l.0.pause();
            l.1.pause();
            say!("host b black-holed (forwarders stopped) for {down:?}");
            std::thread::sleep(down);
            l.0.resume();
            l.1.resume();
            "host b black-holed + continued"
        };
        *self.out.counts.entry(name).or_default() += 1;
        // Ready again in the daemon's eyes: a new watch said ready.
        let daemon = self.daemon;
        wait_for(
            &format!("host b ready again in the daemon's status after {name}"),
            Duration::from_secs(120),
            || {
                let s = daemon_call(daemon, &json!({"cmd": "status"}), Duration::from_secs(10))?;
                let b = s["status"]["hosts"]
                    .as_array()
                    .and_then(|h| h.iter().find(|h| h["name"] == "b").cloned());
                match b {
                    Some(b) if b["state"] == "ready" => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        );
        self.shared.host_up(fault);
        self.out.restarts.push(format!(
            "{name}: b ready again in the daemon after {:.1} s",
            at.elapsed().as_secs_f64()
        ));
    }

    /// `signal` to the model instance of `target` (its index, its server); then its worker
    /// must be ready with a new unit, and no process of the old group may be left.
    fn server_fault(&mut self, signal: &str, target: (usize, &LocalServer)) {
        let (host, server) = target;
        let Ok(status) = server.worker_status() else {
            self.skip("server fault: no worker status");
            return;
        };
        if status["state"] != "ready" {
            self.skip(format!("server fault: worker {}", status["state"]));
            return;
        }
        let (Some(router), Some(pgid), Some(spawns)) = (
            status["pid"].as_u64().map(|p| p as u32),
            status["pgid"].as_u64().map(|p| p as u32),
            status["spawns"].as_u64(),
        ) else {
            self.skip(format!(
                "server fault: status without pid/pgid/spawns: {status}"
            ));
            return;
        };
        let instance = match llama_harness::children_of(router).as_slice() {
            [one] => *one,
            other => {
                self.skip(format!("server fault: router children {}", other.len()));
                return;
            }
        };
        let members = group_members(pgid);
        let at = Instant::now();
        let fault = self.shared.host_down(host);
        assert!(kill(signal, instance), "kill {signal} {instance}");
        let name = if signal == "-STOP" {
            "SIGSTOP model instance"
        } else {
            "SIGKILL model instance"
        };
        *self.out.counts.entry(name).or_default() += 1;
        say!("{name} {instance} (router {router}, group {pgid}: {members:?})");
        let host_name = ["a", "b"][host.min(1)];
        say!("(on host {host_name})");
        if signal == "-KILL" && !Self::worker_saw_it(server, self.probe_interval, spawns) {
            self.shared.host_up(fault);
            // The router respawned the instance for the next request before the worker's
            // readiness probe could see it failed: no restart, and nothing for the worker to
            // kill. The instance must be gone all the same, and the worker still ready.
            wait_for(
                &format!("the killed instance {instance} gone"),
                Duration::from_secs(10),
                || match scan_proc(|_, _| true).contains(&instance) {
                    false => Ok(()),
                    true => Err(format!("{instance} still in /proc")),
                },
            );
            *self
                .out
                .counts
                .entry("SIGKILL model instance: of those, unseen by the worker (the router respawned it)")
                .or_default() += 1;
            return;
        }
        // A stall takes the scaled stall_timeout_s after the last progress, a death the next
        // readiness probe; then the backoff and a model load on a loaded box.
        let now = server.wait_worker(
            &format!("llama-worker ready with a new server after {name}"),
            Duration::from_secs(180),
            |s| {
                s["state"] == "ready"
                    && s["spawns"].as_u64().is_some_and(|n| n > spawns)
                    && s["pgid"].as_u64() != Some(u64::from(pgid))
            },
        );
        let healed = at.elapsed();
        self.shared.host_up(fault);
        wait_for(
            &format!("no process of the old group {pgid} left after {name}"),
            Duration::from_secs(10),
            || match group_members(pgid).as_slice() {
                [] => Ok(()),
                alive => Err(format!("alive in group {pgid}: {alive:?}")),
            },
        );
        self.out.restarts.push(format!(
            "{name}: group {pgid} ({} processes) gone; ready again after {:.1} s (cause {})",
            members.len(),
            healed.as_secs_f64(),
            now["last_cause"]
        ));
    }
}

impl Injector<'_> {
    /// Whether the worker reacts to a killed instance (leaves `ready` or spawns again) within
    /// its readiness probe interval and a margin; polled every 100 ms.
    fn worker_saw_it(server: &LocalServer, probe_interval: Duration, spawns: u64) -> bool {
        let until = Instant::now() + probe_interval + Duration::from_secs(3);
        while Instant::now() < until {
            if let Ok(s) = server.worker_status() {
                if s["state"] != "ready" || s["spawns"].as_u64().is_some_and(|n| n > spawns) {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

/// Opens the FIFO for writing until no reader is left: each open lets every `read_file` that
/// hung in `open` go on (it reads an empty file and its thread ends, long after the runner
/// gave it up). `ENXIO` says there is no reader.
fn release_hung_readers(fifo: &Path) -> u32 {
    let mut opened = 0;
    for _ in 0..50 {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
        {
            Ok(f) => {
                opened += 1;
                drop(f);
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => break,
        }
    }
    opened
}

fn write_loopd_config(
    timers: &Timers,
    server: &LocalServer,
    proxy: &Path,
    socket: &Path,
    path: &Path,
    hosts: &str,
) {
    let props = Client::new(ClientConfig::new(proxy, server.model()))
        .props()
        .expect("GET /props through inferproxy");
    let c = &timers.loopd;
    let delays: Vec<String> = c.retry.delays_ms.iter().map(u64::to_string).collect();
    let text = format!(
        "socket = {:?}\nmodel = {:?}\n\
         [limits]\npoll_ms = {}\nbusy_wait_ms = {}\nload_wait_ms = {}\nidle_grace_ms = {}\n\
         liveness_ms = {}\nmax_tokens = 256\n\
         [retry]\ndelays_ms = [{}]\ntotal_ms = {}\n\
         [sampling]\ntemperature = 0.0\nseed = {}\n\
         [runner]\nbudget = {BUDGET}\nworker_socket = {:?}\ntool_timeout_ms = {}\n\
         worker_poll_ms = {}\nstall_ms = {}\ndeath_grace_ms = {}\n\
         [daemon]\nsocket = {:?}\n\
         [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
        proxy.display().to_string(),
        server.model(),
        c.limits.poll_ms,
        c.limits.busy_wait_ms,
        c.limits.load_wait_ms,
        c.limits.idle_grace_ms,
        c.limits.liveness_ms,
        delays.join(", "),
        c.retry.total_ms,
        SAMPLING.seed.unwrap_or(42),
        server.status_socket().display().to_string(),
        c.runner.tool_timeout_ms,
        c.runner.worker_poll_ms,
        c.runner.stall_ms,
        c.runner.death_grace_ms,
        socket.display().to_string(),
        llama_proto::hash::sha256(props.chat_template.as_bytes()).unwrap(),
        props.n_ctx,
        props.total_slots,
    );
    std::fs::write(path, text + hosts).expect("write loopd.toml");
}
/// What the summary prints.
struct Summary<'a> {
    seed: u64,
    n: usize,
    timers: &'a Timers,
    wall: Duration,
    chaos_time: Duration,
    deadline: Duration,
    records: &'a [Record],
    refused: &'a BTreeMap<String, u32>,
    injected: &'a Injected,
    worker_before: &'a str,
    worker_after: &'a str,
    worker_status: &'a str,
    /// CPU-bound processes run beside the stack (`CHAOS_LOAD`).
    load: usize,
    /// The load average when the requests began, and when they had ended.
    load_average: (&'a str, &'a str),
    faults: bool,
}

/// The worker's restarts between two `metrics` texts, by cause (only causes that rose).
fn restarts_between(before: &str, after: &str) -> Vec<(String, f64)> {
    let restarts = |text: &str| series(text, "llama_worker_restarts_total", "cause");
    let before: HashMap<String, f64> = restarts(before).into_iter().collect();
    restarts(after)
        .into_iter()
        .map(|(cause, v)| {
            let d = v - before.get(&cause).copied().unwrap_or(0.0);
            (cause, d)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

/// The figures docs/chaos.md records; printed before any check, so a failed run has them too.
fn print_summary(s: &Summary<'_>) {
    let mut by_outcome: BTreeMap<String, u32> = BTreeMap::new();
    let mut by_kind: BTreeMap<(Kind, String), u32> = BTreeMap::new();
    for r in s.records {
        let o = match &r.reason {
            Some(reason) => format!("failed: {reason}"),
            None => "completed".to_owned(),
        };
        *by_outcome.entry(o.clone()).or_default() += 1;
        *by_kind.entry((r.kind, o)).or_default() += 1;
    }
    let slowest = s.records.iter().map(|r| r.took).max().unwrap_or_default();
    let kept = s
        .records
        .iter()
        .filter(|r| r.reason.is_some() && !r.streamed.is_empty())
        .count();
    let tool_calls: usize = s.records.iter().map(|r| r.tools.len()).sum();
    let hung = s
        .records
        .iter()
        .filter(|r| r.hang_started.is_some())
        .count();
    eprintln!(
        "\n== chaos summary: CHAOS_SEED={} CHAOS_N={} CHAOS_FACTOR={} CHAOS_FAULTS={} \
         CHAOS_LOAD={} ==",
        s.seed,
        s.n,
        s.timers.factor,
        u8::from(s.faults),
        s.load
    );
    eprintln!(
        "load average {} when the requests began, {} when they had ended ({} CPU-bound \
         processes of the run's own among it)",
        s.load_average.0, s.load_average.1, s.load
    );
    eprintln!(
        "wall {:.0} s (requests under faults {:.0} s); slowest request {:.1} s (deadline {:.0} \
         s); {tool_calls} tool calls run",
        s.wall.as_secs_f64(),
        s.chaos_time.as_secs_f64(),
        slowest.as_secs_f64(),
        s.deadline.as_secs_f64()
    );
    eprintln!("outcomes ({} requests ended):", s.records.len());
    for (o, c) in &by_outcome {
        eprintln!("  {c:>4}  {o}");
    }
    eprintln!("  ({kept} failed requests had streamed content; the check: each kept it)");
    let across: Vec<&Record> = s.records.iter().filter(|r| r.across_restart).collect();
    if !across.is_empty() {
        let restarted = across
            .iter()
            .filter(|r| r.reason.as_deref() == Some("daemon_restarted"))
            .count();
        eprintln!(
            "  ({} results fetched from the daemon after the one that acknowledged them: {} \
             daemon_restarted, {} as they had ended)",
            across.len(),
            restarted,
            across.len() - restarted
        );
    }
    let mut retried: BTreeMap<&str, u32> = BTreeMap::new();
    for (_, error) in s.records.iter().flat_map(|r| &r.retries) {
        *retried.entry(error.as_str()).or_default() += 1;
    }
    let retried_requests = s.records.iter().filter(|r| !r.retries.is_empty()).count();
    eprintln!(
        "retries ({} in {retried_requests} requests), by the failed attempt's error:",
        retried.values().sum::<u32>()
    );
    for (e, c) in &retried {
        eprintln!("  {c:>4}  {e}");
    }
    eprintln!(
        "failed with an error the runner retries (the check: none before its retries ran out):"
    );
    for reason in RETRYABLE {
        let failed: Vec<&Record> = s
            .records
            .iter()
            .filter(|r| r.reason.as_deref() == Some(*reason))
            .collect();
        let out = failed
            .iter()
            .filter(|r| s.timers.retries_ran_out(r))
            .count();
        eprintln!(
            "  {:>4}  {reason}: {out} after their retries ran out, {} before",
            failed.len(),
            failed.len() - out
        );
    }
    eprintln!("by kind:");
    for ((k, o), c) in &by_kind {
        eprintln!("  {c:>4}  {:<18} {o}", k.name());
    }
    let mut kv: BTreeMap<String, u32> = BTreeMap::new();
    for (action, outcome) in s.records.iter().flat_map(|r| &r.kv) {
        *kv.entry(format!("{action} {outcome}")).or_default() += 1;
    }
    eprintln!("sessions' KV files (kv events of the turns):");
    for (what, c) in &kv {
        eprintln!("  {c:>4}  {what}");
    }
    eprintln!("refused and tried again:");
    for (code, c) in s.refused {
        eprintln!("  {c:>4}  {code}");
    }
    eprintln!("faults injected:");
    for (f, c) in &s.injected.counts {
        eprintln!("  {c:>4}  {f}");
    }
    eprintln!("  ({hung} requests ran the hanging read_file)");
    for (why, c) in &s.injected.skipped {
        eprintln!("  skipped {c:>3}: {why}");
    }
    let mut total = 0.0;
    eprintln!("worker restarts during the run, by cause (llama_worker_restarts_total):");
    for (cause, d) in restarts_between(s.worker_before, s.worker_after) {
        total += d;
        eprintln!("  {d:>4}  {cause}");
    }
    let injected = s.injected.restarts.len() as f64;
    eprintln!(
        "  {total} in all, {injected} after an injected server fault (below), {} not",
        total - injected
    );
    for r in &s.injected.restarts {
        eprintln!("  {r}");
    }
    if !s.injected.daemon_restarts.is_empty() {
        eprintln!("loopd serve killed and started again on the same store:");
        for r in &s.injected.daemon_restarts {
            eprintln!("  {r}");
        }
    }
    eprintln!("worker at the end of the requests: {}", s.worker_status);
}

#[test]
#[ignore = "minutes long and kills processes on purpose: `make chaos` runs it (--ignored)"]
fn chaos_every_request_ends_named_and_the_stack_heals() {
    let n = env_u64("CHAOS_N", 50) as usize;
    let seed = match std::env::var("CHAOS_SEED") {
        Ok(_) => env_u64("CHAOS_SEED", 0),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    };
    let timers = Timers::new(env_u64("CHAOS_FACTOR", 5));
    say!(
        "CHAOS_SEED={seed} CHAOS_N={n} CHAOS_FACTOR={} (replay with these)",
        timers.factor
    );
    let wall = Instant::now();
    let mut rng = Rng::new(seed);
    let injector_rng = Rng::new(rng.next());

    // HOSTS=2: two one-core hosts, as `scripts/fleet-stack.sh` runs them (one thread each,
    // pinned to a CPU of its own): two servers of two threads each on this box's 2 cores
    // starved each other past the scaled stall timeout (3 restarts of a healthy host a in one
    // run of seed 424242).
    let hosts = env_u64("CHAOS_HOSTS", 1).clamp(1, 2) as usize;
    // Each server saves sessions' KV files into a directory of its own (docs/sessions.md).
    let kv_dirs = [
        llama_harness::temp_dir("chaos-kv-a"),
        llama_harness::temp_dir("chaos-kv-b"),
    ];
    let save_path = |h: usize| format!("slot-save-path = {}\n", kv_dirs[h].display());
    let one_core = |cpu: usize| {
        let s = LocalServer::start_with_configs(
            &timers.worker_config(),
            &format!("threads = 1\nthreads-batch = 1\n{}", save_path(cpu)),
        );
        llama_harness::pin_to_cpu(s.pgid(), cpu);
        s
    };
    let server = if hosts == 2 {
        one_core(0)
    } else {
        LocalServer::start_with_configs(&timers.worker_config(), &save_path(0))
    };
    let proxy = Mutex::new(Proxy::start(server.addr()));
    let proxy_socket = proxy.lock().unwrap().socket().to_owned();
    let dir = llama_harness::temp_dir("chaos");
    let folder = dir.join("shared");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("notes.txt"),
        "The meeting is on Tuesday at noon.\n",
    )
    .unwrap();
    let fifo = folder.join(HANG_FILE);
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    // CHAOS_HOSTS=2: host b beside a, reached through forwarders standing in for the tunnel.
    let b_server = (hosts == 2).then(|| one_core(1));
    let b_proxy = b_server.as_ref().map(|b| Proxy::start(b.addr()));
    let b_links = match (&b_server, &b_proxy) {
        (Some(b), Some(p)) => {
            let here = dir.join("b");
            std::fs::create_dir_all(&here).unwrap();
            Some(Mutex::new((
                Forwarder::start(&here.join("infer.sock"), p.socket()),
                Forwarder::start(&here.join("status.sock"), b.status_socket()),
            )))
        }
        _ => None,
    };
    let host_tables = match &b_links {
        Some(links) => {
            let l = links.lock().unwrap();
            format!(
                "[[host]]\nname = \"a\"\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [0, 1]\n\
                 kv_dir = {:?}\n\
                 [[host]]\nname = \"b\"\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [0, 1]\n\
                 kv_dir = {:?}\n",
                proxy_socket.display().to_string(),
                server.status_socket().display().to_string(),
                kv_dirs[0].display().to_string(),
                l.0.socket().display().to_string(),
                l.1.socket().display().to_string(),
                kv_dirs[1].display().to_string(),
            )
        }
        None => String::new(),
    };
    let kv_table = match hosts {
        2 => "[runner.kv]\nmin_tokens = 0\n".to_owned(),
        _ => format!(
            "[runner.kv]\nmin_tokens = 0\ndir = {:?}\n",
            kv_dirs[0].display().to_string()
        ),
    };
    write_loopd_config(
        &timers,
        &server,
        &proxy_socket,
        &socket,
        &config,
        &format!("{kv_table}{host_tables}"),
    );
    let (serve, serve_log) = start_serve(&config, &folder, &dir);
    let serve = Mutex::new(serve);
    for k in 0..SESSIONS {
        let open = json!({"cmd": "open", "session": format!("chaos-{k}"), "tools": [],
                          "max_tokens": 48});
        let r = daemon_call(&socket, &open, Duration::from_secs(10)).expect("open a session");
        assert_eq!(r["ok"], true, "{r}");
    }
    let deadline = timers.request_deadline();
    say!(
        "stack up after {:.1} s; request deadline {deadline:?}; loopd log {}",
        wall.elapsed().as_secs_f64(),
        serve_log.display()
    );
    // CHAOS_LOAD=n: n CPU-bound processes beside the stack for the whole run (a busy box,
    // as other builds make it), stopped when the test ends, failing or not.
    let load = llama_harness::CpuLoad::start(env_u64("CHAOS_LOAD", 0) as usize);
    if !load.is_empty() {
        say!(
            "{} CPU-bound processes started (process groups {:?})",
            load.len(),
            load.pgids()
        );
    }
    let faults = env_u64("CHAOS_FAULTS", 1) != 0;
    let load_at_start = llama_harness::load_average();
    let chaos_started = Instant::now();
    let worker_before = worker_metrics(server.status_socket()).expect("worker metrics");

    let shared = Shared::default();
    shared.remaining.store(n, Ordering::SeqCst);
    let concurrency = env_u64("CHAOS_CONCURRENCY", 3) as usize;
    let mut records: Vec<Record> = Vec::new();
    let mut refused: BTreeMap<String, u32> = BTreeMap::new();
    // Each refusal with a worker's code, and when.
    let mut worker_refusals: Vec<(String, Instant)> = Vec::new();
    let mut broken: Vec<String> = Vec::new();
    let injected = std::thread::scope(|scope| {
        let injector = Injector {
            server: &server,
            host_b: b_server.as_ref().zip(b_links.as_ref()),
            serve: &serve,
            serve_paths: (&config, &folder, &dir),
            proxy: &proxy,
            daemon: &socket,
            shared: &shared,
            rng: injector_rng,
            out: Injected::default(),
            probe_interval: Duration::from_millis(5_000 / timers.factor),
        };
        let injector = scope.spawn(move || injector.run());
        // HOSTS=2: each host is also down while its worker says anything but `ready` (a
        // restart of its own, not only the injected ones), asked on its own socket every
        // 200 ms: a refusal is fair while both are down.
        if let Some(b) = &b_server {
            let (a, shared) = (&server, &shared);
            scope.spawn(move || {
                let mut open: [Option<usize>; 2] = [None, None];
                while !shared.done.load(Ordering::SeqCst) {
                    for (i, host) in [a, b].into_iter().enumerate() {
                        let ready = host.worker_status().is_ok_and(|s| s["state"] == "ready");
                        match (ready, open[i]) {
                            (false, None) => open[i] = Some(shared.host_down(i)),
                            (true, Some(fault)) => {
                                shared.host_up(fault);
                                open[i] = None;
                            }
                            _ => {}
                        }
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
        // CHAOS_TRACE=file: the worker's status every 250 ms, stamped, to see what it judged.
        if let Ok(path) = std::env::var("CHAOS_TRACE") {
            let (server, shared) = (&server, &shared);
            scope.spawn(move || {
                let mut out = std::fs::File::create(&path).expect("CHAOS_TRACE file");
                while !shared.done.load(Ordering::SeqCst) {
                    let s = server
                        .worker_status()
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    let t = T0.get_or_init(Instant::now).elapsed().as_secs_f64();
                    let _ = writeln!(out, "{t:.2} {s}");
                    std::thread::sleep(Duration::from_millis(250));
                }
            });
        }
        let (tx, rx) = mpsc::channel::<(Kind, Value, Result<Attempt, String>)>();
        let mut in_flight = 0;
        let mut queue: Vec<(Kind, Value)> = Vec::new();
        let mut ended = 0;
        // After a request that broke (no result, or a refusal not to be tried again: the
        // worker `failed`), nothing more is submitted; the ones running still end.
        while ended < n && (broken.is_empty() || in_flight != 0) {
            while broken.is_empty() && in_flight < concurrency && (ended + in_flight) < n {
                let (kind, cmd) = queue.pop().unwrap_or_else(|| {
                    let kind = if shared.hang_next.swap(false, Ordering::SeqCst) {
                        // Counted until it ends, refusals and tries again included.
                        shared.hanging.fetch_add(1, Ordering::SeqCst);
                        Kind::Hang
                    } else {
                        [
                            Kind::Plain,
                            Kind::Arithmetic,
                            Kind::Time,
                            Kind::ReadFile,
                            Kind::Turn,
                        ][rng.below(5) as usize]
                    };
                    shared.remaining.fetch_sub(1, Ordering::SeqCst);
                    (kind, submit_command(kind, &mut rng))
                });
                let tx = tx.clone();
                let (socket, shared) = (&socket, &shared);
                in_flight += 1;
                scope.spawn(move || {
                    let a = run_one(socket, kind, &cmd, deadline, shared);
                    let _ = tx.send((kind, cmd, a));
                });
            }
            let (kind, cmd, a) = rx
                .recv_timeout(deadline + Duration::from_secs(60))
                .expect("a request thread answers within its deadline");
            in_flight -= 1;
            if kind == Kind::Hang && !matches!(a, Ok(Attempt::Refused(_))) {
                shared.hanging.fetch_sub(1, Ordering::SeqCst);
            }
            match a {
                Ok(Attempt::Done(r)) => {
                    let cut = |t: &str| t.chars().take(60).collect::<String>();
                    say!(
                        "request {} ({}) {} {} after {:.1} s; tools {:?}; content {:?}; {}",
                        r.id,
                        kind.name(),
                        r.outcome,
                        r.reason.as_deref().unwrap_or(""),
                        r.took.as_secs_f64(),
                        r.tools,
                        cut(r.content.as_deref().unwrap_or("")),
                        cut(&r.detail)
                    );
                    records.push(*r);
                    ended += 1;
                }
                Ok(Attempt::Refused(code)) => {
                    if code == DAEMON_RESTARTING && injector.is_finished() {
                        // No daemon, and nobody left to start one (the injector ended: it
                        // panicked starting the next daemon, which its join says).
                        broken.push(format!("{} request: no daemon to submit to", kind.name()));
                        ended += 1;
                        continue;
                    }
                    if code.starts_with("WORKER_") {
                        worker_refusals.push((code.clone(), Instant::now()));
                    }
                    *refused.entry(code).or_default() += 1;
                    queue.push((kind, cmd));
                    // Tried again later: the slot frees when a request ends, the worker is
                    // ready again after its restart.
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    say!("BROKEN: {e}");
                    broken.push(e);
                    ended += 1;
                }
            }
        }
        shared.done.store(true, Ordering::SeqCst);
        injector.join().expect("the fault injector panicked")
    });
    let chaos_time = chaos_started.elapsed();
    let load_at_end = llama_harness::load_average();
    let worker_after = worker_metrics(server.status_socket()).unwrap_or_else(|e| e);
    print_summary(&Summary {
        seed,
        n,
        timers: &timers,
        wall: wall.elapsed(),
        chaos_time,
        deadline,
        records: &records,
        refused: &refused,
        injected: &injected,
        worker_before: &worker_before,
        worker_after: &worker_after,
        worker_status: &server
            .worker_status()
            .map_or_else(|e| format!("no status: {e}"), |s| s.to_string()),
        load: load.len(),
        load_average: (&load_at_start, &load_at_end),
        faults,
    });
    assert!(
        broken.is_empty(),
        "requests that did not end with a result within their deadline: {broken:#?}"
    );
    // With two hosts, a worker's refusal only while neither host was up (10 s of grace after
    // each fault's end: a new watch's `ready`, the daemon's view of it).
    if hosts == 2 {
        let while_up: Vec<String> = worker_refusals
            .iter()
            .filter(|(_, at)| !shared.all_down_at(2, *at, Duration::from_secs(10)))
            .map(|(code, at)| format!("{code} at {:.1} s", (*at - chaos_started).as_secs_f64()))
            .collect();
        say!(
            "HOSTS=2: {} refusals with a worker's code, {} of them while a host was up; faults \
             that took a host down: {:?}",
            worker_refusals.len(),
            while_up.len(),
            shared
                .down
                .lock()
                .unwrap()
                .iter()
                .map(|(h, from, to)| format!(
                    "{} {:.1}-{}",
                    ["a", "b"][*h],
                    (*from - chaos_started).as_secs_f64(),
                    to.map_or("open".into(), |t| format!(
                        "{:.1}",
                        (t - chaos_started).as_secs_f64()
                    ))
                ))
                .collect::<Vec<_>>()
        );
        assert!(
            while_up.is_empty(),
            "submits refused with a worker's code while a host was up: {while_up:?}"
        );
    }
    // A retryable failure is a request's result only once its retries ran out.
    let early: Vec<String> = records
        .iter()
        .filter(|r| {
            r.reason
                .as_deref()
                .is_some_and(|reason| RETRYABLE.contains(&reason))
                && !timers.retries_ran_out(r)
        })
        .map(|r| {
            format!(
                "request {}: {:?} {} (retries {:?})",
                r.id, r.reason, r.detail, r.retries
            )
        })
        .collect();
    assert!(
        early.is_empty(),
        "requests that failed with a retryable error before their retries ran out: {early:#?}"
    );
    // Without faults nothing may fail and nothing may be restarted, busy box or not.
    if !faults {
        let failed: Vec<String> = records
            .iter()
            .filter(|r| r.outcome != "completed")
            .map(|r| {
                format!(
                    "request {}: {} {:?} {}",
                    r.id, r.outcome, r.reason, r.detail
                )
            })
            .collect();
        assert_eq!(
            (records.len(), failed),
            (n, Vec::<String>::new()),
            "CHAOS_FAULTS=0: every request completes"
        );
        assert_eq!(
            restarts_between(&worker_before, &worker_after),
            [],
            "CHAOS_FAULTS=0: the worker restarts nothing"
        );
    }

    // Every request ended with a named outcome, and kept what it had streamed.
    for r in &records {
        match (r.outcome.as_str(), r.reason.as_deref()) {
            ("completed", None) => {}
            ("failed", Some("daemon_restarted")) => {
                // Its output as last checkpointed: at most a second behind what streamed.
                let kept = r.content.as_deref().unwrap_or("");
                assert!(
                    r.across_restart && r.streamed.starts_with(kept) && !r.detail.is_empty(),
                    "request {} ended daemon_restarted ({}) keeping {kept:?}, having streamed \
                     {:?} (fetched from the next daemon: {})",
                    r.id,
                    r.detail,
                    r.streamed,
                    r.across_restart
                );
            }
            ("failed", Some(reason)) if NAMED.contains(&reason) => {
                assert!(
                    !r.detail.is_empty(),
                    "request {} failed without a detail",
                    r.id
                );
                assert_eq!(
                    r.content.as_deref().unwrap_or(""),
                    r.streamed,
                    "request {} ({reason}: {}) keeps the content it streamed in its last \
                     generation",
                    r.id,
                    r.detail
                );
            }
            other => panic!("request {} ended without a named outcome: {other:?}", r.id),
        }
        assert!(r.took <= deadline, "request {} took {:?}", r.id, r.took);
    }
    // Every acknowledged id has its record, and ids acknowledged after a daemon restart are
    // greater than every one before it (the store's sequence, not the process's).
    let acks = shared.acks.lock().unwrap().clone();
    let unaccounted: Vec<u64> = acks
        .iter()
        .map(|&(_, id)| id)
        .filter(|id| !records.iter().any(|r| r.id == *id))
        .collect();
    assert!(
        unaccounted.is_empty(),
        "acknowledged ids with no result fetched: {unaccounted:?}"
    );
    for &(kills, id) in &acks {
        for &(later, other) in &acks {
            assert!(
                later <= kills || other > id,
                "id {other} acknowledged after {later} daemon kills is not greater than id \
                 {id} acknowledged after {kills}"
            );
        }
    }
    let daemon_kills = shared.daemon_kills.load(Ordering::SeqCst);
    // A request cancelled while it ran ends `cancelled` (a cancel is the client's word), or
    // `daemon_restarted` when its daemon was killed before the cancel was carried out.
    let cancelled = shared.cancelled.lock().unwrap().clone();
    for id in &cancelled {
        let r = records
            .iter()
            .find(|r| r.id == *id)
            .unwrap_or_else(|| panic!("cancelled request {id} has no record"));
        if r.across_restart && r.reason.as_deref() == Some("daemon_restarted") {
            continue;
        }
        assert_eq!(
            r.reason.as_deref(),
            Some("cancelled"),
            "request {id}, cancelled while running, ended {} {}",
            r.outcome,
            r.detail
        );
    }
    // A hanging tool is given up at its deadline: the request fails, a poll or two after.
    let tool_timeout = Duration::from_millis(timers.loopd.runner.tool_timeout_ms);
    for r in records.iter().filter(|r| r.hang_started.is_some()) {
        let after = r.ended - r.hang_started.unwrap_or(r.ended);
        assert!(
            r.reason.is_some() && after < tool_timeout + 2 * timers.poll() + Duration::from_secs(2),
            "request {} read the FIFO and ended {} {:?} {} after {after:?} (tool timeout \
             {tool_timeout:?})",
            r.id,
            r.outcome,
            r.reason,
            r.detail
        );
    }

    // The end state: every slot free, the server idle, nothing registered, the worker ready.
    let status = wait_for(
        "no runner slot busy and nothing running (daemon status)",
        Duration::from_secs(30),
        || {
            let s = daemon_call(&socket, &json!({"cmd": "status"}), Duration::from_secs(10))?;
            let st = &s["status"];
            if st["busy"] == 0 && st["running"].as_array().is_some_and(Vec::is_empty) {
                Ok(st.clone())
            } else {
                Err(s.to_string())
            }
        },
    );
    // Through a proxy of its own: the shared one's accept bucket is the daemon's.
    let poll_proxy = Proxy::start(server.addr());
    let poller = Client::new(ClientConfig::new(poll_proxy.socket(), server.model()));
    wait_for(
        "no server slot processing (GET /slots)",
        Duration::from_secs(30),
        || match poller.slots() {
            Ok(s) if s.iter().all(|s| !s.is_processing) => Ok(()),
            Ok(s) => Err(format!("{s:?}")),
            Err(e) => Err(e.to_string()),
        },
    );
    drop(poll_proxy);
    let worker_end = server.wait_worker(
        "llama-worker ready with no generation registered",
        Duration::from_secs(60),
        |s| s["state"] == "ready" && s["inflight"] == 0,
    );
    if let Some(b) = &b_server {
        b.wait_worker(
            "host b's llama-worker ready with no generation registered",
            Duration::from_secs(60),
            |s| s["state"] == "ready" && s["inflight"] == 0,
        );
    }
    // And it serves: one more request completes (a stopped instance left behind would not).
    let last = wait_for(
        "a last request admitted and ended",
        deadline,
        || match run_one(
            &socket,
            Kind::Plain,
            &submit_command(Kind::Plain, &mut Rng::new(seed)),
            deadline,
            &shared,
        ) {
            Ok(Attempt::Done(r)) => Ok(r),
            Ok(Attempt::Refused(code)) => Err(code),
            Err(e) => panic!("the last request: {e}"),
        },
    );
    assert_eq!(
        last.outcome, "completed",
        "the last request after the chaos: {last:?}"
    );

    // The daemon counted what we saw (the last request included); its counters are its
    // process's, so only when it was never killed.
    if daemon_kills == 0 {
        let m = daemon_call(&socket, &json!({"cmd": "metrics"}), Duration::from_secs(10))
            .expect("daemon metrics");
        let daemon_metrics = m["metrics"].as_str().unwrap_or("").to_owned();
        let counted = series(&daemon_metrics, "loopd_requests_total", "outcome");
        let sum = |o: &str| -> f64 { counted.iter().filter(|(k, _)| k == o).map(|(_, v)| v).sum() };
        let completed = records.iter().filter(|r| r.outcome == "completed").count();
        assert_eq!(
            (sum("completed"), sum("failed")),
            ((completed + 1) as f64, (records.len() - completed) as f64),
            "loopd_requests_total against the outcomes seen here:\n{daemon_metrics}"
        );
    }

    // Every session's log holds exactly its turns that completed (through daemon kills: a
    // turn running at a kill comes back daemon_restarted and is not in it), and it goes on: a
    // last turn completes.
    let mut lasts = Vec::new();
    for k in 0..SESSIONS {
        let name = format!("chaos-{k}");
        let mut completed: Vec<u64> = records
            .iter()
            .filter(|r| r.session.as_deref() == Some(name.as_str()) && r.outcome == "completed")
            .map(|r| r.id)
            .collect();
        completed.sort_unstable();
        let h = daemon_call(
            &socket,
            &json!({"cmd": "history", "session": name}),
            Duration::from_secs(10),
        )
        .expect("history");
        let mut logged: Vec<u64> = h["records"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["kind"] == "turn")
            .filter_map(|r| r["request"].as_u64())
            .collect();
        logged.sort_unstable();
        assert_eq!(
            logged, completed,
            "session {name}: the turns in its log against the turns seen completed: {h}"
        );
        let last = wait_for(
            &format!("a last turn of {name}"),
            deadline,
            || match run_one(
                &socket,
                Kind::Turn,
                &json!({"cmd": "turn", "session": name, "content": "Thank you.", "follow": true}),
                deadline,
                &shared,
            ) {
                Ok(Attempt::Done(r)) => Ok(r),
                Ok(Attempt::Refused(code)) => Err(code),
                Err(e) => panic!("the last turn of {name}: {e}"),
            },
        );
        assert_eq!(last.outcome, "completed", "{name}: {last:?}");
        say!(
            "session {name}: {} turns logged, all {} seen completed; a last turn completed",
            logged.len(),
            completed.len()
        );
        lasts.push((name, last.turn_tokens));
    }

    // The server killed between turns, with no request running: llama-worker starts a new
    // one (its slots empty), and every session resumes from its KV file: its next turn
    // reuses the whole of its last turn's conversation instead of evaluating it again.
    let before_kill = server.worker_status().expect("host a's worker status");
    let (router, spawns) = (
        before_kill["pid"].as_u64().expect("the router's pid") as u32,
        before_kill["spawns"].as_u64().expect("spawns"),
    );
    assert!(kill("-KILL", router), "kill -KILL {router}");
    say!("SIGKILL host a's server (router {router}) between turns");
    server.wait_worker("a new server after the kill between turns", deadline, |s| {
        s["state"] == "ready" && s["spawns"].as_u64().is_some_and(|n| n > spawns)
    });
    wait_for("every host ready in the daemon's status", deadline, || {
        let s = daemon_call(&socket, &json!({"cmd": "status"}), Duration::from_secs(10))?;
        let hosts = s["status"]["hosts"].as_array().cloned().unwrap_or_default();
        match hosts.iter().all(|h| h["state"] == "ready") {
            true => Ok(()),
            false => Err(format!("{hosts:?}")),
        }
    });
    for (name, before) in &lasts {
        let (_, total) = before.expect("the last turn's session record");
        let cmd = json!({"cmd": "turn", "session": name, "content": "Go on.", "follow": true});
        let r = wait_for(&format!("{name}'s turn after the kill"), deadline, || {
            match run_one(&socket, Kind::Turn, &cmd, deadline, &shared) {
                Ok(Attempt::Done(r)) if r.outcome == "completed" => Ok(r),
                // The daemon heard of the restart after it admitted the turn.
                Ok(Attempt::Done(r))
                    if matches!(
                        r.reason.as_deref(),
                        Some("worker_restarted" | "server_died")
                    ) =>
                {
                    Err(format!("{r:?}"))
                }
                Ok(Attempt::Done(r)) => panic!("{name}'s turn after the kill: {r:?}"),
                Ok(Attempt::Refused(code)) => Err(code),
                Err(e) => panic!("{name}'s turn after the kill: {e}"),
            }
        });
        let restore =
            r.kv.iter()
                .find(|(a, _)| a == "restore")
                .map(|(_, o)| o.clone());
        let (cache_n, _) = r.turn_tokens.expect("the turn's session record");
        assert!(
            matches!(restore.as_deref(), Some("restored" | "resident")) && cache_n + 1 >= total,
            "{name} did not resume from its file: restore {restore:?}, cache_n {cache_n} of \
             its last turn's {total} tokens: {r:?}"
        );
        say!(
            "session {name}: after the server's kill, restore {}, cache_n {cache_n} of its \
             last turn's {total} tokens",
            restore.unwrap_or_default()
        );
    }
    let released = release_hung_readers(&fifo);
    // With CHAOS_TRACE, the logs go next to the trace: the temp dirs go when the run passes.
    if let Ok(trace) = std::env::var("CHAOS_TRACE") {
        let proxy_log = proxy_socket.with_file_name("proxy.log");
        for (from, to) in [
            (server.log().to_owned(), "server.log"),
            (serve_log.clone(), "loopd-serve.log"),
            (proxy_log, "proxy.log"),
        ] {
            let _ = std::fs::copy(&from, format!("{trace}.{to}"));
        }
    }
    say!(
        "end: daemon {status}; worker state {} spawns {} inflight {}; the last request \
         completed; {released} opens of the FIFO released hung read_file threads",
        worker_end["state"],
        worker_end["spawns"],
        worker_end["inflight"]
    );

    let mut serve = serve.into_inner().unwrap();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(serve.0.id().to_string())
        .status();
    let exit = wait_for(
        "loopd serve to exit after SIGTERM",
        Duration::from_secs(30),
        || {
            serve
                .0
                .try_wait()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "still running".to_owned())
        },
    );
    assert_eq!(
        exit.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&serve_log).unwrap_or_default()
    );
    drop(load);
    let _ = std::fs::remove_dir_all(&dir);
}
