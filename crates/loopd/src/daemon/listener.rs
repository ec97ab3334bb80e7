//! [`Daemon`]: the listener of `loopd serve`. The accept loop (one thread per connection,
//! [`MAX_CONNECTIONS`] at once), its tick (the store's expiry and compaction, the metrics
//! file), and the shutdown that cancels what runs. At start it turns every request the last
//! daemon left running into a `daemon_restarted` result, and hands the runner its completion
//! sink: the store is the one result table.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use clock::Clock;

use super::db::{Db, DbError};
use super::line::send;
use super::metrics::Metrics;
use super::output::restarted_result;
use super::protocol::ProtoError;
use super::state::{lock, Inner, State};
use loopd_agent::runner::{RequestId, Runner, SinkAlreadySet};

/// How long a client may take to send its whole command line.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);
/// How long one reply line may take to be written (a client that never reads is dropped).
pub const WRITE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once; one more is answered `TOO_MANY_CONNECTIONS` and closed.
pub const MAX_CONNECTIONS: usize = 64;

/// The detail of a request cancelled because `loopd serve` was stopped (SIGTERM, SIGINT):
/// its reason is `cancelled`, as a caller's cancel, and these words say it was not a caller.
pub const STOPPED: &str = "loopd serve was stopped";
/// Event lines queued for one follower; a follower that falls this far behind is dropped.
pub const EVENT_QUEUE: usize = 4096;
/// How often the accept loop looks at the stop flag, the store's expiry and the metrics file.
pub const TICK: Duration = Duration::from_millis(50);
/// How often, at most, the store gives freed pages back and truncates its WAL while nothing
/// runs. A compaction syncs the disk under the store's lock, so a submit would wait on it.
pub const COMPACT_EVERY: Duration = Duration::from_secs(1);
/// How often it compacts anyway while requests keep running. Between compactions the file is
/// still bounded: SQLite reuses freed pages, and checkpoints the WAL at 1,000 pages.
pub const COMPACT_BUSY_EVERY: Duration = Duration::from_secs(60);

/// What the daemon needs besides the runner and the store.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The tools the runner offers, by name.
    pub tools: Vec<String>,
    /// Tool iterations of a request that names no budget (`runner.budget`), for the results
    /// of requests recovered at start.
    pub budget: u32,
    /// Where to write the metrics for node_exporter's textfile collector, if anywhere.
    pub metrics_file: Option<PathBuf>,
    /// How often that file is written.
    pub metrics_every: Duration,
    /// How long shutdown waits for cancelled requests to store their results.
    pub shutdown_wait: Duration,
    /// The sessions' caps and summary length (`[sessions]`).
    pub sessions: crate::config::Sessions,
    /// A slot's context in tokens (`[expect] n_ctx`, else the server's `/props`); 0 when
    /// unknown: a session then compacts only after the server refused a turn as too long.
    pub n_ctx: u64,
    /// A generation's `max_tokens` when the session names none (`limits.max_tokens`): the
    /// room a turn's answer needs in the context.
    pub max_tokens: u64,
    /// The server's chat template's SHA-256 (`[expect]`), empty when not configured: a
    /// session's turn says whether it changed since the last turn.
    pub template: String,
}

/// Why [`Daemon::new`] could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartError {
    /// The requests left running could not be recovered.
    Recover(DbError),
    /// The runner already hands its results elsewhere.
    Sink(SinkAlreadySet),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Recover(e) => write!(f, "recovering the requests left running: {e}"),
            StartError::Sink(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for StartError {}

/// The daemon: one runner and one store for every client.
pub struct Daemon {
    pub(super) runner: Runner,
    pub(super) state: Arc<State>,
    pub(super) settings: Settings,
    pub(super) connections: AtomicUsize,
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

impl Daemon {
    /// A daemon over `runner` and the store `db`, on `clock` (the client's). Every request
    /// `db` holds as running (the last daemon died under it) is first ended as a
    /// `daemon_restarted` result with its checkpointed output; then every result the runner
    /// makes goes straight into `db`.
    pub fn new(
        runner: Runner,
        clock: Arc<dyn Clock>,
        settings: Settings,
        mut db: Db,
    ) -> Result<Arc<Daemon>, StartError> {
        let budget = settings.budget;
        let recovered = db
            .recover(clock.wall(), |i| restarted_result(i, budget))
            .map_err(StartError::Recover)?;
        let metrics = Metrics::new(runner.slots());
        for id in &recovered {
            eprintln!(
                "loopd serve: {} was running when the last daemon stopped: failed \
                 (daemon_restarted) with the output it had streamed",
                RequestId(*id)
            );
            metrics.restarted();
        }
        let state = Arc::new(State {
            clock,
            inner: Mutex::new(Inner {
                unstored: Default::default(),
                unforgotten: Vec::new(),
                turns: HashMap::new(),
                busy: HashMap::new(),
                force_compact: Default::default(),
                unstored_turns: HashMap::new(),
                db,
                live: HashMap::new(),
                freed: !recovered.is_empty(),
            }),
            changed: Condvar::new(),
            metrics,
            stopping: AtomicBool::new(false),
            followers: AtomicUsize::new(0),
        });
        {
            let mut inner = lock(&state.inner);
            state.drain_evicted(&mut inner);
        }
        let sink = state.clone();
        runner
            .complete_into(Box::new(move |r| sink.complete(r)))
            .map_err(StartError::Sink)?;
        Ok(Arc::new(Daemon {
            runner,
            state,
            settings,
            connections: AtomicUsize::new(0),
        }))
    }

    /// Each host's name, state and slots (one `local` host without `[[host]]`).
    pub fn hosts(&self) -> Vec<loopd_agent::runner::HostStatus> {
        self.runner.hosts()
    }

    /// The metrics text.
    pub fn metrics(&self) -> String {
        self.state.metrics.set_busy(self.runner.busy_slots());
        self.state.metrics.set_hosts(&self.host_lines());
        self.state.metrics.render()
    }

    /// The bytes the store takes on disk now (its file and its WAL).
    pub fn store_bytes(&self) -> u64 {
        lock(&self.state.inner).db.file_bytes()
    }

    /// Asks the accept loop to stop (the first stop signal).
    pub fn stop(&self) {
        self.state.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether [`Daemon::stop`] was called.
    pub fn stopping(&self) -> bool {
        self.state.stopping.load(Ordering::SeqCst)
    }

    /// Serves `listener` until [`Daemon::stop`], then stops accepting, cancels every running
    /// request, waits up to `shutdown_wait` for their results (each logged with its partial
    /// output) and returns.
    pub fn serve(self: &Arc<Daemon>, listener: UnixListener) -> io::Result<()> {
        let bounded = accept_waits_a_tick(&listener)?;
        listener.set_nonblocking(!bounded)?;
        let clock = self.state.clock.clone();
        let mut next_metrics = clock.now();
        let mut compacted = clock.now();
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
            let now = clock.now();
            let since = now.saturating_sub(compacted);
            if self.tick(since >= COMPACT_EVERY, since >= COMPACT_BUSY_EVERY) {
                compacted = now;
            }
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

    /// Writes the results a full disk kept in memory, deletes expired results; gives freed
    /// pages back to the file system when rows were freed and `idle` (if nothing runs) or
    /// `anyway` allow. Whether it compacted.
    fn tick(&self, idle: bool, anyway: bool) -> bool {
        let s = &self.state;
        let mut inner = lock(&s.inner);
        s.store_held(&mut inner);
        if let Err(e) = inner.db.expire(s.clock.wall()) {
            eprintln!("loopd serve: expiring results: {e}");
        }
        s.drain_evicted(&mut inner);
        if !inner.freed || !(anyway || idle && inner.live.is_empty()) {
            return false;
        }
        inner.freed = false;
        if let Err(e) = inner.db.compact() {
            inner.freed = true;
            eprintln!("loopd serve: compacting the store: {e}");
        }
        true
    }

    fn write_metrics_file(&self) {
        let Some(path) = &self.settings.metrics_file else {
            return;
        };
        if let Err(e) = write_atomically(path, self.metrics().as_bytes()) {
            eprintln!("loopd serve: metrics file {}: {e}", path.display());
        }
    }

    fn shutdown(&self) {
        let s = &self.state;
        let running: Vec<u64> = lock(&s.inner).live.keys().copied().collect();
        if !running.is_empty() {
            eprintln!(
                "loopd serve: cancelling {} running request(s)",
                running.len()
            );
        }
        for id in &running {
            let _ = self.runner.cancel_because(RequestId(*id), STOPPED);
        }
        let deadline = s.clock.now() + self.settings.shutdown_wait;
        let mut inner = lock(&s.inner);
        // A last try for results a full disk kept in memory (those still refused are lost
        // to this process: the next start makes them daemon_restarted, with their checkpoint).
        s.store_held(&mut inner);
        // Every request ended, and every follower has written its end line: the process
        // exits after this, and a line still in a channel would be lost.
        while !inner.live.is_empty() || s.followers.load(Ordering::SeqCst) > 0 {
            let left = deadline.saturating_sub(s.clock.now());
            if left.is_zero() {
                eprintln!("loopd serve: some requests did not end within the shutdown wait");
                break;
            }
            inner = s
                .changed
                .wait_timeout(inner, s.clock.wait_slice(left))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if std::mem::take(&mut inner.freed) {
            let _ = inner.db.compact();
        }
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
