//! The seed's retry on the daemon's path, on the real local stack (llama-worker,
//! llama-server, inferproxy, `loopd serve`), spoken to over the daemon's socket:
//!
//! 1. inferproxy's accept bucket emptied (connections opened and closed until one is refused,
//!    as a burst of clients would) and kept empty while two short requests are submitted at
//!    once and for a second after: both complete, each after a `retrying` event (the bucket
//!    refills at 2 a second; the first retry waits about 2 s). Kept empty, not emptied once:
//!    a token that refilled between the emptying and a request's connect let it through at
//!    once in 1 of 5 soak runs, and then the test had nothing to check;
//! 2. inferproxy killed under a streaming request and started again a moment later: the request
//!    completes after a retry, and its answer holds nothing of the cut attempt twice.
//!
//! Greedy sampling with a seed and a small `max_tokens`, as every test that reads the model.

mod real_serve;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use llama_harness::{LocalServer, Proxy};
use real_serve::{start_serve, write_config};
use serde_json::{json, Value};

/// One daemon connection's line reader and writer.
struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Conn {
    fn open(socket: &Path) -> Conn {
        let s = UnixStream::connect(socket).unwrap();
        // Every read has a deadline: a daemon that says nothing fails the test, never hangs it.
        s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        Conn {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn send(&mut self, v: &Value) {
        self.writer.write_all(format!("{v}\n").as_bytes()).unwrap();
    }

    fn line(&mut self) -> Value {
        let mut l = String::new();
        let n = self.reader.read_line(&mut l).unwrap();
        assert!(n > 0, "the daemon closed the connection");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }
}

fn submit(prompt: &str, max_tokens: u64, follow: bool) -> Value {
    json!({"cmd": "submit", "messages": [{"role": "user", "content": prompt}], "budget": 0,
           "tools": [], "max_tokens": max_tokens, "follow": follow})
}

/// Opens and closes connections to inferproxy until it refuses one (closes it at once, without
/// forwarding): its accept bucket is empty. Returns how many it took.
fn empty_bucket(socket: &Path) -> usize {
    for n in 1..=40 {
        let mut s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A request the server answers at once: a refused connection answers nothing.
        let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut head = [0u8; 12];
        if !matches!(s.read(&mut head), Ok(n) if n > 0) {
            return n;
        }
    }
    panic!("inferproxy admitted 40 connections at once: is its accept limit gone?");
}

/// Keeps inferproxy's accept bucket empty until `stop` (each token that refills is taken by a
/// connection closed at once); returns how many it took.
fn keep_bucket_empty(socket: &Path, stop: &std::sync::atomic::AtomicBool) -> usize {
    let mut took = 0;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        if let Ok(mut s) = UnixStream::connect(socket) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            if matches!(s.read(&mut head), Ok(n) if n > 0) {
                took += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    took
}

/// The retries of a result, as `(error, attempt)`.
fn retries(r: &Value) -> Vec<(String, u64)> {
    r["retries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["error"].as_str().unwrap().to_owned(),
                t["attempt"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_refused_or_cut_generation_is_retried_and_completes() {
    let server = LocalServer::start();
    let mut proxy = Proxy::start(server.addr());
    let dir = llama_harness::temp_dir("loopd-retry-real");
    let (config, socket) = write_config(
        &dir,
        &server,
        &proxy,
        "poll_ms = 500\nliveness_ms = 300000\nmax_tokens = 400",
        "budget = 0\nstall_ms = 300000\ndeath_grace_ms = 1000",
    );
    let folder = dir.join("folder");
    std::fs::create_dir(&folder).unwrap();
    let (_serve, log) = start_serve(&config, &folder, &dir);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();

    // 1. The bucket emptied and kept empty, then two requests at once.
    let took = empty_bucket(proxy.socket());
    let stop = std::sync::atomic::AtomicBool::new(false);
    // One command per connection (docs/loopd.md).
    let ask = |cmd: &Value| {
        let mut conn = Conn::open(&socket);
        conn.send(cmd);
        conn.line()
    };
    let mut ids = Vec::new();
    let refilled = std::thread::scope(|scope| {
        let keeper = scope.spawn(|| keep_bucket_empty(proxy.socket(), &stop));
        for prompt in ["What is the capital of France?", "Name a colour."] {
            let reply = ask(&submit(prompt, 16, false));
            assert_eq!(reply["ok"], true, "{reply}");
            ids.push(reply["id"].as_u64().unwrap());
        }
        // The first attempts go out at once; the retries about 2 s later find tokens again.
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        keeper.join().unwrap()
    });
    eprintln!("kept the bucket empty for a second: {refilled} refilled tokens taken");
    for id in ids {
        let reply = ask(&json!({"cmd": "wait", "id": id, "timeout_ms": 600000}));
        let r = &reply["result"];
        eprintln!(
            "bucket emptied after {took} connections; req-{id}: {} {} retries {}",
            r["outcome"], r["detail"], r["retries"]
        );
        assert_eq!(r["outcome"], "completed", "{r:#}\n{}", said());
        let tried = retries(r);
        assert!(!tried.is_empty(), "req-{id} was let through at once: {r:#}");
        assert!(
            tried
                .iter()
                .all(|(e, _)| e == "connect_error" || e == "stream_closed_early"),
            "{r:#}"
        );
    }

    // 2. inferproxy killed under a streaming request, and started again.
    let mut follow = Conn::open(&socket);
    follow.send(&submit(
        "Count from 1 to 100, one number per line.",
        400,
        true,
    ));
    let ack = follow.line();
    assert_eq!(ack["ok"], true, "{ack}");
    let deadline = Instant::now() + Duration::from_secs(600);
    // Attempts refused before any content (part 1 left inferproxy's accept bucket nearly
    // empty, and a refused accept reads as a stream closed early) are retried first.
    let mut refused_first = 0;
    loop {
        let e = follow.line();
        assert!(e.get("result").is_none(), "ended before streaming: {e}");
        if e["event"] == "content" {
            break;
        }
        if e["event"] == "retrying" {
            refused_first += 1;
        }
        assert!(Instant::now() < deadline, "no content within 10 min");
    }
    proxy.kill();
    std::thread::sleep(Duration::from_millis(500));
    proxy.restart();
    let mut events = Vec::new();
    let result = loop {
        let e = follow.line();
        if let Some(r) = e.get("result") {
            break r.clone();
        }
        events.push(e);
    };
    eprintln!(
        "proxy restarted under a stream: {} {} retries {}",
        result["outcome"], result["detail"], result["retries"]
    );
    assert_eq!(result["outcome"], "completed", "{result:#}\n{}", said());
    assert!(!retries(&result).is_empty(), "{result:#}");
    let retrying: Vec<&Value> = events.iter().filter(|e| e["event"] == "retrying").collect();
    assert!(!retrying.is_empty(), "no retrying event: {events:?}");
    // The attempt after the one the kill cut.
    assert_eq!(retrying[0]["attempt"], refused_first + 2, "{retrying:?}");
    let generations = result["generations"].as_array().unwrap();
    assert_eq!(
        generations.len(),
        1,
        "one generation, however many attempts: {result:#}"
    );
    assert!(
        !result["content"].as_str().unwrap_or("").is_empty(),
        "{result:#}"
    );
}
