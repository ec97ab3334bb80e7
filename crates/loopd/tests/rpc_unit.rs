//! llama.cpp's RPC backend against real processes: llama-worker runs two local `ggml-rpc-server`s and
//! `llama-server --rpc` over them as one unit; a chat completes through inferproxy and the
//! request runner; SIGKILL of one RPC server during a generation fails the request with
//! `worker_restarted` or `server_died` and its partial output, the worker brings the unit back
//! to ready, and no process of the old unit survives.
//!
//! Needs the cached llama.cpp build (with `ggml-rpc-server`) and model (`make llama`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llama_harness::{free_port, temp_dir, wait_for, workspace_artifact, workspace_root, Proxy};
use loopd::config::Config;
use loopd_agent::runner::{
    FailReason, Outcome, RequestEvent, Runner, StandardBios, Submission, ToolRegistry,
};
use loopd_client::llama::{ChatEvent, Client};
use loopd_client::selftest::SAMPLING;
use serde_json::Value;

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const MODEL_ID: &str = "smollm2";

fn cached(what: &str) -> PathBuf {
    let out = Command::new(workspace_root().join("scripts/llama-server.sh"))
        .arg(what)
        .output()
        .expect("scripts/llama-server.sh");
    assert!(
        out.status.success(),
        "scripts/llama-server.sh {what} failed (run `make llama`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The `llama-worker` daemon with the RPC unit; SIGTERM (then SIGKILL) when dropped.
struct Unit {
    worker: Child,
    socket: PathBuf,
    port: u16,
    dir: PathBuf,
}

/// Two `[[rpc.local]]` servers.
fn two_local() -> String {
    let entry = format!(
        "[[rpc.local]]\ncommand = {:?}\nargs = [\"-H\", \"127.0.0.1\", \"-p\", \"{{rpc_port}}\", \"-t\", \"1\"]\n",
        cached("rpc").display().to_string()
    );
    entry.repeat(2)
}

/// A `ggml-rpc-server` the test runs itself, standing in for one on another host: the worker
/// only checks it. SIGKILLed when dropped.
struct Remote {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Remote {
    fn new(dir: &Path) -> Remote {
        Remote {
            child: None,
            port: free_port(),
            log: dir.join("remote-rpc.log"),
        }
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            Command::new(cached("rpc"))
                .args(["-H", "127.0.0.1", "-p", &self.port.to_string(), "-t", "1"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Unit {
    fn start(dir: PathBuf, rpc_toml: &str) -> Unit {
        let server = cached("build");
        let model = cached("model").join(MODEL_FILE);
        let template = workspace_root().join("fixtures/templates/smollm2-tools-thinking.jinja");
        let socket = dir.join("worker.sock");
        let config = dir.join("worker.toml");
        std::fs::write(
            &config,
            format!(
                "command = {server:?}\n\
                 args = [\"-m\", {model:?}, \"--alias\", \"{MODEL_ID}\", \"-ngl\", \"99\", \"-c\", \"4096\",\n\
                 \"-np\", \"1\", \"--host\", \"127.0.0.1\", \"--port\", \"{{port}}\", \"--slots\", \"--jinja\",\n\
                 \"--chat-template-file\", {template:?}]\n\
                 status_socket = {socket:?}\nlog_file = {log:?}\n\
                 startup_deadline_s = 60\nstartup_probe_interval_s = 0.2\nprobe_interval_s = 0.5\n\
                 probe_timeout_s = 2\nrestart_backoff_s = 0.5\nstop_grace_s = 2\n{rpc_toml}",
                server = server.display().to_string(),
                model = model.display().to_string(),
                template = template.display().to_string(),
                socket = socket.display().to_string(),
                log = dir.join("server.log").display().to_string(),
            ),
        )
        .unwrap();
        let port = free_port();
        let worker = Command::new(workspace_artifact("llama-worker", "bin", "llama-worker"))
            .args(["run", "--port", &port.to_string(), "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
            .spawn()
            .unwrap();
        Unit {
            worker,
            socket,
            port,
            dir,
        }
    }

    fn status(&self) -> Result<Value, String> {
        let mut s = UnixStream::connect(&self.socket).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        s.write_all(b"status\n").map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(s)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))
    }

    /// Waits for a status that satisfies `pred`; panics with the last one and the logs' tail.
    fn wait(&self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        wait_for(what, limit, || {
            let s = self.status()?;
            if pred(&s) {
                Ok(s)
            } else {
                Err(format!("{s}\nworker log tail: {}", self.log_tail()))
            }
        })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("worker.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let pid = self.worker.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.worker.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.worker.kill();
        let _ = self.worker.wait();
    }
}

/// Live (non-zombie) processes of group `pgid`.
fn live(pgid: i64) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: split after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string() {
            out.push(format!("{head})"));
        }
    }
    out
}

fn pgids(s: &Value) -> Vec<i64> {
    let mut v: Vec<i64> = s["rpc"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["pgid"].as_i64()).collect())
        .unwrap_or_default();
    v.extend(s["pgid"].as_i64());
    v
}

fn ready(s: &Value) -> bool {
    s["state"] == "ready"
}

fn runner(proxy: &Proxy, socket: &Path) -> Runner {
    let mut c = Config::new(proxy.socket(), MODEL_ID);
    c.limits.poll_ms = 500;
    c.runner.worker_socket = Some(socket.to_owned());
    c.runner.worker_poll_ms = 200;
    Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner,
        ToolRegistry::new(),
        Arc::new(StandardBios),
        1,
    )
}

/// Submits a long generation and runs `kill` after three pieces of content; returns the result,
/// checked to be a failure with its partial output, and with `worker_reason` a
/// `worker_restarted` / `server_died` one.
fn cut_by_kill(
    runner: &Runner,
    worker_reason: bool,
    kill: impl FnOnce() + Send + 'static,
) -> loopd_agent::runner::RequestResult {
    let killed = Arc::new(AtomicU32::new(0));
    let k = killed.clone();
    let mut kill = Some(kill);
    let mut pieces = 0;
    let observer = Box::new(move |e: &RequestEvent| {
        if let RequestEvent::Chat(ChatEvent::Content(_)) = e {
            pieces += 1;
            if pieces == 3 {
                if let Some(f) = kill.take() {
                    f();
                    k.store(1, Ordering::SeqCst);
                }
            }
        }
    });
    let id = runner
        .submit_observed(
            request(
                "Count from one to two hundred in words, one number per line.",
                600,
            ),
            Some(observer),
        )
        .expect("admitted");
    let r = runner
        .wait_result(id, Duration::from_secs(120))
        .expect("a result");
    assert_eq!(killed.load(Ordering::SeqCst), 1, "the kill ran: {r:?}");
    match &r.outcome {
        Outcome::Failed { reason, detail } => assert!(
            !worker_reason
                || matches!(reason, FailReason::WorkerRestarted | FailReason::ServerDied),
            "{reason:?}: {detail}"
        ),
        o => panic!("the request did not fail: {o:?}"),
    }
    assert!(
        r.content.as_deref().is_some_and(|c| !c.is_empty()),
        "the partial output is kept: {r:?}"
    );
    r
}

fn request(prompt: &str, max_tokens: u64) -> Submission {
    Submission {
        system: None,
        messages: vec![loopd_client::llama::ChatMessage::User {
            content: prompt.into(),
        }],
        budget: Some(0),
        tools: None,
        session: None,
        summarize: None,
        options: loopd_client::llama::ChatOptions {
            thinking: false,
            max_tokens: Some(max_tokens),
            sampling: Some(SAMPLING),
        },
    }
}

#[test]
fn killing_one_rpc_server_mid_generation_restarts_the_whole_unit() {
    let unit = Unit::start(temp_dir("rpc-unit"), &two_local());
    let first = unit.wait("the RPC unit ready", Duration::from_secs(120), ready);
    let rpc = first["rpc"].as_array().expect("rpc endpoints").clone();
    assert_eq!(rpc.len(), 2, "{first}");
    let proxy = Proxy::start(([127, 0, 0, 1], unit.port).into());
    let runner = runner(&proxy, &unit.socket);

    // A chat completes through the whole stack over the two RPC servers.
    let id = runner.submit(request("Say hello.", 16)).expect("admitted");
    let r = runner
        .wait_result(id, Duration::from_secs(120))
        .expect("a result");
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "{:?} {:?}",
        r.outcome,
        r.content
    );
    assert!(r.content.as_deref().is_some_and(|c| !c.is_empty()), "{r:?}");

    // SIGKILL one RPC server once the generation has produced a few pieces of content.
    let victim = rpc[1]["pid"]
        .as_u64()
        .expect("the RPC server's pid")
        .to_string();
    cut_by_kill(&runner, true, move || {
        let ok = Command::new("kill")
            .args(["-KILL", &victim])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -KILL {victim}");
    });

    // The unit comes back: new RPC servers, a new server, ready; the loss named.
    let back = unit.wait(
        "the unit ready again after the restart",
        Duration::from_secs(120),
        |s| ready(s) && s["total_restarts"].as_u64() >= Some(1),
    );
    assert!(
        matches!(back["last_cause"].as_str(), Some("rpc_exited" | "exited")),
        "{back}"
    );
    let lost = back["rpc_lost"]["endpoint"].as_str().unwrap_or_default();
    assert!(
        lost.starts_with(rpc[1]["endpoint"].as_str().unwrap()),
        "the lost endpoint is the killed one: {back}"
    );
    // No process of the old unit survives (the guards make the groups whole).
    for g in pgids(&first) {
        wait_for(
            &format!("group {g} of the old unit gone"),
            Duration::from_secs(5),
            || {
                let l = live(g);
                if l.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{l:?}"))
                }
            },
        );
    }
    // And it serves again.
    let id = runner.submit(request("Say hello.", 16)).expect("admitted");
    let r = runner
        .wait_result(id, Duration::from_secs(120))
        .expect("a result");
    assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    let _ = std::fs::remove_dir_all(&unit.dir);
}

/// A remote endpoint (a `ggml-rpc-server` the worker does not own) that refuses keeps the
/// worker not ready with the endpoint in its reason and llama-server unspawned; once it
/// listens, the unit becomes ready. Killed mid-generation, llama-server aborts, the worker
/// restarts the unit, names the remote as lost and waits for it; back, the unit is ready.
#[test]
fn a_remote_rpc_server_is_waited_for_and_its_loss_named() {
    let dir = temp_dir("rpc-remote");
    let mut remote = Remote::new(&dir);
    let endpoint = format!("127.0.0.1:{}", remote.port);
    let unit = Unit::start(dir, &format!("[rpc]\nremote = [\"{endpoint}\"]\n"));
    let waiting = unit.wait(
        "the worker waiting for the remote endpoint",
        Duration::from_secs(30),
        |s| s["reason"].as_str().is_some_and(|r| r.contains(&endpoint)) && s["state"] == "starting",
    );
    assert_eq!(waiting["spawns"], 0, "llama-server not spawned: {waiting}");
    let proxy = Proxy::start(([127, 0, 0, 1], unit.port).into());
    let runner = runner(&proxy, &unit.socket);
    assert_eq!(
        runner
            .submit(request("Say hello.", 8))
            .err()
            .map(|e| e.as_str()),
        Some("WORKER_NOT_READY")
    );

    remote.start();
    unit.wait(
        "ready once the remote listens",
        Duration::from_secs(120),
        ready,
    );
    let r = runner
        .wait_result(
            runner.submit(request("Say hello.", 16)).expect("admitted"),
            Duration::from_secs(120),
        )
        .expect("a result");
    assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");

    // The remote host goes away mid-generation: llama-server aborts, the unit restarts.
    let remote = Arc::new(std::sync::Mutex::new(remote));
    let r2 = remote.clone();
    // Any failure: the worker learns of the loss only when llama-server has died, and the
    // runner reads the worker's status once when the stream breaks, possibly before the
    // worker's next reap (within 0.1 s), so `stream_closed_early` is a possible reason here.
    let r = cut_by_kill(&runner, false, move || r2.lock().unwrap().kill());
    eprintln!("the request cut by the remote's loss: {:?}", r.outcome);
    let lost = unit.wait(
        "the remote named as lost, the worker waiting for it",
        Duration::from_secs(60),
        |s| {
            s["state"] != "ready"
                && s["rpc_lost"]["endpoint"]
                    .as_str()
                    .is_some_and(|e| e.starts_with(&endpoint))
        },
    );
    assert_eq!(lost["last_cause"], "exited", "{lost}");
    remote.lock().unwrap().start();
    unit.wait(
        "ready again once the remote is back",
        Duration::from_secs(120),
        |s| ready(s) && s["total_restarts"].as_u64() >= Some(1),
    );
    let _ = std::fs::remove_dir_all(&unit.dir);
}
