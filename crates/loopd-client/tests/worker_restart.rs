//! The whole local stack under a crash: llama-worker runs the router, inferproxy forwards, loopd
//! streams. Killing llama-server with SIGKILL mid-stream must end in a completed request: the
//! worker brings the server back and `chat_with_retry` sends the request again.

use std::process::Command;
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use loopd_client::config::ClientConfig;
use loopd_client::llama::{ChatEvent, ChatRequest, Client, FinishReason};

#[test]
fn a_stream_survives_llama_server_being_killed_under_it() {
    let server = LocalServer::start();
    let proxy = Proxy::start(server.addr());
    let mut c = ClientConfig::new(proxy.socket(), server.model());
    c.sampling.temperature = Some(0.0);
    c.limits.max_tokens = 32;
    // Polls are connections too: keep them inside inferproxy's 2-per-second accept budget.
    c.limits.poll_ms = 1000;
    let client = Client::new(c);
    let req = ChatRequest::user(0, "Count from one to twenty in words.");

    let before = server
        .server_pid()
        .expect("the worker reports the server's pid");
    let mut killed = false;
    let mut events = Vec::new();
    let done = client
        .chat_with_retry(&req, &mut |e| {
            events.push(e.clone());
            if !killed && matches!(e, ChatEvent::Content(_)) {
                killed = true;
                let status = Command::new("kill")
                    .args(["-KILL", &before.to_string()])
                    .status()
                    .expect("run kill");
                assert!(status.success(), "kill -KILL {before}");
            }
        })
        .expect("the request completes after the worker restarts the server");

    assert!(killed, "the stream produced content before the kill");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, ChatEvent::Retrying { attempt: 2, .. })),
        "a Retrying event after the kill: {events:?}"
    );
    assert!(matches!(
        done.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ));
    // The retried request may complete before the worker's next readiness probe: wait for the
    // worker to say so rather than asking once.
    let status = server.wait_worker(
        "the worker ready again with a new llama-server",
        Duration::from_secs(120),
        |s| {
            s["state"] == "ready"
                && s["pid"].as_u64().is_some_and(|p| p != u64::from(before))
                && s["total_restarts"].as_u64() >= Some(1)
        },
    );
    assert_ne!(status["pid"], before, "a new llama-server runs: {status}");
}
