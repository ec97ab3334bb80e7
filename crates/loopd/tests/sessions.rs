//! `loopd serve`'s sessions against the fake server (docs/sessions.md): every chat request a
//! session sends extends the one before it byte for byte (the fake server's recorded bodies
//! are compared), the log holds only completed turns, a turn runs one at a time, names and
//! sizes are capped with their own codes, a deleted session is gone from the store, and a
//! conversation that outgrows the context is compacted by the documented rule.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use llama_harness::fake::{extension, raw_messages, streamed};
use loopd::config::Config;
use loopd_client::config::Expect;
use serde_json::{json, Value};
use support::daemon::{config, error_of, slow_answer, Running};
use support::{FakeServer, Reply};

const CHAT: &str = "/v1/chat/completions";

fn daemon(server: &FakeServer, tweak: impl FnOnce(&mut Config)) -> Running {
    let mut c = config(server);
    c.expect = Some(Expect {
        chat_template_sha256: "0".repeat(64),
        n_ctx: 4096,
        total_slots: 2,
    });
    tweak(&mut c);
    let dir = server.socket().parent().unwrap().to_owned();
    Running::start_configured(
        server,
        2,
        Arc::new(clock::SystemClock::new()),
        Duration::from_secs(60),
        &dir.join("loopd.db"),
        c,
    )
}

fn answer(text: &str, timings: (u64, u64, u64)) -> Reply {
    let delta = json!({ "content": text }).to_string();
    streamed(&[&delta], "stop", Some(timings))
}

fn open(d: &Running, name: &str) -> Value {
    d.call(json!({"cmd": "open", "session": name}))
}

/// A turn, waited for: its result.
fn turn(d: &Running, session: &str, content: &str) -> Value {
    let r = d.call(json!({"cmd": "turn", "session": session, "content": content}));
    let id = r["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("turn refused: {r}"));
    let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
    w["result"].clone()
}

/// Every chat request the fake server received extends the one before it; returns what
/// each added.
fn chain(server: &FakeServer) -> Vec<Vec<Value>> {
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    bodies
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            extension(&w[0], &w[1])
                .unwrap_or_else(|e| panic!("request {} does not extend {}: {e}", i + 1, i))
        })
        .collect()
}

fn messages(body: &[u8]) -> Vec<Value> {
    serde_json::from_str(raw_messages(body).unwrap()).unwrap()
}

#[test]
fn each_turn_extends_the_last_byte_for_byte_and_the_log_holds_every_completed_turn() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            answer("Blue.", (0, 100, 20)),
            answer("Green.", (118, 15, 20)),
            answer("Red.", (0, 300, 5)),
        ],
    )]);
    let d = daemon(&server, |_| {});
    assert_eq!(
        open(&d, "colours"),
        json!({"ok": true, "session": "colours"})
    );
    let results: Vec<Value> = ["sky?", "grass?", "blood?"]
        .iter()
        .map(|q| turn(&d, "colours", q))
        .collect();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["outcome"], "completed", "{r}");
        assert_eq!(r["session"]["turn"], i + 1);
        assert_eq!(r["session"]["session"], "colours");
    }
    let s: Vec<(&Value, &Value, &Value)> = results
        .iter()
        .map(|r| {
            (
                &r["session"]["extends"],
                &r["session"]["why_not"],
                &r["session"]["cache_outcome"],
            )
        })
        .collect();
    assert_eq!(
        s,
        [
            (&json!(false), &json!("first_turn"), &json!("none")),
            (&json!(true), &Value::Null, &json!("hit")),
            (&json!(true), &Value::Null, &json!("loss")),
        ]
    );
    assert_eq!(results[1]["session"]["total_n"], 153);
    let added = chain(&server);
    assert_eq!(
        added,
        [
            vec![
                json!({"role": "assistant", "content": "Blue."}),
                json!({"role": "user", "content": "grass?"})
            ],
            vec![
                json!({"role": "assistant", "content": "Green."}),
                json!({"role": "user", "content": "blood?"})
            ],
        ]
    );
    let h = d.call(json!({"cmd": "history", "session": "colours"}));
    let kinds: Vec<&str> = h["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "assistant",
            "turn",
            "user",
            "assistant",
            "turn",
            "user",
            "assistant",
            "turn"
        ]
    );
    assert_eq!(
        h["records"][1],
        json!({"kind": "assistant", "content": "Blue."})
    );
    assert_eq!(h["session"]["turns"], 3);
    let list = d.call(json!({"cmd": "list"}));
    assert_eq!(list["sessions"][0]["name"], "colours");
    assert_eq!(list["sessions"][0]["turns"], 3);
    let m = d.call(json!({"cmd": "metrics"}));
    let text = m["metrics"].as_str().unwrap();
    for line in [
        r#"loopd_session_turns_total{cache_outcome="none",extends="false"} 1"#,
        r#"loopd_session_turns_total{cache_outcome="hit",extends="true"} 1"#,
        r#"loopd_session_turns_total{cache_outcome="loss",extends="true"} 1"#,
    ] {
        assert!(text.contains(line), "{line} not in {text}");
    }
}

#[test]
fn a_turn_with_tool_calls_logs_them_and_the_next_turn_extends_its_last_generation() {
    let call = json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
        "function": {"name": "arithmetic", "arguments": "{\"operation\":\"add\",\"numbers\":[2,3]}"}}]})
    .to_string();
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            streamed(&[&call], "tool_calls", Some((0, 50, 10))),
            answer("It is 5.", (60, 10, 4)),
            answer("Yes.", (74, 8, 2)),
        ],
    )]);
    let d = daemon(&server, |_| {});
    open(&d, "sums");
    let r = turn(&d, "sums", "2+3?");
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(turn(&d, "sums", "sure?")["outcome"], "completed");
    let added = chain(&server);
    assert_eq!(added[0].len(), 2, "the call and its result: {:?}", added[0]);
    assert_eq!(added[0][1]["role"], "tool");
    assert_eq!(
        added[1],
        [
            json!({"role": "assistant", "content": "It is 5."}),
            json!({"role": "user", "content": "sure?"})
        ]
    );
    let h = d.call(json!({"cmd": "history", "session": "sums"}));
    let records = h["records"].as_array().unwrap();
    assert_eq!(records[1]["tool_calls"][0]["name"], "arithmetic");
    assert_eq!(records[2]["kind"], "tool");
    assert_eq!(records[2]["tool_call_id"], "c1");
    assert_eq!(records[3]["content"], "It is 5.");
}

#[test]
fn a_failed_turn_leaves_the_log_as_it_was_and_the_next_turn_extends_the_last_completed_one() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            answer("One.", (0, 40, 3)),
            Reply::json(500, r#"{"error":{"code":500,"message":"boom"}}"#),
            answer("Two.", (43, 5, 3)),
        ],
    )]);
    let d = daemon(&server, |_| {});
    open(&d, "s");
    assert_eq!(turn(&d, "s", "a")["outcome"], "completed");
    let failed = turn(&d, "s", "b");
    assert_eq!(failed["outcome"], "failed", "{failed}");
    assert_eq!(failed["session"]["turn"], 2);
    let h = d.call(json!({"cmd": "history", "session": "s"}));
    assert_eq!(h["records"].as_array().unwrap().len(), 3, "{h}");
    let ok = turn(&d, "s", "c");
    assert_eq!(ok["session"]["turn"], 2, "the failed turn took no number");
    assert!(ok["session"]["extends"].as_bool().unwrap(), "{ok}");
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    assert_eq!(
        extension(&bodies[0], &bodies[2]).unwrap(),
        [
            json!({"role": "assistant", "content": "One."}),
            json!({"role": "user", "content": "c"})
        ]
    );
}

#[test]
fn turns_run_one_at_a_time_and_a_busy_session_cannot_be_deleted() {
    let server = FakeServer::start(vec![(
        CHAT,
        vec![slow_answer(20, Duration::from_millis(50))],
    )]);
    let d = daemon(&server, |_| {});
    open(&d, "s");
    let first = d.call(json!({"cmd": "turn", "session": "s", "content": "long"}));
    let id = first["id"].as_u64().unwrap();
    let second = d.call(json!({"cmd": "turn", "session": "s", "content": "again"}));
    assert_eq!(error_of(&second), "SESSION_BUSY");
    assert_eq!(
        second["detail"],
        format!("session \"s\" is running req-{id}; its turns run one at a time")
    );
    assert_eq!(
        error_of(&d.call(json!({"cmd": "delete", "session": "s"}))),
        "SESSION_BUSY"
    );
    let list = d.call(json!({"cmd": "list"}));
    assert_eq!(list["sessions"][0]["running"], id);
    // Another session runs beside it on the other slot.
    open(&d, "t");
    assert_eq!(turn(&d, "t", "short")["outcome"], "completed");
    let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
    assert_eq!(w["result"]["outcome"], "completed");
    assert_eq!(turn(&d, "s", "again")["session"]["turn"], 2);
}

#[test]
fn names_and_sizes_are_capped_with_their_own_codes() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
    let d = daemon(&server, |c| {
        c.sessions.max_sessions = 3;
    });
    let longest = "n".repeat(256);
    assert_eq!(open(&d, &longest)["session"], longest.as_str());
    let r = open(&d, &"n".repeat(257));
    assert_eq!(error_of(&r), "BAD_REQUEST");
    assert_eq!(
        r["detail"],
        "bad request: session: 257 bytes; it must be 1 to 256"
    );
    assert_eq!(error_of(&open(&d, "")), "BAD_REQUEST");
    assert_eq!(
        open(&d, "a\u{7}b")["detail"],
        "bad request: session: the control character '\\u{7}' is not allowed in a name"
    );
    assert_eq!(error_of(&open(&d, &longest)), "SESSION_EXISTS");
    let named = d.call(json!({"cmd": "open"}));
    assert_eq!(
        named["session"], "s-2",
        "the daemon names the second session"
    );
    assert_eq!(open(&d, "third")["session"], "third");
    let full = open(&d, "fourth");
    assert_eq!(error_of(&full), "SESSION_FULL");
    assert_eq!(
        full["detail"],
        "3 sessions are open (sessions.max_sessions); delete one first"
    );
    for (cmd, code) in [
        (
            json!({"cmd": "turn", "session": "none", "content": "x"}),
            "SESSION_NOT_FOUND",
        ),
        (
            json!({"cmd": "history", "session": "none"}),
            "SESSION_NOT_FOUND",
        ),
        (
            json!({"cmd": "delete", "session": "none"}),
            "SESSION_NOT_FOUND",
        ),
        (json!({"cmd": "open", "tools": ["nope"]}), "UNKNOWN_TOOL"),
        (json!({"cmd": "turn", "session": "x"}), "BAD_REQUEST"),
    ] {
        assert_eq!(error_of(&d.call(cmd.clone())), code, "{cmd}");
    }
}

/// The log cap at its limit and one past: a log of `max_log_bytes - 1` takes a turn, one of
/// `max_log_bytes` does not.
#[test]
fn a_log_at_its_cap_takes_no_turn_and_one_byte_under_it_does() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
    let probe = daemon(&server, |_| {});
    open(&probe, "p");
    turn(&probe, "p", "hello");
    let one_turn = probe.call(json!({"cmd": "history", "session": "p"}))["session"]["bytes"]
        .as_u64()
        .unwrap();
    drop(probe);
    for (cap, code) in [(one_turn + 1, None), (one_turn, Some("SESSION_FULL"))] {
        let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
        let d = daemon(&server, |c| c.sessions.max_log_bytes = cap);
        open(&d, "p");
        turn(&d, "p", "hello");
        let h = d.call(json!({"cmd": "history", "session": "p"}));
        assert_eq!(
            h["session"]["bytes"], one_turn,
            "the same turn, the same bytes"
        );
        let r = d.call(json!({"cmd": "turn", "session": "p", "content": "hello"}));
        match code {
            None => assert!(r["id"].is_u64(), "cap {cap}: {r}"),
            Some(c) => {
                assert_eq!(error_of(&r), c, "cap {cap}");
                assert_eq!(
                    r["detail"],
                    format!(
                        "session \"p\"'s log holds {one_turn} bytes, at its cap of {cap} \
                         (sessions.max_log_bytes); start a new session"
                    )
                );
            }
        }
    }
}

fn store_rows(store: &Path, session: &str) -> (i64, i64) {
    let c =
        rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let count = |sql: &str| c.query_row(sql, [session], |r| r.get(0)).unwrap();
    (
        count("SELECT count(*) FROM sessions WHERE name = ?1"),
        count("SELECT count(*) FROM session_records WHERE session = ?1"),
    )
}

#[test]
fn a_deleted_session_is_gone_from_the_store() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
    let d = daemon(&server, |_| {});
    let store = server.socket().parent().unwrap().join("loopd.db");
    open(&d, "gone");
    open(&d, "kept");
    turn(&d, "gone", "one");
    turn(&d, "kept", "one");
    assert_eq!(store_rows(&store, "gone"), (1, 3));
    assert_eq!(
        d.call(json!({"cmd": "delete", "session": "gone"})),
        json!({"ok": true, "deleted": "gone"})
    );
    assert_eq!(store_rows(&store, "gone"), (0, 0));
    assert_eq!(store_rows(&store, "kept"), (1, 3));
    assert_eq!(
        error_of(&d.call(json!({"cmd": "history", "session": "gone"}))),
        "SESSION_NOT_FOUND"
    );
}

#[test]
fn a_budget_given_with_a_turn_stays_and_says_the_prompt_changed() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
    let d = daemon(&server, |_| {});
    d.call(json!({"cmd": "open", "session": "b", "budget": 2}));
    turn(&d, "b", "one");
    let r = d.call(json!({"cmd": "turn", "session": "b", "content": "two", "budget": 5}));
    let id = r["id"].as_u64().unwrap();
    let w = d.call(json!({"cmd": "wait", "id": id, "timeout_ms": 20_000}));
    assert_eq!(w["result"]["budget"], 5);
    assert_eq!(w["result"]["session"]["why_not"], "settings_changed");
    let r3 = turn(&d, "b", "three");
    assert_eq!(r3["budget"], 5);
    assert_eq!(r3["session"]["extends"], true);
    let h = d.call(json!({"cmd": "history", "session": "b"}));
    assert_eq!(h["settings"]["budget"], 5);
}

/// A 1,400-token context and answers of about 300 tokens: the fourth turn would not fit, so
/// the daemon has the model summarize turns 2..=b first, the turn says `compacted`, the log
/// records the summary, and the next turn extends the compacted one again.
#[test]
fn a_turn_that_would_not_fit_is_compacted_by_a_summary_and_the_next_extends_it() {
    let long = "word ".repeat(120);
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            answer(&long, (0, 330, 300)),
            answer(&long, (630, 40, 300)),
            answer(&long, (970, 40, 300)),
            // The summary generation, then the compacted turn and the one after it.
            answer("They talked about words.", (100, 500, 8)),
            answer("Short.", (20, 600, 3)),
            answer("Again.", (623, 12, 2)),
        ],
    )]);
    let d = daemon(&server, |c| {
        c.expect.as_mut().unwrap().n_ctx = 1_400;
        c.limits.max_tokens = 100;
    });
    open(&d, "long");
    for q in ["one", "two", "three"] {
        assert_eq!(turn(&d, "long", q)["outcome"], "completed");
    }
    let r = turn(&d, "long", "four");
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["session"]["extends"], false);
    assert_eq!(r["session"]["why_not"], "compacted");
    assert_eq!(r["session"]["compacted"], json!(["summary"]));
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    assert_eq!(bodies.len(), 5);
    let summary_request = messages(&bodies[3]);
    assert_eq!(
        summary_request.last().unwrap()["content"],
        "Summarize the conversation so far in a few sentences: the facts, names, numbers and \
         decisions it established and what is still open. Write only the summary."
    );
    let compacted = messages(&bodies[4]);
    let users: Vec<&str> = compacted
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users[0], "one", "turn 1 is kept whole");
    assert!(
        users
            .iter()
            .any(|u| u.starts_with("[Summary of the earlier conversation")
                && u.contains("They talked about words.")),
        "{users:?}"
    );
    assert_eq!(*users.last().unwrap(), "four");
    let h = d.call(json!({"cmd": "history", "session": "long"}));
    let compaction = h["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "compaction")
        .unwrap()
        .clone();
    assert_eq!(compaction["rule"], "summary");
    assert_eq!(compaction["from_turn"], 2);
    assert_eq!(compaction["summary"], "They talked about words.");
    let next = turn(&d, "long", "five");
    assert_eq!(next["session"]["extends"], true, "{next}");
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    extension(&bodies[4], &bodies[5]).expect("the turn after the compaction extends it");
}

/// The server's own refusal of a prompt as too long (HTTP 400, `exceed_context_size_error`)
/// fails that turn with its reason, and the next turn compacts whatever the estimate says,
/// keeping only the last turn.
#[test]
fn a_turn_the_server_refused_as_too_long_makes_the_next_one_compact() {
    let too_long = r#"{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}"#;
    let server = FakeServer::start(vec![(
        CHAT,
        vec![
            answer("One.", (0, 60, 4)),
            answer("Two.", (62, 10, 4)),
            answer("Three.", (76, 10, 4)),
            Reply::json(400, too_long),
            answer("Turn two was about two.", (30, 40, 6)),
            answer("Fits now.", (0, 90, 4)),
        ],
    )]);
    let d = daemon(&server, |_| {});
    open(&d, "s");
    for q in ["one", "two", "three"] {
        assert_eq!(turn(&d, "s", q)["outcome"], "completed");
    }
    let refused = turn(&d, "s", "four");
    assert_eq!(refused["outcome"], "failed");
    assert_eq!(refused["fail_reason"], "http_error", "{refused}");
    assert_eq!(refused["session"]["extends"], true);
    let r = turn(&d, "s", "four");
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["session"]["why_not"], "compacted");
    assert_eq!(r["session"]["compacted"], json!(["summary"]));
    let bodies: Vec<Vec<u8>> = server.bodies_to(CHAT);
    let users: Vec<String> = messages(bodies.last().unwrap())
        .into_iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        users,
        [
            "one".to_owned(),
            "[Summary of the earlier conversation, written to fit the context window]\n\
             Turn two was about two.\n\nthree"
                .to_owned(),
            "four".to_owned()
        ]
    );
}

/// A daemon started again with another chat template (`[expect]`) on the same store: the
/// session goes on, and its next turn says its prompt no longer extends the last one's.
#[test]
fn a_turn_after_the_template_changed_says_so() {
    let server = FakeServer::start(vec![(CHAT, vec![answer("Fine.", (0, 10, 2))])]);
    let mut first = daemon(&server, |_| {});
    open(&first, "t");
    turn(&first, "t", "one");
    first.stop();
    drop(first);
    let second = daemon(&server, |c| {
        c.expect.as_mut().unwrap().chat_template_sha256 = "1".repeat(64);
    });
    let r = turn(&second, "t", "two");
    assert_eq!(r["session"]["turn"], 2, "{r}");
    assert_eq!(r["session"]["extends"], false);
    assert_eq!(r["session"]["why_not"], "template_changed");
    assert_eq!(turn(&second, "t", "three")["session"]["extends"], true);
}
