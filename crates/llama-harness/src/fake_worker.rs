//! A fake llama-worker status socket: `status` answers the scripted state, `stall` and
//! `stall <id>` the scripted verdict (a `restarting` verdict also moves the state to
//! `restarting` with a new spawn, as the real worker does). `register <slot>` answers ids 1,
//! 2, ... while the scripted state is `ready` (else refused with it), `progress` and `done`
//! answer `{"ok":true}`, and `watch` stays open: its `hello` (ids 1, 2, ...), the state line,
//! then a state line at each change ([`FakeWorker::set`], a `restarting` stall verdict), the
//! failures pushed with [`FakeWorker::push_failed`], and a ping every second. `stop` and
//! `start` (straight to `ready`) answer the status once every open watch has written the new
//! state, as the real worker does. Every command is recorded.
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What the fake worker says.
#[derive(Debug, Clone)]
pub struct Script {
    pub state: &'static str,
    pub spawns: u64,
    pub last_cause: Option<&'static str>,
    /// `restarting`, `not_ready` or `not_stalled`.
    pub stall: &'static str,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            state: "ready",
            spawns: 1,
            last_cause: None,
            stall: "not_stalled",
        }
    }
}

struct Shared {
    script: Mutex<Script>,
    commands: Mutex<Vec<String>>,
    stop: AtomicBool,
    next_id: AtomicU64,
    next_watch: AtomicU64,
    watchers: Mutex<Vec<Sender<Push>>>,
    /// The open watches write nothing, pings included (a black hole).
    muted: AtomicBool,
}

/// The fake worker; stops and removes its directory on drop.
pub struct FakeWorker {
    dir: PathBuf,
    socket: PathBuf,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl FakeWorker {
    pub fn start(script: Script) -> FakeWorker {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("loopd-worker-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("worker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let shared = Arc::new(Shared {
            script: Mutex::new(script),
            commands: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            next_watch: AtomicU64::new(1),
            watchers: Mutex::new(Vec::new()),
            muted: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    serve(conn, &s);
                }
            }
        });
        FakeWorker {
            dir,
            socket,
            shared,
            accept: Some(accept),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Changes what it says from now on; a new state or spawn count is pushed to every open
    /// watch, as the real worker pushes each change.
    pub fn set(&self, f: impl FnOnce(&mut Script)) {
        let mut script = self.shared.script.lock().unwrap();
        let before = (script.state, script.spawns);
        f(&mut script);
        if (script.state, script.spawns) != before {
            self.shared.push(state_line(&script));
        }
    }

    /// Every command received, in order.
    pub fn commands(&self) -> Vec<String> {
        self.shared.commands.lock().unwrap().clone()
    }

    /// How many `stall` and `stall <id>` commands came.
    pub fn stalls(&self) -> usize {
        self.commands()
            .iter()
            .filter(|c| *c == "stall" || c.starts_with("stall "))
            .count()
    }

    /// How many `watch` connections are open.
    pub fn watching(&self) -> usize {
        let mut w = self.shared.watchers.lock().unwrap();
        w.retain(|tx| tx.send(Push::Probe).is_ok());
        w.len()
    }

    /// Closes every open watch connection (a new one may open at once).
    pub fn close_watches(&self) {
        self.shared.watchers.lock().unwrap().clear();
    }

    /// While `muted`, the open watches write nothing, pings included: a black hole.
    pub fn mute_watches(&self, muted: bool) {
        self.shared.muted.store(muted, Ordering::SeqCst);
    }

    /// Pushes `{"event":"failed","id":<id>,"reason":<reason>}` to every open watch.
    pub fn push_failed(&self, id: u64, reason: &str) {
        let line = format!("{{\"event\":\"failed\",\"id\":{id},\"reason\":\"{reason}\"}}");
        self.shared.push(line);
    }
}

/// What goes down one watch's queue.
enum Push {
    Line(String),
    /// From [`FakeWorker::watching`]: nothing to write.
    Probe,
    /// Answer once everything before it is written.
    Flush(Sender<()>),
}

impl Shared {
    /// Writes `line` to every open watch.
    fn push(&self, line: String) {
        self.watchers
            .lock()
            .unwrap()
            .retain(|tx| tx.send(Push::Line(line.clone())).is_ok());
    }

    /// Waits until every open watch has written what was pushed before, as the real worker
    /// does before it answers `start` or `stop`.
    fn flush(&self) {
        let (tx, rx) = mpsc::channel();
        let n = {
            let mut w = self.watchers.lock().unwrap();
            w.retain(|w| w.send(Push::Flush(tx.clone())).is_ok());
            w.len()
        };
        for _ in 0..n {
            let _ = rx.recv_timeout(Duration::from_secs(2));
        }
    }
}

/// The `status` answer for what `script` says.
fn status_line(script: &Script) -> String {
    format!(
        "{{\"state\":\"{}\",\"pid\":42,\"port\":8080,\"restarts_in_window\":0,\
         \"total_restarts\":0,\"spawns\":{},\"last_cause\":{},\"cpu_ticks\":7,\
         \"cpu_progress_age_s\":0.100,\"last_readiness\":null,\"inflight\":0}}",
        script.state,
        script.spawns,
        script
            .last_cause
            .map_or("null".to_owned(), |c| format!("\"{c}\""))
    )
}

/// The watch's `state` line for what `script` says.
fn state_line(script: &Script) -> String {
    format!(
        "{{\"event\":\"state\",\"state\":\"{}\",\"spawns\":{}}}",
        script.state, script.spawns
    )
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The open watches end, as they do when a worker exits.
        self.close_watches();
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes the watch's lines until the client goes or the fake stops.
fn watch(conn: UnixStream, rx: Receiver<Push>, stop: Arc<Shared>) {
    while !stop.stop.load(Ordering::SeqCst) {
        let line = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Push::Probe) => continue,
            Ok(Push::Flush(done)) => {
                let _ = done.send(());
                continue;
            }
            Ok(Push::Line(l)) => l,
            Err(RecvTimeoutError::Timeout) => "{\"event\":\"ping\"}".to_owned(),
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if stop.muted.load(Ordering::SeqCst) {
            continue;
        }
        if (&conn).write_all(format!("{line}\n").as_bytes()).is_err() {
            return;
        }
    }
}

fn serve(conn: UnixStream, s: &Arc<Shared>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut line = String::new();
    if BufReader::new(&conn).read_line(&mut line).is_err() {
        return;
    }
    let command = line.trim().to_owned();
    s.commands.lock().unwrap().push(command.clone());
    let mut script = s.script.lock().unwrap();
    let word = command.split(' ').next().unwrap_or("");
    let answer = match word {
        "watch" => {
            let first = state_line(&script);
            let (tx, rx) = mpsc::channel();
            let hello = s.next_watch.fetch_add(1, Ordering::SeqCst);
            let _ = tx.send(Push::Line(format!(
                "{{\"event\":\"hello\",\"watch\":{hello}}}"
            )));
            let _ = tx.send(Push::Line(first));
            s.watchers.lock().unwrap().push(tx);
            let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
            let stop = s.clone();
            thread::spawn(move || watch(conn, rx, stop));
            return;
        }
        "register" if script.state == "ready" => {
            let id = s.next_id.fetch_add(1, Ordering::SeqCst);
            format!("{{\"registered\":{id}}}")
        }
        "register" => format!("{{\"refused\":\"{}\"}}", script.state),
        "progress" | "done" => "{\"ok\":true}".to_owned(),
        // As the real worker: the state set is on every watch before the answer (which is
        // the status line; `start` goes straight to ready here).
        "stop" | "start" => {
            let to = if word == "stop" { "stopped" } else { "ready" };
            if script.state != to {
                script.state = to;
                s.push(state_line(&script));
                s.flush();
            }
            status_line(&script)
        }
        "status" => status_line(&script),
        "stall" => match script.stall {
            "restarting" if script.state == "ready" => {
                script.state = "restarting";
                script.spawns += 1;
                script.last_cause = Some("stall");
                s.push(state_line(&script));
                "{\"stall\":\"restarting\"}".to_owned()
            }
            "restarting" | "not_ready" => "{\"stall\":\"not_ready\"}".to_owned(),
            _ => "{\"stall\":\"not_stalled\",\"since_progress_s\":0.250}".to_owned(),
        },
        _ => "{\"error\":\"unknown command\"}".to_owned(),
    };
    drop(script);
    let _ = (&conn).write_all(format!("{answer}\n").as_bytes());
}
