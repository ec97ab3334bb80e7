//! What the real-process fleet tests share: the daemon's socket protocol by hand (a command
//! and its reply; a submit followed line by line, each line with when it came) and the waits
//! on `status`'s hosts, each with a deadline that says what it last saw.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use llama_harness::wait_for;
use serde_json::{json, Value};

/// One command, one reply line.
pub fn call(socket: &Path, cmd: &Value) -> Value {
    let mut s = UnixStream::connect(socket).expect("the daemon's socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

pub fn status(socket: &Path) -> Value {
    call(socket, &json!({"cmd": "status"}))["status"].clone()
}

pub fn host_state(socket: &Path, name: &str) -> String {
    status(socket)["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|h| h["name"] == name))
        .map_or("absent".into(), |h| {
            h["state"].as_str().unwrap_or("?").to_owned()
        })
}

/// A submitted request followed on its connection: each line as it comes, with its time.
pub struct Followed {
    pub id: u64,
    lines: mpsc::Receiver<(Instant, Value)>,
    seen: Vec<Value>,
}

impl Followed {
    pub fn submit(socket: &Path, prompt: &str, max_tokens: u64, session: Option<&str>) -> Followed {
        let mut cmd = json!({"cmd": "submit", "follow": true, "budget": 0, "tools": [],
            "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]});
        if let Some(s) = session {
            cmd["session"] = json!(s);
        }
        let mut s = UnixStream::connect(socket).expect("the daemon's socket");
        s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
        let mut reader = BufReader::new(s);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        let reply: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(reply["ok"], true, "submit refused: {reply}");
        let id = reply["id"].as_u64().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let v: Value = serde_json::from_str(&line).unwrap_or(json!({"bad": line}));
                    if tx.send((Instant::now(), v)).is_err() {
                        return;
                    }
                }
            }
        });
        Followed {
            id,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits up to `timeout` for a line `pred` holds for; returns when it came.
    pub fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Instant {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((at, v)) => {
                    let hit = pred(&v);
                    self.seen.push(v);
                    if hit {
                        return at;
                    }
                }
                Err(_) => panic!(
                    "req-{}: no {what} within {timeout:?}; last lines: {:?}",
                    self.id,
                    self.seen.iter().rev().take(5).collect::<Vec<_>>()
                ),
            }
        }
    }

    pub fn placed_on(&mut self) -> String {
        self.wait("placed event", Duration::from_secs(30), |v| {
            v["event"] == "placed"
        });
        self.seen.last().unwrap()["host"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub fn first_content(&mut self) {
        self.wait("first content", Duration::from_secs(120), |v| {
            v["event"] == "content"
        });
    }

    /// The result line and when it came.
    pub fn result(&mut self, timeout: Duration) -> (Instant, Value) {
        let at = self.wait("result line", timeout, |v| v.get("result").is_some());
        (at, self.seen.last().unwrap()["result"].clone())
    }
}

pub fn assert_failed_with_output(r: &Value, reasons: &[&str], host: &str) {
    assert_eq!(r["outcome"], "failed", "{r}");
    let reason = r["fail_reason"].as_str().unwrap_or("");
    assert!(reasons.contains(&reason), "fail_reason {reason}: {r}");
    assert_eq!(r["host"], host, "{r}");
    assert!(
        r["content"].as_str().is_some_and(|c| !c.is_empty()),
        "the partial output is kept: {r}"
    );
}

pub fn completed_on(socket: &Path, session: Option<&str>, want_host: &str) {
    let mut f = Followed::submit(socket, "Say hello.", 8, session);
    let (_, r) = f.result(Duration::from_secs(120));
    assert_eq!(r["outcome"], "completed", "{r}");
    assert_eq!(r["host"], want_host, "{r}");
}

pub fn wait_host(socket: &Path, name: &str, state: &str, timeout: Duration) {
    wait_for(
        &format!("host {name} {state}"),
        timeout,
        || match host_state(socket, name) {
            s if s == state => Ok(()),
            s => Err(s),
        },
    );
}

/// Waits up to 10 s for `loopd serve`'s ready line in `log` (it comes just after `READY=1`)
/// and for it to name `hosts` (`hosts a, b`).
pub fn wait_ready_line(log: &Path, hosts: &str) {
    wait_for(
        &format!("the ready line naming {hosts}"),
        Duration::from_secs(10),
        || {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            match said.lines().find(|l| l.contains("ready on")) {
                Some(l) if l.contains(hosts) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );
}
