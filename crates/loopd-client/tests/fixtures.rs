//! The recorded transcripts (`fixtures/`, from the real server) served by the fake server: the
//! deltas reassemble exactly into what the server's non-streamed answer to the same request
//! says, and every event the transcript carries comes out as a `ChatEvent`.

mod support;

use llama_harness::fixture;
use loopd_client::config::ClientConfig;
use loopd_client::llama::{ChatEvent, ChatRequest, Client, Completion, FinishReason};
use serde_json::Value;
use support::{events_of, FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";
const CONTROL: &str = "/v1/chat/completions/control";

fn json(name: &str) -> Value {
    serde_json::from_slice(&fixture(name)).unwrap()
}

fn request() -> ChatRequest {
    ChatRequest::user(0, "x")
}

/// Serves `<name>.sse`, one piece per event, and runs one chat on `config`.
fn serve(
    name: &str,
    config: impl FnOnce(&mut ClientConfig),
) -> (Completion, Vec<ChatEvent>, FakeServer) {
    let control = json("reasoning_end.control.json")["response"].to_string();
    let server = FakeServer::start(vec![
        (
            CHAT,
            vec![Reply::sse(events_of(&fixture(&format!("{name}.sse"))))],
        ),
        (CONTROL, vec![Reply::json(200, &control)]),
    ]);
    let mut c = ClientConfig::new(server.socket(), "smollm2");
    config(&mut c);
    let client = Client::new(c);
    let mut events = Vec::new();
    let done = client
        .chat(&request(), &mut |e| events.push(e.clone()))
        .unwrap();
    (done, events, server)
}

fn text(events: &[ChatEvent], reasoning: bool) -> String {
    events
        .iter()
        .filter_map(|e| match (e, reasoning) {
            (ChatEvent::Content(s), false) | (ChatEvent::Reasoning(s), true) => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

/// The message of the non-streamed answer to the same request.
fn message(name: &str) -> Value {
    json(&format!("{name}.response.json"))["choices"][0]["message"].clone()
}

#[test]
fn plain_reassembles_to_the_non_streamed_answer() {
    let (done, events, _) = serve("plain", |_| {});
    let want = message("plain");
    assert_eq!(done.message.content.as_deref(), want["content"].as_str());
    assert_eq!(text(&events, false), done.message.content.clone().unwrap());
    assert_eq!(done.finish_reason, FinishReason::Stop);
    assert_eq!(done.message.reasoning_content, None);
    // The transcript's prompt progress (0 then 13 of 13) comes out too.
    let progress: Vec<&ChatEvent> = events
        .iter()
        .filter(|e| matches!(e, ChatEvent::Progress { .. }))
        .collect();
    assert_eq!(
        progress.last(),
        Some(&&ChatEvent::Progress {
            total: 13,
            cache: 0,
            processed: 13
        })
    );
    let t = json("plain.response.json")["timings"].clone();
    assert_eq!(
        done.timings.expect("timings").prompt_n,
        t["prompt_n"].as_u64().unwrap()
    );
    assert_eq!(
        done.timings.expect("timings").predicted_n,
        t["predicted_n"].as_u64().unwrap()
    );
}

#[test]
fn thinking_reassembles_reasoning_and_counts_its_tokens() {
    let (done, events, server) = serve("thinking", |_| {});
    let want = message("thinking");
    assert_eq!(
        done.message.reasoning_content.as_deref(),
        want["reasoning_content"].as_str()
    );
    assert_eq!(
        text(&events, true),
        done.message.reasoning_content.clone().unwrap()
    );
    assert_eq!(
        done.message.content.unwrap_or_default(),
        want["content"].as_str().unwrap()
    );
    // Every generated token was reasoning here but the last, the end of the turn, which came
    // with the final chunk and no reasoning text.
    assert_eq!(
        done.reasoning_tokens + 1,
        done.timings.expect("timings").predicted_n
    );
    assert!(!done.thinking_capped && server.requests_to(CONTROL).is_empty());
}

#[test]
fn tool_call_reassembles_name_and_arguments() {
    let (done, events, _) = serve("tool_call", |_| {});
    let want = &message("tool_call")["tool_calls"][0];
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.message.tool_calls.len(), 1);
    assert_eq!(
        done.message.tool_calls[0].name,
        want["function"]["name"].as_str().unwrap()
    );
    assert_eq!(
        done.message.tool_calls[0].arguments,
        want["function"]["arguments"].as_str().unwrap()
    );
    let deltas: Vec<&ChatEvent> = events
        .iter()
        .filter(|e| matches!(e, ChatEvent::ToolCallDelta { .. }))
        .collect();
    assert!(deltas.len() > 1, "arguments arrive in pieces");
    match deltas[0] {
        ChatEvent::ToolCallDelta {
            index: 0,
            id: Some(id),
            name: Some(name),
            ..
        } => {
            assert_eq!(
                (id, name),
                (
                    &done.message.tool_calls[0].id,
                    &done.message.tool_calls[0].name
                )
            );
        }
        other => panic!("{other:?}"),
    }
    let args: String = deltas
        .iter()
        .map(|e| match e {
            ChatEvent::ToolCallDelta { arguments, .. } => arguments.as_str(),
            _ => "",
        })
        .collect();
    assert_eq!(args, done.message.tool_calls[0].arguments);
}

#[test]
fn progress_events_are_the_transcripts_prompt_progress() {
    let (done, events, _) = serve("progress", |_| {});
    let want: Vec<ChatEvent> = events_of(&fixture("progress.sse"))
        .iter()
        .filter_map(|e| serde_json::from_slice::<Value>(e.strip_prefix(b"data: ")?).ok())
        .filter_map(|v| {
            let p = v.get("prompt_progress")?;
            Some(ChatEvent::Progress {
                total: p["total"].as_u64()?,
                cache: p["cache"].as_u64()?,
                processed: p["processed"].as_u64()?,
            })
        })
        .collect();
    assert!(want.len() >= 3, "{want:?}");
    let got: Vec<ChatEvent> = events
        .into_iter()
        .filter(|e| matches!(e, ChatEvent::Progress { .. }))
        .collect();
    assert_eq!(got, want);
    assert!(done.message.content.is_some());
}

#[test]
fn reasoning_end_posts_the_recorded_control_call_and_the_answer_follows() {
    let (done, events, server) = serve("reasoning_end", |c| c.limits.thinking_cap = 3);
    let capped = events
        .iter()
        .position(|e| matches!(e, ChatEvent::ThinkingCapped { .. }))
        .unwrap();
    assert_eq!(events[capped], ChatEvent::ThinkingCapped { tokens: 3 });
    assert!(done.thinking_capped);
    assert!(done
        .message
        .content
        .as_deref()
        .is_some_and(|c| !c.is_empty()));
    assert_eq!(text(&events, false), done.message.content.clone().unwrap());
    assert_eq!(
        text(&events, true),
        done.message.reasoning_content.clone().unwrap()
    );
    let sent = server.requests_to(CONTROL);
    assert_eq!(sent.len(), 1);
    let recorded = &json("reasoning_end.control.json")["request"];
    assert_eq!(
        serde_json::from_slice::<Value>(&sent[0].body).unwrap(),
        *recorded
    );
    assert_eq!(
        sent[0].body,
        serde_json::to_vec(recorded).unwrap(),
        "same bytes, same key order"
    );
}

#[test]
fn a_raw_chunked_response_as_received() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![Reply::raw(fixture("chunked_response.http"))],
    )]);
    let client = Client::new(ClientConfig::new(server.socket(), "smollm2"));
    let done = client.chat(&request(), &mut |_| {}).unwrap();
    // The same request as `plain`, greedy: the same answer.
    assert_eq!(
        done.message.content.as_deref(),
        message("plain")["content"].as_str()
    );
    assert_eq!(done.finish_reason, FinishReason::Stop);
}

#[test]
fn a_transcript_cut_anywhere_before_its_last_chunk_is_closed_early() {
    let body = fixture("plain.sse");
    let finish = body
        .windows(14)
        .position(|w| w == b"\"finish_reason")
        .unwrap();
    let last = body
        .windows(22)
        .rposition(|w| w == b"\"finish_reason\":\"stop\"")
        .unwrap();
    assert!(finish < last);
    for cut in [1, body.len() / 3, last] {
        let server = FakeServer::start(vec![(
            CHAT,
            vec![Reply::sse(vec![body[..cut].to_vec()]).ending(support::End::Cut)],
        )]);
        let r = Client::new(ClientConfig::new(server.socket(), "smollm2"))
            .chat(&request(), &mut |_| {});
        assert!(
            matches!(r, Err(loopd_client::llama::InferError::StreamClosedEarly)),
            "cut at {cut}: {r:?}"
        );
    }
}

#[test]
fn any_split_of_the_stream_gives_the_same_completion() {
    let body = fixture("tool_call.sse");
    let whole = serve("tool_call", |_| {});
    for (size, delay) in [(1, 0), (7, 0), (64, 1), (997, 2)] {
        let pieces: Vec<Vec<u8>> = body.chunks(size).map(<[u8]>::to_vec).collect();
        let reply = Reply::sse(pieces).each_after(std::time::Duration::from_millis(delay));
        let server = FakeServer::start(vec![(CHAT, vec![reply])]);
        let client = Client::new(ClientConfig::new(server.socket(), "smollm2"));
        let mut events = Vec::new();
        let done = client
            .chat(&request(), &mut |e| events.push(e.clone()))
            .unwrap();
        assert_eq!(done, whole.0, "pieces of {size}");
        assert_eq!(events, whole.1, "pieces of {size}");
    }
}
