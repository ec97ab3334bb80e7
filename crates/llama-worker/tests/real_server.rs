//! Against the REAL llama-server in router mode: started, made ready and stopped by the worker,
//! and the CPU time summed over its process group rises during a real prefill, most of it in
//! the model instance the router spawned (not the router itself). And when the `llama-worker`
//! daemon is SIGKILLed, the router and its model instance are gone within seconds.
//!
//! Needs the cached server and model (`make llama`). Paths come from `LLAMA_SERVER_BIN` and
//! `LLAMA_MODEL_GGUF` when set, else from `scripts/llama-server.sh all`.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{describe, live, state, tick_until, wait_group_gone, wait_members};
use llama_worker::cpu::group_members;
use llama_worker::{Config, State, SystemClock, Worker};

const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn server_and_model() -> (PathBuf, PathBuf) {
    if let (Ok(s), Ok(m)) = (
        std::env::var("LLAMA_SERVER_BIN"),
        std::env::var("LLAMA_MODEL_GGUF"),
    ) {
        return (s.into(), m.into());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(root.join("scripts/llama-server.sh"))
        .arg("all")
        .output()
        .expect("scripts/llama-server.sh");
    assert!(
        out.status.success(),
        "scripts/llama-server.sh all failed (run `make llama`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let server = PathBuf::from(lines.next().expect("server path"));
    let model = PathBuf::from(lines.next().expect("model dir")).join(MODEL_FILE);
    assert!(server.is_file(), "{server:?} missing: run `make llama`");
    assert!(model.is_file(), "{model:?} missing: run `make llama`");
    (server, model)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// POSTs `body` and returns the status line and the whole response.
fn post(port: u16, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(28))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// (the router's ticks, whole group's ticks).
fn ticks(pgid: i32, router: i32) -> (u64, u64) {
    let m = group_members(Path::new("/proc"), pgid).unwrap();
    let leader = m
        .iter()
        .find(|p| p.pid == router)
        .map_or(0, |p| p.cpu_ticks());
    (leader, m.iter().map(|p| p.cpu_ticks()).sum())
}

/// A fresh folder with the router's preset in it; the worker config (TOML) for that router.
fn router_config(name: &str) -> (PathBuf, String) {
    router_config_for(name, &server_and_model().1)
}

/// The same with another model file behind the model id `smollm2`.
fn router_config_for(name: &str, model: &Path) -> (PathBuf, String) {
    let (server, _) = server_and_model();
    let dir = std::env::temp_dir().join(format!("lw-real-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let preset = dir.join("preset.ini");
    std::fs::write(
        &preset,
        format!(
            "version = 1\n\n[smollm2]\nmodel = {}\nc = 8192\nnp = 2\nload-on-startup = true\n",
            model.display()
        ),
    )
    .unwrap();
    let toml = format!(
        r#"
command = {server:?}
args = ["--models-preset", {preset:?}, "--models-max", "1", "--host", "127.0.0.1",
        "--port", "{{port}}", "-np", "2", "--slots", "--jinja"]
log_file = {log:?}
models = ["smollm2"]
startup_deadline_s = 25
startup_probe_interval_s = 0.2
probe_interval_s = 0.5
cpu_probe_interval_s = 0.2
"#,
        server = server.display().to_string(),
        preset = preset.display().to_string(),
        log = dir.join("server.log").display().to_string(),
    );
    (dir, toml)
}

#[test]
fn group_cpu_time_rises_during_a_real_prefill() {
    let (dir, toml) = router_config("cpu");
    let config = Config::from_toml(&toml).unwrap();
    let port = free_port();
    let mut w = Worker::new(config, port, SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    assert!(
        tick_until(&mut w, Duration::from_secs(25), |w| state(w)
            == State::Ready),
        "not ready: {}",
        h.status().to_json()
    );
    let pgid = w.pgid().unwrap();
    let router = h.status().pid.unwrap() as i32;

    // About 260 prompt tokens, one generated: the time goes into the prefill. Measured on this
    // 2-core box: about 0.1 s idle, about 14 s (19 tokens/s) when loaded by parallel builds.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(25);
    let body = format!(
        "{{\"model\":\"smollm2\",\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\"content\":\"{prompt}\"}}]}}"
    );
    let before = ticks(pgid, router);
    let request = thread::spawn(move || post(port, "/v1/chat/completions", &body));
    let end = Instant::now() + Duration::from_secs(28);
    let mut peak_members = 0;
    while !request.is_finished() {
        assert!(Instant::now() < end, "request took too long");
        w.tick();
        peak_members = peak_members.max(live(pgid).len());
        thread::sleep(Duration::from_millis(100));
    }
    let after = ticks(pgid, router);
    let reply = request.join().unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    w.tick();

    let group_rise = after.1 - before.1;
    let leader_rise = after.0 - before.0;
    eprintln!(
        "group ticks {} -> {} (+{group_rise}), router alone +{leader_rise}, {peak_members} live members",
        before.1, after.1
    );
    // The router spawned a model instance into its group (the guard is the third member)...
    assert!(peak_members >= 3, "{peak_members}");
    // ...the group's CPU time rose by at least 0.1 s of CPU (100 ticks/s)...
    assert!(group_rise >= 10, "group rose only {group_rise} ticks");
    // ...and most of it was not the router's own, so the router alone would look idle.
    assert!(
        group_rise - leader_rise > leader_rise,
        "group +{group_rise}, router +{leader_rise}"
    );
    let s = h.status();
    assert_eq!(s.state, State::Ready);
    assert_eq!(s.total_restarts, 0);
    assert!(s
        .cpu_progress_age
        .is_some_and(|a| a < Duration::from_secs(25)));

    h.stop();
    w.tick();
    assert_eq!(live(pgid), Vec::<i32>::new(), "server processes left");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kill -KILL` of the daemon leaves neither the router nor its model instance.
#[test]
fn a_sigkilled_worker_leaves_no_router_process() {
    let (dir, toml) = router_config("orphans");
    let socket = dir.join("worker.sock");
    let config = dir.join("worker.toml");
    std::fs::write(&config, format!("{toml}status_socket = {socket:?}\n")).unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_llama-worker"))
        .args(["run", "--port", &free_port().to_string(), "--config"])
        .arg(&config)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(25);
    let mut last = String::new();
    let status = loop {
        if let Ok(s) = llama_worker::client::query(&socket, "status") {
            if s.contains("\"state\":\"ready\"") {
                break s;
            }
            last = s;
        }
        if Instant::now() >= end {
            let _ = worker.kill();
            let _ = worker.wait();
            panic!("not ready after 25 s; last status: {last}");
        }
        thread::sleep(Duration::from_millis(100));
    };
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    let pgid = i32::try_from(v["pgid"].as_i64().unwrap()).unwrap();
    // The guard, the router, and the model instance the router spawned.
    let members = wait_members(pgid, 3);
    assert!(members.len() >= 3, "{:?}", describe(pgid));
    worker.kill().unwrap(); // SIGKILL
    worker.wait().unwrap();
    wait_group_gone(pgid, Duration::from_secs(5));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A model whose instance cannot load (a GGUF cut short: the header reads, the tensor
/// data is missing) makes the worker `failed`, never `ready`, each instance exit counted as a
/// crash-loop event; with the default proportions scaled down 10 times, in well under a minute,
/// with a reason that names the model, its exit status and the server log.
#[test]
fn a_model_that_cannot_load_makes_the_real_router_failed_not_ready() {
    let (_, model) = server_and_model();
    let cut = std::env::temp_dir().join(format!("lw-real-cut-{}.gguf", std::process::id()));
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 4]).unwrap();
    let (dir, toml) = router_config_for("broken", &cut);
    let toml = toml.replace("startup_deadline_s = 25\n", "")
        + "startup_deadline_s = 12\nrestart_backoff_s = 0.2\nrestart_window_s = 60\n\
           max_restarts_per_window = 5\nunready_restart_s = 3\nstall_timeout_s = 12\n";
    let config = Config::from_toml(&toml).unwrap();
    let mut w = Worker::new(config, free_port(), SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    let started = Instant::now();
    let mut states = Vec::new();
    let failed = tick_until(&mut w, Duration::from_secs(60), |w| {
        let s = state(w);
        if states.last() != Some(&s) {
            states.push(s);
        }
        s == State::Failed
    });
    let took = started.elapsed();
    let s = h.status();
    assert!(failed, "not failed after 60 s: {}", s.to_json());
    assert!(!states.contains(&State::Ready), "{states:?}");
    assert_eq!(s.spawns, 6, "{}", s.to_json());
    let exit = s.last_model_exit.clone().expect("a model exit");
    assert_eq!((exit.model.as_str(), exit.while_loading), ("smollm2", true));
    assert_ne!(exit.exit_code, 0);
    let log = dir.join("server.log");
    assert_eq!(
        s.reason.as_deref(),
        Some(
            format!(
                "crash-loop protection: 6 failures in a row (5 restarts) without 60 s ready, the \
                 last because model smollm2 failed to load: its instance exited with status {}; \
                 server log: {}",
                exit.exit_code,
                log.display()
            )
            .as_str()
        )
    );
    // Six turns of (router start, load, exit, probe) and five backoffs of 0.2 s.
    assert!(took < Duration::from_secs(45), "{took:?}");
    eprintln!("failed after {took:?}, exit status {}", exit.exit_code);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("failed to load"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(&cut).unwrap();
}

/// A model instance killed under the router is seen at once, not at the next
/// readiness probe. The probe interval here is 60 s, so only the watch on the router's children
/// can see the death within the 20 s allowed: the restart's cause is `model_exited` and the
/// router's word on the exit (the status it reports for its killed child) is in the status.
#[test]
fn a_killed_model_instance_is_seen_before_the_next_readiness_probe() {
    let (dir, toml) = router_config("instance-death");
    let toml = toml.replace("probe_interval_s = 0.5\n", "probe_interval_s = 60\n");
    let config = Config::from_toml(&toml).unwrap();
    let mut w = Worker::new(config, free_port(), SystemClock::new()).unwrap();
    let h = w.handle();
    h.start();
    let ready = tick_until(&mut w, Duration::from_secs(60), |w| {
        state(w) == State::Ready
    });
    assert!(ready, "not ready after 60 s: {}", h.status().to_json());
    let router = h.status().pid.expect("a router pid");
    // Ticks run on this thread: look for the instance between them.
    let mut instance = None;
    let found = tick_until(&mut w, Duration::from_secs(30), |_| {
        instance = llama_worker::cpu::children(Path::new("/proc"), router)
            .and_then(|c| c.first().copied());
        instance.is_some()
    });
    let instance = instance
        .filter(|_| found)
        .expect("the router's model instance");
    // One more tick so the worker has seen the instance too.
    tick_until(&mut w, Duration::from_millis(300), |_| false);
    let killed = Instant::now();
    assert!(Command::new("kill")
        .args(["-KILL", &instance.to_string()])
        .status()
        .unwrap()
        .success());
    let seen = tick_until(&mut w, Duration::from_secs(20), |w| {
        w.handle().status().last_model_exit.is_some()
    });
    let took = killed.elapsed();
    let s = h.status();
    assert!(
        seen,
        "the instance's death unseen after 20 s: {}",
        s.to_json()
    );
    let exit = s.last_model_exit.clone().unwrap();
    assert_eq!(
        (exit.model.as_str(), exit.while_loading),
        ("smollm2", false)
    );
    assert_eq!(
        s.last_cause.map(|c| c.as_str()),
        Some("model_exited"),
        "{}",
        s.to_json()
    );
    eprintln!(
        "instance {instance} killed; seen after {} ms with exit status {}",
        took.as_millis(),
        exit.exit_code
    );
    h.stop();
    tick_until(&mut w, Duration::from_secs(10), |w| {
        state(w) == State::Stopped
    });
    std::fs::remove_dir_all(&dir).unwrap();
}
