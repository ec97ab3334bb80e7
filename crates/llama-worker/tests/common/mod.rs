//! Test helpers: a readiness endpoint whose behaviour a test switches at run time, configs
//! with small numbers, and `/proc` checks.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use llama_worker::{Clock, Config, State, Worker};

/// How the test readiness endpoint answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// 200 at once.
    Ok = 0,
    /// 503 at once.
    Unavailable = 1,
    /// Reads the request, never answers (until the connection is dropped by the prober).
    Silent = 2,
    /// 200 after 1 s (longer than the probe timeout the tests use).
    Slow = 3,
}

/// A tiny HTTP server thread standing in for llama-server's `/health` and `/v1/models`.
pub struct Endpoint {
    pub port: u16,
    mode: Arc<AtomicU8>,
}

impl Endpoint {
    pub fn start(mode: Mode) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let shared = Arc::new(AtomicU8::new(mode as u8));
        let m = shared.clone();
        thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                let m = m.clone();
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf);
                    let reply: &[u8] = match m.load(Ordering::SeqCst) {
                        0 => b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}",
                        1 => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
                        2 => {
                            thread::sleep(Duration::from_secs(5));
                            return;
                        }
                        _ => {
                            thread::sleep(Duration::from_secs(1));
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
                        }
                    };
                    let _ = s.write_all(reply);
                });
            }
        });
        Self { port, mode: shared }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }
}

/// A config running `sh -c script`, with numbers small enough for tests.
pub fn config(script: &str) -> Config {
    Config::from_toml(&format!(
        r#"
command = "/bin/sh"
args = ["-c", {script:?}]
startup_deadline_s = 5
startup_probe_interval_s = 0.05
probe_interval_s = 0.1
probe_timeout_s = 0.2
unready_restart_s = 1.5
cpu_probe_interval_s = 0.25
stall_timeout_s = 1
restart_window_s = 60
max_restarts_per_window = 3
restart_backoff_s = 2
stop_grace_s = 0.5
"#
    ))
    .unwrap()
}

/// Ticks (with short real sleeps) until `pred` holds or `limit` of real time passes.
pub fn tick_until<C: Clock>(
    w: &mut Worker<C>,
    limit: Duration,
    mut pred: impl FnMut(&mut Worker<C>) -> bool,
) -> bool {
    let end = Instant::now() + limit;
    loop {
        w.tick();
        if pred(w) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

pub fn state<C: Clock>(w: &Worker<C>) -> State {
    w.handle().state()
}

/// Pids of live (non-zombie) processes in group `pgid`.
pub fn live(pgid: i32) -> Vec<i32> {
    let mut v = llama_worker::cpu::live_members(Path::new("/proc"), pgid).unwrap();
    v.sort();
    v
}

/// Whether `pid` is gone or a zombie.
pub fn dead(pid: i32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(b) => llama_worker::stat::parse_stat(&b).is_ok_and(|s| s.is_zombie()),
    }
}

/// Waits (real time) until group `pgid` has at least `n` live members; returns them.
pub fn wait_members(pgid: i32, n: usize) -> Vec<i32> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let m = live(pgid);
        if m.len() >= n || Instant::now() >= end {
            return m;
        }
        thread::sleep(Duration::from_millis(20));
    }
}
