//! The local llama-server answers a streamed chat request with chunks of the shape the client
//! relies on (docs/inference-contract.md), and the harness stops everything it started.

use std::time::Duration;

use llama_harness::{http_request, wait_for, LocalServer};

#[test]
fn a_streamed_chat_request_gets_chunks_then_done() {
    let server = LocalServer::start();
    let body = format!(
        r#"{{"model":"{}","messages":[{{"role":"user","content":"Name a colour."}}],"stream":true,"temperature":0,"max_tokens":8,"timings_per_token":true,"chat_template_kwargs":{{"enable_thinking":false}}}}"#,
        server.model()
    );
    let (status, raw) = http_request(
        server.addr(),
        "POST",
        "/v1/chat/completions",
        Some(body.as_bytes()),
    )
    .expect("request");
    assert_eq!(status, 200);
    // The body is still chunked; the SSE lines inside are whole because each chunk holds events.
    let text = String::from_utf8_lossy(&raw);
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(|d| serde_json::from_str(d).expect("each data line is one JSON chunk"))
        .collect();
    assert!(text.contains("data: [DONE]"), "the stream ends in [DONE]");
    assert!(events.len() >= 2, "a role chunk and at least one more");
    let id = &events[0]["id"];
    for e in &events {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(&e["id"], id, "one id for the whole stream");
    }
    let last = events.last().unwrap();
    assert!(last["timings"]["predicted_n"].as_u64() > Some(0), "{last}");
    let finish = last["choices"][0]["finish_reason"].as_str();
    assert!(matches!(finish, Some("stop") | Some("length")), "{last}");
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!content.is_empty(), "some content streamed");

    let worker = server.wait_worker("state ready", Duration::from_secs(30), |s| {
        s["state"] == "ready"
    });
    let pid = worker["pid"].as_u64().expect("server pid");
    drop(server);
    let proc_dir = format!("/proc/{pid}");
    wait_for(
        "llama-server to be gone after the harness stops",
        Duration::from_secs(10),
        || match std::fs::read_to_string(format!("{proc_dir}/stat")) {
            Err(_) => Ok(()),
            // A zombie has exited; only its parent's wait is left.
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                Ok(())
            }
            Ok(stat) => Err(stat),
        },
    );
}
