//! Smoke tests of the request runner through real sockets (a fake server and a fake
//! llama-worker status socket) on the wall clock: the slot table, admission, results handed
//! out once, cancel, and each way a request ends, end to end through the drive thread. Every
//! timing and every decision to the millisecond is tested on fake time in `tests/agent.rs`
//! and `tests/agent_scenarios.rs`; nothing here bounds how long a request took, except `wait`'s
//! 10 s for a request that would otherwise never end.

mod sections;
// The client's own test support: the fake server and a held slot, written once.
#[path = "../../loopd-client/tests/support/mod.rs"]
mod support;
use llama_harness::fake_worker as worker_fake;

mod scripted;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llama_harness::fixture;
use loopd_agent::runner::{
    BiosContext, BiosProvider, CallSource, FailReason, Outcome, RequestEvent, RequestId,
    RequestResult, ResultError, RetryRecord, Runner, StallAnswer, Submission, SubmitError,
    Summarize, Tool, ToolError, ToolRegistry,
};
use loopd_client::config::Retry;
use loopd_client::llama::{
    AssistantMessage, Cancel, ChatEvent, ChatMessage, Client, FinishReason, InferError,
};
use scripted::tool_call_deltas;
use sections::Config;
use serde_json::{json, Value};
use support::{
    done, events_of, json_answer as answer, json_chunk as chunk, json_content as content,
    slots_json, End, FakeServer, Reply,
};
use worker_fake::{FakeWorker, Script};

const CHAT: &str = "/v1/chat/completions";
const SLOTS: &str = "/slots";

fn config(server: &FakeServer, worker: Option<&FakeWorker>) -> Config {
    let mut c = Config::new(server.socket(), "smollm2");
    c.limits.poll_ms = 20;
    c.limits.busy_wait_ms = 5_000;
    c.limits.load_wait_ms = 2_000;
    c.limits.idle_grace_ms = 2_000;
    c.limits.liveness_ms = 5_000;
    c.runner.budget = 3;
    c.runner.tool_timeout_ms = 200;
    c.runner.stall_ms = 150;
    c.runner.worker_poll_ms = 20;
    c.runner.worker_timeout_ms = 1_000;
    c.runner.worker_socket = worker.map(|w| w.socket().to_owned());
    // One retry, 40 ms after a retryable failure.
    c.retry = Retry {
        attempts: 2,
        delays_ms: vec![40],
        jitter_percent: 0,
        total_ms: 5_000,
    };
    c
}

/// One assistant message calling `(id, name, arguments)` in order.
fn calls(list: &[(&str, &str, &str)]) -> Reply {
    let deltas = tool_call_deltas(list);
    Reply::sse(vec![
        chunk(json!({ "tool_calls": deltas }), None, 0),
        chunk(json!({}), Some("tool_calls"), 0),
        done(),
    ])
}

/// The tools of these tests: `echo` logs its calls, `fail` fails, `sleep` outlives the tool
/// timeout, `signal` is an exit tool.
struct Echo(Arc<Mutex<Vec<String>>>);
struct Fail;
struct Sleep;
struct Signal;

fn object() -> Value {
    json!({"type": "object", "properties": {}})
}

impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "echoes"
    }
    fn parameters(&self) -> Value {
        object()
    }
    fn run(&self, args: &Value, _: &Cancel) -> Result<String, ToolError> {
        self.0.lock().unwrap().push(args.to_string());
        Ok(format!("echo {args}"))
    }
}

impl Tool for Fail {
    fn name(&self) -> &str {
        "fail"
    }
    fn description(&self) -> &str {
        "fails"
    }
    fn parameters(&self) -> Value {
        object()
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        Err(ToolError::Failed("disk on fire".into()))
    }
}

impl Tool for Sleep {
    fn name(&self) -> &str {
        "sleep"
    }
    fn description(&self) -> &str {
        "sleeps"
    }
    fn parameters(&self) -> Value {
        object()
    }
    fn run(&self, _: &Value, cancel: &Cancel) -> Result<String, ToolError> {
        cancel.sleep(
            &loopd_client::clock::SystemClock::new(),
            Duration::from_secs(5),
        );
        Ok("woke".into())
    }
}

impl Tool for Signal {
    fn name(&self) -> &str {
        "signal"
    }
    fn description(&self) -> &str {
        "an exit tool"
    }
    fn parameters(&self) -> Value {
        object()
    }
    fn is_exit(&self) -> bool {
        true
    }
    fn run(&self, _: &Value, _: &Cancel) -> Result<String, ToolError> {
        panic!("an exit tool is never run")
    }
}

/// A fixed BIOS with a budget note, as `StandardBios` but short.
struct NotedBios;

impl BiosProvider for NotedBios {
    fn bios(&self, ctx: &BiosContext<'_>) -> String {
        format!("BIOS: {} tool iterations", ctx.budget)
    }

    fn budget_note(&self, ctx: &BiosContext<'_>) -> Option<String> {
        Some(format!("{} left", ctx.budget_left))
    }
}

struct Setup {
    runner: Runner,
    log: Arc<Mutex<Vec<String>>>,
}

fn setup(config: Config, slots: u32) -> Setup {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Echo(log.clone()))).unwrap();
    tools.register(Arc::new(Fail)).unwrap();
    tools.register(Arc::new(Sleep)).unwrap();
    tools.register(Arc::new(Signal)).unwrap();
    let runner = Runner::new(
        Arc::new(Client::new(config.client())),
        config.runner.clone(),
        tools,
        Arc::new(NotedBios),
        slots,
    );
    Setup { runner, log }
}

fn ask(text: &str) -> Submission {
    Submission {
        messages: vec![ChatMessage::User {
            content: text.into(),
        }],
        ..Submission::default()
    }
}

fn wait(runner: &Runner, id: RequestId) -> RequestResult {
    runner
        .wait_result(id, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("no result for {id} within 10 s: {e}"))
}

fn run(s: &Setup, req: Submission) -> RequestResult {
    let id = s.runner.submit(req).expect("a free slot");
    wait(&s.runner, id)
}

/// The `messages` of the `n`th chat request the server received.
fn sent(server: &FakeServer, n: usize) -> Vec<Value> {
    let reqs = server.requests_to(CHAT);
    let body: Value = serde_json::from_slice(&reqs[n].body).unwrap();
    body["messages"].as_array().unwrap().clone()
}

/// Submits `req` with an observer that passes each piece of streamed content on.
fn submit_watching_content(
    runner: &Runner,
    req: Submission,
) -> (RequestId, std::sync::mpsc::Receiver<String>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Chat(loopd_client::llama::ChatEvent::Content(t)) = e {
            let _ = tx.send(t.clone());
        }
    });
    let id = runner.submit_observed(req, Some(observer)).unwrap();
    (id, rx)
}

fn failed(r: &RequestResult) -> (FailReason, &str) {
    match &r.outcome {
        Outcome::Failed { reason, detail } => (reason.clone(), detail.as_str()),
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn assert_released(runner: &Runner) {
    assert_eq!(runner.busy_slots(), 0, "every slot is free again");
}

#[test]
fn a_batch_of_three_calls_is_one_iteration_run_in_order() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            calls(&[
                ("c1", "echo", r#"{"n":1}"#),
                ("c2", "echo", r#"{"n":2}"#),
                ("c3", "echo", r#"{"n":3}"#),
            ]),
            answer("Done."),
        ],
    )]);
    let s = setup(config(&server, None), 2);
    let r = run(&s, ask("go"));
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            finish_reason: loopd_client::llama::FinishReason::Stop
        }
    );
    assert_eq!(
        *s.log.lock().unwrap(),
        [r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]
    );
    assert_eq!(
        (r.budget, r.budget_left),
        (3, 2),
        "one iteration costs 1, not 3"
    );
    let left: Vec<u32> = r.generations.iter().map(|g| g.budget_left).collect();
    assert_eq!(left, [3, 2]);
    assert_eq!(r.tool_calls.len(), 3);
    assert!(r.tool_calls.iter().all(|t| t.iteration == 1));
    assert_eq!(r.content.as_deref(), Some("Done."));
    // The second generation sees one assistant message with the three calls, then the three
    // results in the listed order.
    let m = sent(&server, 1);
    let roles: Vec<&str> = m.iter().map(|x| x["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "tool"]
    );
    assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 3);
    let results: Vec<(&str, &str)> = m[3..]
        .iter()
        .map(|x| {
            (
                x["tool_call_id"].as_str().unwrap(),
                x["content"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("c1", r#"echo {"n":1}"#),
            ("c2", r#"echo {"n":2}"#),
            // The last result of the iteration carries the budget note.
            ("c3", "echo {\"n\":3}\n\n2 left")
        ]
    );
    assert_released(&s.runner);
}

#[test]
fn an_exit_tool_is_recorded_costs_no_budget_and_generation_continues() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            calls(&[
                ("x1", "signal", r#"{"why":"half way"}"#),
                ("c1", "echo", "{}"),
            ]),
            calls(&[("x2", "signal", "{}")]),
        ],
    )]);
    let s = setup(config(&server, None), 1);
    let r = run(&s, ask("go"));
    assert!(r.outcome.fail_reason().is_none(), "{:?}", r.outcome);
    let exits: Vec<(u32, &str, CallSource)> = r
        .exits
        .iter()
        .map(|e| (e.generation, e.call.id.as_str(), e.source))
        .collect();
    assert_eq!(
        exits,
        [(1, "x1", CallSource::Native), (2, "x2", CallSource::Native)]
    );
    // Only the normal call cost anything, and only it went back to the model.
    assert_eq!(r.budget_left, 2);
    assert_eq!(r.tool_calls.len(), 1);
    let m = sent(&server, 1);
    let ids: Vec<&str> = m[2]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c1"]);
    assert_eq!(
        server.requests_to(CHAT).len(),
        2,
        "the exit-only answer ends the request"
    );
}

#[test]
fn budget_zero_and_another_call_fails_with_tool_execution_error_output_kept() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            calls(&[("c1", "echo", r#"{"a":1}"#)]),
            calls(&[("c2", "echo", r#"{"a":2}"#)]),
        ],
    )]);
    let s = setup(config(&server, None), 1);
    let mut req = ask("go");
    req.budget = Some(1);
    let r = run(&s, req);
    assert_eq!(
        failed(&r),
        (
            FailReason::ToolExecutionError,
            "tool iteration budget exhausted"
        )
    );
    assert_eq!(r.budget_left, 0);
    assert_eq!(
        *s.log.lock().unwrap(),
        [r#"{"a":1}"#],
        "the second call never ran"
    );
    // The output is kept: the first iteration and the refused message.
    let last = r.transcript.last().unwrap();
    assert!(
        matches!(last, ChatMessage::Assistant(AssistantMessage { tool_calls, .. }) if tool_calls[0].id == "c2"),
        "{last:?}"
    );
    // A budget of 0 refuses the very first call.
    let server = FakeServer::start(vec![(CHAT, vec![calls(&[("c1", "echo", "{}")])])]);
    let s = setup(config(&server, None), 1);
    let mut req = ask("go");
    req.budget = Some(0);
    let r = run(&s, req);
    assert_eq!(failed(&r).0, FailReason::ToolExecutionError);
    assert!(s.log.lock().unwrap().is_empty());
    assert_released(&s.runner);
}

#[test]
fn any_failing_call_fails_the_request_with_tool_execution_error() {
    let cases = [
        ("fail", "{}", "tool `fail` (call c2) failed: disk on fire"),
        (
            "sleep",
            "{}",
            "tool `sleep` (call c2) timed out after 200 ms (runner.tool_timeout_ms)",
        ),
        (
            "echo",
            "{not json",
            "tool `echo` (call c2) bad arguments: not JSON",
        ),
        (
            "echo",
            "[1]",
            "tool `echo` (call c2) bad arguments: not a JSON object",
        ),
        (
            "nosuch",
            "{}",
            "tool `nosuch` (call c2) failed: no tool named `nosuch`",
        ),
        (
            "echo",
            r#"{"n":-1.8e308}"#,
            "tool `echo` (call c2) bad arguments: not JSON: JSON number at byte 5 is out of range",
        ),
    ];
    for (name, args, want) in cases {
        let server = FakeServer::start(vec![(
            CHAT,
            vec![calls(&[
                ("c1", "echo", r#"{"first":true}"#),
                ("c2", name, args),
                ("c3", "echo", r#"{"third":true}"#),
            ])],
        )]);
        let s = setup(config(&server, None), 1);
        // `sleep` sleeps 5 s: the request ends at its 200 ms deadline, not the tool's end
        // (`wait` would give up after 10 s on a slot held for good).
        let r = run(&s, ask("go"));
        let (reason, detail) = failed(&r);
        assert_eq!(reason, FailReason::ToolExecutionError, "{name}");
        assert!(detail.starts_with(want), "{name}: {detail}");
        // Calls run in order and stop at the first failure; what ran is kept.
        assert_eq!(*s.log.lock().unwrap(), [r#"{"first":true}"#], "{name}");
        assert_eq!(r.tool_calls.len(), 2, "{name}");
        assert!(r.tool_calls[1].result.is_err());
        assert_eq!(r.budget_left, 3, "a failed iteration is not counted");
        assert_eq!(
            server.requests_to(CHAT).len(),
            1,
            "{name}: no next generation carries the call back"
        );
        assert_released(&s.runner);
    }
}

#[test]
fn a_call_written_as_text_runs_as_a_call() {
    // The real server's stream (recorded) of the model writing its call as text.
    let text = Reply::sse(events_of(&fixture("tool_call_text.sse")));
    let server = FakeServer::start(vec![(CHAT, vec![text, answer("Sunny.")])]);
    let config = config(&server, None);
    let log = Arc::new(Mutex::new(Vec::new()));
    struct Weather(Arc<Mutex<Vec<String>>>);
    impl Tool for Weather {
        fn name(&self) -> &str {
            "get_weather"
        }
        fn description(&self) -> &str {
            "weather"
        }
        fn parameters(&self) -> Value {
            object()
        }
        fn run(&self, args: &Value, _: &Cancel) -> Result<String, ToolError> {
            self.0.lock().unwrap().push(args["city"].to_string());
            Ok("sunny, 21 C".into())
        }
    }
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Weather(log.clone()))).unwrap();
    let runner = Runner::new(
        Arc::new(Client::new(config.client())),
        config.runner.clone(),
        tools,
        Arc::new(NotedBios),
        1,
    );
    let id = runner.submit(ask("Weather in Paris?")).unwrap();
    let r = wait(&runner, id);
    assert!(r.outcome.fail_reason().is_none(), "{:?}", r.outcome);
    assert_eq!(*log.lock().unwrap(), ["\"Paris\""]);
    assert_eq!(r.tool_calls[0].source, CallSource::Text);
    assert_eq!(r.tool_calls[0].call.id, "text-1-0");
    assert_eq!(r.budget_left, 2);
    // The call goes back as a call, not as text, so the template renders it once.
    let m = sent(&server, 1);
    assert_eq!(m[2]["content"], Value::Null);
    assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "text-1-0", "content": "sunny, 21 C\n\n2 left"})
    );
}

/// A stream of `line` written `times` times, then silence (the server would go on for ever).
fn looping(line: &str, times: usize) -> Reply {
    let mut pieces = vec![content("Let me think.\n")];
    pieces.extend((0..times).map(|_| content(&format!("{line}\n"))));
    Reply::sse(pieces).ending(End::Silence)
}

#[test]
fn a_39_character_line_repeated_closes_the_stream_with_loop_detected() {
    let line = "I will now check the weather for you.."; // 38 bytes + '\n'
    assert_eq!(line.len() + 1, 39);
    let server = FakeServer::start(vec![(CHAT, vec![looping(line, 40)])]);
    let s = setup(config(&server, None), 1);
    // The server never finishes: only the runner closing the stream ends the request.
    let r = run(&s, ask("go"));
    let (reason, detail) = failed(&r);
    assert_eq!(reason, FailReason::LoopDetected);
    assert!(
        detail.contains("1-line unit of 38 bytes repeated 8 times"),
        "{detail}"
    );
    let kept = r.content.unwrap();
    assert!(kept.starts_with("Let me think.\n"));
    assert!(kept.matches(line).count() >= 8, "the output is kept");
    assert_released(&s.runner);
}

#[test]
fn no_slot_available_at_once_when_every_slot_is_busy_and_no_queue() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![content("...")]).ending(End::Silence)],
    )]);
    let s = setup(config(&server, None), 2);
    let a = s.runner.submit(ask("a")).unwrap();
    let b = s.runner.submit(ask("b")).unwrap();
    // Both streams are silent for good: a queue would block here, never return.
    assert_eq!(s.runner.submit(ask("c")), Err(SubmitError::NoSlotAvailable));
    assert_eq!(
        SubmitError::NoSlotAvailable.to_string(),
        "NO_SLOT_AVAILABLE"
    );
    assert_eq!(s.runner.busy_slots(), 2, "the refusal used no slot");
    // The two run on server slots 0 and 1.
    support_wait(|| server.requests_to(CHAT).len() == 2);
    let mut ids: Vec<u64> = server
        .requests_to(CHAT)
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["id_slot"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ids.sort();
    assert_eq!(ids, [0, 1]);
    s.runner.cancel(a).unwrap();
    let ra = wait(&s.runner, a);
    assert_eq!(failed(&ra).0, FailReason::Cancelled);
    assert_eq!(s.runner.busy_slots(), 1);
    let c = s.runner.submit(ask("c")).expect("a cancel frees its slot");
    for id in [b, c] {
        s.runner.cancel(id).unwrap();
        wait(&s.runner, id);
    }
    assert_released(&s.runner);
}

#[test]
fn worker_not_ready_or_failed_refuses_without_using_a_slot() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("hi")])]);
    let worker = FakeWorker::start(Script::default());
    let s = setup(config(&server, Some(&worker)), 1);
    for (state, want) in [
        ("starting", SubmitError::WorkerNotReady),
        ("restarting", SubmitError::WorkerNotReady),
        ("failed", SubmitError::WorkerFailed),
        ("stopped", SubmitError::WorkerStopped),
    ] {
        worker.set(|w| w.state = state);
        // Admission takes the state from the watch's line: wait until it is in.
        seen_state(&s.runner, state);
        assert_eq!(s.runner.submit(ask("x")), Err(want), "{state}");
        assert_eq!(s.runner.busy_slots(), 0);
    }
    assert_eq!(SubmitError::WorkerNotReady.to_string(), "WORKER_NOT_READY");
    assert_eq!(SubmitError::WorkerFailed.to_string(), "WORKER_FAILED");
    assert!(server.requests_to(CHAT).is_empty());
    worker.set(|w| w.state = "ready");
    seen_state(&s.runner, "ready");
    let r = run(&s, ask("x"));
    assert!(r.outcome.fail_reason().is_none(), "{:?}", r.outcome);
    // A worker socket that does not answer is not a ready worker (once its watch ended, as a
    // worker that exits ends it).
    drop(worker);
    llama_harness::wait_for("the watch lost", Duration::from_secs(5), || {
        match s.runner.hosts().first().map(|h| h.state.as_str()) {
            Some("ready") => Err("still ready".to_owned()),
            _ => Ok(()),
        }
    });
    assert_eq!(s.runner.submit(ask("x")), Err(SubmitError::WorkerNotReady));
}

#[test]
fn a_result_is_handed_out_once_then_not_found() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![answer("one").first_after(Duration::from_millis(100))],
    )]);
    let s = setup(config(&server, None), 1);
    let id = s.runner.submit(ask("x")).unwrap();
    assert_eq!(s.runner.get_result(id), Err(ResultError::Pending));
    let r = wait(&s.runner, id);
    assert_eq!(r.id, id);
    assert_eq!(r.content.as_deref(), Some("one"));
    assert_eq!(s.runner.get_result(id), Err(ResultError::NotFound));
    assert_eq!(s.runner.get_result(id), Err(ResultError::NotFound));
    assert_eq!(s.runner.cancel(id), Err(ResultError::NotFound));
    assert_eq!(
        s.runner.get_result(RequestId(999)),
        Err(ResultError::NotFound)
    );
    assert_eq!(ResultError::NotFound.to_string(), "NOT_FOUND");
    assert_eq!(s.runner.records(), 0, "the record is released");
}

/// With a completion sink the runner keeps no result: each ending goes to the sink once, on
/// the request's thread, after its slot was freed, under the id the caller gave.
#[test]
fn a_completion_sink_gets_each_result_once_under_the_callers_id_with_the_slot_free() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("one"), answer("two")])]);
    let s = setup(config(&server, None), 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = Arc::new(s.runner);
    let seen = Arc::downgrade(&runner);
    let sink = Box::new(move |r: RequestResult| {
        // The slot is free by the time the sink hears of the ending.
        let busy = seen.upgrade().map(|run| run.busy_slots());
        let _ = tx.send((r, busy));
    });
    runner.complete_into(sink).unwrap();
    let again = runner.complete_into(Box::new(|_| {}));
    assert_eq!(again, Err(loopd_agent::runner::SinkAlreadySet));
    for (given, text) in [(41, "one"), (7, "two")] {
        let id = runner
            .submit_named::<SubmitError>(ask("x"), |_| Ok((RequestId(given), None)))
            .unwrap();
        assert_eq!(id, RequestId(given));
        let (r, busy) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            (r.id, r.content.as_deref(), busy),
            (id, Some(text), Some(0))
        );
        assert_eq!(runner.get_result(id), Err(ResultError::NotFound));
    }
    assert_eq!(runner.records(), 0, "the runner keeps nothing");
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "once each"
    );
}

/// A caller that cannot name the request (its store refused) refuses the submit with its own
/// error, and no slot is used.
#[test]
fn a_naming_error_refuses_the_submit_and_uses_no_slot() {
    #[derive(Debug, PartialEq)]
    enum Refused {
        Runner(SubmitError),
        Store,
    }
    impl From<SubmitError> for Refused {
        fn from(e: SubmitError) -> Self {
            Refused::Runner(e)
        }
    }
    let server = FakeServer::start(vec![(CHAT, vec![answer("one")])]);
    let s = setup(config(&server, None), 1);
    let refused = s.runner.submit_named(ask("x"), |_| Err(Refused::Store));
    assert_eq!(refused, Err(Refused::Store));
    assert_released(&s.runner);
    assert_eq!(s.runner.records(), 0);
    assert!(server.requests().is_empty());
}

#[test]
fn cancel_ends_a_silent_stream_with_its_partial_output() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![content("Hello, "), content("wor")]).ending(End::Silence)],
    )]);
    let s = setup(config(&server, None), 1);
    let (id, rx) = submit_watching_content(&s.runner, ask("x"));
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "Hello, ");
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "wor");
    // The stream is silent for good: only the cancel ends the request (its timing to the
    // millisecond is tests/agent.rs's).
    s.runner.cancel(id).unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(
        failed(&r),
        (FailReason::Cancelled, "cancelled by the caller")
    );
    assert_eq!(r.content.as_deref(), Some("Hello, wor"));
    assert_eq!(
        r.transcript,
        [ChatMessage::Assistant(AssistantMessage {
            content: Some("Hello, wor".into()),
            reasoning_content: None,
            tool_calls: vec![]
        })]
    );
    assert_released(&s.runner);
}

/// The runner's side of "cancel frees the slot" (the client's is tests/cancel.rs): the slot's
/// next request asks `/slots` until the abandoned generation is over before it sends, through
/// the drive thread; a request after a normal answer sends at once.
#[test]
fn the_request_after_a_cancel_waits_for_its_slot_to_be_idle_before_sending() {
    let busy = Reply::json(200, &slots_json(Some(0)));
    let idle = Reply::json(200, &slots_json(None));
    let server = FakeServer::start(vec![
        (
            CHAT,
            vec![
                Reply::sse(vec![content("Hello, ")]).ending(End::Silence),
                answer("next"),
                answer("after"),
            ],
        ),
        (SLOTS, vec![busy.clone(), busy, idle]),
    ]);
    let s = setup(config(&server, None), 1);
    let (id, rx) = submit_watching_content(&s.runner, ask("x"));
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), "Hello, ");
    s.runner.cancel(id).unwrap();
    assert_eq!(failed(&wait(&s.runner, id)).0, FailReason::Cancelled);
    assert!(server.requests_to(SLOTS).is_empty());

    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Chat(c) = e {
            seen.lock().unwrap().push(c.clone());
        }
    });
    let id = s.runner.submit_observed(ask("y"), Some(observer)).unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(r.content.as_deref(), Some("next"), "{r:?}");
    assert_eq!(server.requests_to(SLOTS).len(), 3, "busy, busy, idle");
    let busy = loopd_client::llama::ChatEvent::Waiting { slot_busy: true };
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events.iter().take_while(|e| **e == busy).count(),
        2,
        "two waits before the answer: {events:?}"
    );
    assert_eq!(server.requests_to(CHAT).len(), 2);

    let r = run(&s, ask("z"));
    assert_eq!(r.content.as_deref(), Some("after"), "{r:?}");
    // (A poll after the send is the first-byte wait's, every poll_ms on a slow box.)
    let before_third: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.path().to_owned())
        .take_while({
            let mut chats = 0;
            move |p| {
                chats += usize::from(p == CHAT);
                chats < 3
            }
        })
        .filter(|p| p == SLOTS)
        .collect();
    assert_eq!(before_third.len(), 3, "no check after a normal answer");
    assert_released(&s.runner);
}

#[test]
fn cancel_while_a_tool_runs_ends_the_request() {
    let server = FakeServer::start(vec![(CHAT, vec![calls(&[("c1", "sleep", "{}")])])]);
    let mut c = config(&server, None);
    c.runner.tool_timeout_ms = 10_000;
    let s = setup(c, 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let observer = Box::new(move |e: &RequestEvent| {
        if matches!(e, RequestEvent::ToolStarted { .. }) {
            let _ = tx.send(());
        }
    });
    let id = s.runner.submit_observed(ask("x"), Some(observer)).unwrap();
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    s.runner.cancel(id).unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(failed(&r).0, FailReason::Cancelled);
    assert_released(&s.runner);
}

#[test]
fn slow_headers_past_the_stall_limit_end_in_a_restart_and_worker_restarted() {
    let server = FakeServer::start(vec![
        (
            CHAT,
            vec![answer("late").first_after(Duration::from_secs(3))],
        ),
        (SLOTS, vec![Reply::json(200, &slots_json(Some(0)))]),
    ]);
    let worker = FakeWorker::start(Script {
        stall: "restarting",
        ..Script::default()
    });
    let s = setup(config(&server, Some(&worker)), 1);
    let r = run(&s, ask("x"));
    let (reason, detail) = failed(&r);
    assert_eq!(reason, FailReason::WorkerRestarted);
    assert!(detail.contains("runner.stall_ms"), "{detail}");
    assert_eq!(r.stalls, [StallAnswer::Restarting]);
    assert_eq!(worker.stalls(), 1);
    assert_eq!(r.content, None);
    assert_released(&s.runner);
}

#[test]
fn a_mid_stream_stall_ends_in_a_restart_and_worker_restarted_with_partial_output() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![content("The answer is")]).ending(End::Silence)],
    )]);
    let worker = FakeWorker::start(Script {
        stall: "restarting",
        ..Script::default()
    });
    let s = setup(config(&server, Some(&worker)), 1);
    let r = run(&s, ask("x"));
    assert_eq!(failed(&r).0, FailReason::WorkerRestarted);
    assert_eq!(r.content.as_deref(), Some("The answer is"));
    assert_eq!(r.stalls, [StallAnswer::Restarting]);
    assert_eq!(
        r.generations[0].finish_reason, None,
        "the failed generation has no finish reason"
    );
    assert_released(&s.runner);
    // The worker is restarting now (its watch says so): new requests are refused without a
    // slot.
    seen_state(&s.runner, "restarting");
    assert_eq!(s.runner.submit(ask("y")), Err(SubmitError::WorkerNotReady));
}

#[test]
fn a_restart_or_death_seen_on_the_status_socket_fails_the_requests_in_flight() {
    for (cause, want) in [
        ("unready", FailReason::WorkerRestarted),
        ("exited", FailReason::ServerDied),
    ] {
        let server = FakeServer::start(vec![(
            CHAT,
            vec![Reply::sse(vec![content("partial")]).ending(End::Silence)],
        )]);
        let worker = FakeWorker::start(Script::default());
        let mut c = config(&server, Some(&worker));
        c.runner.stall_ms = 60_000;
        let s = setup(c, 2);
        // The restart comes once both have their partial output in hand.
        let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let observe = || -> Option<loopd_agent::runner::Observer> {
            let seen = seen.clone();
            Some(Box::new(move |e: &RequestEvent| {
                if matches!(
                    e,
                    RequestEvent::Chat(loopd_client::llama::ChatEvent::Content(_))
                ) {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }))
        };
        let a = s.runner.submit_observed(ask("a"), observe()).unwrap();
        let b = s.runner.submit_observed(ask("b"), observe()).unwrap();
        support_wait(|| seen.load(std::sync::atomic::Ordering::SeqCst) == 2);
        worker.set(|w| {
            w.state = "restarting";
            w.spawns = 2;
            w.last_cause = Some(cause);
        });
        for id in [a, b] {
            let r = wait(&s.runner, id);
            assert_eq!(failed(&r).0, want, "{cause}");
            assert_eq!(r.content.as_deref(), Some("partial"));
        }
        assert_eq!(
            want.to_string(),
            if cause == "exited" {
                "server_died"
            } else {
                "worker_restarted"
            }
        );
        assert_released(&s.runner);
    }
}

#[test]
fn a_disconnect_mid_stream_is_retried_and_once_retries_run_out_fails_with_the_partial_output() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            Reply::sse(vec![content("Half an ans")]).ending(End::Cut),
            Reply::sse(vec![content("Half again")]).ending(End::Cut),
        ],
    )]);
    let s = setup(config(&server, None), 1);
    let r = run(&s, ask("x"));
    let (reason, detail) = failed(&r);
    assert_eq!(reason, FailReason::Client(InferError::StreamClosedEarly));
    assert_eq!(reason.to_string(), "stream_closed_early");
    assert_eq!(detail, "the stream ended before its last chunk");
    // The last attempt's output; the first one's was dropped when it was retried.
    assert_eq!(r.content.as_deref(), Some("Half again"));
    assert_eq!(
        r.retries,
        [RetryRecord {
            generation: 1,
            attempt: 2,
            after_ms: 40,
            error: "stream_closed_early",
            detail: "the stream ended before its last chunk".into(),
        }]
    );
    assert_eq!(server.requests_to(CHAT).len(), 2);
    assert_eq!(
        sent(&server, 0),
        sent(&server, 1),
        "the same messages again"
    );
    assert_released(&s.runner);
}

#[test]
fn a_retried_generation_starts_over_and_its_retry_is_an_event_and_costs_no_budget() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            calls(&[("a", "echo", r#"{"n":1}"#)]),
            Reply::sse(vec![content("lost words")]).ending(End::Cut),
            answer("done"),
        ],
    )]);
    let s = setup(config(&server, None), 1);
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let observer = Box::new(move |e: &RequestEvent| seen.lock().unwrap().push(e.clone()));
    let id = s.runner.submit_observed(ask("x"), Some(observer)).unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            finish_reason: FinishReason::Stop
        },
        "{r:?}"
    );
    assert_eq!(r.content.as_deref(), Some("done"));
    assert_eq!(
        (r.budget, r.budget_left),
        (3, 2),
        "one iteration; the retry is free"
    );
    assert_eq!(r.tool_calls.len(), 1, "the tool ran once");
    assert_eq!(r.generations.len(), 2);
    assert_eq!(r.retries.len(), 1);
    assert_eq!((r.retries[0].generation, r.retries[0].attempt), (2, 2));
    // Nothing of the dropped attempt is in the transcript: the call, its result, the answer.
    let texts: Vec<String> = r
        .transcript
        .iter()
        .filter_map(|m| match m {
            ChatMessage::Assistant(a) => a.content.clone(),
            _ => None,
        })
        .collect();
    assert!(!texts.iter().any(|t| t.contains("lost")), "{texts:?}");
    assert_eq!(
        sent(&server, 1),
        sent(&server, 2),
        "the same messages again"
    );
    let retrying: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            RequestEvent::Chat(ChatEvent::Retrying {
                attempt, after_ms, ..
            }) => Some((*attempt, *after_ms)),
            _ => None,
        })
        .collect();
    assert_eq!(retrying, [(2, 40)]);
    assert_released(&s.runner);
}

#[test]
fn failure_reasons_print_as_the_seed_names_them() {
    let names: Vec<String> = [
        FailReason::ToolExecutionError,
        FailReason::ToolParseError,
        FailReason::WorkerRestarted,
        FailReason::ServerDied,
        FailReason::LoopDetected,
        FailReason::Cancelled,
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        names,
        [
            "tool_execution_error",
            "tool_parse_error",
            "worker_restarted",
            "server_died",
            "loop_detected",
            "cancelled"
        ]
    );
}

/// Waits up to 5 s for `cond`.
fn support_wait(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "condition not met within 5 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_panicking_observer_fails_its_request_and_frees_the_slot() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("hi")])]);
    let s = setup(config(&server, None), 1);
    let observer = Box::new(|_: &RequestEvent| panic!("observer bug"));
    let id = s.runner.submit_observed(ask("x"), Some(observer)).unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(failed(&r).0, FailReason::Panicked);
    assert_released(&s.runner);
    let r = run(&s, ask("y"));
    assert!(r.outcome.fail_reason().is_none(), "{:?}", r.outcome);
}

/// The commands the worker got about generations, in order, a `register`'s watch id left out
/// (it names the runner's watch connection once its hello has been read).
fn generation_commands(worker: &FakeWorker) -> Vec<String> {
    let ours = ["register", "progress", "done", "stall"];
    worker
        .commands()
        .into_iter()
        .filter(|c| ours.iter().any(|w| c.split(' ').next() == Some(w)))
        .map(|c| match c.split(' ').collect::<Vec<_>>().as_slice() {
            ["register", slot, _watch] => format!("register {slot}"),
            _ => c,
        })
        .collect()
}

/// Waits until the runner's one host shows the worker's `state` (its watch's last line).
fn seen_state(runner: &Runner, state: &str) {
    llama_harness::wait_for(
        &format!("the worker's {state} on the watch"),
        Duration::from_secs(5),
        || match runner.hosts().first().map(|h| h.state.as_str()) {
            Some(s) if s == state => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
}

/// With the watch open and its state line in, a submit asks the worker nothing before its
/// `register` (a `status` round trip on the request's path cost 3.5 to 15 ms on a
/// busy box); the watch's line is the worker's word.
#[test]
fn admission_takes_the_workers_state_from_the_watch_without_a_status_round_trip() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("ok")])]);
    let worker = FakeWorker::start(Script::default());
    let s = setup(config(&server, Some(&worker)), 1);
    seen_state(&s.runner, "ready");
    let before = worker.commands().len();
    let r = run(&s, ask("x"));
    assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    let said = worker.commands()[before..].to_vec();
    let to_register: Vec<&String> = said
        .iter()
        .take_while(|c| !c.starts_with("register"))
        .collect();
    assert!(
        said.iter().any(|c| c.starts_with("register")) && to_register.is_empty(),
        "the worker heard {said:?}"
    );
    // Without a watch line (a worker that restarts is seen on the watch, then asked).
    worker.set(|w| w.state = "restarting");
    seen_state(&s.runner, "restarting");
    assert_eq!(s.runner.submit(ask("x")), Err(SubmitError::WorkerNotReady));
    assert!(server.requests_to(CHAT).len() == 1);
}

#[test]
fn each_generation_is_registered_with_the_worker_and_done_when_it_ends() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("ok")])]);
    let worker = FakeWorker::start(Script::default());
    let s = setup(config(&server, Some(&worker)), 1);
    // The registration names the runner's watch connection (one server may have several clients), once its hello came.
    support_wait(|| worker.watching() == 1);
    std::thread::sleep(Duration::from_millis(200));
    let r = run(&s, ask("x"));
    assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    assert!(
        worker.commands().contains(&"register 0 1".to_owned()),
        "{:?}",
        worker.commands()
    );
    // `done` follows the result (the caller does not wait for it), so it is waited for.
    let said = llama_harness::wait_for("done 1 at the worker", Duration::from_secs(5), || {
        let c = generation_commands(&worker);
        match c.last().map(String::as_str) {
            Some("done 1") => Ok(c),
            _ => Err(format!("{c:?}")),
        }
    });
    // The first byte is reported unless the whole answer came in the read that ended it.
    let middle = &said[1..said.len() - 1];
    assert!(
        said[0] == "register 0" && (middle.is_empty() || middle == ["progress 1 first_byte"]),
        "{said:?}"
    );
}

#[test]
fn a_failure_pushed_on_the_watch_ends_the_request_with_its_partial_output() {
    for (pushed, want) in [
        ("worker_restarted", FailReason::WorkerRestarted),
        ("server_died", FailReason::ServerDied),
        ("worker_stopped", FailReason::WorkerStopped),
    ] {
        let server = FakeServer::start(vec![(
            CHAT,
            vec![Reply::sse(vec![content("partial")]).ending(End::Silence)],
        )]);
        let worker = FakeWorker::start(Script::default());
        let mut c = config(&server, Some(&worker));
        // Only the push can end it: no stall report, no status poll, liveness past `wait`.
        c.runner.stall_ms = 60_000;
        c.runner.worker_poll_ms = 60_000;
        c.limits.liveness_ms = 60_000;
        let s = setup(c, 1);
        support_wait(|| worker.watching() == 1);
        let id = s.runner.submit(ask("a")).unwrap();
        support_wait(|| generation_commands(&worker).len() == 2);
        worker.push_failed(1, pushed);
        let r = wait(&s.runner, id);
        let (reason, detail) = failed(&r);
        assert_eq!(reason, want, "{pushed}");
        assert!(detail.contains("pushed on the watch"), "{detail}");
        assert_eq!(r.content.as_deref(), Some("partial"));
        assert_released(&s.runner);
        assert_eq!(
            generation_commands(&worker),
            ["register 0", "progress 1 first_byte"],
            "no done for a generation the worker failed"
        );
    }
}

/// Every byte the server sent before the worker pushed its death is in loopd's socket when
/// the push is read (both are local sockets): the request ends with the worker's reason and
/// all of that output, never part of it. Without a drain of the socket first, about one run
/// in two lost some of it.
#[test]
fn a_pushed_failure_keeps_every_piece_already_received() {
    const PIECES: usize = 400;
    const RUNS: u32 = 500;
    let texts: Vec<String> = (0..PIECES).map(|k| format!("piece {k}; ")).collect();
    let server = FakeServer::start(vec![
        (
            CHAT,
            vec![Reply::sse(texts.iter().map(|t| content(t)).collect()).ending(End::Silence)],
        ),
        (SLOTS, vec![Reply::json(200, &slots_json(None))]),
    ]);
    let whole: String = texts.concat();
    let worker = FakeWorker::start(Script::default());
    let mut c = config(&server, Some(&worker));
    // Only the push can end it.
    c.runner.stall_ms = 60_000;
    c.runner.worker_poll_ms = 60_000;
    c.limits.liveness_ms = 60_000;
    let s = setup(c, 1);
    support_wait(|| worker.watching() == 1);
    let mut lost = Vec::new();
    for run in 1..=RUNS {
        let id = s.runner.submit(ask("a")).unwrap();
        // Generation `run` is registered and sent; the server wrote its every byte.
        // Polled every millisecond (not `wait_for`'s 100 ms): 500 runs in seconds.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            // (The slot's `/slots` polls after the last request's close are served too.)
            let (chats, written, served) = (
                server.requests_to(CHAT).len(),
                server.written(),
                server.served(),
            );
            if chats == run as usize && written == served {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "waited 5 s for run {run}'s reply: {chats} chats, {written} of {served} written"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        worker.push_failed(u64::from(run), "server_died");
        let r = wait(&s.runner, id);
        assert_eq!(failed(&r).0, FailReason::ServerDied, "run {run}: {r:?}");
        if r.content.as_deref() != Some(whole.as_str()) {
            lost.push((run, r.content.map_or(0, |c| c.len())));
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {RUNS} runs lost output (run, bytes kept of {}): {:?}",
        lost.len(),
        whole.len(),
        &lost[..lost.len().min(5)]
    );
}

/// The worker writes the state `stop` or `start` set on every watch before it answers, so the
/// next submit goes by it: refused `WORKER_STOPPED` right after a `stop` was answered, and
/// accepted right after a `start` was (admission looks at no state with a line still unread
/// behind it).
#[test]
fn a_submit_right_after_the_worker_answered_stop_is_refused_worker_stopped() {
    use worker_proto::{call, Command};
    let server = FakeServer::start(vec![(CHAT, vec![answer("ok")])]);
    let worker = FakeWorker::start(Script::default());
    let s = setup(config(&server, Some(&worker)), 1);
    support_wait(|| worker.watching() == 1);
    let t = Duration::from_secs(2);
    for round in 0..200 {
        let stopped = call(worker.socket(), Command::Stop, t).unwrap();
        assert!(stopped.contains("\"state\":\"stopped\""), "{stopped}");
        assert_eq!(
            s.runner.submit(ask("x")).err(),
            Some(SubmitError::WorkerStopped),
            "round {round}"
        );
        call(worker.socket(), Command::Start, t).unwrap();
        let id = s
            .runner
            .submit(ask("x"))
            .unwrap_or_else(|e| panic!("round {round}: refused after start: {e:?}"));
        let r = wait(&s.runner, id);
        assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    }
}

#[test]
fn wait_result_waits_on_the_clients_clock() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("late")])]);
    let clock = loopd_client::clock::FakeClock::new();
    let config = config(&server, None);
    let client = Arc::new(Client::with_time(
        config.client(),
        Arc::new(clock.clone()),
        Arc::new(loopd_client::clock::SystemJitter::new()),
    ));
    let runner = Runner::new(
        client.clone(),
        config.runner,
        ToolRegistry::new(),
        Arc::new(NotedBios),
        1,
    );
    // The request queues behind a holder of its slot, so it stays running.
    let held = support::hold_slot(&client, 0);
    let id = runner.submit(ask("x")).unwrap();
    support_wait(|| client.gate().queued(0) == 1);
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let r = &runner;
        s.spawn(move || tx.send(r.wait_result(id, Duration::from_secs(1))).unwrap());
        // A second of fake time: real time does not end the wait, the fake clock does.
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        clock.advance(Duration::from_millis(999));
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        clock.advance(Duration::from_millis(1));
        let r = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the wait ended");
        assert_eq!(r, Err(ResultError::Pending));
    });
    runner.cancel(id).unwrap();
    let r = wait(&runner, id);
    assert_eq!(failed(&r).0, FailReason::Cancelled);
    drop(held);
}

/// Every connection a generation opens goes through inferproxy's accept bucket (burst 10, then
/// 2 a second), so the runner opens only what it needs: a generation answered within
/// `poll_ms` is the chat connection alone (llama-worker is asked on its own socket), each
/// retry one more, and `/slots` is asked only after an abandoned generation or while no
/// answer comes.
#[test]
fn a_generation_opens_one_connection_through_the_proxy_and_a_retry_one_more() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            calls(&[("c1", "echo", "{}")]),
            Reply::sse(vec![content("cut")]).ending(End::Cut),
            answer("ok"),
        ],
    )]);
    let worker = FakeWorker::start(Script::default());
    let mut c = config(&server, Some(&worker));
    // The cut is the worker's to explain first: not for 10 s here.
    c.runner.death_grace_ms = 100;
    let s = setup(c, 1);
    let r = run(&s, ask("x"));
    assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    assert_eq!(r.retries.len(), 1, "{r:?}");
    let paths: Vec<String> = server
        .requests()
        .iter()
        .map(|q| q.path().to_owned())
        .collect();
    assert_eq!(paths, [CHAT, CHAT, CHAT], "two generations, one retried");
}

/// A turn whose session is compacted: the summary of two earlier turns goes into its user
/// message.
fn compacting() -> Submission {
    let mut req = ask("And now?");
    req.system = Some("Be brief.".into());
    req.summarize = Some(Summarize {
        messages: vec![
            ChatMessage::User {
                content: "What is 2+2?".into(),
            },
            ChatMessage::Assistant(AssistantMessage {
                content: Some("4".into()),
                reasoning_content: None,
                tool_calls: vec![],
            }),
            ChatMessage::User {
                content: "Summarize the conversation so far.".into(),
            },
        ],
        max_tokens: 64,
        into: 0,
        prefix: "Earlier: ".into(),
    });
    req
}

/// The body of the `n`th chat request the server received.
fn body(server: &FakeServer, n: usize) -> Value {
    serde_json::from_slice(&server.requests_to(CHAT)[n].body).unwrap()
}

#[test]
fn a_summary_generation_runs_first_on_the_slot_and_generation_1_carries_its_text() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            answer(" They asked 2+2. "),
            answer("Still 4."),
            answer("Still 4."),
        ],
    )]);
    let s = setup(config(&server, None), 1);
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let observer = Box::new(move |e: &RequestEvent| seen.lock().unwrap().push(e.clone()));
    let id = s
        .runner
        .submit_observed(compacting(), Some(observer))
        .unwrap();
    let r = wait(&s.runner, id);
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            finish_reason: FinishReason::Stop
        },
        "{r:?}"
    );
    assert_eq!(r.content.as_deref(), Some("Still 4."));
    assert_eq!(r.generations.len(), 1);
    assert_eq!((r.budget, r.budget_left), (3, 3));
    assert_eq!(r.transcript.len(), 1, "generation 1's answer alone");

    let summary = body(&server, 0);
    assert_eq!(
        summary["messages"],
        json!([
            {"role": "system", "content": "BIOS: 3 tool iterations"},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "Summarize the conversation so far."},
        ])
    );
    assert_eq!(summary["max_tokens"], 64);
    assert_eq!(summary["chat_template_kwargs"]["enable_thinking"], false);
    assert_eq!(
        summary["tools"],
        body(&server, 1)["tools"],
        "the same prefix"
    );
    assert_eq!(
        sent(&server, 1),
        [
            json!({"role": "system", "content": "BIOS: 3 tool iterations"}),
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Earlier: They asked 2+2.\n\nAnd now?"}),
        ]
    );
    // The same turn submitted without a summary, its message already as the summary left it:
    // generation 1 sends the same bytes.
    let mut plain = compacting();
    plain.summarize = None;
    plain.messages[0] = ChatMessage::User {
        content: "Earlier: They asked 2+2.\n\nAnd now?".into(),
    };
    assert_eq!(run(&s, plain).outcome.fail_reason(), None);
    let reqs = server.requests_to(CHAT);
    assert_eq!(reqs.len(), 3);
    assert_eq!(
        String::from_utf8_lossy(&reqs[1].body),
        String::from_utf8_lossy(&reqs[2].body)
    );

    let shown: Vec<RequestEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| !matches!(e, RequestEvent::Chat(c) if !matches!(c, ChatEvent::Content(_))))
        .cloned()
        .collect();
    assert!(
        matches!(
            &shown[..],
            [
                RequestEvent::Summarized { summary, timings: Some(_) },
                RequestEvent::Generation { number: 1, budget_left: 3 },
                RequestEvent::Chat(ChatEvent::Content(answer)),
            ] if summary == "They asked 2+2." && answer == "Still 4."
        ),
        "{shown:?}"
    );
    assert_released(&s.runner);
}

#[test]
fn a_summary_generation_cut_past_its_retries_fails_the_request_with_no_output() {
    let cut = || Reply::sse(vec![content("They asked")]).ending(End::Cut);
    let server = FakeServer::start(vec![(CHAT, vec![cut(), cut()])]);
    let s = setup(config(&server, None), 1);
    let r = run(&s, compacting());
    assert_eq!(
        failed(&r).0,
        FailReason::Client(InferError::StreamClosedEarly),
        "{r:?}"
    );
    assert_eq!((r.content, r.reasoning_content), (None, None));
    assert!(r.generations.is_empty() && r.transcript.is_empty());
    assert_eq!(
        r.retries.iter().map(|t| t.generation).collect::<Vec<_>>(),
        [0],
        "the summary generation's retry"
    );
    let reqs = server.requests_to(CHAT);
    assert_eq!(reqs.len(), 2, "two attempts, both the summary");
    assert_eq!(body(&server, 1)["max_tokens"], 64);
    assert_released(&s.runner);
}
