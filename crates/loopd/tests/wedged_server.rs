//! The whole local stack with a wedged model instance, on the default timeline scaled down by
//! one factor (5: 30 s of silence becomes 6 s). llama-worker runs the router, inferproxy
//! forwards, loopd's runner registers each generation and keeps a watch open. The model
//! instance (a child of the router, in the worker's group) is stopped with SIGSTOP after the
//! first streamed tokens: the worker sees the generation make no progress, restarts the server
//! and pushes the failure; the request ends `worker_restarted` with the tokens it had, and the
//! next request completes once the worker is ready again. With SIGKILL the router cuts the
//! stream; the generation stays registered for `runner.death_grace_ms` and the worker's
//! `server_died` (pushed, or seen on the status poll) is the reason.
//!
//! Either the push or the status poll may end the request first (both say the same);
//! `WEDGED_POLL_MS=60000` leaves only the push.

use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use llama_harness::{wait_for, LocalServer, Proxy};
use loopd::config::Config;
use loopd::llama::{ChatEvent, ChatMessage, Client};
use loopd::runner::{
    FailReason, Outcome, RequestEvent, Runner, StandardBios, Submission, ToolRegistry,
};

/// The factor the default timers are divided by.
const FACTOR: u64 = 5;

/// llama-worker's defaults (docs/llama-worker.md) divided by [`FACTOR`].
fn worker_config() -> String {
    let s = |default: f64| default / FACTOR as f64;
    format!(
        "stall_timeout_s = {}\ncpu_probe_interval_s = {}\nprobe_interval_s = {}\n\
         unready_restart_s = {}\nrestart_backoff_s = {}\n",
        s(30.0),
        s(5.0),
        s(5.0),
        s(30.0),
        s(2.0)
    )
}

/// loopd's defaults divided by [`FACTOR`].
fn loopd_config(server: &LocalServer, proxy: &Proxy) -> Config {
    let mut c = Config::new(proxy.socket(), server.model());
    let d = Config::new(proxy.socket(), server.model());
    c.limits.poll_ms = d.limits.poll_ms / FACTOR;
    c.limits.idle_grace_ms = d.limits.idle_grace_ms / FACTOR;
    c.limits.liveness_ms = d.limits.liveness_ms / FACTOR;
    c.runner.stall_ms = d.runner.stall_ms / FACTOR;
    c.runner.death_grace_ms = d.runner.death_grace_ms / FACTOR;
    // WEDGED_POLL_MS=60000 leaves the watch's push as the only way to see the restart.
    c.runner.worker_poll_ms = std::env::var("WEDGED_POLL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d.runner.worker_poll_ms / FACTOR);
    c.runner.worker_socket = Some(server.status_socket().to_owned());
    c.sampling.temperature = Some(0.0);
    c.limits.max_tokens = 256;
    c
}

fn ask(text: &str) -> Submission {
    Submission {
        messages: vec![ChatMessage::User {
            content: text.into(),
        }],
        ..Submission::default()
    }
}

/// The pids whose parent is `parent`, from `/proc/*/stat`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`: the comm may hold spaces, so split after its `)`.
        let rest = &stat[stat.rfind(')')? + 1..];
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent).then_some(pid)
    })
    .collect()
}

/// The model instance the router runs now: its only child.
fn model_instance(server: &LocalServer) -> u32 {
    wait_for(
        "the router's model instance",
        Duration::from_secs(30),
        || {
            let router = server.server_pid().ok_or("no router pid in the status")?;
            match children_of(router).as_slice() {
                [one] => Ok(*one),
                other => Err(format!("children of router {router}: {other:?}")),
            }
        },
    )
}

/// Sends `signal` to the model instance at the first streamed token of one request, checks
/// that the request ends `want` with those tokens, then that the next request completes.
fn wedge(signal: &str, want: FailReason) {
    let server = LocalServer::start_with_worker_config(&worker_config());
    let proxy = Proxy::start(server.addr());
    let c = loopd_config(&server, &proxy);
    let runner = Runner::new(
        Arc::new(Client::new(c)),
        ToolRegistry::new(),
        Arc::new(StandardBios),
        1,
    );
    let before = server.worker_status().expect("a worker status")["spawns"]
        .as_u64()
        .expect("spawns in the status");
    let instance = model_instance(&server);
    let (signalled, signals) = mpsc::channel();
    let sig = signal.to_owned();
    let mut sent = false;
    let observer = Box::new(move |e: &RequestEvent| {
        if !sent && matches!(e, RequestEvent::Chat(ChatEvent::Content(_))) {
            sent = true;
            // On the driver's thread: nothing more is read before the signal is sent.
            let ok = Command::new("kill")
                .args([sig.as_str(), &instance.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            let _ = signalled.send(ok);
        }
    });
    let id = runner
        .submit_observed(ask("Count from one to fifty in words."), Some(observer))
        .expect("a free slot on a ready worker");
    let r = runner
        .wait_result(id, Duration::from_secs(120))
        .unwrap_or_else(|e| {
            panic!(
                "no result within 120 s ({e}); server log {:?}",
                server.log()
            )
        });
    assert_eq!(
        signals.try_recv(),
        Ok(true),
        "kill {signal} {instance} at the first token; the result: {r:?}"
    );
    match &r.outcome {
        Outcome::Failed { reason, detail } => {
            assert_eq!(*reason, want, "{detail}; content {:?}", r.content);
            eprintln!("wedged_server: {signal} -> {reason}: {detail}");
        }
        other => panic!("expected {want} after {signal}, got {other:?}"),
    }
    assert!(
        r.content.as_deref().is_some_and(|t| !t.is_empty()),
        "the tokens streamed before the {signal} are kept: {r:?}"
    );
    server.wait_worker(
        "the worker ready again with a new server",
        Duration::from_secs(120),
        |s| s["state"] == "ready" && s["spawns"].as_u64().is_some_and(|n| n > before),
    );
    let next = wait_for("the next request admitted", Duration::from_secs(30), || {
        runner.submit(ask("Say hello.")).map_err(|e| e.to_string())
    });
    let r = runner
        .wait_result(next, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("no result for the next request within 120 s ({e})"));
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "the next request completes: {r:?}"
    );
    assert_eq!(runner.busy_slots(), 0);
}

#[test]
fn a_stopped_model_instance_fails_the_request_worker_restarted_and_the_next_completes() {
    wedge("-STOP", FailReason::WorkerRestarted);
}

#[test]
fn a_killed_model_instance_fails_the_request_server_died_and_the_next_completes() {
    wedge("-KILL", FailReason::ServerDied);
}
