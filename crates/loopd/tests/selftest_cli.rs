//! `loopd selftest` against the fake server: it exits 1, and prints the failing check's line.

mod support;

use std::process::Command;

use llama_proto::hash::sha256;
use loopd_client::config::Expect;
use support::{FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";
const TEMPLATE: &str = "{{ messages }}";

fn props(template: &str, n_ctx: u64, total_slots: u32) -> Reply {
    let body = serde_json::json!({
        "default_generation_settings": {"n_ctx": n_ctx},
        "total_slots": total_slots,
        "chat_template": template,
    });
    Reply::json(200, &body.to_string())
}

fn expect() -> Expect {
    Expect {
        chat_template_sha256: sha256(TEMPLATE.as_bytes()).unwrap().to_string(),
        n_ctx: 4096,
        total_slots: 2,
    }
}

/// A streamed answer: one chunk per delta, then the finish with `timings` (or none).
fn stream(deltas: &[&str], finish: &str, timings: Option<(u64, u64, u64)>) -> Reply {
    let timings = timings.map_or(String::new(), |(c, p, n)| {
        format!(r#","timings":{{"cache_n":{c},"prompt_n":{p},"predicted_n":{n}}}"#)
    });
    let mut pieces: Vec<Vec<u8>> = deltas
        .iter()
        .map(|d| {
            format!(r#"data: {{"id":"chatcmpl-s","choices":[{{"index":0,"delta":{d}}}]{timings}}}"#)
                .into_bytes()
        })
        .collect();
    pieces.push(
        format!(
            r#"data: {{"id":"chatcmpl-s","choices":[{{"index":0,"delta":{{}},"finish_reason":"{finish}"}}]{timings}}}"#
        )
        .into_bytes(),
    );
    pieces.push(b"data: [DONE]".to_vec());
    Reply::sse(
        pieces
            .into_iter()
            .map(|mut p| {
                p.extend_from_slice(b"\n\n");
                p
            })
            .collect(),
    )
}

fn answer(timings: Option<(u64, u64, u64)>) -> Reply {
    stream(&[r#"{"content":"Blue."}"#], "stop", timings)
}

#[test]
fn loopd_selftest_exits_1_with_the_failing_line() {
    let server = FakeServer::start(vec![
        ("/props", vec![props(TEMPLATE, 4096, 2)]),
        (
            CHAT,
            vec![
                answer(Some((0, 300, 2))),
                answer(Some((0, 180, 4))),
                answer(Some((180, 12, 3))),
            ],
        ),
    ]);
    let dir = server.socket().parent().unwrap().to_owned();
    let config = dir.join("loopd.toml");
    let e = expect();
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = \"smollm2\"\n[limits]\nload_wait_ms = 1000\n[retry]\nattempts = 1\ndelays_ms = []\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n",
            server.socket().display().to_string(),
            e.chat_template_sha256,
            e.n_ctx,
            e.total_slots
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["selftest", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        5,
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(lines[1].starts_with("ok   server "), "{stdout}");
    assert_eq!(
        lines[2],
        "FAIL tool-call expected a get_weather call with JSON object arguments and finish_reason \
         tool_calls; got [] finish_reason stop"
    );
    assert!(lines[3].starts_with("ok   cache "), "{stdout}");
    assert_eq!(
        lines[4],
        "selftest FAILED: tool-call (1 of 3 checks failed)"
    );
}
