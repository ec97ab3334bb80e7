//! The self-test against the fake server: each check passes on the answers it wants and fails,
//! with a line that says why, on every way a server can differ; the requests pin their
//! sampling and `max_tokens` (`loopd selftest`'s exit is loopd's `tests/selftest_cli.rs`).

mod support;

use llama_proto::hash::sha256;
use loopd_client::config::{ClientConfig, Expect, Limits};
use loopd_client::llama::Client;
use loopd_client::selftest::{self, Check, CACHE_MAX_TOKENS, TOOL_MAX_TOKENS};
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

fn client(server: &FakeServer) -> Client {
    let mut c = ClientConfig::new(server.socket(), "smollm2");
    c.expect = Some(expect());
    c.limits = Limits {
        poll_ms: 50,
        busy_wait_ms: 200,
        load_wait_ms: 150,
        idle_grace_ms: 120,
        liveness_ms: 300,
        ..Limits::default()
    };
    c.retry.attempts = 1;
    c.retry.delays_ms = Vec::new();
    Client::new(c)
}

fn call(arguments: &str) -> Reply {
    let args = serde_json::to_string(arguments).unwrap();
    streamed(
        &[&format!(
            r#"{{"tool_calls":[{{"index":0,"id":"c1","type":"function","function":{{"name":"get_weather","arguments":{args}}}}}]}}"#
        )],
        "tool_calls",
        Some((0, 300, 20)),
    )
}

fn answer(timings: Option<(u64, u64, u64)>) -> Reply {
    streamed(&[r#"{"content":"Blue."}"#], "stop", timings)
}

fn check(routes: Vec<(&str, Vec<Reply>)>, f: fn(&Client, u32) -> Check) -> Check {
    let server = FakeServer::start(routes);
    f(&client(&server), 0)
}

#[test]
fn the_server_check_names_each_mismatch() {
    let ok = check(
        vec![("/props", vec![props_reply(TEMPLATE, 4096, 2)])],
        selftest::server_matches,
    );
    assert!(ok.passed, "{ok}");
    let want = expect().chat_template_sha256;
    let other = sha256(b"{{ other }}").unwrap().to_string();
    for (reply, detail) in [
        (
            props_reply("{{ other }}", 4096, 2),
            format!("chat_template sha256 expected {want} got {other}; n_ctx expected 4096 got 4096; total_slots expected 2 got 2"),
        ),
        (
            props_reply(TEMPLATE, 8192, 2),
            format!("chat_template sha256 expected {want} got {want}; n_ctx expected 4096 got 8192; total_slots expected 2 got 2"),
        ),
        (
            props_reply(TEMPLATE, 4096, 1),
            format!("chat_template sha256 expected {want} got {want}; n_ctx expected 4096 got 4096; total_slots expected 2 got 1"),
        ),
    ] {
        let c = check(vec![("/props", vec![reply])], selftest::server_matches);
        assert_eq!((c.passed, c.detail), (false, detail));
    }
}

#[test]
fn the_tool_check_fails_without_a_call_with_bad_arguments_or_the_wrong_finish() {
    let ok = check(
        vec![(CHAT, vec![call(r#"{"city": "Paris"}"#)])],
        selftest::tool_call_parses,
    );
    assert!(ok.passed, "{ok}");
    let expected =
        "expected a get_weather call with JSON object arguments and finish_reason tool_calls; got";
    for (reply, got) in [
        (
            answer(Some((0, 300, 2))),
            "[] finish_reason stop".to_owned(),
        ),
        (
            call(r#"{"city": "Par"#),
            r#"[get_weather({"city": "Par)] finish_reason tool_calls"#.to_owned(),
        ),
        (
            call(r#""Paris""#),
            r#"[get_weather("Paris")] finish_reason tool_calls"#.to_owned(),
        ),
        (
            streamed(
                &[
                    r#"{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}"#,
                ],
                "length",
                Some((0, 300, 64)),
            ),
            "[get_weather({})] finish_reason length".to_owned(),
        ),
    ] {
        let c = check(vec![(CHAT, vec![reply])], selftest::tool_call_parses);
        assert_eq!((c.passed, c.detail), (false, format!("{expected} {got}")));
    }
}

#[test]
fn the_cache_check_fails_on_a_loss_and_on_missing_timings() {
    let turn1 = Some((0, 180, 4));
    let ok = check(
        vec![(CHAT, vec![answer(turn1), answer(Some((180, 12, 3)))])],
        selftest::turn_two_hits_cache,
    );
    assert!(ok.passed, "{ok}");
    assert_eq!(
        ok.detail,
        "turn 2 expected to reuse about 184 tokens (at most 64 short); got cache_n 180 (prompt_n 12)"
    );
    let loss = check(
        vec![(CHAT, vec![answer(turn1), answer(Some((119, 80, 3)))])],
        selftest::turn_two_hits_cache,
    );
    assert_eq!(
        (loss.passed, loss.detail.as_str()),
        (
            false,
            "turn 2 expected to reuse about 184 tokens (at most 64 short); got cache_n 119 (prompt_n 80)"
        )
    );
    for (replies, turn) in [
        (vec![answer(None), answer(Some((180, 12, 3)))], 1),
        (vec![answer(turn1), answer(None)], 2),
        (vec![answer(None), answer(None)], 1),
    ] {
        let c = check(vec![(CHAT, replies)], selftest::turn_two_hits_cache);
        assert_eq!(
            (c.passed, c.detail),
            (
                false,
                format!("expected timings on both turns; the server sent none on turn {turn}")
            )
        );
    }
}

#[test]
fn every_request_pins_greedy_sampling_a_seed_and_a_small_max_tokens() {
    let server = FakeServer::start(vec![
        ("/props", vec![props_reply(TEMPLATE, 4096, 2)]),
        (
            CHAT,
            vec![
                call(r#"{"city": "Paris"}"#),
                answer(Some((0, 180, 4))),
                answer(Some((180, 12, 3))),
            ],
        ),
    ]);
    let checks = selftest::run(&client(&server), 1, &mut |_| {});
    assert!(checks.iter().all(|c| c.passed), "{checks:?}");
    let sent = server.requests_to(CHAT);
    let limits: Vec<(u64, f64, u64, u64)> = sent
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            (
                v["max_tokens"].as_u64().unwrap(),
                v["temperature"].as_f64().unwrap(),
                v["seed"].as_u64().unwrap(),
                v["id_slot"].as_u64().unwrap(),
            )
        })
        .collect();
    let seed = selftest::SAMPLING.seed.unwrap();
    assert_eq!(
        limits,
        [
            (TOOL_MAX_TOKENS, 0.0, seed, 1),
            (CACHE_MAX_TOKENS, 0.0, seed, 1),
            (CACHE_MAX_TOKENS, 0.0, seed, 1)
        ]
    );
    // The design's budget: about 1,000 tokens for the three checks. The prompts are what the
    // fake server cannot count, so this bounds what the requests allow the model to generate.
    const { assert!(TOOL_MAX_TOKENS + 2 * CACHE_MAX_TOKENS <= 128) };
}
