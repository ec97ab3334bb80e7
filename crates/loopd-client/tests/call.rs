//! [`ChatCall`] on fake time: the gate, the wait for an abandoned slot, and M2a section 4's
//! retry (2 s, 8 s, 30 s, each ±25%, 4 attempts, never past 5 minutes, each retry back
//! through the gate after a `Retrying` event), every deadline checked one millisecond before
//! it and at it. No socket, no thread, no clock.

use std::sync::Arc;
use std::time::Duration;

use loopd_client::clock::FakeJitter;
use loopd_client::config::{Limits, Retry};
use loopd_client::llama::{
    Buffers, CallOutput, ChatCall, ChatEvent, ChatRequest, Deadline, InferError, Silence, SlotSeen,
};

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// The defaults (M2a section 4), but a first-byte wait short enough to walk.
fn limits() -> Limits {
    Limits {
        poll_ms: 5_000,
        load_wait_ms: 180_000,
        idle_grace_ms: 30_000,
        liveness_ms: 30_000,
        ..Limits::default()
    }
}

fn call<'b>(b: &'b mut Buffers, offsets: &[i64]) -> ChatCall<'b> {
    let jitter = Arc::new(FakeJitter::new(offsets));
    let req = ChatRequest::user(1, "hi");
    ChatCall::new(ms(0), limits(), &Retry::default(), jitter, req, b.storage())
}

fn drain(c: &mut ChatCall<'_>) -> Vec<CallOutput> {
    std::iter::from_fn(|| c.poll_output()).collect()
}

/// The outputs but the events, by kind.
fn kinds(out: &[CallOutput]) -> Vec<&'static str> {
    out.iter()
        .filter_map(|o| match o {
            CallOutput::Event(_) => None,
            CallOutput::Acquire => Some("acquire"),
            CallOutput::PollSlots => Some("slots"),
            CallOutput::Send => Some("send"),
            CallOutput::EndReasoning { .. } => Some("end_reasoning"),
            CallOutput::JudgeSilence => Some("judge"),
            CallOutput::Close { abandoned: false } => Some("close"),
            CallOutput::Close { abandoned: true } => Some("close abandoned"),
        })
        .collect()
}

fn retrying(out: &[CallOutput]) -> Vec<(u32, u64)> {
    out.iter()
        .filter_map(|o| match o {
            CallOutput::Event(ChatEvent::Retrying {
                attempt, after_ms, ..
            }) => Some((*attempt, *after_ms)),
            _ => None,
        })
        .collect()
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n";

fn chunk(delta: &str, finish: Option<&str>) -> Vec<u8> {
    let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":0,\"delta\":{delta}}}],\
         \"id\":\"chatcmpl-t\",\"object\":\"chat.completion.chunk\"}}\n\n"
    )
    .into_bytes()
}

fn answer(text: &str) -> Vec<u8> {
    [
        HEAD,
        &chunk(&format!("{{\"content\":\"{text}\"}}"), None),
        &chunk("{}", Some("stop")),
    ]
    .concat()
}

/// Lets the call (its `Acquire` already drained) through the gate and sends it at `at`.
fn go(c: &mut ChatCall<'_>, at: u64) {
    c.handle_acquired(ms(at), Ok(false));
    assert_eq!(kinds(&drain(c)), ["send"]);
    c.handle_sent(ms(at));
}

/// The call's next wake-up is `at`: nothing happens a millisecond before, `want` at it.
fn wakes_at(c: &mut ChatCall<'_>, at: u64, want: &[&str]) {
    assert_eq!(c.poll_timeout(), Some(ms(at)));
    c.handle_timeout(ms(at - 1));
    assert_eq!(kinds(&drain(c)), Vec::<&str>::new(), "at {}", at - 1);
    c.handle_timeout(ms(at));
    assert_eq!(kinds(&drain(c)), want, "at {at}");
}

/// One attempt let through the gate at `at` that fails with `kind`; its outputs.
fn fail(c: &mut ChatCall<'_>, at: u64, kind: &str) -> Vec<CallOutput> {
    match kind {
        "connect" => {
            let socket = "/run/infer.sock".into();
            let source = std::io::ErrorKind::ConnectionRefused.into();
            c.handle_acquired(ms(at), Ok(false));
            assert_eq!(kinds(&drain(c)), ["send"]);
            c.handle_send_error(ms(at), InferError::Connect { socket, source });
        }
        "closed_early" => {
            go(c, at);
            c.handle_bytes(ms(at), HEAD);
            c.handle_bytes(ms(at + 1), &chunk("{\"content\":\"lost\"}", None));
            c.handle_eof(ms(at + 2));
        }
        "503" => {
            go(c, at);
            let head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 7\r\n\r\nloading";
            c.handle_bytes(ms(at), head);
            c.handle_eof(ms(at));
        }
        "stalled" => {
            go(c, at);
            let first = [HEAD, &chunk("{\"content\":\"x\"}", None)].concat();
            c.handle_bytes(ms(at), &first);
            c.handle_timeout(ms(at + 30_000));
        }
        other => panic!("{other}"),
    }
    drain(c)
}

/// How long a failing attempt of `kind` lasts after it is let through.
fn lasts(kind: &str) -> u64 {
    match kind {
        "stalled" => 30_000,
        "closed_early" => 2,
        _ => 0,
    }
}

fn name(kind: &str) -> &'static str {
    match kind {
        "connect" => "connect_error",
        "closed_early" => "stream_closed_early",
        "503" => "http_error",
        "stalled" => "stalled",
        other => panic!("{other}"),
    }
}

#[test]
fn each_retryable_error_is_retried_at_2_8_30_s_through_the_gate_then_given_up() {
    for kind in ["connect", "closed_early", "503", "stalled"] {
        let mut b = Buffers::new();
        let mut c = call(&mut b, &[]);
        assert_eq!(kinds(&drain(&mut c)), ["acquire"]);
        let mut at = 0;
        for (attempt, wait) in [(2, 2_000), (3, 8_000), (4, 30_000)] {
            let out = fail(&mut c, at, kind);
            assert_eq!(retrying(&out), [(attempt, wait)], "{kind}");
            // Only silence is closed by loopd while the server may still be generating.
            let closed: &[&str] = match kind {
                "stalled" => &["close abandoned"],
                _ => &["close"],
            };
            assert_eq!(
                kinds(&out),
                closed,
                "{kind}: the attempt's connection and permit"
            );
            assert_eq!(c.attempt(), attempt);
            at += lasts(kind) + wait;
            wakes_at(&mut c, at, &["acquire"]);
        }
        let out = fail(&mut c, at, kind);
        assert!(retrying(&out).is_empty(), "{kind}: no fifth attempt");
        assert!(c.is_over());
        let f = c.take_result().unwrap().unwrap_err();
        assert_eq!(f.error.as_str(), name(kind));
    }
}

#[test]
fn the_waits_vary_by_a_quarter_either_way_and_no_more() {
    let mut b = Buffers::new();
    // -25% of 2 s, +25% of 8 s, and one past +25% of 30 s (clamped).
    let mut c = call(&mut b, &[-500, 2_000, 7_501]);
    drain(&mut c);
    let mut at = 0;
    for (attempt, wait) in [(2, 1_500), (3, 10_000), (4, 37_500)] {
        let out = fail(&mut c, at, "connect");
        assert_eq!(retrying(&out), [(attempt, wait)]);
        at += wait;
        wakes_at(&mut c, at, &["acquire"]);
    }
}

#[test]
fn no_retry_starts_whose_wait_would_end_past_five_minutes() {
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    // The first attempt is let through only at 297.999 s (a long gate wait) and is refused:
    // 2 s more ends at 299.999 s, within 300 s.
    let out = fail(&mut c, 297_999, "connect");
    assert_eq!(retrying(&out), [(2, 2_000)]);
    wakes_at(&mut c, 299_999, &["acquire"]);
    // Refused again at once: 8 s more would end past 300 s.
    let out = fail(&mut c, 299_999, "connect");
    assert!(retrying(&out).is_empty());
    assert_eq!(
        c.take_result().unwrap().unwrap_err().error.as_str(),
        "connect_error"
    );
}

#[test]
fn a_retrys_wait_for_its_first_byte_ends_at_five_minutes() {
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    fail(&mut c, 0, "connect");
    wakes_at(&mut c, 2_000, &["acquire"]);
    go(&mut c, 2_000);
    // The slot stays busy: polls every poll_ms until the budget's end at 300 s.
    let mut next = 7_000;
    while next < 300_000 {
        wakes_at(&mut c, next, &["slots"]);
        c.handle_slots(ms(next), SlotSeen::Busy);
        next += 5_000;
    }
    c.handle_timeout(ms(300_000));
    let out = drain(&mut c);
    assert!(retrying(&out).is_empty(), "the budget is spent");
    let f = c.take_result().unwrap().unwrap_err();
    assert!(
        matches!(f.error, InferError::TimedOut(Deadline::RetryTotal)),
        "{:?}",
        f.error
    );
}

#[test]
fn what_is_not_retryable_ends_the_call_at_once() {
    let bad_request = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 3\r\n\r\nbig";
    // 400: the prompt does not fit; answered by compaction, not by sending it again.
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    go(&mut c, 0);
    c.handle_bytes(ms(1), bad_request);
    c.handle_eof(ms(2));
    let out = drain(&mut c);
    assert_eq!((kinds(&out), retrying(&out)), (vec!["close"], vec![]));
    let f = c.take_result().unwrap().unwrap_err();
    assert_eq!(
        f.error.to_string(),
        InferError::Http {
            status: 400,
            body: "big".into()
        }
        .to_string()
    );
    // WaitTimeout and Busy from the gate: no permit was taken, nothing to close.
    for e in [InferError::WaitTimeout, InferError::Busy] {
        let mut b = Buffers::new();
        let mut c = call(&mut b, &[]);
        drain(&mut c);
        let want = e.as_str();
        c.handle_acquired(ms(600_000), Err(e));
        assert_eq!(drain(&mut c), []);
        assert_eq!(c.take_result().unwrap().unwrap_err().error.as_str(), want);
    }
    // A cancel on the wire.
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    go(&mut c, 0);
    c.cancel(ms(5));
    let out = drain(&mut c);
    assert_eq!(
        (kinds(&out), retrying(&out)),
        (vec!["close abandoned"], vec![])
    );
    assert!(matches!(
        c.take_result().unwrap().unwrap_err().error,
        InferError::Cancelled
    ));
}

#[test]
fn a_cancel_during_the_wait_before_a_retry_ends_the_call_at_once() {
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    fail(&mut c, 0, "closed_early");
    assert_eq!(c.poll_timeout(), Some(ms(2_002)));
    c.cancel(ms(700));
    assert!(c.is_over(), "not at 2,002 ms: at once");
    assert_eq!(drain(&mut c), []);
    let f = c.take_result().unwrap().unwrap_err();
    assert!(matches!(f.error, InferError::Cancelled));
}

#[test]
fn a_held_failure_waits_for_the_owners_verdict() {
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    c.hold();
    drain(&mut c);
    let out = fail(&mut c, 0, "closed_early");
    assert!(retrying(&out).is_empty(), "nothing decided yet");
    assert!(matches!(c.held(), Some(InferError::StreamClosedEarly)));
    assert_eq!(c.poll_timeout(), None, "only the verdict moves it");
    // The owner heard the worker say the server is fine: the schedule retries, from then.
    c.decide(ms(900), true);
    assert_eq!(retrying(&drain(&mut c)), [(2, 2_000)]);
    wakes_at(&mut c, 2_900, &["acquire"]);
    go(&mut c, 2_900);
    c.handle_bytes(ms(3_000), &answer("whole"));
    let done = c.take_result().unwrap().unwrap();
    assert_eq!(
        done.message.content.as_deref(),
        Some("whole"),
        "the lost words are gone"
    );
    // A verdict against a retry (the worker restarted the server) ends it with the error.
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    c.hold();
    drain(&mut c);
    fail(&mut c, 0, "closed_early");
    c.decide(ms(10), false);
    assert_eq!(drain(&mut c), []);
    let f = c.take_result().unwrap().unwrap_err();
    assert!(matches!(f.error, InferError::StreamClosedEarly));
    assert_eq!(
        f.partial.message.content.as_deref(),
        Some("lost"),
        "its output kept"
    );
}

#[test]
fn an_abandoned_slot_is_polled_every_poll_ms_until_idle_then_sent() {
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    c.handle_acquired(ms(10), Ok(true));
    assert_eq!(kinds(&drain(&mut c)), ["slots"]);
    c.handle_slots(ms(12), SlotSeen::Busy);
    let out = drain(&mut c);
    assert_eq!(
        out,
        [CallOutput::Event(ChatEvent::Waiting { slot_busy: true })]
    );
    wakes_at(&mut c, 5_012, &["slots"]);
    c.handle_slots(ms(5_013), SlotSeen::Idle);
    assert_eq!(kinds(&drain(&mut c)), ["send"]);
    // Busy past busy_wait_ms (10 min) from the start of the wait: WaitTimeout, and the slot
    // stays marked abandoned for its next permit.
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    c.handle_acquired(ms(0), Ok(true));
    drain(&mut c);
    c.handle_slots(ms(599_999), SlotSeen::Busy);
    drain(&mut c);
    wakes_at(&mut c, 604_999, &["slots"]);
    c.handle_slots(ms(600_000), SlotSeen::Busy);
    assert_eq!(kinds(&drain(&mut c)), ["close abandoned"]);
    assert!(matches!(
        c.take_result().unwrap().unwrap_err().error,
        InferError::WaitTimeout
    ));
}

#[test]
fn a_stall_is_silence_past_liveness_on_the_calls_own_exchange() {
    // (Not a retry matter: the nested exchange's timer, seen through the call.)
    let mut b = Buffers::new();
    let mut c = call(&mut b, &[]);
    drain(&mut c);
    go(&mut c, 0);
    c.handle_bytes(
        ms(10),
        &[HEAD, &chunk("{\"content\":\"x\"}", None)].concat(),
    );
    assert!(c.answering());
    assert_eq!(c.poll_timeout(), Some(ms(30_010)));
    c.handle_timeout(ms(30_010));
    let out = drain(&mut c);
    assert_eq!(retrying(&out), [(2, 2_000)]);
    let said: Vec<String> = out
        .iter()
        .filter_map(|o| match o {
            CallOutput::Event(ChatEvent::Retrying { error, .. }) => Some(error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(said, [InferError::Stalled(Silence::Liveness).to_string()]);
}
