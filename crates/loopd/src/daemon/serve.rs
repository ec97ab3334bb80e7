//! The IO loop of `loopd serve`: the socket's accept loop, one thread per connection (a read
//! deadline and a line cap on the command, a write deadline on every reply line), one waiter
//! thread per running request that moves its result from the runner into the
//! [`ResultStore`] the moment it is stored, and the shutdown that cancels what runs. Every
//! decision about kept results is the store's; this file only feeds it the time.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use clock::Clock;
use serde_json::json;

use super::metrics::Metrics;
use super::protocol::{self, event_json, result_json, Command, ProtoError, MAX_LINE_BYTES};
use super::store::{Lookup, ResultStore};
use crate::runner::{RequestEvent, RequestId, RequestResult, ResultError, Runner, Submission};

/// How long a client may take to send its whole command line.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// How long one reply line may take to be written (a client that never reads is dropped).
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; one more is answered `TOO_MANY_CONNECTIONS` and closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Event lines queued for one follower; a follower that falls this far behind is dropped.
pub const EVENT_QUEUE: usize = 4096;
/// How often the accept loop looks at the stop flag, the store's timers and the metrics file.
pub const TICK: Duration = Duration::from_millis(50);

/// What the daemon needs besides the runner.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long an unfetched result is kept.
    pub result_ttl: Duration,
    /// Results kept at most.
    pub max_results: usize,
    /// The tools the runner offers, by name.
    pub tools: Vec<String>,
    /// Where to write the metrics for node_exporter's textfile collector, if anywhere.
    pub metrics_file: Option<PathBuf>,
    /// How often that file is written.
    pub metrics_every: Duration,
    /// How long shutdown waits for cancelled requests to store their results.
    pub shutdown_wait: Duration,
}

enum Line {
    Event(String),
    End(String),
}

type Hub = Arc<Mutex<Vec<SyncSender<Line>>>>;

struct Inner {
    store: ResultStore<RequestResult>,
    hubs: HashMap<u64, Hub>,
    waiters: Vec<JoinHandle<()>>,
}

/// The daemon: one runner and one result store for every client.
pub struct Daemon {
    runner: Runner,
    clock: Arc<dyn Clock>,
    settings: Settings,
    inner: Mutex<Inner>,
    changed: Condvar,
    metrics: Metrics,
    stopping: AtomicBool,
    connections: AtomicUsize,
    /// Connections streaming a request's events: each still owes its client the end line.
    followers: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bounds a blocking `accept` on `listener` by [`TICK`], so a client is taken the moment it
/// connects (not up to a tick later, as with a non-blocking listener polled each tick) and the
/// loop still sees the stop flag every tick. Linux applies a socket's receive timeout
/// (`SO_RCVTIMEO`) to accept(2); it is set through a duplicate of the descriptor, since
/// `UnixListener` has no setter. Elsewhere: `false`, and the loop polls.
fn accept_waits_a_tick(listener: &UnixListener) -> io::Result<bool> {
    if cfg!(target_os = "linux") {
        let fd = std::os::fd::OwnedFd::from(listener.try_clone()?);
        UnixStream::from(fd).set_read_timeout(Some(TICK))?;
        return Ok(true);
    }
    Ok(false)
}

/// Writes `line` and a newline within [`WRITE_DEADLINE`].
fn send(stream: &UnixStream, line: &str) -> io::Result<()> {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    (&*stream).write_all(&buf)
}

impl Daemon {
    /// A daemon over `runner`, reading time from `clock`.
    pub fn new(runner: Runner, clock: Arc<dyn Clock>, settings: Settings) -> Arc<Daemon> {
        let metrics = Metrics::new(runner.slots());
        Arc::new(Daemon {
            inner: Mutex::new(Inner {
                store: ResultStore::new(settings.result_ttl, settings.max_results),
                hubs: HashMap::new(),
                waiters: Vec::new(),
            }),
            runner,
            clock,
            settings,
            changed: Condvar::new(),
            metrics,
            stopping: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            followers: AtomicUsize::new(0),
        })
    }

    /// The metrics text.
    pub fn metrics(&self) -> String {
        self.metrics.set_busy(self.runner.busy_slots());
        self.metrics.render()
    }

    /// Asks the accept loop to stop (the first stop signal).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether [`Daemon::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Serves `listener` until [`Daemon::stop`], then stops accepting, cancels every running
    /// request, waits up to `shutdown_wait` for their results (each logged with its partial
    /// output) and returns.
    pub fn serve(self: &Arc<Daemon>, listener: UnixListener) -> io::Result<()> {
        let bounded = accept_waits_a_tick(&listener)?;
        listener.set_nonblocking(!bounded)?;
        let mut next_metrics = self.clock.now();
        while !self.stopping() {
            match listener.accept() {
                Ok((stream, _)) => self.accept(stream),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && bounded => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(TICK),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("loopd serve: accept: {e}");
                    thread::sleep(TICK);
                }
            }
            let now = self.clock.now();
            self.expire(now);
            if now >= next_metrics {
                self.write_metrics_file();
                next_metrics = now + self.settings.metrics_every;
            }
        }
        drop(listener);
        self.shutdown();
        self.write_metrics_file();
        Ok(())
    }

    fn accept(self: &Arc<Daemon>, stream: UnixStream) {
        if self.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            // Said briefly or not at all: the accept loop must not wait on this client.
            let _ = stream.set_nonblocking(true);
            let _ = send(&stream, &ProtoError::TooManyConnections.to_line());
            return;
        }
        let me = self.clone();
        let spawned = thread::Builder::new()
            .name("loopd-conn".into())
            .spawn(move || {
                let _ = me.connection(&stream);
                me.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            eprintln!("loopd serve: no thread for a connection; it was closed");
        }
    }

    fn expire(&self, now: Duration) {
        let mut inner = lock(&self.inner);
        inner.store.expire(now);
        while let Some(e) = inner.store.poll_evicted() {
            eprintln!(
                "loopd serve: the result of {} was dropped unfetched ({})",
                RequestId(e.id),
                e.reason.as_str()
            );
            self.metrics.evicted(e.reason.as_str());
        }
        inner.waiters.retain(|h| !h.is_finished());
    }

    fn write_metrics_file(&self) {
        let Some(path) = &self.settings.metrics_file else {
            return;
        };
        if let Err(e) = write_atomically(path, self.metrics().as_bytes()) {
            eprintln!("loopd serve: metrics file {}: {e}", path.display());
        }
    }

    /// Reads one command line within [`READ_DEADLINE`] and the cap.
    fn read_line(&self, stream: &UnixStream) -> Result<Option<Vec<u8>>, ProtoError> {
        let deadline = self.clock.now() + READ_DEADLINE;
        let mut line = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let left = deadline.saturating_sub(self.clock.now());
            if left.is_zero() {
                return Err(ProtoError::ReadTimeout);
            }
            let _ = stream.set_read_timeout(Some(left));
            match (&*stream).read(&mut buf) {
                Ok(0) if line.is_empty() => return Ok(None),
                Ok(0) => return Ok(Some(line)),
                Ok(n) => {
                    if let Some(end) = buf[..n].iter().position(|&b| b == b'\n') {
                        line.extend_from_slice(&buf[..end]);
                        return if line.len() >= MAX_LINE_BYTES {
                            Err(ProtoError::LineTooLong)
                        } else {
                            Ok(Some(line))
                        };
                    }
                    line.extend_from_slice(&buf[..n]);
                    // The newline counts towards the cap.
                    if line.len() >= MAX_LINE_BYTES {
                        return Err(ProtoError::LineTooLong);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ProtoError::ReadTimeout)
                }
                Err(_) => return Ok(None),
            }
        }
    }

    fn connection(self: &Arc<Daemon>, stream: &UnixStream) -> io::Result<()> {
        stream.set_nonblocking(false)?;
        stream.set_write_timeout(Some(WRITE_DEADLINE))?;
        let line = match self.read_line(stream) {
            Ok(Some(l)) => l,
            Ok(None) => return Ok(()),
            Err(e) => return send(stream, &e.to_line()),
        };
        let cmd = match protocol::parse(&line) {
            Ok(c) => c,
            Err(e) => return send(stream, &e.to_line()),
        };
        match cmd {
            Command::Submit { request, follow } => self.submit(stream, request, follow),
            Command::Result { id } => {
                let reply = match lock(&self.inner).store.take(id, self.clock.now()) {
                    Lookup::Done(r) => json!({"ok": true, "result": result_json(&r)}).to_string(),
                    Lookup::Pending => ProtoError::Pending.to_line(),
                    Lookup::NotFound => ProtoError::NotFound.to_line(),
                };
                send(stream, &reply)
            }
            Command::Wait { id, timeout_ms } => {
                let reply = self.wait(id, Duration::from_millis(timeout_ms));
                send(stream, &reply)
            }
            Command::Cancel { id } => {
                let reply = self.cancel(id);
                send(stream, &reply)
            }
            Command::Follow { id } => self.follow(stream, id),
            Command::Status => send(stream, &self.status()),
            Command::Metrics => send(
                stream,
                &json!({"ok": true, "metrics": self.metrics()}).to_string(),
            ),
        }
    }

    fn wait(&self, id: u64, timeout: Duration) -> String {
        let deadline = self.clock.now() + timeout;
        let mut inner = lock(&self.inner);
        loop {
            match inner.store.take(id, self.clock.now()) {
                Lookup::Done(r) => {
                    return json!({"ok": true, "result": result_json(&r)}).to_string()
                }
                Lookup::NotFound => return ProtoError::NotFound.to_line(),
                Lookup::Pending => {}
            }
            let left = deadline.saturating_sub(self.clock.now());
            if left.is_zero() {
                return ProtoError::Pending.to_line();
            }
            inner = self
                .changed
                .wait_timeout(inner, left.min(TICK * 20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn cancel(&self, id: u64) -> String {
        let inner = lock(&self.inner);
        if inner.store.running().any(|r| r == id) {
            drop(inner);
            let _ = self.runner.cancel(RequestId(id));
            return json!({"ok": true, "state": "cancelling"}).to_string();
        }
        if inner.store.knows(id, self.clock.now()) {
            return json!({"ok": true, "state": "ended"}).to_string();
        }
        ProtoError::NotFound.to_line()
    }

    fn status(&self) -> String {
        let inner = lock(&self.inner);
        let running: Vec<u64> = inner.store.running().collect();
        json!({"ok": true, "status": {
            "state": if self.stopping() { "stopping" } else { "serving" },
            "slots": self.runner.slots(),
            "busy": self.runner.busy_slots(),
            "running": running,
            "kept": inner.store.kept(),
            "connections": self.connections.load(Ordering::SeqCst),
            "tools": self.settings.tools,
        }})
        .to_string()
    }

    fn follow(&self, stream: &UnixStream, id: u64) -> io::Result<()> {
        let (tx, rx) = sync_channel(EVENT_QUEUE);
        {
            let inner = lock(&self.inner);
            match inner.hubs.get(&id) {
                Some(hub) => lock(hub).push(tx),
                None if inner.store.knows(id, self.clock.now()) => {
                    return send(
                        stream,
                        &ProtoError::Refused(
                            "ENDED",
                            format!("{} has ended; fetch its result with result", RequestId(id)),
                        )
                        .to_line(),
                    );
                }
                None => return send(stream, &ProtoError::NotFound.to_line()),
            }
        }
        send(stream, &json!({"ok": true, "id": id}).to_string())?;
        self.stream_events(stream, rx)
    }

    fn stream_events(&self, stream: &UnixStream, rx: Receiver<Line>) -> io::Result<()> {
        self.followers.fetch_add(1, Ordering::SeqCst);
        let sent = self.pass_on(stream, rx);
        // Under the table lock, so a shutdown waiting on the count cannot miss the wake-up.
        let inner = lock(&self.inner);
        self.followers.fetch_sub(1, Ordering::SeqCst);
        drop(inner);
        self.changed.notify_all();
        sent
    }

    fn pass_on(&self, stream: &UnixStream, rx: Receiver<Line>) -> io::Result<()> {
        loop {
            match rx.recv() {
                Ok(Line::Event(l)) => send(stream, &l)?,
                Ok(Line::End(l)) => return send(stream, &l),
                // The hub dropped this follower: it fell EVENT_QUEUE lines behind.
                Err(_) => {
                    return send(
                        stream,
                        &ProtoError::Refused(
                            "FOLLOWER_DROPPED",
                            format!("the client fell {EVENT_QUEUE} events behind"),
                        )
                        .to_line(),
                    )
                }
            }
        }
    }

    fn submit(
        self: &Arc<Daemon>,
        stream: &UnixStream,
        request: Submission,
        follow: bool,
    ) -> io::Result<()> {
        if self.stopping() {
            return send(stream, &ProtoError::ShuttingDown.to_line());
        }
        if let Some(t) = request
            .tools
            .iter()
            .flatten()
            .find(|t| !self.settings.tools.contains(t))
        {
            return send(stream, &ProtoError::UnknownTool(t.clone()).to_line());
        }
        let hub: Hub = Arc::new(Mutex::new(Vec::new()));
        let rx = follow.then(|| {
            let (tx, rx) = sync_channel(EVENT_QUEUE);
            lock(&hub).push(tx);
            rx
        });
        let first_token: Arc<Mutex<Option<Duration>>> = Arc::default();
        let observer = {
            let (hub, first_token, clock) = (hub.clone(), first_token.clone(), self.clock.clone());
            let submitted = self.clock.now();
            Box::new(move |e: &RequestEvent| {
                if let RequestEvent::Chat(
                    crate::llama::ChatEvent::Content(_)
                    | crate::llama::ChatEvent::Reasoning(_)
                    | crate::llama::ChatEvent::ToolCallDelta { .. },
                ) = e
                {
                    let mut t = lock(&first_token);
                    if t.is_none() {
                        *t = Some(clock.now().saturating_sub(submitted));
                    }
                }
                let mut subs = lock(&hub);
                if subs.is_empty() {
                    return;
                }
                let Some(v) = event_json(e) else { return };
                let line = v.to_string();
                subs.retain(|s| match s.try_send(Line::Event(line.clone())) {
                    Ok(()) => true,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
                });
            })
        };
        // The table lock is held across submit so a fast request cannot store before it is
        // known as running.
        let mut inner = lock(&self.inner);
        let id = match self.runner.submit_observed(request, Some(observer)) {
            Ok(id) => id,
            Err(e) => {
                drop(inner);
                self.metrics.refused(e.as_str());
                let detail = match e {
                    crate::runner::SubmitError::NoSlotAvailable => format!(
                        "every slot is busy ({} of {}); there is no queue",
                        self.runner.busy_slots(),
                        self.runner.slots()
                    ),
                    other => format!("llama-worker is not ready: {other}"),
                };
                return send(stream, &ProtoError::Refused(e.as_str(), detail).to_line());
            }
        };
        inner.store.handle_started(id.0);
        inner.hubs.insert(id.0, hub.clone());
        let me = self.clone();
        let waiter = thread::Builder::new()
            .name(format!("loopd-wait-{id}"))
            .spawn(move || me.collect(id, hub, first_token));
        match waiter {
            Ok(h) => inner.waiters.push(h),
            Err(_) => {
                // Without its waiter the result would never be stored: end it now.
                inner
                    .store
                    .handle_stored(id.0, placeholder(id), self.clock.now());
                let _ = self.runner.cancel(id);
            }
        }
        drop(inner);
        self.metrics.set_busy(self.runner.busy_slots());
        send(stream, &json!({"ok": true, "id": id.0}).to_string())?;
        match rx {
            Some(rx) => self.stream_events(stream, rx),
            None => Ok(()),
        }
    }

    /// The waiter of `id`: moves its result from the runner to the store, tells followers.
    fn collect(&self, id: RequestId, hub: Hub, first_token: Arc<Mutex<Option<Duration>>>) {
        let result = loop {
            match self.runner.wait_result(id, Duration::from_secs(1)) {
                Ok(r) => break r,
                Err(ResultError::Pending) => {}
                Err(ResultError::NotFound) => return,
            }
        };
        self.metrics.finished(&result, *lock(&first_token));
        self.metrics.set_busy(self.runner.busy_slots());
        let body = json!({"ok": true, "result": result_json(&result)}).to_string();
        if self.stopping() {
            let partial = result.content.as_deref().unwrap_or("");
            eprintln!(
                "loopd serve: {id} ended at shutdown: {} ({} bytes of output: {:?})",
                result
                    .outcome
                    .fail_reason()
                    .map_or("completed", |r| r.as_str()),
                partial.len(),
                partial.chars().take(80).collect::<String>()
            );
        }
        // Under the table lock, so no follower can join the hub after its last line.
        let mut inner = lock(&self.inner);
        for s in lock(&hub).drain(..) {
            let _ = s.try_send(Line::End(body.clone()));
        }
        inner.hubs.remove(&id.0);
        inner.store.handle_stored(id.0, result, self.clock.now());
        drop(inner);
        self.changed.notify_all();
    }

    fn shutdown(&self) {
        let running: Vec<u64> = lock(&self.inner).store.running().collect();
        if !running.is_empty() {
            eprintln!(
                "loopd serve: cancelling {} running request(s)",
                running.len()
            );
        }
        for id in &running {
            let _ = self.runner.cancel(RequestId(*id));
        }
        let deadline = self.clock.now() + self.settings.shutdown_wait;
        let mut inner = lock(&self.inner);
        // Every request ended, and every follower has written its end line: the process
        // exits after this, and a line still in a channel would be lost.
        while inner.store.running().next().is_some() || self.followers.load(Ordering::SeqCst) > 0 {
            let left = deadline.saturating_sub(self.clock.now());
            if left.is_zero() {
                eprintln!("loopd serve: some requests did not end within the shutdown wait");
                break;
            }
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// The result of a request whose waiter could not start.
fn placeholder(id: RequestId) -> RequestResult {
    RequestResult {
        id,
        outcome: crate::runner::Outcome::Failed {
            reason: crate::runner::FailReason::Cancelled,
            detail: "no thread could be started to collect its result".into(),
        },
        content: None,
        reasoning_content: None,
        transcript: vec![],
        tool_calls: vec![],
        exits: vec![],
        generations: vec![],
        budget: 0,
        budget_left: 0,
        stalls: vec![],
        retries: vec![],
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a reader (node_exporter's
/// textfile collector) never sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
