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

/// `scripts/serve.sh` leaves no preset or worker config on disk: both live in a folder it
/// removes before the worker starts, and the worker names them by its own open fds.
#[test]
fn serve_sh_leaves_no_files_behind() {
    let server = LocalServer::start();
    let port = server.addr().port();
    let status = server.wait_worker("state ready", Duration::from_secs(30), |s| {
        s["state"] == "ready"
    });
    let router = status["pid"].as_u64().expect("server pid");
    let cmdline = std::fs::read(format!("/proc/{router}/cmdline")).expect("router cmdline");
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args
        .iter()
        .position(|a| a == "--models-preset")
        .expect("--models-preset");
    let preset = &args[at + 1];
    let worker_pid = std::fs::read_to_string(format!("/proc/{router}/stat"))
        .expect("router stat")
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(1).map(str::to_owned))
        .expect("ppid");
    assert_eq!(preset, &format!("/proc/{worker_pid}/fd/8"));
    let text = std::fs::read_to_string(preset).expect("the preset, through the worker's fd");
    assert!(text.starts_with("version = 1\n\n[smollm2]\n"), "{text}");
    let target = std::fs::read_link(preset).expect("fd link");
    assert!(
        target.to_string_lossy().ends_with("/preset.ini (deleted)"),
        "{}",
        target.display()
    );

    let tmp = std::env::temp_dir();
    let prefix = format!("serve-{port}.");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("temp dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert_eq!(left, Vec::<std::path::PathBuf>::new());
    let cache = std::env::var_os("BOXMAKER_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache")
                })
                .join("boxmaker")
        });
    for old in [format!("preset-{port}.ini"), format!("worker-{port}.toml")] {
        assert!(!cache.join("run").join(&old).exists(), "{old} in the cache");
    }
}
