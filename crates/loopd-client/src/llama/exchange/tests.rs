//! The exchange on fake time: every timer one millisecond before its limit and at it.

use super::*;
use crate::llama::{FinishReason, ProtocolError, ToolCall};
use http_nostd::HttpError;
use sse_nostd::SseError;

fn limits() -> Limits {
    Limits {
        poll_ms: 50,
        busy_wait_ms: 200,
        load_wait_ms: 150,
        idle_grace_ms: 120,
        liveness_ms: 100,
        connect_ms: 80,
        call_ms: 300,
        thinking_cap: 3,
        thinking_overrun: 2,
        max_tokens: 64,
        queue: 8,
    }
}

fn t(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

/// One `data:` event in llama-server's chunk format.
fn event(delta: &str, finish: Option<&str>, predicted_n: u64) -> Vec<u8> {
    let finish = finish.map_or("null".to_owned(), |f| format!("\"{f}\""));
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":{finish},\"index\":0,\"delta\":{delta}}}],\"id\":\"chatcmpl-t\",\"object\":\"chat.completion.chunk\",\"timings\":{{\"cache_n\":0,\"prompt_n\":12,\"predicted_n\":{predicted_n}}}}}\n\n"
    )
    .into_bytes()
}

fn content(text: &str, n: u64) -> Vec<u8> {
    event(&format!("{{\"content\":\"{text}\"}}"), None, n)
}

fn reasoning(n: u64) -> Vec<u8> {
    event("{\"reasoning_content\":\"hm\"}", None, n)
}

fn finish(n: u64) -> Vec<u8> {
    event("{}", Some("stop"), n)
}

/// `pieces` as HTTP chunks, one each.
fn chunked(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn answer() -> Vec<u8> {
    let mut b = HEAD.to_vec();
    b.extend(chunked(&[
        content("Red", 1),
        content(", blue", 2),
        finish(3),
        b"data: [DONE]\n\n".to_vec(),
    ]));
    b.extend_from_slice(b"0\r\n\r\n");
    b
}

fn outputs(x: &mut ChatExchange<'_>) -> Vec<Output> {
    std::iter::from_fn(|| x.poll_output()).collect()
}

fn ev(e: ChatEvent) -> Output {
    Output::Event(e)
}

fn text(s: &str) -> Output {
    ev(ChatEvent::Content(s.into()))
}

fn error(x: &mut ChatExchange<'_>) -> InferError {
    match x.take_result() {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn an_answer_assembles_and_its_events_come_out_in_order() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let bytes = answer();
    // Reading stops at the HTTP chunk with the finish_reason: `[DONE]` and the rest are left.
    let upto = bytes.len() - chunked(&[b"data: [DONE]\n\n".to_vec()]).len() - 5;
    assert_eq!(x.handle_bytes(t(10), &bytes), upto);
    assert_eq!(outputs(&mut x), [text("Red"), text(", blue")]);
    assert!(x.is_over());
    assert_eq!(x.poll_timeout(), None);
    let done = x.take_result().unwrap().unwrap();
    assert_eq!(
        (done.message.content.as_deref(), done.finish_reason),
        (Some("Red, blue"), FinishReason::Stop)
    );
    assert!(x.take_result().is_none(), "the result is handed out once");
    assert!(x.is_over());
}

#[test]
fn every_split_of_the_bytes_gives_the_same_events_and_completion() {
    let bytes = answer();
    for cut in 0..bytes.len() {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        let used = x.handle_bytes(t(1), &bytes[..cut]);
        assert!(used == cut || x.is_over(), "cut {cut}: {used}");
        x.handle_bytes(t(2), &bytes[cut..]);
        assert_eq!(outputs(&mut x), [text("Red"), text(", blue")], "cut {cut}");
        let done = x.take_result().unwrap().unwrap();
        assert_eq!(done.message.content.as_deref(), Some("Red, blue"));
    }
}

#[test]
fn events_given_back_lend_their_strings_to_later_events() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut bytes = HEAD.to_vec();
    bytes.extend(chunked(&[content("Crimson", 1)]));
    x.handle_bytes(t(1), &bytes);
    let mut out = outputs(&mut x);
    assert_eq!(out, [text("Crimson")]);
    let Some(Output::Event(red)) = out.pop() else {
        unreachable!()
    };
    let ChatEvent::Content(s) = &red else {
        unreachable!()
    };
    let at = s.as_ptr();
    x.recycle(red);
    x.handle_bytes(t(2), &chunked(&[content(" red", 2), finish(3)]));
    let out = outputs(&mut x);
    assert_eq!(
        out,
        [text(" red")],
        "the same events as without giving back"
    );
    let [Output::Event(ChatEvent::Content(s))] = &out[..] else {
        unreachable!()
    };
    assert_eq!(s.as_ptr(), at, "written into the string given back");
    let done = x.take_result().unwrap().unwrap();
    assert_eq!(done.message.content.as_deref(), Some("Crimson red"));
}

#[test]
fn slots_is_polled_every_poll_ms_until_the_first_byte() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(1_000), &mut b);
    assert_eq!(x.poll_timeout(), Some(t(1_050)));
    x.handle_timeout(t(1_049));
    assert_eq!(outputs(&mut x), []);
    x.handle_timeout(t(1_050));
    assert_eq!(outputs(&mut x), [Output::PollSlots]);
    // One poll at a time: no second one while the first is out.
    x.handle_timeout(t(1_070));
    assert_eq!(outputs(&mut x), []);
    x.handle_slots(t(1_053), SlotSeen::Busy);
    assert_eq!(
        outputs(&mut x),
        [ev(ChatEvent::Waiting { slot_busy: true })]
    );
    assert_eq!(x.poll_timeout(), Some(t(1_103)), "poll_ms after the answer");
    // The first byte ends the polling; liveness runs from it.
    x.handle_bytes(t(1_080), b"HTTP/1.1 2");
    assert_eq!(x.poll_timeout(), Some(t(1_180)));
    x.handle_timeout(t(1_103));
    assert_eq!(outputs(&mut x), []);
}

/// Polls with `seen` at each of `times`, then returns the outcome.
fn poll_run(seen: SlotSeen, times: &[u64]) -> Option<InferError> {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    for &at in times {
        x.handle_timeout(t(at));
        x.handle_slots(t(at), seen);
    }
    x.take_result().map(|r| r.unwrap_err())
}

#[test]
fn a_busy_slot_is_wait_timeout_at_busy_wait_ms() {
    assert!(poll_run(SlotSeen::Busy, &[50, 100, 150, 199]).is_none());
    let e = poll_run(SlotSeen::Busy, &[50, 100, 150, 200]);
    assert!(matches!(e, Some(InferError::WaitTimeout)), "{e:?}");
}

#[test]
fn an_unavailable_slot_is_load_timeout_at_load_wait_ms() {
    assert!(poll_run(SlotSeen::Unavailable, &[50, 100, 149]).is_none());
    let e = poll_run(SlotSeen::Unavailable, &[50, 100, 150]);
    assert!(matches!(e, Some(InferError::LoadTimeout)), "{e:?}");
}

#[test]
fn an_idle_slot_is_stalled_at_idle_grace_ms() {
    assert!(poll_run(SlotSeen::Idle, &[50, 100, 119]).is_none());
    let e = poll_run(SlotSeen::Idle, &[50, 100, 120]);
    assert!(
        matches!(e, Some(InferError::Stalled(Silence::IdleGrace))),
        "{e:?}"
    );
}

#[test]
fn silence_after_the_first_byte_is_stalled_at_liveness_ms() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut bytes = HEAD.to_vec();
    bytes.extend(chunked(&[content("Red", 1)]));
    x.handle_bytes(t(10), &bytes);
    assert_eq!(x.poll_timeout(), Some(t(110)));
    x.handle_timeout(t(109));
    assert!(!x.is_over());
    // Any byte counts, a comment too.
    x.handle_bytes(t(100), &chunked(&[b": keep-alive\n\n".to_vec()]));
    x.handle_timeout(t(199));
    assert!(!x.is_over());
    x.handle_timeout(t(200));
    assert!(matches!(
        error(&mut x),
        InferError::Stalled(Silence::Liveness)
    ));
    assert_eq!(outputs(&mut x), [text("Red")]);
    assert_eq!(x.partial().message.content.as_deref(), Some("Red"));
}

/// With a judge (llama-worker), a silent stream is put to it at liveness instead of failing:
/// alive, liveness runs from the verdict; not alive, `Stalled(Liveness)` with what streamed.
#[test]
fn a_judged_silent_stream_goes_on_while_the_judge_says_alive() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.judge_silence();
    let mut bytes = HEAD.to_vec();
    bytes.extend(chunked(&[content("Red", 1)]));
    x.handle_bytes(t(10), &bytes);
    assert_eq!(outputs(&mut x), [text("Red")]);
    x.handle_timeout(t(109));
    assert_eq!(outputs(&mut x), []);
    x.handle_timeout(t(110));
    assert_eq!(outputs(&mut x), [Output::JudgeSilence]);
    // Asked once; no timer runs while the judge thinks, and time alone changes nothing.
    assert_eq!(x.poll_timeout(), None);
    x.handle_timeout(t(125));
    assert_eq!(outputs(&mut x), []);
    assert!(!x.is_over());
    x.handle_silence_verdict(t(130), true);
    assert_eq!(x.poll_timeout(), Some(t(230)));
    // A verdict nobody asked for is ignored.
    x.handle_silence_verdict(t(131), false);
    assert!(!x.is_over());
    x.handle_timeout(t(229));
    assert_eq!(outputs(&mut x), []);
    x.handle_timeout(t(230));
    assert_eq!(outputs(&mut x), [Output::JudgeSilence]);
    // Bytes while the judge thinks are kept; a "not alive" verdict still ends it.
    x.handle_bytes(t(231), &chunked(&[content(" and", 2)]));
    x.handle_silence_verdict(t(240), false);
    assert!(matches!(
        error(&mut x),
        InferError::Stalled(Silence::Liveness)
    ));
    assert_eq!(outputs(&mut x), [text(" and")]);
    assert_eq!(x.partial().message.content.as_deref(), Some("Red and"));
}

#[test]
fn a_stream_has_no_total_deadline() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(0), HEAD);
    // A byte every 99 ms for ten minutes of fake time.
    for i in 1..6_000u64 {
        x.handle_bytes(t(i * 99), &chunked(&[b": x\n\n".to_vec()]));
        x.handle_timeout(t(i * 99 + 98));
    }
    assert!(!x.is_over());
}

#[test]
fn a_trickled_head_is_timed_out_at_call_ms_from_its_first_byte() {
    let head = b"HTTP/1.1 200 OK\r\nX-Slow: aaaaaaaaaaaaaaaa\r\n";
    for (last, over) in [(319, false), (320, true)] {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        // A byte every 60 ms, under the 100 ms liveness: only the whole-head limit can end it.
        let mut now = 20;
        for byte in head.iter().take(6) {
            x.handle_bytes(t(now), std::slice::from_ref(byte));
            now += 60;
        }
        assert_eq!(x.poll_timeout(), Some(t(320)));
        x.handle_timeout(t(last));
        assert_eq!(x.is_over(), over, "at {last}");
    }
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(20), b"HTTP/1.1 2");
    x.handle_timeout(t(320));
    assert!(matches!(
        error(&mut x),
        InferError::Stalled(Silence::Liveness)
    ));
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut now = 20;
    for byte in head.iter().take(6) {
        x.handle_bytes(t(now), std::slice::from_ref(byte));
        now += 60;
    }
    x.handle_timeout(t(320));
    assert!(matches!(
        error(&mut x),
        InferError::TimedOut(Deadline::Call)
    ));
}

#[test]
fn an_error_body_keeps_what_arrived_within_call_ms() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(
        t(10),
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\nLoad",
    );
    assert_eq!(x.poll_timeout(), Some(t(110)));
    let mut now = 10;
    for byte in b"ing model, please wait" {
        now += 60;
        if now >= 310 {
            break;
        }
        x.handle_bytes(t(now), std::slice::from_ref(byte));
    }
    assert_eq!(x.poll_timeout(), Some(t(310)));
    x.handle_timeout(t(309));
    assert!(!x.is_over());
    x.handle_timeout(t(310));
    match error(&mut x) {
        InferError::Http { status, body } => assert_eq!((status, body.as_str()), (503, "Loading ")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_error_body_is_cut_at_4_kib_without_waiting_for_the_rest() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut bytes = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 10000\r\n\r\n".to_vec();
    bytes.extend(std::iter::repeat_n(b'e', ERROR_BODY_CAP));
    x.handle_bytes(t(1), &bytes);
    match error(&mut x) {
        InferError::Http { status, body } => assert_eq!((status, body.len()), (400, 4096)),
        other => panic!("{other:?}"),
    }
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(1), &bytes[..bytes.len() - 1]);
    assert!(!x.is_over(), "one byte short of the cap waits for more");
}

#[test]
fn a_retry_stops_waiting_for_its_first_byte_at_the_budget() {
    let run = |at: u64| {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        x.set_first_byte_deadline(t(70));
        assert_eq!(x.poll_timeout(), Some(t(50)));
        x.handle_timeout(t(50));
        x.handle_slots(t(52), SlotSeen::Busy);
        assert_eq!(
            x.poll_timeout(),
            Some(t(70)),
            "the budget comes before the poll"
        );
        x.handle_timeout(t(at));
        x.take_result().map(|r| r.unwrap_err())
    };
    assert!(run(69).is_none());
    let e = run(70);
    assert!(
        matches!(e, Some(InferError::TimedOut(Deadline::RetryTotal))),
        "{e:?}"
    );
    // A stream that is producing bytes is never cut by the budget.
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.set_first_byte_deadline(t(70));
    x.handle_bytes(t(60), HEAD);
    x.handle_bytes(t(140), &chunked(&[content("Red", 1)]));
    x.handle_timeout(t(200));
    assert!(!x.is_over());
    assert_eq!(x.poll_timeout(), Some(t(240)));
}

fn thinking(n: u64, answer: bool) -> Vec<Vec<u8>> {
    let mut pieces: Vec<Vec<u8>> = (1..=n).map(reasoning).collect();
    if answer {
        pieces.extend([content("5", n + 1), finish(n + 2)]);
    }
    pieces
}

fn hm() -> Output {
    ev(ChatEvent::Reasoning("hm".into()))
}

#[test]
fn the_thinking_cap_pauses_the_bytes_until_reasoning_end_is_answered() {
    // Each event its own HTTP chunk, and all events in one chunk: either way the exchange
    // stops at the capping chunk and the rest is handed back after the answer.
    let pieces = thinking(4, true);
    let one_chunk = vec![pieces.concat()];
    for framing in [pieces.clone(), one_chunk] {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        let mut bytes = HEAD.to_vec();
        bytes.extend(chunked(&framing));
        let used = x.handle_bytes(t(5), &bytes);
        assert!(used < bytes.len(), "stops at the capping chunk");
        assert_eq!(
            outputs(&mut x),
            [
                hm(),
                hm(),
                hm(),
                Output::EndReasoning {
                    id: "chatcmpl-t".into()
                }
            ]
        );
        assert_eq!(x.handle_bytes(t(6), &bytes[used..]), 0, "paused");
        assert_eq!(x.poll_timeout(), None);
        x.handle_timeout(t(10_000));
        assert!(!x.is_over(), "no timer runs while the control call is out");
        x.handle_control_answer(t(10_050), true);
        x.handle_bytes(t(10_051), &bytes[used..]);
        assert_eq!(
            outputs(&mut x),
            [ev(ChatEvent::ThinkingCapped { tokens: 3 }), hm(), text("5")]
        );
        let done = x.take_result().unwrap().unwrap();
        assert!(done.thinking_capped);
        assert_eq!(
            (done.message.content.as_deref(), done.reasoning_tokens),
            (Some("5"), 4)
        );
    }
}

#[test]
fn reasoning_past_the_grace_or_a_refused_control_call_is_thinking_overrun() {
    let mut bytes = HEAD.to_vec();
    bytes.extend(chunked(&thinking(20, false)));
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let used = x.handle_bytes(t(1), &bytes);
    x.handle_control_answer(t(2), true);
    x.handle_bytes(t(3), &bytes[used..]);
    assert!(matches!(error(&mut x), InferError::ThinkingOverrun));
    // Capped at 3, overrun at 3 + 2: five reasoning pieces were seen.
    let seen = outputs(&mut x);
    assert_eq!(seen.iter().filter(|o| **o == hm()).count(), 5);
    assert_eq!(x.partial().reasoning_tokens, 5);

    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(1), &bytes);
    x.handle_control_answer(t(2), false);
    assert!(matches!(error(&mut x), InferError::ThinkingOverrun));
    let seen = outputs(&mut x);
    assert!(!seen
        .iter()
        .any(|o| matches!(o, Output::Event(ChatEvent::ThinkingCapped { .. }))));
    assert_eq!(
        x.partial().message.reasoning_content.as_deref(),
        Some("hmhmhm")
    );
}

#[test]
fn the_end_of_the_connection() {
    let end = |bytes: &[u8]| {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        x.handle_bytes(t(1), bytes);
        x.handle_eof(t(2));
        (x.take_result().unwrap(), x.partial())
    };
    // Before any byte, in the head, and mid-stream: closed early, the partial kept.
    assert!(matches!(end(b"").0, Err(InferError::StreamClosedEarly)));
    assert!(matches!(
        end(b"HTTP/1.1 200 OK\r\n").0,
        Err(InferError::StreamClosedEarly)
    ));
    let mut cut = HEAD.to_vec();
    cut.extend(chunked(&[content("Red", 1)]));
    let (r, partial) = end(&cut);
    assert!(matches!(r, Err(InferError::StreamClosedEarly)));
    assert_eq!(partial.message.content.as_deref(), Some("Red"));
    // Cut after the final chunk, before `[DONE]`: complete.
    let mut whole = HEAD.to_vec();
    whole.extend(chunked(&[content("Red", 1), finish(2)]));
    assert_eq!(
        end(&whole).0.unwrap().message.content.as_deref(),
        Some("Red")
    );
    // A body read to the close that ends inside an event.
    let mut open = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
    open.extend_from_slice(b"data: {\"choi");
    assert!(matches!(end(&open).0, Err(InferError::StreamClosedEarly)));
    // A chunked body that ends cleanly without the final chunk.
    let mut clean = cut.clone();
    clean.extend_from_slice(b"0\r\n\r\n");
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(1), &clean);
    assert!(matches!(error(&mut x), InferError::StreamClosedEarly));
}

/// Wherever the connection ends before the final chunk, the request failed the same way:
/// `StreamClosedEarly`, which the retry schedule retries, with what was assembled kept.
#[test]
fn a_connection_cut_anywhere_before_the_final_chunk_is_closed_early() {
    let whole = {
        let mut b = HEAD.to_vec();
        b.extend(chunked(&[content("Red", 1)]));
        b
    };
    let event = content("Blue", 2);
    let mut inside_event = whole.clone();
    // A chunk that holds half an event, then the router's clean end of its body.
    inside_event.extend(chunked(&[event[..event.len() / 2].to_vec()]));
    inside_event.extend_from_slice(b"0\r\n\r\n");
    let mut between_events = whole.clone();
    between_events.extend_from_slice(b"0\r\n\r\n");
    let cuts: [(&str, Vec<u8>, Option<&str>); 7] = [
        ("inside the status line", b"HTTP/1.1 2".to_vec(), None),
        ("inside the head", HEAD[..HEAD.len() - 2].to_vec(), None),
        (
            "inside a chunk size",
            [&whole[..], b"1"].concat(),
            Some("Red"),
        ),
        (
            "inside a chunk size line",
            [&whole[..], b"1f;ext"].concat(),
            Some("Red"),
        ),
        (
            "inside chunk data",
            [
                &whole[..],
                format!("{:x}\r\n", event.len()).as_bytes(),
                &event[..9],
            ]
            .concat(),
            Some("Red"),
        ),
        ("inside an event", inside_event, Some("Red")),
        (
            "between events without [DONE] or a finish reason",
            between_events,
            Some("Red"),
        ),
    ];
    for (place, bytes, kept) in cuts {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        x.handle_bytes(t(1), &bytes);
        x.handle_eof(t(2));
        let r = x.take_result().unwrap();
        assert!(
            matches!(r, Err(InferError::StreamClosedEarly)),
            "{place}: {r:?}"
        );
        assert_eq!(x.partial().message.content.as_deref(), kept, "{place}");
    }
}

#[test]
fn cancel_ends_the_request_with_its_partial() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut bytes = HEAD.to_vec();
    bytes.extend(chunked(&[
        content("Red", 1),
        event(
            r#"{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a"}}]}"#,
            None,
            2,
        ),
    ]));
    x.handle_bytes(t(1), &bytes);
    x.cancel();
    assert!(x.is_over());
    assert_eq!(x.poll_timeout(), None);
    assert!(matches!(error(&mut x), InferError::Cancelled));
    let p = x.partial();
    assert_eq!(p.message.content.as_deref(), Some("Red"));
    assert_eq!(
        p.message.tool_calls,
        [ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{\"a".into()
        }]
    );
    assert_eq!(p.timings.map(|t| t.predicted_n), Some(2));
    // After the end, bytes are ignored and timers do nothing.
    assert_eq!(x.handle_bytes(t(2), b"more"), 4);
    x.handle_timeout(t(1_000_000));
    assert!(x.take_result().is_none());
}

#[test]
fn protocol_errors_are_typed_and_an_error_payload_keeps_the_partial() {
    let run = |bytes: &[u8]| {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        x.handle_bytes(t(1), bytes);
        (x.take_result().unwrap().unwrap_err(), x.partial())
    };
    let mut huge = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
    huge.resize(crate::http::HEAD_CAP + 1, b'a');
    assert!(matches!(
        run(&huge).0,
        InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Http(
            HttpError::HeadersTooLarge
        )))
    ));
    let mut bad = HEAD.to_vec();
    bad.extend(chunked(&[b"data: {\"choices\":[{\"delta\":\n\n".to_vec()]));
    assert!(matches!(
        run(&bad).0,
        InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Decode(_)))
    ));
    let mut long = HEAD.to_vec();
    let mut line = b"data: ".to_vec();
    line.resize(crate::sse::SSE_CAP + 1, b'x');
    long.extend(chunked(&[line]));
    assert!(matches!(
        run(&long).0,
        InferError::Protocol(ProtocolError::Stream(llama_proto::StreamError::Sse(
            SseError::LineTooLong
        )))
    ));
    let mut err = HEAD.to_vec();
    err.extend(chunked(&[
        content("Red", 1),
        b"data: {\"error\":{\"code\":500,\"message\":\"Context size has been exceeded.\"}}\n\n"
            .to_vec(),
    ]));
    let (e, partial) = run(&err);
    assert!(
        matches!(e, InferError::Http { status: 500, ref body } if body == "Context size has been exceeded."),
        "{e:?}"
    );
    assert_eq!(partial.message.content.as_deref(), Some("Red"));
}

#[test]
fn an_idle_slot_is_no_waiting_event_busy_and_unavailable_are() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut at = 0;
    let mut seen = Vec::new();
    for s in [SlotSeen::Idle, SlotSeen::Busy, SlotSeen::Unavailable] {
        at += 50;
        x.handle_timeout(t(at));
        assert_eq!(outputs(&mut x), [Output::PollSlots]);
        x.handle_slots(t(at), s);
        seen.push(outputs(&mut x));
    }
    assert_eq!(
        seen,
        [
            vec![],
            vec![ev(ChatEvent::Waiting { slot_busy: true })],
            vec![ev(ChatEvent::Waiting { slot_busy: false })]
        ]
    );
}

/// A chunk with only prompt progress, as llama-server sends it (`return_progress`).
fn progress(processed: u64, total: u64) -> Vec<u8> {
    format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":null}}}}],\"id\":\"chatcmpl-t\",\"object\":\"chat.completion.chunk\",\"prompt_progress\":{{\"total\":{total},\"cache\":7,\"processed\":{processed},\"time_ms\":0}}}}\n\n"
    )
    .into_bytes()
}

/// llama-server sends its 200 head and the progress of the cached part of the prompt as soon
/// as it starts on a request, then progress after each batch, and its answer once the whole
/// prompt is processed (measured: head and `processed: 7` of 1,704 after 22 ms, the first
/// token after 4 s). Until then the request is in its prefill: timed as before the first byte
/// (a busy slot, `/slots` polled), not as a silent stream.
#[test]
fn a_head_and_prompt_progress_are_the_prefill_not_a_silent_stream() {
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    let mut start = HEAD.to_vec();
    start.extend(chunked(&[progress(7, 1_704)]));
    x.handle_bytes(t(1), &start);
    assert!(!x.answering());
    assert_eq!(
        outputs(&mut x),
        [ev(ChatEvent::Progress {
            total: 1_704,
            cache: 7,
            processed: 7
        })]
    );
    // At liveness_ms (100) after the head: a /slots poll, not `stalled`; and only then, since
    // the server has taken the request (each poll is a connection through inferproxy).
    assert_eq!(x.poll_timeout(), Some(t(101)));
    x.handle_timeout(t(100));
    assert_eq!(outputs(&mut x), []);
    x.handle_timeout(t(101));
    assert_eq!(outputs(&mut x), [Output::PollSlots]);
    x.handle_slots(t(101), SlotSeen::Busy);
    assert_eq!(
        outputs(&mut x),
        [ev(ChatEvent::Waiting { slot_busy: true })]
    );
    assert_eq!(x.poll_timeout(), Some(t(201)));
    x.handle_bytes(t(150), &chunked(&[progress(1_031, 1_704)]));
    assert!(!x.answering(), "one batch of the prompt done, not all");
    drain_progress(&mut x);
    assert_eq!(
        x.poll_timeout(),
        Some(t(201)),
        "batch progress is no answer"
    );
    // The whole prompt processed: the answer has begun, and liveness runs from here.
    x.handle_bytes(t(190), &chunked(&[progress(1_704, 1_704)]));
    assert!(x.answering());
    assert_eq!(x.poll_timeout(), Some(t(290)));
    drain_progress(&mut x);
    x.handle_timeout(t(201));
    assert_eq!(outputs(&mut x), [], "no poll once the answer has begun");
    x.handle_bytes(t(250), &chunked(&[content("Red", 1), finish(2)]));
    assert_eq!(outputs(&mut x), [text("Red")]);
    assert_eq!(
        x.take_result().unwrap().unwrap().message.content.as_deref(),
        Some("Red")
    );
    // A server that sends no progress: its first event is the answer.
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(1), HEAD);
    assert!(!x.answering());
    x.handle_bytes(t(20), &chunked(&[content("Red", 1)]));
    assert!(x.answering());
    assert_eq!(x.poll_timeout(), Some(t(120)));
}

fn drain_progress(x: &mut ChatExchange<'_>) {
    for o in outputs(x) {
        assert!(
            matches!(o, Output::Event(ChatEvent::Progress { .. })),
            "{o:?}"
        );
    }
}

#[test]
fn the_prefill_after_the_head_has_the_bounds_of_the_wait_before_it() {
    let run = |seen: SlotSeen, times: &[u64]| {
        let mut b = Buffers::new();
        let mut x = ChatExchange::new(limits(), t(0), &mut b);
        x.handle_bytes(t(1), HEAD);
        for &at in times {
            x.handle_timeout(t(at));
            x.handle_slots(t(at), seen);
        }
        x.take_result().map(|r| r.unwrap_err())
    };
    // busy_wait_ms (200), load_wait_ms (150), idle_grace_ms (120), from the send.
    assert!(run(SlotSeen::Busy, &[101, 199]).is_none());
    let e = run(SlotSeen::Busy, &[101, 200]);
    assert!(matches!(e, Some(InferError::WaitTimeout)), "{e:?}");
    let e = run(SlotSeen::Unavailable, &[101, 150]);
    assert!(matches!(e, Some(InferError::LoadTimeout)), "{e:?}");
    assert!(run(SlotSeen::Idle, &[101, 119]).is_none());
    let e = run(SlotSeen::Idle, &[101, 120]);
    assert!(
        matches!(e, Some(InferError::Stalled(Silence::IdleGrace))),
        "{e:?}"
    );
    // A judge is asked instead, as before the head.
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.judge_silence();
    x.handle_bytes(t(1), HEAD);
    for at in [101, 120] {
        x.handle_timeout(t(at));
        x.handle_slots(t(at), SlotSeen::Idle);
    }
    assert_eq!(outputs(&mut x), [Output::PollSlots, Output::JudgeSilence]);
    assert!(!x.is_over());
    // The connection closing in the prefill: closed early.
    let mut b = Buffers::new();
    let mut x = ChatExchange::new(limits(), t(0), &mut b);
    x.handle_bytes(t(1), HEAD);
    x.handle_eof(t(2));
    assert!(matches!(error(&mut x), InferError::StreamClosedEarly));
}
