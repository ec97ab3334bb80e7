//! The real `loopd serve` binary over the fake server, as systemd runs it: a config whose
//! `[expect]` the fake server's `/props` matches, a script that passes the self-test, and the
//! daemon on `NOTIFY_SOCKET`.

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use llama_proto::hash::sha256;
use serde_json::{json, Value};

use super::{done, FakeServer, Reply};

pub const TEMPLATE: &str = "{{ messages }}";

pub fn props() -> Reply {
    let body = json!({
        "default_generation_settings": {"n_ctx": 4096},
        "total_slots": 2,
        "chat_template": TEMPLATE,
    });
    Reply::json(200, &body.to_string())
}

/// A streamed chunk with llama-server's `timings`, as the cache check reads them.
pub fn timed(
    delta: Value,
    finish: Option<&str>,
    (cache_n, prompt_n, predicted_n): (u64, u64, u64),
) -> Vec<u8> {
    let v = json!({"id": "chatcmpl-s", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                   "timings": {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": predicted_n}});
    format!("data: {v}\n\n").into_bytes()
}

/// The self-test's three generations: a `get_weather` call, then two answers, the second
/// served from the cache.
pub fn passing_self_test() -> Vec<Reply> {
    let call = json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
    let answer = |t| {
        Reply::sse(vec![
            timed(json!({"content": "Blue."}), None, t),
            timed(json!({}), Some("stop"), t),
            done(),
        ])
    };
    vec![
        Reply::sse(vec![
            timed(call, None, (0, 300, 20)),
            timed(json!({}), Some("tool_calls"), (0, 300, 20)),
            done(),
        ]),
        answer((0, 180, 4)),
        answer((180, 12, 3)),
    ]
}

/// An answer of `n` pieces, one every `every`.
pub struct Served {
    pub child: Child,
    pub socket: PathBuf,
    notify: UnixDatagram,
    stderr: Option<JoinHandle<String>>,
}

impl Served {
    /// Starts `loopd serve` with `NOTIFY_SOCKET` on a datagram socket of the test's own.
    pub fn start(server: &FakeServer, poll_ms: u64, extra: &str) -> Served {
        let dir = server.socket().parent().unwrap().to_owned();
        let (config, socket) = write_config(server, &dir, poll_ms, extra);
        let notify_path = dir.join("notify.sock");
        // Left bound by an earlier daemon of the same test.
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_loopd"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify_path)
            // The store in the test's directory, never the user's.
            .env("STATE_DIRECTORY", &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Served {
            child,
            socket,
            notify,
            stderr: Some(stderr),
        }
    }

    /// The next `NOTIFY_SOCKET` message, within `within`.
    pub fn notified(&self, within: Duration) -> Option<String> {
        self.notify.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 512];
        let n = self.notify.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned())
    }

    /// `READY=1` within `within`, or a panic with what the daemon said (killed first, so its
    /// stderr ends).
    pub fn expect_ready(&mut self, within: Duration) {
        let got = self.notified(within);
        if got.as_deref() != Some("READY=1") {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "loopd serve not ready within {within:?} (notified: {got:?}); it said:\n{}",
                self.said()
            );
        }
    }

    /// Sends `sig` (`TERM`, `INT`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{sig} {}", self.child.id());
    }

    /// What the daemon wrote on stderr, once it has exited.
    pub fn said(&mut self) -> String {
        self.stderr
            .take()
            .map_or(String::new(), |h| h.join().unwrap())
    }

    /// The exit status within `within`, or a panic with what the daemon said.
    pub fn exit_within(mut self, within: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.said());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "loopd serve still running after {within:?}; it said:\n{}",
                    self.said()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn write_config(
    server: &FakeServer,
    dir: &Path,
    poll_ms: u64,
    extra: &str,
) -> (PathBuf, PathBuf) {
    let socket = dir.join("loopd.sock");
    let config = dir.join("loopd.toml");
    std::fs::write(
        &config,
        format!(
            "socket = {:?}\nmodel = \"smollm2\"\n\
             [limits]\nload_wait_ms = 60000\nbusy_wait_ms = 60000\npoll_ms = {poll_ms}\n\
             [retry]\nattempts = 1\ndelays_ms = []\n\
             [daemon]\nsocket = {:?}\n\
             [expect]\nchat_template_sha256 = \"{}\"\nn_ctx = 4096\ntotal_slots = 2\n{extra}",
            server.socket().display().to_string(),
            socket.display().to_string(),
            sha256(TEMPLATE.as_bytes()).unwrap(),
        ),
    )
    .unwrap();
    (config, socket)
}
