//! `loopd serve`'s daemon against the fake server: one slot table for every client, results
//! kept until fetched (TTL on a fake clock), cancel and shutdown with partial output, and
//! hostile clients on the socket, each answered with a typed error while others are served.
//! The start-up refusals run the real binary; the soak is in `daemon_soak.rs`, alone in its
//! process.

mod support;
use llama_harness::fake_worker as worker_fake;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use clock::FakeClock;
use loopd::daemon::client;
use loopd::daemon::protocol::MAX_LINE_BYTES;
use loopd::daemon::READ_DEADLINE;
use serde_json::{json, Value};
use support::daemon::{call_raw, command, error_of, serve_to_exit, slow_answer, submit, Running};
use support::{json_answer, FakeServer, Reply};
use worker_fake::{FakeWorker, Script};

const CHAT: &str = "/v1/chat/completions";

#[test]
fn three_clients_on_two_slots_the_third_is_refused_and_no_slot_is_shared() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(4, Duration::from_millis(150))],
    )]);
    let d = Running::on_system_clock(&server, 2);
    let socket = d.socket.clone();
    let replies: Vec<Value> = (0..3)
        .map(|i| {
            let s = socket.clone();
            thread::spawn(move || call_raw(&s, &submit(&format!("q{i}"))))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ids: Vec<u64> = replies.iter().filter_map(|r| r["id"].as_u64()).collect();
    let refused: Vec<&Value> = replies.iter().filter(|r| r["ok"] == json!(false)).collect();
    assert_eq!(ids.len(), 2, "{replies:?}");
    assert_eq!(refused.len(), 1, "{replies:?}");
    assert_eq!(error_of(refused[0]), "NO_SLOT_AVAILABLE");
    assert_eq!(
        refused[0]["detail"],
        "every slot is busy (2 of 2); there is no queue"
    );
    for id in &ids {
        let r = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
        assert_eq!(r["result"]["outcome"], "completed", "{r}");
        assert_eq!(r["result"]["content"], "w0 w1 w2 w3 ");
    }
    let mut slots: Vec<u64> = server
        .requests_to(CHAT)
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["id_slot"]
                .as_u64()
                .unwrap()
        })
        .collect();
    slots.sort();
    assert_eq!(slots, [0, 1], "the two live requests ran on distinct slots");
    let status = d.call(json!({"cmd": "status"}));
    assert_eq!(status["status"]["busy"], 0);
    assert_eq!(status["status"]["kept"], 0);
    let metrics = d.call(json!({"cmd": "metrics"}));
    let text = metrics["metrics"].as_str().unwrap();
    assert!(
        text.contains("loopd_requests_total{outcome=\"refused\",reason=\"NO_SLOT_AVAILABLE\"} 1"),
        "{text}"
    );
    assert!(text.contains("loopd_requests_total{outcome=\"completed\",reason=\"\"} 2"));
}

#[test]
fn a_result_is_fetched_once_and_expires_at_its_ttl_on_the_fake_clock() {
    let server = FakeServer::start(vec![(CHAT, vec![json_answer("Hello.")])]);
    let clock = FakeClock::new();
    let d = Running::start(&server, 1, Arc::new(clock.clone()), Duration::from_secs(10));
    let a = d.call(submit("a"))["id"].as_u64().unwrap();
    let r = d.call(json!({"cmd": "wait", "id": a, "timeout_ms": 20_000}));
    assert_eq!(r["result"]["content"], "Hello.");
    assert_eq!(
        error_of(&d.call(json!({"cmd": "result", "id": a}))),
        "NOT_FOUND"
    );
    let b = d.call(submit("b"))["id"].as_u64().unwrap();
    // Let it finish without fetching it, then move the fake clock to its TTL.
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.call(json!({"cmd": "status"}))["status"]["kept"] != 1 {
        assert!(Instant::now() < deadline, "b never finished");
        thread::sleep(Duration::from_millis(20));
    }
    clock.advance(Duration::from_millis(9_999));
    thread::sleep(Duration::from_millis(300));
    assert_eq!(d.call(json!({"cmd": "cancel", "id": b}))["state"], "ended");
    clock.advance(Duration::from_millis(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.call(json!({"cmd": "status"}))["status"]["kept"] != 0 {
        assert!(Instant::now() < deadline, "b never expired");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        error_of(&d.call(json!({"cmd": "result", "id": b}))),
        "NOT_FOUND"
    );
    let text = d.call(json!({"cmd": "metrics"}))["metrics"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("loopd_results_evicted_total{reason=\"expired\"} 1"),
        "{text}"
    );
}

#[test]
fn follow_streams_events_and_cancel_ends_with_the_partial_output() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(200, Duration::from_millis(50))],
    )]);
    let d = Running::on_system_clock(&server, 1);
    let socket = d.socket.clone();
    let follower = thread::spawn(move || {
        let mut events = Vec::new();
        let end = client::follow(
            &socket,
            &command(
                json!({"cmd": "submit", "messages": [{"role": "user", "content": "go"}], "follow": true}),
            ),
            Duration::from_secs(30),
            &mut |_| {},
            &mut |e| events.push(serde_json::to_value(e).unwrap()),
        )
        .unwrap();
        let end = serde_json::to_value(end).unwrap();
        (events, end)
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let s = d.call(json!({"cmd": "status"}));
        if let Some(id) = s["status"]["running"][0].as_u64() {
            break id;
        }
        assert!(Instant::now() < deadline, "never running: {s}");
        thread::sleep(Duration::from_millis(20));
    };
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        d.call(json!({"cmd": "cancel", "id": id}))["state"],
        "cancelling"
    );
    let (events, end) = follower.join().unwrap();
    assert_eq!(events[0]["event"], "generation");
    assert!(events.iter().any(|e| e["event"] == "content"), "{events:?}");
    let r = &end["result"];
    assert_eq!(r["outcome"], "failed");
    assert_eq!(r["fail_reason"], "cancelled");
    let partial = r["content"].as_str().unwrap();
    assert!(partial.starts_with("w0 "), "{r}");
    // The follower's copy did not fetch it.
    let fetched = d.call(json!({"cmd": "result", "id": id}));
    assert_eq!(fetched["result"]["content"], partial);
    assert_eq!(
        error_of(&d.call(json!({"cmd": "follow", "id": id}))),
        "NOT_FOUND"
    );
}

#[test]
fn shutdown_cancels_what_runs_and_tells_the_follower_with_partial_output() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(200, Duration::from_millis(50))],
    )]);
    let mut d = Running::on_system_clock(&server, 2);
    let id = d.call(submit("go"))["id"].as_u64().unwrap();
    let socket = d.socket.clone();
    let follower = thread::spawn(move || {
        let end = client::follow(
            &socket,
            &command(json!({"cmd": "follow", "id": id})),
            Duration::from_secs(30),
            &mut |_| {},
            &mut |_| {},
        )
        .unwrap();
        serde_json::to_value(end).unwrap()
    });
    thread::sleep(Duration::from_millis(400));
    d.stop();
    let end = follower.join().unwrap();
    assert_eq!(end["result"]["fail_reason"], "cancelled", "{end}");
    assert!(end["result"]["content"]
        .as_str()
        .unwrap()
        .starts_with("w0 "));
    assert!(!d.socket.exists(), "the socket file is removed");
    assert!(UnixStream::connect(&d.socket).is_err());
}

fn raw(socket: &Path, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The daemon may answer and close before the whole of an over-long line is written.
    let _ = s.write_all(bytes);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn hostile_clients_get_typed_errors_and_the_others_are_served() {
    let server = FakeServer::start(vec![(CHAT, vec![json_answer("ok")])]);
    let d = Running::on_system_clock(&server, 2);
    // A client that connects and sends nothing holds only its own thread, until the deadline.
    let silent = UnixStream::connect(&d.socket).unwrap();
    silent.set_read_timeout(Some(READ_DEADLINE * 4)).unwrap();
    // A client that sends half a line and stops.
    let mut half = UnixStream::connect(&d.socket).unwrap();
    half.write_all(br#"{"cmd":"sta"#).unwrap();
    half.set_read_timeout(Some(READ_DEADLINE * 4)).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json\n".to_vec(), "BAD_JSON"),
        (b"{\"cmd\":\"explode\"}\n".to_vec(), "UNKNOWN_COMMAND"),
        (b"{\"cmd\":\"result\",\"id\":\"x\"}\n".to_vec(), "BAD_REQUEST"),
        (b"{\"cmd\":\"result\",\"id\":99}\n".to_vec(), "NOT_FOUND"),
        (b"{\"cmd\":\"cancel\",\"id\":99}\n".to_vec(), "NOT_FOUND"),
        (
            b"{\"cmd\":\"submit\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[\"rm_rf\"]}\n"
                .to_vec(),
            "UNKNOWN_TOOL",
        ),
        (vec![b'x'; MAX_LINE_BYTES + 10], "LINE_TOO_LONG"),
        (b"\xff\xfe\n".to_vec(), "BAD_JSON"),
    ];
    for (bytes, code) in cases {
        let out = raw(&d.socket, &bytes);
        let v: Value = serde_json::from_str(out.trim_end()).unwrap_or_else(|_| panic!("{out}"));
        assert_eq!(error_of(&v), code, "{out}");
    }
    // A line at the cap is still read (and is bad JSON only because of its padding).
    let mut at_cap = br#"{"cmd":"status"}"#.to_vec();
    at_cap.resize(MAX_LINE_BYTES - 1, b' ');
    at_cap.push(b'\n');
    let v: Value = serde_json::from_str(raw(&d.socket, &at_cap).trim_end()).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    // Meanwhile everyone else is served.
    let id = d.call(submit("hi"))["id"].as_u64().unwrap();
    let r = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
    assert_eq!(r["result"]["content"], "ok");
    // The silent and the half-line clients are told at the deadline.
    for mut s in [silent, half] {
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let v: Value = serde_json::from_str(out.trim_end()).unwrap_or_else(|_| panic!("{out}"));
        assert_eq!(error_of(&v), "READ_TIMEOUT");
    }
    // A second daemon on the same socket is refused while this one listens.
    assert_eq!(
        socket_file::bind(&d.socket).unwrap_err(),
        socket_file::ListenError::InUse
    );
    // Every hostile connection (and the probe `bind` just made) is let go: only the status
    // call itself is left. A connection's thread counts down when it sees the close, so this
    // is waited for, not read at one instant.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = d.call(json!({"cmd": "status"}))["status"]["connections"].clone();
        if seen == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "connections still {seen} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An `[expect]` that no server matches: `serve` needs one to start, and its self-test fails.
const WRONG_EXPECT: &str = "[expect]\nchat_template_sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\nn_ctx = 4096\ntotal_slots = 2\n";

fn serve_config(server: &FakeServer, extra: &str) -> (PathBuf, PathBuf) {
    let dir = server.socket().parent().unwrap().to_owned();
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = \"smollm2\"\n[limits]\nload_wait_ms = 300\npoll_ms = 50\n\
             [retry]\nattempts = 1\ndelays_ms = []\n[daemon]\nsocket = {:?}\n{extra}",
            server.socket().display().to_string(),
            socket.display().to_string(),
        ),
    )
    .unwrap();
    (config, socket)
}

/// [`serve_config`] linked to a fake llama-worker in `state`, with `load_wait_ms`: the config,
/// the daemon's socket and the worker (alive as long as it is held).
fn config_with_worker(
    server: &FakeServer,
    state: &'static str,
    load_wait_ms: u64,
) -> (PathBuf, PathBuf, FakeWorker) {
    let worker = FakeWorker::start(Script {
        state,
        ..Script::default()
    });
    let (config, socket) = serve_config(
        server,
        &format!(
            "[runner]\nworker_socket = {:?}\n{WRONG_EXPECT}",
            worker.socket().display().to_string()
        ),
    );
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "load_wait_ms = 300",
        &format!("load_wait_ms = {load_wait_ms}"),
    );
    std::fs::write(&config, text).unwrap();
    (config, socket, worker)
}

#[test]
fn serve_refuses_to_start_on_a_failing_self_test_and_never_opens_its_socket() {
    let props = json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2,
                       "chat_template": "{{ messages }}"});
    let server = FakeServer::start(vec![
        ("/props", vec![Reply::json(200, &props.to_string())]),
        (CHAT, vec![json_answer("no tools here")]),
    ]);
    let wrong = "0".repeat(64);
    let (config, socket) = serve_config(
        &server,
        &format!("[expect]\nchat_template_sha256 = \"{wrong}\"\nn_ctx = 4096\ntotal_slots = 2\n"),
    );
    let (code, stderr) = serve_to_exit(&config);
    assert_eq!(code, Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(
        last.starts_with(&format!(
            "loopd serve: refusing to start: the self-test failed: FAIL server    chat_template sha256 expected {wrong} got "
        )),
        "{stderr}"
    );
    assert!(!socket.exists());
}

#[test]
fn serve_refuses_to_start_when_the_server_never_loads() {
    let server = FakeServer::start(vec![(
        "/props",
        vec![Reply::json(503, r#"{"error":{"message":"Loading model"}}"#)],
    )]);
    let (config, socket) = serve_config(&server, WRONG_EXPECT);
    let (code, stderr) = serve_to_exit(&config);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.lines().last().unwrap().starts_with(
            "loopd serve: refusing to start: the server did not answer GET /props within 0 s"
        ),
        "{stderr}"
    );
    assert!(!socket.exists());
}

#[test]
fn submit_tools_are_the_tools_its_generations_offer() {
    let server = FakeServer::start(vec![(CHAT, vec![json_answer("ok")])]);
    let d = Running::on_system_clock(&server, 1);
    let all = d.call(json!({"cmd": "status"}))["status"]["tools"].clone();
    let mut offered = Vec::new();
    for tools in [None, Some(json!(["arithmetic"])), Some(json!([]))] {
        let mut cmd = submit("hi");
        if let Some(t) = &tools {
            cmd["tools"] = t.clone();
        }
        let id = d.call(cmd)["id"].as_u64().unwrap();
        let r = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
        assert_eq!(r["result"]["outcome"], "completed", "{r}");
        let sent = server.requests_to(CHAT).pop().unwrap();
        let body: Value = serde_json::from_slice(&sent.body).unwrap();
        let names: Vec<Value> = body["tools"].as_array().map_or(Vec::new(), |t| {
            t.iter().map(|t| t["function"]["name"].clone()).collect()
        });
        offered.push(Value::Array(names));
    }
    assert!(all.as_array().unwrap().len() > 1, "{all}");
    assert_eq!(offered, [all, json!(["arithmetic"]), json!([])]);
}

#[test]
fn serve_waits_for_a_restarting_worker_and_says_so_once() {
    let props = json!({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2,
                       "chat_template": "{{ messages }}"});
    let loading = Reply::json(503, r#"{"error":{"message":"Loading model"}}"#);
    let server = FakeServer::start(vec![
        (
            "/props",
            vec![
                loading.clone(),
                loading.clone(),
                loading,
                Reply::json(200, &props.to_string()),
            ],
        ),
        (CHAT, vec![json_answer("no tools here")]),
    ]);
    // Three polls see the worker restarting and the server loading; the fourth gets /props.
    let (config, socket, _worker) = config_with_worker(&server, "restarting", 20_000);
    let (code, stderr) = serve_to_exit(&config);
    let waiting: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("llama-worker is restarting"))
        .collect();
    assert_eq!(
        waiting,
        [
            "loopd: llama-worker is restarting the server; waiting for it up to 20 s \
          (limits.load_wait_ms)"
        ],
        "{stderr}"
    );
    assert!(server.requests_to("/props").len() >= 4, "{stderr}");
    // It got past the wait: the self-test ran (and refused: the [expect] is wrong).
    assert!(
        stderr.contains("refusing to start: the self-test failed"),
        "{stderr}"
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(!socket.exists());
}

/// `loopd run` in process asks llama-worker first, as the daemon's `submit` does: a worker
/// that cannot serve refuses at once with the seed's name, and the server is never asked (it
/// used to wait out `load_wait_ms` on `GET /props`).
#[test]
fn loopd_run_refuses_at_once_with_the_seeds_name_when_the_worker_cannot_serve() {
    for (state, code) in [
        ("restarting", "WORKER_NOT_READY"),
        ("starting", "WORKER_NOT_READY"),
        ("failed", "WORKER_FAILED"),
        ("stopped", "WORKER_STOPPED"),
    ] {
        let server = FakeServer::start(vec![]);
        // A load wait the refusal must not sit out.
        let (config, _, _worker) = config_with_worker(&server, state, 600_000);
        let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(["run", "--config"])
            .arg(&config)
            .arg("What is 2 + 2?")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // Status 3: refused (docs/loopd.md, exit status).
        assert_eq!(out.status.code(), Some(3), "{state}: {err}");
        assert!(
            err.lines()
                .last()
                .unwrap_or_default()
                .starts_with(&format!("loopd run: {code}: llama-worker is {state}")),
            "{state}: {err}"
        );
        assert_eq!(server.requests(), [], "{state}: the server was asked");
    }
}
