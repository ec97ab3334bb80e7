//! Test helpers: a readiness endpoint whose behaviour a test switches at run time, configs
//! with small numbers, and `/proc` checks.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use llama_worker::{Config, SharedClock, State, Worker};

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
    /// A router whose model `m` failed: 200 everywhere, and a model list (the body of every
    /// answer, which `/health` probes ignore) saying `m`'s instance exited with status 1.
    ModelFailed = 4,
    /// A router whose model `m` is still loading.
    ModelLoading = 5,
}

/// A tiny HTTP server thread standing in for llama-server's `/health` and `/v1/models`, and
/// its `/slots`: slot 0 never ran a task, slot 2's `n_decoded` goes up by one on every
/// `/slots` answer while [`Endpoint::set_decoding`] says so (a slot generating), else stays.
pub struct Endpoint {
    pub port: u16,
    mode: Arc<AtomicU8>,
    hits: Arc<AtomicU64>,
    decoding: Arc<AtomicBool>,
    slots_hits: Arc<AtomicU64>,
}

impl Endpoint {
    pub fn start(mode: Mode) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let shared = Arc::new(AtomicU8::new(mode as u8));
        let hits = Arc::new(AtomicU64::new(0));
        let decoding = Arc::new(AtomicBool::new(false));
        let slots_hits = Arc::new(AtomicU64::new(0));
        let (m, h) = (shared.clone(), hits.clone());
        let (dec, sh) = (decoding.clone(), slots_hits.clone());
        thread::spawn(move || {
            let decoded = Arc::new(AtomicU64::new(40));
            for conn in l.incoming() {
                let Ok(mut s) = conn else { continue };
                h.fetch_add(1, Ordering::SeqCst);
                let m = m.clone();
                let (dec, sh, decoded) = (dec.clone(), sh.clone(), decoded.clone());
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).unwrap_or(0);
                    if buf[..n].starts_with(b"GET /slots ") {
                        sh.fetch_add(1, Ordering::SeqCst);
                        let rise = u64::from(dec.load(Ordering::SeqCst));
                        let count = decoded.fetch_add(rise, Ordering::SeqCst) + rise;
                        let body = format!(
                            "[{{\"id\":0,\"is_processing\":false}},{{\"id\":2,\
                             \"is_processing\":true,\"next_token\":[{{\"n_decoded\":{count}}}]}}]"
                        );
                        let head =
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                        let _ = s.write_all((head + &body).as_bytes());
                        return;
                    }
                    let reply: &[u8] = match m.load(Ordering::SeqCst) {
                        0 => b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"ok\"}",
                        4 => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 79\r\n\r\n\
                               {\"data\":[{\"id\":\"m\",\"status\":{\"value\":\"unloaded\",\
                               \"failed\":true,\"exit_code\":1}}]}"
                        }
                        5 => {
                            b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n\
                               {\"data\":[{\"id\":\"m\",\"status\":{\"value\":\"loading\"}}]}"
                        }
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
        Self {
            port,
            mode: shared,
            hits,
            decoding,
            slots_hits,
        }
    }

    /// Whether slot 2's decoded-token count rises with each `/slots` answer.
    pub fn set_decoding(&self, on: bool) {
        self.decoding.store(on, Ordering::SeqCst);
    }

    /// `/slots` requests answered so far.
    pub fn slots_hits(&self) -> u64 {
        self.slots_hits.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Waits (real time, at most 5 s) until more than `n` connections were accepted.
    pub fn wait_hits_over(&self, n: u64) {
        let end = Instant::now() + Duration::from_secs(5);
        while self.hits() <= n {
            assert!(
                Instant::now() < end,
                "no probe arrived; {} hits",
                self.hits()
            );
            thread::sleep(Duration::from_millis(5));
        }
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
pub fn tick_until<C: SharedClock>(
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

pub fn state<C: SharedClock>(w: &Worker<C>) -> State {
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

/// `pid (comm)` of each live member of group `pgid`, for messages.
pub fn describe(pgid: i32) -> Vec<String> {
    live(pgid)
        .into_iter()
        .map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            format!("{p} ({})", comm.trim_end())
        })
        .collect()
}

/// Waits (real time) until group `pgid` has no live member, at most `limit`; panics with the
/// members it last saw.
pub fn wait_group_gone(pgid: i32, limit: Duration) {
    let end = Instant::now() + limit;
    loop {
        let seen = describe(pgid);
        if seen.is_empty() {
            return;
        }
        if Instant::now() >= end {
            panic!("group {pgid} still has {seen:?} after {limit:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A worker on a fake clock running `sleep 300` (no CPU time) against `ep`, started and
/// ticked (in real time) until it is ready; with the clock that drives it.
pub fn ready_idle_worker(
    ep: &Endpoint,
) -> (Worker<llama_worker::FakeClock>, llama_worker::FakeClock) {
    let clock = llama_worker::FakeClock::new();
    let mut w = Worker::new(config("sleep 300"), ep.port, clock.clone()).unwrap();
    w.handle().start();
    assert!(tick_until(&mut w, Duration::from_secs(10), |w| state(w)
        == State::Ready));
    (w, clock)
}
