//! Timers through the real socket, on the wall clock. The timers' rules are tested on fake time
//! to the millisecond in `src/llama/exchange/tests.rs`; here, three smoke tests show the loop
//! sets its socket timeouts from them, and one test per whole-step deadline shows it firing
//! against a fake server that trickles one byte at a time (well within every per-read limit)
//! or never answers. Every limit is 50 to 300 ms, so nothing waits for a second.

mod support;

use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopd_client::config::{ClientConfig, Limits};
use loopd_client::llama::{
    Cancel, ChatEvent, ChatMessage, ChatRequest, Client, Completion, Deadline, InferError, Silence,
};
use support::{
    content, finish, hold_slot, reasoning, slots_json, End, FakeServer, Reply, CHAT, CONTROL,
};

const TRICKLE: Duration = Duration::from_millis(15);

fn config(socket: &std::path::Path) -> ClientConfig {
    let mut c = ClientConfig::new(socket, "smollm2");
    c.limits = Limits {
        poll_ms: 50,
        busy_wait_ms: 200,
        load_wait_ms: 150,
        idle_grace_ms: 120,
        liveness_ms: 100,
        connect_ms: 150,
        call_ms: 300,
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

/// Runs `f` and says how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let r = f();
    (r, start.elapsed())
}

/// `took` is at least `limit` and well short of a second past it.
fn near(took: Duration, limit_ms: u64) {
    let limit = Duration::from_millis(limit_ms);
    assert!(
        took >= limit && took < limit + Duration::from_millis(900),
        "took {took:?} for a {limit:?} limit"
    );
}

fn chat(client: &Client, req: &ChatRequest) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
    let mut events = Vec::new();
    let r = client.chat(req, &mut |e| events.push(e.clone()));
    (r, events)
}

#[test]
fn smoke_a_busy_slot_is_polled_until_wait_timeout() {
    let server = FakeServer::start(vec![
        (CHAT, vec![Reply::silence()]),
        ("/slots", vec![Reply::json(200, &slots_json(Some(0)))]),
    ]);
    let client = Client::new(config(server.socket()));
    let ((r, events), took) = timed(|| chat(&client, &request(0)));
    assert!(matches!(r, Err(InferError::WaitTimeout)), "{r:?}");
    near(took, 200);
    assert!(
        events.len() >= 3
            && events
                .iter()
                .all(|e| *e == ChatEvent::Waiting { slot_busy: true }),
        "{events:?}"
    );
    assert_eq!(server.requests_to("/slots").len(), events.len());
}

#[test]
fn smoke_silence_after_the_first_byte_is_stalled_with_the_partial() {
    let reply = Reply::sse(vec![content("Red", 1)]).ending(End::Silence);
    let server = FakeServer::start(vec![(CHAT, vec![reply])]);
    let client = Client::new(config(server.socket()));
    let start = Instant::now();
    let r = client.run(&request(0), &Cancel::new(), &mut |_| {});
    let took = start.elapsed();
    let failed = r.unwrap_err();
    assert!(
        matches!(failed.error, InferError::Stalled(Silence::Liveness)),
        "{failed}"
    );
    near(took, 100);
    assert_eq!(failed.partial.message.content.as_deref(), Some("Red"));
    assert!(
        server.requests_to("/slots").is_empty(),
        "no polls after the first byte"
    );
}

#[test]
fn smoke_slow_deltas_keep_a_stream_alive_past_any_single_limit() {
    // 60 ms apart, under a 200 ms liveness limit, for 480 ms in all: no total deadline.
    // (Liveness 200 ms here, not the suite's 100: on a loaded box a 60 ms gap came 100 ms late.)
    let mut pieces = Vec::new();
    for i in 0..4 {
        pieces.push(b": keep-alive\n\n".to_vec());
        pieces.push(content("x", i + 1));
    }
    pieces.push(finish(5));
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::sse(pieces).each_after(Duration::from_millis(60))],
    )]);
    let mut c = config(server.socket());
    c.limits.liveness_ms = 200;
    let client = Client::new(c);
    let ((r, _), took) = timed(|| chat(&client, &request(0)));
    assert_eq!(r.unwrap().message.content.as_deref(), Some("xxxx"));
    assert!(took >= Duration::from_millis(480), "{took:?}");
}

#[test]
fn connect_ms_ends_a_connect_to_a_listener_whose_backlog_is_full() {
    use socket2::{Domain, SockAddr, Socket, Type};
    let dir = llama_harness::temp_dir("loopd-backlog");
    let path = dir.join("infer.sock");
    let listener = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
    listener.bind(&SockAddr::unix(&path).unwrap()).unwrap();
    listener.listen(0).unwrap();
    // Fill the backlog with connections nobody accepts, until one would have to wait.
    let mut queued = Vec::new();
    loop {
        let s = Socket::new(Domain::UNIX, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        match s.connect(&SockAddr::unix(&path).unwrap()) {
            Ok(()) => queued.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
        assert!(queued.len() < 1_000, "the backlog never filled");
    }
    let client = Client::new(config(&path));
    let ((r, events), took) = timed(|| chat(&client, &request(0)));
    assert!(
        matches!(r, Err(InferError::TimedOut(Deadline::Connect))),
        "{r:?}"
    );
    assert!(events.is_empty());
    near(took, 150);
    drop(listener);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connect_ms_ends_a_request_write_the_server_never_reads() {
    let dir = llama_harness::temp_dir("loopd-noread");
    let path = dir.join("infer.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        // Holds the connection, never reading, until the test is done with it.
        let _ = released.recv_timeout(Duration::from_secs(10));
        drop(conn);
    });
    let mut req = request(0);
    // Far more than a Unix socket buffers.
    req.messages = vec![ChatMessage::User {
        content: "x".repeat(8 << 20),
    }];
    let client = Client::new(config(&path));
    let start = Instant::now();
    let r = client.chat(&req, &mut |_| {});
    let took = start.elapsed();
    assert!(
        matches!(r, Err(InferError::TimedOut(Deadline::Connect))),
        "{r:?}"
    );
    // Rendering 8 MiB of JSON comes before the clock starts; allow for it.
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(2),
        "{took:?}"
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn call_ms_ends_trickled_props_slots_and_tokenize() {
    let props =
        r#"{"default_generation_settings":{"n_ctx":4096},"total_slots":2,"chat_template":"{{x}}"}"#;
    let server = FakeServer::start(vec![
        ("/props", vec![Reply::json(200, props).trickled(TRICKLE)]),
        (
            "/slots",
            vec![Reply::json(200, &slots_json(None)).trickled(TRICKLE)],
        ),
        (
            "/tokenize",
            vec![
                Reply::json(200, r#"{"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}"#)
                    .trickled(TRICKLE),
            ],
        ),
    ]);
    let client = Client::new(config(server.socket()));
    type Call<'a> = &'a dyn Fn() -> Result<(), InferError>;
    let calls: [(&str, Call); 3] = [
        ("/props", &|| client.props().map(drop)),
        ("/slots", &|| client.slots().map(drop)),
        ("/tokenize", &|| client.tokenize("hi").map(drop)),
    ];
    for (what, call) in calls {
        let (r, took) = timed(call);
        assert!(
            matches!(r, Err(InferError::TimedOut(Deadline::Call))),
            "{what}: {r:?}"
        );
        near(took, 300);
    }
}

#[test]
fn call_ms_ends_a_trickled_control_call_as_thinking_overrun() {
    let thinking: Vec<Vec<u8>> = (1..=20).map(|i| reasoning("hm", i)).collect();
    let server = FakeServer::start(vec![
        (CHAT, vec![Reply::sse(thinking).ending(End::Silence)]),
        (
            CONTROL,
            vec![Reply::json(
                200,
                r#"{"success":true,"padding":"........................"}"#,
            )
            .trickled(TRICKLE)],
        ),
    ]);
    let client = Client::new(config(server.socket()));
    let ((r, events), took) = timed(|| chat(&client, &request(0)));
    assert!(matches!(r, Err(InferError::ThinkingOverrun)), "{r:?}");
    near(took, 300);
    assert!(!events.contains(&ChatEvent::ThinkingCapped { tokens: 3 }));
}

#[test]
fn call_ms_ends_a_trickled_error_body_keeping_what_came() {
    let body = "Loading model, please wait while the weights are read from the disk".repeat(3);
    // The head at once, then the body one byte every 15 ms.
    let mut reply = Reply::json(503, &body);
    reply.pieces = body
        .bytes()
        .enumerate()
        .map(|(i, b)| (if i == 0 { Duration::ZERO } else { TRICKLE }, vec![b]))
        .collect();
    let server = FakeServer::start(vec![(CHAT, vec![reply])]);
    let mut c = config(server.socket());
    c.retry.attempts = 1;
    c.retry.delays_ms.clear();
    let client = Client::new(c);
    let ((r, _), took) = timed(|| chat(&client, &request(0)));
    match r {
        Err(InferError::Http {
            status: 503,
            body: kept,
        }) => {
            assert!(!kept.is_empty() && kept.len() < body.len(), "{kept:?}");
            assert!(body.starts_with(&kept));
        }
        other => panic!("{other:?}"),
    }
    near(took, 300);
}

#[test]
fn call_ms_ends_a_trickled_response_head() {
    let head = format!("HTTP/1.1 200 OK\r\nX-Padding: {}\r\n\r\n", "p".repeat(100));
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::raw(head.into_bytes()).trickled(TRICKLE)],
    )]);
    let client = Client::new(config(server.socket()));
    let ((r, _), took) = timed(|| chat(&client, &request(0)));
    assert!(
        matches!(r, Err(InferError::TimedOut(Deadline::Call))),
        "{r:?}"
    );
    near(took, 300);
}

#[test]
fn busy_wait_ms_ends_a_wait_at_the_slot_gate() {
    let server = FakeServer::start(vec![]);
    let client = Arc::new(Client::new(config(server.socket())));
    let held = hold_slot(&client, 0);
    let ((r, events), took) = timed(|| chat(&client, &request(0)));
    assert!(matches!(r, Err(InferError::WaitTimeout)), "{r:?}");
    near(took, 200);
    assert_eq!(events, [ChatEvent::Queued { ahead: 1 }]);
    assert_eq!(client.gate().queued(0), 0, "the waiter left the queue");
    assert!(server.requests().is_empty());
    drop(held);
}

#[test]
fn retry_total_ms_ends_a_retrys_wait_for_its_first_byte() {
    // The first attempt is cut at once; the retry's wait on a busy slot (which alone could
    // last busy_wait_ms) ends when the 250 ms budget does.
    let server = FakeServer::start(vec![
        (
            CHAT,
            vec![Reply::silence().ending(End::Cut), Reply::silence()],
        ),
        ("/slots", vec![Reply::json(200, &slots_json(Some(0)))]),
    ]);
    let mut c = config(server.socket());
    c.limits.busy_wait_ms = 10_000;
    c.retry.total_ms = 250;
    let client = Client::new(c);
    let mut events = Vec::new();
    let (r, took) = timed(|| client.chat_with_retry(&request(0), &mut |e| events.push(e.clone())));
    assert!(
        matches!(r, Err(InferError::TimedOut(Deadline::RetryTotal))),
        "{r:?}"
    );
    near(took, 250);
    assert!(
        matches!(events[0], ChatEvent::Retrying { attempt: 2, .. }),
        "{events:?}"
    );
    assert_eq!(
        server.requests_to(CHAT).len(),
        2,
        "no third attempt past the budget"
    );
}
