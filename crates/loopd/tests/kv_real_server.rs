//! Sessions' KV in files on the real local stack (llama-worker, llama-server with
//! `slot-save-path`, inferproxy, `loopd serve` owning one slot): a session that comes back
//! to a slot another used restores its file and evaluates only its new tokens; one whose
//! slot held it still does nothing; a server killed between turns resumes from the file;
//! a corrupt, missing or mismatched file, another session's file in its place, a file the
//! server refuses, and a save that cannot be written are each a cold prefill with the outcome that names it and a
//! completed turn; past the cap the least recently used file goes, and one over it alone at
//! once; a slot under `min_tokens` is not saved; a deleted session's files go with it.
//! Greedy sampling with the self-test's seed and a small `max_tokens`.

mod real_serve;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use llama_harness::{LocalServer, Proxy};
use real_serve::{call, start_serve_in, write_config};
use serde_json::{json, Value};

struct Stack {
    socket: PathBuf,
    log: PathBuf,
    kv: PathBuf,
    _serve: real_serve::Serve,
    _proxy: Proxy,
    server: LocalServer,
}

impl Stack {
    /// `kv` lines go into `[runner.kv]` after its `dir`.
    fn start(tag: &str, kv: &str) -> Stack {
        let dir = llama_harness::temp_dir(tag);
        let save = dir.join("kv");
        std::fs::create_dir(&save).unwrap();
        let server =
            LocalServer::start_with_configs("", &format!("slot-save-path = {}\n", save.display()));
        let proxy = Proxy::start(server.addr());
        let (config, socket) = write_config(
            &dir,
            &server,
            &proxy,
            "poll_ms = 500\nliveness_ms = 300000\nmax_tokens = 48",
            &format!(
                "budget = 0\nstall_ms = 300000\nslots = 1\n[runner.kv]\ndir = {:?}\n{kv}",
                save.display().to_string()
            ),
        );
        let (serve, log) = start_serve_in(&config, &dir);
        Stack {
            socket,
            log,
            kv: save,
            _serve: serve,
            _proxy: proxy,
            server,
        }
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn open(&self, name: &str) {
        let r = call(
            &self.socket,
            &json!({"cmd": "open", "session": name, "tools": [], "max_tokens": 16,
                    "system": "You are a helpful assistant who answers every question about \
                               the weather, the sea, ships, lighthouses and the people who keep \
                               them, in plain words and in one short sentence."}),
        );
        assert_eq!(r["session"], name, "{r}");
    }

    /// A turn, followed to its end: its kv events and its result. A turn refused because
    /// the server is not ready, or failed because it restarted (after a kill: the daemon may
    /// hear of it after admitting the turn), is sent again, for up to 3 minutes.
    fn turn(&self, session: &str, content: &str) -> (Vec<Value>, Value) {
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        loop {
            let (kv, r) = self.turn_once(session, content, deadline);
            let restarted = ["worker_restarted", "server_died"]
                .contains(&r["fail_reason"].as_str().unwrap_or(""));
            if restarted && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            assert_eq!(
                r["outcome"],
                "completed",
                "{session}: {r}\nloopd serve said:\n{}",
                self.said()
            );
            return (kv, r);
        }
    }

    fn turn_once(
        &self,
        session: &str,
        content: &str,
        deadline: std::time::Instant,
    ) -> (Vec<Value>, Value) {
        let cmd = json!({"cmd": "turn", "session": session, "content": content, "follow": true});
        // One reader for the whole stream: the reply and the first events may come in one read.
        let reader = loop {
            let s = UnixStream::connect(&self.socket).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
            (&s).write_all(format!("{cmd}\n").as_bytes()).unwrap();
            let mut reader = BufReader::new(s);
            let mut first = String::new();
            reader.read_line(&mut first).unwrap();
            let v: Value = serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
            if v["ok"] == true {
                break reader;
            }
            assert!(
                v["code"] == "WORKER_NOT_READY" && std::time::Instant::now() < deadline,
                "{session}: {v}"
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        let mut kv = Vec::new();
        for line in reader.lines() {
            let line = line.unwrap();
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if v["event"] == "kv" {
                kv.push(v);
            } else if v.get("result").is_some() {
                return (kv, v["result"].clone());
            } else if v["ok"] == false {
                panic!("{session}: {v}");
            }
        }
        panic!("{session}: the stream ended without a result");
    }

    fn files(&self, session: &str) -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = std::fs::read_dir(&self.kv)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy().into_owned();
                n.starts_with(&prefix(session))
            })
            .collect();
        all.sort();
        all
    }
}

/// What `loopd_agent`'s `session_prefix` makes of a session name: `loopd-` and 32 hex digits
/// of its explicit key.
fn prefix(session: &str) -> String {
    let key = loopd_agent::fleet::SessionKey::explicit(session).unwrap();
    let hex: String = key.as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("loopd-{hex}-")
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The kv event of `action`, and its outcome.
fn kv<'a>(events: &'a [Value], action: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["action"] == action)
        .unwrap_or_else(|| panic!("no kv {action} among {events:?}"))
}

fn outcome<'a>(events: &'a [Value], action: &str) -> &'a str {
    kv(events, action)["outcome"].as_str().unwrap()
}

#[test]
fn sessions_on_one_slot_restore_their_files_and_every_fault_is_a_cold_prefill() {
    let stack = Stack::start("loopd-kv-real", "min_tokens = 0");
    stack.open("a");
    stack.open("b");

    // a's first turn: no file yet; then saved.
    let (ev, a1) = stack.turn("a", "What colour is the sea on a clear day?");
    assert_eq!(outcome(&ev, "restore"), "missing", "{ev:?}");
    assert_eq!(outcome(&ev, "save"), "saved", "{ev:?}");
    let saved_a = n(&kv(&ev, "save")["tokens"]);
    // The prompt and every sampled token but the last, never evaluated.
    assert_eq!(saved_a + 1, n(&a1["session"]["total_n"]), "{ev:?} {a1}");
    assert_eq!(stack.files("a").len(), 2, "the file and its sidecar");

    // b takes the one slot; then a comes back and restores: only its new tokens evaluated.
    let (ev, b1) = stack.turn("b", "Why do lighthouses flash?");
    assert_eq!(outcome(&ev, "restore"), "missing");
    let (ev, a2) = stack.turn("a", "And on a stormy day?");
    assert_eq!(outcome(&ev, "restore"), "restored", "{ev:?}");
    assert_eq!(n(&kv(&ev, "restore")["tokens"]), saved_a);
    let s = &a2["session"];
    assert_eq!(s["cache_outcome"], "hit", "{a2}");
    assert!(n(&s["cache_n"]) + 1 >= saved_a, "{a2}");
    assert!(n(&s["prompt_n"]) < 40, "only the new message: {a2}");

    // Nothing between: the slot still holds a, nothing is restored.
    let (ev, a3) = stack.turn("a", "And at night?");
    assert_eq!(outcome(&ev, "restore"), "resident", "{ev:?}");
    assert_eq!(a3["session"]["cache_outcome"], "hit", "{a3}");

    // The server killed between turns (SIGKILL of the router): llama-worker starts a new one,
    // and a resumes from its file.
    let before = stack.server.worker_status().unwrap();
    let router = before["pid"].as_u64().unwrap() as i32;
    let spawns = n(&before["spawns"]);
    // SAFETY: a plain kill(2) of a process this test's server started.
    assert_eq!(unsafe { libc::kill(router, libc::SIGKILL) }, 0);
    let total_a3 = n(&a3["session"]["total_n"]);
    stack.server.wait_worker(
        "llama-worker ready with a new server after the kill",
        Duration::from_secs(180),
        |s| s["state"] == "ready" && s["spawns"].as_u64().is_some_and(|n| n > spawns),
    );
    // The daemon may refuse while it hears of the restart: turn() tries again.
    let (ev, a4) = stack.turn("a", "And in the fog?");
    assert_eq!(
        outcome(&ev, "restore"),
        "restored",
        "{ev:?}\n{}",
        stack.said()
    );
    let s = &a4["session"];
    assert!(
        n(&s["cache_n"]) + 1 >= total_a3,
        "resumed from the file saved at turn 3 ({total_a3} tokens): {a4}\n{}",
        stack.said()
    );

    // b's file corrupted (one byte of its KV): refused by its hash, a cold prefill, saved anew.
    let b_kv = stack
        .files("b")
        .into_iter()
        .find(|p| p.extension().unwrap() == "kv")
        .unwrap();
    let mut bytes = std::fs::read(&b_kv).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&b_kv, &bytes).unwrap();
    let (ev, b2) = stack.turn("b", "Who keeps them?");
    assert_eq!(outcome(&ev, "restore"), "corrupt", "{ev:?}");
    assert!(kv(&ev, "restore")["detail"]
        .as_str()
        .unwrap()
        .contains("hashes to"));
    // Cold: only what b shares with the conversation the slot held (a's: the BIOS and the
    // system message), not b's own first turn.
    let b1_total = n(&b1["session"]["total_n"]);
    assert!(
        n(&b2["session"]["cache_n"]) + 8 < b1_total,
        "a cold prefill: {b2}"
    );
    assert_eq!(outcome(&ev, "save"), "saved", "{ev:?}");

    // a's files deleted: missing, a cold prefill.
    for f in stack.files("a") {
        std::fs::remove_file(f).unwrap();
    }
    let (ev, a5) = stack.turn("a", "And in the rain?");
    assert_eq!(outcome(&ev, "restore"), "missing", "{ev:?}");
    let a4_total = n(&a4["session"]["total_n"]);
    assert!(
        n(&a5["session"]["cache_n"]) + 8 < a4_total,
        "a cold prefill: {a5}"
    );

    // b's sidecar says another model: a mismatch, nothing restored.
    let b_meta = stack
        .files("b")
        .into_iter()
        .find(|p| p.extension().unwrap() == "meta")
        .unwrap();
    let mut meta: Value = serde_json::from_slice(&std::fs::read(&b_meta).unwrap()).unwrap();
    meta["model"] = json!("another-model");
    std::fs::write(&b_meta, meta.to_string()).unwrap();
    let (ev, _) = stack.turn("b", "Are they lonely?");
    assert_eq!(outcome(&ev, "restore"), "mismatch", "{ev:?}");

    // a's own file replaced by b's (a valid file, another conversation): restored, and the
    // server reuses only what the two prompts share, so a's answer is a's.
    let (a_kv, a_meta) = {
        let f = stack.files("a");
        (f[0].clone(), f[1].clone())
    };
    assert!(a_kv.to_string_lossy().ends_with(".kv") && a_meta.to_string_lossy().ends_with(".meta"));
    let b = stack.files("b");
    std::fs::copy(&b[0], &a_kv).unwrap();
    std::fs::copy(&b[1], &a_meta).unwrap();
    let b_tokens =
        n(&serde_json::from_slice::<Value>(&std::fs::read(&b[1]).unwrap()).unwrap()["tokens"]);
    let (ev, a6) = stack.turn("a", "And in the snow?");
    assert_eq!(outcome(&ev, "restore"), "restored", "{ev:?}");
    assert_eq!(n(&kv(&ev, "restore")["tokens"]), b_tokens);
    let cache_n = n(&a6["session"]["cache_n"]);
    assert!(
        cache_n < b_tokens,
        "only the shared prefix (system message) reused, not b's {b_tokens} tokens: {a6}"
    );

    // A full disk: a 64 KiB tmpfs over the save path (a file is megabytes). The server's
    // save fails, the partial file goes, the turn completes; unmounted, the files are back.
    let full = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(&stack.kv)
        .status()
        .unwrap();
    assert!(
        full.success(),
        "mount a small tmpfs (the tests run as root)"
    );
    let (ev, b4) = stack.turn("b", "What do they eat?");
    let left: Vec<_> = std::fs::read_dir(&stack.kv).unwrap().flatten().collect();
    assert!(Command::new("umount")
        .arg(&stack.kv)
        .status()
        .unwrap()
        .success());
    assert_eq!(outcome(&ev, "save"), "failed", "{ev:?}");
    assert!(kv(&ev, "save")["detail"].is_string(), "{ev:?}");
    assert!(left.is_empty(), "the partial file deleted: {left:?}");
    assert!(b4["content"].is_string(), "{b4}");

    // a's file (b holds the slot) replaced by bytes that are no slot file, its sidecar made to
    // check: the server refuses the restore (and empties the slot), a cold prefill, the turn
    // completes and saves anew.
    let a = stack.files("a");
    let junk = vec![0x5au8; 4096];
    std::fs::write(&a[0], &junk).unwrap();
    let mut meta: Value = serde_json::from_slice(&std::fs::read(&a[1]).unwrap()).unwrap();
    meta["bytes"] = json!(junk.len());
    meta["xxh3"] = json!(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&junk)));
    std::fs::write(&a[1], meta.to_string()).unwrap();
    let (ev, a7) = stack.turn("a", "Do they sleep in the day?");
    assert_eq!(outcome(&ev, "restore"), "refused", "{ev:?}");
    assert!(kv(&ev, "restore")["detail"].is_string(), "{ev:?}");
    assert!(a7["content"].is_string(), "{a7}");
    assert_eq!(outcome(&ev, "save"), "saved", "{ev:?}");

    // The metrics count each outcome.
    let m = call(&stack.socket, &json!({"cmd": "metrics"}));
    let text = m["metrics"].as_str().unwrap_or_default().to_owned();
    for line in [
        r#"loopd_kv_total{action="restore",outcome="restored"} 3"#,
        r#"loopd_kv_total{action="restore",outcome="corrupt"} 1"#,
        r#"loopd_kv_total{action="restore",outcome="mismatch"} 1"#,
        r#"loopd_kv_total{action="save",outcome="failed"} 1"#,
        r#"loopd_kv_total{action="restore",outcome="resident"} 1"#,
        r#"loopd_kv_total{action="restore",outcome="refused"} 1"#,
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }

    // Deleting a session deletes its files.
    assert!(!stack.files("a").is_empty());
    let d = call(&stack.socket, &json!({"cmd": "delete", "session": "a"}));
    assert_eq!(d["deleted"], "a", "{d}");
    assert_eq!(stack.files("a"), Vec::<PathBuf>::new());
}

#[test]
fn the_least_recently_used_file_goes_first_and_one_over_the_cap_alone_goes_at_once() {
    // 5 MB: one file of this conversation (about 3.2 MB) fits, two do not.
    let stack = Stack::start("loopd-kv-lru", "min_tokens = 0\nmax_bytes = 5000000");
    stack.open("a");
    stack.open("b");
    let (ev, _) = stack.turn("a", "What colour is the sea on a clear day?");
    assert_eq!(outcome(&ev, "save"), "saved", "{ev:?}");
    let a_bytes = n(&kv(&ev, "save")["bytes"]);
    assert!(a_bytes <= 5_000_000, "{ev:?}");
    let (ev, _) = stack.turn("b", "Why do lighthouses flash?");
    let save = kv(&ev, "save");
    assert_eq!(save["outcome"], "saved", "{ev:?}");
    assert!(a_bytes + n(&save["bytes"]) > 5_000_000, "{ev:?}");
    assert_eq!(n(&save["evicted"]), 1, "a's file made room for b's: {ev:?}");
    assert_eq!(stack.files("a"), Vec::<PathBuf>::new());
    assert_eq!(stack.files("b").len(), 2);
    let (ev, _) = stack.turn("a", "And on a stormy day?");
    assert_eq!(outcome(&ev, "restore"), "missing", "{ev:?}");
    let m = call(&stack.socket, &json!({"cmd": "metrics"}));
    let text = m["metrics"].as_str().unwrap_or_default();
    // a's second save evicted b's in turn.
    assert!(text.contains("loopd_kv_evicted_total 2"), "{text}");
    drop(stack);

    // One byte: every file is over the cap alone, and is deleted as soon as it is written.
    let stack = Stack::start("loopd-kv-cap", "min_tokens = 0\nmax_bytes = 1");
    stack.open("a");
    let (ev, _) = stack.turn("a", "What colour is the sea?");
    assert_eq!(outcome(&ev, "save"), "too_big", "{ev:?}");
    assert_eq!(stack.files("a"), Vec::<PathBuf>::new());
}

#[test]
fn a_conversation_under_min_tokens_is_not_saved() {
    let stack = Stack::start("loopd-kv-small", "min_tokens = 100000");
    stack.open("a");
    let (ev, _) = stack.turn("a", "What colour is the sea?");
    assert_eq!(outcome(&ev, "save"), "small", "{ev:?}");
    assert_eq!(n(&kv(&ev, "save")["tokens"]), 0);
    assert_eq!(stack.files("a"), Vec::<PathBuf>::new());
}
