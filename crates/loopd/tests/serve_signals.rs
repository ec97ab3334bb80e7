//! `loopd serve` as systemd runs it, through the real binary against a fake server that passes
//! the self-test: `READY=1` on `NOTIFY_SOCKET` only once the socket answers and the self-test
//! passed; SIGTERM cancels what runs (its follower gets `cancelled` with the partial output)
//! and exits 0; a second signal during a slow shutdown exits at once (status 130); and a second
//! `loopd serve` on a live socket or store refuses to start, before its self-test.

mod support;
use llama_harness::fake_worker as worker_fake;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use loopd::daemon::client;
use serde_json::{json, Value};
use support::daemon::{call_raw, command, serve_to_exit};
use support::serve::{passing_self_test, props, write_config, Served};
use support::{done, json_answer, json_chunk, json_content, End, FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";
fn slow_answer(n: usize, every: Duration) -> Reply {
    let mut pieces: Vec<Vec<u8>> = (0..n).map(|i| json_content(&format!("w{i} "))).collect();
    pieces.push(json_chunk(json!({}), Some("stop"), 5));
    pieces.push(done());
    Reply::sse(pieces).each_after(every)
}

/// Submits a followed request on a thread; its events come on the channel, its end line from
/// the handle.
fn follow(socket: &Path) -> (mpsc::Receiver<Value>, JoinHandle<Value>) {
    let (tx, rx) = mpsc::channel();
    let socket = socket.to_owned();
    let h = thread::spawn(move || {
        let end = client::follow(
            &socket,
            &command(
                json!({"cmd": "submit", "messages": [{"role": "user", "content": "go"}], "follow": true}),
            ),
            Duration::from_secs(60),
            &mut |_| {},
            &mut |e| {
                let _ = tx.send(serde_json::to_value(e).unwrap());
            },
        )
        .unwrap();
        serde_json::to_value(end).unwrap()
    });
    (rx, h)
}

/// Waits for an event that `want` accepts, or panics with the events seen.
fn wait_event(rx: &mpsc::Receiver<Value>, want: impl Fn(&Value) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) if want(&e) => return,
            Ok(e) => seen.push(e),
            Err(_) => panic!("no {what} within 30 s; saw {seen:?}"),
        }
    }
}

#[test]
fn ready_after_the_self_test_and_sigterm_cancels_with_partial_output_and_exits_0() {
    let mut chat = passing_self_test();
    chat.push(slow_answer(400, Duration::from_millis(50)));
    let server = FakeServer::start(vec![("/props", vec![props()]), (CHAT, chat)]);
    let served = Served::start(&server, 200, "");
    let ready = served.notified(Duration::from_secs(60));
    assert_eq!(
        ready.as_deref(),
        Some("READY=1"),
        "no READY=1 within 60 s; the fake server saw {} chat requests",
        server.requests_to(CHAT).len()
    );
    // When READY=1 came, the self-test's three generations were done and the socket answered.
    assert_eq!(server.requests_to(CHAT).len(), 3);
    let status = call_raw(&served.socket, &json!({"cmd": "status"}));
    assert_eq!(status["ok"], true, "{status}");
    // A request is running and has said something.
    let (events, follower) = follow(&served.socket);
    wait_event(&events, |e| e["event"] == "content", "content event");
    served.signal("TERM");
    let signalled = Instant::now();
    let end = follower.join().unwrap();
    let r = &end["result"];
    assert_eq!(r["outcome"], "failed", "{end}");
    assert_eq!(r["fail_reason"], "cancelled", "{end}");
    // Not the caller's words: an operator reading the store sees who cancelled.
    assert_eq!(r["detail"], "loopd serve was stopped", "{end}");
    assert!(r["content"].as_str().unwrap().starts_with("w0 "), "{end}");
    assert_eq!(
        served.notified(Duration::from_secs(30)).as_deref(),
        Some("STOPPING=1")
    );
    let socket = served.socket.clone();
    let (status, stderr) = served.exit_within(Duration::from_secs(30));
    let took = signalled.elapsed();
    eprintln!("loopd serve: SIGTERM to exit in {took:?} (poll_ms 200)");
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("loopd serve: SIGTERM: stopping (cancelling what runs"),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().last(),
        Some("loopd serve: stopped"),
        "{stderr}"
    );
    assert!(!socket.exists(), "the socket file is removed");
    // One line at the request's end (its format: daemon/state.rs's `end_line` test).
    let ends: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" end outcome="))
        .collect();
    assert_eq!(ends.len(), 1, "{stderr}");
    assert!(
        ends[0].starts_with(
            "loopd serve: req-1 end outcome=failed reason=cancelled generations=1 prompt_tokens="
        ),
        "{stderr}"
    );
}

#[test]
fn a_second_signal_during_a_slow_shutdown_exits_at_once() {
    let mut chat = passing_self_test();
    // The request's first byte never comes and nothing is due for 20 s (the next /slots poll,
    // the next worker status): its cancel is seen only then, so the shutdown is slow.
    chat.push(Reply::silence());
    let server = FakeServer::start(vec![("/props", vec![props()]), (CHAT, chat)]);
    let mut served = Served::start(&server, 20_000, "[runner]\nworker_poll_ms = 60000\n");
    served.expect_ready(Duration::from_secs(60));
    let id = call_raw(
        &served.socket,
        &json!({"cmd": "submit", "messages": [{"role": "user", "content": "go"}]}),
    )["id"]
        .as_u64()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.requests_to(CHAT).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "request {id} never reached the server"
        );
        thread::sleep(Duration::from_millis(20));
    }
    served.signal("TERM");
    assert_eq!(
        served.notified(Duration::from_secs(30)).as_deref(),
        Some("STOPPING=1"),
        "the first signal starts the shutdown"
    );
    served.signal("INT");
    let (status, stderr) = served.exit_within(Duration::from_secs(15));
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some("loopd serve: SIGINT again: exiting now"),
        "{stderr}"
    );
}

#[test]
fn a_second_loopd_serve_on_a_live_store_or_socket_refuses_to_start() {
    let mut chat = passing_self_test();
    chat.extend(passing_self_test());
    let server = FakeServer::start(vec![("/props", vec![props()]), (CHAT, chat)]);
    let mut first = Served::start(&server, 200, "");
    first.expect_ready(Duration::from_secs(60));
    let dir = server.socket().parent().unwrap().to_owned();
    let (config, socket) = write_config(&server, &dir, 200, "");
    let asked = server.requests().len();
    // The same socket: refused at once, before the self-test (tests/cli.rs times it).
    let (code, stderr) = serve_to_exit(&config);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "loopd serve: refusing to start: a loopd serve is already serving on {s} \
             (`loopd status --socket {s}`)\n",
            s = socket.display()
        )
    );
    assert_eq!(server.requests().len(), asked, "the server was asked");
    // A socket of its own but the same store: refused at once, naming the file and what is
    // wrong with it.
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &format!("socket = {:?}", socket.display().to_string()),
        &format!(
            "socket = {:?}",
            dir.join("other.sock").display().to_string()
        ),
    );
    std::fs::write(&config, text).unwrap();
    let (code, stderr) = serve_to_exit(&config);
    assert_eq!(code, Some(1), "{stderr}");
    let store = dir.join("loopd.db");
    assert!(
        stderr.lines().last().unwrap().starts_with(&format!(
            "loopd serve: refusing to start: store {}: locked by another process (is another \
             loopd serve using this store?): ",
            store.display()
        )),
        "{stderr}"
    );
    assert_eq!(server.requests().len(), asked, "the server was asked");
    // The first one still serves.
    assert!(UnixStream::connect(&socket).is_ok());
    first.signal("TERM");
    let (status, stderr) = first.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// A request that streams `a0 ` and, `every` later, `a1 `, then is silent for good.
fn two_pieces_then_silence(every: Duration) -> Reply {
    Reply::sse(vec![json_content("a0 "), json_content("a1 ")])
        .each_after(every)
        .ending(End::Silence)
}

fn call(socket: &Path, cmd: Value) -> Value {
    call_raw(socket, &cmd)
}

/// `kill -9` of `loopd serve` with two requests running and three results unfetched, then a
/// new `loopd serve` on the same store: the three results are fetched intact, the two running
/// ones are `failed`/`daemon_restarted` with the output they had streamed (checkpointed before
/// their followers saw it), and new ids are greater than every old one.
#[test]
fn kill_9_loses_nothing_acknowledged_and_running_requests_come_back_daemon_restarted() {
    let mut chat = passing_self_test();
    chat.extend(["one", "two", "three"].map(json_answer));
    // A second apart, so the second piece is past the once-a-second checkpoint rate.
    let every = Duration::from_millis(1_200);
    chat.extend([
        two_pieces_then_silence(every),
        two_pieces_then_silence(every),
    ]);
    chat.extend(passing_self_test());
    chat.push(json_answer("after"));
    let server = FakeServer::start(vec![("/props", vec![props(), props()]), (CHAT, chat)]);
    let mut first = Served::start(&server, 200, "");
    first.expect_ready(Duration::from_secs(60));
    let socket = first.socket.clone();
    let submit = |text: &str| {
        let r = call(
            &socket,
            json!({"cmd": "submit", "messages": [{"role": "user", "content": text}]}),
        );
        r["id"].as_u64().unwrap_or_else(|| panic!("{r}"))
    };
    // Three that end and are never fetched, one at a time (the script's order).
    let mut done = Vec::new();
    for (i, text) in ["q1", "q2", "q3"].into_iter().enumerate() {
        done.push(submit(text));
        let deadline = Instant::now() + Duration::from_secs(30);
        while call(&socket, json!({"cmd": "status"}))["status"]["kept"] != i + 1 {
            assert!(Instant::now() < deadline, "{text} never ended");
            thread::sleep(Duration::from_millis(20));
        }
    }
    // Two running, each followed until its second piece: by then it is checkpointed.
    let running: Vec<u64> = (0..2).map(|i| submit(&format!("slow{i}"))).collect();
    let followers: Vec<_> = running
        .iter()
        .map(|id| {
            let (tx, rx) = mpsc::channel();
            let (socket, id) = (socket.clone(), *id);
            thread::spawn(move || {
                let _ = client::follow(
                    &socket,
                    &command(json!({"cmd": "follow", "id": id})),
                    Duration::from_secs(60),
                    &mut |_| {},
                    &mut |e| {
                        let _ = tx.send(serde_json::to_value(e).unwrap());
                    },
                );
            });
            rx
        })
        .collect();
    for rx in &followers {
        wait_event(rx, |e| e["event"] == "content" && e["text"] == "a1 ", "a1");
    }
    let status = call(&socket, json!({"cmd": "status"}))["status"].clone();
    assert_eq!(status["running"], json!(running), "{status}");
    assert_eq!(status["kept"], 3, "{status}");
    first.signal("KILL");
    let (status, _) = first.exit_within(Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed by SIGKILL");

    let mut second = Served::start(&server, 200, "");
    second.expect_ready(Duration::from_secs(60));
    for (id, text) in done.iter().zip(["one", "two", "three"]) {
        let r = call(&socket, json!({"cmd": "result", "id": id}));
        let r = &r["result"];
        assert_eq!(
            (&r["id"], &r["outcome"], &r["content"], &r["finish_reason"]),
            (
                &json!(id),
                &json!("completed"),
                &json!(text),
                &json!("stop")
            ),
            "{r}"
        );
    }
    for id in &running {
        let r = call(&socket, json!({"cmd": "result", "id": id}));
        let r = &r["result"];
        assert_eq!(
            (&r["id"], &r["outcome"], &r["fail_reason"], &r["content"]),
            (
                &json!(id),
                &json!("failed"),
                &json!("daemon_restarted"),
                &json!("a0 a1 ")
            ),
            "{r}"
        );
        // Fetched once, as any result.
        let again = call(&socket, json!({"cmd": "result", "id": id}));
        assert_eq!(again["error"], "NOT_FOUND", "{again}");
    }
    let metrics = call(&socket, json!({"cmd": "metrics"}));
    assert!(
        metrics["metrics"]
            .as_str()
            .unwrap()
            .contains("loopd_requests_total{outcome=\"failed\",reason=\"daemon_restarted\"} 2"),
        "{metrics}"
    );
    let new = submit("after");
    let old_max = running.iter().chain(&done).max().copied().unwrap();
    assert_eq!((old_max, new), (5, 6), "ids are never reused");
    let r = call(
        &socket,
        json!({"cmd": "wait", "id": new, "timeout_ms": 30_000}),
    );
    assert_eq!(r["result"]["content"], "after", "{r}");
    second.signal("TERM");
    let (status, stderr) = second.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{stderr}");
    for id in &running {
        let line = format!(
            "loopd serve: req-{id} was running when the last daemon stopped: failed \
             (daemon_restarted) with the output it had streamed"
        );
        assert!(stderr.lines().any(|l| l == line), "no `{line}` in {stderr}");
    }
}

/// With several hosts (`[[host]]`), a request running at a `kill -9` comes back
/// `daemon_restarted` naming the host it ran on, as every result of such a daemon does: the
/// seat is stored with the request when it is placed.
#[test]
fn a_request_running_at_a_kill_9_comes_back_naming_its_host() {
    let mut chat = passing_self_test();
    chat.push(two_pieces_then_silence(Duration::from_millis(50)));
    chat.extend(passing_self_test());
    let server = FakeServer::start(vec![("/props", vec![props(), props()]), (CHAT, chat)]);
    let worker = worker_fake::FakeWorker::start(worker_fake::Script::default());
    let host = format!(
        "[[host]]\nname = \"gpu-b\"\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [1]\n",
        server.socket().display().to_string(),
        worker.socket().display().to_string(),
    );
    let mut first = Served::start(&server, 200, &host);
    first.expect_ready(Duration::from_secs(60));
    let socket = first.socket.clone();
    let r = call(
        &socket,
        json!({"cmd": "submit", "messages": [{"role": "user", "content": "slow"}]}),
    );
    let id = r["id"].as_u64().unwrap_or_else(|| panic!("{r}"));
    // Killed while it runs: the checkpoint may or may not hold its text, the seat is there.
    // Not before its request reached the server: "running" is said when it is placed, and a
    // request killed before its POST would leave its reply to the next daemon's self-test.
    let deadline = Instant::now() + Duration::from_secs(30);
    let asked = passing_self_test().len() + 1;
    loop {
        let status = call(&socket, json!({"cmd": "status"}));
        let seen = server.requests_to(CHAT).len();
        if status["status"]["running"] == json!([id]) && seen == asked {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "req-{id} never ran: {status}, the server saw {seen} chat requests of {asked}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    first.signal("KILL");
    let (status, _) = first.exit_within(Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed by SIGKILL");

    let mut second = Served::start(&server, 200, &host);
    second.expect_ready(Duration::from_secs(60));
    let r = call(&second.socket, json!({"cmd": "result", "id": id}));
    let r = &r["result"];
    assert_eq!(
        (&r["fail_reason"], &r["host"]),
        (&json!("daemon_restarted"), &json!("gpu-b")),
        "{r}"
    );
    second.signal("TERM");
    let (status, stderr) = second.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{stderr}");
}

/// A session survives `kill -9` of `loopd serve`: the turn running at the kill comes back
/// `daemon_restarted` and is not in the log (nothing is recorded until a turn completes), the
/// session is free again, and its next turn extends the last completed one, byte for byte.
#[test]
fn a_session_survives_kill_9_and_the_turn_running_at_the_kill_is_not_in_its_log() {
    let mut chat = passing_self_test();
    chat.push(json_answer("one"));
    chat.push(two_pieces_then_silence(Duration::from_millis(50)));
    chat.extend(passing_self_test());
    chat.push(json_answer("three"));
    let server = FakeServer::start(vec![("/props", vec![props(), props()]), (CHAT, chat)]);
    let mut first = Served::start(&server, 200, "");
    first.expect_ready(Duration::from_secs(60));
    let socket = first.socket.clone();
    assert_eq!(
        call(&socket, json!({"cmd": "open", "session": "s"})),
        json!({"ok": true, "session": "s"})
    );
    let turn = |content: &str| {
        let r = call(
            &socket,
            json!({"cmd": "turn", "session": "s", "content": content}),
        );
        r["id"].as_u64().unwrap_or_else(|| panic!("{r}"))
    };
    let one = turn("first");
    let r = call(
        &socket,
        json!({"cmd": "wait", "id": one, "timeout_ms": 30_000}),
    );
    assert_eq!(r["result"]["content"], "one", "{r}");
    let running = turn("second");
    let (tx, rx) = mpsc::channel();
    let s = socket.clone();
    thread::spawn(move || {
        let _ = client::follow(
            &s,
            &command(json!({"cmd": "follow", "id": running})),
            Duration::from_secs(60),
            &mut |_| {},
            &mut |e| {
                let _ = tx.send(serde_json::to_value(e).unwrap());
            },
        );
    });
    wait_event(&rx, |e| e["event"] == "content" && e["text"] == "a1 ", "a1");
    first.signal("KILL");
    let (status, _) = first.exit_within(Duration::from_secs(10));
    assert_eq!(status.code(), None, "killed by SIGKILL");

    let mut second = Served::start(&server, 200, "");
    second.expect_ready(Duration::from_secs(60));
    let r = call(&socket, json!({"cmd": "result", "id": running}));
    assert_eq!(r["result"]["fail_reason"], "daemon_restarted", "{r}");
    let h = call(&socket, json!({"cmd": "history", "session": "s"}));
    let kinds: Vec<&str> = h["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["user", "assistant", "turn"], "{h}");
    assert_eq!(h["session"].get("running"), None, "{h}");
    let again = turn("again");
    let r = call(
        &socket,
        json!({"cmd": "wait", "id": again, "timeout_ms": 30_000}),
    );
    assert_eq!(r["result"]["content"], "three", "{r}");
    assert_eq!(r["result"]["session"]["turn"], 2, "{r}");
    assert_eq!(r["result"]["session"]["extends"], true, "{r}");
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    // The self-test's three, turn 1, the turn cut by the kill, the self-test again, turn 2.
    assert_eq!(bodies.len(), 9);
    assert_eq!(
        llama_harness::fake::extension(&bodies[3], &bodies[8]).unwrap(),
        [
            json!({"role": "assistant", "content": "one"}),
            json!({"role": "user", "content": "again"})
        ]
    );
    second.signal("TERM");
    let (status, stderr) = second.exit_within(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{stderr}");
}
