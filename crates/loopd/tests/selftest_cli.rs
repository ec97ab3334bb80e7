//! `loopd selftest` against the fake server: it exits 1, and prints the failing check's line.

mod support;

use std::process::Command;

use llama_proto::hash::sha256;
use loopd_client::config::Expect;
use support::{props_reply, streamed, FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";
const TEMPLATE: &str = "{{ messages }}";

fn expect() -> Expect {
    Expect {
        chat_template_sha256: sha256(TEMPLATE.as_bytes()).unwrap().to_string(),
        n_ctx: 4096,
        total_slots: 2,
    }
}

fn answer(timings: Option<(u64, u64, u64)>) -> Reply {
    streamed(&[r#"{"content":"Blue."}"#], "stop", timings)
}

#[test]
fn loopd_selftest_exits_1_with_the_failing_line() {
    let server = FakeServer::start(vec![
        ("/props", vec![props_reply(TEMPLATE, 4096, 2)]),
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
