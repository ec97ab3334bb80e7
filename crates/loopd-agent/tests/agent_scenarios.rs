//! Seed 003's appendix-L scenarios that `tests/runner.rs` ran through real sockets on the
//! wall clock, here on fake time: a scripted driver plays the server (each reply's bytes at a
//! set millisecond), the tools (at once, in order) and llama-worker (a fixed status and stall
//! answer) around one `AgentRequest`, jumping from one `poll_timeout` to the next. Every
//! result is exact and the whole file runs in milliseconds.

mod scripted;
mod sections;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llama_harness::fixture;
use loopd_agent::runner::RunnerConfig;
use loopd_agent::runner::{
    Action, AgentRequest, BiosContext, BiosProvider, CallSource, FailReason, Outcome, RequestId,
    RequestResult, Setup, StallAnswer, Submission, ToolError, ToolRegistry, WorkerState,
    WorkerStatus,
};
use loopd_client::clock::FakeJitter;
use loopd_client::config::Retry;
use loopd_client::llama::{Buffers, ChatMessage, ChatRequest, SlotSeen};
use scripted::{ms, tool_call_deltas, Named};
use sections::Config;
use serde_json::{json, Value};

/// A BIOS that records every context it was asked for, with a budget note.
#[derive(Default)]
struct RecordingBios(Mutex<Vec<(u32, u32)>>);

impl BiosProvider for RecordingBios {
    fn bios(&self, ctx: &BiosContext<'_>) -> String {
        self.0
            .lock()
            .unwrap()
            .push((ctx.budget_left, ctx.iterations));
        format!("BIOS: {} tool iterations", ctx.budget)
    }

    fn budget_note(&self, ctx: &BiosContext<'_>) -> Option<String> {
        Some(format!("{} left", ctx.budget_left))
    }
}

/// tests/runner.rs's `[runner]`: budget 3, stall reports every 150 ms, status every 20 ms.
fn settings(worker: bool) -> RunnerConfig {
    RunnerConfig {
        budget: 3,
        tool_timeout_ms: 200,
        stall_ms: 150,
        worker_poll_ms: 20,
        worker_socket: worker.then(|| "/run/worker.sock".into()),
        ..RunnerConfig::default()
    }
}

fn config() -> Config {
    let mut c = Config::new("/run/infer.sock", "smollm2");
    c.limits.poll_ms = 20;
    c.limits.busy_wait_ms = 5_000;
    c.limits.load_wait_ms = 2_000;
    c.limits.idle_grace_ms = 2_000;
    c.limits.liveness_ms = 5_000;
    c
}

fn ask(text: &str) -> Submission {
    Submission {
        messages: vec![ChatMessage::User {
            content: text.into(),
        }],
        ..Submission::default()
    }
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";

fn data(delta: Value, finish: Option<&str>) -> Vec<u8> {
    let v = json!({
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1, "id": "chatcmpl-a", "model": "smollm2",
        "object": "chat.completion.chunk",
        "timings": {"cache_n": 0, "prompt_n": 10, "predicted_n": 3}
    });
    format!("data: {v}\n\n").into_bytes()
}

fn content(text: &str) -> Vec<u8> {
    data(json!({ "content": text }), None)
}

fn finished(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut out = HEAD.to_vec();
    for p in pieces {
        out.extend_from_slice(p);
    }
    out.extend(data(json!({}), Some("stop")));
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// What the server does with one request: `bytes` `after` ms past the send, then the end of
/// the stream, or silence (the server would go on for ever).
struct Reply {
    after: u64,
    bytes: Vec<u8>,
    silence: bool,
}

fn answer(text: &str) -> Reply {
    Reply {
        after: 10,
        bytes: finished(&[content(text)]),
        silence: false,
    }
}

fn calls(list: &[(&str, &str, &str)]) -> Reply {
    let deltas = tool_call_deltas(list);
    let mut bytes = HEAD.to_vec();
    bytes.extend(data(json!({ "tool_calls": deltas }), None));
    bytes.extend(data(json!({}), Some("tool_calls")));
    bytes.extend_from_slice(b"data: [DONE]\n\n");
    Reply {
        after: 10,
        bytes,
        silence: false,
    }
}

/// llama-worker as the script plays it: always `ready` under spawn 1, and one answer to
/// every stall report.
struct Worker {
    stall: StallAnswer,
}

/// What came of one scripted request.
struct Run {
    result: RequestResult,
    sent: Vec<ChatRequest>,
    /// Every normal call the script ran: its arguments, in order.
    ran: Vec<String>,
    /// When the request ended, on the machine's time.
    ended: Duration,
}

/// Plays `replies` (one per request sent), the tools and `worker` around a fresh machine.
fn play(
    req: Submission,
    bios: Arc<dyn BiosProvider>,
    replies: Vec<Reply>,
    worker: Option<Worker>,
) -> Run {
    let mut tools = ToolRegistry::new();
    for (name, exit) in [("echo", false), ("fail", false), ("signal", true)] {
        tools.register(Arc::new(Named(name, exit))).unwrap();
    }
    let s = settings(worker.is_some());
    let setup = Setup {
        id: RequestId(1),
        slot: 0,
        limits: config().limits,
        settings: &s,
        tools: &tools,
        bios,
        spawns: worker.as_ref().map(|_| 1),
        retry: Retry::once(),
        jitter: Arc::new(FakeJitter::new(&[])),
    };
    let mut buffers = Buffers::new();
    let mut m = AgentRequest::new(Duration::ZERO, setup, req, buffers.storage());
    let mut replies = VecDeque::from(replies);
    let (mut sent, mut ran) = (Vec::new(), Vec::new());
    // The bytes still to come: when, what, and whether silence follows them.
    let mut due: Option<(Duration, Vec<u8>, bool)> = None;
    let mut now = Duration::ZERO;
    for _ in 0..100_000 {
        while let Some(a) = m.poll_action() {
            match a {
                Action::Event(_) | Action::CancelTool { .. } => {}
                Action::Acquire => m.handle_acquired(now, Ok(false)),
                Action::Send(chat) => {
                    sent.push(chat);
                    m.handle_sent(now);
                    let r = replies.pop_front().expect("a reply for every request");
                    due = Some((now + ms(r.after), r.bytes, r.silence));
                }
                Action::PollSlots => m.handle_slots(now, SlotSeen::Busy),
                Action::EndReasoning { .. } => m.handle_control_answer(now, true),
                Action::Close { .. } => due = None,
                Action::RunTool {
                    id,
                    name,
                    arguments,
                } => {
                    let result = match name.as_str() {
                        "echo" => {
                            ran.push(arguments.to_string());
                            Ok(format!("echo {arguments}"))
                        }
                        _ => Err(ToolError::Failed("disk on fire".into())),
                    };
                    m.handle_tool_result(now, &id, result);
                }
                Action::WorkerStatus => m.handle_worker_status(
                    now,
                    Ok(WorkerStatus {
                        state: WorkerState::Ready,
                        spawns: 1,
                        last_cause: None,
                        reason: None,
                    }),
                ),
                // The worker registers every generation (as id 1) and takes its reports.
                Action::RegisterGeneration => m.handle_registered(
                    now,
                    Ok(loopd_agent::runner::worker::RegisterAnswer::Registered(1)),
                ),
                Action::ReportProgress { .. } | Action::GenerationDone { .. } => {}
                Action::ReportStall { .. } => {
                    let w = worker
                        .as_ref()
                        .expect("a stall is reported only to a worker");
                    m.handle_stall_answer(now, Ok(w.stall));
                }
                Action::Done(result) => {
                    return Run {
                        result: *result,
                        sent,
                        ran,
                        ended: now,
                    }
                }
            }
        }
        let timer = m.poll_timeout();
        match due.take() {
            Some((at, bytes, silence)) if timer.is_none_or(|t| at <= t) => {
                now = now.max(at);
                let mut fed = 0;
                while fed < bytes.len() && !m.is_done() {
                    fed += m.handle_bytes(now, &bytes[fed..]);
                }
                if !silence && !m.is_done() {
                    m.handle_eof(now);
                }
            }
            other => {
                due = other;
                now = now.max(timer.expect("the machine waits for something"));
                m.handle_timeout(now);
            }
        }
    }
    panic!("the request never ended");
}

fn failed(r: &RequestResult) -> (FailReason, &str) {
    match &r.outcome {
        Outcome::Failed { reason, detail } => (reason.clone(), detail),
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// The `n`th request's messages as JSON, as the server would read them.
fn messages(run: &Run, n: usize) -> Vec<Value> {
    let body = loopd_client::llama::render_request(&config().client(), &run.sent[n]);
    let v: Value = serde_json::from_slice(&body).unwrap();
    v["messages"].as_array().unwrap().clone()
}

fn plain(replies: Vec<Reply>) -> Run {
    play(ask("go"), Arc::new(RecordingBios::default()), replies, None)
}

#[test]
fn bios_first_then_the_caller_system_then_the_conversation_the_bios_fixed_the_budget_in_a_note() {
    let bios = Arc::new(RecordingBios::default());
    let mut req = ask("hello");
    req.system = Some("You are terse.".into());
    let replies = vec![
        calls(&[("c1", "echo", "{}")]),
        calls(&[("c2", "echo", "{}")]),
        answer("ok"),
    ];
    let run = play(req, bios.clone(), replies, None);
    assert!(
        run.result.outcome.fail_reason().is_none(),
        "{:?}",
        run.result.outcome
    );
    assert_eq!(*bios.0.lock().unwrap(), [(3, 0)], "written once");
    for n in 0..3 {
        let m = messages(&run, n);
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "BIOS: 3 tool iterations"})
        );
        assert_eq!(m[1], json!({"role": "system", "content": "You are terse."}));
        assert_eq!(m[2], json!({"role": "user", "content": "hello"}));
    }
    let last = messages(&run, 2);
    assert_eq!(last.len(), 7, "BIOS, system, user, 2 x (call, result)");
    // Each iteration's result ends with the note; earlier requests are prefixes of later
    // ones, so the server's cache keeps all of them.
    assert_eq!(last[4]["content"], "echo {}\n\n2 left");
    assert_eq!(last[6]["content"], "echo {}\n\n1 left");
    assert_eq!(messages(&run, 1)[..5], last[..5]);
    assert_eq!(
        run.ended,
        ms(30),
        "three generations of 10 ms, the tools at once"
    );
}

#[test]
fn text_calls_that_do_not_parse_or_name_no_tool_are_tool_parse_errors() {
    let cases = [
        (
            "Sure.\n<tool_call>\n{\"name\": \"echo\", \"arguments\": {\"a\": }\n</tool_call>",
            "tool_call JSON is malformed",
        ),
        (
            "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
            "names no tool: `rm_rf`",
        ),
        (
            "<tool_call>{\"name\": \"echo\"}</tool_call>",
            "has no \"arguments\"",
        ),
        (
            "<tool_call>{\"name\": \"echo\", \"arguments\": {}}",
            "no </tool_call>",
        ),
    ];
    for (text, want) in cases {
        let run = plain(vec![answer(text)]);
        let (reason, detail) = failed(&run.result);
        assert_eq!(reason, FailReason::ToolParseError, "{text}");
        assert!(detail.contains(want), "{text}: {detail}");
        assert_eq!(
            run.result.content.as_deref(),
            Some(text),
            "the output is kept"
        );
        assert!(run.ran.is_empty());
    }
}

#[test]
fn an_exit_tool_written_as_text_is_recorded_and_generation_continues() {
    let text =
        "Half way.\n<tool_call>{\"name\": \"signal\", \"arguments\": {\"p\": 50}}</tool_call>\
                \n<tool_call>{\"name\": \"echo\", \"arguments\": {\"k\": 1}}</tool_call>";
    let run = plain(vec![answer(text), answer("All done.")]);
    let r = &run.result;
    assert!(r.outcome.fail_reason().is_none(), "{:?}", r.outcome);
    assert_eq!(r.exits.len(), 1);
    assert_eq!(
        (
            r.exits[0].call.name.as_str(),
            r.exits[0].call.arguments.as_str()
        ),
        ("signal", "{\"p\": 50}")
    );
    assert_eq!(r.exits[0].source, CallSource::Text);
    assert_eq!(run.ran, [r#"{"k":1}"#]);
    assert_eq!(r.budget_left, 2);
    assert_eq!(r.content.as_deref(), Some("All done."));
    // The prose stays in the assistant message; the calls become calls.
    let m = messages(&run, 1);
    assert_eq!(m[2]["content"], "Half way.");
    assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 1);
    // An exit call alone in text ends nothing early and costs nothing.
    let run = plain(vec![answer(
        "<tool_call>{\"name\": \"signal\", \"arguments\": {}}</tool_call>",
    )]);
    assert!(
        run.result.outcome.fail_reason().is_none(),
        "{:?}",
        run.result.outcome
    );
    assert_eq!((run.result.exits.len(), run.result.budget_left), (1, 3));
}

/// A stream of `line` written `times` times after a first line, then silence.
fn looping(line: &str, times: usize) -> Reply {
    let mut bytes = HEAD.to_vec();
    bytes.extend(content("Let me think.\n"));
    for _ in 0..times {
        bytes.extend(content(&format!("{line}\n")));
    }
    Reply {
        after: 10,
        bytes,
        silence: true,
    }
}

#[test]
fn a_39_character_line_repeated_closes_the_stream_with_loop_detected() {
    let line = "I will now check the weather for you.."; // 38 bytes + '\n'
    assert_eq!(line.len() + 1, 39);
    let run = plain(vec![looping(line, 40)]);
    let (reason, detail) = failed(&run.result);
    assert_eq!(reason, FailReason::LoopDetected);
    assert!(
        detail.contains("1-line unit of 38 bytes repeated 8 times"),
        "{detail}"
    );
    let kept = run.result.content.unwrap();
    assert!(kept.starts_with("Let me think.\n"));
    // All 40 came in one read, so all are kept (tests/agent.rs feeds them one at a time and
    // sees the stream closed at the 8th).
    assert_eq!(kept.matches(line).count(), 40, "the output is kept");
    // The server never finishes: the machine closed the stream when the bytes came.
    assert_eq!(run.ended, ms(10));
}

#[test]
fn loop_tiers_short_lines_need_more_repeats_than_long_ones() {
    // (line, repeats written, fires): short < 16 bytes needs 24, long >= 64 needs 5.
    let long = "This is a rather long sentence that the model keeps on writing out.";
    assert!(long.len() >= 64);
    let cases = [
        ("Yes.", 23, false),
        ("Yes.", 24, true),
        (long, 4, false),
        (long, 5, true),
    ];
    for (line, times, fires) in cases {
        let mut pieces: Vec<Vec<u8>> = (0..times).map(|_| content(&format!("{line}\n"))).collect();
        pieces.push(content("The end."));
        let run = plain(vec![Reply {
            after: 10,
            bytes: finished(&pieces),
            silence: false,
        }]);
        assert_eq!(
            run.result.outcome.fail_reason() == Some(&FailReason::LoopDetected),
            fires,
            "{line:?} x{times}: {:?}",
            run.result.outcome
        );
    }
}

#[test]
fn benign_repetition_does_not_trigger_the_loop_detector() {
    let code =
        "fn main() {\n    if a {\n        if b {\n            f();\n        }\n    }\n}\n}\n}\n}\n";
    let bullets = "- item\n".repeat(6) + "\n\n\n\n\n\n\n\n\n\n";
    let few = "Checking the weather in the city now.\n".repeat(4);
    for text in [code.to_string(), bullets, few] {
        let run = plain(vec![answer(&text)]);
        assert!(
            run.result.outcome.fail_reason().is_none(),
            "{text:?}: {:?}",
            run.result.outcome
        );
        assert_eq!(run.result.content.as_deref(), Some(text.as_str()));
    }
}

#[test]
fn the_recorded_smollm2_loop_is_detected_with_its_output_kept() {
    // The real server's stream of the model repeating one sentence (fixtures/looping.sse),
    // then silence where the server would have gone on to max_tokens.
    let mut bytes = HEAD.to_vec();
    bytes.extend(fixture("looping.sse"));
    let run = plain(vec![Reply {
        after: 10,
        bytes,
        silence: true,
    }]);
    let (reason, detail) = failed(&run.result);
    assert_eq!(reason, FailReason::LoopDetected, "{detail}");
    assert!(
        run.result.content.is_some_and(|c| !c.is_empty()),
        "the output is kept"
    );
    assert_eq!(run.ended, ms(10));
}

#[test]
fn a_long_silent_prefill_with_cpu_progress_is_not_a_stall() {
    // Nothing for 700 ms (the slot busy with the prompt); the worker sees CPU time rise.
    let not = StallAnswer::NotStalled {
        since_progress_ms: 250,
    };
    let mut reply = answer("worth the wait");
    reply.after = 700;
    let run = play(
        ask("x"),
        Arc::new(RecordingBios::default()),
        vec![reply],
        Some(Worker { stall: not }),
    );
    assert!(
        run.result.outcome.fail_reason().is_none(),
        "{:?}",
        run.result.outcome
    );
    assert_eq!(run.result.content.as_deref(), Some("worth the wait"));
    // stall_ms is 150: reports at 150, 300, 450, 600 ms, each answered not stalled.
    assert_eq!(run.result.stalls, [not; 4]);
    assert_eq!(run.ended, ms(700));
}

#[test]
fn a_mid_stream_stall_ends_in_a_restart_and_worker_restarted_with_partial_output() {
    let mut bytes = HEAD.to_vec();
    bytes.extend(content("The answer is"));
    let reply = Reply {
        after: 10,
        bytes,
        silence: true,
    };
    let run = play(
        ask("x"),
        Arc::new(RecordingBios::default()),
        vec![reply],
        Some(Worker {
            stall: StallAnswer::Restarting,
        }),
    );
    assert_eq!(failed(&run.result).0, FailReason::WorkerRestarted);
    assert_eq!(run.result.content.as_deref(), Some("The answer is"));
    assert_eq!(run.result.stalls, [StallAnswer::Restarting]);
    assert_eq!(
        run.result.generations[0].finish_reason, None,
        "the failed generation has no finish reason"
    );
    // The last progress came at 10 ms; the report one stall_ms later.
    assert_eq!(run.ended, ms(160));
}
