//! A slot's KV saved to a file and restored on the real llama-server (started with
//! `slot-save-path`): what a save and a restore cost per MB, and what a restore buys a
//! returning conversation, measured against evaluating its prompt again. The figures are
//! printed for docs/benchmarks.md; what is asserted is behaviour: the file holds the whole
//! conversation, a restore brings it back (the next request finds it in the cache, up to the
//! last token), a missing file is refused with 400 and the slot is then cold, and the server
//! refuses a name that could leave its save path. `SLOT_FILE_FACTS=30,60,120` (`make
//! bench-slot-files`) measures three conversations, of about 850, 1,700 and 3,500 tokens.

use std::time::{Duration, Instant};

use llama_harness::{LocalServer, Proxy};
use loopd_client::config::ClientConfig;
use loopd_client::llama::{
    ChatMessage, ChatRequest, Client, Completion, InferError, SlotAction, SlotFile,
};

fn user(text: &str) -> ChatMessage {
    ChatMessage::User {
        content: text.into(),
    }
}

/// A prompt of about `facts` * 28 tokens, different for each `seed`.
fn long_prompt(seed: u32, facts: u32) -> String {
    let mut s = String::from("Remember these facts.\n");
    for i in 0..facts {
        s.push_str(&format!(
            "Fact {i}: the box numbered {} holds {} red stones and {} blue stones.\n",
            seed * 1000 + i,
            (i * 7 + seed) % 50,
            (i * 3 + seed) % 40
        ));
    }
    s.push_str("How many red stones are in the first box?");
    s
}

/// The chat on `slot` with `messages`, its wall time (one token: the time to the first token).
fn timed(client: &Client, slot: u32, messages: Vec<ChatMessage>) -> (Completion, Duration) {
    let mut req = ChatRequest::user(slot, "");
    req.messages = messages;
    let started = Instant::now();
    let done = client.chat(&req, &mut |_| {}).expect("the chat completes");
    (done, started.elapsed())
}

fn mb_per_s(f: &SlotFile) -> f64 {
    f.bytes as f64 / 1e6 / (f.micros.max(1) as f64 / 1e6)
}

#[test]
fn a_saved_slot_restores_a_returning_conversation() {
    let dir = llama_harness::temp_dir("slot-files");
    let saves = dir.join("slots");
    std::fs::create_dir_all(&saves).unwrap();
    let server =
        LocalServer::start_with_configs("", &format!("slot-save-path = {}\n", saves.display()));
    let proxy = Proxy::start(server.addr());
    let mut c = ClientConfig::new(proxy.socket(), llama_harness::MODEL_ID);
    c.limits.max_tokens = 1;
    c.limits.poll_ms = 500;
    c.limits.liveness_ms = 180_000;
    c.limits.call_ms = 60_000;
    c.sampling.temperature = Some(0.0);
    c.sampling.seed = Some(42);
    let client = Client::new(c);

    // `make test` runs one size; `make bench-slot-files` the three (SLOT_FILE_FACTS).
    let sizes: Vec<u32> = std::env::var("SLOT_FILE_FACTS")
        .unwrap_or_else(|_| "30".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("SLOT_FILE_FACTS: numbers, comma-separated")
        })
        .collect();
    for facts in sizes {
        let a = long_prompt(facts, facts);
        // Cold: the conversation evaluated from nothing.
        let (first, cold) = timed(&client, 0, vec![user(&a)]);
        let t = first.timings.expect("timings");
        let name = format!("loopd-probe-{facts}.kv");
        let saved = client.slot_file(0, SlotAction::Save, &name).expect("save");
        // The prompt and every sampled token but the last, which was never evaluated.
        assert_eq!(
            saved.tokens,
            t.cache_n + t.prompt_n + t.predicted_n - 1,
            "{saved:?} {t:?}"
        );
        // Another conversation takes the slot.
        timed(&client, 0, vec![user(&long_prompt(facts + 7, facts))]);
        let restored = client
            .slot_file(0, SlotAction::Restore, &name)
            .expect("restore");
        assert_eq!(restored.tokens, saved.tokens);
        // The returning conversation's next request: its prompt is in the cache again.
        let next = vec![
            user(&a),
            ChatMessage::Assistant(first.message.clone()),
            user("And in the second box?"),
        ];
        let (warm, warm_took) = timed(&client, 0, next.clone());
        let w = warm.timings.expect("timings");
        assert!(
            w.cache_n + 8 >= saved.tokens,
            "restored {} tokens, the next request found {} of them",
            saved.tokens,
            w.cache_n
        );
        // The same request with no file to restore: a missing file is refused, the slot is
        // then empty, and the whole prompt is evaluated again.
        let missing = client.slot_file(0, SlotAction::Restore, "loopd-none.kv");
        assert!(
            matches!(&missing, Err(InferError::Http { status: 400, .. })),
            "{missing:?}"
        );
        let (again, again_took) = timed(&client, 0, next);
        let g = again.timings.expect("timings");
        assert!(g.cache_n < 64, "an emptied slot holds nothing: {g:?}");
        eprintln!(
            "slot files: {} tokens ({:.1} MB): save {:.2} ms ({:.0} MB/s), restore {:.2} ms \
             ({:.0} MB/s); first prompt cold {:.0} ms; returning request after the restore \
             {:.0} ms (cache_n {}, prompt_n {}) against {:.0} ms evaluated again (prompt_n {})",
            saved.tokens,
            saved.bytes as f64 / 1e6,
            saved.micros as f64 / 1e3,
            mb_per_s(&saved),
            restored.micros as f64 / 1e3,
            mb_per_s(&restored),
            cold.as_secs_f64() * 1e3,
            warm_took.as_secs_f64() * 1e3 + restored.micros as f64 / 1e3,
            w.cache_n,
            w.prompt_n,
            again_took.as_secs_f64() * 1e3,
            g.prompt_n,
        );
    }
    // The server's own check of a name, behind ours: a path out of the save folder.
    let raw = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .arg(format!("http://{}/slots/0?action=save", server.addr()))
        .args(["-H", "Content-Type: application/json", "-d"])
        .arg(format!(
            r#"{{"model":"{}","filename":"../escape.kv"}}"#,
            llama_harness::MODEL_ID
        ))
        .output();
    if let Ok(out) = raw {
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "400",
            "the server refuses it too"
        );
    }
    assert!(!dir.join("escape.kv").exists());
}
