//! The client over a real Unix socket against the fake server: the bytes it sends, the
//! second connections it makes (`/slots`, the control call), the errors and events it returns,
//! and the retry loop around it. The timers themselves are tested on fake time in
//! `src/llama/exchange/tests.rs`; `timing.rs` has the wall-clock smoke tests and deadlines.

mod support;

use std::sync::Arc;
use std::time::Duration;

use loopd_client::config::{ClientConfig, Limits};

use loopd_client::llama::{
    Cancel, ChatEvent, ChatRequest, Client, Completion, FinishReason, InferError, ProtocolError,
};
use support::{
    answer, content, done, finish, hold_slot, reasoning, slots_json, End, FakeServer, Reply, CHAT,
    CONTROL,
};

fn config(server: &FakeServer) -> ClientConfig {
    let mut c = ClientConfig::new(server.socket(), "smollm2");
    c.limits = Limits {
        // Polls come quickly; every other timer is far away (timing.rs tests them).
        poll_ms: 50,
        busy_wait_ms: 5_000,
        load_wait_ms: 5_000,
        idle_grace_ms: 5_000,
        liveness_ms: 5_000,
        connect_ms: 1_000,
        call_ms: 1_000,
        thinking_cap: 3,
        thinking_overrun: 2,
        max_tokens: 64,
        queue: 8,
    };
    c.retry.delays_ms = vec![60, 60, 60];
    c
}

fn request(slot: u32) -> ChatRequest {
    ChatRequest::user(slot, "Name three colours.")
}

/// Runs `chat` and returns the result and the events.
fn run(client: &Client, req: &ChatRequest) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
    let mut events = Vec::new();
    let r = client.chat(req, &mut |e| events.push(e.clone()));
    (r, events)
}

fn kind(r: &Result<Completion, InferError>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("{e:?}")
            .split(['(', ' '])
            .next()
            .unwrap()
            .to_owned(),
    }
}

#[test]
fn a_plain_answer_sends_the_rendered_request_and_assembles() {
    let server = FakeServer::start(vec![(CHAT, vec![answer()])]);
    let client = Client::new(config(&server));
    let (r, events) = run(&client, &request(1));
    let done = r.unwrap();
    assert_eq!(
        events,
        [
            ChatEvent::Content("Red".into()),
            ChatEvent::Content(", blue".into())
        ]
    );
    assert_eq!(
        (done.message.content.as_deref(), done.finish_reason),
        (Some("Red, blue"), FinishReason::Stop)
    );
    assert_eq!(done.timings.expect("timings").predicted_n, 3);
    let sent = server.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].method.as_str(), sent[0].target.as_str()),
        ("POST", CHAT)
    );
    assert_eq!(sent[0].header("connection"), Some("close"));
    assert_eq!(
        sent[0].body,
        loopd_client::llama::render_request(client.config(), &request(1))
    );
}

#[test]
fn a_finished_requests_buffers_serve_the_next_as_if_new() {
    // The first answer is longer, thinks and calls a tool; the second reuses its buffers
    // without clearing them and must see none of it.
    let call = support::chunk(
        r#"{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        None,
        4,
    );
    let first = Reply::sse(vec![
        reasoning("mm, colours", 1),
        content("Red, blue and green", 2),
        call,
        finish(5),
        done(),
    ]);
    let server = FakeServer::start(vec![(CHAT, vec![first, answer()])]);
    let client = Client::new(config(&server));
    assert_eq!(client.buffer_pool().spare(), 0);
    let one = run(&client, &request(0)).0.unwrap();
    assert_eq!(one.message.tool_calls.len(), 1);
    assert_eq!(client.buffer_pool().spare(), 1, "kept for the next request");
    let two = run(&client, &request(0)).0.unwrap();
    assert_eq!(
        (
            two.message.content.as_deref(),
            two.message.reasoning_content.as_deref(),
            two.message.tool_calls.len(),
            two.reasoning_tokens
        ),
        (Some("Red, blue"), None, 0, 0)
    );
    assert_eq!(client.buffer_pool().spare(), 1, "the same set again");
}

#[test]
fn connect_error_when_nothing_listens() {
    let server = FakeServer::start(vec![]);
    let mut c = config(&server);
    c.socket = c.socket.with_file_name("absent.sock");
    let (r, events) = run(&Client::new(c), &request(0));
    assert!(
        matches!(r, Err(InferError::Connect { ref source, .. }) if source.kind() == std::io::ErrorKind::NotFound),
        "{r:?}"
    );
    assert!(events.is_empty());
}

#[test]
fn busy_when_the_queue_is_full() {
    let server = FakeServer::start(vec![(CHAT, vec![answer()])]);
    let mut c = config(&server);
    c.limits.queue = 0;
    let client = Client::new(c);
    let held = hold_slot(&client, 0);
    let (r, events) = run(&client, &request(0));
    assert_eq!(kind(&r), "Busy");
    assert!(events.is_empty() && server.requests().is_empty());
    drop(held);
    assert!(run(&client, &request(0)).0.is_ok());
}

#[test]
fn queued_behind_a_request_on_the_same_slot() {
    let slow = answer().first_after(Duration::from_millis(150));
    let server = FakeServer::start(vec![
        (CHAT, vec![slow, answer()]),
        ("/slots", vec![Reply::json(200, &slots_json(Some(0)))]),
    ]);
    let client = Arc::new(Client::new(config(&server)));
    let first = {
        let client = client.clone();
        std::thread::spawn(move || run(&client, &request(0)).0.map(|c| c.message.content))
    };
    while !client.gate().is_held(0) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (r, events) = run(&client, &request(0));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(events[0], ChatEvent::Queued { ahead: 1 });
    assert_eq!(first.join().unwrap().unwrap().as_deref(), Some("Red, blue"));
}

#[test]
fn waiting_on_a_busy_slot_then_the_answer() {
    let server = FakeServer::start(vec![
        (CHAT, vec![answer().first_after(Duration::from_millis(130))]),
        ("/slots", vec![Reply::json(200, &slots_json(Some(1)))]),
    ]);
    let (r, events) = run(&Client::new(config(&server)), &request(1));
    assert!(r.is_ok(), "{r:?}");
    let waits = events
        .iter()
        .take_while(|e| **e == ChatEvent::Waiting { slot_busy: true })
        .count();
    assert!(waits >= 1, "{events:?}");
    assert_eq!(
        events[waits..],
        [
            ChatEvent::Content("Red".into()),
            ChatEvent::Content(", blue".into())
        ]
    );
    let polls = server.requests_to("/slots");
    assert_eq!(polls.len(), waits, "one Waiting per poll");
    assert!(polls
        .iter()
        .all(|p| p.target == "/slots?model=smollm2" && p.method == "GET"));
}

#[test]
fn stream_closed_early_on_a_cut_or_an_end_without_finish_reason() {
    for end in [End::Cut, End::Clean] {
        let server = FakeServer::start(vec![(
            CHAT,
            vec![Reply::sse(vec![content("Red", 1)]).ending(end)],
        )]);
        let (r, events) = run(&Client::new(config(&server)), &request(0));
        assert_eq!(kind(&r), "StreamClosedEarly", "{end:?}");
        assert_eq!(events, [ChatEvent::Content("Red".into())]);
    }
    let server = FakeServer::start(vec![(CHAT, vec![Reply::silence().ending(End::Cut)])]);
    assert_eq!(
        kind(&run(&Client::new(config(&server)), &request(0)).0),
        "StreamClosedEarly"
    );
}

#[test]
fn every_failure_returns_what_was_assembled_before_it() {
    let call = support::chunk(
        r#"{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a"}}]}"#,
        None,
        3,
    );
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![reasoning("hm", 1), content("Red", 2), call]).ending(End::Cut)],
    )]);
    let client = Client::new(config(&server));
    let failed = client
        .run(&request(0), &Cancel::new(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(failed.error, InferError::StreamClosedEarly));
    let p = failed.partial;
    assert_eq!(
        (
            p.message.content.as_deref(),
            p.message.reasoning_content.as_deref()
        ),
        (Some("Red"), Some("hm"))
    );
    assert_eq!(
        (
            p.message.tool_calls[0].name.as_str(),
            p.message.tool_calls[0].arguments.as_str()
        ),
        ("f", "{\"a")
    );
    assert_eq!(
        (p.reasoning_tokens, p.timings.map(|t| t.predicted_n)),
        (1, Some(3))
    );
    // A failure before any byte has an empty partial; retries end with the last attempt's.
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![content("Red", 1)]).ending(End::Cut)],
    )]);
    let client = Client::new(config(&server));
    let failed = client
        .run_with_retry(&request(0), &Cancel::new(), &mut |_| {})
        .unwrap_err();
    assert!(matches!(failed.error, InferError::StreamClosedEarly));
    assert_eq!(failed.partial.message.content.as_deref(), Some("Red"));
    assert_eq!(server.requests_to(CHAT).len(), 4);
}

#[test]
fn a_cut_after_the_final_chunk_still_completes() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(vec![content("Red", 1), finish(2)]).ending(End::Cut)],
    )]);
    let (r, _) = run(&Client::new(config(&server)), &request(0));
    assert_eq!(r.unwrap().message.content.as_deref(), Some("Red"));
}

#[test]
fn http_errors_carry_status_and_a_capped_body() {
    let fits = r#"{"error":{"code":400,"message":"the prompt does not fit","type":"invalid_request_error"}}"#;
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::json(400, fits), Reply::json(503, &"x".repeat(5000))],
    )]);
    let client = Client::new(config(&server));
    match run(&client, &request(0)).0 {
        Err(InferError::Http { status: 400, body }) => assert_eq!(body, fits),
        other => panic!("{other:?}"),
    }
    match run(&client, &request(0)).0 {
        Err(InferError::Http { status: 503, body }) => assert_eq!(body, "x".repeat(4096)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_error_payload_mid_stream_is_an_error_not_a_success() {
    let err = b"data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\",\"type\":\"exceed_context_size_error\"}}\n\n".to_vec();
    let server = FakeServer::start(vec![(CHAT, vec![Reply::sse(vec![content("Red", 1), err])])]);
    match run(&Client::new(config(&server)), &request(0)) {
        (Err(InferError::Http { status: 500, body }), events) => {
            assert_eq!(body, "Context size has been exceeded.");
            assert_eq!(events, [ChatEvent::Content("Red".into())]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn protocol_errors_for_bad_json_and_broken_caps() {
    let bad = Reply::sse(vec![b"data: {\"choices\":[{\"delta\":\n\n".to_vec()]);
    let huge_head =
        Reply::raw(format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(16 * 1024)).into_bytes());
    let mut long_line = b"data: ".to_vec();
    long_line.resize(1024 * 1024 + 1, b'x');
    long_line.extend_from_slice(b"\n\n");
    let server = FakeServer::start(vec![(
        CHAT,
        vec![bad, huge_head, Reply::sse(vec![long_line])],
    )]);
    let client = Client::new(config(&server));
    let r = run(&client, &request(0)).0;
    assert!(
        matches!(
            r,
            Err(InferError::Protocol(ProtocolError::Stream(
                llama_proto::StreamError::Decode(_)
            )))
        ),
        "{r:?}"
    );
    let r = run(&client, &request(0)).0;
    assert!(
        matches!(
            r,
            Err(InferError::Protocol(ProtocolError::Stream(
                llama_proto::StreamError::Http(http_nostd::HttpError::HeadersTooLarge)
            )))
        ),
        "{r:?}"
    );
    let r = run(&client, &request(0)).0;
    assert!(
        matches!(
            r,
            Err(InferError::Protocol(ProtocolError::Stream(
                llama_proto::StreamError::Sse(sse_nostd::SseError::LineTooLong)
            )))
        ),
        "{r:?}"
    );
}

/// Reasoning chunks 1..=n tokens, then (optionally) an answer.
fn thinking_stream(n: u64, then_answer: bool) -> Reply {
    let mut pieces: Vec<Vec<u8>> = (1..=n).map(|i| reasoning("hm", i)).collect();
    if then_answer {
        pieces.extend([content("5", n + 1), finish(n + 2), done()]);
    }
    Reply::sse(pieces)
        .each_after(Duration::from_millis(5))
        .ending(if then_answer {
            End::Clean
        } else {
            End::Silence
        })
}

#[test]
fn thinking_cap_posts_reasoning_end_and_reads_on() {
    let server = FakeServer::start(vec![
        (CHAT, vec![thinking_stream(4, true)]),
        (CONTROL, vec![Reply::json(200, r#"{"success":true}"#)]),
    ]);
    let (r, events) = run(&Client::new(config(&server)), &request(0));
    let done = r.unwrap();
    assert!(done.thinking_capped);
    assert_eq!(
        (done.message.content.as_deref(), done.reasoning_tokens),
        (Some("5"), 4)
    );
    let capped = events
        .iter()
        .position(|e| *e == ChatEvent::ThinkingCapped { tokens: 3 })
        .unwrap();
    assert_eq!(
        events[..capped],
        [
            ChatEvent::Reasoning("hm".into()),
            ChatEvent::Reasoning("hm".into()),
            ChatEvent::Reasoning("hm".into())
        ]
    );
    let control = server.requests_to(CONTROL);
    assert_eq!(control.len(), 1);
    assert_eq!(
        control[0].body,
        br#"{"id":"chatcmpl-t","action":"reasoning_end","model":"smollm2"}"#
    );
}

#[test]
fn thinking_overrun_when_the_control_call_fails() {
    let refusals = [
        Reply::json(200, r#"{"success":false,"message":"no such completion"}"#),
        Reply::json(404, r#"{"error":{"code":404,"message":"not found"}}"#),
    ];
    for refusal in refusals {
        let server = FakeServer::start(vec![
            (CHAT, vec![thinking_stream(20, false)]),
            (CONTROL, vec![refusal]),
        ]);
        let (r, events) = run(&Client::new(config(&server)), &request(0));
        assert_eq!(kind(&r), "ThinkingOverrun");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ChatEvent::ThinkingCapped { .. })),
            "{events:?}"
        );
    }
}

#[test]
fn retry_after_a_cut_goes_through_the_gate_again_with_the_same_bytes() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::silence().ending(End::Cut), answer()],
    )]);
    let client = Client::new(config(&server));
    let mut events = Vec::new();
    let r = client.chat_with_retry(&request(0), &mut |e| events.push(e.clone()));
    assert_eq!(r.unwrap().message.content.as_deref(), Some("Red, blue"));
    match &events[0] {
        ChatEvent::Retrying {
            attempt: 2,
            after_ms,
            error,
        } => {
            assert!((45..=75).contains(after_ms), "60 ms ± 25%: {after_ms}");
            assert_eq!(error, &InferError::StreamClosedEarly.to_string());
        }
        other => panic!("{other:?}"),
    }
    let sent = server.requests_to(CHAT);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].body, sent[1].body);
}

#[test]
fn retry_gives_up_after_four_attempts_and_not_on_400() {
    let server = FakeServer::start(vec![(CHAT, vec![Reply::json(503, "Loading model")])]);
    let client = Client::new(config(&server));
    let mut events = Vec::new();
    let r = client.chat_with_retry(&request(0), &mut |e| events.push(e.clone()));
    assert!(matches!(r, Err(InferError::Http { status: 503, .. })));
    let attempts: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Retrying { attempt, .. } => Some(*attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [2, 3, 4]);
    assert_eq!(server.requests_to(CHAT).len(), 4);
    let server = FakeServer::start(vec![(CHAT, vec![Reply::json(400, "bad")])]);
    let client = Client::new(config(&server));
    let mut events = Vec::new();
    assert!(client
        .chat_with_retry(&request(0), &mut |e| events.push(e.clone()))
        .is_err());
    assert!(events.is_empty());
    assert_eq!(server.requests_to(CHAT).len(), 1);
}

/// `POST /slots/N?action=save|restore`: the body names the model and the file, the answer's
/// counts are read; the server's refusals keep their status; a name that could leave the save
/// path is refused before any request.
#[test]
fn a_slot_is_saved_and_restored_by_file_name() {
    use loopd_client::llama::{SlotAction, SlotFile};
    let server = FakeServer::start(vec![(
        "/slots/1",
        vec![
            Reply::json(
                200,
                r#"{"id_slot":1,"filename":"loopd-a.kv","n_saved":174,"n_written":4194304,"timings":{"save_ms":2.25}}"#,
            ),
            Reply::json(
                200,
                r#"{"id_slot":1,"filename":"loopd-a.kv","n_restored":174,"n_read":4194304,"timings":{"restore_ms":1.5}}"#,
            ),
            Reply::json(
                400,
                r#"{"error":{"code":400,"message":"Unable to restore slot, no available space in KV cache or invalid slot save file","type":"invalid_request_error"}}"#,
            ),
        ],
    )]);
    let client = Client::new(config(&server));
    assert_eq!(
        client.slot_file(1, SlotAction::Save, "loopd-a.kv"),
        Ok(SlotFile {
            tokens: 174,
            bytes: 4_194_304,
            micros: 2_250
        })
    );
    assert_eq!(
        client.slot_file(1, SlotAction::Restore, "loopd-a.kv"),
        Ok(SlotFile {
            tokens: 174,
            bytes: 4_194_304,
            micros: 1_500
        })
    );
    let refused = client.slot_file(1, SlotAction::Restore, "loopd-a.kv");
    assert!(
        matches!(&refused, Err(InferError::Http { status: 400, body }) if body.contains("Unable to restore slot")),
        "{refused:?}"
    );
    let sent = server.requests_to("/slots/1");
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0].target, "/slots/1?action=save");
    assert_eq!(sent[1].target, "/slots/1?action=restore");
    assert_eq!(
        String::from_utf8_lossy(&sent[0].body),
        r#"{"model":"smollm2","filename":"loopd-a.kv"}"#
    );
    let escaping = client.slot_file(1, SlotAction::Save, "../loopd.db");
    assert!(
        matches!(&escaping, Err(InferError::Http { status: 400, body }) if body == "not sent: a slot file's name may not hold '/'"),
        "{escaping:?}"
    );
    assert_eq!(server.requests_to("/slots/1").len(), 3, "nothing was sent");
}
