//! 1,000 requests through the runner against the fake server, mixing every way a request ends:
//! completion, tool iterations, tool errors, parse errors, loop detection, cancel, and
//! restart-induced failure (a stall the fake worker answers with a restart). At the end no
//! slot, no record and no thread is left. Alone in its file so that the thread count is this
//! test's own.

mod sections;
// The client's own test support: the fake server and a held slot, written once.
#[path = "../../loopd-client/tests/support/mod.rs"]
mod support;
use llama_harness::fake_worker as worker_fake;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopd_agent::runner::{
    Outcome, ResultError, Runner, StandardBios, Submission, SubmitError, Tool, ToolError,
    ToolRegistry,
};
use loopd_client::llama::{Cancel, ChatMessage, Client};
use sections::Config;
use serde_json::{json, Value};
use support::{
    done, json_answer as answer, json_chunk as chunk, json_content as content, End, FakeServer,
    Reply,
};
use worker_fake::{FakeWorker, Script};

const REQUESTS: usize = 1_000;

fn call(name: &str) -> Reply {
    let d = json!({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                   "function": {"name": name, "arguments": "{}"}}]});
    Reply::sse(vec![
        chunk(d, None, 0),
        chunk(json!({}), Some("tool_calls"), 0),
        done(),
    ])
}

struct Ok_;
struct Bad;

impl Tool for Ok_ {
    fn name(&self) -> &str {
        "ok"
    }
    fn description(&self) -> &str {
        "succeeds"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        Ok("fine".into())
    }
}

impl Tool for Bad {
    fn name(&self) -> &str {
        "bad"
    }
    fn description(&self) -> &str {
        "fails"
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        Err(ToolError::Failed("no".into()))
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_thousand_mixed_requests_leak_no_slot_no_record_and_no_thread() {
    let line = "I will now check the weather for you..";
    let kinds = [
        answer("ok"),
        call("ok"),
        call("bad"),
        answer("<tool_call>{\"name\": \"ok\", \"arguments\": {]}</tool_call>"),
        Reply::sse((0..12).map(|_| content(&format!("{line}\n"))).collect()).ending(End::Silence),
        Reply::sse(vec![content("silent after this")]).ending(End::Silence),
    ];
    // Replies are handed out in arrival order; a cycle of the six kinds, enough for every
    // generation (a tool iteration takes two).
    let replies: Vec<Reply> = (0..REQUESTS * 3)
        .map(|i| kinds[i % kinds.len()].clone())
        .collect();
    let server = FakeServer::start(vec![("/v1/chat/completions", replies)]);
    let worker = FakeWorker::start(Script {
        stall: "restarting",
        ..Script::default()
    });
    let mut c = Config::new(server.socket(), "smollm2");
    c.limits.poll_ms = 10;
    c.limits.liveness_ms = 5_000;
    c.runner.stall_ms = 60;
    c.runner.worker_poll_ms = 10;
    c.runner.worker_socket = Some(worker.socket().to_owned());
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Ok_)).unwrap();
    tools.register(Arc::new(Bad)).unwrap();
    let runner = Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner.clone(),
        tools,
        Arc::new(StandardBios),
        2,
    );
    // The runner's watch (and the fake's side of it) belong to the baseline.
    let open_until = Instant::now() + Duration::from_secs(10);
    while worker.watching() != 1 {
        assert!(
            Instant::now() < open_until,
            "the runner opened no watch in 10 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let baseline = threads();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(180);
    let (mut submitted, mut outstanding) = (0usize, HashSet::new());
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    while submitted < REQUESTS || !outstanding.is_empty() {
        assert!(
            Instant::now() < deadline,
            "soak took over 180 s: {counts:?}"
        );
        let mut busy = false;
        if submitted < REQUESTS {
            let req = Submission {
                messages: vec![ChatMessage::User {
                    content: format!("request {submitted}"),
                }],
                ..Submission::default()
            };
            match runner.submit(req) {
                Ok(id) => {
                    submitted += 1;
                    outstanding.insert(id);
                    busy = true;
                    if submitted % 10 == 0 {
                        runner.cancel(id).unwrap();
                    }
                }
                Err(SubmitError::NoSlotAvailable) => {}
                Err(SubmitError::WorkerNotReady) => {
                    // The fake restart is over: the worker is ready under its new spawn.
                    worker.set(|w| w.state = "ready");
                    *counts.entry("WORKER_NOT_READY".into()).or_default() += 1;
                }
                Err(e) => panic!("unexpected refusal {e}"),
            }
        }
        let ids: Vec<_> = outstanding.iter().copied().collect();
        for id in ids {
            match runner.get_result(id) {
                Ok(r) => {
                    outstanding.remove(&id);
                    busy = true;
                    let name = match &r.outcome {
                        Outcome::Completed { .. } => "completed".to_owned(),
                        Outcome::Failed { reason, .. } => reason.to_string(),
                    };
                    *counts.entry(name).or_default() += 1;
                    assert_eq!(runner.get_result(id), Err(ResultError::NotFound));
                }
                Err(ResultError::Pending) => {}
                Err(ResultError::NotFound) => panic!("{id} lost its result"),
            }
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let took = start.elapsed();
    eprintln!("soak: {REQUESTS} requests in {took:?}: {counts:?}");
    let ended: usize = counts
        .iter()
        .filter(|(k, _)| *k != "WORKER_NOT_READY")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(ended, REQUESTS);
    for reason in [
        "completed",
        "tool_execution_error",
        "tool_parse_error",
        "loop_detected",
        "cancelled",
        "worker_restarted",
    ] {
        assert!(
            counts.get(reason).is_some_and(|&n| n > 0),
            "no {reason}: {counts:?}"
        );
    }
    let allowed: HashSet<&str> = [
        "completed",
        "tool_execution_error",
        "tool_parse_error",
        "loop_detected",
        "cancelled",
        "worker_restarted",
        "WORKER_NOT_READY",
    ]
    .into();
    assert!(
        counts.keys().all(|k| allowed.contains(k.as_str())),
        "{counts:?}"
    );
    assert_eq!(runner.busy_slots(), 0, "a slot leaked");
    assert_eq!(runner.records(), 0, "a record leaked");
    // Threads end a moment after their last act: wait for the count with a deadline.
    let wait_until = Instant::now() + Duration::from_secs(10);
    let mut now = threads();
    while now > baseline && Instant::now() < wait_until {
        std::thread::sleep(Duration::from_millis(20));
        now = threads();
    }
    assert!(
        now <= baseline,
        "threads: {now} now, {baseline} before the soak"
    );
}
