//! loopd against the real local llama-server, through a real inferproxy on a Unix socket.
//!
//! One router and one proxy serve the whole file (they stop when the test process exits). The
//! model is tiny, so the tests check the shape of what comes back, not its wording. The tests
//! take turns: inferproxy admits 2 connections a second after a burst of 10 (an accident
//! limit), which parallel tests and fast `/slots` polls would exhaust.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use loopd_client::config::ClientConfig;
use loopd_client::llama::{
    cache_outcome, AssistantMessage, CacheOutcome, ChatEvent, ChatMessage, ChatRequest, Client,
    Completion, FinishReason, InferError,
};

/// The shared server and the proxy in front of it.
fn shared() -> &'static (LocalServer, Proxy) {
    static SHARED: OnceLock<(LocalServer, Proxy)> = OnceLock::new();
    SHARED.get_or_init(|| {
        let server = LocalServer::start();
        let proxy = Proxy::start(server.addr());
        (server, proxy)
    })
}

/// The socket of the shared proxy in front of the shared server.
fn socket() -> PathBuf {
    shared().1.socket().to_owned()
}

/// One test at a time against the shared server.
fn turn() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

fn config() -> ClientConfig {
    let mut c = ClientConfig::new(socket(), llama_harness::MODEL_ID);
    c.limits.max_tokens = 48;
    c.limits.poll_ms = 500;
    c.sampling.temperature = Some(0.0);
    // A 2,048-token batch takes longer than the default 30 s on a loaded 2-core box.
    c.limits.liveness_ms = 180_000;
    c
}

fn user(text: &str) -> ChatMessage {
    ChatMessage::User {
        content: text.into(),
    }
}

fn chat(client: &Client, req: &ChatRequest) -> (Result<Completion, InferError>, Vec<ChatEvent>) {
    let mut events = Vec::new();
    let r = client.chat(req, &mut |e| events.push(e.clone()));
    (r, events)
}

fn joined(events: &[ChatEvent], pick: fn(&ChatEvent) -> Option<&str>) -> String {
    events.iter().filter_map(pick).collect()
}

fn content_of(e: &ChatEvent) -> Option<&str> {
    match e {
        ChatEvent::Content(s) => Some(s),
        _ => None,
    }
}

fn reasoning_of(e: &ChatEvent) -> Option<&str> {
    match e {
        ChatEvent::Reasoning(s) => Some(s),
        _ => None,
    }
}

#[test]
fn plain_streamed_answer() {
    let _turn = turn();
    let client = Client::new(config());
    let req = ChatRequest::user(0, "Name three colours.");
    let (r, events) = chat(&client, &req);
    let done = r.unwrap();
    let text = done.message.content.clone().unwrap();
    assert!(!text.is_empty());
    assert_eq!(
        joined(&events, content_of),
        text,
        "the deltas reassemble exactly"
    );
    assert!(done.id.starts_with("chatcmpl-"), "{}", done.id);
    assert!(matches!(
        done.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ));
    assert!(
        done.timings.expect("timings").prompt_n > 0
            && done.timings.expect("timings").predicted_n > 0,
        "{:?}",
        done.timings
    );
    assert!(done.message.tool_calls.is_empty() && !done.thinking_capped);
}

#[test]
fn a_tool_call() {
    let _turn = turn();
    let client = Client::new(config());
    // The self-test's request: two worked examples, then the question; the 135M model copies
    // the pattern (docs/inference-contract.md).
    let req = loopd_client::selftest::tool_request(0);
    let (r, events) = chat(&client, &req);
    let done = r.unwrap();
    assert_eq!(done.finish_reason, FinishReason::ToolCalls, "{done:?}");
    assert_eq!(done.message.tool_calls.len(), 1, "{done:?}");
    let call = &done.message.tool_calls[0];
    assert_eq!(call.name, "get_weather");
    let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
    assert!(args.get("city").is_some_and(|c| c.is_string()), "{args}");
    let streamed: String = events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::ToolCallDelta {
                index: 0,
                arguments,
                ..
            } => Some(arguments.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(streamed, call.arguments);
}

#[test]
fn a_thinking_answer_capped_early() {
    let _turn = turn();
    let mut c = config();
    c.limits.thinking_cap = 4;
    c.limits.max_tokens = 160;
    let client = Client::new(c);
    let mut req = ChatRequest::user(1, "Explain why the sky is blue.");
    req.options.thinking = true;
    let (r, events) = chat(&client, &req);
    let done = r.unwrap();
    let capped = events
        .iter()
        .position(|e| matches!(e, ChatEvent::ThinkingCapped { .. }))
        .expect("capped");
    assert!(matches!(events[capped], ChatEvent::ThinkingCapped { tokens } if tokens >= 4));
    assert!(done.thinking_capped);
    assert!(
        done.reasoning_tokens >= 4 && done.reasoning_tokens < 4 + 256,
        "{}",
        done.reasoning_tokens
    );
    assert_eq!(
        joined(&events, reasoning_of),
        done.message.reasoning_content.clone().unwrap_or_default()
    );
    // The control call ended reasoning, and the answer followed.
    assert!(
        done.message
            .content
            .as_deref()
            .is_some_and(|s| !s.is_empty()),
        "{done:?}"
    );
    assert!(events[capped..].iter().any(|e| content_of(e).is_some()));
}

fn long_prompt() -> String {
    let para =
        "The lighthouse keeper wrote in the log every evening: the wind, the tide, the ships \
                that passed, and the colour of the sky over the harbour before the lamp was lit. ";
    para.repeat(60) + "\nIn one sentence, what did the keeper write about?"
}

#[test]
fn progress_events_on_a_long_prompt() {
    let _turn = turn();
    let mut c = config();
    c.limits.max_tokens = 8;
    let client = Client::new(c);
    let req = ChatRequest::user(0, long_prompt());
    let (r, events) = chat(&client, &req);
    let done = r.unwrap();
    let progress: Vec<(u64, u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Progress {
                total,
                cache,
                processed,
            } => Some((*total, *cache, *processed)),
            _ => None,
        })
        .collect();
    assert!(progress.len() >= 2, "{progress:?}");
    let total = progress[0].0;
    assert!(total > 1_000, "{total}");
    assert!(
        progress.windows(2).all(|w| w[0].2 <= w[1].2),
        "processed never goes back: {progress:?}"
    );
    assert_eq!(progress.last().unwrap().2, total);
    assert_eq!(
        done.timings.expect("timings").cache_n + done.timings.expect("timings").prompt_n,
        total
    );
}

#[test]
fn turn_two_hits_the_cache() {
    let _turn = turn();
    let client = Client::new(config());
    let mut messages = vec![
        ChatMessage::System {
            content: "You are terse.".into(),
        },
        user(&format!("{}\nSummarise that in five words.", long_prompt())),
    ];
    let req = |messages: &Vec<ChatMessage>| ChatRequest::new(1, messages.clone());
    let first = chat(&client, &req(&messages)).0.unwrap();
    messages.push(ChatMessage::Assistant(AssistantMessage {
        content: first.message.content.clone(),
        reasoning_content: first.message.reasoning_content.clone(),
        tool_calls: first.message.tool_calls.clone(),
    }));
    messages.push(user("Now in three words."));
    let second = chat(&client, &req(&messages)).0.unwrap();
    assert_eq!(
        cache_outcome(
            &first.timings.expect("timings"),
            &second.timings.expect("timings")
        ),
        CacheOutcome::Hit,
        "{:?} then {:?}",
        first.timings,
        second.timings
    );
    assert!(
        second.timings.expect("timings").cache_n > 1_000,
        "{:?}",
        second.timings
    );
}

#[test]
fn a_request_pinned_to_a_busy_slot_waits_then_completes() {
    let _turn = turn();
    // Two clients, so loopd's own gate does not queue the second: the server's slot is busy.
    let mut long = config();
    long.limits.max_tokens = 200;
    let holder = Arc::new(Client::new(long));
    let blocking = {
        let holder = holder.clone();
        std::thread::spawn(move || {
            let req = ChatRequest::user(1, long_prompt());
            let (r, events) = chat(&holder, &req);
            r.map(|c| c.finish_reason)
                .map_err(|e| format!("{e:?} after {events:?}"))
        })
    };
    let client = Client::new(config());
    // Wait until the server reports slot 1 processing, then send on the same slot. Polled
    // through a proxy of its own, as the shared one's accept bucket is the other tests'.
    let poll_proxy = Proxy::start(shared().0.addr());
    let poller = Client::new(ClientConfig::new(
        poll_proxy.socket(),
        llama_harness::MODEL_ID,
    ));
    llama_harness::wait_for(
        "slot 1 to be processing",
        Duration::from_secs(60),
        || match poller.slots() {
            Ok(slots) if slots.iter().any(|s| s.id == 1 && s.is_processing) => Ok(()),
            Ok(slots) => Err(format!("{slots:?}")),
            Err(e) => Err(e.to_string()),
        },
    );
    let req = ChatRequest::user(1, "Say hi.");
    let (r, events) = chat(&client, &req);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        events.first(),
        Some(&ChatEvent::Waiting { slot_busy: true }),
        "{events:?}"
    );
    blocking.join().unwrap().unwrap();
}

#[test]
fn props_slots_and_tokenize() {
    let _turn = turn();
    let client = Client::new(config());
    let props = client.props().unwrap();
    assert_eq!(props.total_slots, 2);
    assert!(props.n_ctx > 0 && !props.chat_template.is_empty());
    let slots = client.slots().unwrap();
    assert_eq!(slots.iter().map(|s| s.id).collect::<Vec<_>>(), [0, 1]);
    let tokens = client.tokenize("Hello world").unwrap();
    assert!(!tokens.is_empty() && tokens.len() < 5, "{tokens:?}");
}

/// A generation loopd abandons mid-stream (here a cancel after the first
/// tokens) leaves the server's slot idle soon after, because the server notices the closed
/// connection; and the next request on that slot goes through once `/slots` says idle.
#[test]
fn a_cancelled_generation_frees_its_server_slot() {
    let _turn = turn();
    let mut c = config();
    c.limits.max_tokens = 400;
    let client = Client::new(c);
    let req = ChatRequest::user(0, "Write a long story about a lighthouse keeper.");
    let cancel = loopd_client::llama::Cancel::new();
    let mut tokens = 0;
    let r = client.run(&req, &cancel, &mut |e| {
        if matches!(e, ChatEvent::Content(_)) {
            tokens += 1;
            if tokens == 3 {
                cancel.cancel();
            }
        }
    });
    let cancelled_at = std::time::Instant::now();
    let failed = r.expect_err("cancelled mid-stream");
    assert!(
        matches!(failed.error, InferError::Cancelled),
        "{}",
        failed.error
    );
    assert!(failed
        .partial
        .message
        .content
        .as_deref()
        .is_some_and(|t| !t.is_empty()));
    // Poll /slots until slot 0 is idle, saying what was last seen. Through a proxy of its own:
    // through the shared one these polls would spend the accept bucket (burst 10, 2 a second)
    // that the tests after this one need.
    let poll_proxy = Proxy::start(shared().0.addr());
    let poller = Client::new(ClientConfig::new(
        poll_proxy.socket(),
        llama_harness::MODEL_ID,
    ));
    // Its bucket refuses past 10 quick polls (a slow box): a refused poll is "not yet".
    let idle_after = loop {
        let seen = match poller.slots() {
            Ok(slots) => {
                let busy = slots.iter().find(|s| s.id == 0).map(|s| s.is_processing);
                if busy == Some(false) {
                    break cancelled_at.elapsed();
                }
                format!("{slots:?}")
            }
            Err(e) => format!("GET /slots: {e}"),
        };
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(10),
            "slot 0 still processing 10 s after the cancel; last seen: {seen}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("slot 0 idle {idle_after:?} after the cancel ({tokens} tokens streamed)");
    // The next request on the slot completes.
    let (r, _) = chat(&client, &ChatRequest::user(0, "Name three colours."));
    r.unwrap();
}

/// llama-server sends its 200 head, and the progress of the cached part of the prompt, as soon
/// as it starts on a request, and its answer only once the whole prompt is processed
/// (measured on this server: head and `processed: 7` of 1,704 after 22 ms, the first token
/// after 4 s; 14 s for a 1,500-token prompt on a loaded box). Between the two the request is a
/// busy slot in its prefill, not a silent stream: with the model instance stopped in the
/// middle of a long prompt for twice `liveness_ms`, the answer still completes. (Liveness is
/// measured from the box, 3 s at least: on a loaded box the tokens after the prefill come
/// seconds apart.)
/// (Before this was so, `config()` had to raise liveness to 180 s for long prompts.)
#[test]
fn a_prefill_longer_than_liveness_is_a_busy_slot_not_a_stall() {
    let _turn = turn();
    // Through a proxy of its own: the prefill polls /slots, and the shared proxy's accept
    // bucket (burst 10, then 2 a second) is the other tests'.
    let proxy = Proxy::start(shared().0.addr());
    let mut c = config();
    c.socket = proxy.socket().to_owned();
    // Liveness as short as this box allows: three times the longest gap between two events of
    // a short answer measured now (3 s at least), so that the tokens after the prefill come
    // within it on a loaded box too; the pause is twice it.
    let gap = longest_event_gap(&Client::new(c.clone()));
    let liveness = (gap * 3).clamp(Duration::from_millis(3_000), Duration::from_secs(15));
    eprintln!("longest gap between events {gap:?}: liveness {liveness:?}");
    c.limits.liveness_ms = liveness.as_millis() as u64;
    c.limits.poll_ms = 500;
    c.limits.max_tokens = 8;
    let client = Client::new(c);
    let router = shared().0.server_pid().expect("the router's pid");
    let instance = llama_harness::wait_for("the model instance", Duration::from_secs(30), || {
        match llama_harness::children_of(router).as_slice() {
            [one] => Ok(*one),
            other => Err(format!("children of router {router}: {other:?}")),
        }
    });
    let pause = liveness * 2;
    let signal = move |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &instance.to_string()])
            .status()
            .is_ok_and(|s| s.success())
    };
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let stopped = signal("-STOP");
        std::thread::sleep(pause);
        stopped && signal("-CONT")
    });
    // A prompt the cache has not seen, so its whole prefill runs.
    let nonce = std::process::id();
    let req = ChatRequest::user(0, format!("Log {nonce}. {}", long_prompt()));
    let started = std::time::Instant::now();
    let mut first_event = None;
    let r = client.chat(&req, &mut |e| {
        let prefill = matches!(e, ChatEvent::Waiting { .. } | ChatEvent::Progress { .. });
        if !prefill && first_event.is_none() {
            first_event = Some(started.elapsed());
        }
    });
    assert!(stopper.join().unwrap(), "kill -STOP / -CONT {instance}");
    let first = first_event.unwrap_or_else(|| panic!("no answer began: {r:?}"));
    assert!(
        first >= pause,
        "the answer began after {first:?}, before the instance was continued: the pause did \
         not fall in the prefill"
    );
    let done =
        r.unwrap_or_else(|e| panic!("a prefill of {first:?} with liveness {liveness:?}: {e:?}"));
    assert!(done.timings.is_some_and(|t| t.prompt_n > 1_000), "{done:?}");
}

/// The longest wait between two events (or before the first) of a short greedy answer on a
/// fresh prompt: what this box takes now between tokens.
fn longest_event_gap(client: &Client) -> Duration {
    let nonce = std::process::id();
    let mut req = ChatRequest::user(0, format!("Note {nonce}: say hello."));
    req.options.max_tokens = Some(8);
    let mut last = std::time::Instant::now();
    let mut longest = Duration::ZERO;
    client
        .chat(&req, &mut |_| {
            longest = longest.max(last.elapsed());
            last = std::time::Instant::now();
        })
        .expect("a short answer to measure the box");
    longest
}
