//! Sessions on the real local stack (llama-worker, llama-server, inferproxy, `loopd serve`):
//! a 10-turn conversation whose every turn after the first evaluates only its new tokens (the
//! server's prompt cache holds the whole conversation, since each request extends the last),
//! and a 30-turn conversation on the 4,096-token slot that outgrows it and keeps going by
//! compaction with no error reaching the user. Greedy sampling with the self-test's seed and
//! a small `max_tokens` keep the small model's answers the same from run to run (`limits.max_tokens`
//! caps a session's own `max_tokens`).

mod real_serve;

use std::path::{Path, PathBuf};

use llama_harness::{LocalServer, Proxy};
use real_serve::{call, start_serve_in, write_config};
use serde_json::{json, Value};

/// The real stack and `loopd serve` on it: greedy sampling, `max_tokens` as given, no tool
/// budget, the stall report left to the timers, and the test's own `runner` lines.
struct Stack {
    socket: PathBuf,
    log: PathBuf,
    // Dropped in this order: the daemon, then the proxy, then the server.
    _serve: real_serve::Serve,
    _proxy: Proxy,
    _server: LocalServer,
}

impl Stack {
    fn start(tag: &str, max_tokens: u64, extra: &str) -> Stack {
        let server = LocalServer::start();
        let proxy = Proxy::start(server.addr());
        let dir = llama_harness::temp_dir(tag);
        let (config, socket) = write_config(
            &dir,
            &server,
            &proxy,
            &format!("poll_ms = 500\nliveness_ms = 300000\nmax_tokens = {max_tokens}"),
            &format!("budget = 0\nstall_ms = 300000\n{extra}"),
        );
        let (serve, log) = start_serve_in(&config, &dir);
        Stack {
            socket,
            log,
            _serve: serve,
            _proxy: proxy,
            _server: server,
        }
    }
}

/// A turn, waited for: its result (the turn's content and its `session` record).
fn turn(socket: &Path, session: &str, content: &str) -> Value {
    let r = call(
        socket,
        &json!({"cmd": "turn", "session": session, "content": content}),
    );
    let id = r["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("turn refused: {r}"));
    let w = call(
        socket,
        &json!({"cmd": "wait", "id": id, "timeout_ms": 600_000}),
    );
    w["result"].clone()
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn ten_turns_each_evaluate_only_their_new_tokens() {
    let stack = Stack::start("loopd-sessions-real", 48, "");
    let (socket, log) = (&stack.socket, &stack.log);
    let opened = call(
        socket,
        &json!({"cmd": "open", "session": "ten", "tools": [], "max_tokens": 24}),
    );
    assert_eq!(opened["session"], "ten", "{opened}");
    let questions = [
        "What colour is the sky?",
        "And the grass?",
        "Name a fruit.",
        "Name an animal.",
        "What is two plus two?",
        "Name a city.",
        "What is water made of?",
        "Name a planet.",
        "What do bees make?",
        "Say goodbye.",
    ];
    let mut previous_total = 0;
    let mut table =
        String::from("turn | cache_n | prompt_n | new tokens | cache_outcome | extends\n");
    for (i, q) in questions.iter().enumerate() {
        let r = turn(socket, "ten", q);
        assert_eq!(
            r["outcome"],
            "completed",
            "turn {}: {r}\nloopd serve said:\n{}",
            i + 1,
            std::fs::read_to_string(log).unwrap_or_default()
        );
        let s = &r["session"];
        assert_eq!(n(&s["turn"]), i as u64 + 1, "{r}");
        let (cache_n, prompt_n) = (n(&s["cache_n"]), n(&s["prompt_n"]));
        // The turn's prompt in tokens, less the whole of the last turn's conversation.
        let new = (cache_n + prompt_n).saturating_sub(previous_total);
        table.push_str(&format!(
            "{} | {cache_n} | {prompt_n} | {new} | {} | {}\n",
            i + 1,
            s["cache_outcome"].as_str().unwrap(),
            s["extends"]
        ));
        if i > 0 {
            assert_eq!(s["extends"], true, "turn {}: {r}", i + 1);
            assert_eq!(s["cache_outcome"], "hit", "turn {}: {r}\n{table}", i + 1);
            assert!(
                prompt_n <= new + 32,
                "turn {}: prompt_n {prompt_n} > {new} new tokens + 32\n{table}",
                i + 1
            );
        }
        previous_total = n(&s["total_n"]);
    }
    eprintln!("{table}");
    let h = call(socket, &json!({"cmd": "history", "session": "ten"}));
    assert_eq!(h["session"]["turns"], 10);
    assert_eq!(
        h["records"].as_array().unwrap().len(),
        30,
        "user, answer, turn per turn"
    );
}

#[test]
fn thirty_turns_on_the_4096_token_slot_keep_going_by_compaction() {
    let stack = Stack::start(
        "loopd-sessions-real-30",
        200,
        "[sessions]\nsummary_max_tokens = 96",
    );
    let (socket, log) = (&stack.socket, &stack.log);
    call(
        socket,
        &json!({"cmd": "open", "session": "thirty", "tools": [], "system": "You are a storyteller."}),
    );
    let mut compactions = Vec::new();
    let mut lines = String::new();
    for i in 1..=30 {
        let r = turn(
            socket,
            "thirty",
            &format!("Tell part {i} of a long story about a lighthouse keeper, in detail."),
        );
        assert_eq!(
            r["outcome"],
            "completed",
            "turn {i}: {r}\nloopd serve said:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        let s = &r["session"];
        lines.push_str(&format!(
            "{i}: cache_n {} prompt_n {} total_n {} {} {}\n",
            s["cache_n"], s["prompt_n"], s["total_n"], s["cache_outcome"], s["compacted"]
        ));
        assert!(
            n(&s["total_n"]) <= 4096,
            "turn {i} ran past the slot's context: {r}"
        );
        if let Some(rules) = s["compacted"].as_array() {
            compactions.push((i, rules.clone()));
        }
    }
    eprintln!("{lines}compactions: {compactions:?}");
    assert!(
        compactions
            .iter()
            .any(|(_, rules)| rules.contains(&json!("summary"))),
        "30 turns of up to 200 tokens outgrow 4,096 tokens: a summary was due\n{lines}"
    );
    let h = call(socket, &json!({"cmd": "history", "session": "thirty"}));
    assert_eq!(h["session"]["turns"], 30);
    let summaries = h["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "compaction" && r["rule"] == "summary")
        .count();
    assert_eq!(
        summaries,
        compactions
            .iter()
            .filter(|(_, r)| r.contains(&json!("summary")))
            .count()
    );
}
