//! The request machine on fake time: every appendix-L decision of one agent request (batches,
//! budget, exit tools, text calls, the loop detector, tool deadlines, stalls, restarts,
//! cancels, disconnects), each input with its `now` and every timer checked to the
//! millisecond. No socket, no thread, no clock: `tests/runner.rs` keeps the wall-clock
//! smoke tests through real sockets.

mod scripted;
mod sections;

use std::sync::Arc;
use std::time::Duration;

use loopd_agent::runner::worker::{RegisterAnswer, WorkerError, WorkerFailReason};
use loopd_agent::runner::RunnerConfig;
use loopd_agent::runner::{
    Action, AgentRequest, BiosContext, BiosProvider, FailReason, Outcome, RequestEvent, RequestId,
    RequestResult, RetryRecord, Setup, StallAnswer, Submission, Summarize, ToolRegistry,
    WorkerState, WorkerStatus,
};
use loopd_client::clock::FakeJitter;
use loopd_client::config::Retry;
use loopd_client::llama::{
    AssistantMessage, Buffers, ChatEvent, ChatMessage, ChatOptions, ChatRequest, FinishReason,
    InferError, Silence, SlotSeen, Timings,
};
use scripted::{ms, tool_call_deltas, Named};
use sections::Config;
use serde_json::{json, Value};

struct Fixed;

impl BiosProvider for Fixed {
    fn bios(&self, ctx: &BiosContext<'_>) -> String {
        format!("BIOS of {} iterations", ctx.budget)
    }
}

fn tools() -> ToolRegistry {
    let mut t = ToolRegistry::new();
    for (name, exit) in [("echo", false), ("other", false), ("signal", true)] {
        t.register(Arc::new(Named(name, exit))).unwrap();
    }
    t
}

/// `[runner]` with short, distinct timers; with or without a worker socket.
fn settings(worker: bool) -> RunnerConfig {
    RunnerConfig {
        budget: 2,
        tool_timeout_ms: 500,
        worker_socket: worker.then(|| "/run/worker.sock".into()),
        worker_poll_ms: 1_000,
        stall_ms: 150,
        ..RunnerConfig::default()
    }
}

fn config() -> Config {
    let mut c = Config::new("/run/infer.sock", "smollm2");
    c.limits.poll_ms = 100;
    c.limits.liveness_ms = 400;
    c.limits.idle_grace_ms = 10_000;
    c
}

fn ask(budget: Option<u32>) -> Submission {
    Submission {
        messages: vec![ChatMessage::User {
            content: "hi".into(),
        }],
        budget,
        ..Submission::default()
    }
}

fn machine<'b>(
    buffers: &'b mut Buffers,
    settings: &RunnerConfig,
    req: Submission,
    spawns: Option<u64>,
) -> AgentRequest<'b> {
    let mut m = retrying(buffers, settings, req, spawns, Retry::once());
    // The slot gate lets generation 1 in at once; later ones are let in by `respond`.
    m.handle_acquired(Duration::ZERO, Ok(false));
    m
}

/// A machine whose generations are tried again under `retry` (no jitter), at the gate.
fn retrying<'b>(
    buffers: &'b mut Buffers,
    settings: &RunnerConfig,
    req: Submission,
    spawns: Option<u64>,
    retry: Retry,
) -> AgentRequest<'b> {
    let tools = tools();
    let setup = Setup {
        id: RequestId(7),
        slot: 1,
        limits: config().limits,
        settings,
        tools: &tools,
        bios: Arc::new(Fixed),
        spawns,
        retry,
        jitter: Arc::new(FakeJitter::new(&[])),
    };
    AgentRequest::new(Duration::ZERO, setup, req, buffers.storage())
}

fn drain(m: &mut AgentRequest<'_>) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// The actions but the events, by kind: `send`, `close`, `tool echo`, ...
fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(_) => None,
            Action::Acquire => Some("acquire".into()),
            Action::Send(_) => Some("send".into()),
            Action::PollSlots => Some("slots".into()),
            Action::EndReasoning { .. } => Some("end_reasoning".into()),
            Action::Close { .. } => Some("close".into()),
            Action::RunTool { name, .. } => Some(format!("tool {name}")),
            Action::CancelTool { id } => Some(format!("cancel {id}")),
            Action::WorkerStatus => Some("status".into()),
            Action::ReportStall { generation: None } => Some("stall".into()),
            Action::ReportStall {
                generation: Some(g),
            } => Some(format!("stall {g}")),
            Action::RegisterGeneration => Some("register".into()),
            Action::ReportProgress { id, kind } => Some(format!("progress {id} {}", kind.as_str())),
            Action::GenerationDone { id } => Some(format!("generation_done {id}")),
            Action::Done(_) => Some("done".into()),
        })
        .collect()
}

fn result(actions: Vec<Action>) -> RequestResult {
    actions
        .into_iter()
        .find_map(|a| match a {
            Action::Done(r) => Some(*r),
            _ => None,
        })
        .expect("the request ended")
}

fn sent(actions: &[Action]) -> Vec<ChatMessage> {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Send(req) => Some(req.messages.clone()),
            _ => None,
        })
        .expect("a request was sent")
}

fn failed(r: &RequestResult) -> (FailReason, String) {
    match &r.outcome {
        Outcome::Failed { reason, detail } => (reason.clone(), detail.clone()),
        other => panic!("expected a failure, got {other:?}"),
    }
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";

/// The head and llama-server's first event (the role), which it sends once the prompt is
/// processed: the head alone comes at once, before the prefill.
fn answered() -> Vec<u8> {
    [
        HEAD,
        &data(json!({"role": "assistant", "content": null}), None, 0),
    ]
    .concat()
}

fn data(delta: Value, finish: Option<&str>, cache_n: u64) -> Vec<u8> {
    let v = json!({
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1, "id": "chatcmpl-a", "model": "smollm2",
        "object": "chat.completion.chunk",
        "timings": {"cache_n": cache_n, "prompt_n": 10, "predicted_n": 3}
    });
    format!("data: {v}\n\n").into_bytes()
}

/// A whole response: the head, `text` as content, and the final chunk.
fn answer(text: &str) -> Vec<u8> {
    [
        HEAD,
        &data(json!({ "content": text }), None, 0),
        &data(json!({}), Some("stop"), 0),
        b"data: [DONE]\n\n",
    ]
    .concat()
}

/// A whole response asking for `calls` (id, name, arguments).
fn calls(list: &[(&str, &str, &str)], cache_n: u64) -> Vec<u8> {
    let deltas = tool_call_deltas(list);
    [
        HEAD,
        &data(json!({ "tool_calls": deltas }), None, cache_n),
        &data(json!({}), Some("tool_calls"), cache_n),
        b"data: [DONE]\n\n",
    ]
    .concat()
}

/// Sends the pending request at `at` and feeds it `bytes` at once. The generation ends at its
/// `finish_reason` chunk, so the stream's `[DONE]` after it is left unread (the driver closes
/// the connection); everything before it is consumed.
fn respond(m: &mut AgentRequest<'_>, at: u64, bytes: &[u8]) -> Vec<Action> {
    m.handle_acquired(ms(at), Ok(false));
    m.handle_sent(ms(at));
    let used = m.handle_bytes(ms(at), bytes);
    assert!(
        matches!(&bytes[used..], b"" | b"data: [DONE]\n\n"),
        "left unread: {:?}",
        String::from_utf8_lossy(&bytes[used..])
    );
    drain(m)
}

#[test]
fn a_batch_of_three_calls_is_one_iteration_run_in_order_one_at_a_time() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    let first = drain(&mut m);
    assert_eq!(kinds(&first), ["acquire", "send"]);
    assert_eq!(
        sent(&first)[0],
        ChatMessage::System {
            content: "BIOS of 2 iterations".into()
        }
    );
    let batch = calls(
        &[
            ("a", "echo", r#"{"n":1}"#),
            ("b", "other", "{}"),
            ("c", "echo", r#"{"n":3}"#),
        ],
        0,
    );
    let a = respond(&mut m, 40, &batch);
    assert_eq!(kinds(&a), ["close", "tool echo"]);
    m.handle_tool_result(ms(50), "a", Ok("one".into()));
    assert_eq!(kinds(&drain(&mut m)), ["tool other"]);
    // A late or unknown result changes nothing.
    m.handle_tool_result(ms(55), "zzz", Ok("?".into()));
    assert!(drain(&mut m).is_empty());
    m.handle_tool_result(ms(60), "b", Ok("two".into()));
    assert_eq!(kinds(&drain(&mut m)), ["tool echo"]);
    m.handle_tool_result(ms(70), "c", Ok("three".into()));
    let next = drain(&mut m);
    assert_eq!(kinds(&next), ["acquire"]);
    assert!(next.iter().any(|a| matches!(
        a,
        Action::Event(RequestEvent::Iteration {
            number: 1,
            budget_left: 1
        })
    )));
    m.handle_acquired(ms(70), Ok(false));
    let next = drain(&mut m);
    assert_eq!(kinds(&next), ["send"]);
    let msgs = sent(&next);
    let tail: Vec<&ChatMessage> = msgs.iter().skip(2).collect();
    assert_eq!(tail.len(), 4, "one assistant message and three results");
    assert!(
        matches!(tail[0], ChatMessage::Assistant(AssistantMessage { tool_calls, .. }) if tool_calls.len() == 3)
    );
    let results: Vec<&str> = tail[1..]
        .iter()
        .map(|m| match m {
            ChatMessage::Tool { content, .. } => content.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(results[..2], ["one", "two"]);
    assert!(results[2].starts_with("three"), "{}", results[2]);
    let r = result(respond(&mut m, 100, &answer("done")));
    assert_eq!(r.outcome.fail_reason(), None);
    assert_eq!((r.budget, r.budget_left, r.tool_calls.len()), (2, 1, 3));
    assert_eq!(r.content.as_deref(), Some("done"));
    let elapsed: Vec<Duration> = r.generations.iter().map(|g| g.elapsed).collect();
    assert_eq!(
        elapsed,
        [ms(40), ms(30)],
        "send to end, on the machine's time"
    );
}

#[test]
fn an_exit_tool_is_recorded_never_run_and_costs_no_budget() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(Some(0)), None);
    drain(&mut m);
    let r = result(respond(
        &mut m,
        10,
        &calls(&[("x", "signal", r#"{"why":"done"}"#)], 0),
    ));
    assert_eq!(r.outcome.fail_reason(), None, "{:?}", r.outcome);
    assert_eq!(r.exits.len(), 1);
    assert_eq!(r.exits[0].call.name, "signal");
    assert_eq!((r.budget_left, r.tool_calls.len()), (0, 0));
}

#[test]
fn budget_zero_and_another_call_is_tool_execution_error_with_output_kept() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(Some(0)), None);
    drain(&mut m);
    let r = result(respond(&mut m, 10, &calls(&[("a", "echo", "{}")], 0)));
    assert_eq!(
        failed(&r),
        (
            FailReason::ToolExecutionError,
            "tool iteration budget exhausted".into()
        )
    );
    assert!(
        matches!(&r.transcript[0], ChatMessage::Assistant(AssistantMessage { tool_calls, .. }) if tool_calls.len() == 1)
    );
}

#[test]
fn bad_arguments_and_unknown_tools_fail_without_running_anything() {
    for (name, args, want) in [
        ("echo", "not json", "bad arguments: not JSON"),
        ("echo", "[1]", "bad arguments: not a JSON object"),
        ("nothing", "{}", "failed: no tool named `nothing`"),
        // Numbers no reader takes, by the rule of the text-call parser: past f64's range
        // (serde_json refuses it) and longer than its cap.
        (
            "echo",
            r#"{"n": 1e400}"#,
            "bad arguments: not JSON: JSON number at byte 6 is out of range",
        ),
        (
            "echo",
            &format!(r#"{{"n": 1{}}}"#, "0".repeat(64)),
            "bad arguments: not JSON: JSON number at byte 6 is longer than 64 bytes",
        ),
    ] {
        let mut b = Buffers::new();
        let s = settings(false);
        let mut m = machine(&mut b, &s, ask(None), None);
        drain(&mut m);
        let out = respond(&mut m, 10, &calls(&[("a", name, args)], 0));
        assert!(!kinds(&out).iter().any(|k| k.starts_with("tool")), "{name}");
        let (reason, detail) = failed(&result(out));
        assert_eq!(reason, FailReason::ToolExecutionError);
        assert!(detail.contains(want), "{detail}");
    }
}

#[test]
fn a_call_written_as_text_runs_and_one_that_does_not_parse_is_tool_parse_error() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    let text = r#"Let me see. <tool_call>{"name": "echo", "arguments": {"n": 1}}</tool_call>"#;
    let out = respond(&mut m, 10, &answer(text));
    let run = out.iter().find_map(|a| match a {
        Action::RunTool { id, arguments, .. } => Some((id.clone(), arguments.clone())),
        _ => None,
    });
    assert_eq!(run, Some(("text-1-0".into(), json!({"n": 1}))));

    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    let r = result(respond(
        &mut m,
        10,
        &answer("<tool_call>{\"name\": </tool_call>"),
    ));
    assert_eq!(failed(&r).0, FailReason::ToolParseError);

    // A number past f64's range: the call is refused before anything runs, and no next
    // generation carries it back to the server.
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    let text = r#"<tool_call>{"name": "echo", "arguments": {"n": 1e400}}</tool_call>"#;
    let out = respond(&mut m, 10, &answer(text));
    assert!(
        !kinds(&out).iter().any(|k| k.starts_with("tool")),
        "{out:?}"
    );
    let (reason, detail) = failed(&result(out));
    assert_eq!(reason, FailReason::ToolParseError);
    assert_eq!(
        detail,
        "<tool_call> block at byte 0: tool_call JSON number at byte 47 is out of range \
         (it rounds to f64::MAX or beyond)"
    );
}

#[test]
fn a_repeated_line_closes_the_stream_with_loop_detected_and_the_output_kept() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(5), HEAD);
    let line = "This line is thirty-eight bytes long!\n";
    let mut out = Vec::new();
    for k in 0..20 {
        m.handle_bytes(ms(10 + k), &data(json!({ "content": line }), None, 0));
        out.extend(drain(&mut m));
        if m.is_done() {
            break;
        }
    }
    assert_eq!(kinds(&out), ["close", "done"]);
    let r = result(out);
    assert_eq!(failed(&r).0, FailReason::LoopDetected);
    assert_eq!(
        r.content.as_deref().map(|c| c.matches(line).count()),
        Some(8)
    );
    assert_eq!(
        r.generations[0].elapsed,
        ms(17),
        "the 8th repeat came at 17 ms"
    );
}

#[test]
fn a_tool_that_ignores_its_cancel_is_given_up_at_its_deadline_to_the_millisecond() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    let out = respond(&mut m, 1_000, &calls(&[("a", "echo", "{}")], 0));
    assert_eq!(kinds(&out), ["close", "tool echo"]);
    assert_eq!(
        m.poll_timeout(),
        Some(ms(1_500)),
        "tool_timeout_ms after the start"
    );
    m.handle_timeout(ms(1_499));
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(ms(1_500));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["cancel a", "done"]);
    let (reason, detail) = failed(&result(out));
    assert_eq!(reason, FailReason::ToolExecutionError);
    assert_eq!(
        detail,
        "tool `echo` (call a) timed out after 500 ms (runner.tool_timeout_ms)"
    );
    // The tool's answer, whenever it comes, changes nothing.
    m.handle_tool_result(ms(9_000), "a", Ok("late".into()));
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.poll_timeout(), None);
}

#[test]
fn cancel_while_streaming_and_while_a_tool_runs() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(5), HEAD);
    m.handle_bytes(ms(6), &data(json!({"content": "partial"}), None, 0));
    drain(&mut m);
    m.cancel(ms(7));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "done"]);
    let r = result(out);
    assert_eq!(
        failed(&r),
        (FailReason::Cancelled, "cancelled by the caller".into())
    );
    assert_eq!(r.content.as_deref(), Some("partial"));

    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    respond(&mut m, 10, &calls(&[("a", "echo", "{}")], 0));
    m.cancel(ms(20));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["cancel a", "done"]);
    assert_eq!(failed(&result(out)).0, FailReason::Cancelled);
}

#[test]
fn a_disconnect_mid_stream_without_a_worker_is_the_clients_error_with_the_partial() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(5), HEAD);
    m.handle_bytes(ms(6), &data(json!({"content": "half"}), None, 0));
    m.handle_eof(ms(8));
    let r = result(drain(&mut m));
    assert_eq!(
        failed(&r).0,
        FailReason::Client(InferError::StreamClosedEarly)
    );
    assert_eq!(r.content.as_deref(), Some("half"));
}

#[test]
fn silence_is_reported_as_a_stall_every_stall_ms_and_a_restart_ends_the_request() {
    let mut b = Buffers::new();
    let s = settings(true);
    let mut m = machine(&mut b, &s, ask(None), Some(3));
    drain(&mut m);
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(20), HEAD);
    m.handle_bytes(ms(30), &data(json!({"content": "a"}), None, 0));
    drain(&mut m);
    // Progress at 30 ms: the report is due at 180 ms.
    assert_eq!(m.poll_timeout(), Some(ms(180)));
    m.handle_timeout(ms(179));
    assert!(drain(&mut m).is_empty());
    m.handle_timeout(ms(180));
    assert_eq!(kinds(&drain(&mut m)), ["stall"]);
    let not = StallAnswer::NotStalled {
        since_progress_ms: 2,
    };
    m.handle_stall_answer(ms(181), Ok(not));
    drain(&mut m);
    assert_eq!(
        m.poll_timeout(),
        Some(ms(330)),
        "one stall_ms after the report"
    );
    m.handle_timeout(ms(330));
    assert_eq!(kinds(&drain(&mut m)), ["stall"]);
    m.handle_stall_answer(ms(331), Ok(StallAnswer::Restarting));
    let r = result(drain(&mut m));
    assert_eq!(failed(&r).0, FailReason::WorkerRestarted);
    assert_eq!(r.stalls, [not, StallAnswer::Restarting]);
    assert_eq!(r.content.as_deref(), Some("a"));
}

fn status(state: WorkerState, spawns: u64, cause: Option<&str>) -> WorkerStatus {
    WorkerStatus {
        state,
        spawns,
        last_cause: cause.map(str::to_owned),
        reason: None,
    }
}

#[test]
fn the_worker_is_read_every_worker_poll_ms_and_a_restart_or_death_fails_the_request() {
    let cases = [
        (
            status(WorkerState::Ready, 4, Some("stall")),
            FailReason::WorkerRestarted,
        ),
        (
            status(WorkerState::Restarting, 3, Some("exited")),
            FailReason::ServerDied,
        ),
        (
            status(WorkerState::Stopped, 3, None),
            FailReason::WorkerStopped,
        ),
    ];
    let s = RunnerConfig {
        worker_poll_ms: 100,
        stall_ms: 10_000,
        ..settings(true)
    };
    for (st, want) in cases {
        let mut b = Buffers::new();
        let mut m = machine(&mut b, &s, ask(None), Some(3));
        drain(&mut m);
        m.handle_acquired(ms(0), Ok(false));
        m.handle_sent(ms(0));
        m.handle_bytes(ms(10), HEAD);
        m.handle_bytes(ms(50), &data(json!({"content": "b"}), None, 0));
        drain(&mut m);
        assert_eq!(
            m.poll_timeout(),
            Some(ms(100)),
            "worker_poll_ms after the start"
        );
        m.handle_timeout(ms(100));
        assert_eq!(kinds(&drain(&mut m)), ["status"]);
        assert_eq!(
            m.poll_timeout(),
            Some(ms(450)),
            "only liveness while the read is out"
        );
        m.handle_worker_status(ms(101), Ok(status(WorkerState::Ready, 3, None)));
        assert!(drain(&mut m).is_empty(), "the same server, still ready");
        assert_eq!(m.poll_timeout(), Some(ms(201)));
        m.handle_bytes(ms(150), &data(json!({"content": "c"}), None, 0));
        drain(&mut m);
        m.handle_timeout(ms(201));
        assert_eq!(kinds(&drain(&mut m)), ["status"]);
        m.handle_worker_status(ms(202), Ok(st.clone()));
        let out = drain(&mut m);
        assert_eq!(kinds(&out), ["close", "done"], "{st:?}");
        let r = result(out);
        assert_eq!(failed(&r).0, want, "{st:?}");
        assert_eq!(r.content.as_deref(), Some("bc"));
    }
}

#[test]
fn a_silent_server_the_client_gives_up_on_is_reported_then_the_worker_is_asked() {
    let mut b = Buffers::new();
    let s = settings(true);
    let mut m = machine(&mut b, &s, ask(None), Some(1));
    drain(&mut m);
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(10), &answered());
    drain(&mut m);
    // Liveness 400 ms after the last byte; the stall report (150 ms) comes first.
    m.handle_timeout(ms(160));
    assert_eq!(kinds(&drain(&mut m)), ["stall"]);
    m.handle_stall_answer(ms(161), Ok(StallAnswer::NotReady));
    m.handle_timeout(ms(410));
    let out = drain(&mut m);
    assert_eq!(
        kinds(&out),
        ["close", "stall"],
        "the client's stall is reported too"
    );
    m.handle_stall_answer(
        ms(411),
        Ok(StallAnswer::NotStalled {
            since_progress_ms: 1,
        }),
    );
    assert_eq!(kinds(&drain(&mut m)), ["status"]);
    m.handle_worker_status(ms(412), Ok(status(WorkerState::Ready, 1, None)));
    let r = result(drain(&mut m));
    assert_eq!(
        failed(&r).0,
        FailReason::Client(InferError::Stalled(Silence::Liveness))
    );
}

#[test]
fn the_first_byte_wait_polls_slots_on_the_machines_time() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, ask(None), None);
    drain(&mut m);
    m.handle_acquired(ms(5), Ok(false));
    m.handle_sent(ms(5));
    assert_eq!(
        m.poll_timeout(),
        Some(ms(105)),
        "limits.poll_ms after the send"
    );
    m.handle_timeout(ms(105));
    assert_eq!(kinds(&drain(&mut m)), ["slots"]);
    m.handle_slots(ms(106), SlotSeen::Busy);
    let out = drain(&mut m);
    assert!(matches!(
        out.as_slice(),
        [Action::Event(RequestEvent::Chat(
            loopd_client::llama::ChatEvent::Waiting { slot_busy: true }
        ))]
    ));
    assert_eq!(m.poll_timeout(), Some(ms(206)));
}

#[test]
fn the_request_offers_only_its_chosen_tools_and_refuses_a_call_to_another() {
    let chosen = |names: &[&str]| Submission {
        tools: Some(names.iter().map(|n| n.to_string()).collect()),
        ..ask(None)
    };
    let offered = |actions: &[Action]| -> Vec<String> {
        actions
            .iter()
            .find_map(|a| match a {
                Action::Send(req) => Some(req.tools.iter().map(|t| t.name.clone()).collect()),
                _ => None,
            })
            .expect("a request was sent")
    };
    let s = settings(false);
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, ask(None), None);
    assert_eq!(offered(&drain(&mut m)), ["echo", "other", "signal"]);
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, chosen(&[]), None);
    assert!(offered(&drain(&mut m)).is_empty());
    // A chosen tool runs; the next generation still offers only the chosen ones.
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, chosen(&["other", "echo"]), None);
    assert_eq!(offered(&drain(&mut m)), ["echo", "other"]);
    let out = respond(&mut m, 10, &calls(&[("a", "echo", "{}")], 0));
    assert_eq!(kinds(&out), ["close", "tool echo"]);
    m.handle_tool_result(ms(20), "a", Ok("one".into()));
    m.handle_acquired(ms(20), Ok(false));
    assert_eq!(offered(&drain(&mut m)), ["echo", "other"]);
    // A call to a tool not chosen, an exit tool included, is refused as an unknown one.
    for name in ["other", "signal"] {
        let mut b = Buffers::new();
        let mut m = machine(&mut b, &s, chosen(&["echo"]), None);
        assert_eq!(offered(&drain(&mut m)), ["echo"]);
        let out = respond(&mut m, 10, &calls(&[("a", name, "{}")], 0));
        assert!(!kinds(&out).iter().any(|k| k.starts_with("tool")), "{name}");
        let r = result(out);
        assert!(r.exits.is_empty(), "{name}: {:?}", r.exits);
        assert_eq!(
            failed(&r),
            (
                FailReason::ToolExecutionError,
                format!("tool `{name}` (call a) failed: no tool named `{name}`")
            ),
            "{name}"
        );
    }
}

/// A machine with a worker socket whose first generation the worker registered as `id` at
/// 2 ms, sent at 3 ms.
fn registered<'b>(b: &'b mut Buffers, s: &RunnerConfig, id: u64) -> AgentRequest<'b> {
    let mut m = machine(b, s, ask(None), Some(3));
    assert_eq!(
        kinds(&drain(&mut m)),
        ["acquire", "register"],
        "the slot taken, then registered before it is sent"
    );
    m.handle_registered(ms(2), Ok(RegisterAnswer::Registered(id)));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    m.handle_acquired(ms(3), Ok(false));
    m.handle_sent(ms(3));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m
}

#[test]
fn a_generation_is_registered_its_first_byte_and_then_bytes_each_second_reported_then_done() {
    let mut b = Buffers::new();
    let s = RunnerConfig {
        stall_ms: 10_000,
        worker_poll_ms: 60_000,
        ..settings(true)
    };
    let mut m = registered(&mut b, &s, 9);
    m.handle_bytes(ms(50), HEAD);
    assert_eq!(
        kinds(&drain(&mut m)),
        Vec::<String>::new(),
        "the head is no progress: the worker judges the prefill by CPU time"
    );
    m.handle_bytes(ms(100), &answered()[HEAD.len()..]);
    assert_eq!(kinds(&drain(&mut m)), ["progress 9 first_byte"]);
    let mut at = Vec::new();
    for (t, text) in [
        (400, "a"),
        (700, "b"),
        (1_099, "c"),
        (1_100, "d"),
        (1_400, "e"),
    ] {
        m.handle_bytes(ms(t), &data(json!({ "content": text }), None, 0));
        if !kinds(&drain(&mut m)).is_empty() {
            at.push(t);
        }
    }
    assert_eq!(
        at,
        [1_100],
        "bytes one PROGRESS_EVERY after the first byte's report"
    );
    assert_eq!(loopd_agent::runner::PROGRESS_EVERY, ms(1_000));
    let end = [&data(json!({}), Some("stop"), 0)[..], b"data: [DONE]\n\n"].concat();
    m.handle_bytes(ms(1_500), &end);
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "generation_done 9", "done"]);
    assert_eq!(result(out).content.as_deref(), Some("abcde"));
}

#[test]
fn the_clients_stall_is_reported_as_stall_of_the_generation_before_it_is_unregistered() {
    let mut b = Buffers::new();
    let s = settings(true);
    let mut m = registered(&mut b, &s, 4);
    m.handle_bytes(ms(10), &answered());
    assert_eq!(kinds(&drain(&mut m)), ["progress 4 first_byte"]);
    // stall_ms (150) after the send (3), then liveness (400) after the last byte.
    m.handle_timeout(ms(152));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m.handle_timeout(ms(153));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    m.handle_stall_answer(ms(153), Ok(StallAnswer::NotReady));
    m.handle_timeout(ms(303));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    m.handle_stall_answer(ms(303), Ok(StallAnswer::NotReady));
    // The stream's liveness puts the silence to the worker; the connection stays open.
    m.handle_timeout(ms(409));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m.handle_timeout(ms(410));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    // A worker that is not ready has no word on the server: the client's own verdict stands.
    m.handle_stall_answer(ms(411), Ok(StallAnswer::NotReady));
    assert_eq!(
        kinds(&drain(&mut m)),
        ["close", "generation_done 4", "status"]
    );
    m.handle_worker_status(ms(412), Ok(status(WorkerState::Ready, 3, None)));
    let r = result(drain(&mut m));
    assert_eq!(
        failed(&r).0,
        FailReason::Client(InferError::Stalled(Silence::Liveness))
    );
}

/// A slow box, shape b: a tool call's opening is generated but not streamed (the server's parser
/// holds it back), so on a slow box the stream is silent past liveness while its slot decodes.
/// The worker, which reads the slot's decoded tokens, says `not_stalled`, and the stream goes
/// on; its bytes then finish the request, with no retry.
#[test]
fn a_silent_stream_the_worker_calls_alive_goes_on_and_completes() {
    let mut b = Buffers::new();
    let s = settings(true);
    let mut m = registered(&mut b, &s, 4);
    m.handle_bytes(ms(10), &answered());
    assert_eq!(kinds(&drain(&mut m)), ["progress 4 first_byte"]);
    m.handle_timeout(ms(153));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    let alive = || {
        Ok(StallAnswer::NotStalled {
            since_progress_ms: 20,
        })
    };
    m.handle_stall_answer(ms(154), alive());
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    // The next periodic report (stall_ms after the last, 304) is out when liveness (410)
    // comes: its answer is the verdict, and no second report is sent.
    m.handle_timeout(ms(304));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    m.handle_timeout(ms(410));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m.handle_timeout(ms(411));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m.handle_stall_answer(ms(412), alive());
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    // Liveness runs again from the verdict: 412 + 400. The periodic report is due at 562.
    m.handle_timeout(ms(562));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    m.handle_stall_answer(ms(563), alive());
    m.handle_timeout(ms(712));
    assert_eq!(kinds(&drain(&mut m)), ["stall 4"]);
    m.handle_stall_answer(ms(713), alive());
    m.handle_timeout(ms(811));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    // The call's text arrives (less than PROGRESS_EVERY after the first byte's report: not
    // reported), then the end.
    m.handle_bytes(ms(811), &data(json!({ "content": " there" }), None, 0));
    let end = [&data(json!({}), Some("stop"), 0)[..], b"data: [DONE]\n\n"].concat();
    m.handle_bytes(ms(812), &end);
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "generation_done 4", "done"]);
    let r = result(out);
    assert_eq!(r.content.as_deref(), Some(" there"));
    assert!(r.retries.is_empty(), "{:?}", r.retries);
    assert_eq!(r.stalls.len(), 4);
}

#[test]
fn a_failure_pushed_for_the_generation_ends_the_request_at_once_with_its_output() {
    let cases = [
        (
            WorkerFailReason::WorkerRestarted,
            FailReason::WorkerRestarted,
        ),
        (WorkerFailReason::ServerDied, FailReason::ServerDied),
        (WorkerFailReason::WorkerStopped, FailReason::WorkerStopped),
    ];
    for (pushed, want) in cases {
        let mut b = Buffers::new();
        let s = settings(true);
        let mut m = registered(&mut b, &s, 5);
        m.handle_bytes(ms(10), HEAD);
        m.handle_bytes(ms(20), &data(json!({"content": "part"}), None, 0));
        drain(&mut m);
        m.handle_worker_failed(ms(30), 6, pushed);
        assert_eq!(
            kinds(&drain(&mut m)),
            Vec::<String>::new(),
            "another generation's"
        );
        m.handle_worker_failed(ms(31), 5, pushed);
        let out = drain(&mut m);
        assert_eq!(
            kinds(&out),
            ["close", "done"],
            "the worker forgot it: no done <id>"
        );
        let r = result(out);
        let (reason, detail) = failed(&r);
        assert_eq!(reason, want);
        assert!(
            detail.ends_with("(generation 5, pushed on the watch)"),
            "{detail}"
        );
        assert_eq!(r.content.as_deref(), Some("part"));
        assert_eq!(r.generations[0].elapsed, ms(31));
    }
}

#[test]
fn a_refused_registration_sends_nothing_and_one_unanswered_sends_unregistered() {
    for (state, want) in [
        (WorkerState::Restarting, FailReason::WorkerRestarted),
        (WorkerState::Stopped, FailReason::WorkerStopped),
    ] {
        let mut b = Buffers::new();
        let s = settings(true);
        let mut m = machine(&mut b, &s, ask(None), Some(3));
        drain(&mut m);
        m.handle_registered(ms(1), Ok(RegisterAnswer::Refused(state)));
        let out = drain(&mut m);
        // The slot's permit goes back unused.
        assert_eq!(kinds(&out), ["close", "done"]);
        let r = result(out);
        assert_eq!(failed(&r).0, want);
        assert!(r.generations.is_empty(), "nothing was sent");
    }
    let mut b = Buffers::new();
    let s = settings(true);
    let mut m = machine(&mut b, &s, ask(None), Some(3));
    drain(&mut m);
    let silent = WorkerError::Io(std::io::ErrorKind::TimedOut.into());
    m.handle_registered(ms(1), Err(silent));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    m.handle_acquired(ms(2), Ok(false));
    m.handle_sent(ms(2));
    m.handle_bytes(ms(10), &answered());
    assert_eq!(
        kinds(&drain(&mut m)),
        Vec::<String>::new(),
        "no progress unregistered"
    );
    // stall_ms (150) after the send.
    m.handle_timeout(ms(151));
    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
    m.handle_timeout(ms(152));
    assert_eq!(kinds(&drain(&mut m)), ["stall"], "a bare stall");
}

#[test]
fn a_silent_prefill_is_the_workers_to_judge_at_idle_grace_ms() {
    let s = RunnerConfig {
        stall_ms: 60_000,
        worker_poll_ms: 60_000,
        ..settings(true)
    };
    let mut limits = config().limits;
    limits.idle_grace_ms = 250;
    let tools = tools();
    let not = StallAnswer::NotStalled {
        since_progress_ms: 3,
    };
    let answers: [(StallAnswer, &[&str]); 3] = [
        (not, &[]),
        (
            StallAnswer::NotReady,
            &["close", "generation_done 4", "status"],
        ),
        (
            StallAnswer::Restarting,
            &["close", "generation_done 4", "done"],
        ),
    ];
    for (verdict, then) in answers {
        let mut b = Buffers::new();
        let setup = Setup {
            id: RequestId(7),
            slot: 1,
            limits,
            settings: &s,
            tools: &tools,
            bios: Arc::new(Fixed),
            spawns: Some(3),
            retry: Retry::once(),
            jitter: Arc::new(FakeJitter::new(&[])),
        };
        let mut m = AgentRequest::new(Duration::ZERO, setup, ask(None), b.storage());
        m.handle_acquired(ms(1), Ok(false));
        drain(&mut m);
        m.handle_registered(ms(2), Ok(RegisterAnswer::Registered(4)));
        drain(&mut m);
        m.handle_sent(ms(3));
        // `/slots` every poll_ms (100) says idle; idle_grace_ms (250) is up at the third.
        for at in [103, 204, 305] {
            assert_eq!(m.poll_timeout(), Some(ms(at)));
            m.handle_timeout(ms(at));
            assert_eq!(kinds(&drain(&mut m)), ["slots"]);
            m.handle_slots(ms(at + 1), SlotSeen::Idle);
            let want: &[&str] = if at == 305 { &["stall 4"] } else { &[] };
            assert_eq!(kinds(&drain(&mut m)), want, "{at}");
        }
        assert_eq!(
            m.poll_timeout(),
            Some(ms(60_000)),
            "no timer but the status poll"
        );
        m.handle_stall_answer(ms(310), Ok(verdict));
        let out = drain(&mut m);
        assert_eq!(kinds(&out), then, "{verdict:?}");
        match verdict {
            StallAnswer::NotStalled { .. } => {
                assert_eq!(m.poll_timeout(), Some(ms(410)), "the wait starts over");
                answers_late(&mut m, 500, &answer("late"));
            }
            StallAnswer::NotReady => {
                m.handle_worker_status(ms(311), Ok(status(WorkerState::Ready, 3, None)));
                let r = result(drain(&mut m));
                assert_eq!(
                    failed(&r).0,
                    FailReason::Client(InferError::Stalled(Silence::IdleGrace))
                );
                assert_eq!(r.stalls, [StallAnswer::NotReady], "reported once");
            }
            StallAnswer::Restarting => {
                let (reason, detail) = failed(&result(out));
                assert_eq!(reason, FailReason::WorkerRestarted);
                assert!(detail.contains("limits.idle_grace_ms"), "{detail}");
            }
        }
    }
}

/// After a `not_stalled`, registered generation 4 answers "late" at `at`, whole in one read:
/// its events go out first, and it is over before a first byte would be reported, so the
/// worker hears only that it is done.
fn answers_late(m: &mut AgentRequest<'_>, at: u64, bytes: &[u8]) {
    let r = respond_more(m, at, bytes);
    assert_eq!(r.0, ["close", "generation_done 4", "done"]);
    assert_eq!(r.1.content.as_deref(), Some("late"));
}

/// Feeds `bytes` at `at` to a request already sent: the action kinds and its result.
fn respond_more(m: &mut AgentRequest<'_>, at: u64, bytes: &[u8]) -> (Vec<String>, RequestResult) {
    let used = m.handle_bytes(ms(at), bytes);
    // As in `respond`: only the `[DONE]` after the finish_reason chunk may be left unread.
    assert!(matches!(&bytes[used..], b"" | b"data: [DONE]\n\n"));
    let out = drain(m);
    (kinds(&out), result(out))
}

#[test]
fn a_generation_that_broke_off_waits_death_grace_ms_for_the_worker_to_explain_it() {
    let s = RunnerConfig {
        stall_ms: 60_000,
        death_grace_ms: 2_500,
        ..settings(true)
    };
    for pushed in [true, false] {
        let mut b = Buffers::new();
        let mut m = registered(&mut b, &s, 5);
        m.handle_bytes(ms(10), HEAD);
        m.handle_bytes(ms(20), &data(json!({"content": "part"}), None, 0));
        drain(&mut m);
        m.handle_eof(ms(30));
        assert_eq!(
            kinds(&drain(&mut m)),
            ["close", "status"],
            "still registered"
        );
        m.handle_worker_status(ms(31), Ok(status(WorkerState::Ready, 3, None)));
        assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
        assert_eq!(m.poll_timeout(), Some(ms(1_031)), "the next status poll");
        if pushed {
            m.handle_worker_failed(ms(900), 5, WorkerFailReason::ServerDied);
            let out = drain(&mut m);
            assert_eq!(kinds(&out), ["done"]);
            let r = result(out);
            assert_eq!(failed(&r).0, FailReason::ServerDied);
            assert_eq!(r.content.as_deref(), Some("part"));
            continue;
        }
        for at in [1_031, 2_031] {
            m.handle_timeout(ms(at));
            assert_eq!(kinds(&drain(&mut m)), ["status"]);
            m.handle_worker_status(ms(at), Ok(status(WorkerState::Ready, 3, None)));
            assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new(), "{at}");
        }
        m.handle_timeout(ms(3_031));
        assert_eq!(kinds(&drain(&mut m)), ["status"]);
        m.handle_worker_status(ms(3_031), Ok(status(WorkerState::Ready, 3, None)));
        let out = drain(&mut m);
        assert_eq!(kinds(&out), ["generation_done 5", "done"], "past 2,530 ms");
        let r = result(out);
        assert_eq!(
            failed(&r).0,
            FailReason::Client(InferError::StreamClosedEarly)
        );
    }
}

/// M2a section 4 reconciled with seed 003 I: a generation that broke off is tried again when
/// the worker says its server is the one the request was admitted under and ready; a restart
/// or a death the worker reports (pushed, or on the status poll) ends the request with its
/// output, never retried.
#[test]
fn a_broken_off_generation_is_retried_unless_the_worker_says_the_server_went_away() {
    let s = RunnerConfig {
        stall_ms: 60_000,
        death_grace_ms: 2_500,
        ..settings(true)
    };
    for case in ["ready", "pushed", "died"] {
        let mut b = Buffers::new();
        let mut m = retrying(&mut b, &s, ask(None), Some(3), Retry::default());
        assert_eq!(kinds(&drain(&mut m)), ["acquire"]);
        m.handle_acquired(ms(1), Ok(false));
        assert_eq!(kinds(&drain(&mut m)), ["register"]);
        m.handle_registered(ms(2), Ok(RegisterAnswer::Registered(5)));
        assert_eq!(kinds(&drain(&mut m)), ["send"]);
        m.handle_sent(ms(3));
        m.handle_bytes(ms(10), HEAD);
        m.handle_bytes(ms(20), &data(json!({"content": "lost"}), None, 0));
        drain(&mut m);
        m.handle_eof(ms(30));
        assert_eq!(kinds(&drain(&mut m)), ["close", "status"], "{case}");
        match case {
            "pushed" => {
                m.handle_worker_failed(ms(900), 5, WorkerFailReason::WorkerRestarted);
                let r = result(drain(&mut m));
                assert_eq!(failed(&r).0, FailReason::WorkerRestarted);
                assert_eq!((r.retries.len(), r.content.as_deref()), (0, Some("lost")));
            }
            "died" => {
                let died = status(WorkerState::Restarting, 4, Some("exited"));
                m.handle_worker_status(ms(31), Ok(died));
                let out = drain(&mut m);
                assert_eq!(kinds(&out), ["generation_done 5", "done"]);
                let r = result(out);
                assert_eq!(failed(&r).0, FailReason::ServerDied);
                assert_eq!((r.retries.len(), r.content.as_deref()), (0, Some("lost")));
            }
            _ => {
                for at in [31, 1_031, 2_031] {
                    if at > 31 {
                        m.handle_timeout(ms(at));
                        assert_eq!(kinds(&drain(&mut m)), ["status"]);
                    }
                    m.handle_worker_status(ms(at), Ok(status(WorkerState::Ready, 3, None)));
                    assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new(), "{at}");
                }
                m.handle_timeout(ms(3_031));
                assert_eq!(kinds(&drain(&mut m)), ["status"]);
                m.handle_worker_status(ms(3_031), Ok(status(WorkerState::Ready, 3, None)));
                // Past death_grace_ms with the same server: unregistered, then retried.
                let out = drain(&mut m);
                assert_eq!(kinds(&out), ["generation_done 5"]);
                let said: Vec<(u32, u64)> = out
                    .iter()
                    .filter_map(|a| match a {
                        Action::Event(RequestEvent::Chat(ChatEvent::Retrying {
                            attempt,
                            after_ms,
                            ..
                        })) => Some((*attempt, *after_ms)),
                        _ => None,
                    })
                    .collect();
                assert_eq!(said, [(2, 2_000)]);
                // Back through the gate at 5,031 ms (the status poll comes due first).
                m.handle_timeout(ms(4_031));
                assert_eq!(kinds(&drain(&mut m)), ["status"]);
                m.handle_worker_status(ms(4_031), Ok(status(WorkerState::Ready, 3, None)));
                assert_eq!(m.poll_timeout(), Some(ms(5_031)));
                m.handle_timeout(ms(5_030));
                assert_eq!(kinds(&drain(&mut m)), Vec::<String>::new());
                m.handle_timeout(ms(5_031));
                // (The status poll falls due at the same millisecond.)
                assert_eq!(kinds(&drain(&mut m)), ["acquire", "status"]);
                m.handle_acquired(ms(5_032), Ok(false));
                assert_eq!(kinds(&drain(&mut m)), ["register"], "registered anew");
                m.handle_worker_status(ms(5_032), Ok(status(WorkerState::Ready, 3, None)));
                m.handle_registered(ms(5_033), Ok(RegisterAnswer::Registered(6)));
                let sent_again = drain(&mut m);
                assert_eq!(kinds(&sent_again), ["send"]);
                m.handle_sent(ms(5_034));
                let (k, r) = respond_more(&mut m, 5_040, &answer("whole"));
                assert_eq!(k, ["close", "generation_done 6", "done"]);
                assert_eq!(
                    r.outcome,
                    Outcome::Completed {
                        finish_reason: FinishReason::Stop
                    }
                );
                assert_eq!(r.content.as_deref(), Some("whole"));
                assert_eq!(
                    r.transcript,
                    [ChatMessage::Assistant(AssistantMessage {
                        content: Some("whole".into()),
                        reasoning_content: None,
                        tool_calls: vec![],
                    })],
                    "nothing of the dropped attempt"
                );
                assert_eq!((r.budget, r.budget_left, r.generations.len()), (2, 2, 1));
                assert_eq!(
                    r.retries,
                    [RetryRecord {
                        generation: 1,
                        attempt: 2,
                        after_ms: 2_000,
                        error: "stream_closed_early",
                        detail: "the stream ended before its last chunk".into(),
                    }]
                );
            }
        }
    }
}

#[test]
fn a_cancel_during_the_wait_before_a_retry_ends_the_request_cancelled_at_once() {
    let s = settings(false);
    let mut b = Buffers::new();
    let mut m = retrying(&mut b, &s, ask(None), None, Retry::default());
    drain(&mut m);
    let socket = "/run/infer.sock".into();
    let refused = std::io::ErrorKind::ConnectionRefused.into();
    m.handle_acquired(ms(1), Ok(false));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    m.handle_send_error(
        ms(2),
        InferError::Connect {
            socket,
            source: refused,
        },
    );
    assert_eq!(kinds(&drain(&mut m)), ["close"]);
    assert_eq!(m.poll_timeout(), Some(ms(2_002)));
    m.cancel(ms(500));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["done"]);
    let r = result(out);
    assert_eq!(failed(&r).0, FailReason::Cancelled);
    assert_eq!(r.retries.len(), 1, "the retry it was waiting for");
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::User {
        content: text.into(),
    }
}

fn assistant(text: &str) -> ChatMessage {
    ChatMessage::Assistant(AssistantMessage {
        content: Some(text.into()),
        reasoning_content: None,
        tool_calls: vec![],
    })
}

/// A turn of a session being compacted: a system message, two turns kept and the new one, with
/// thinking on and its own `max_tokens`; the two turns before them are summarized into
/// `messages[into]`.
fn compacting(into: usize) -> Submission {
    Submission {
        system: Some("Be brief.".into()),
        messages: vec![user("Hello."), assistant("Hi."), user("And now?")],
        options: ChatOptions {
            thinking: true,
            max_tokens: Some(500),
            sampling: None,
        },
        summarize: Some(Summarize {
            messages: vec![
                user("What is 2+2?"),
                assistant("4"),
                user("Summarize the conversation so far."),
            ],
            max_tokens: 64,
            into,
            prefix: "Earlier: ".into(),
        }),
        ..ask(None)
    }
}

/// The chat request sent.
fn request(actions: &[Action]) -> ChatRequest {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Send(req) => Some(req.clone()),
            _ => None,
        })
        .expect("a request was sent")
}

/// The request's events but the client's.
fn events(actions: &[Action]) -> Vec<RequestEvent> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(RequestEvent::Chat(_)) => None,
            Action::Event(e) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// The client's events that stream the answer: content, reasoning and call deltas.
fn streamed(actions: &[Action]) -> Vec<ChatEvent> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(RequestEvent::Chat(
                e @ (ChatEvent::Content(_)
                | ChatEvent::Reasoning(_)
                | ChatEvent::ToolCallDelta { .. }),
            )) => Some(e.clone()),
            _ => None,
        })
        .collect()
}

/// The first request of `req` as a machine without a worker sends it.
fn first_request(req: Submission) -> ChatRequest {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, req, None);
    request(&drain(&mut m))
}

#[test]
fn a_summary_generation_runs_first_and_its_text_opens_the_user_message_it_names() {
    let mut b = Buffers::new();
    let s = settings(false);
    let mut m = machine(&mut b, &s, compacting(2), None);
    let first = drain(&mut m);
    assert_eq!(kinds(&first), ["acquire", "send"]);
    assert_eq!(
        events(&first),
        [],
        "the summary generation is no Generation"
    );
    // Generation 1 of the same turn without a summary to write, its message as the summary
    // will leave it.
    let mut plain = compacting(2);
    plain.summarize = None;
    plain.messages[2] = user("Earlier: They asked 2+2; it is 4.\n\nAnd now?");
    let generation_1 = first_request(plain);
    assert_eq!(
        request(&first),
        ChatRequest {
            slot: 1,
            messages: vec![
                ChatMessage::System {
                    content: "BIOS of 2 iterations".into()
                },
                ChatMessage::System {
                    content: "Be brief.".into()
                },
                user("What is 2+2?"),
                assistant("4"),
                user("Summarize the conversation so far."),
            ],
            tools: generation_1.tools.clone(),
            options: ChatOptions {
                thinking: false,
                max_tokens: Some(64),
                sampling: None,
            },
        }
    );
    assert_eq!(
        generation_1.tools.len(),
        3,
        "the request's tools, all of them"
    );

    let out = respond(&mut m, 40, &answer("  They asked 2+2; it is 4.\n"));
    assert_eq!(kinds(&out), ["close", "acquire"]);
    assert_eq!(
        streamed(&out),
        [],
        "the summary is not streamed as the answer"
    );
    assert_eq!(
        events(&out),
        [
            RequestEvent::Summarized {
                summary: "They asked 2+2; it is 4.".into(),
                timings: Some(Timings {
                    cache_n: 0,
                    prompt_n: 10,
                    predicted_n: 3
                }),
            },
            RequestEvent::Generation {
                number: 1,
                budget_left: 2
            },
        ]
    );
    let out = respond(&mut m, 60, &answer("Still 4."));
    assert_eq!(kinds(&out), ["send", "close", "done"]);
    assert_eq!(
        request(&out),
        generation_1,
        "generation 1 as a request without a summary sends it"
    );
    assert_eq!(streamed(&out), [ChatEvent::Content("Still 4.".into())]);
    let r = result(out);
    assert_eq!(
        r.outcome,
        Outcome::Completed {
            finish_reason: FinishReason::Stop
        }
    );
    assert_eq!(r.content.as_deref(), Some("Still 4."));
    assert_eq!(r.transcript, [assistant("Still 4.")]);
    assert_eq!((r.budget, r.budget_left), (2, 2));
    assert_eq!(r.generations.len(), 1, "the summary is not one of them");
    let g = &r.generations[0];
    assert_eq!(g.cache, None, "judged against no earlier generation");
    assert_eq!(
        g.elapsed,
        ms(20),
        "from its own start, when the summary ended"
    );
    assert!(r.retries.is_empty() && r.stalls.is_empty());
}

#[test]
fn the_summarys_calls_are_never_run_and_an_empty_summary_is_written_as_no_summary() {
    let with_calls = [
        HEAD,
        &data(json!({"content": "Two turns."}), None, 0),
        &data(
            json!({ "tool_calls": tool_call_deltas(&[("a", "echo", "{}"), ("x", "signal", "{}")]) }),
            None,
            0,
        ),
        &data(json!({}), Some("tool_calls"), 0),
        b"data: [DONE]\n\n",
    ]
    .concat();
    for (bytes, summary) in [
        (with_calls, "Two turns."),
        (
            calls(&[("a", "echo", "{}"), ("x", "signal", "{}")], 0),
            "(no summary)",
        ),
        (answer(" \n "), "(no summary)"),
    ] {
        let mut b = Buffers::new();
        let s = settings(false);
        let mut m = machine(&mut b, &s, compacting(0), None);
        drain(&mut m);
        let out = respond(&mut m, 10, &bytes);
        assert_eq!(kinds(&out), ["close", "acquire"], "{summary}: nothing run");
        assert_eq!(
            events(&out)[0],
            RequestEvent::Summarized {
                summary: summary.into(),
                timings: Some(Timings {
                    cache_n: 0,
                    prompt_n: 10,
                    predicted_n: 3
                }),
            }
        );
        let out = respond(&mut m, 20, &answer("Go on."));
        assert_eq!(
            request(&out).messages[2..],
            [
                user(&format!("Earlier: {summary}\n\nHello.")),
                assistant("Hi."),
                user("And now?"),
            ]
        );
        let r = result(out);
        assert_eq!(r.outcome.fail_reason(), None, "{summary}");
        assert!(r.tool_calls.is_empty() && r.exits.is_empty(), "{summary}");
        assert_eq!(r.calls_not_run().count(), 0);
        assert_eq!(r.transcript, [assistant("Go on.")]);
        assert_eq!((r.generations.len(), r.budget_left), (1, 2));
    }
}

#[test]
fn a_summary_into_no_user_message_leaves_the_conversation_as_it_was() {
    // `into` names the assistant turn, then a message past the end.
    for into in [1, 3, 99] {
        let mut b = Buffers::new();
        let s = settings(false);
        let mut m = machine(&mut b, &s, compacting(into), None);
        drain(&mut m);
        let out = respond(&mut m, 10, &answer("Two turns."));
        assert!(
            matches!(&events(&out)[0], RequestEvent::Summarized { summary, .. } if summary == "Two turns."),
            "{into}"
        );
        let out = respond(&mut m, 20, &answer("Go on."));
        let mut plain = compacting(into);
        plain.summarize = None;
        assert_eq!(request(&out), first_request(plain), "{into}");
        assert_eq!(result(out).outcome.fail_reason(), None);
    }
}

/// Feeds the generation under way (no worker) what ends it, `case`: the stream closed
/// early, a line repeated until the loop detector fires, or a cancel mid-stream.
fn break_off(m: &mut AgentRequest<'_>, case: &str) -> Vec<Action> {
    m.handle_acquired(ms(0), Ok(false));
    m.handle_sent(ms(0));
    m.handle_bytes(ms(5), HEAD);
    m.handle_bytes(ms(6), &data(json!({"content": "half"}), None, 0));
    let mut out = drain(m);
    match case {
        "closed_early" => m.handle_eof(ms(8)),
        "cancel" => m.cancel(ms(8)),
        _ => {
            let line = "This line is thirty-eight bytes long!\n";
            for k in 0..20 {
                m.handle_bytes(ms(10 + k), &data(json!({ "content": line }), None, 0));
                if m.is_done() {
                    break;
                }
            }
        }
    }
    out.extend(drain(m));
    out
}

#[test]
fn a_summary_generation_that_fails_ends_the_request_as_generation_1_would_with_no_output() {
    for (case, want) in [
        (
            "closed_early",
            FailReason::Client(InferError::StreamClosedEarly),
        ),
        ("cancel", FailReason::Cancelled),
        ("loop", FailReason::LoopDetected),
    ] {
        let s = settings(false);
        let mut b = Buffers::new();
        let mut plain = machine(&mut b, &s, ask(None), None);
        drain(&mut plain);
        let plain = break_off(&mut plain, case);
        let mut b = Buffers::new();
        let mut m = machine(&mut b, &s, compacting(2), None);
        drain(&mut m);
        let out = break_off(&mut m, case);
        assert_eq!(kinds(&out), kinds(&plain), "{case}");
        assert_eq!(kinds(&out), ["close", "done"], "{case}");
        assert_eq!(events(&out), [], "{case}: no Summarized, no Generation");
        let (r, p) = (result(out), result(plain));
        assert_eq!(failed(&r).0, want, "{case}");
        assert_eq!(r.outcome, p.outcome, "{case}");
        assert!(p.content.is_some() && !p.generations.is_empty(), "{case}");
        assert_eq!(
            (r.content, r.reasoning_content),
            (None, None),
            "{case}: the summary's text is not the request's output"
        );
        assert!(
            r.transcript.is_empty() && r.generations.is_empty(),
            "{case}"
        );
        assert_eq!((r.budget, r.budget_left), (2, 2), "{case}");
    }
}

#[test]
fn the_worker_registers_the_summary_generation_and_its_failure_is_the_requests() {
    let s = settings(true);
    // Refused: the detail names the summary generation.
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, compacting(2), Some(3));
    assert_eq!(kinds(&drain(&mut m)), ["acquire", "register"]);
    m.handle_registered(ms(1), Ok(RegisterAnswer::Refused(WorkerState::Restarting)));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "done"]);
    let r = result(out);
    assert_eq!(
        failed(&r),
        (
            FailReason::WorkerRestarted,
            "llama-worker refused to register the summary generation (worker restarting)".into()
        )
    );
    assert!(r.generations.is_empty() && r.transcript.is_empty());

    // Registered, then pushed as failed: ended at once, no output.
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, compacting(2), Some(3));
    drain(&mut m);
    m.handle_registered(ms(1), Ok(RegisterAnswer::Registered(5)));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    m.handle_sent(ms(2));
    m.handle_bytes(ms(10), &answered());
    m.handle_bytes(ms(20), &data(json!({"content": "part"}), None, 0));
    assert_eq!(kinds(&drain(&mut m)), ["progress 5 first_byte"]);
    m.handle_worker_failed(ms(30), 5, WorkerFailReason::ServerDied);
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "done"]);
    let r = result(out);
    assert_eq!(
        failed(&r),
        (
            FailReason::ServerDied,
            "llama-server died on its own (generation 5, pushed on the watch)".into()
        )
    );
    assert_eq!(r.content, None);
    assert!(r.generations.is_empty() && r.transcript.is_empty());

    // Answered: unregistered, then generation 1 registered anew.
    let mut b = Buffers::new();
    let mut m = machine(&mut b, &s, compacting(2), Some(3));
    drain(&mut m);
    m.handle_registered(ms(1), Ok(RegisterAnswer::Registered(5)));
    drain(&mut m);
    m.handle_sent(ms(2));
    m.handle_bytes(ms(10), &answer("Two turns."));
    let out = drain(&mut m);
    assert_eq!(kinds(&out), ["close", "generation_done 5", "acquire"]);
    m.handle_acquired(ms(11), Ok(false));
    assert_eq!(kinds(&drain(&mut m)), ["register"]);
    m.handle_registered(ms(12), Ok(RegisterAnswer::Registered(6)));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    m.handle_sent(ms(13));
    let (k, r) = respond_more(&mut m, 20, &answer("Go on."));
    assert_eq!(k, ["close", "generation_done 6", "done"]);
    assert_eq!(r.generations.len(), 1);
}

#[test]
fn a_summary_generation_is_retried_as_any_generation_and_its_retries_are_generation_0s() {
    let s = settings(false);
    let mut b = Buffers::new();
    let mut m = retrying(&mut b, &s, compacting(2), None, Retry::default());
    drain(&mut m);
    m.handle_acquired(ms(1), Ok(false));
    assert_eq!(kinds(&drain(&mut m)), ["send"]);
    let refused = std::io::ErrorKind::ConnectionRefused.into();
    m.handle_send_error(
        ms(2),
        InferError::Connect {
            socket: "/run/infer.sock".into(),
            source: refused,
        },
    );
    assert_eq!(kinds(&drain(&mut m)), ["close"]);
    assert_eq!(m.poll_timeout(), Some(ms(2_002)));
    m.handle_timeout(ms(2_002));
    let again = drain(&mut m);
    assert_eq!(kinds(&again), ["acquire"]);
    let out = respond(&mut m, 2_010, &answer("Two turns."));
    assert_eq!(
        request(&out).options.max_tokens,
        Some(64),
        "the summary, again"
    );
    assert!(matches!(
        &events(&out)[..],
        [
            RequestEvent::Summarized { .. },
            RequestEvent::Generation { number: 1, .. }
        ]
    ));
    let r = result(respond(&mut m, 2_020, &answer("Go on.")));
    assert_eq!(r.outcome.fail_reason(), None);
    let retried: Vec<(u32, u32, u64, &str)> = r
        .retries
        .iter()
        .map(|t| (t.generation, t.attempt, t.after_ms, t.error))
        .collect();
    assert_eq!(retried, [(0, 2, 2_000, "connect_error")]);
    assert_eq!(r.generations.len(), 1);
}
