//! Device tests (design section 6): run by `make verify-device` with `--ignored`, against the
//! router that `UPSTREAM` names, with the config that `LOOPD_CONFIG` names. Each test starts its
//! own `inferproxy` (the binary at `INFERPROXY_BIN`, so loopd does not depend on that crate),
//! uses slot 0, and never touches the llama-server process.
//!
//! `make test` runs them against the local router; `make verify-device` against straylight.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use llama_harness::Proxy;
use loopd::config::Config;
use loopd_client::llama::{ChatEvent, ChatRequest, Client, FinishReason};

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run these through make verify-device"))
}

fn upstream() -> SocketAddr {
    let up = env("UPSTREAM");
    up.to_socket_addrs()
        .unwrap_or_else(|e| panic!("UPSTREAM {up}: {e}"))
        .next()
        .unwrap_or_else(|| panic!("UPSTREAM {up} resolves to nothing"))
}

/// The verify-device config, pointed at this test's own proxy, greedy and short.
fn config(socket: &Path) -> Config {
    let path = env("LOOPD_CONFIG");
    let mut c = Config::load(Path::new(&path)).unwrap_or_else(|e| panic!("{e}"));
    c.socket = socket.to_owned();
    c.sampling.temperature = Some(0.0);
    c.limits.max_tokens = 48;
    // Polls are connections too: keep them inside inferproxy's 2-per-second accept budget.
    c.limits.poll_ms = 1000;
    c
}

fn ask(text: &str, thinking: bool) -> ChatRequest {
    let mut req = ChatRequest::user(0, text);
    req.options.thinking = thinking;
    req
}

#[test]
#[ignore = "needs a router: run by make verify-device (make test runs it against the local one)"]
fn a_capped_thinking_block_is_ended_and_the_answer_follows() {
    let proxy = Proxy::start(upstream());
    let mut c = config(proxy.socket());
    c.limits.thinking_cap = 8;
    let client = Client::new(c.client());
    let mut events = Vec::new();
    let done = client
        .chat(&ask("Explain why the sky is blue.", true), &mut |e| {
            events.push(e.clone())
        })
        .expect("the capped request completes");

    let capped_at = events
        .iter()
        .position(|e| matches!(e, ChatEvent::ThinkingCapped { tokens } if *tokens >= 8))
        .expect("a ThinkingCapped event once 8 reasoning tokens streamed");
    assert!(done.thinking_capped);
    assert!(
        (8..8 + 256).contains(&done.reasoning_tokens),
        "reasoning stopped within the overrun allowance: {} tokens",
        done.reasoning_tokens
    );
    let answer: String = events[capped_at..]
        .iter()
        .filter_map(|e| match e {
            ChatEvent::Content(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        !answer.trim().is_empty(),
        "content follows the cap: {events:?}"
    );
    assert_eq!(
        done.message.content.as_deref().map(str::trim),
        Some(answer.trim())
    );
}

#[test]
#[ignore = "needs a router: run by make verify-device (make test runs it against the local one)"]
fn a_stream_survives_its_inferproxy_being_killed_and_restarted() {
    let mut proxy = Proxy::start(upstream());
    let client = Client::new(config(proxy.socket()).client());
    let mut events = Vec::new();
    let mut killed = false;
    let done = client
        .chat_with_retry(
            &ask("Count from one to twenty in words.", false),
            &mut |e| {
                events.push(e.clone());
                if !killed && matches!(e, ChatEvent::Content(_)) {
                    killed = true;
                    proxy.kill();
                    proxy.restart();
                }
            },
        )
        .expect("the request completes through the restarted proxy");

    assert!(killed, "the stream produced content before the kill");
    let retry = events
        .iter()
        .find_map(|e| match e {
            ChatEvent::Retrying { attempt, error, .. } => Some((*attempt, error.clone())),
            _ => None,
        })
        .expect("a Retrying event after the kill");
    assert_eq!(retry.0, 2, "the first retry is attempt 2: {retry:?}");
    assert!(matches!(
        done.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ));
    assert!(done.message.content.is_some_and(|c| !c.trim().is_empty()));
}
