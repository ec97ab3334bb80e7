//! `loopd serve`'s daemon in-process over the fake server, for the daemon's tests: its config,
//! a running daemon on a socket next to the fake server's, and the replies they share.

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use clock::Clock;
use loopd::config::Config;
use loopd::daemon::{Daemon, Db, DbSettings, Durability, Settings};
use loopd_agent::runner::{builtin_tools, Runner, StandardBios};
use loopd_client::llama::Client;
use serde_json::{json, Value};

use super::{done, json_chunk, json_content, FakeServer, Reply};

pub fn config(server: &FakeServer) -> Config {
    let mut c = Config::new(server.socket(), "smollm2");
    c.limits.poll_ms = 20;
    c.limits.busy_wait_ms = 5_000;
    c.limits.load_wait_ms = 2_000;
    c.limits.idle_grace_ms = 5_000;
    c.limits.liveness_ms = 5_000;
    c.retry.attempts = 1;
    c.retry.delays_ms = Vec::new();
    c.runner.budget = 3;
    c
}

pub struct Running {
    pub daemon: Arc<Daemon>,
    pub socket: PathBuf,
    thread: Option<JoinHandle<()>>,
    _dir: PathBuf,
}

impl Running {
    /// [`start`](Self::start) on the system clock, results kept a minute.
    pub fn on_system_clock(server: &FakeServer, slots: u32) -> Running {
        Self::start(
            server,
            slots,
            Arc::new(clock::SystemClock::new()),
            Duration::from_secs(60),
        )
    }

    pub fn start(server: &FakeServer, slots: u32, clock: Arc<dyn Clock>, ttl: Duration) -> Running {
        let dir = server.socket().parent().unwrap().to_owned();
        Self::start_with_store(server, slots, clock, ttl, &dir.join("loopd.db"))
    }

    /// [`start`](Self::start) with the store at `store` (its own file system in a test).
    pub fn start_with_store(
        server: &FakeServer,
        slots: u32,
        clock: Arc<dyn Clock>,
        ttl: Duration,
        store: &std::path::Path,
    ) -> Running {
        Self::start_configured(server, slots, clock, ttl, store, config(server))
    }

    /// [`start_with_store`](Self::start_with_store) with the config `config`.
    pub fn start_configured(
        server: &FakeServer,
        slots: u32,
        clock: Arc<dyn Clock>,
        ttl: Duration,
        store: &std::path::Path,
        config: Config,
    ) -> Running {
        let dir = server.socket().parent().unwrap().to_owned();
        let socket = dir.join("loopd.sock");
        let client = Arc::new(Client::new(config.client()));
        let tools = builtin_tools(None, client.shared_clock()).unwrap();
        let names = tools.schemas().into_iter().map(|s| s.name).collect();
        let runner = Runner::new(client, config.runner, tools, Arc::new(StandardBios), slots);
        // The store in the test's own directory, never the user's; `LOOPD_STORE_SYNC=full`
        // measures the soak's submit-to-ack with an fsync per commit (docs/benchmarks.md).
        let durability = match std::env::var("LOOPD_STORE_SYNC").as_deref() {
            Ok("full") => Durability::Full,
            _ => Durability::Normal,
        };
        let db = Db::open(
            store,
            DbSettings {
                durability,
                ttl,
                cap: 100,
            },
        )
        .unwrap();
        let settings = Settings {
            tools: names,
            budget: 3,
            metrics_file: Some(dir.join("loopd.prom")),
            metrics_every: Duration::from_millis(100),
            shutdown_wait: Duration::from_secs(5),
            sessions: config.sessions,
            n_ctx: config.expect.as_ref().map_or(0, |e| e.n_ctx),
            max_tokens: config.limits.max_tokens,
            template: config.expect.as_ref().map_or(String::new(), |e| {
                e.chat_template_sha256.to_ascii_lowercase()
            }),
        };
        let daemon = Daemon::new(runner, clock, settings, db).unwrap();
        let bound = socket_file::bind(&socket).unwrap();
        let d = daemon.clone();
        let thread = thread::spawn(move || {
            d.serve(bound.listener.try_clone().unwrap()).unwrap();
            bound.remove_file();
        });
        Running {
            daemon,
            socket,
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn call(&self, cmd: Value) -> Value {
        call_raw(&self.socket, &cmd)
    }

    pub fn stop(&mut self) {
        self.daemon.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends `cmd` as it is and returns the one reply line as JSON, an error reply included:
/// the tests look at the wire, where the client (`loopd::daemon::client`) reads types.
pub fn call_raw(socket: &std::path::Path, cmd: &Value) -> Value {
    use std::io::{BufRead, Write};
    let s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    (&s).write_all(format!("{cmd}\n").as_bytes()).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(&s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// A command written as JSON, read into its type.
pub fn command(cmd: Value) -> loopd::daemon::protocol::Command {
    serde_json::from_value(cmd).unwrap()
}

pub fn submit(prompt: &str) -> Value {
    json!({"cmd": "submit", "messages": [{"role": "user", "content": prompt}]})
}

/// An answer whose pieces come `every` apart: `n` of them.
pub fn slow_answer(n: usize, every: Duration) -> Reply {
    let mut pieces: Vec<Vec<u8>> = (0..n).map(|i| json_content(&format!("w{i} "))).collect();
    pieces.push(json_chunk(json!({}), Some("stop"), 5));
    pieces.push(done());
    Reply::sse(pieces).each_after(every)
}

pub fn error_of(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error reply: {v}"))
}

/// Runs `loopd serve --config config` to its exit (a start-up it refuses): its exit code and
/// its stderr. A config that names no store gets one next to it (`STATE_DIRECTORY`).
pub fn serve_to_exit(config: &std::path::Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loopd"))
        .args(["serve", "--config"])
        .arg(config)
        .env("STATE_DIRECTORY", config.parent().unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr)
}
