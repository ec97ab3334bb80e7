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
//! A prompt that takes longer than liveness to evaluate is not a stall: llama-server sends its
//! head at once and nothing more until the prompt is evaluated; the client, seeing no answer
//! yet, waits on the slot `/slots` says is busy, the worker judges the registered prefill by
//! the server's CPU time, and the request completes with no restart.
//!
//! Either the push or the status poll may end the request first (both say the same);
//! `WEDGED_POLL_MS=60000` leaves only the push. `WEDGED_FACTOR=1` runs the two wedges on the
//! default timers themselves (`make soak` does, once: `loopd-wedged-server-unscaled`).

mod sections;

use std::process::Command;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use llama_harness::{wait_for, LocalServer, Proxy};
use loopd_agent::runner::{
    FailReason, Outcome, RequestEvent, Runner, StandardBios, Submission, ToolRegistry,
};
use loopd_client::llama::{ChatEvent, ChatMessage, Client};
use sections::Config;

/// One test at a time: each runs a whole stack on a scaled timeline, and two of them on the
/// same 2 cores (the long prefill above all) would starve each other past those timers.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The factor the default timers are divided by: 5, or `WEDGED_FACTOR`.
fn factor() -> u64 {
    std::env::var("WEDGED_FACTOR")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&f| f > 0)
        .unwrap_or(5)
}

/// llama-worker's defaults (docs/llama-worker.md) divided by [`factor`].
fn worker_config() -> String {
    let s = |default: f64| default / factor() as f64;
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

/// loopd's defaults divided by [`factor`].
fn loopd_config(server: &LocalServer, proxy: &Proxy) -> Config {
    let mut c = Config::new(proxy.socket(), server.model());
    let d = Config::new(proxy.socket(), server.model());
    c.limits.poll_ms = d.limits.poll_ms / factor();
    c.limits.idle_grace_ms = d.limits.idle_grace_ms / factor();
    c.limits.liveness_ms = d.limits.liveness_ms / factor();
    c.runner.stall_ms = d.runner.stall_ms / factor();
    c.runner.death_grace_ms = d.runner.death_grace_ms / factor();
    // WEDGED_POLL_MS=60000 leaves the watch's push as the only way to see the restart.
    c.runner.worker_poll_ms = std::env::var("WEDGED_POLL_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d.runner.worker_poll_ms / factor());
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

/// The model instance the router runs now: its only child.
fn model_instance(server: &LocalServer) -> u32 {
    wait_for(
        "the router's model instance",
        Duration::from_secs(30),
        || {
            let router = server.server_pid().ok_or("no router pid in the status")?;
            match llama_harness::children_of(router).as_slice() {
                [one] => Ok(*one),
                other => Err(format!("children of router {router}: {other:?}")),
            }
        },
    )
}

/// Sends `signal` to the model instance at the first streamed token of one request, checks
/// that the request ends `want` with those tokens, then that the next request completes.
fn wedge(signal: &str, want: FailReason) {
    let _serial = one_at_a_time();
    let server = LocalServer::start_with_worker_config(&worker_config());
    let proxy = Proxy::start(server.addr());
    let c = loopd_config(&server, &proxy);
    let runner = Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner.clone(),
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

/// A prompt of `lines` numbered lines (about 14 tokens each) the model must read whole.
fn long_prompt(lines: usize) -> String {
    let mut p = String::from("Here is a list. Say only the colour of the last box.\n");
    let colours = ["red", "green", "blue", "yellow", "white", "black", "orange"];
    for i in 1..=lines {
        p.push_str(&format!(
            "Box {i} is {} and holds {} stones.\n",
            colours[i % colours.len()],
            i * 7 % 13
        ));
    }
    p
}

#[test]
fn a_prefill_longer_than_liveness_is_not_a_stall_and_completes() {
    let _serial = one_at_a_time();
    // The whole prompt in one batch: llama-server says nothing between its first chunk and
    // the end of the prompt (with the default 2,048 a `prompt_progress` comes every ~5 s).
    let server = LocalServer::start_with_configs(&worker_config(), "b = 4096\n");
    let proxy = Proxy::start(server.addr());
    let mut c = loopd_config(&server, &proxy);
    c.limits.max_tokens = 8;
    let liveness = Duration::from_millis(c.limits.liveness_ms);
    let idle_grace = Duration::from_millis(c.limits.idle_grace_ms);
    let runner = Runner::new(
        Arc::new(Client::new(c.client())),
        c.runner.clone(),
        ToolRegistry::new(),
        Arc::new(StandardBios),
        1,
    );
    let before = server.worker_status().expect("a worker status");
    // The first streamed byte's time after the submit, measured on the driver's thread.
    let (first, firsts) = mpsc::channel();
    let start = std::time::Instant::now();
    let mut seen = false;
    let busy_waits = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let waits = busy_waits.clone();
    let observer = Box::new(move |e: &RequestEvent| match e {
        RequestEvent::Chat(ChatEvent::Waiting { slot_busy: true }) if !seen => {
            waits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        RequestEvent::Chat(ChatEvent::Content(_)) if !seen => {
            seen = true;
            let _ = first.send(start.elapsed());
        }
        _ => {}
    });
    let id = runner
        .submit_observed(ask(&long_prompt(260)), Some(observer))
        .expect("a free slot on a ready worker");
    // What the worker says of the generation while it is evaluated, sampled until the end.
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let socket = server.status_socket().to_owned();
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut prefill = None;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = worker_proto::call(
                    &socket,
                    worker_proto::Command::Status,
                    Duration::from_secs(10),
                ) {
                    if prefill.is_none() && s.contains("\"phase\":\"prefill\"") {
                        prefill = Some(s);
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            prefill
        })
    };
    let r = runner.wait_result(id, Duration::from_secs(600));
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let during = sampler.join().unwrap();
    let r = r.unwrap_or_else(|e| {
        panic!(
            "no result within 600 s ({e}); server log {:?}",
            server.log()
        )
    });
    let ttft = firsts.try_recv().unwrap_or_else(|_| {
        panic!("no byte was streamed: {r:?}");
    });
    let prompt_tokens = r.generations[0].timings.map(|t| t.prompt_n).unwrap_or(0);
    eprintln!(
        "wedged_server: a prefill of {prompt_tokens} tokens; first byte after {} ms \
         (liveness {} ms, idle grace {} ms); worker during it: {during:?}",
        ttft.as_millis(),
        liveness.as_millis(),
        idle_grace.as_millis(),
    );
    assert!(
        matches!(r.outcome, Outcome::Completed { .. }),
        "a long prefill completes: {r:?}"
    );
    let during = during.expect("the worker's status showed the generation in prefill");
    assert!(during.contains("\"inflight\":1"), "{during}");
    // The premise: the server was silent past liveness (and the client's idle grace) before
    // its first byte, so the generation was judged on CPU time and found alive.
    assert!(
        ttft > liveness && ttft > idle_grace,
        "the prompt ({prompt_tokens} tokens) took only {} ms to its first byte; the test \
         needs a prefill longer than liveness ({} ms)",
        ttft.as_millis(),
        liveness.as_millis()
    );
    // How the client knew: the head came at once and nothing past the prompt after it, so it
    // asked `/slots` (every liveness_ms in this part of the prefill) and heard the slot busy.
    let busy = busy_waits.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        busy >= 1,
        "the client waited on a busy slot during the prefill ({busy} busy answers)"
    );
    let after = server.worker_status().expect("a worker status");
    assert_eq!(
        (after["spawns"].clone(), after["total_restarts"].clone()),
        (before["spawns"].clone(), before["total_restarts"].clone()),
        "no restart: before {before}, after {after}"
    );
    assert_eq!(runner.busy_slots(), 0);
}
