//! `loopd serve` over two real inference hosts on this box: two llama-worker
//! routers on loopback, each pinned to its own CPU and serving with one thread, each reached
//! through its own inferproxy and a socat forwarder per socket standing in for the SSH tunnel
//! (`-L infer.sock:...` and `-L status.sock:...`), so that a host's "network" can be cut.
//!
//! One daemon, one run, the faults in turn; each request is followed on the daemon's socket
//! and every wait has a deadline that says what it last saw:
//!
//! 0. a third host that answers nothing is named and not used: the daemon serves with two;
//! 1. two requests with two sessions land one per host (`placed` events);
//! 2. SIGKILL of host b's model instance mid-stream: b's request ends with the worker's
//!    reason (`worker_restarted` / `server_died`) and its partial output, pushed on b's watch;
//!    a's request completes;
//! 3. a partition (b's forwarders killed) mid-stream: b's request ends `host_lost` with its
//!    output; `status` says b is lost; the next submit lands on a, refused by nobody;
//! 4. b rejoins (forwarders started again): b is ready again and its session goes back there;
//! 5. a black hole (b's forwarders stopped) mid-stream: `host_lost` once b's watch has been
//!    silent for 3 s; a takes the next submit; b comes back when the forwarders continue.
//!
//! The times of 2, 3 and 5 (fault to result line) are printed for docs/benchmarks/fleet.md.

mod fleet_support;
mod real_serve;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleet_support::{
    assert_failed_with_output, call, completed_on, status, wait_host, wait_ready_line, Followed,
};
use llama_harness::{pin_to_cpu, temp_dir, Forwarder, LocalServer, Proxy};
use loopd_client::llama::Client;
use loopd_client::selftest::SAMPLING;
use loopd_client::ClientConfig;
use real_serve::{start_serve, Serve};
use serde_json::json;

/// Long enough to be mid-stream when a fault comes (one thread, SmolLM2-135M).
const LONG: &str = "Count from 1 to 300, one number per line.";
const LONG_TOKENS: u64 = 600;

struct Host {
    name: &'static str,
    server: LocalServer,
    _proxy: Proxy,
    infer: Forwarder,
    status: Forwarder,
}

impl Host {
    fn start(name: &'static str, cpu: usize, dir: &Path) -> Host {
        let server = LocalServer::start_with_configs("", "threads = 1\nthreads-batch = 1\n");
        let pinned = pin_to_cpu(server.pgid(), cpu);
        eprintln!(
            "host {name}: {} processes pinned to CPU {cpu}",
            pinned.len()
        );
        let proxy = Proxy::start(server.addr());
        let here = dir.join(name);
        std::fs::create_dir_all(&here).unwrap();
        let infer = Forwarder::start(&here.join("infer.sock"), proxy.socket());
        let status = Forwarder::start(&here.join("status.sock"), server.status_socket());
        Host {
            name,
            server,
            _proxy: proxy,
            infer,
            status,
        }
    }

    fn toml(&self) -> String {
        format!(
            "[[host]]\nname = {:?}\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [0, 1]\n",
            self.name,
            self.infer.socket().display().to_string(),
            self.status.socket().display().to_string(),
        )
    }

    fn partition(&mut self) {
        self.infer.kill();
        self.status.kill();
    }

    fn rejoin(&mut self) {
        self.infer.restart();
        self.status.restart();
    }
}

fn write_config(dir: &Path, a: &Host, b: &Host) -> (PathBuf, PathBuf) {
    let props = Client::new(ClientConfig::new(a.infer.socket(), a.server.model()))
        .props()
        .expect("GET /props through a's forwarder");
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = {:?}\n\
             [limits]\nload_wait_ms = 5000\n\
             [sampling]\ntemperature = 0.0\nseed = {}\n\
             [runner]\nworker_socket = {:?}\n\
             [daemon]\nsocket = {:?}\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = {}\ntotal_slots = {}\n\
             {}{}\
             [[host]]\nname = \"c\"\ninfer_socket = {:?}\nworker_socket = {:?}\nslots = [0]\n",
            a.infer.socket().display().to_string(),
            a.server.model(),
            SAMPLING.seed.unwrap(),
            a.status.socket().display().to_string(),
            socket.display().to_string(),
            llama_proto::hash::sha256(props.chat_template.as_bytes()).unwrap(),
            props.n_ctx,
            props.total_slots,
            a.toml(),
            b.toml(),
            dir.join("c/infer.sock").display().to_string(),
            dir.join("c/status.sock").display().to_string(),
        ),
    )
    .unwrap();
    (config, socket)
}

#[test]
fn two_hosts_one_daemon_each_fault_ends_only_its_hosts_request() {
    let dir = temp_dir("fleet-real");
    let (a, mut b) = std::thread::scope(|s| {
        let d = dir.clone();
        let ta = s.spawn(move || Host::start("a", 0, &d));
        let tb = s.spawn(|| Host::start("b", 1, &dir));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let (config, socket) = write_config(&dir, &a, &b);
    let folder = temp_dir("fleet-real-folder");
    let (_serve, log): (Serve, PathBuf) = start_serve(&config, &folder, &dir);
    // Host c answers nothing: named, not used; the daemon serves with a and b.
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        said.contains("loopd serve: host c: not used: the server did not answer GET /props"),
        "{said}"
    );
    wait_ready_line(&log, "hosts a, b");
    wait_host(&socket, "a", "ready", Duration::from_secs(30));
    wait_host(&socket, "b", "ready", Duration::from_secs(30));

    // 1. One per host; 2. b's model instance killed mid-stream.
    let mut on_a = Followed::submit(&socket, LONG, 64, Some("sa"));
    assert_eq!(on_a.placed_on(), "a");
    let mut on_b = Followed::submit(&socket, LONG, LONG_TOKENS, Some("sb"));
    assert_eq!(on_b.placed_on(), "b");
    on_b.first_content();
    let instance = b
        .server
        .server_pid()
        .and_then(|router| llama_harness::children_of(router).first().copied())
        .expect("b's model instance");
    let killed = Instant::now();
    assert!(std::process::Command::new("kill")
        .args(["-KILL", &instance.to_string()])
        .status()
        .unwrap()
        .success());
    let (at, r) = on_b.result(Duration::from_secs(30));
    let pushed = at.duration_since(killed);
    assert_failed_with_output(&r, &["worker_restarted", "server_died"], "b");
    let (_, ra) = on_a.result(Duration::from_secs(300));
    assert_eq!(
        ra["outcome"], "completed",
        "a's request never noticed: {ra}"
    );
    assert_eq!(ra["host"], "a");
    b.server
        .wait_worker("b's worker ready again", Duration::from_secs(120), |s| {
            s["state"] == "ready"
        });
    wait_host(&socket, "b", "ready", Duration::from_secs(30));

    // 3. A partition mid-stream.
    let mut on_b = Followed::submit(&socket, LONG, LONG_TOKENS, Some("sb"));
    assert_eq!(on_b.placed_on(), "b", "the session goes back to b");
    on_b.first_content();
    let cut = Instant::now();
    b.partition();
    let (at, r) = on_b.result(Duration::from_secs(30));
    let partitioned = at.duration_since(cut);
    assert_failed_with_output(&r, &["host_lost"], "b");
    wait_host(&socket, "b", "lost", Duration::from_secs(10));
    // Refused by nobody: a takes it.
    completed_on(&socket, Some("sb"), "a");

    // 4. b rejoins; its session goes back... to a now (it ran there last); a new one to the
    // most free host. A fresh session with a busy: b.
    b.rejoin();
    wait_host(&socket, "b", "ready", Duration::from_secs(30));
    let mut hold_a = Followed::submit(&socket, LONG, LONG_TOKENS, Some("hold-a"));
    assert_eq!(hold_a.placed_on(), "a");
    completed_on(&socket, Some("sc"), "b");

    // 5. A black hole mid-stream on b.
    let mut on_b = Followed::submit(&socket, LONG, LONG_TOKENS, Some("sc"));
    assert_eq!(on_b.placed_on(), "b", "the session goes back to b");
    on_b.first_content();
    let stopped = Instant::now();
    b.infer.pause();
    b.status.pause();
    let (at, r) = on_b.result(Duration::from_secs(30));
    let holed = at.duration_since(stopped);
    assert_failed_with_output(&r, &["host_lost"], "b");
    call(&socket, &json!({"cmd": "cancel", "id": hold_a.id}));
    let (_, rh) = hold_a.result(Duration::from_secs(60));
    assert_eq!(rh["host"], "a");
    completed_on(&socket, None, "a");
    b.infer.resume();
    b.status.resume();
    wait_host(&socket, "b", "ready", Duration::from_secs(30));
    let st = status(&socket);
    assert_eq!(st["busy"], 0, "{st}");

    eprintln!(
        "fleet figures: pushed death {} ms (worker's reason), partition {} ms (host_lost), \
         black hole {} ms (host_lost); load {}",
        pushed.as_millis(),
        partitioned.as_millis(),
        holed.as_millis(),
        llama_harness::load_average()
    );
    assert!(
        pushed < Duration::from_secs(5),
        "pushed death took {pushed:?}"
    );
    assert!(
        partitioned < Duration::from_secs(10),
        "partition took {partitioned:?}"
    );
    assert!(
        holed >= Duration::from_secs(2) && holed < Duration::from_secs(12),
        "black hole took {holed:?}"
    );
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&folder);
}
