//! Cancelling a request: from another thread, from its own event callback, while it is queued
//! at the slot gate, while it waits for its first byte, and during a retry's backoff. Each ends
//! within one poll interval (`poll_ms`, 50 ms here) with `Cancelled` and the output assembled
//! so far, and a cancelled stream's connection is closed, which makes the server stop.

mod support;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use loopd_client::config::{ClientConfig, Limits};
use loopd_client::llama::{Cancel, ChatEvent, ChatRequest, Client, Failed, InferError};
use support::{content, hold_slot, slots_json, End, FakeServer, Reply, CHAT};

const POLL_MS: u64 = 50;

fn config(server: &FakeServer) -> ClientConfig {
    let mut c = ClientConfig::new(server.socket(), "smollm2");
    // Every other limit far away: only the cancel can end these requests.
    c.limits = Limits {
        poll_ms: POLL_MS,
        liveness_ms: 60_000,
        ..Limits::default()
    };
    c.retry.delays_ms = vec![60_000, 60_000, 60_000];
    c
}

fn request() -> ChatRequest {
    ChatRequest::user(0, "Count slowly.")
}

/// A request running on its own thread: its result and when it ended.
type Running = std::thread::JoinHandle<(Result<loopd_client::llama::Completion, Failed>, Instant)>;

/// Runs `run` (or `run_with_retry`) on a thread; sends each event to the returned channel.
fn spawn(client: Arc<Client>, cancel: Cancel, retry: bool) -> (mpsc::Receiver<ChatEvent>, Running) {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut send = |e: &ChatEvent| {
            let _ = tx.send(e.clone());
        };
        let r = if retry {
            client.run_with_retry(&request(), &cancel, &mut send)
        } else {
            client.run(&request(), &cancel, &mut send)
        };
        (r, Instant::now())
    });
    (rx, t)
}

/// Cancels, then checks the request ended within one poll interval with `Cancelled`.
fn cancel_and_check(cancel: &Cancel, t: Running) -> Failed {
    let at = Instant::now();
    cancel.cancel();
    let (r, ended) = t.join().unwrap();
    let took = ended.duration_since(at);
    // One poll interval, and some room for a loaded machine.
    assert!(
        took <= Duration::from_millis(POLL_MS + 150),
        "ended {took:?} after the cancel"
    );
    let failed = r.unwrap_err();
    assert!(matches!(failed.error, InferError::Cancelled), "{failed}");
    failed
}

fn hung_up(server: &FakeServer) {
    llama_harness::wait_for(
        "the server to see the client close",
        Duration::from_secs(5),
        || match server.hung_up() {
            0 => Err("no connection closed by the client yet".into()),
            _ => Ok(()),
        },
    );
}

#[test]
fn cancel_from_another_thread_mid_stream_keeps_the_partial_and_closes() {
    let reply = Reply::sse(vec![content("Red", 1)]).ending(End::Silence);
    let server = FakeServer::start(vec![(CHAT, vec![reply])]);
    let client = Arc::new(Client::new(config(&server)));
    let cancel = Cancel::new();
    let (events, t) = spawn(client, cancel.clone(), false);
    assert_eq!(
        events.recv_timeout(Duration::from_secs(5)).unwrap(),
        ChatEvent::Content("Red".into())
    );
    let failed = cancel_and_check(&cancel, t);
    assert_eq!(failed.partial.message.content.as_deref(), Some("Red"));
    hung_up(&server);
}

#[test]
fn cancel_from_inside_on_event_stops_the_stream_there() {
    let reply = Reply::sse(vec![content("Red", 1), content(", blue", 2)]).ending(End::Silence);
    let server = FakeServer::start(vec![(CHAT, vec![reply])]);
    let client = Client::new(config(&server));
    let cancel = Cancel::new();
    let mut seen = Vec::new();
    let r = client.run(&request(), &cancel, &mut |e| {
        seen.push(e.clone());
        cancel.cancel();
    });
    let failed = r.unwrap_err();
    assert!(matches!(failed.error, InferError::Cancelled), "{failed}");
    // Both deltas came in one read, so both are out; the stream stops after them.
    assert!(
        seen.starts_with(&[ChatEvent::Content("Red".into())]),
        "{seen:?}"
    );
    assert!(failed
        .partial
        .message
        .content
        .as_deref()
        .unwrap()
        .starts_with("Red"));
    hung_up(&server);
}

#[test]
fn cancel_while_waiting_for_the_first_byte() {
    let server = FakeServer::start(vec![
        (CHAT, vec![Reply::silence()]),
        ("/slots", vec![Reply::json(200, &slots_json(Some(0)))]),
    ]);
    let client = Arc::new(Client::new(config(&server)));
    let cancel = Cancel::new();
    let (events, t) = spawn(client, cancel.clone(), false);
    assert_eq!(
        events.recv_timeout(Duration::from_secs(5)).unwrap(),
        ChatEvent::Waiting { slot_busy: true }
    );
    let failed = cancel_and_check(&cancel, t);
    assert_eq!(failed.partial, Default::default());
    hung_up(&server);
}

#[test]
fn cancel_while_queued_at_the_slot_gate() {
    let server = FakeServer::start(vec![]);
    let client = Arc::new(Client::new(config(&server)));
    let held = hold_slot(&client, 0);
    let cancel = Cancel::new();
    let (events, t) = spawn(client.clone(), cancel.clone(), false);
    assert_eq!(
        events.recv_timeout(Duration::from_secs(5)).unwrap(),
        ChatEvent::Queued { ahead: 1 }
    );
    cancel_and_check(&cancel, t);
    assert_eq!(client.gate().queued(0), 0);
    assert!(server.requests().is_empty(), "nothing was sent");
    drop(held);
}

#[test]
fn cancel_during_a_retry_wait_keeps_the_failed_attempts_partial() {
    let cut = Reply::sse(vec![content("Red", 1)]).ending(End::Cut);
    let server = FakeServer::start(vec![(CHAT, vec![cut])]);
    let client = Arc::new(Client::new(config(&server)));
    let cancel = Cancel::new();
    let (events, t) = spawn(client, cancel.clone(), true);
    assert_eq!(
        events.recv_timeout(Duration::from_secs(5)).unwrap(),
        ChatEvent::Content("Red".into())
    );
    match events.recv_timeout(Duration::from_secs(5)).unwrap() {
        ChatEvent::Retrying { attempt: 2, .. } => {}
        other => panic!("{other:?}"),
    }
    // The backoff is a minute long; the cancel ends it at once.
    let failed = cancel_and_check(&cancel, t);
    assert_eq!(failed.partial.message.content.as_deref(), Some("Red"));
    assert_eq!(server.requests_to(CHAT).len(), 1);
}

/// A cancelled request may leave the server generating: the slot's next request asks `/slots`
/// until the slot is idle (a `Waiting` per busy answer) before it sends; a request after a
/// normal completion sends at once.
#[test]
fn the_request_after_a_cancel_waits_for_slots_to_say_idle() {
    let busy = Reply::json(200, &slots_json(Some(0)));
    let idle = Reply::json(200, &slots_json(None));
    let server = FakeServer::start(vec![
        (CHAT, vec![Reply::silence(), support::answer()]),
        // The first busy is the cancelled request's own first-byte poll.
        ("/slots", vec![busy.clone(), busy.clone(), busy, idle]),
    ]);
    let client = Client::new(config(&server));
    let cancel = Cancel::new();
    let r = client.run(&request(), &cancel, &mut |e| {
        assert_eq!(*e, ChatEvent::Waiting { slot_busy: true });
        cancel.cancel();
    });
    assert!(matches!(r.unwrap_err().error, InferError::Cancelled));
    assert_eq!(server.requests_to("/slots").len(), 1);

    let mut after_cancel = Vec::new();
    let done = client.run(&request(), &Cancel::new(), &mut |e| {
        after_cancel.push(e.clone())
    });
    assert_eq!(done.unwrap().message.content.as_deref(), Some("Red, blue"));
    assert_eq!(server.requests_to("/slots").len(), 4);

    let mut after_answer = Vec::new();
    let done = client.run(&request(), &Cancel::new(), &mut |e| {
        after_answer.push(e.clone())
    });
    assert_eq!(done.unwrap().message.content.as_deref(), Some("Red, blue"));
    assert_eq!(
        server.requests_to("/slots").len(),
        4,
        "no check after an answer"
    );
    let waits = vec![ChatEvent::Waiting { slot_busy: true }; 2];
    assert_eq!(after_cancel, [waits, after_answer.clone()].concat());
    assert_eq!(server.requests_to(CHAT).len(), 3);
}
